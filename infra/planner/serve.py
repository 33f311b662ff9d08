"""Time to serve: from `pulumi up` to the first answer, as a timeline of named phases.

The main node's critical path, as the node scripts run it (cloud-init/scripts):

    boot -> build (llama.cpp)  ---------------+
         -> download -> verify (sha256) ------+-> load: the main's layers, then each worker's
                                                  layers sent to it, one worker after another

The build and the download run at once (node-boot.sh); the workers boot and build meanwhile.
Every rate is a named figure with its basis: the catalog, a benchmark of this repository
(``bench/results/*.json``), a cited source, or a stated assumption. Two download paths:

- ``internet``: the model's own host, through the NAT gateway, at an assumed rate;
- ``staged``: the provider's object store in the stack's region (``python -m infra.stage``),
  many ranged reads at once over the private path, up to the instance's network.

The load at the pinned commit: llama-server maps the file and faults all of it in first
(``MAP_POPULATE``), then repacks its own Q4_0 weights on one core, then for each worker hashes
every tensor over 10 MiB (FNV-1a, one core), copies it into a message and sends it on one flow,
one worker after another. Where the file does not fit in the main node's memory, the page cache
cannot hold it between the download, the checksum and the load: the checksum and the load's
populate read it from the disk again. What the populate evicted is read once more during the
tensors' hashing; that read is not counted: without it the phases already put Arm's published
405B load (about 30 min from a 125 MiB/s disk, tests/planner/test_plan.py) 36 % high.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infra.catalog import InstanceType
from infra.core import sizing
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
DOWNLOAD_JOBS = 8
# Large models are published split: a Hugging Face file holds at most 50 GB.
PART_BYTES = 50 * GB

# Measured by bench/load.py on this repository's machine (bench/results/load.json). These are
# x86 figures: no Graviton, Axion or Cobalt figure is published. SHA-256 of one part per core,
# as fetch-model.sh checks it (OpenSSL through Python's hashlib).
SHA256_GBPS_PER_CORE = 1.439
# llama-server loading weights it holds itself from the page cache (Q4_0, repacked).
LOAD_GBPS = 0.954
# Weights llama-server sends to an RPC worker, per byte apart from the wire: FNV-1a hashing
# (one core), the copy into the message, and the worker's copy into its buffer.
RPC_SEND_GBPS = 0.483
LOAD_BASIS = "bench/results/load.json (measured on this repository's x86 machine)"
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
    return model.size_bytes <= sizing.usable_memory_bytes(main)


def _download(
    model: Model, main: InstanceType, path: str, disk_mibps: float, internet_gbps: float
) -> tuple[float, str]:
    """Seconds to fetch the file, and which limit sets the rate."""
    limits = {"the instance's network (catalog)": main.network_gbps or math.inf}
    if path == "internet":
        limits[f"the model host, assumed {internet_gbps:g} Gbit/s"] = internet_gbps
    else:
        streams = STAGED_STREAMS * min(part_count(model), DOWNLOAD_JOBS)
        limits[f"{streams} ranged reads: {STORE_BASIS}"] = streams * STORE_STREAM_MBPS * 8e6 / GB
    limits[f"the main disk's write, {disk_mibps:.0f} MiB/s"] = disk_mibps * MIB * 8 / GB
    basis, gbps = min(limits.items(), key=lambda item: item[1])
    return model.size_bytes * 8 / (gbps * GB), basis


def _verify(model: Model, main: InstanceType, disk_mibps: float) -> tuple[float, str]:
    # fetch-model.sh checks each part in the job that fetched it.
    parts = min(part_count(model), DOWNLOAD_JOBS, main.vcpus)
    rate = parts * SHA256_GBPS_PER_CORE * GB
    basis = f"sha256 of {parts} part(s) at once, {SHA256_GBPS_PER_CORE} GB/s each ({LOAD_BASIS})"
    if not fits_page_cache(model, main) and disk_mibps * MIB < rate:
        rate = disk_mibps * MIB
        basis = f"read again from the main disk at {disk_mibps:.0f} MiB/s (memory cannot hold it)"
    return model.size_bytes / rate, basis


def time_to_serve(
    model: Model,
    main: InstanceType,
    layout: Placement,
    disk_mibps: float,
    *,
    path: str = "internet",
    internet_gbps: float = INTERNET_GBPS,
) -> ServeTime:
    """The main node's timeline on one download path."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {', '.join(PATHS)}, not {path!r}")
    boot = Phase("boot", 0.0, BOOT_SECONDS, BOOT_BASIS)
    build = Phase("build", boot.end, build_seconds(main.vcpus), BUILD_BASIS)
    seconds, basis = _download(model, main, path, disk_mibps, internet_gbps)
    download = Phase("download", boot.end, seconds, f"{path}: limited by {basis}")
    seconds, basis = _verify(model, main, disk_mibps)
    verify = Phase("verify", download.end, seconds, basis)
    phases = [boot, build, download, verify]
    workers = layout.shares[1:]
    # The workers are ready by then: their build is shorter than the main node's on any type
    # (worker_build_seconds; tests/planner/test_plan.py).
    start = max(build.end, verify.end)
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
    flow = min(main.network_gbps or SINGLE_FLOW_GBPS, SINGLE_FLOW_GBPS) * GB / 8
    for index, share in enumerate(workers, start=1):
        # One tensor after another: hash and copy it, then send it.
        per_byte = 1 / (RPC_SEND_GBPS * GB) + 1 / flow
        phases.append(
            Phase(
                f"load worker {index}",
                phases[-1].end,
                share.weight_bytes * per_byte,
                f"{share.weight_bytes / GB:.1f} GB hashed and copied at {RPC_SEND_GBPS} GB/s "
                f"({LOAD_BASIS}), sent on one flow at {flow * 8 / GB:g} Gbit/s",
            )
        )
    return ServeTime(path, tuple(phases))
