"""A cost run's record: one JSON line per event, per stack, under ``runs/<id>/<stack>/``.

Every step is written as it happens, so a run that crashed can be reported, cleaned up or
watched from another terminal, and the report is made from these files alone.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EVENTS_FILE = "events.jsonl"
RUN_FILE = "run.json"

# The phases a stack goes through, in order; each starts with an event of that name.
PHASES = ("preflight", "up", "wait", "bench", "destroy", "audit")


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


@dataclass
class EventLog:
    """The events of one stack in one run."""

    directory: Path
    # Called with each event as it is written (the command line prints them).
    echo: Callable[[str, dict[str, Any]], None] | None = None

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        return self.directory / EVENTS_FILE

    def emit(self, event: str, **data: Any) -> dict[str, Any]:
        record = {"at": round(time.time(), 3), "event": event, **data}
        with self._lock, self.path.open("a") as out:
            out.write(json.dumps(record, sort_keys=True) + "\n")
        if self.echo:
            self.echo(self.directory.name, record)
        return record

    def events(self) -> list[dict[str, Any]]:
        return read_events(self.path)


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every whole event in the file (a line cut short by a crash is left out)."""
    records = []
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def stack_dirs(run_dir: Path) -> Iterator[Path]:
    for child in sorted(run_dir.iterdir()):
        if (child / EVENTS_FILE).is_file():
            yield child


def last(events: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    return next((e for e in reversed(events) if e["event"] == name), None)


def phase_of(events: list[dict[str, Any]]) -> str:
    """The stack's phase now: the last phase begun, or how it ended (``done``, ``failed``)."""
    for event in reversed(events):
        if event["event"] == "finished":
            return "done" if event.get("ok") else "failed"
        if event["event"] in PHASES:
            return str(event["event"])
    return "pending"


def needs_cleanup(events: list[dict[str, Any]]) -> bool:
    """Whether anything may still exist: up began and no destroy finished since."""
    up = max((i for i, e in enumerate(events) if e["event"] == "up"), default=None)
    if up is None:
        return False
    return not any(e["event"] == "destroyed" for e in events[up:])
