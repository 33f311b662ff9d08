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
  cloud VM its figures are the node's own (``infra.observe.metrics.cpu_use``, ``memory``);
- loopback (no namespaces): llama-server only; the nodes' processes and traffic cannot be told
  apart, so those columns say n/a.

Reading (``read_cluster``) is kept apart from the pure figures and drawing
(``infra.observe.topview``), which the tests exercise on readings they make.
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
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TextIO

from infra.core.limits import METRICS_PORT
from infra.local import cluster
from infra.local.netns import exec_prefix, namespace_pids
from infra.observe import metrics
from infra.observe.metrics import MetricsError, Snapshot
from infra.observe.topview import (
    FOOTER,
    NodeReading,
    ProcessUse,
    live,
    render,
    row,
)

FETCH_TIMEOUT_SECONDS = 2.0


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
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Print a frame every ``interval`` seconds until interrupted; with ``once``, one frame after
    one interval."""
    if interval <= 0:
        raise cluster.LocalClusterError(f"--interval {interval}: give a positive number of seconds")
    return live(
        lambda: read_cluster(spec),
        lambda before, after: frame(spec, before, after, interval),
        interval=interval, once=once, out=out, sleep=sleep, clock=clock,
    )  # fmt: skip
