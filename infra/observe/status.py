"""A node's status file (``status.json``, written by its boot and services), read through a
command channel with the status tool: it takes the file's lock and never follows a link, where a
plain ``cat`` could catch a write half-way."""

from __future__ import annotations

import json
from dataclasses import dataclass
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


# The phases whose progress the node counts, and the status fields it counts in: bytes done, and
# in all (null until known). The download's are the model's parts; the load's the weights sent to
# the workers (a main node alone has none to send, and says no percentage).
PROGRESS_FIELDS = {
    "downloading": ("download_done_bytes", "download_total_bytes"),
    "loading": ("load_sent_bytes", "load_total_bytes"),
}


@dataclass(frozen=True)
class Progress:
    done: int
    total: int | None

    @property
    def percent(self) -> int | None:
        """Whole percent, 100 only once done; None when the total is not known."""
        if not self.total:
            return None
        return min(100 if self.done >= self.total else 99, self.done * 100 // self.total)

    def describe(self) -> str:
        """``41% (94.0 of 229.0 GB)``; ``12.3 GB so far`` without a total."""
        if self.percent is None:
            return f"{gigabytes(self.done)} so far"
        return f"{self.percent}% ({gigabytes(self.done, unit=False)} of {gigabytes(self.total)})"


def gigabytes(count: int | None, *, unit: bool = True) -> str:
    """Decimal GB, as model sizes and disks are sold."""
    shown = f"{(count or 0) / 1e9:,.1f}"
    return f"{shown} GB" if unit else shown


def progress(status: dict[str, Any]) -> Progress | None:
    """What the node has counted of its current phase, if it counts it."""
    fields = PROGRESS_FIELDS.get(str(status.get("phase")))
    if fields is None:
        return None
    done, total = (status.get(field) for field in fields)
    if not isinstance(done, int) or isinstance(done, bool):
        return None
    return Progress(done, total if isinstance(total, int) and total > 0 else None)


def phase_text(status: dict[str, Any], *, short: bool = False) -> str:
    """The phase, with its progress where the node counts it: ``downloading 41%`` (short, for a
    table column), ``downloading 41% (94.0 of 229.0 GB)``."""
    phase = str(status.get("phase") or "starting")
    found = progress(status)
    if found is None or (short and found.percent is None):
        return phase
    return f"{phase} {found.percent}%" if short else f"{phase} {found.describe()}"
