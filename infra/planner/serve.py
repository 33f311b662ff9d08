"""Time to serve: from `pulumi up` to the first answer, as a timeline of named phases.

The main node's critical path, as the node scripts run it (cloud-init/scripts):

    boot -> build (llama.cpp)  ---------------+
         -> download -> verify (sha256) ------+-> load: the main's layers, then each worker's
                                                  layers sent to it, one worker after another

The build and the download run at once (node-boot.sh); the workers boot and build meanwhile.
Every rate is a named figure with its basis: the catalog, a benchmark of this repository
(``bench/results/*.json``), a cited source, or a stated assumption. Two download paths:

- ``internet``: the model's own host, through the NAT gateway, at an assumed rate;
- ``staged``: the provider's object store in the stack's region (``lrc stage``),
  many ranged reads at once over the private path, up to the instance's network.

The download, as fetch-model.sh runs it: at most ``DOWNLOAD_JOBS`` parts at once (every part
where the main node's memory holds the file, else as many as it holds), each part's sha256 check
starting as its download ends, beside the next parts' downloads; so the parts come in rounds, and
only the last round's checks are left once the last byte is in. A model that fits downloads at
the network's pace: the page cache may hold all of it dirty (``WRITEBACK_BYTES``); one that does
not, at the disk's.

The load, with the build's patch set (``cloud-init/patches``, docs/loader.md): where the file
fits in the main node's memory it is mapped in on one thread (``MAP_POPULATE`` of pages the
download left in the page cache); then the main node repacks its own Q4_0 weights on every core
(patch 0004) while each worker is sent its layers at the same time (patch 0002), each without the
FNV hash and cache probe (0001), on one flow each. Where the file does not fit, nothing is read
ahead (0003): the load reads the file from the main disk once by page faults, each reading the
disk's read-ahead window (which fetch-model.sh raises), at the rate measured for demand paging
against sequential reads (bench/readahead.py) and within the disk's IOPS, while the same three
things go on. ``loader="upstream"`` is llama.cpp at the pin without the patches
(``llamaCppPatchesOff: [all]``): populate everything first, repack on one core, hash and send to
one worker after the other; it reproduces Arm's published 405B load (about 30 min from a 125
MiB/s disk, tests/planner/test_plan.py) within the bounds that test sets.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from infra.catalog import InstanceType
from infra.clouds import FACTS
from infra.core import perf, sizing
from infra.core.placement import Placement
from infra.models import Model

MIB = 1024**2
GB = 1e9

PATHS = ("internet", "staged")

# Boot and package installation before the build: an assumption until a cost run measures it.
BOOT_SECONDS = 90.0
BOOT_BASIS = "assumption: VM start, cloud-init and packages (a cost run measures it)"

# The full llama.cpp build (bench/results/boot.json: 697.5 CPU-s, 401.9 s on 2 cores), split
# by Amdahl's law into a serial part and a part that divides across the vCPUs. A worker builds
# only ggml-rpc-server: 0.112 of the full build's CPU time (the same file).
BUILD_SERIAL_SECONDS = 106.3
BUILD_PARALLEL_CPU_SECONDS = 591.2
WORKER_BUILD_CPU_RATIO = 0.112
BUILD_BASIS = "bench/results/boot.json: the full build's CPU time, by Amdahl's law"

# The internet path's rate: the model's host decides it (--download-gbps).
INTERNET_GBPS = 2.0
# The staged path: AWS's S3 performance guidelines ("Performance guidelines for Amazon S3",
# horizontal scaling): one concurrent ranged GET per 85-90 MB/s of throughput. GCS and Azure
# Blob publish no per-connection figure; the same is used.
STORE_STREAM_MBPS = 85.0
STORE_BASIS = "AWS S3 performance guidelines: one ranged GET per 85-90 MB/s"
# fetch-model.sh's defaults (a test keeps them equal): ranged reads per staged part, and parts
# fetched at once.
STAGED_STREAMS = 16
DOWNLOAD_JOBS = sizing.DOWNLOAD_JOBS
# Large models are published split: a Hugging Face file holds at most 50 GB.
PART_BYTES = 50 * GB

# Measured by bench/load.py on this repository's machine (bench/results/load.json). These are
# x86 figures: no Graviton, Axion or Cobalt figure is published. SHA-256 of one part per core,
# as fetch-model.sh checks it (OpenSSL through Python's hashlib).
SHA256_GBPS_PER_CORE = 1.217
LOAD_BASIS = "bench/results/load.json (measured on this repository's x86 machine)"
# Upstream: llama-server loading weights it holds itself from the page cache (Q4_0, repacked on
# one core), and sending them to an RPC worker one tensor at a time: the FNV hash (and its cache
# probe) on one core, then the copies and the send ("phases": hash_gbps, copy_gbps). The send's
# copies and the wire overlap (the socket takes the bytes as the wire drains them); the hash
# does not (upstream's ggml-rpc hashes a tensor before it sends it).
LOAD_GBPS = 0.73
HASH_GBPS = 1.081
COPY_GBPS = 0.616
# Patched ("phases"): mapping a cached file in (MAP_POPULATE, one thread); the Q4_0 repack per
# thread, and how much of a thread each added one is worth (the measured speedup on this
# machine's cores over their count); a weight's way to one worker without the hash, its copy
# overlapped with the wire (rpc_send_gbps_patched).
POPULATE_GBPS = 25.338
REPACK_GBPS_PER_THREAD = 0.983
REPACK_THREAD_EFFICIENCY = 0.9
RPC_SEND_GBPS_PATCHED = 0.625
LOADERS = ("patched", "upstream")
# A model larger than memory is read by page faults (patch 0003): one thread copying out of a
# mapping keeps one read-ahead window in flight, so each window costs the disk's latency on top
# of its transfer. bench/results/readahead.json (medians of interleaved rounds, a cold disk of
# this repository's machine): such a thread at the kernel's 128 KiB read-ahead and at
# fetch-model.sh's, and read() of 16 MiB pieces, the disk's sequential rate. The latency is what
# the 128 KiB rate leaves beyond the transfer; a cloud disk's is no lower (EBS: "single-digit
# millisecond", Amazon EBS volume types).
SEQUENTIAL_READ_GBPS = 0.9335
DEMAND_PAGED_GBPS = {128: 0.5201, 16384: 0.6554}
READ_AHEAD_BASIS = "bench/results/readahead.json (a cold disk of this repository's machine)"
DEFAULT_READ_AHEAD_KB = 128  # the kernel's, where the benchmark measures the latency
# The largest I/O a disk type counts as one of its IOPS; a smaller one counts as a whole one.
# gp3: "I/O size is capped at 256 KiB for SSD volumes" (Amazon EBS user guide, "Amazon EBS I/O
# characteristics and monitoring",
# https://docs.aws.amazon.com/ebs/latest/userguide/ebs-io-characteristics.html).
IOPS_IO_KIB = {"gp3": 256}
# One TCP flow carries the weights to each worker. AWS caps a flow at 10 Gbit/s inside a
# cluster placement group (FACTS); the other providers publish no cap, so the same is used.
SINGLE_FLOW_GBPS = 10.0


@dataclass(frozen=True)
class Phase:
    name: str
    start: float
    seconds: float
    basis: str

    @property
    def end(self) -> float:
        return self.start + self.seconds

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "startSeconds": round(self.start),
            "seconds": round(self.seconds),
            "basis": self.basis,
        }


@dataclass(frozen=True)
class ServeTime:
    path: str
    phases: tuple[Phase, ...]

    @property
    def total_seconds(self) -> float:
        return max(p.end for p in self.phases)

    def seconds(self, prefix: str) -> float:
        """Seconds of the phases whose names start with ``prefix`` ("load": every load phase)."""
        return sum(p.seconds for p in self.phases if p.name.startswith(prefix))

    def to_json(self) -> dict[str, object]:
        return {
            "totalSeconds": round(self.total_seconds),
            "phases": [p.to_json() for p in self.phases],
        }


class Timelines(Mapping[str, ServeTime]):
    """Timelines by path, each worked out the first time it is read: a search weighs every
    candidate cluster and shows only a few."""

    def __init__(self, make: Mapping[str, Callable[[], ServeTime]]) -> None:
        self._make = dict(make)
        self._made: dict[str, ServeTime] = {}

    def __getitem__(self, path: str) -> ServeTime:
        if path not in self._made:
            self._made[path] = self._make[path]()
        return self._made[path]

    def __iter__(self) -> Iterator[str]:
        return iter(self._make)

    def __len__(self) -> int:
        return len(self._make)

    def __repr__(self) -> str:
        return f"Timelines({', '.join(self._make)})"


def build_seconds(vcpus: int) -> float:
    return BUILD_SERIAL_SECONDS + BUILD_PARALLEL_CPU_SECONDS / vcpus


def worker_build_seconds(vcpus: int) -> float:
    """ggml-rpc-server alone: the full build's time scaled by its share of the CPU time."""
    return build_seconds(vcpus) * WORKER_BUILD_CPU_RATIO


def part_count(model: Model) -> int:
    return max(1, math.ceil(model.size_bytes / PART_BYTES))


def fits_page_cache(model: Model, main: InstanceType) -> bool:
    """Whether the main node's memory holds the whole file: then the checksum and the load read
    it from memory, not from the disk again."""
    return sizing.fits_memory(model.size_bytes, main)


def _jobs(model: Model, main: InstanceType, loader: str) -> int:
    """Parts fetched at once: upstream as the scripts did before they bounded it by memory."""
    if loader == "upstream":
        return DOWNLOAD_JOBS
    return sizing.download_jobs(model.size_bytes, part_count(model), main)


def _download_rate(
    main: InstanceType,
    path: str,
    parts: int,
    *,
    disk_mibps: float,
    internet_gbps: float,
    disk_bound: bool,
) -> tuple[float, str]:
    """Gbit/s at which ``parts`` parts download together, and which limit sets it."""
    limits = {"the instance's network (catalog)": main.network_gbps or math.inf}
    if path == "internet":
        limits[f"the model host, assumed {internet_gbps:g} Gbit/s"] = internet_gbps
    else:
        streams = STAGED_STREAMS * parts
        limits[f"{streams} ranged reads: {STORE_BASIS}"] = streams * STORE_STREAM_MBPS * 8e6 / GB
    if disk_bound:
        limits[f"the main disk's write, {disk_mibps:.0f} MiB/s"] = disk_mibps * MIB * 8 / GB
    basis, gbps = min(limits.items(), key=lambda item: item[1])
    return gbps, basis


def _check_rate(
    main: InstanceType, parts: int, disk_mibps: float, cached: bool
) -> tuple[float, str]:
    """Bytes a second at which ``parts`` parts are checked together (a core each), and how."""
    rate = min(parts, main.vcpus) * SHA256_GBPS_PER_CORE * GB
    basis = f"{SHA256_GBPS_PER_CORE} GB/s a core from the page cache ({LOAD_BASIS})"
    if not cached and disk_mibps * MIB < rate:
        rate = disk_mibps * MIB
        basis = f"read again from the main disk at {disk_mibps:.0f} MiB/s (memory cannot hold them)"
    return rate, basis


def _fetch(
    model: Model,
    main: InstanceType,
    start: float,
    *,
    path: str,
    disk_mibps: float,
    internet_gbps: float,
    loader: str,
) -> tuple[Phase, Phase]:
    """The download and the checks left after it, round by round as fetch-model.sh runs them:
    ``jobs`` parts at once, each part's check beside the next round's downloads. Not the disk
    where the file fits in memory (the page cache holds it dirty while the disk catches up:
    WRITEBACK_BYTES); upstream, the disk bounds it and the checks wait as the scripts did."""
    count, jobs = part_count(model), _jobs(model, main, loader)
    part = model.size_bytes / count
    disk_bound = loader == "upstream" or not fits_page_cache(model, main)
    end, checked, rounds = start, start, []
    for first in range(0, count, jobs):
        parts = min(jobs, count - first)
        gbps, limit = _download_rate(
            main,
            path,
            parts,
            disk_mibps=disk_mibps,
            internet_gbps=internet_gbps,
            disk_bound=disk_bound,
        )
        end += parts * part * 8 / (gbps * GB)
        cached = fits_page_cache(model, main) or (
            loader == "patched" and parts * part <= sizing.usable_memory_bytes(main)
        )
        check, check_basis = _check_rate(main, parts, disk_mibps, cached)
        checked = max(checked, end + parts * part / check)
        rounds.append(f"{parts} at {gbps:.2f} Gbit/s ({limit})")
    said = [f"{len(list(same))} x {text}" for text, same in itertools.groupby(rounds)]
    download = Phase(
        "download",
        start,
        end - start,
        f"{path}: {count} part(s), {jobs} at a time (fetch-model.sh): " + "; ".join(said),
    )
    earlier = "; each earlier part's ran beside the next downloads" if len(rounds) > 1 else ""
    verify = Phase(
        "verify", end, checked - end, f"the last {parts} part(s)' sha256, {check_basis}{earlier}"
    )
    return download, verify


def time_to_serve(
    model: Model,
    main: InstanceType,
    layout: Placement,
    disk_mibps: float,
    *,
    path: str = "internet",
    internet_gbps: float = INTERNET_GBPS,
    loader: str = "patched",
) -> ServeTime:
    """The main node's timeline on one download path."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {', '.join(PATHS)}, not {path!r}")
    if loader not in LOADERS:
        raise ValueError(f"loader must be one of {', '.join(LOADERS)}, not {loader!r}")
    boot = Phase("boot", 0.0, BOOT_SECONDS, BOOT_BASIS)
    build = Phase("build", boot.end, build_seconds(main.vcpus), BUILD_BASIS)
    download, verify = _fetch(
        model,
        main,
        boot.end,
        path=path,
        disk_mibps=disk_mibps,
        internet_gbps=internet_gbps,
        loader=loader,
    )
    phases = [boot, build, download, verify]
    # The workers are ready by then: their build is shorter than the main node's on any type
    # (worker_build_seconds; tests/planner/test_plan.py).
    start = max(build.end, verify.end)
    load = _upstream_load if loader == "upstream" else patched_load
    phases += load(model, main, layout, disk_mibps, start)
    return ServeTime(path, tuple(phases))


def _flow_bytes_per_second(main: InstanceType) -> float:
    return min(main.network_gbps or SINGLE_FLOW_GBPS, SINGLE_FLOW_GBPS) * GB / 8


def patched_load(
    model: Model, main: InstanceType, layout: Placement, disk_mibps: float, start: float
) -> list[Phase]:
    phases = []
    if fits_page_cache(model, main):
        populate = Phase(
            "load populate",
            start,
            model.size_bytes / (POPULATE_GBPS * GB),
            f"the cached file mapped in (MAP_POPULATE) on one thread at {POPULATE_GBPS} GB/s "
            f"({LOAD_BASIS})",
        )
        phases.append(populate)
        start = populate.end
    else:
        mibps, basis = demand_paged_mibps(main, disk_mibps)
        phases.append(
            Phase(
                "load disk read",
                start,
                model.size_bytes / (mibps * MIB),
                f"the file read once from the main disk by page faults as the load touches it "
                f"(memory cannot hold it: no pre-read, patch 0003) at {mibps:.0f} MiB/s: {basis}; "
                "beside the phases below",
            )
        )
    own = layout.shares[0].weight_bytes
    repack, basis = repack_rate(main)
    phases.append(Phase("load main", start, own / repack, f"{own / GB:.1f} GB {basis}"))
    flow = _flow_bytes_per_second(main)
    rate = min(RPC_SEND_GBPS_PATCHED * GB, flow)
    # A worker repacks each weight as it arrives (patch 0005), before it takes the next: on its
    # own cores, at the main node's repack rate (the workers are of its type).
    for index, share in enumerate(layout.shares[1:], start=1):
        phases.append(
            Phase(
                f"load worker {index}",
                start,
                share.weight_bytes / rate + share.weight_bytes / repack,
                f"{share.weight_bytes / GB:.1f} GB sent at the same time as the other workers' "
                f"(patch 0002), without the hash (0001), at {rate / GB:.2f} GB/s: the lesser of "
                f"one connection's measured {RPC_SEND_GBPS_PATCHED} GB/s ({LOAD_BASIS}) and one "
                f"flow's {flow * 8 / GB:g} Gbit/s; each weight then {basis} on the worker "
                "(patch 0005)",
            )
        )
    return phases


def fault_latency_seconds() -> float:
    """What a demand-paged read waits for each read-ahead window beyond its transfer, from the
    measured rates at the kernel's read-ahead."""
    window = DEFAULT_READ_AHEAD_KB * 1024
    return window / (DEMAND_PAGED_GBPS[DEFAULT_READ_AHEAD_KB] * GB) - window / (
        SEQUENTIAL_READ_GBPS * GB
    )


def demand_paged_gbps(read_ahead_kb: int, disk_gbps: float) -> float:
    """GB/s of one thread reading a cold disk by page faults: one window in flight at a time."""
    window = read_ahead_kb * 1024
    return window / (fault_latency_seconds() + window / (disk_gbps * GB)) / GB


def demand_paged_mibps(main: InstanceType, disk_mibps: float) -> tuple[float, str]:
    """MiB/s at which the load reads a file larger than memory from the main disk by page
    faults, and why: one read-ahead window in flight (fetch-model.sh raises the model's disk's
    then: MODEL_READ_AHEAD_KB), within the IOPS the disk has for I/Os of that size."""
    facts = FACTS[main.provider]
    read_ahead = sizing.MODEL_READ_AHEAD_KB
    mibps = demand_paged_gbps(read_ahead, disk_mibps * MIB / GB) * GB / MIB
    basis = (
        f"one {read_ahead} KiB read-ahead window at a time (fetch-model.sh's), each waiting "
        f"{fault_latency_seconds() * 1e3:.2f} ms beyond its transfer at the disk's "
        f"{disk_mibps:.0f} MiB/s (page faults against sequential reads, {READ_AHEAD_BASIS})"
    )
    io_kib = IOPS_IO_KIB.get(facts.disk.name)
    iops = facts.disk.provision(math.ceil(disk_mibps)).iops
    if io_kib is not None and iops is not None:
        # Each fault reads the read-ahead beyond what the last one read.
        cap = iops * min(read_ahead, io_kib) / 1024
        if cap < mibps:
            mibps = cap
            basis = (
                f"{iops} IOPS of {min(read_ahead, io_kib)} KiB reads ({facts.disk.name} counts "
                f"each I/O up to {io_kib} KiB as one: Amazon EBS user guide)"
            )
    return mibps, basis


def repack_rate(main: InstanceType) -> tuple[float, str]:
    """Bytes a second the main node repacks on every vCPU, and the basis: the measured rate per
    thread, each thread beyond the first worth the measured efficiency, up to a third of the
    node's memory bandwidth (the repack reads each byte, writes it, and the new pages are
    zeroed first)."""
    threads = main.vcpus
    rate = REPACK_GBPS_PER_THREAD * (1 + (threads - 1) * REPACK_THREAD_EFFICIENCY) * GB
    basis = (
        f"repacked on {threads} threads at {REPACK_GBPS_PER_THREAD} GB/s each, "
        f"{REPACK_THREAD_EFFICIENCY:.2f} of that for each thread beyond the first (patch 0004; "
        f"{LOAD_BASIS})"
    )
    bandwidth = perf.node_bandwidth_gbps(main)
    if bandwidth is not None and bandwidth * GB / 3 < rate:
        rate = bandwidth * GB / 3
        basis = f"repacked at a third of the node's {bandwidth:.0f} GB/s of memory bandwidth"
    return rate, basis


def _upstream_load(
    model: Model, main: InstanceType, layout: Placement, disk_mibps: float, start: float
) -> list[Phase]:
    phases = []
    if not fits_page_cache(model, main):
        populate = Phase(
            "load populate",
            start,
            model.size_bytes / (disk_mibps * MIB),
            f"the whole file faulted in (MAP_POPULATE) from the main disk at {disk_mibps:.0f} "
            "MiB/s: memory cannot hold it",
        )
        phases.append(populate)
        start = populate.end
    own = layout.shares[0].weight_bytes
    phases.append(
        Phase(
            "load main",
            start,
            own / (LOAD_GBPS * GB),
            f"{own / GB:.1f} GB repacked on one core at {LOAD_GBPS} GB/s ({LOAD_BASIS})",
        )
    )
    flow = _flow_bytes_per_second(main)
    for index, share in enumerate(layout.shares[1:], start=1):
        # One tensor after another: hash it, then copy it onto the wire.
        per_byte = 1 / (HASH_GBPS * GB) + max(1 / (COPY_GBPS * GB), 1 / flow)
        phases.append(
            Phase(
                f"load worker {index}",
                phases[-1].end,
                share.weight_bytes * per_byte,
                f"{share.weight_bytes / GB:.1f} GB hashed at {HASH_GBPS} GB/s, then copied at "
                f"{COPY_GBPS} GB/s ({LOAD_BASIS}) onto one flow of {flow * 8 / GB:g} Gbit/s, "
                "whichever is slower",
            )
        )
    return phases
