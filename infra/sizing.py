"""How much memory a model needs per node, and the disks that hold it.

One rule for the stack's config validation and the planner, so a cluster the planner recommends
is one the program accepts. The nodes that hold layers are the workers; with no workers the main
node holds them all itself.
"""

from __future__ import annotations

import math
from typing import Protocol

from infra.catalog import InstanceType
from infra.pins import MAX_WORKERS

# Memory a node keeps for itself: the OS, the page cache llama.cpp needs to stream weights, and
# the RPC server's own allocations.
OS_HEADROOM_BYTES = 2 * 1024**3
OS_HEADROOM_FRACTION = 0.05


class Footprint(Protocol):
    """What sizing needs to know about a model."""

    @property
    def size_bytes(self) -> int: ...

    @property
    def layers(self) -> int | None: ...

    @property
    def kv_bytes_per_token(self) -> int: ...


def usable_memory_bytes(instance: InstanceType) -> int:
    """What one node can give the model: its memory less the OS headroom."""
    return int(instance.memory_bytes * (1 - OS_HEADROOM_FRACTION)) - OS_HEADROOM_BYTES


def compute_buffer_bytes(model_bytes: int) -> int:
    """Per-device compute buffers at ubatch 512: about 0.3 GB (8B) to 1.2 GB (405B)."""
    return int(min(1.2e9, max(0.3e9, 0.005 * model_bytes + 0.28e9)))


def kv_cache_bytes(model: Footprint, context: int) -> int:
    return model.kv_bytes_per_token * context


def node_need_bytes(model: Footprint, context: int, holders: int) -> int:
    """Memory the most loaded of ``holders`` nodes needs: its layers' weights and KV cache, and
    its compute buffers."""
    # Layers are not split: the most loaded node holds ceil(layers / holders) of them.
    share = math.ceil(model.layers / holders) / model.layers if model.layers else 1 / holders
    weights_and_kv = model.size_bytes + kv_cache_bytes(model, context)
    return int(weights_and_kv * share) + compute_buffer_bytes(model.size_bytes)


def fits(model: Footprint, context: int, holders: int, instance: InstanceType) -> bool:
    return node_need_bytes(model, context, holders) <= usable_memory_bytes(instance)


def min_workers(model: Footprint, context: int, instance: InstanceType) -> int | None:
    """The fewest workers of this type that hold the model, or None if even the most do not."""
    for count in range(1, MAX_WORKERS + 1):
        if fits(model, context, count, instance):
            return count
    return None


def default_main_disk_gb(model_bytes: int) -> int:
    """The main node stores the whole file, plus room for the build and the OS."""
    return math.ceil(model_bytes / 1e9 * 1.1) + 40


def default_worker_disk_gb(model_bytes: int, workers: int) -> int:
    """A worker's tensor cache holds its share of the weights."""
    return math.ceil(model_bytes / 1e9 * 1.1 / max(workers, 1)) + 30
