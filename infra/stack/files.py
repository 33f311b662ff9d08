"""The stacks' settings, read as Pulumi resolves them, by every command through one reader
(``stack_values``), and the stack files under ``stacks/`` (``Pulumi.<stack>.yaml``) written by
``lrc plan --write-stack`` once the program's own check accepts them.

A stack file of plain values is read here, with no Pulumi CLI and no network. A value Pulumi
keeps encrypted (``apiKey: {secure: ...}``, from ``pulumi config set --secret``) is known to be
set (a ``Secret``) without being decrypted, where only its presence matters. Pulumi itself is
asked (``pulumi config --json``) where a stack takes values from elsewhere: an ESC environment
(``environment:`` in the file), config Pulumi Cloud keeps for a stack with no file here, or a
secret whose value is needed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from infra.core.layout import PROJECT
from infra.core.paths import INSTALLED, OWN_FILES
from infra.stack import pulumi_cli
from infra.stack.config import REGION_KEYS, ClusterConfig, from_settings
from infra.stack.pulumi_cli import PulumiError, Secret
from infra.stack.settings import SETTINGS

# This lrc's own files: the checkout it runs from, or the copy an installed wheel carries.
REPO = OWN_FILES
# Where the project's stacks are looked for: LRC_PROJECT_DIR, else the Pulumi project of this
# directory or one above it (a checkout of this project, or a copy of its Pulumi.yaml and
# stacks/), else lrc's own.
PROJECT_VARIABLE = "LRC_PROJECT_DIR"


def find_project(start: Path, environ: Mapping[str, str] = os.environ) -> Path:
    """The Pulumi project lrc reads stacks from, asked from directory ``start``."""
    if named := environ.get(PROJECT_VARIABLE):
        return Path(named).expanduser().resolve()
    for directory in (start, *start.parents):
        if _is_this_project(directory / "Pulumi.yaml"):
            return directory
    return REPO


def _is_this_project(path: Path) -> bool:
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(document, dict) and document.get("name") == PROJECT


def _stacks_dir(project: Path) -> Path:
    """The project's stackConfigDir (Pulumi.yaml), as Pulumi reads it."""
    try:
        document = yaml.safe_load((project / "Pulumi.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        document = {}
    return project / str(document.get("stackConfigDir") or ".")


def _here() -> Path:
    try:
        return Path.cwd()
    except OSError:  # a directory removed under the shell
        return REPO


PROJECT_DIR = find_project(_here())
STACKS_DIR = _stacks_dir(PROJECT_DIR)
# The settings whose values are secrets: the program reads them decrypted, lrc only their
# presence.
SECRET_KEYS = frozenset(f"{PROJECT}:{s.key}" for s in SETTINGS if s.secret)


def project_dir() -> Path:
    """The Pulumi project's directory (its Pulumi.yaml), where Pulumi is asked about a stack."""
    return PROJECT_DIR


def writable_stacks_dir() -> Path:
    """Where ``lrc plan --write-stack`` writes: the project's stacks, or ``./stacks`` when the
    only stacks are those an installed lrc carries."""
    return Path("stacks") if STACKS_DIR.is_relative_to(INSTALLED) else STACKS_DIR


class StackFileError(ValueError):
    """No such stack, or its values cannot be read; the message says why and what to do."""


def stack_names() -> list[str]:
    return sorted(
        p.name.removeprefix("Pulumi.").removesuffix(".yaml")
        for p in STACKS_DIR.glob("Pulumi.*.yaml")
    )


def _secure(value: Any) -> bool:
    """Whether a stack file's value is, or holds, one Pulumi keeps encrypted."""
    if isinstance(value, dict):
        return set(value) == {"secure"} or any(_secure(v) for v in value.values())
    if isinstance(value, list):
        return any(_secure(v) for v in value)
    return False


def stack_values(stack: str, *, reveal: bool = False) -> dict[str, Any]:
    """The stack's config values (``namespace:key`` -> value) as its program gets them; a
    secret is a ``Secret`` unless ``reveal`` (then Pulumi decrypts it, with the stack's
    passphrase or secrets provider). ``StackFileError`` when there is no such stack, or Pulumi
    is needed and cannot answer."""
    path = STACKS_DIR / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        found = _service_config(stack, reveal)
        if found:
            return found
        raise StackFileError(
            f"stack {stack!r}: no {_shown(path)}; the stacks are {', '.join(stack_names())}"
        )
    document = yaml.safe_load(path.read_text()) or {}
    values: dict[str, Any] = dict(document.get("config") or {})
    secure = {key for key, value in values.items() if _secure(value)}
    needed = secure if reveal else secure - SECRET_KEYS  # a secret whose value a setting is
    environments = document.get("environment")
    if not environments and not needed:
        return {key: Secret(key) if key in secure else value for key, value in values.items()}
    why = (
        f"its ESC environment ({_environments(environments)})"
        if environments
        else f"the value of its secret {', '.join(sorted(needed))}"
    )
    try:
        return pulumi_cli.config(stack, project_dir(), show_secrets=bool(needed))
    except PulumiError as error:
        raise StackFileError(
            f"stack {stack!r}: {why} is read through the Pulumi CLI: {error}"
        ) from None


def _service_config(stack: str, reveal: bool) -> dict[str, Any]:
    """A stack with no file here, whose config Pulumi Cloud keeps; {} when Pulumi has none."""
    if not pulumi_cli.available():
        return {}
    try:
        return pulumi_cli.config(stack, project_dir(), show_secrets=reveal)
    except PulumiError:
        return {}


def _environments(listed: Any) -> str:
    if isinstance(listed, list):
        return ", ".join(str(name) for name in listed)
    if isinstance(listed, dict):  # `environment: {imports: [...]}`
        return _environments(listed.get("imports", []))
    return str(listed)


def _shown(path: Path) -> str:
    """A path as the user finds it from here."""
    return str(path.relative_to(_here()) if path.is_relative_to(_here()) else path)


def stack_config(stack: str) -> ClusterConfig:
    """The stack's checked ``ClusterConfig``; a bad setting raises ``ConfigError``, a missing
    file ``StackFileError``."""
    return config_of(stack_values(stack), stack)


def config_of(values: dict[str, Any], stack: str = "") -> ClusterConfig:
    """A stack file's ``config:`` values (the project's keys and the cloud's region key), checked
    as the program checks them."""
    project = f"{PROJECT}:"
    settings = {k.removeprefix(project): v for k, v in values.items() if k.startswith(project)}
    return from_settings(settings, values.get(_region_key(settings)), stack)


def write_stack_file(
    stacks_dir: Path,
    name: str,
    settings: Mapping[str, Any],
    region: str,
    header: Sequence[str],
) -> Path:
    """``stacks_dir/Pulumi.NAME.yaml``: ``header`` as comment lines, then ``config:`` with the
    cloud's region and the project's ``settings``, as ``config_of`` reads them back. A stack the
    program would refuse raises its ``ConfigError``, and nothing is written."""
    from_settings(settings, region)
    values = {_region_key(settings): region} | {
        f"{PROJECT}:{key}": value for key, value in settings.items()
    }
    path = stacks_dir / f"Pulumi.{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    body = yaml.safe_dump({"config": values}, sort_keys=False, width=200)
    path.write_text("".join(f"# {line}\n" for line in header) + body)
    return path


def _region_key(settings: Mapping[str, Any]) -> str:
    """The stack file's key for the region of the settings' cloud (AWS unless they say)."""
    return REGION_KEYS.get(str(settings.get("cloud", "aws")), "")
