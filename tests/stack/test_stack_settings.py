"""The settings are declared once (infra/stack/settings.py): Pulumi.yaml's config block and the
README's table say what that table says, the config check reads exactly the declared keys, and
the block follows Pulumi's rules for project config, so Pulumi accepts every stack preset."""

from __future__ import annotations

import ast
import json
import re
from typing import Any

import pytest
import yaml

from infra.core.layout import PROJECT
from infra.stack import settings
from infra.stack.settings import BY_KEY, SETTINGS, Setting
from tests.conftest import REPO
from tests.pulumi_mocks import stack_config, stack_names

PULUMI_YAML = REPO / "Pulumi.yaml"
README = REPO / "docs" / "settings.md"  # where the settings table lives
CONFIG_PY = REPO / "infra" / "stack" / "config.py"
README_START = "<!-- settings:start -->"
README_END = "<!-- settings:end -->"
# Pulumi's project config: the types it knows, and the attributes a key may have.
PULUMI_TYPES = {"string", "integer", "boolean", "array"}
PULUMI_ATTRIBUTES = {"type", "items", "description", "secret", "default", "value"}
FIXED_DEFAULTS = [s for s in SETTINGS if s.default is not None]


def project_file() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(PULUMI_YAML.read_text())
    return loaded


def as_pulumi_hands_it(value: Any) -> str:
    """A value as Pulumi hands it to the program: scalars as text, the rest as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(value)


def pulumi_accepts(kind: str, items: dict[str, Any] | None, value: Any) -> bool:
    """Pulumi's check of a value against a declared type (ValidateConfigValue)."""
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        if isinstance(value, str):
            return re.fullmatch(r"[+-]?[0-9]+", value) is not None
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool) or value in ("true", "false")
    if kind == "array":
        return (
            isinstance(value, list)
            and items is not None
            and all(pulumi_accepts(items["type"], items.get("items"), item) for item in value)
        )
    return False


def config_py_keys() -> tuple[set[str], set[str]]:
    """The keys config.py reads as ``BY_KEY["..."]``, and every string literal it holds."""
    tree = ast.parse(CONFIG_PY.read_text())
    read: set[str] = set()
    literals: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            literals.add(node.value)
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == "BY_KEY"
            and isinstance(node.slice, ast.Constant)
        ):
            read.add(str(node.slice.value))
    return read, literals


def test_pulumi_yaml_config_block_is_the_declared_one() -> None:
    project = project_file()
    assert project["config"] == settings.project_config()
    assert settings.project_file_block() in PULUMI_YAML.read_text()
    assert project["name"] == PROJECT
    assert project["runtime"]["options"]["toolchain"] == "uv"
    assert project["stackConfigDir"] == "stacks"


def test_readme_table_is_the_declared_one() -> None:
    text = README.read_text()
    assert text.count(README_START) == 1
    assert text.count(README_END) == 1
    table = text.split(README_START)[1].split(README_END)[0]
    assert table.strip("\n") + "\n" == settings.readme_table()


def test_config_reads_only_declared_keys() -> None:
    read, _ = config_py_keys()
    assert read, "config.py reads no BY_KEY[...]: the check below would hold for nothing"
    assert read - set(BY_KEY) == set()


def test_every_declared_key_is_read_by_config() -> None:
    _, literals = config_py_keys()
    assert [s.key for s in SETTINGS if s.key not in literals] == []


@pytest.mark.parametrize("setting", FIXED_DEFAULTS, ids=lambda s: s.key)
def test_fixed_default_passes_its_own_check(setting: Setting) -> None:
    assert setting.read({}) == setting.default
    assert setting.read({setting.key: setting.default}) == setting.default
    # Pulumi hands a Pulumi.yaml default over as text (JSON for arrays and objects).
    assert setting.read({setting.key: as_pulumi_hands_it(setting.default)}) == setting.default


def test_project_config_follows_pulumi_rules() -> None:
    problems = []
    for key, entry in project_file()["config"].items():
        if set(entry) - PULUMI_ATTRIBUTES:
            problems.append(f"{key}: unknown attributes {sorted(set(entry) - PULUMI_ATTRIBUTES)}")
        if "default" in entry and "value" in entry:
            problems.append(f"{key}: both default and value")
        if ":" in key:  # another namespace (aws:region): a value only, no type or default
            if "type" in entry or "default" in entry or "value" not in entry:
                problems.append(f"{key}: a provider's key takes a value, no type or default")
            continue
        if key not in BY_KEY:
            problems.append(f"{key}: not a setting of the project")
            continue
        kind = entry.get("type")
        if kind is not None and kind not in PULUMI_TYPES:
            problems.append(f"{key}: type {kind!r} is not one of {sorted(PULUMI_TYPES)}")
        if kind == "array" and "type" not in entry.get("items", {}):
            problems.append(f"{key}: an array without items")
        default = entry.get("default")
        if (
            kind is not None
            and default is not None
            and not pulumi_accepts(kind, entry.get("items"), default)
        ):
            problems.append(f"{key}: default {default!r} is not a {kind}")
        # Pulumi asks every stack for a declared key with neither default nor value.
        if "default" not in entry and "value" not in entry and not BY_KEY[key].required:
            problems.append(f"{key}: optional, but Pulumi would ask every stack for it")
    assert problems == []


@pytest.mark.parametrize("stack", stack_names())
def test_pulumi_accepts_the_preset(stack: str) -> None:
    declared = project_file()["config"]
    given = {
        key.removeprefix(f"{PROJECT}:"): value
        for key, value in stack_config(stack).items()
        if key.startswith(f"{PROJECT}:")
    }
    assert set(given) - set(BY_KEY) == set()
    # Pulumi asks for the project's keys that have neither a default nor a value.
    missing = [
        key
        for key, entry in declared.items()
        if ":" not in key and not {"default", "value"} & set(entry) and key not in given
    ]
    assert missing == []
    for key, value in given.items():
        kind = declared.get(key, {}).get("type")
        if kind is not None:
            text = value if isinstance(value, list | dict) else as_pulumi_hands_it(value)
            assert pulumi_accepts(kind, declared[key].get("items"), text), (key, value)


@pytest.mark.parametrize(
    ("key", "text"),
    [("llamaCppCommit", "1" * 40), ("instanceType", "123"), ("image", "1e5")],
)
def test_a_string_setting_that_looks_like_a_number_stays_text(key: str, text: str) -> None:
    # Pulumi hands every value over as text; only non-string settings are decoded from JSON.
    assert BY_KEY[key].read({key: text}) == text
