"""A process the local cluster starts detached and tracks by its pid file (the balancer's HAProxy,
the store's server): whether it still runs, and stopping it with its process group."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text())
    except (FileNotFoundError, ValueError):
        return None


def alive(pid_file: Path) -> bool:
    pid = read_pid(pid_file)
    if pid is None:
        return False
    try:
        # A zombie (exited, not yet reaped by whoever started it) is not alive.
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def stop(pid_file: Path, grace_seconds: float = 10) -> None:
    """SIGTERM to its process group, then SIGKILL after ``grace_seconds``; the pid file goes."""
    pid = read_pid(pid_file)
    if pid is None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not alive(pid_file):
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + grace_seconds
        while alive(pid_file) and time.monotonic() < deadline:
            time.sleep(0.1)
    pid_file.unlink(missing_ok=True)
