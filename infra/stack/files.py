"""The stack files under ``stacks/`` (``Pulumi.<stack>.yaml``): read as the program reads them,
and written (``lrc plan --write-stack``) once the program's own check accepts them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from infra.core.layout import PROJECT
from infra.stack.config import REGION_KEYS, ClusterConfig, from_settings

REPO = Path(__file__).resolve().parents[2]
STACKS_DIR = REPO / "stacks"


def project_dir() -> Path:
    """The Pulumi project's directory (its Pulumi.yaml), where Pulumi is asked about a stack."""
    return REPO


class StackFileError(ValueError):
    """No such stack file; the message lists the stacks there are."""


def stack_names() -> list[str]:
    return sorted(
        p.name.removeprefix("Pulumi.").removesuffix(".yaml")
        for p in STACKS_DIR.glob("Pulumi.*.yaml")
    )


def stack_values(stack: str) -> dict[str, Any]:
    path = STACKS_DIR / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        raise StackFileError(
            f"stack {stack!r}: no {path.relative_to(REPO)}; the stacks are "
            f"{', '.join(stack_names())}"
        )
    values: dict[str, Any] = (yaml.safe_load(path.read_text()) or {}).get("config", {})
    return values


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
