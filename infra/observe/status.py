"""A node's status file (``status.json``, written by its boot and services), read through a
command channel with the status tool: it takes the file's lock and never follows a link, where a
plain ``cat`` could catch a write half-way."""

from __future__ import annotations

import json
from typing import Any

from infra.boot import VM_PATHS
from infra.core.node_text import printable, printable_values

STATUS_COMMAND = [
    f"{VM_PATHS.bin_dir}/llama-rpc-status",
    "--file",
    f"{VM_PATHS.data_dir}/status.json",
    "show",
]


class StatusError(ValueError):
    """The status file could not be read as a node's status."""


def parse_status(text: str) -> dict[str, Any]:
    """A node's status, its text made printable (the service user writes the file)."""
    try:
        status = json.loads(text)
    except json.JSONDecodeError:
        raise StatusError(f"the status file is not JSON yet: {printable(text[:200])!r}") from None
    if not isinstance(status, dict):
        raise StatusError("the status file holds no JSON object")
    found: dict[str, Any] = printable_values(status)
    return found
