"""``python -m infra.local top``: what every node of a local cluster is doing, refreshed live.

Per node: its phase (from its status file, as ``status`` shows it), CPU use, memory, the bytes it
sends to and receives from the other nodes, and on each main node the KV cache use, tokens
generated per second and the requests in flight (llama-server's ``/metrics`` and ``/slots``).

Where the figures come from:
- llama-server: its ``/metrics`` and ``/slots`` on the API port, and on machines node-exporter on
  each node's ``METRICS_PORT``, asked over HTTP from inside the node's own network namespace (the
  metrics port admits only the cluster's network and the node itself);
- traffic: node-exporter on machines; the namespace's ``/proc/net/dev`` for processes (no
  exporter runs there). Both count the node's own namespace;
- CPU and memory: the CPU time and resident memory of the processes in the node's namespace,
  CPU as a share of this machine's cores (the nodes share them). On machines too: node-exporter
  in a container reads the host's ``/proc/stat`` and ``/proc/meminfo``, not the machine's; on a
  cloud VM its figures are the node's own (``infra.metrics.cpu_use``, ``memory``);
- loopback (no namespaces): llama-server only; the nodes' processes and traffic cannot be told
  apart, so those columns say n/a.

Reading (``read_cluster``) is kept apart from the pure figures (``row``) and drawing
(``render``), which the tests exercise on readings they make.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from infra import metrics
from infra.local import cluster
from infra.local.netns import exec_prefix, namespace_pids
from infra.metrics import MetricsError, Snapshot
from infra.types import METRICS_PORT

# Interfaces that carry no traffic between nodes: loopback, and the local host's link to a main
# node (``infra.local.netns.VpcNetwork``), which carries the user's requests.
NOT_BETWEEN_NODES = frozenset({"lo", "tunnel"})
FETCH_TIMEOUT_SECONDS = 2.0
CLEAR_SCREEN = "\x1b[H\x1b[2J"


@dataclass(frozen=True)
class ProcessUse:
    """The processes in a node's namespace: CPU seconds of each (by pid) and resident bytes."""

    cpu_seconds: Mapping[int, float]
    resident_bytes: int


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
        figures["memory_bytes"] = after.processes.resident_bytes
    if after.server:
        if before.server:
            figures["tokens_per_second"] = metrics.tokens_per_second(before.server, after.server)
        ratio = metrics.kv_cache_usage(after.server, after.slots)
        figures["kv_cache_percent"] = None if ratio is None else 100 * ratio
        figures["requests"] = metrics.requests(after.server)
    return Row(after.name, after.role, after.phase, notes=after.notes, **figures)


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
    "in use; TOK/s: tokens generated; REQ: requests processing+deferred."
)


def footer(spec: Mapping[str, Any], cpus: int) -> list[str]:
    if spec.get("netns"):
        source = (
            f"CPU %: the node's processes, as a share of this machine's {cpus} cores; "
            "MEMORY: their resident memory"
        )
        source += (
            " (of this machine's; node-exporter in a machine reads the host's CPU and memory); "
            "RX, TX: node-exporter."
            if spec.get("machines")
            else " (no node-exporter runs in processes mode)."
        )
    else:
        source = "CPU, memory and traffic: n/a, the nodes share this machine's loopback."
    return [FOOTER, source]


# --- reading the nodes (I/O) --------------------------------------------------------------


def _fetch(namespace: str | None, url: str) -> str:
    """GET ``url`` from inside ``namespace`` (the node's own), or from here on loopback."""
    if namespace is None:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_SECONDS) as response:  # noqa: S310
            body: bytes = response.read()
            return body.decode()
    curl = shutil.which("curl")
    if curl is None:
        raise OSError("curl is not installed")
    result = subprocess.run(
        [*exec_prefix(namespace), curl, "--silent", "--show-error", "--fail",
         "--max-time", str(FETCH_TIMEOUT_SECONDS), url],
        capture_output=True, text=True, check=False, timeout=FETCH_TIMEOUT_SECONDS + 5,
    )  # fmt: skip
    if result.returncode != 0:
        raise OSError(result.stderr.strip() or f"curl exit {result.returncode}")
    return result.stdout


def process_use(namespace: str) -> ProcessUse:
    """CPU seconds and resident memory of the processes in ``namespace`` (root: any process)."""
    ticks = os.sysconf("SC_CLK_TCK")
    page = os.sysconf("SC_PAGE_SIZE")
    seconds: dict[int, float] = {}
    resident = 0
    for pid in namespace_pids(namespace):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            # utime and stime: the 14th and 15th fields, the 12th and 13th after the name.
            seconds[pid] = (int(fields[11]) + int(fields[12])) / ticks
            resident += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
    return ProcessUse(seconds, resident)


def read_node(
    spec: Mapping[str, Any], node: Mapping[str, Any], phase: str, server_port: int
) -> NodeReading:
    namespace = node.get("namespace")
    machines = bool(spec.get("machines"))
    notes: list[str] = []
    found: dict[str, Any] = {}
    if machines:
        try:
            text = _fetch(namespace, f"http://{node['ip']}:{METRICS_PORT}/metrics")
            found["exporter"] = Snapshot.parse(text, time.monotonic())
        except (OSError, subprocess.SubprocessError, MetricsError) as error:
            notes.append(f"node-exporter on port {METRICS_PORT} did not answer ({error})")
    if namespace:
        found["processes"] = process_use(namespace)
    if namespace and not machines:
        try:
            dev = subprocess.run(
                [*exec_prefix(namespace), "cat", "/proc/net/dev"],
                capture_output=True, text=True, check=True, timeout=10,
            ).stdout  # fmt: skip
            found["network"] = Snapshot.of(metrics.proc_net_dev_samples(dev), time.monotonic())
        except (OSError, subprocess.SubprocessError, MetricsError) as error:
            notes.append(f"its namespace's traffic could not be read ({error})")
    if node["role"] == "main":
        base = f"http://{node['ip']}:{server_port}"
        try:
            found["server"] = Snapshot.parse(_fetch(namespace, f"{base}/metrics"), time.monotonic())
            found["slots"] = json.loads(_fetch(namespace, f"{base}/slots"))
        except (OSError, subprocess.SubprocessError, MetricsError, ValueError) as error:
            if phase == "serving":
                notes.append(f"llama-server's /metrics did not answer ({error})")
    return NodeReading(
        name=node["name"],
        role=node["role"],
        phase=phase,
        taken_at=time.monotonic(),
        notes=tuple(notes),
        **found,
    )


def read_cluster(spec: Mapping[str, Any]) -> list[NodeReading]:
    """Every node (of every serving group), read at once."""
    statuses = cluster.read_status(dict(spec))
    stopped = set(cluster.stopped_machines(dict(spec)))
    nodes = spec["nodes"]

    def phase(name: str) -> str:
        status = statuses.get(name, {})
        return "machine stopped" if name in stopped else str(status.get("phase", "starting"))

    with ThreadPoolExecutor(max_workers=min(16, len(nodes))) as pool:
        return list(
            pool.map(
                lambda n: read_node(spec, n, phase(n["name"]), int(spec["server_port"])), nodes
            )
        )


def title(spec: Mapping[str, Any], interval: float) -> str:
    kind = "machines" if spec.get("machines") else "processes" if spec.get("netns") else "loopback"
    groups = spec.get("replicas", 1)
    shown = f", {groups} serving groups" if groups > 1 else ""
    return (
        f"local cluster {spec['id']!r} ({kind}, {len(spec['nodes'])} nodes{shown}) · "
        f"every {interval:g} s · {time.strftime('%H:%M:%S')}"
    )


def frame(
    spec: Mapping[str, Any], before: list[NodeReading], after: list[NodeReading], interval: float
) -> str:
    cpus = os.cpu_count() or 1
    rows = [row(b, a, cpus) for b, a in zip(before, after, strict=True)]
    return render(rows, title(spec, interval), footer(spec, cpus))


def run(
    spec: Mapping[str, Any],
    interval: float,
    *,
    once: bool,
    out: TextIO = sys.stdout,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Print a frame every ``interval`` seconds until interrupted; with ``once``, one frame after
    one interval."""
    if interval <= 0:
        raise cluster.LocalClusterError(f"--interval {interval}: give a positive number of seconds")
    before = read_cluster(spec)
    try:
        while True:
            sleep(interval)
            after = read_cluster(spec)
            shown = frame(spec, before, after, interval)
            out.write(shown if once else CLEAR_SCREEN + shown)
            out.flush()
            if once:
                return 0
            before = after
    except KeyboardInterrupt:
        return 0
