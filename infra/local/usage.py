"""What each node of a local cluster is doing, read from the host: CPU time, memory, the bytes on
its VPC interface, and the main node's KV cache (``infra.observe.usage.UsageProbe``).

A node is its network namespace, as a VM is its own kernel's view:

- CPU: a machine's cgroup (``cpu.stat`` ``usage_usec``, which keeps the time of processes that
  have ended); a node run as processes, the CPU time of the processes in its namespace (``utime``
  + ``stime`` in ``/proc/<pid>/stat``), each counted from when this probe first saw it, so one
  that ends leaves the total as it was;
- memory: the proportional set size of the namespace's processes (``infra.local.procfs``, as
  the local ``top`` reads it);
- bytes: the counters of the node's ``eth0``, its only link to the VPC bridge, from the
  namespace's ``/proc/net/dev``. The main node's link to the host (``tunnel``), which carries the
  API requests, is not counted. The model reaches every node from the host's disk (a bind mount
  or a ``file://`` URL), so these bytes are the nodes' RPC traffic, but with ``--staged``: then
  each node also reads the cluster's store over the VPC, as a cloud's nodes read their bucket
  (the store's request log says how much);
- KV cache: llama-server's ``/slots`` on the main node (``infra.observe.metrics.kv_cache_usage``).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from infra.local import procfs
from infra.local.machines import CGROUP_ROOT
from infra.local.netns import exec_prefix
from infra.local.procfs import Process
from infra.local.spec import ClusterSpec
from infra.observe import metrics
from infra.observe.usage import KvCacheReading, NodeCounters, Reading, Sampler, UsageUnavailable

VPC_INTERFACE = "eth0"
HTTP_TIMEOUT_SECONDS = 10


def received_bytes(namespace: str) -> int:
    """What the VPC interface of ``namespace`` received since the namespace was made."""
    return _interface_counters(namespace)[0]


def sent_bytes(namespace: str) -> int:
    """What the VPC interface of ``namespace`` sent since the namespace was made."""
    return _interface_counters(namespace)[8]


def _interface_counters(namespace: str) -> list[int]:
    """The VPC interface's ``/proc/net/dev`` counters: received bytes first, sent at 8."""
    text = subprocess.run(
        [*exec_prefix(namespace), "cat", "/proc/net/dev"],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout  # fmt: skip
    for line in text.splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == VPC_INTERFACE:
            return [int(value) for value in counters.split()]
    raise UsageUnavailable(f"no {VPC_INTERFACE} in namespace {namespace}")


def cgroup_cpu_seconds(cpu_stat: str) -> float:
    """``usage_usec`` of a cgroup v2 ``cpu.stat``, in seconds."""
    for line in cpu_stat.splitlines():
        name, _, value = line.partition(" ")
        if name == "usage_usec":
            return int(value) / 1e6
    raise ValueError("no usage_usec in cpu.stat")


def _unified_root() -> Path:
    """Where cgroup v2 is mounted: alone, or beside v1 (``unified``)."""
    return CGROUP_ROOT if (CGROUP_ROOT / "cgroup.procs").exists() else CGROUP_ROOT / "unified"


def process_cgroup(pid: int) -> Path | None:
    """The cgroup v2 directory of a process (its ``0::`` line)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return _unified_root() / line[3:].lstrip("/")
    return None


def machine_cgroup(nspawn_pid: int) -> Path | None:
    """A machine's cgroup, from its systemd-nspawn process: nspawn moves itself into
    ``<machine>/supervisor`` and the machine into ``<machine>/payload``."""
    directory = process_cgroup(nspawn_pid)
    if directory is not None and directory.name == "supervisor":
        return directory.parent
    return directory


class CpuAccount:
    """The CPU seconds of a changing set of processes, as one counter that only grows: a
    process adds what it used since it was last seen (all of it when first seen), and one that
    ended takes nothing back."""

    def __init__(self) -> None:
        self.total = 0.0
        self.seen: dict[Process, float] = {}

    def update(self, used: Mapping[Process, float]) -> float:
        for pid, seconds in used.items():
            self.total += max(seconds - self.seen.get(pid, 0.0), 0.0)
        self.seen = dict(used)
        return self.total


class LocalProbe:
    """Reads a running local cluster (namespaces or machines) from the host."""

    def __init__(self, spec: ClusterSpec) -> None:
        if not spec.netns:
            raise UsageUnavailable(
                "the nodes share this machine's loopback, so their traffic and processes cannot "
                "be told apart: bring the cluster up with network namespaces (as root)"
            )
        self.spec = spec
        self._roles = {node.name: node.role for node in spec.nodes}
        self._namespaces = {node.name: node.namespace or "" for node in spec.nodes}
        self._accounts = {name: CpuAccount() for name in self._roles}
        self._lock = threading.Lock()
        main = spec.nodes[0]
        self.url = f"http://{main.ip}:{spec.server_port}"
        network = spec.network()
        # Nothing is sent to the main node's address unless the host's route to it is the
        # cluster's own link.
        if network is None or not network.main_is_routed_here():
            raise UsageUnavailable(
                f"the host's route to {main.ip} is not the cluster's own link; is the "
                f"cluster {spec.id!r} up?"
            )

    @property
    def roles(self) -> Mapping[str, str]:
        return self._roles

    def describe(self) -> dict[str, str]:
        machines = self.spec.machines
        return {
            "cpu": "the machine's cgroup (cpu.stat usage_usec)"
            if machines
            else "utime + stime of the processes in the node's network namespace",
            "memory": "Pss of the processes in the node's network namespace",
            "bytes": f"{VPC_INTERFACE} of the node's network namespace (/proc/net/dev)",
            "kv_cache": "llama-server /slots on the main node",
        }

    def read(self) -> Reading:
        with self._lock:
            at = time.monotonic()
            pids = procfs.namespace_processes(list(self._namespaces.values()))
            nodes = {
                name: self._node(name, pids[ns])
                for name, ns in self._namespaces.items()
                if pids.get(ns)
            }
            return Reading(at=at, nodes=nodes, kv_cache=self._kv_cache())

    def _node(self, name: str, pids: list[int]) -> NodeCounters:
        use = procfs.node_use(pids)
        cpu = self._accounts[name].update(use.cpu_seconds)
        memory = use.memory_bytes
        if self.spec.machines:
            cpu = self._machine_cpu(name)
        received, sent = self._interface_bytes(pids)
        return NodeCounters(cpu, memory, received, sent)

    def _machine_cpu(self, name: str) -> float:
        """The machine's cgroup CPU time: it keeps what ended processes used (llama-bench)."""
        machine = self.spec.node(name).booted()
        nspawn = machine.nspawn_pid()
        directory = machine_cgroup(nspawn) if nspawn else None
        if directory is None:
            raise UsageUnavailable(f"machine {machine.name} is not running")
        return cgroup_cpu_seconds((directory / "cpu.stat").read_text())

    @staticmethod
    def _interface_bytes(pids: list[int]) -> tuple[int, int]:
        for pid in pids:
            try:
                text = Path(f"/proc/{pid}/net/dev").read_text()
            except OSError:
                continue
            snapshot = metrics.Snapshot.of(metrics.proc_net_dev_samples(text), 0.0)
            counters = metrics.network_bytes(snapshot).get(VPC_INTERFACE)
            if counters is not None:
                return counters.received, counters.sent
        raise UsageUnavailable(f"no {VPC_INTERFACE} in the namespace of processes {pids}")

    def _kv_cache(self) -> KvCacheReading | None:
        try:
            slots = self._http("/slots", None, HTTP_TIMEOUT_SECONDS)
        except (OSError, ValueError):  # llama-server restarting, or /slots turned off
            return None
        ratio = metrics.kv_cache_usage(None, slots)
        if ratio is None:
            return None
        return KvCacheReading(ratio, sum(int(slot["n_ctx"]) for slot in slots))

    def recorder(self, interval: float) -> Sampler:
        """Read from this machine in a thread: the reading itself crosses no network."""
        return Sampler(self, interval)

    def complete(self, body: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        reply: dict[str, Any] = self._http("/completion", body, timeout)
        return reply

    def _http(self, path: str, body: Mapping[str, Any] | None, timeout: float) -> Any:
        """GET (or POST ``body`` to) the main node's llama-server: its JSON reply. Only ever its
        http:// address, whose route was checked to be the cluster's own link."""
        request = urllib.request.Request(  # noqa: S310
            f"{self.url}{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            return json.load(response)


def probe(cache: Path, cluster_id: str) -> LocalProbe:
    """A probe of the running local cluster ``cluster_id``."""
    return LocalProbe(ClusterSpec.load(cache, cluster_id))
