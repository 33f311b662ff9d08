"""What the processes of a local cluster's node use, read from ``/proc`` on the host: one
definition of a node's CPU time and memory for the live view (``top``) and the cost run's usage
probe alike.

- a node's processes: those whose network namespace is the node's;
- CPU: ``utime`` + ``stime`` of each (``/proc/<pid>/stat``), keyed by pid and start time so a
  reused pid is another process;
- memory: the proportional set size (``Pss`` in ``/proc/<pid>/smaps_rollup``): a page shared
  by several processes is split between them, so the nodes' figures add up to what this machine
  holds for them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

Process = tuple[int, int]  # pid and start time


def namespace_processes(namespaces: list[str]) -> dict[str, list[int]]:
    """The processes in each named network namespace, from one pass over /proc."""
    inodes: dict[int, str] = {}
    for ns in namespaces:
        try:
            inodes[os.stat(f"/run/netns/{ns}").st_ino] = ns
        except FileNotFoundError:
            continue
    found: dict[str, list[int]] = {ns: [] for ns in namespaces}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            owner = inodes.get(os.stat(f"/proc/{entry.name}/ns/net").st_ino)
        except OSError:  # ended, or a kernel thread
            continue
        if owner is not None:
            found[owner].append(int(entry.name))
    return found


def process_cpu_seconds(stat: str) -> tuple[int, float]:
    """A ``/proc/<pid>/stat`` line's start time (in clock ticks since boot: with the pid, it
    names the process even when the pid is reused) and its utime + stime, in seconds."""
    # The command name may hold spaces and parentheses: the fields follow the last ')'.
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[19]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def pss_bytes(smaps_rollup: str) -> int:
    """The ``Pss`` of a ``/proc/<pid>/smaps_rollup``, in bytes."""
    for line in smaps_rollup.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    raise ValueError("no Pss line in smaps_rollup")


@dataclass(frozen=True)
class NodeUse:
    """The processes of one node: each one's CPU seconds, and their memory (Pss) together."""

    cpu_seconds: dict[Process, float]
    memory_bytes: int


def node_use(pids: list[int]) -> NodeUse:
    """CPU seconds and memory of ``pids``; a process that ends while being read is left out."""
    used: dict[Process, float] = {}
    memory = 0
    for pid in pids:
        try:
            started, seconds = process_cpu_seconds(Path(f"/proc/{pid}/stat").read_text())
            pss = pss_bytes(Path(f"/proc/{pid}/smaps_rollup").read_text())
        except (OSError, ValueError, IndexError):
            continue
        used[pid, started] = seconds
        memory += pss
    return NodeUse(used, memory)
