"""The stack files under ``stacks/`` (``Pulumi.<stack>.yaml``), read as the program reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from infra.core.layout import PROJECT
from infra.stack.config import REGION_KEYS, ClusterConfig, from_settings

REPO = Path(__file__).resolve().parents[2]
STACKS_DIR = REPO / "stacks"


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
    cloud = str(settings.get("cloud", "aws"))
    return from_settings(settings, values.get(REGION_KEYS.get(cloud, "")), stack)
