"""The live view of a cluster's nodes, as ``lrc local top`` and ``lrc top``
draw it: two readings of every node (``NodeReading``) make a row of figures each (``row``), and
the rows a frame (``render``). Pure: the readers fetch (``infra.local.top`` on this machine,
``infra.observe.top`` through a stack's command channel).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO, TypeVar

from infra.observe import metrics
from infra.observe.metrics import MetricsError, Snapshot

CLEAR_SCREEN = "\x1b[H\x1b[2J"
Readings = TypeVar("Readings")

# Interfaces that carry no traffic between nodes: loopback, and the local host's link to a main
# node (``infra.local.netns.VpcNetwork``), which carries the user's requests.
NOT_BETWEEN_NODES = frozenset({"lo", "tunnel"})


@dataclass(frozen=True)
class ProcessUse:
    """The processes in a node's namespace: CPU seconds of each (by pid and start time) and
    their memory (``infra.local.procfs``: proportional set size)."""

    cpu_seconds: Mapping[tuple[int, int], float]
    memory_bytes: int


@dataclass(frozen=True)
class NodeReading:
    """One read of one node."""

    name: str
    role: str
    phase: str
    taken_at: float
    exporter: Snapshot | None = None  # node-exporter
    server: Snapshot | None = None  # llama-server /metrics (main nodes)
    slots: Sequence[Any] | None = None  # llama-server /slots
    network: Snapshot | None = None  # the namespace's /proc/net/dev (processes)
    processes: ProcessUse | None = None
    # Why a figure is missing, said once under the table.
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Row:
    """One node's figures over the interval between two readings; None: not known."""

    name: str
    role: str
    phase: str
    cpu_percent: float | None = None
    memory_bytes: int | None = None
    memory_total_bytes: int | None = None
    received_per_second: float | None = None
    sent_per_second: float | None = None
    received_bytes: int | None = None  # since the node (or its namespace) started
    sent_bytes: int | None = None
    kv_cache_percent: float | None = None
    tokens_per_second: float | None = None
    requests: metrics.Requests | None = None
    # With a draft model: the drafted tokens accepted since llama-server started, in %.
    draft_accepted_percent: float | None = None
    notes: tuple[str, ...] = field(default=())


def _between_nodes(use: Mapping[str, metrics.NetworkUse]) -> metrics.NetworkUse | None:
    kept = {device: u for device, u in use.items() if device not in NOT_BETWEEN_NODES}
    return metrics.network_total(kept) if kept else None


def _bytes_between_nodes(snapshot: Snapshot) -> tuple[int, int] | None:
    kept = [b for d, b in metrics.network_bytes(snapshot).items() if d not in NOT_BETWEEN_NODES]
    if not kept:
        return None
    return sum(b.received for b in kept), sum(b.sent for b in kept)


def process_cpu_percent(before: ProcessUse, after: ProcessUse, elapsed: float, cpus: int) -> float:
    """CPU time the processes used in the interval, as a share of ``cpus`` cores. A process that
    started in the interval counts whole; one that ended counts nothing of its last moments."""
    spent = sum(
        seconds - before.cpu_seconds.get(pid, 0.0)
        for pid, seconds in after.cpu_seconds.items()
        if seconds >= before.cpu_seconds.get(pid, 0.0)
    )
    return min(100.0, 100.0 * spent / elapsed / cpus) if elapsed > 0 and cpus > 0 else 0.0


def row(before: NodeReading, after: NodeReading, cpus: int) -> Row:
    """The node's figures between two readings (``cpus``: this machine's, for processes)."""
    elapsed = after.taken_at - before.taken_at
    if elapsed <= 0:
        raise MetricsError(f"{after.name}: the readings must be taken one after the other")
    figures: dict[str, Any] = {}
    if before.exporter and after.exporter:
        cpu = metrics.cpu_use(before.exporter, after.exporter)
        figures["cpu_percent"] = cpu.mean_percent if cpu else None
        memory = metrics.memory(after.exporter)
        if memory:
            figures |= {"memory_bytes": memory.used_bytes, "memory_total_bytes": memory.total_bytes}
    counters = (
        (before.exporter, after.exporter)
        if before.exporter and after.exporter
        else (before.network, after.network)
    )
    if counters[0] and counters[1]:
        use = _between_nodes(metrics.network_use(counters[0], counters[1]))
        if use:
            figures |= {
                "received_per_second": use.received_per_second,
                "sent_per_second": use.sent_per_second,
            }
        totals = _bytes_between_nodes(counters[1])
        if totals:
            figures["received_bytes"], figures["sent_bytes"] = totals
    # The processes in the node's namespace, when read, say its CPU and memory: a machine's
    # exporter reads the host's (see the module's docstring).
    if before.processes and after.processes:
        figures["cpu_percent"] = process_cpu_percent(
            before.processes, after.processes, elapsed, cpus
        )
        figures["memory_bytes"] = after.processes.memory_bytes
    if after.server:
        if before.server:
            figures["tokens_per_second"] = metrics.tokens_per_second(before.server, after.server)
        ratio = metrics.kv_cache_usage(after.server, after.slots)
        figures["kv_cache_percent"] = None if ratio is None else 100 * ratio
        figures["requests"] = metrics.requests(after.server)
        acceptance = metrics.draft_acceptance(after.server)
        figures["draft_accepted_percent"] = None if acceptance is None else 100 * acceptance.ratio
    return Row(after.name, after.role, after.phase, notes=after.notes, **figures)


def rows_data(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """The rows as ``--json`` prints them: every figure, None where it is not known."""
    return [dataclasses.asdict(row_) for row_ in rows]


def human_bytes(count: float | None, per_second: bool = False) -> str:
    if count is None:
        return "n/a"
    suffix = "/s" if per_second else ""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            shown = f"{count:.0f}" if unit == "B" else f"{count:.1f}"
            return f"{shown} {unit}{suffix}"
        count /= 1024
    raise AssertionError("unreachable")


def _number(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


COLUMNS = (
    ("NODE", 8, "<"),
    ("ROLE", 6, "<"),
    ("PHASE", 16, "<"),
    ("CPU %", 6, ">"),
    ("MEMORY", 21, ">"),
    ("RX/s", 12, ">"),
    ("TX/s", 12, ">"),
    ("RX", 10, ">"),
    ("TX", 10, ">"),
    ("KV %", 6, ">"),
    ("TOK/s", 7, ">"),
    ("REQ", 5, ">"),
    ("ACC %", 6, ">"),
)


def _cells(row_: Row) -> list[str]:
    memory = human_bytes(row_.memory_bytes)
    if row_.memory_bytes is not None and row_.memory_total_bytes:
        memory += f" of {human_bytes(row_.memory_total_bytes)}"
    main = row_.role == "main"
    requests = row_.requests
    return [
        row_.name,
        row_.role,
        row_.phase,
        _number(row_.cpu_percent),
        memory,
        human_bytes(row_.received_per_second, per_second=True),
        human_bytes(row_.sent_per_second, per_second=True),
        human_bytes(row_.received_bytes),
        human_bytes(row_.sent_bytes),
        _number(row_.kv_cache_percent) if main else "",
        _number(row_.tokens_per_second) if main else "",
        (f"{requests.processing}+{requests.deferred}" if requests else "n/a") if main else "",
        _number(row_.draft_accepted_percent, 0) if row_.draft_accepted_percent is not None else "",
    ]


def _line(cells: Sequence[str]) -> str:
    return " ".join(
        f"{cell:{align}{width}}" for cell, (_, width, align) in zip(cells, COLUMNS, strict=True)
    ).rstrip()


def render(rows: Sequence[Row], title: str, footer: Sequence[str] = ()) -> str:
    """One frame: a title, a line per node, and what the columns mean and why any is n/a."""
    lines = [title, _line([name for name, _, _ in COLUMNS])]
    lines += [_line(_cells(r)) for r in rows]
    notes = [f"{r.name}: {note}" for r in rows for note in r.notes]
    lines += ["", *footer, *notes]
    return "\n".join(lines).rstrip() + "\n"


FOOTER = (
    "RX, TX: bytes between nodes (since the node started), and per second; KV %: KV cache cells "
    "in use; TOK/s: tokens generated; REQ: requests processing+deferred; ACC %: with a draft "
    "model, the drafted tokens accepted."
)


def live(
    read: Callable[[], Readings],
    draw: Callable[[Readings, Readings], str],
    *,
    interval: float,
    once: bool,
    out: TextIO,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> int:
    """Draw a frame from each two readings at least ``interval`` seconds apart, each over the
    last, until Ctrl-C; with ``once``, one plain frame."""
    started = clock()
    before = read()
    try:
        while True:
            sleep(max(0.0, started + interval - clock()))
            started = clock()
            after = read()
            shown = draw(before, after)
            out.write(shown if once else CLEAR_SCREEN + shown)
            out.flush()
            if once:
                return 0
            before = after
    except KeyboardInterrupt:
        return 0
