"""Memory rules: what a node can give the model, the KV cache llama.cpp allocates for a context
and a number of slots, compute buffers, and the disks that hold the model.

One home for these rules, shared by the stack's config validation, the planner and the local
cluster, so a cluster the planner recommends is one the program accepts. How the layers are
divided between the nodes is ``infra.core.placement``.
"""

from __future__ import annotations

import math

from infra import catalog
from infra.catalog import InstanceType
from infra.clouds import FACTS
from infra.models import Model

# Memory a node keeps for itself: the OS, the page cache llama.cpp needs to stream weights, and
# the RPC server's own allocations.
OS_HEADROOM_BYTES = 2 * 1024**3
OS_HEADROOM_FRACTION = 0.05

# llama.cpp at the pinned commit pads the context to multiples of 256 cells, and sizes a
# sliding-window layer's cache to the window plus one micro-batch (src/llama-context.cpp,
# src/llama-kv-cache-iswa.cpp).
KV_CELL_PADDING = 256
MICRO_BATCH = 512
DEFAULT_CONTEXT = 4096
# One request at a time: a large model on CPUs decodes a few tokens per second, and every slot
# costs a whole context of KV cache on every node.
DEFAULT_SLOTS = 1
MAX_SLOTS = 64


def usable_memory_bytes(instance: InstanceType) -> int:
    """What one node can give the model: its memory less the OS headroom."""
    return usable_of(instance.memory_bytes)


def fits_memory(file_bytes: int, instance: InstanceType) -> bool:
    """Whether a node's memory holds the whole model file (its page cache, between the download,
    the checksum and the load)."""
    return file_bytes <= usable_memory_bytes(instance)


# Parts of a split model fetch-model.sh fetches at once (its DOWNLOAD_JOBS default).
DOWNLOAD_JOBS = 8


def download_jobs(file_bytes: int, parts: int, instance: InstanceType) -> int:
    """Parts a main node fetches at once: every one where its memory holds the file; else as many
    as its memory holds, so that each part is checked while it is still in the page cache (one
    at least)."""
    if fits_memory(file_bytes, instance):
        return DOWNLOAD_JOBS
    held = int(usable_memory_bytes(instance) // (file_bytes / max(parts, 1)))
    return max(1, min(DOWNLOAD_JOBS, held))


def usable_of(memory_bytes: int) -> int:
    """What a node with ``memory_bytes`` of memory can give the model."""
    return int(memory_bytes * (1 - OS_HEADROOM_FRACTION)) - OS_HEADROOM_BYTES


def compute_buffer_bytes(model_bytes: int) -> int:
    """Per-device compute buffers at ubatch 512: about 0.3 GB (8B) to 1.2 GB (405B)."""
    return int(min(1.2e9, max(0.3e9, 0.005 * model_bytes + 0.28e9)))


def _pad(cells: int) -> int:
    return math.ceil(cells / KV_CELL_PADDING) * KV_CELL_PADDING


def slot_context(context: int, slots: int) -> int:
    """The context each slot gets from ``--ctx-size context x slots --parallel slots`` (as
    llama-server.sh runs it): at least ``context``, rounded up to a multiple of 256."""
    return _pad(_pad(context * slots) // slots)


# The decode speed assumed where nothing predicts one (a type without a published bandwidth, or
# this machine): timeouts sized from it outlast what the clusters the stacks make are predicted
# to take (the 405B on three c8g.16xlarge: 1.63 tok/s).
UNKNOWN_DECODE_TPS = 1.0


def longest_generation_seconds(context: int, slots: int, decode_tps: float) -> int:
    """The longest a request can run: a slot's whole context generated at ``decode_tps`` (the
    prompt's tokens counted as generated ones, an over-count). A balancer's timeouts outlast it,
    as a request waiting for a busy group waits at most one such generation more per request
    ahead of it."""
    if decode_tps <= 0:
        raise ValueError(f"a decode speed is positive, not {decode_tps}")
    return math.ceil(slot_context(context, slots) / decode_tps)


def kv_cells(context: int, slots: int, window: int | None = None) -> int:
    """KV-cache cells a layer holds for all slots: the slot context, or for a sliding-window
    layer the window and one micro-batch, whichever is smaller."""
    per_slot = slot_context(context, slots)
    if window is not None:
        per_slot = _pad(min(per_slot, window + MICRO_BATCH))
    return per_slot * slots


# The read-ahead (KiB) a main node whose memory cannot hold the model gives the disk the model
# is on (fetch-model.sh's MODEL_READ_AHEAD_KB): the load reads the file by page faults, each
# reading this much ahead (the kernel's 128 KiB keeps one small read in flight a thread).
MODEL_READ_AHEAD_KB = 16384

# Provisioned throughput of the main node's disk, which the model loads from (within each
# cloud's range).
DEFAULT_DISK_THROUGHPUT_MIBPS = 1000


# A model larger than memory crosses the main disk twice: written as it downloads, read as it
# loads.
DISK_PASSES = 2


def draft_bytes(draft: Model, context: int, slots: int) -> int:
    """What a draft model takes of the main node's memory: its weights, and its KV cache at the
    target's context for every slot (llama-server gives the draft the target's context)."""
    return draft.size_bytes + draft.kv_bytes_per_token * context * slots


def main_disk_throughput_mibps(
    cloud: str,
    model_bytes: int | None = None,
    main: InstanceType | None = None,
    *,
    boot_disk: bool = False,
) -> int | None:
    """The main disk's default throughput on a cloud; None where the disk has no such knob.
    A model the main node's memory cannot hold is written to the disk and read back from it as
    it loads: its disk gets as much as the node can use for that (its published disk
    bandwidth), within the cloud's range; within a boot disk's (``boot_disk``: Kubernetes nodes,
    where the model is on the node's one disk)."""
    facts = FACTS[cloud]
    limits = facts.disk_throughput_mibps
    if limits is None:
        return None
    default = limits.clamp(DEFAULT_DISK_THROUGHPUT_MIBPS)
    if model_bytes is None or main is None or fits_memory(model_bytes, main):
        return default
    bandwidth = catalog.disk_bandwidth(cloud, main.name)
    if bandwidth is None:
        return default
    wanted = max(default, limits.clamp(int(bandwidth.mibps_for(DISK_PASSES * model_bytes))))
    if boot_disk and facts.boot_disk_max_mibps is not None:
        return min(wanted, facts.boot_disk_max_mibps)
    return wanted


def main_disk_read_mibps(
    main: InstanceType, size_gb: int, throughput_mibps: int | None, model_bytes: int
) -> float:
    """How fast the main node moves the model through its disk: the disk's own rate, capped by
    how fast the node reaches its disks (for the model's two passes, from a fresh start) where
    the catalog knows it."""
    disk = FACTS[main.provider].disk.read_mibps(size_gb, throughput_mibps)
    bandwidth = catalog.disk_bandwidth(main.provider, main.name)
    if bandwidth is None:
        return disk
    return min(disk, bandwidth.mibps_for(DISK_PASSES * model_bytes))


def default_main_disk_gb(model_bytes: int) -> int:
    """The main node stores the whole file, plus room for the build and the OS."""
    return math.ceil(model_bytes / 1e9 * 1.1) + 40


# A worker's disk holds the OS and the build: its weights come over the network into memory, and
# it keeps no tensor cache (rpc-worker.sh says why).
WORKER_DISK_GB = 30
# The least room for the OS, the build tools and the llama.cpp build, on any node.
SYSTEM_DISK_GB = 20


# The longest a node's boot may take to serve before its spend guard counts it idle: the
# pinned build (at most minutes: infra/planner/serve.py's BUILD_* from bench/results/boot.json,
# about 12 minutes on one vCPU) within an hour, the model's download at a floor well under the
# slowest path the planner models (one object-store stream, 85 MB/s), the main node's wait for
# its workers and its model load's own time limit.
SERVE_BUILD_SECONDS = 3600
SERVE_FETCH_FLOOR_BYTES_PER_SECOND = 20e6


def serve_deadline_seconds(fetched_bytes: int, worker_wait_seconds: int, load_seconds: int) -> int:
    """How long a node of a group may take from boot to serving, at most."""
    fetch = math.ceil(fetched_bytes / SERVE_FETCH_FLOOR_BYTES_PER_SECOND)
    return SERVE_BUILD_SECONDS + fetch + worker_wait_seconds + load_seconds
