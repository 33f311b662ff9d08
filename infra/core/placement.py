"""Where the layers go: how many each node holds, the main node included, and the llama-server
flags that put them exactly there.

At the pinned llama.cpp commit a CPU-only main node is never an offload target: with
``--n-gpu-layers N`` the first ``n_layer + 1 - N`` layers (and their KV cache) stay on its CPU,
and the rest, the output head counted as one more layer, are split over the RPC devices in
proportion to ``--tensor-split`` (src/llama-model.cpp, ``i_gpu_start``; the token embeddings
always stay on the CPU). Giving each worker's layer count as its split, the last one plus the
output, places every layer where this module says, so an N-node cluster pools N nodes' memory.

Layers are shared in proportion to each node's free memory (what it has left after its compute
buffers and the embeddings or output head it must hold), as llama.cpp's own default split is, and
then moved one at a time off any node that would overflow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from infra.core import sizing
from infra.core.layout import MAIN, node_name
from infra.models import Model

__all__ = ["MAIN", "NodeShare", "Placement", "fewest_workers", "place"]


@dataclass(frozen=True)
class NodeShare:
    node: str
    first_layer: int
    layers: int
    weight_bytes: int  # its layers' weights, and the embeddings or output head it holds
    kv_bytes: int  # the KV cache of its layers, for every slot
    need_bytes: int  # weights, KV cache and compute buffers
    usable_bytes: int

    @property
    def bytes(self) -> int:
        """What the node holds of the model: weights and KV cache."""
        return self.weight_bytes + self.kv_bytes

    @property
    def fits(self) -> bool:
        return self.need_bytes <= self.usable_bytes


@dataclass(frozen=True)
class Placement:
    shares: tuple[NodeShare, ...]  # the main node first, then the workers in order

    @property
    def fits(self) -> bool:
        return all(share.fits for share in self.shares)

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(share.layers for share in self.shares)

    @property
    def worst(self) -> NodeShare:
        """The node closest to (or furthest past) its memory."""
        return max(self.shares, key=lambda s: s.need_bytes / max(s.usable_bytes, 1))

    @property
    def gpu_layers(self) -> int:
        """``--n-gpu-layers``: every layer the workers hold, and the output head (none without
        workers: the main node holds everything)."""
        return sum(self.tensor_split)

    @property
    def tensor_split(self) -> tuple[int, ...]:
        """``--tensor-split``: each worker's layers; the last also takes the output head."""
        split = list(self.layers[1:])
        if split:
            split[-1] += 1
        return tuple(split)

    @property
    def worker_weight_bytes(self) -> int:
        """The weights the main node sends to the workers as it loads."""
        return sum(share.weight_bytes for share in self.shares[1:])

    def to_json(self) -> list[dict[str, int | str]]:
        return [{"node": s.node, "layers": s.layers, "bytes": s.bytes} for s in self.shares]

    def describe(self) -> str:
        """The layers per node, main first: ``42 + 42 + 42``."""
        return " + ".join(str(n) for n in self.layers)


@dataclass(frozen=True)
class _Costs:
    """Each layer's bytes, and what each node holds besides its layers."""

    layer_weights: tuple[int, ...]
    layer_kv: tuple[int, ...]
    fixed_weights: tuple[int, ...]
    compute: int

    def share(self, index: int, start: int, count: int, usable: int) -> NodeShare:
        weights = self.fixed_weights[index] + sum(self.layer_weights[start : start + count])
        kv = sum(self.layer_kv[start : start + count])
        need = weights + kv + self.compute
        return NodeShare(node_name(index), start, count, weights, kv, need, usable)


def _costs(model: Model, context: int, slots: int, nodes: int) -> _Costs:
    full = sizing.kv_cells(context, slots)
    window = sizing.kv_cells(context, slots, model.sliding_window) if model.sliding_window else 0
    layer_kv = tuple(
        per_token * (window if i in model.sliding_layers else full)
        for i, per_token in enumerate(model.kv_per_layer)
    )
    # The main node always holds the embeddings; the last node the output head (which, when it
    # is the embeddings, costs nothing more on the main node itself).
    fixed = [0] * nodes
    fixed[0] += model.input_bytes
    if nodes > 1 or not model.tied_embeddings:
        fixed[-1] += model.output_bytes
    return _Costs(
        model.weights_per_layer,
        layer_kv,
        tuple(fixed),
        sizing.compute_buffer_bytes(model.size_bytes),
    )


def _shares(costs: _Costs, counts: Sequence[int], usable: Sequence[int]) -> tuple[NodeShare, ...]:
    shares, start = [], 0
    for index, count in enumerate(counts):
        shares.append(costs.share(index, start, count, usable[index]))
        start += count
    return tuple(shares)


def _proportional(layers: int, free: Sequence[int]) -> list[int]:
    """``layers`` in whole shares proportional to ``free``; remainders to the largest fractions,
    the earlier node first on a tie."""
    total = sum(free)
    if total <= 0:
        free, total = [1] * len(free), len(free)
    ideal = [layers * f / total for f in free]
    counts = [int(x) for x in ideal]
    by_fraction = sorted(range(len(free)), key=lambda i: (-(ideal[i] - counts[i]), i))
    for i in by_fraction[: layers - sum(counts)]:
        counts[i] += 1
    return counts


def place(model: Model, context: int, slots: int, usable: Sequence[int]) -> Placement:
    """Share the model's layers between nodes with ``usable`` bytes each (the main node first).

    The result may not fit (``Placement.fits``): then no other division fits either, as far as
    moving single layers off overflowing nodes can tell.
    """
    if not usable:
        raise ValueError("a cluster has at least the main node")
    costs = _costs(model, context, slots, len(usable))
    fixed = [w + costs.compute for w in costs.fixed_weights]
    per_layer = (sum(costs.layer_weights) + sum(costs.layer_kv)) / model.layers
    free = [max(0, u - f) for u, f in zip(usable, fixed, strict=True)]
    counts = _proportional(model.layers, free)
    shares = _shares(costs, counts, usable)
    if sum(free) < per_layer * model.layers:
        return Placement(shares)  # too little memory in all, however the layers are divided
    for _ in range(model.layers * len(usable)):
        over = [i for i, s in enumerate(shares) if not s.fits and s.layers]
        if not over:
            break
        donor = max(over, key=lambda i: shares[i].need_bytes - shares[i].usable_bytes)
        spare = [s.usable_bytes - s.need_bytes - per_layer for s in shares]
        receiver = max((i for i in range(len(shares)) if i != donor), key=spare.__getitem__)
        if spare[receiver] < 0:
            break
        counts[donor] -= 1
        counts[receiver] += 1
        shares = _shares(costs, counts, usable)
    return Placement(shares)


def fewest_workers(
    model: Model, context: int, slots: int, *, main_usable: int, worker_usable: int, most: int
) -> int | None:
    """The fewest workers (0 to ``most``) beside this main node that hold the model."""
    for workers in range(most + 1):
        if place(model, context, slots, [main_usable] + [worker_usable] * workers).fits:
            return workers
    return None


def split(
    model: Model, context: int, slots: int, counts: Sequence[int], usable: Sequence[int]
) -> Placement:
    """The model's layers in the ``counts`` given (the main node first), as a run published
    them; ``place`` chooses them instead."""
    if sum(counts) != model.layers or len(counts) != len(usable):
        raise ValueError(f"{list(counts)} do not share {model.layers} layers over {len(usable)}")
    return Placement(_shares(_costs(model, context, slots, len(usable)), counts, usable))
