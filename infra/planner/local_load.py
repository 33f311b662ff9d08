"""Time to serve with worker-local loading, and time to heal after a lost worker.

Worker-local loading, staged, with a prebuilt llama.cpp: every node boots, fetches the prebuilt
binary from the stack's object store, and fetches only the byte ranges of the GGUF its own layers
need (the main node the header too), many ranged reads at once, each tensor checked by sha256 as
it comes, onto its own disk (a worker's into its RPC server's tensor cache). Once every node has
its slice, the main node loads its own layers from its disk and sends each worker an 8-byte key a
tensor instead of the weights; each worker reads that tensor's cache file from its disk and
repacks it (patch 0005), one tensor after another. The nodes work side by side, so the slowest
node's fetch and the slowest node's load set the time::

    boot -> binary  (each node)
         -> fetch its slice (each node) ---> load its slice (each node, from its own disk)

Healing: when a worker's RPC server dies, the main node's llama-server aborts at its next send
and systemd restarts both (cloud-init/systemd: ``RestartSec``). Then the group loads again: with
the main node sending the weights (``main-sends``, the staged path's loader) the main
node reads the whole model again and sends every worker its layers; with worker-local loading
each node reads its own slice from its own disk and page cache, and no weight crosses the
network.

A node's fetch writes its slice at its disk's pace (the page cache takes it only up to the
kernel's dirty limit). Its load reads from the page cache what its memory holds beside the loaded
copy and the rest from its disk: at boot, the kernel evicts that much of the slice's pages as
the copy grows (at worst pages not yet read); after a restart, that much could not have stayed
cached beside the copy the dead process held. One node has no slice to take: its timeline is
the staged one with the binary in the build's place. Every rate names its source;
``SERVE_GOAL_SECONDS`` and ``HEAL_GOAL_SECONDS`` are the design's targets, and ``verdict`` says
which phase of the critical path binds and by how much.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infra.catalog import InstanceType
from infra.clouds import FACTS
from infra.core import sizing
from infra.core.placement import NodeShare, Placement
from infra.models import Model
from infra.planner import serve
from infra.planner.serve import GB, MIB, Phase, ServeTime

# The prebuilt llama.cpp a node fetches instead of building: the pinned build's bin/ (llama-server,
# ggml-rpc-server, llama-cli, llama-bench) as built on this repository's machine (x86_64, static);
# an aarch64 build of the same targets is of the same order. One ranged read fetches it.
BINARY_BYTES = 44_494_352
BINARY_BASIS = "the pinned build's bin/ as built here, 44.5 MB (x86_64; aarch64 of the same order)"

# Ranged reads a node keeps in flight for its slice, each of RANGE_BYTES: "typical sizes for
# byte-range requests are 8 MB or 16 MB" (AWS whitepaper, "Best Practices Design Patterns:
# Optimizing Amazon S3 Performance", Use Byte-Range Fetches).
SLICE_STREAMS = 64
RANGE_BYTES = 16 * MIB
# The store's request rate, shared by every node reading the staged model: 5,500 GET/HEAD a
# second per partitioned prefix ("Optimizing Amazon S3 performance", Amazon S3 user guide).
STORE_GETS_PER_SECOND = 5500
STORE_GETS_BASIS = "5,500 GETs/s per prefix (Amazon S3 user guide)"

# read() of a cold file on one thread, as the RPC server reads a cache file, against the disk's
# sequential rate: bench/results/readahead.json's medians, read() of 16 MiB pieces at the kernel's
# 128 KiB read-ahead (0.764 GB/s) and at 16 MiB (0.9335 GB/s, the disk's sequential rate).
READ_SHARE = {128: 0.764 / 0.9335, 16384: 1.0}
# A worker's cache disk keeps the kernel's read-ahead: no node script raises it (fetch-model.sh
# raises only the main node's model disk's, MODEL_READ_AHEAD_KB).
WORKER_READ_AHEAD_KB = serve.DEFAULT_READ_AHEAD_KB

# Measured on the local cluster of machines (bench/worker_local.py --machines,
# bench/results/worker_local_machines.json; Gemma 3 270M, a main node and two workers, systemd
# restarting both), medians of every run's first kill (a boot's first lost worker): after
# `kill -9` of one worker's ggml-rpc-server, a request sent at once made the main node's
# llama-server abort at its send ("Main process exited" in its journal) ABORT_SECONDS after the
# kill, and the group answered it again BACK_SECONDS after the kill (a test holds both to the
# file). The restart between is the units' RestartSec (cloud-init/systemd/llama-server.service,
# llama-rpc-worker.service); the rest is starting, waiting for the workers, loading the 0.25 GB
# model and answering.
HEAL_BASIS = (
    "measured on the local cluster of machines (bench/results/worker_local_machines.json: Gemma "
    "3 270M, kill -9 of a worker's RPC server)"
)
ABORT_SECONDS = 0.1
BACK_SECONDS = 8.7
RESTART_SECONDS = 5.0
# systemd counts a unit's restarts for the whole boot: each later loss waits longer, up to this.
RESTART_MAX_SECONDS = 30.0
RESTART_BASIS = (
    "RestartSec=5 of llama-server.service and llama-rpc-worker.service, at a boot's first lost "
    "worker; up to RestartMaxDelaySec=30s after more (RestartSteps=5)"
)

# The design's targets: a staged model serving within three minutes of `pulumi up`, and a group
# serving again within a minute of losing a worker.
SERVE_GOAL_SECONDS = 180.0
HEAL_GOAL_SECONDS = 60.0

# The staged path with worker-local loading and a prebuilt binary, beside serve.PATHS.
PATH = "staged-local"
HEAL_PATHS = ("main-sends", "worker-local")


@dataclass(frozen=True)
class Disk:
    """A node's disk for its slice: its sequential MiB/s and read-ahead (KiB)."""

    mibps: float
    read_ahead_kb: int


def slice_bytes(share: NodeShare) -> int:
    return share.weight_bytes


def disk_bytes(share: NodeShare, node: InstanceType) -> int:
    """Bytes of a node's slice its load reads from its disk rather than the page cache: what its
    memory cannot hold beside the loaded copy (weights and KV cache). As the loaded copy grows,
    the kernel evicts that much of the slice's pages, at worst pages not yet read; after a
    restart, that much could not have stayed cached beside the copy the dead process held."""
    room = sizing.usable_memory_bytes(node) - share.bytes
    return min(slice_bytes(share), max(0, slice_bytes(share) - room))


def _limit(limits: dict[str, float]) -> tuple[float, str]:
    """The least rate (bytes a second) and a basis naming it first, then the others."""
    name, rate = min(limits.items(), key=lambda item: item[1])
    others = "; ".join(f"{n} {r / GB:.2f} GB/s" for n, r in limits.items() if n != name)
    return rate, f"{name} {rate / GB:.2f} GB/s (beside: {others})"


def fetch_rate(node: InstanceType, disk: Disk, nodes: int) -> tuple[float, str]:
    """Bytes a second at which a node fetches its slice, and what bounds it: the page cache
    takes the slice only up to the kernel's dirty limit (no node script raises it for a slice),
    so its disk's write counts."""
    cores = min(SLICE_STREAMS, node.vcpus)
    limits = {
        "the node's network (catalog)": (node.network_gbps or math.inf) * GB / 8,
        f"{SLICE_STREAMS} ranged reads ({serve.STORE_BASIS})": (
            SLICE_STREAMS * serve.STORE_STREAM_MBPS * 1e6
        ),
        f"its share of the store's {STORE_GETS_BASIS}, {RANGE_BYTES // MIB} MiB ranges": (
            STORE_GETS_PER_SECOND * RANGE_BYTES / nodes
        ),
        f"sha256, each tensor on a core of its own, up to {cores} at once ({serve.LOAD_BASIS})": (
            cores * serve.SHA256_GBPS_PER_CORE * GB
        ),
    }
    limits[f"its disk's write, {disk.mibps:.0f} MiB/s"] = disk.mibps * MIB
    return _limit(limits)


def cache_read_rate(node: InstanceType, disk: Disk) -> tuple[float, str]:
    """Bytes a second at which one thread read()s cache files from a node's disk: the measured
    share of the disk's rate at its read-ahead, within the IOPS the disk has for I/Os that size."""
    share = READ_SHARE[disk.read_ahead_kb]
    rate = disk.mibps * MIB * share
    basis = (
        f"read() on one thread at {share:.2f} of its disk's {disk.mibps:.0f} MiB/s with a "
        f"{disk.read_ahead_kb} KiB read-ahead ({serve.READ_AHEAD_BASIS})"
    )
    facts = FACTS[node.provider]
    io_kib = serve.IOPS_IO_KIB.get(facts.disk.name)
    iops = facts.disk.provision(math.ceil(disk.mibps)).iops
    if io_kib is not None and iops is not None:
        # A read() larger than the read-ahead is read in I/Os up to the device's largest (the
        # kernel's ractl_max_pages), assumed at least the size the disk counts as one.
        cap = iops * io_kib * 1024
        if cap < rate:
            rate = cap
            basis = (
                f"{iops} IOPS of {io_kib} KiB reads ({facts.disk.name} counts each I/O up to "
                f"{io_kib} KiB as one: Amazon EBS user guide)"
            )
    return rate, basis


@dataclass(frozen=True)
class Node:
    """One node of the group as worker-local loading sees it: its type, its share of the
    layers, the disk its slice is on and whether its memory holds the slice twice."""

    index: int  # 0: the main node
    instance: InstanceType
    share: NodeShare
    disk: Disk

    @property
    def name(self) -> str:
        return "main" if self.index == 0 else f"worker {self.index}"

    @property
    def bytes(self) -> int:
        return slice_bytes(self.share)

    @property
    def from_disk(self) -> int:
        return disk_bytes(self.share, self.instance)

    @property
    def from_cache(self) -> int:
        return self.bytes - self.from_disk

    def cache_seconds(self) -> float:
        return self.from_cache / (serve.POPULATE_GBPS * GB)

    def split(self) -> str:
        return (
            f"{self.from_cache / GB:.1f} GB from the page cache at {serve.POPULATE_GBPS} GB/s "
            f"({serve.LOAD_BASIS}), {self.from_disk / GB:.1f} GB from its disk (what memory "
            "cannot hold beside the loaded copy)"
        )


def nodes_of(
    main: InstanceType, worker: InstanceType, layout: Placement, disk_mibps: float
) -> list[Node]:
    """The group's nodes, each slice on a disk of ``disk_mibps``: the main node's model disk
    (fetch-model.sh's read-ahead); each worker's provisioned as it, at the kernel's read-ahead
    (WORKER_READ_AHEAD_KB)."""
    return [
        Node(
            index,
            main if index == 0 else worker,
            share,
            Disk(disk_mibps, sizing.MODEL_READ_AHEAD_KB if index == 0 else WORKER_READ_AHEAD_KB),
        )
        for index, share in enumerate(layout.shares)
    ]


def _main_load(node: Node, start: float) -> Phase:
    """The main node's own layers from its own disk and page cache, read by page faults
    (patch 0003) beside the repack on every core."""
    repack, repack_basis = serve.repack_rate(node.instance)
    mibps, basis = serve.demand_paged_mibps(node.instance, node.disk.mibps)
    read = node.cache_seconds() + node.from_disk / (mibps * MIB)
    return Phase(
        "load main",
        start,
        max(read, node.bytes / repack),
        f"its {node.bytes / GB:.1f} GB: {node.split()}, by page faults at {mibps:.0f} MiB/s "
        f"({basis}); {repack_basis} beside it",
    )


def _worker_load(node: Node, start: float) -> Phase:
    """A worker's layers from its own tensor cache: each tensor's file read, then repacked
    (patch 0005), one tensor after another as the main node's keys come."""
    read, how = cache_read_rate(node.instance, node.disk)
    repack, repack_basis = serve.repack_rate(node.instance)
    return Phase(
        f"load {node.name}",
        start,
        node.cache_seconds() + node.from_disk / read + node.bytes / repack,
        f"{node.bytes / GB:.1f} GB, the main node sending 8-byte keys, no weights: each tensor's "
        f"cache file read, {node.split()} at {read / MIB:.0f} MiB/s: {how}; then {repack_basis} "
        "(patch 0005)",
    )


def _loads(nodes: list[Node], start: float) -> list[Phase]:
    return [_main_load(nodes[0], start), *(_worker_load(n, start) for n in nodes[1:])]


def _fetch(node: Node, start: float, count: int) -> Phase:
    rate, basis = fetch_rate(node.instance, node.disk, count)
    if node.index == 0:
        what = "its slice (and the header, whose few MB are not counted)"
    else:
        what = (
            f"its slice into its tensor cache, on a disk of its own at {node.disk.mibps:.0f} "
            "MiB/s (as the main node's model disk; the hourly price counts the workers' system "
            "disks only)"
        )
    return Phase(
        f"fetch {node.name}",
        start,
        node.bytes / rate,
        f"{what}, {node.bytes / GB:.1f} GB at {basis}",
    )


def _binary(main: InstanceType, start: float) -> Phase:
    return Phase(
        "binary",
        start,
        BINARY_BYTES / (serve.STORE_STREAM_MBPS * 1e6)
        + BINARY_BYTES / (serve.SHA256_GBPS_PER_CORE * GB),
        f"the prebuilt llama.cpp ({BINARY_BASIS}) in one ranged read ({serve.STORE_BASIS}), "
        "checked by its sha256; the on-node build is the fallback "
        f"({serve.build_seconds(main.vcpus):.0f} s)",
    )


def time_to_serve(
    model: Model, main: InstanceType, worker: InstanceType, layout: Placement, disk_mibps: float
) -> ServeTime:
    """Staged, worker-local, prebuilt: each node boots, fetches the binary and its own slice,
    then loads it from its own disk. One node has no slice to take: the staged path as the main
    node runs it, with the binary instead of the build."""
    boot = Phase("boot", 0.0, serve.BOOT_SECONDS, serve.BOOT_BASIS)
    binary = _binary(main, boot.end)
    if len(layout.shares) == 1:
        return _prebuilt(
            serve.time_to_serve(model, main, layout, disk_mibps, path="staged"), binary
        )
    nodes = nodes_of(main, worker, layout, disk_mibps)
    phases = [boot, binary, *(_fetch(node, boot.end, len(nodes)) for node in nodes)]
    phases += _loads(nodes, max(p.end for p in phases))
    return ServeTime(PATH, tuple(phases))


def _prebuilt(staged: ServeTime, binary: Phase) -> ServeTime:
    """``staged`` with ``binary`` in the build's place: the load starts once the binary and the
    check are done."""
    build = next(p for p in staged.phases if p.name == "build")
    loads = [p for p in staged.phases if p.name.startswith("load")]
    before = [p for p in staged.phases if p is not build and not p.name.startswith("load")]
    shift = max(binary.end, *(p.end for p in before)) - min(p.start for p in loads)
    moved = [Phase(p.name, p.start + shift, p.seconds, p.basis) for p in loads]
    return ServeTime(PATH, (before[0], binary, *before[1:], *moved))


def _restart() -> list[Phase]:
    abort = Phase(
        "abort",
        0.0,
        ABORT_SECONDS,
        f"the main node's llama-server aborts at its next send to the lost worker ({HEAL_BASIS})",
    )
    restart = Phase("restart", abort.end, RESTART_SECONDS, RESTART_BASIS)
    start = Phase(
        "start",
        restart.end,
        BACK_SECONDS - ABORT_SECONDS - RESTART_SECONDS,
        f"the processes start, the main node finds every worker answering, a 0.25 GB model loads "
        f"and the group answers ({HEAL_BASIS}: {BACK_SECONDS} s from the kill); the load below "
        "comes on top",
    )
    return [abort, restart, start]


@dataclass(frozen=True)
class Group:
    """What a heal reloads: the model, the nodes' types, the layers and the model disk's rate."""

    model: Model
    main: InstanceType
    worker: InstanceType
    layout: Placement
    disk_mibps: float


def time_to_heal(group: Group, path: str) -> ServeTime:
    """From the loss of a worker's RPC server to the group serving again, on one path."""
    if path not in HEAL_PATHS:
        raise ValueError(f"path must be one of {', '.join(HEAL_PATHS)}, not {path!r}")
    if len(group.layout.shares) < 2:
        raise ValueError("a cluster of one node has no worker to lose")
    phases = _restart()
    start = phases[-1].end
    if path == "main-sends":
        phases += serve.patched_load(group.model, group.main, group.layout, group.disk_mibps, start)
    else:
        nodes = nodes_of(group.main, group.worker, group.layout, group.disk_mibps)
        phases += _loads(nodes, start)
    return ServeTime(f"heal-{path}", tuple(phases))


def critical_path(timeline: ServeTime) -> list[Phase]:
    """The phases, each starting where the one before it ends, that end last."""
    last = max(timeline.phases, key=lambda p: (p.end, p.seconds))
    path = [last]
    while path[0].start > 0:
        before = [p for p in timeline.phases if math.isclose(p.end, path[0].start, abs_tol=1e-6)]
        if not before:
            break
        path.insert(0, max(before, key=lambda p: p.seconds))
    return path


@dataclass(frozen=True)
class Verdict:
    goal_seconds: float
    total_seconds: float
    path: tuple[Phase, ...]

    @property
    def met(self) -> bool:
        return self.total_seconds <= self.goal_seconds

    @property
    def over_seconds(self) -> float:
        return self.total_seconds - self.goal_seconds

    @property
    def binding(self) -> Phase:
        """The longest phase on the critical path."""
        return max(self.path, key=lambda p: p.seconds)

    def line(self) -> str:
        steps = " -> ".join(f"{p.name} {p.seconds:.0f} s" for p in self.path)
        if self.met:
            return (
                f"within the {self.goal_seconds:.0f} s goal by {-self.over_seconds:.0f} s; "
                f"longest: {self.binding.name} ({self.binding.seconds:.0f} s); critical path: "
                f"{steps}"
            )
        return (
            f"misses the {self.goal_seconds:.0f} s goal by {self.over_seconds:.0f} s; binds: "
            f"{self.binding.name} ({self.binding.seconds:.0f} s); critical path: {steps}"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "goalSeconds": round(self.goal_seconds),
            "met": self.met,
            "overSeconds": round(self.over_seconds),
            "binding": self.binding.name,
            "criticalPath": [p.name for p in self.path],
        }


def verdict(timeline: ServeTime, goal_seconds: float) -> Verdict:
    return Verdict(goal_seconds, timeline.total_seconds, tuple(critical_path(timeline)))
