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

Several streams at once (llama-server's slots, ``batch_step``): one decode step reads each node's
weights once for every stream in the batch, and each stream's own KV cache, so the memory term
grows with the KV cache only; the step also multiplies the arithmetic by the batch, which a CPU's
compute rate bounds (``compute_flops``, from a published prompt-processing run). Where no compute
figure exists, no gain from batching is assumed at all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from infra import catalog
from infra.catalog import InstanceType
from infra.core import placement, sizing
from infra.core.placement import NodeShare, Placement
from infra.models import PRESETS, Model

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


def _anchor_instance(provider: str, region: str, name: str) -> InstanceType:
    found = catalog.find(provider, region, name)
    if found is None:
        raise LookupError(f"anchor instance {name} is not in the catalog")
    return found


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
        return _anchor_instance(self.provider, self.region, self.instance_type)


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


def computed_weight_bytes(model: Model, share: NodeShare) -> int:
    """A node's weights that take part in a token's arithmetic: all it holds but the embeddings,
    of which a token reads one row."""
    return share.weight_bytes - (model.input_bytes if share.node == placement.MAIN else 0)


def kv_bytes_read(model: Model, share: NodeShare, kv_tokens: int) -> float:
    """The KV cache one stream reads on a node per token, at ``kv_tokens`` tokens."""
    window = model.sliding_window or kv_tokens
    return sum(
        model.kv_per_layer[i] * (min(kv_tokens, window) if i in model.sliding_layers else kv_tokens)
        for i in range(share.first_layer, share.first_layer + share.layers)
    )


def streamed_bytes(model: Model, share: NodeShare, kv_tokens: int) -> float:
    """Bytes one node reads per decoded token: its weights (a MoE's active share; of the
    embeddings only one row, so nothing) and its layers' KV cache at ``kv_tokens`` tokens."""
    active = model.weight_bytes_per_token / model.size_bytes
    return computed_weight_bytes(model, share) * active + kv_bytes_read(model, share, kv_tokens)


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


# Batched decode: several streams at once on one serving group (llama-server's slots).
#
# A prompt run is decode's arithmetic for many tokens at once without its wait on memory
# (llama-bench pp512 reads the weights once per 512 tokens), so its rate is the most that a batch
# of streams can reach on the same cores: an upper bound, since a batch of a few streams keeps the
# cores less busy than 512 prompt tokens do.
FLOPS_PER_PARAMETER = 2  # a multiply and an add per weight per token


@dataclass(frozen=True)
class PromptAnchor:
    """A published prompt-processing rate: what a CPU's cores compute in llama.cpp."""

    label: str
    model: str
    instance_type: str
    threads: int
    prompt_tps: float  # at ``threads``
    half_threads_prompt_tps: float  # at half as many: how the rate grows with cores
    source: str
    provider: str = "gcp"
    region: str = "us-central1"

    @property
    def instance(self) -> InstanceType:
        return _anchor_instance(self.provider, self.region, self.instance_type)

    @property
    def flops(self) -> float:
        """FLOP/s at ``threads``, counted as ``token_flops`` counts a decoded token's."""
        flops = token_flops(PRESETS[self.model])
        if flops is None:
            raise ValueError(f"{self.model}: no parameter count")
        return self.prompt_tps * flops

    @property
    def scaling_exponent(self) -> float:
        """Rate ~ threads ** exponent, from the two runs (1: linear in the cores)."""
        return math.log2(self.prompt_tps / self.half_threads_prompt_tps)


AXION_PROMPT = PromptAnchor(
    "AFM-4.5B Q4_0 prompt (llama-bench pp512) on 1 x c4a-standard-16",
    "afm-4.5b-q4_0",
    "c4a-standard-16",
    threads=16,
    prompt_tps=315.83,
    half_threads_prompt_tps=177.14,
    source="Arm learning path: Arcee AFM-4.5B on Google Axion, llama-bench at 8 and 16 threads "
    "(github.com/ArmDeveloperEcosystem/arm-learning-paths, content/learning-paths/"
    "servers-and-cloud-computing/arcee-foundation-model-on-gcp/07_evaluating_the_quantized_models.md)",
)
# The CPU families a compute rate is known for, and its basis. Graviton3 (Neoverse V1), Graviton2
# (N1) and Cobalt 100 (N2): no published prompt run with Arm's current Q4_0 kernels was found.
COMPUTE_BASIS = {
    "axion": f"measured: {AXION_PROMPT.label}, {AXION_PROMPT.prompt_tps} tok/s",
    "graviton4": "assumed equal to Axion's per vCPU: the same Neoverse V2 core, and no published "
    "Graviton4 prompt run was found",
}
NO_BATCHING_GAIN = "no batching gain assumed"


def parameters_per_byte(model: Model) -> float | None:
    """The model's (active) parameters per (active) weight byte; None when not known."""
    parameters = model.active_parameters or model.parameters
    return None if not parameters else parameters / model.weight_bytes_per_token


def token_flops(model: Model) -> float | None:
    """Arithmetic of one token: 2 per weight it multiplies, the embeddings aside (a token reads
    one row of them), a MoE's active experts only."""
    per_byte = parameters_per_byte(model)
    if per_byte is None:
        return None
    active = model.weight_bytes_per_token / model.size_bytes
    return FLOPS_PER_PARAMETER * (model.size_bytes - model.input_bytes) * active * per_byte


def compute_flops(instance: InstanceType) -> float | None:
    """FLOP/s a node's cores reach in llama.cpp's batched products, or None where no figure is
    known. Scaled from the anchor by its own growth with threads (8 -> 16 threads gave 1.78x,
    not 2x), which keeps larger nodes below a linear extrapolation."""
    if instance.cpu_family not in COMPUTE_BASIS:
        return None
    anchor = AXION_PROMPT
    return anchor.flops * math.pow(instance.vcpus / anchor.threads, anchor.scaling_exponent)


def no_compute_reason(model: Model, nodes: Sequence[InstanceType]) -> str | None:
    """Why a batch's compute bound is unknown (then no batching gain is assumed), or None."""
    missing = sorted({n.cpu_family for n in nodes if n.cpu_family not in COMPUTE_BASIS})
    if missing:
        return f"no published compute rate for {', '.join(missing)}"
    if not model.parameters:
        return "the model's parameter count is unknown"
    return None


@dataclass(frozen=True)
class Batch:
    """One serving group decoding ``streams`` streams at once: one token for each per step."""

    streams: int
    step_seconds: float
    bound: str  # "memory bandwidth", "compute", or NO_BATCHING_GAIN and why

    @property
    def stream_tps(self) -> float:
        return 1 / self.step_seconds

    @property
    def aggregate_tps(self) -> float:
        return self.streams / self.step_seconds


def batch_step(
    model: Model,
    nodes: Sequence[InstanceType],
    layout: Placement,
    kv_tokens: int,
    streams: int,
) -> Batch | None:
    """A step of ``streams`` streams on one group: per node, the weights read once for all of
    them plus each stream's KV cache, or the batch's arithmetic, whichever takes longer; the
    nodes one after another, and the fixed per-layer and per-hop costs once per step. None when
    a node's bandwidth is unknown. At one stream this is ``decode_tps`` (while memory-bound)."""
    if streams < 1:
        raise ValueError(f"a batch has at least one stream, not {streams}")
    single = decode_tps(model, nodes, layout, kv_tokens)
    if single is None:
        return None
    reason = no_compute_reason(model, nodes)
    if reason is not None:
        return Batch(streams, streams / single, f"{NO_BATCHING_GAIN}: {reason}")
    cal = calibration()
    active = model.weight_bytes_per_token / model.size_bytes
    per_byte = parameters_per_byte(model) or 0.0
    seconds = compute_seconds = 0.0
    for share, instance in zip(layout.shares, nodes, strict=True):
        bandwidth, flops = node_bandwidth_gbps(instance), compute_flops(instance)
        if bandwidth is None or flops is None:  # decode_tps and no_compute_reason rule it out
            return None
        weights = computed_weight_bytes(model, share)
        # A MoE's streams may each use other experts: none is assumed shared (the most read).
        read = min(weights, streams * weights * active)
        read += streams * kv_bytes_read(model, share, kv_tokens)
        memory = read / (cal.eta * bandwidth * 1e9)
        compute = streams * FLOPS_PER_PARAMETER * weights * active * per_byte / flops
        seconds += max(memory, compute)
        compute_seconds += compute if compute > memory else 0.0
    fixed = model.layers * cal.layer_overhead_seconds + (len(nodes) - 1) * cal.hop_seconds
    bound = "compute" if compute_seconds > seconds / 2 else "memory bandwidth"
    return Batch(streams, seconds + fixed, bound)


@dataclass(frozen=True)
class Load:
    """A set of serving groups at a load: each group's batch (a balancer spreads the streams)."""

    groups: tuple[Batch, ...]

    @property
    def streams(self) -> int:
        return sum(g.streams for g in self.groups)

    @property
    def aggregate_tps(self) -> float:
        return sum(g.aggregate_tps for g in self.groups)

    @property
    def stream_tps(self) -> float:
        """The slowest stream's speed: the busiest group's."""
        return min(g.stream_tps for g in self.groups)

    @property
    def bound(self) -> str:
        return max(self.groups, key=lambda g: g.streams).bound
