"""The package's shape: no import cycles, no cloud SDK where only facts are needed, no module
loaded twice by the one module the product runs with ``-m``, and cloud facts that depend on
nothing but the standard library."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import REPO

INFRA = REPO / "infra"
SDKS = ("pulumi", "pulumi_aws", "pulumi_gcp", "pulumi_azure_native")


def module_files() -> dict[str, Path]:
    """Every module under infra/ by its dotted name (a package by its __init__)."""
    modules = {}
    for path in sorted(INFRA.rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path, name: str, *, types: bool = False) -> list[tuple[str, list[str]]]:
    """Each import statement in a module, at any depth (functions included), as (module, names)
    with relative imports resolved; ``if TYPE_CHECKING:`` blocks only with ``types``: they never
    run, but a reader still has to follow them."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, list[str]]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and is_type_checking(node) and not types:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([module] if module else [])])
            found.append((module, [alias.name for alias in node.names]))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def import_graph(*, types: bool = False) -> dict[str, set[str]]:
    """Edges between infra modules: ``from infra.x import y`` goes to infra.x.y when that is a
    module, else to infra.x. ``types``: imports for the type checker only count too."""
    modules = module_files()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for module, names in imports_of(path, name, types=types):
            targets = [f"{module}.{n}" if f"{module}.{n}" in modules else module for n in names]
            for target in targets or [module]:
                if target in modules and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of modules (Tarjan), as a path that
    returns to its start."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            connect(node)

    def path_back(start: str, group: set[str]) -> list[str]:
        seen = {start}
        paths = [[start]]
        while paths:
            path = paths.pop(0)
            for target in sorted(graph[path[-1]] & group):
                if target == start:
                    return [*path, start]
                if target not in seen:
                    seen.add(target)
                    paths.append([*path, target])
        raise AssertionError("a strongly connected group has a cycle through each member")

    return [path_back(min(group), group) for group in groups]


def test_the_import_graph_sees_imports_at_every_depth(tmp_path: Path) -> None:
    graph = import_graph()
    assert "infra.stack.config" in graph["infra.stack.program"]
    assert "infra.catalog.refresh.common" in graph["infra.catalog.refresh.gcp"]  # a module
    assert "infra.clouds" in graph["infra.core.costs"]  # a name from a package
    assert "infra.boot.deliver" in graph["infra.boot"]  # a package's own submodules
    assert "infra.models.gguf_header" in graph["infra.planner.request"]  # inside a function
    source = tmp_path / "__init__.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import sibling\n"
        "from ..other import thing\n"
        "if TYPE_CHECKING:\n    import for_types_only\n"
        "def later():\n    import lazily\n"
    )
    assert imports_of(source, "infra.pkg") == [
        ("typing", ["TYPE_CHECKING"]),
        ("infra.pkg", ["sibling"]),
        ("infra.other", ["thing"]),
        ("lazily", []),
    ]


def test_the_cycle_finder_finds_a_cycle_and_prints_it() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("types", [False, True], ids=["at-run-time", "for-the-type-checker"])
def test_no_infra_module_imports_itself_through_others(types: bool) -> None:
    """Not at run time, and not through ``if TYPE_CHECKING:`` either: a cycle a reader must
    follow is one whether or not Python runs it."""
    found = cycles(import_graph(types=types))
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


# The layers, lowest first. A package imports its own layer and the ones below, never one above;
# inside a layer the packages import each other without a cycle (the package graph below).
LAYERS = {
    # 0: facts, shared rules and the clouds' input rules (the tests' oracle); no cloud SDK, no I/O.
    # SettingError, the shape every layer's setting errors take: models/ raises it and core/'s
    # other modules import models/, so it is a unit of its own, importing nothing.
    "infra.core.errors": 0,
    "infra.clouds": 0,
    "infra.conformance": 0,
    "infra.catalog": 0,
    "infra.models": 0,
    "infra.core": 0,
    # 1: what a node boots, the Pulumi program and its preflight, a cloud's live account,
    # observing nodes, planning.
    "infra.boot": 1,
    "infra.preflight": 1,
    "infra.live": 1,
    "infra.stack": 1,
    "infra.observe": 1,
    "infra.planner": 1,
    # 2: built on the layers below: the local cluster, the cost runs, model staging.
    "infra.local": 2,
    "infra.costrun": 2,
    "infra.stage": 2,
    # 3: the commands, lrc's own package; they may import anything, and nothing imports them.
    "infra.cli": 3,
}
COMMAND_LINE = LAYERS["infra.cli"]
# Imports that the layers allow but the design does not: the Pulumi program never depends on
# how a stack is planned or watched.
NEVER = {"infra.stack": ("infra.planner", "infra.observe")}


def unit_of(module: str) -> tuple[str, int]:
    """The package (or module) a module belongs to in the layer table, the longest that holds
    it, and its layer."""
    holders = [unit for unit in LAYERS if module == unit or module.startswith(unit + ".")]
    if not holders:
        raise KeyError(f"{module} is in no layer: add its package to LAYERS")
    unit = max(holders, key=len)
    return unit, LAYERS[unit]


def layer_problems(graph: dict[str, set[str]]) -> list[str]:
    """Every import that goes up a layer, into a command, or across a NEVER line."""
    problems = []
    for module, targets in sorted(graph.items()):
        unit, layer = unit_of(module)
        for target in sorted(targets):
            to_unit, to_layer = unit_of(target)
            if to_layer == COMMAND_LINE and layer != COMMAND_LINE:
                problems.append(f"{module} imports the command line: {target}")
            elif to_layer > layer:
                problems.append(f"{module} (layer {layer}) imports {target} (layer {to_layer})")
            elif any(to_unit == banned for banned in NEVER.get(unit, ())):
                problems.append(f"{module} imports {target}: {unit} never imports {to_unit}")
    return problems


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded onto the layer table's packages."""
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        unit, _ = unit_of(module)
        edges = packages.setdefault(unit, set())
        for target in targets:
            to_unit, _ = unit_of(target)
            if to_unit != unit:
                edges.add(to_unit)
                packages.setdefault(to_unit, set())
    return packages


def in_layers(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph without the root package (``infra/__init__.py``, which imports nothing)."""
    return {m: {t for t in ts if t != "infra"} for m, ts in graph.items() if m != "infra"}


def test_the_root_package_imports_nothing() -> None:
    assert imports_of(INFRA / "__init__.py", "infra", types=True) == []


def test_every_module_has_a_layer() -> None:
    for module in in_layers(import_graph()):
        unit_of(module)  # raises for a package the table leaves out


@pytest.mark.parametrize("types", [False, True], ids=["at-run-time", "for-the-type-checker"])
def test_no_layer_imports_a_higher_one(types: bool) -> None:
    problems = layer_problems(in_layers(import_graph(types=types)))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("types", [False, True], ids=["at-run-time", "for-the-type-checker"])
def test_no_two_packages_import_each_other(types: bool) -> None:
    packages = package_graph(in_layers(import_graph(types=types)))
    assert set(packages) == set(LAYERS)  # every package of the table is seen
    found = cycles(packages)
    assert not found, "package cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_layer_rules_catch_an_import_up_into_a_command_or_across_a_line() -> None:
    fine = {
        "infra.core.costs": {"infra.catalog", "infra.clouds"},
        "infra.stack.config": {"infra.core.costs", "infra.boot"},
        "infra.local.cluster": {"infra.stack.config", "infra.observe.metrics"},
        "infra.cli.plan": {"infra.planner.request", "infra.cli.options"},
        "infra.cli.local": {"infra.local.cluster"},
    }
    assert layer_problems(fine) == []
    assert layer_problems({"infra.core.costs": {"infra.stack.config"}}) == [
        "infra.core.costs (layer 0) imports infra.stack.config (layer 1)"
    ]
    assert layer_problems({"infra.observe.top": {"infra.local.access"}}) == [
        "infra.observe.top (layer 1) imports infra.local.access (layer 2)"
    ]
    assert layer_problems({"infra.costrun.pipeline": {"infra.cli.stage"}}) == [
        "infra.costrun.pipeline imports the command line: infra.cli.stage"
    ]
    # A package's own module named cli or __main__ is in its package's layer, as any other.
    assert layer_problems({"infra.planner.cli": {"infra.cli.options"}}) == [
        "infra.planner.cli imports the command line: infra.cli.options"
    ]
    assert layer_problems({"infra.boot.__main__": {"infra.local.cluster"}}) == [
        "infra.boot.__main__ (layer 1) imports infra.local.cluster (layer 2)"
    ]
    assert layer_problems({"infra.stack.component": {"infra.observe.metrics"}}) == [
        "infra.stack.component imports infra.observe.metrics: infra.stack never imports "
        "infra.observe"
    ]
    assert unit_of("infra.core.errors") == ("infra.core.errors", 0)
    assert unit_of("infra.core.costs") == ("infra.core", 0)
    assert package_graph({"infra.models.model": {"infra.core.errors"}}) == {
        "infra.models": {"infra.core.errors"},
        "infra.core.errors": set(),
    }
    with pytest.raises(KeyError, match=r"infra\.newpackage\.thing is in no layer"):
        layer_problems({"infra.newpackage.thing": set()})
    both_ways = {"infra.boot.node": {"infra.stack.config"}, "infra.stack.config": {"infra.boot"}}
    assert cycles(package_graph(both_ways)) == [["infra.boot", "infra.stack", "infra.boot"]]


# Import one module, then list the modules of the watched packages loaded since the last one.
LOAD_PROBE = """
import importlib, json, sys
watched = {watched}
report = {{}}
for name in {modules}:
    before = set(sys.modules)
    importlib.import_module(name)
    new = set(sys.modules) - before
    report[name] = sorted(m for m in new if any(m == w or m.startswith(w + ".") for w in watched))
print(json.dumps(report))
"""


def loaded_by(modules: list[str], watched: set[str]) -> dict[str, list[str]]:
    """The modules of the watched packages each module loads, imported in turn in a fresh
    interpreter (what an earlier one loaded is not counted again)."""
    code = LOAD_PROBE.format(watched=watched, modules=modules)
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    loaded: dict[str, list[str]] = json.loads(result.stdout)
    assert set(loaded) == set(modules)
    return loaded


def test_checking_settings_planning_and_booting_load_no_cloud_sdk() -> None:
    """The config check, the planner and the boot renderer run without a cloud SDK: they stay
    fast, and work where no SDK is installed."""
    modules = [
        "infra.clouds",
        "infra.boot",
        "infra.stack.settings",
        "infra.stack.config",
        "infra.cli.plan",
    ]
    loaded = loaded_by(modules, set(SDKS))
    assert all(not sdk for sdk in loaded.values()), loaded


def test_the_live_operations_load_a_cloud_sdk_only_when_called() -> None:
    """Every command, the local cluster's channel and the program import ``infra.live``: its
    registry of all three clouds costs none of their SDKs (boto3, Google's, Azure's, Pulumi's)
    until a live call is made."""
    modules = ["infra.live", "infra.observe.wait", "infra.stage.staging", "infra.cli.check"]
    loaded = loaded_by(modules, {*SDKS, "boto3", "botocore", "google", "azure"})
    assert all(not sdk for sdk in loaded.values()), loaded


def test_the_product_never_loads_the_clouds_input_rules() -> None:
    """``infra.conformance`` is the tests' oracle: the facts, the config check, the planner, the
    boot renderer and the Pulumi program run without its 2,700 lines."""
    modules = [
        "infra.clouds",
        "infra.stack.config",
        "infra.cli.plan",
        "infra.boot",
        "infra.stack.program",
        "infra.cli.lrc",
    ]
    loaded = loaded_by([*modules, "infra.conformance"], {"infra.conformance"})
    assert "infra.conformance.rules" in loaded.pop("infra.conformance")  # the probe sees it
    assert all(not rules for rules in loaded.values()), loaded


# Runs a module as ``python -m`` does, then prints every loaded module's file by name.
RUN_AS_MAIN = """
import atexit, json, runpy, sys
def report():
    files = {{n: getattr(m, "__file__", None) for n, m in list(sys.modules.items())}}
    sys.__stdout__.write("\\nMODULES " + json.dumps(files) + "\\n")
atexit.register(report)
sys.argv = [{module!r}, *{args!r}]
runpy.run_module({module!r}, run_name="__main__", alter_sys=True)
"""


def test_the_supervisor_run_as_a_module_loads_each_module_once() -> None:
    """The local cluster starts its supervisor with ``-m infra.local.supervisor`` (the one module
    the product runs so), which runs the file as ``__main__``: were it also imported by its own
    name, or any module loaded under two names or twice, its code would run twice and its state
    exist in two copies."""
    module = "infra.local.supervisor"
    code = RUN_AS_MAIN.format(module=module, args=["--help"])
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert result.stdout.startswith(f"usage: {module} [-h] state")  # it ran, as __main__
    imported = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", result.stderr, re.M)
    infra = [name for name in imported if name.split(".")[0] == "infra"]
    assert "infra.local.spec" in infra  # the listing is read: the supervisor's own imports
    twice = sorted({name for name in infra if infra.count(name) > 1})
    assert not twice, f"imported more than once: {twice}"
    assert module not in infra, "the module imported again by its own name"
    files: dict[str, str | None] = json.loads(result.stdout.rsplit("MODULES ", 1)[1])
    names_by_file: dict[Path, list[str]] = {}
    for name, file in files.items():
        if file and Path(file).resolve().is_relative_to(INFRA):
            names_by_file.setdefault(Path(file).resolve(), []).append(name)
    assert module not in files, "the module loaded again by its own name"
    aliases = {str(f): n for f, n in names_by_file.items() if len(n) > 1}
    assert not aliases, f"one file loaded under several names: {aliases}"


def test_cloud_facts_import_only_the_standard_library_and_each_other() -> None:
    """Facts are read by the config check, the planner and the boot renderer: a provider SDK or
    another infra module here would come along with them."""
    modules = module_files()
    facts = {
        name: path for name, path in modules.items() if name.split(".")[:2] == ["infra", "clouds"]
    }
    assert {"infra.clouds", "infra.clouds.base", "infra.clouds.aws"} <= set(facts)
    outside = []
    for name, path in facts.items():
        for module, _ in imports_of(path, name):
            top = module.split(".")[0]
            if top in sys.stdlib_module_names or module.split(".")[:2] == ["infra", "clouds"]:
                continue
            outside.append(f"{path.relative_to(REPO)}: {module}")
    assert not outside, outside


# The provider SDKs mypy reads service by service (pyproject.toml's overrides).
TYPED_SDKS = ("pulumi_aws", "pulumi_azure_native", "pulumi_gcp", "pulumi_kubernetes")


def typed_sdk_modules() -> set[str]:
    """The SDK modules mypy follows: the overrides' patterns with ``follow_imports = normal``."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    followed: set[str] = set()
    for override in config["tool"]["mypy"].get("overrides", []):
        if override.get("follow_imports") == "normal":
            followed |= {pattern.removesuffix(".*") for pattern in override["module"]}
    return followed


def sdk_modules_used(path: Path) -> set[str]:
    """Each SDK module a file reaches: ``import pulumi_aws as aws`` then ``aws.ec2.X``, or
    ``aws.get_availability_zones_output`` (star-imported from its own module), as the SDK's
    dotted module name."""
    tree = ast.parse(path.read_text(), str(path))
    aliases = {
        alias.asname or alias.name: alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name in TYPED_SDKS
    }
    used: set[str] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
            continue
        sdk = aliases.get(node.value.id)
        if sdk is None:
            continue
        spec = importlib.util.find_spec(sdk)
        assert spec is not None and spec.origin is not None
        home = Path(spec.origin).parent
        if (home / node.attr).is_dir():
            used.add(f"{sdk}.{node.attr}")
            continue
        defined = [
            module.stem
            for module in home.glob("*.py")
            if re.search(rf"^(def|class) {node.attr}\b", module.read_text(), re.MULTILINE)
        ]
        used |= {f"{sdk}.{stem}" for stem in defined} or {sdk}
    return used


def test_mypy_reads_every_sdk_service_the_code_uses() -> None:
    """An SDK service left out of the list would be typed as Any: a wrong argument to its
    resources would pass the type check."""
    followed = typed_sdk_modules()
    missing = {
        f"{path.relative_to(REPO)}: {module}"
        for path in [*INFRA.rglob("*.py"), REPO / "policy" / "rules.py"]
        for module in sdk_modules_used(path)
        if module not in followed
    }
    assert not missing, "add to pyproject.toml's followed SDK modules:\n" + "\n".join(
        sorted(missing)
    )
    assert "pulumi_aws.ec2" in followed and "pulumi_aws.glue" not in followed
