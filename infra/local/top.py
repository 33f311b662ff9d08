"""``lrc local top``: what every node of a local cluster is doing, refreshed live.

Per node: its phase (from its status file, as ``status`` shows it), CPU use, memory, the bytes it
sends to and receives from the other nodes, and on each main node the KV cache use, tokens
generated per second and the requests in flight (llama-server's ``/metrics`` and ``/slots``).

Where the figures come from:
- llama-server: its ``/metrics`` and ``/slots`` on the API port, and on machines node-exporter on
  each node's ``METRICS_PORT``, asked over HTTP from inside the node's own network namespace (the
  metrics port admits only the cluster's network and the node itself);
- traffic: node-exporter on machines; the namespace's ``/proc/net/dev`` for processes (no
  exporter runs there). Both count the node's own namespace;
- CPU and memory: the CPU time and memory (proportional set size) of the processes in the
  node's namespace (``infra.local.procfs``, as the cost run reads them), CPU as a share of this
  machine's cores (the nodes share them). On machines too: node-exporter
  in a container reads the host's ``/proc/stat`` and ``/proc/meminfo``, not the machine's; on a
  cloud VM its figures are the node's own (``infra.observe.metrics.cpu_use``, ``memory``);
- loopback (no namespaces): llama-server only; the nodes' processes and traffic cannot be told
  apart, so those columns say n/a.

Reading (``read_cluster``) is kept apart from the pure figures and drawing
(``infra.observe.topview``), which the tests exercise on readings they make.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TextIO

from infra.core.limits import METRICS_PORT
from infra.local import cluster, procfs
from infra.local.netns import exec_prefix
from infra.local.options import LocalClusterError
from infra.local.spec import ClusterSpec, LocalNode, api_key_header
from infra.observe import metrics
from infra.observe.metrics import MetricsError, Snapshot
from infra.observe.status import phase_text
from infra.observe.topview import (
    FOOTER,
    NodeReading,
    ProcessUse,
    Row,
    live,
    render,
    row,
)

FETCH_TIMEOUT_SECONDS = 2.0


def footer(spec: ClusterSpec, cpus: int) -> list[str]:
    if spec.netns:
        source = (
            f"CPU %: the node's processes, as a share of this machine's {cpus} cores; "
            "MEMORY: their proportional set size (shared pages split between their users)"
        )
        source += (
            " (of this machine's; node-exporter in a machine reads the host's CPU and memory); "
            "RX, TX: node-exporter."
            if spec.machines
            else " (no node-exporter runs in processes mode)."
        )
    else:
        source = "CPU, memory and traffic: n/a, the nodes share this machine's loopback."
    return [FOOTER, source]


# --- reading the nodes (I/O) --------------------------------------------------------------


def _fetch(namespace: str | None, url: str, headers: dict[str, str] | None = None) -> str:
    """GET ``url`` from inside ``namespace`` (the node's own), or from here on loopback. The
    headers (the API key) go to curl on its stdin, never on a command line others can read."""
    if namespace is None:
        request = urllib.request.Request(url, headers=headers or {})  # noqa: S310
        with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_SECONDS) as response:  # noqa: S310
            body: bytes = response.read()
            return body.decode()
    curl = shutil.which("curl")
    if curl is None:
        raise OSError("curl is not installed")
    result = subprocess.run(
        [*exec_prefix(namespace), curl, "--silent", "--show-error", "--fail",
         "--max-time", str(FETCH_TIMEOUT_SECONDS), "--header", "@-", url],
        input="".join(f"{name}: {value}\n" for name, value in (headers or {}).items()),
        capture_output=True, text=True, check=False, timeout=FETCH_TIMEOUT_SECONDS + 5,
    )  # fmt: skip
    if result.returncode != 0:
        raise OSError(result.stderr.strip() or f"curl exit {result.returncode}")
    return result.stdout


def process_use(namespace: str) -> ProcessUse:
    """CPU seconds and memory of the processes in ``namespace`` (root: any process)."""
    use = procfs.node_use(procfs.namespace_processes([namespace])[namespace])
    return ProcessUse(use.cpu_seconds, use.memory_bytes)


def read_node(spec: ClusterSpec, node: LocalNode, phase: str) -> NodeReading:
    namespace = node.namespace
    machines = spec.machines
    notes: list[str] = []
    found: dict[str, Any] = {}
    if machines:
        try:
            text = _fetch(namespace, f"http://{node.ip}:{METRICS_PORT}/metrics")
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
    if node.role == "main":
        base = f"http://{node.ip}:{spec.server_port}"
        keyed = api_key_header(spec)
        try:
            text = _fetch(namespace, f"{base}/metrics", keyed)
            found["server"] = Snapshot.parse(text, time.monotonic())
            found["slots"] = json.loads(_fetch(namespace, f"{base}/slots", keyed))
        except (OSError, subprocess.SubprocessError, MetricsError, ValueError) as error:
            if phase == "serving":
                notes.append(f"llama-server's /metrics did not answer ({error})")
    return NodeReading(
        name=node.name,
        role=node.role,
        phase=phase,
        taken_at=time.monotonic(),
        notes=tuple(notes),
        **found,
    )


def read_cluster(spec: ClusterSpec) -> list[NodeReading]:
    """Every node (of every serving group), read at once."""
    statuses = cluster.read_status(spec)
    stopped = set(cluster.stopped_machines(spec))
    nodes = spec.nodes

    def phase(name: str) -> str:
        status = statuses.get(name, {})
        return "machine stopped" if name in stopped else phase_text(status, short=True)

    with ThreadPoolExecutor(max_workers=min(16, len(nodes))) as pool:
        return list(pool.map(lambda n: read_node(spec, n, phase(n.name)), nodes))


def title(spec: ClusterSpec, interval: float) -> str:
    kind = "machines" if spec.machines else "processes" if spec.netns else "loopback"
    groups = spec.replicas
    shown = f", {groups} serving groups" if groups > 1 else ""
    return (
        f"local cluster {spec.id!r} ({kind}, {len(spec.nodes)} nodes{shown}) · "
        f"every {interval:g} s · {time.strftime('%H:%M:%S')}"
    )


def rows(before: list[NodeReading], after: list[NodeReading]) -> list[Row]:
    cpus = os.cpu_count() or 1
    return [row(b, a, cpus) for b, a in zip(before, after, strict=True)]


def frame(
    spec: ClusterSpec, before: list[NodeReading], after: list[NodeReading], interval: float
) -> str:
    return render(rows(before, after), title(spec, interval), footer(spec, os.cpu_count() or 1))


def run(
    spec: ClusterSpec,
    interval: float,
    *,
    once: bool,
    out: TextIO = sys.stdout,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    draw_rows: Callable[[list[Row]], str] | None = None,
) -> int:
    """Print a frame every ``interval`` seconds until interrupted; with ``once``, one frame after
    one interval; with ``draw_rows``, once, what it draws of the rows (``--json``)."""
    if interval <= 0:
        raise LocalClusterError(f"--interval {interval}: give a positive number of seconds")

    def draw(before: list[NodeReading], after: list[NodeReading]) -> str:
        if draw_rows is not None:
            return draw_rows(rows(before, after))
        return frame(spec, before, after, interval)

    return live(
        lambda: read_cluster(spec), draw,
        interval=interval, once=once or draw_rows is not None, out=out, sleep=sleep, clock=clock,
    )  # fmt: skip
