"""Predicted speed: decode tokens per second (the time to serve is ``infra.planner.serve``).

Decode on CPUs is bound by memory bandwidth: every token streams the weights once. A layer
split runs the nodes one after another, so a token costs

    weight and KV bytes / (eta x node bandwidth)  +  layers x per-layer overhead
                                                  +  RPC workers x per-hop cost

``eta`` and the per-layer overhead are solved from the two published anchors in ``ANCHORS``
(the 405B RPC run is bound by bandwidth, the 8B single-node run shows the fixed per-layer
cost). The per-hop cost is measured by ``bench/boot.py``: its weight in the 405B anchor is
under 0.5 %, too small to solve for from it. ``CHECKS`` are further published runs: the
Graviton ones test the model, and one Axion run gives Axion's effective bandwidth
(``derived_socket_bandwidth_gbps``), which ``cpus.csv`` carries with that source.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from infra import catalog, placement, sizing
from infra.catalog import InstanceType
from infra.models import PRESETS, Model
from infra.placement import NodeShare, Placement

# Assumption: half of a socket's cores saturate its memory controllers, so an instance with at
# least that many vCPUs streams at the socket's bandwidth. The 405B anchor supports it: on 64 of
# Graviton4's 96 cores it streams 375 GB/s per node, more than a proportional 358 GB/s.
SATURATING_CORE_FRACTION = 0.5

# Extra time per RPC worker per token: the graph sent to the worker and the activations back.
# bench/boot.py measured 30.86 tok/s through two workers against 33.36 tok/s in one process
# (bench/results/boot.json), 1.22 ms per worker on loopback; a real network adds its latency.
RPC_HOP_SECONDS = 1.22e-3

# The decode speed is quoted at half the context filled: the KV cache read grows per token.
KV_FILL_FRACTION = 0.5


@dataclass(frozen=True)
class Anchor:
    """A published decode measurement the model is calibrated to."""

    label: str
    model: str
    instance_type: str
    nodes: int
    decode_tps: float
    source: str
    provider: str = "aws"
    region: str = "us-east-1"
    # Tokens in the KV cache during the measured decode (a short prompt and reply).
    kv_tokens: int = 128
    # "asserted": the model must predict it within CHECK_TOLERANCE; "derives": it sets a CPU
    # family's bandwidth (exact by construction); "reported": shown, not asserted (why in note).
    role: str = "asserted"
    note: str = ""

    @property
    def instance(self) -> InstanceType:
        found = catalog.find(self.provider, self.region, self.instance_type)
        if found is None:
            raise LookupError(f"anchor instance {self.instance_type} is not in the catalog")
        return found


RPC_ANCHOR = Anchor(
    "Llama-3.1-405B Q4_0 on 3 x c8g.16xlarge (main + 2 RPC workers)",
    "llama-3.1-405b-q4_0",
    "c8g.16xlarge",
    3,
    1.64,
    "Arm learning path: distributed inference with llama.cpp (build 5935)",
)
SINGLE_NODE_ANCHOR = Anchor(
    "Llama-3.1-8B Q4_0 on 1 x r8g.16xlarge (64 threads)",
    "llama-3.1-8b-q4_0",
    "r8g.16xlarge",
    1,
    61.6,
    "Arm learning path: llama.cpp on Arm CPUs",
)
ANCHORS = (RPC_ANCHOR, SINGLE_NODE_ANCHOR)

CHECK_TOLERANCE = 0.15
_AFM_AWS = "Arm learning path: Arcee AFM-4.5B on AWS Graviton4 (llama.cpp b5757, 16 threads)"
_AFM_GCP = "Arm learning path: Arcee AFM-4.5B on Google Axion (llama.cpp b6030, 16 threads)"
AXION_ANCHOR = Anchor(
    "AFM-4.5B Q4_0 on 1 x c4a-standard-16",
    "afm-4.5b-q4_0",
    "c4a-standard-16",
    1,
    61.01,
    _AFM_GCP + ": llama-server, 115 tokens",
    provider="gcp",
    region="us-central1",
    role="derives",
    note="sets Axion's effective bandwidth",
)
CHECKS = (
    Anchor("AFM-4.5B Q4_0 on 1 x c8g.4xlarge", "afm-4.5b-q4_0", "c8g.4xlarge", 1, 40.72,
           _AFM_AWS + ": llama-server, 111 tokens"),
    Anchor("AFM-4.5B Q8_0 on 1 x c8g.4xlarge", "afm-4.5b-q8_0", "c8g.4xlarge", 1, 25.13,
           _AFM_AWS + ": llama-cli, 331 tokens", kv_tokens=350),
    AXION_ANCHOR,
    Anchor("AFM-4.5B Q8_0 on 1 x c4a-standard-16", "afm-4.5b-q8_0", "c4a-standard-16", 1,
           37.89, _AFM_GCP + ": llama-cli, 352 tokens", provider="gcp", region="us-central1",
           kv_tokens=375),
    Anchor("Llama-2-7B Q4_0 on 1 x r7g.16xlarge", "llama-2-7b-q4_0", "r7g.16xlarge", 1, 31.6,
           "llama.cpp PR #5780 (2024-03, `main -t 64`)", role="reported",
           note="2024 code, before the Arm Q4_0 repacking that the other runs use"),
)  # fmt: skip


def derived_socket_bandwidth_gbps(anchor: Anchor, cores_per_socket: int) -> float:
    """The socket bandwidth that makes the model predict ``anchor`` exactly on its CPU, with
    the same saturation rule as every other family (``node_bandwidth_gbps``)."""
    model, instance = PRESETS[anchor.model], anchor.instance
    usable = sizing.usable_memory_bytes(instance)
    layout = placement.place(model, 2 * anchor.kv_tokens, 1, [usable] * anchor.nodes)
    cal = calibration()
    streamed = sum(streamed_bytes(model, share, anchor.kv_tokens) for share in layout.shares)
    left = 1 / anchor.decode_tps - model.layers * cal.layer_overhead_seconds
    left -= (anchor.nodes - 1) * cal.hop_seconds
    if left <= 0:
        raise ValueError(f"{anchor.label}: the per-layer overhead alone is slower than measured")
    node_gbps = streamed / (cal.eta * left) / 1e9
    return node_gbps / min(1.0, instance.vcpus / (cores_per_socket * SATURATING_CORE_FRACTION))


def extrapolation_note(instance: InstanceType) -> str | None:
    """Whether a predicted speed stretches a bandwidth derived from one run past its size."""
    family = catalog.cpu_families().get(instance.cpu_family)
    if family is None or not family.source.startswith("derived"):
        return None
    anchor = next((a for a in CHECKS if a.role == "derives"
                   and a.instance.cpu_family == instance.cpu_family), None)  # fmt: skip
    if anchor is None or instance.vcpus <= anchor.instance.vcpus:
        return None
    return f"speed extrapolated from a {anchor.instance.vcpus}-vCPU run"


@dataclass(frozen=True)
class Calibration:
    eta: float  # fraction of the node's memory bandwidth that decode achieves
    layer_overhead_seconds: float  # fixed cost per layer per token (dispatch, thread sync)
    hop_seconds: float = RPC_HOP_SECONDS


def node_bandwidth_gbps(instance: InstanceType) -> float | None:
    """Memory bandwidth one node streams at, or None when its CPU's is not published."""
    family = catalog.cpu_families().get(instance.cpu_family)
    if family is None or family.socket_memory_bandwidth_gbps is None:
        return None
    if family.cores_per_socket is None:
        return None
    saturating = family.cores_per_socket * SATURATING_CORE_FRACTION
    return family.socket_memory_bandwidth_gbps * min(1.0, instance.vcpus / saturating)


def streamed_bytes(model: Model, share: NodeShare, kv_tokens: int) -> float:
    """Bytes one node reads per decoded token: its weights (a MoE's active share; of the
    embeddings only one row, so nothing) and its layers' KV cache at ``kv_tokens`` tokens."""
    weights = share.weight_bytes - (model.input_bytes if share.node == placement.MAIN else 0)
    active = model.weight_bytes_per_token / model.size_bytes
    window = model.sliding_window or kv_tokens
    kv = sum(
        model.kv_per_layer[i] * (min(kv_tokens, window) if i in model.sliding_layers else kv_tokens)
        for i in range(share.first_layer, share.first_layer + share.layers)
    )
    return weights * active + kv


def _terms(
    model: Model, nodes: Sequence[InstanceType], layout: Placement, kv_tokens: int
) -> tuple[float, int, int] | None:
    """(seconds of memory traffic, layers, RPC hops) for one token: the nodes run one after
    another, each streaming its share at its own bandwidth. None when a bandwidth is unknown."""
    seconds = 0.0
    for share, instance in zip(layout.shares, nodes, strict=True):
        bandwidth = node_bandwidth_gbps(instance)
        if bandwidth is None:
            return None
        seconds += streamed_bytes(model, share, kv_tokens) / (bandwidth * 1e9)
    return seconds, model.layers, len(nodes) - 1


def anchor_terms(anchor: Anchor) -> tuple[float, int, int]:
    model, nodes = PRESETS[anchor.model], [anchor.instance] * anchor.nodes
    usable = [sizing.usable_memory_bytes(n) for n in nodes]
    terms = _terms(
        model, nodes, placement.place(model, 2 * anchor.kv_tokens, 1, usable), anchor.kv_tokens
    )
    if terms is None:
        raise ValueError(f"no memory bandwidth for {anchor.instance.cpu_family}")
    return terms


def calibrate(anchors: tuple[Anchor, Anchor] = (RPC_ANCHOR, SINGLE_NODE_ANCHOR)) -> Calibration:
    """Solve eta and the per-layer overhead so both anchors are predicted exactly."""
    rows = []
    for anchor in anchors:
        seconds, layers, hops = anchor_terms(anchor)
        rows.append((seconds, layers, 1 / anchor.decode_tps - hops * RPC_HOP_SECONDS))
    (a1, b1, r1), (a2, b2, r2) = rows
    determinant = a1 * b2 - a2 * b1
    if abs(determinant) < 1e-15:
        raise ValueError("the anchors do not separate bandwidth from per-layer overhead")
    inverse_eta = (r1 * b2 - r2 * b1) / determinant
    overhead = (a1 * r2 - a2 * r1) / determinant
    if inverse_eta <= 0 or overhead < 0:
        raise ValueError(f"anchors give a non-physical fit: 1/eta={inverse_eta}, c={overhead}")
    return Calibration(eta=1 / inverse_eta, layer_overhead_seconds=overhead)


@cache
def calibration() -> Calibration:
    return calibrate()


def decode_tps(
    model: Model, nodes: Sequence[InstanceType], layout: Placement, kv_tokens: int
) -> float | None:
    """Predicted single-stream decode tokens/s of a cluster (``nodes``: the main node's type,
    then each worker's) with its layers placed as ``layout`` says; None when a CPU's bandwidth is
    not published."""
    terms = _terms(model, nodes, layout, kv_tokens)
    if terms is None:
        return None
    cal = calibration()
    seconds, layers, hops = terms
    return 1 / (seconds / cal.eta + layers * cal.layer_overhead_seconds + hops * cal.hop_seconds)
