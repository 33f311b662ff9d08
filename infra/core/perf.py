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
(``derived_socket_bandwidth_gbps``), which ``cpus.csv`` carries with that source. A MoE reads
only the experts its tokens chose, but decodes below its bandwidth: Arm's DeepSeek-R1 run sets
what a MoE layer costs a step beyond its reads (``moe_layer_seconds``).

A step of several tokens (``step``: a prompt, the check of a draft model's tokens, several
streams at once) reads each node's weights once and each sequence's KV cache, and adds the
arithmetic of every token beyond the first at the node's compute rate with its kernel: repacked on
the main node, plain on RPC workers unless they repack too (patch 0005). Part of the shorter of
the two runs under the other (``overlap``). The rates and that share come from published runs
(``AXION_PROMPT``, ``RPC_PROMPT``, ``PROMPT_RUNS``, ``BATCHED_RUNS``), each named with its source;
a machine measured on its own (``measured_node``) takes the catalog's place for bench/calibrate.py.
Where no compute figure exists, no gain from batching and no prompt rate are assumed.
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
_DEEPSEEK_ARM = (
    "Arm learning path: DeepSeek-R1 on Arm servers, llama-cli build 4963, 64 threads, bartowski's "
    "Q4_0 (github.com/ArmDeveloperEcosystem/arm-learning-paths, content/learning-paths/"
    "servers-and-cloud-computing/deepseek-cpu/deepseek-chatbot.md)"
)
# A MoE layer costs more than its reads: the router, the choice of experts and each chosen
# expert's product run as steps of their own (ggml-cpu's MUL_MAT_ID sorts a step's rows by expert
# and multiplies one expert after another), so a MoE decodes well below its memory bandwidth
# (llama.cpp #25976: GLM-5.2 on a 96-core Neoverse-N2 at 30-63 % of STREAM, its cycles in the
# kernels; ik_llama.cpp #1752: DeepSeek V4 Flash with "the bus ~60% idle"). The model counts it
# as a fixed cost a layer a step, solved from Arm's DeepSeek-R1 decode.
MOE_ANCHOR = Anchor(
    "DeepSeek-R1 Q4_0 on 1 x r8g.24xlarge (64 threads)",
    "deepseek-r1-q4_0",
    "r8g.24xlarge",
    1,
    12.24,
    _DEEPSEEK_ARM + ": eval 81.72 ms per token over 511 runs after a 20-token prompt",
    kv_tokens=20 + 511 // 2,
    role="derives",
    note="sets a MoE layer's own cost a step",
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
    MOE_ANCHOR,
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
    of which a token reads one row; where the output head is the embeddings themselves (tied) and
    this node computes it (it holds the last layer: placement gives it no copy), the logits read
    them whole."""
    if share.node != placement.MAIN:
        return share.weight_bytes
    if model.tied_embeddings and share.first_layer + share.layers == model.layers:
        return share.weight_bytes
    return share.weight_bytes - model.input_bytes


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
    seconds, _, hops = terms
    return 1 / (seconds / calibration().eta + fixed_seconds(model, hops))


def fixed_seconds(model: Model, hops: int) -> float:
    """A step's costs that do not grow with its tokens: each layer's, a MoE layer's own
    (``moe_layer_seconds``), and each RPC hop's."""
    cal = calibration()
    moe = moe_layer_seconds() if model.is_moe else 0.0
    return model.layers * (cal.layer_overhead_seconds + moe) + hops * cal.hop_seconds


@cache
def moe_layer_seconds() -> float:
    """A MoE layer's cost a step beyond its reads, solved so that ``MOE_ANCHOR`` is predicted
    exactly."""
    anchor = MOE_ANCHOR
    seconds, layers, hops = anchor_terms(anchor)
    cal = calibration()
    dense = seconds / cal.eta + layers * cal.layer_overhead_seconds + hops * cal.hop_seconds
    left = 1 / anchor.decode_tps - dense
    if left < 0:
        raise ValueError(f"{anchor.label}: decodes faster than its reads alone")
    return left / layers


# Steps of several tokens: a prompt, the check of a draft, several streams at once.
#
# A step of n tokens reads each node's weights once (a MoE's active experts for each token, up to
# all of them) and each sequence's KV cache, like a decoded token, and adds the arithmetic of the
# n - 1 tokens beyond the first at the node's compute rate; the kernels compute on the weights as
# they stream in, so part of the shorter of the two is hidden (``overlap``). Arm's own run shows
# the arithmetic is not free: on one r8g.16xlarge the 8B's 14-token prompt took 41.98 ms against
# 16.23 ms a decoded token. The compute rate is a kernel's: llama.cpp's CPU backend repacks Q4_0
# (and Q4_K, Q8_0, IQ4_NL) matrices on a local node for its interleaved GEMM kernels (i8mm on
# Neoverse V2); an RPC worker at the pinned commit keeps its weights in the CPU device's default
# buffer and runs the plain kernels, unless the build's patch 0005 (``GGML_RPC_REPACK``) makes it
# repack too. Every quantisation is assumed to repack as Q4_0 does (the runs are Q4_0 and Q4_K).
FLOPS_PER_PARAMETER = 2  # a multiply and an add per weight per token
REPACKED, PLAIN = "repacked", "plain"
# llama.cpp computes a prompt in steps of at most n_ubatch tokens (512 by default).
UBATCH_TOKENS = 512
# The prompt a plan's time to first token is quoted for (``lrc plan --prompt-tokens``).
PROMPT_TOKENS = 1000


def _published(path: str) -> str:
    return f"github.com/ArmDeveloperEcosystem/arm-learning-paths, content/learning-paths/{path}"


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
    prompt_tokens: int = 512

    @property
    def instance(self) -> InstanceType:
        return _anchor_instance(self.provider, self.region, self.instance_type)

    @property
    def flops(self) -> float:
        return self.flops_at(overlap())

    def flops_at(self, hidden: float) -> float:
        """FLOP/s of the repacked kernels at ``threads``: the prompt's time less one decode step
        (its read of the weights) is the arithmetic of every token but the first."""
        model, instance = PRESETS[self.model], self.instance
        if token_flops(model) is None:
            raise ValueError(f"{self.model}: no parameter count")
        layout = placement.place(
            model, self.prompt_tokens, 1, [sizing.usable_memory_bytes(instance)]
        )
        (share,) = layout.shares
        flops = prompt_flops(model, share)
        one = decode_tps(model, [instance], layout, self.prompt_tokens)
        if one is None:
            raise ValueError(f"{self.label}: no memory bandwidth for {instance.cpu_family}")
        # The prompt less one decode step, plus the share of its reads its arithmetic hid.
        fixed = fixed_seconds(model, 0)
        arithmetic = self.prompt_tokens / self.prompt_tps - 1 / one + hidden * (1 / one - fixed)
        return (self.prompt_tokens - 1) * flops / arithmetic

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
    "(" + _published("servers-and-cloud-computing/arcee-foundation-model-on-gcp/"
                     "07_evaluating_the_quantized_models.md") + ")",
)  # fmt: skip


@dataclass(frozen=True)
class PromptRun:
    """A published prompt (one step of ``tokens``) on a cluster of catalog types: the model
    predicts its seconds. ``layers``: the run's own split (main first), where it published one."""

    label: str
    model: str
    instance_type: str
    nodes: int
    tokens: int
    seconds: float
    source: str
    layers: tuple[int, ...] | None = None
    # "asserted": held within PROMPT_TOLERANCE; "derives": it sets the plain kernels' rate.
    role: str = "asserted"
    provider: str = "aws"
    region: str = "us-east-1"

    @property
    def instance(self) -> InstanceType:
        return _anchor_instance(self.provider, self.region, self.instance_type)

    def layout(self) -> Placement:
        model, usable = PRESETS[self.model], sizing.usable_memory_bytes(self.instance)
        if self.layers is None:
            return placement.place(model, 2 * self.tokens, 1, [usable] * self.nodes)
        return placement.split(model, 2 * self.tokens, 1, self.layers, [usable] * self.nodes)


# Arm's 405B run: upstream workers (plain kernels) held 99 of the 126 layers (the KV buffers it
# printed, 432 / 800 / 784 MiB, are 27 / 50 / 49 layers), the main node's 27 were repacked.
RPC_PROMPT = PromptRun(
    "Llama-3.1-405B Q4_0 5-token prompt on 3 x c8g.16xlarge (main + 2 upstream RPC workers)",
    "llama-3.1-405b-q4_0",
    "c8g.16xlarge",
    3,
    5,
    1.92598,
    "Arm learning path, distributed inference with llama.cpp, build 5935: prompt eval time = "
    "1925.98 ms / 5 tokens, eval 609.68 ms per token ("
    + _published("servers-and-cloud-computing/distributed-inference-with-llama-cpp/how-to-3.md")
    + ")",
    layers=(27, 50, 49),
    role="derives",
)
SINGLE_NODE_PROMPT = PromptRun(
    "Llama-3.1-8B Q4_0 14-token prompt on 1 x r8g.16xlarge (64 threads, repacked)",
    "llama-3.1-8b-q4_0",
    "r8g.16xlarge",
    1,
    14,
    0.04198,
    "Arm learning path, llama.cpp on Arm CPUs: prompt eval time = 41.98 ms / 14 tokens, eval "
    "16.23 ms per token, CPU_AARCH64 buffer ("
    + _published("servers-and-cloud-computing/llama-cpu/llama-chatbot.md")
    + ")",
)
# A MoE's short prompt reads the experts its tokens chose, each mostly by one of them: nearly a
# read of those experts and little more (``Model.read_share``, ``Model.reuse_share``). Run on
# 64 of the node's 96 cores; the model gives it all 96 (its reads bind, not its arithmetic).
MOE_PROMPT = PromptRun(
    "DeepSeek-R1 Q4_0 20-token prompt on 1 x r8g.24xlarge (64 threads, repacked)",
    "deepseek-r1-q4_0",
    "r8g.24xlarge",
    1,
    20,
    0.47765,
    _DEEPSEEK_ARM + ": prompt eval time = 477.65 ms / 20 tokens",
)
PROMPT_RUNS = (RPC_PROMPT, SINGLE_NODE_PROMPT, MOE_PROMPT)
PROMPT_TOLERANCE = 0.2


@dataclass(frozen=True)
class BatchedRun:
    """A published llama-batched-bench table on a machine not in the catalog: its decode of one
    sequence gives its bandwidth and its prompt its compute (``measured_node``), and the model
    predicts its decode of several sequences at once."""

    label: str
    model: str
    decode_tps: float  # one sequence (S_TG at B=1)
    prompt_tokens: int
    prompt_tps: float  # S_PP at B=1
    kv_tokens: int  # mean KV cache of a sequence while it decodes
    aggregate_tps: tuple[tuple[int, float], ...]  # (sequences, S_TG)
    source: str


_N2 = (
    "llama.cpp PR #13886 (arm64: optimize q4_k_q8_k kernel with i8mm), Neoverse-N2, "
    "llama-batched-bench -npp 128 -ntg 128 -npl 1,2,4,8,16,32 -t 64, Meta-Llama-3-8B-Instruct "
    "Q4_K_M, -fa --no-mmap"
)
BATCHED_RUNS = (
    BatchedRun("Llama-3-8B Q4_K_M on Neoverse-N2, 64 threads, Q4_K repacked (the PR)",
               "llama-3.1-8b-q4_k_m", 24.28, 128, 147.83, 192,
               ((2, 47.93), (4, 84.00), (8, 114.74)), _N2 + ": 'this pr' column"),
    BatchedRun("Llama-3-8B Q4_K_M on Neoverse-N2, 64 threads, plain kernels (before the PR)",
               "llama-3.1-8b-q4_k_m", 24.36, 128, 110.12, 192,
               ((2, 46.36), (4, 74.68), (8, 91.04)), _N2 + ": 'original' column"),
)  # fmt: skip

# The CPU families a compute rate is known for, and its basis. Graviton3 (Neoverse V1) and
# Graviton2 (N1): no published prompt run with Arm's current kernels.
COMPUTE_BASIS = {
    "axion": f"measured: {AXION_PROMPT.label}, {AXION_PROMPT.prompt_tps} tok/s",
    "graviton4": "assumed equal to Axion's per vCPU: the same Neoverse V2 core, and no published "
    "Graviton4 prompt run at many tokens was found (Arm's 8B 14-token run holds it)",
    "cobalt100": "measured on a Neoverse N2 at 64 threads (llama.cpp #13886: Llama-3-8B Q4_K_M, "
    "128-token prompt at 147.83 tok/s repacked, 110.12 plain), Cobalt 100's core (LLVM's "
    "cobalt-100 alias of neoverse-n2), scaled with vCPUs as Axion's rate grows with threads",
}
# The Neoverse N2 runs' threads (BATCHED_RUNS: the repacked column, then the plain one).
N2_THREADS = 64
NO_BATCHING_GAIN = "no batching gain assumed"


def parameters_per_byte(model: Model) -> float | None:
    """The model's (active) parameters per (active) weight byte; None when not known."""
    parameters = model.active_parameters or model.parameters
    return None if not parameters else parameters / model.weight_bytes_per_token


def token_flops(model: Model) -> float | None:
    """Arithmetic of one token: 2 per weight it multiplies, the embeddings aside (a token reads
    one row of them) unless they are the output head too (tied), a MoE's active experts only."""
    per_byte = parameters_per_byte(model)
    if per_byte is None:
        return None
    active = model.weight_bytes_per_token / model.size_bytes
    multiplied = model.size_bytes - (0 if model.tied_embeddings else model.input_bytes)
    return FLOPS_PER_PARAMETER * multiplied * active * per_byte


def share_flops(model: Model, share: NodeShare) -> float:
    """Arithmetic of one token on one node's share (0 when the parameter count is unknown)."""
    per_byte = parameters_per_byte(model) or 0.0
    active = model.weight_bytes_per_token / model.size_bytes
    return FLOPS_PER_PARAMETER * computed_weight_bytes(model, share) * active * per_byte


def head_flops(model: Model, share: NodeShare) -> float:
    """The output head's part of ``share_flops``: nothing unless this node computes the logits
    (it holds the last layer). A prompt's step computes them for its last token alone; a draft's
    check, and a step of several streams, for every token (llama.cpp's ``n_outputs``)."""
    computed = computed_weight_bytes(model, share)
    return share_flops(model, share) * head_bytes(model, share) / computed if computed else 0.0


def head_bytes(model: Model, share: NodeShare) -> int:
    """The output head's part of ``computed_weight_bytes``: none unless this node computes the
    logits (it holds the last layer)."""
    if share.layers == 0 or share.first_layer + share.layers != model.layers:
        return 0
    return min(computed_weight_bytes(model, share), model.output_bytes)


def prompt_flops(model: Model, share: NodeShare) -> float:
    """Arithmetic of one more prompt token on one node: its layers', not the head's."""
    return share_flops(model, share) - head_flops(model, share)


def _repacked_flops(instance: InstanceType, hidden: float | None = None) -> float | None:
    anchor = AXION_PROMPT
    if instance.cpu_family not in COMPUTE_BASIS or node_bandwidth_gbps(anchor.instance) is None:
        return None
    hidden = overlap() if hidden is None else hidden
    if instance.cpu_family == "cobalt100":
        flops, threads = _n2_flops(REPACKED, hidden), N2_THREADS
    else:
        flops, threads = _anchor_flops(anchor, hidden), anchor.threads
    return flops * math.pow(instance.vcpus / threads, anchor.scaling_exponent)


@cache
def _n2_flops(kernel: str, hidden: float) -> float:
    """The Neoverse N2's rate with ``kernel`` at N2_THREADS, from its own runs (#13886)."""
    run = BATCHED_RUNS[0 if kernel == REPACKED else 1]
    node = measured_node(PRESETS[run.model], decode_tps=run.decode_tps,
                         prompt_tokens=run.prompt_tokens, prompt_tps=run.prompt_tps,
                         kv_tokens=run.kv_tokens, label=run.label, plain=kernel == PLAIN,
                         hidden=hidden)  # fmt: skip
    flops = node.flops(kernel)
    if flops is None:
        raise ValueError(f"{run.label}: no {kernel} rate")
    return flops


@cache
def _anchor_flops(anchor: PromptAnchor, hidden: float) -> float:
    """``anchor.flops_at``, once per share: every plan row's step asks for it. It reads the
    anchor's bandwidth through the catalog, which is one per process (a catalog without it gives
    no rate, which ``_repacked_flops`` checks before asking)."""
    return anchor.flops_at(hidden)


@cache
def plain_slowdown() -> float:
    """How much slower Neoverse V2's plain Q4_0 kernels compute than its repacked ones, solved
    from Arm's 405B run (``RPC_PROMPT``: the only published run with plain kernels on it): the
    prompt's time less its reads and fixed costs, less the main node's repacked arithmetic, is the
    workers' plain arithmetic. A 2024 run on Graviton3 (Neoverse V1; llama.cpp PR #5780, 16-token
    prompt at 64 threads) gave 2.6x per token beyond the first, 1.75x on the whole prompt."""
    run = RPC_PROMPT
    model, instance = PRESETS[run.model], run.instance
    layout = run.layout()
    repacked = _repacked_flops(instance)
    bandwidth = node_bandwidth_gbps(instance)
    if repacked is None or bandwidth is None:
        raise ValueError(f"{run.label}: no compute rate or bandwidth for {instance.cpu_family}")
    hidden = overlap()
    reads = [
        _read_seconds(model, s, bandwidth, run.tokens, sequences=1, kv=run.tokens)
        for s in layout.shares
    ]
    fixed = fixed_seconds(model, run.nodes - 1)
    main, *workers = layout.shares
    main_extra = (run.tokens - 1) * prompt_flops(model, main) / repacked
    # The workers' arithmetic is longer than their reads (checked below), so each hides a
    # ``hidden`` share of its reads.
    left = run.seconds - fixed - node_seconds(reads[0], main_extra, hidden) - sum(reads[1:])
    left += hidden * sum(reads[1:])
    if left <= sum(reads[1:]):
        raise ValueError(f"{run.label}: the workers' arithmetic is shorter than their reads")
    plain = (run.tokens - 1) * sum(prompt_flops(model, s) for s in workers) / left
    return repacked / plain


def compute_flops(instance: InstanceType, kernel: str = REPACKED) -> float | None:
    """FLOP/s a node's cores reach in llama.cpp's matrix products for each token of a step beyond
    the first, with the ``kernel`` named, or None where no figure is known. Scaled from the Axion
    anchor by its own growth with threads (8 -> 16 threads gave 1.78x, not 2x), which keeps larger
    nodes below a linear extrapolation; plain kernels at ``plain_slowdown`` of it."""
    repacked = _repacked_flops(instance)
    if repacked is None or kernel == REPACKED:
        return repacked
    if kernel != PLAIN:
        raise ValueError(f"a kernel is {REPACKED} or {PLAIN}, not {kernel!r}")
    if instance.cpu_family == "cobalt100":  # the N2's own plain run
        return repacked * _n2_flops(PLAIN, overlap()) / _n2_flops(REPACKED, overlap())
    return repacked / plain_slowdown()


@dataclass(frozen=True)
class NodeRates:
    """What the model needs of one node: its memory bandwidth, and its compute rate with each
    kernel (None: unknown). A catalog type's come from ``node_rates``; a machine measured on its
    own (this one, or a published run's) from ``measured_node``."""

    bandwidth_gbps: float
    repacked_flops: float | None
    plain_flops: float | None
    label: str = ""
    # Each one-row pass of the repacked kernels (``one_row_passes``) reads the weights again
    # from memory: its threads' chunks of a matrix outgrow their cores' cache
    # (``one_row_rereads``). A catalog type's are a 4 x vCPUs-th of a matrix, taken to fit
    # (Graviton4 has 2 MB of L2 a core, The Next Platform, 2024-07-09; the 405B's largest matrix
    # over 64 vCPUs is 1.9 MiB a chunk).
    one_row_rereads: bool = False

    def flops(self, kernel: str) -> float | None:
        return self.repacked_flops if kernel == REPACKED else self.plain_flops


def node_rates(instance: InstanceType) -> NodeRates | None:
    bandwidth = node_bandwidth_gbps(instance)
    if bandwidth is None:
        return None
    return NodeRates(
        bandwidth,
        compute_flops(instance, REPACKED),
        compute_flops(instance, PLAIN),
        instance.name,
    )


def _rates(nodes: Sequence[InstanceType]) -> list[NodeRates] | None:
    # A cluster's nodes are mostly of one type: each type's rates once.
    by_type = {node: node_rates(node) for node in dict.fromkeys(nodes)}
    found = [by_type[node] for node in nodes]
    return None if any(r is None for r in found) else [r for r in found if r is not None]


def _read_seconds(
    model: Model, share: NodeShare, bandwidth_gbps: float, tokens: int, *, sequences: int, kv: int
) -> float:
    """A step's reads on one node: its weights once (of a MoE, the experts some token of the step
    chose: ``Model.read_share``) and each sequence's KV cache."""
    weights = computed_weight_bytes(model, share)
    read = weights * model.read_share(tokens) + sequences * kv_bytes_read(model, share, kv)
    return read / (calibration().eta * bandwidth_gbps * 1e9)


# The repacked kernels multiply a chunk of a matrix by a step's rows four at a time and by the
# rest one at a time, each such row a pass over the whole chunk (ggml-cpu/repack.cpp,
# forward_mul_mat_one_chunk: gemm for the rows in fours, gemv for each of the others). A thread's
# chunk is the whole matrix at one thread, a 4 x threads-th of it otherwise (forward_mul_mat).
ROW_GROUP = 4
CHUNKS_PER_THREAD = 4


def one_row_passes(rows: int) -> int:
    """Passes over a matrix, beyond the first, that the repacked kernels make for ``rows`` rows:
    one for each row past the last four (every row but one below four)."""
    if rows < 1:
        raise ValueError(f"a step has at least one row, not {rows}")
    return rows - 1 if rows < ROW_GROUP else rows % ROW_GROUP


def one_row_rereads(threads: int, matrix_bytes: int, cache_bytes: int) -> bool:
    """Whether a one-row pass reads the weights again from memory: a thread's chunk of its
    largest matrix (``matrix_bytes``) is larger than a core's ``cache_bytes``."""
    if threads < 1 or matrix_bytes < 1 or cache_bytes < 1:
        raise ValueError(f"threads {threads}, matrix {matrix_bytes} B, cache {cache_bytes} B")
    chunks = 1 if threads == 1 else CHUNKS_PER_THREAD * threads
    return matrix_bytes / chunks > cache_bytes


def _reread_seconds(
    model: Model, share: NodeShare, bandwidth_gbps: float, tokens: int, outputs: int
) -> float:
    """A step's further reads of a dense node's weights by its one-row passes: its layers' for
    the step's rows, the output head's for the rows whose logits it computes."""
    computed = computed_weight_bytes(model, share)
    if model.is_moe or tokens < 2 or not computed:
        return 0.0
    head = head_bytes(model, share)
    passes = one_row_passes(tokens) * (computed - head) + one_row_passes(outputs) * head
    return passes / (calibration().eta * bandwidth_gbps * 1e9)


def _beyond_first(model: Model, tokens: int) -> float:
    """A step's arithmetic beyond one pass over its reads, in tokens' worth: ``tokens - 1`` for
    a dense model; fewer for a MoE, whose routed experts are mostly chosen by one token of a
    short step (``Model.reuse_share``)."""
    active = model.weight_bytes_per_token / model.size_bytes
    return model.reuse_share(tokens) / active if model.is_moe else float(tokens - 1)


def node_seconds(read: float, extra: float, hidden: float) -> float:
    """One node's part of a step: its reads and its extra arithmetic, less the ``hidden``
    fraction of the shorter that runs under the other (the kernels compute on the weights as they
    stream in)."""
    return read + extra - hidden * min(read, extra)


@dataclass(frozen=True)
class Step:
    """One step of ``tokens`` tokens (of ``sequences`` sequences) on one serving group."""

    tokens: int
    seconds: float
    memory_seconds: float  # the reads, every node in turn
    compute_seconds: float  # the arithmetic of the tokens beyond the first, every node in turn

    @property
    def bound(self) -> str:
        return "compute" if self.compute_seconds > self.memory_seconds else "memory bandwidth"


def step(
    model: Model,
    nodes: Sequence[NodeRates],
    layout: Placement,
    kv_tokens: int,
    tokens: int,
    *,
    sequences: int = 1,
    workers_repack: bool = False,
    hidden: float | None = None,
    outputs: int | None = None,
) -> Step | None:
    """A step of ``tokens`` tokens on nodes that run one after another (the main node first): on
    each, its reads, then the arithmetic of every token beyond the first at its kernel's rate
    (the main node's repacked; a worker's repacked only with ``workers_repack``), and the
    repacked kernels' one-row passes where they read the weights again; the fixed
    per-layer and per-hop costs once. ``outputs``: the tokens whose logits it computes (every
    one unless said; a prompt's step, its last). At one token this is ``decode_tps``'s step. None
    when a compute rate or the parameter count a step of several tokens needs is unknown."""
    outputs = tokens if outputs is None else outputs
    if tokens < 1 or not 1 <= sequences <= tokens or not 1 <= outputs <= tokens:
        raise ValueError(f"a step of {tokens} tokens in {sequences} sequences, {outputs} out")
    if tokens > 1 and parameters_per_byte(model) is None:
        return None
    if tokens == 1:
        hidden = 0.0
    elif hidden is None:
        hidden = overlap()
    memory = compute = seconds = 0.0
    for index, (share, node) in enumerate(zip(layout.shares, nodes, strict=True)):
        read = _read_seconds(
            model, share, node.bandwidth_gbps, tokens, sequences=sequences, kv=kv_tokens
        )
        extra = 0.0
        if tokens > 1:
            kernel = REPACKED if index == 0 or workers_repack else PLAIN
            flops = node.flops(kernel)
            if flops is None:
                return None
            extra = _beyond_first(model, tokens) * prompt_flops(model, share) / flops
            extra += (outputs - 1) * head_flops(model, share) / flops
            if kernel == REPACKED and node.one_row_rereads:
                read += _reread_seconds(model, share, node.bandwidth_gbps, tokens, outputs)
        memory, compute = memory + read, compute + extra
        seconds += node_seconds(read, extra, hidden)
    return Step(tokens, seconds + fixed_seconds(model, len(nodes) - 1), memory, compute)


def no_compute_reason(model: Model, nodes: Sequence[InstanceType]) -> str | None:
    """Why a step's compute is unknown (then no batching gain is assumed), or None."""
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
    *,
    workers_repack: bool = False,
) -> Batch | None:
    """A step of ``streams`` streams on one group (``step`` with a sequence per token); None
    when a node's bandwidth is unknown; without a compute rate, no gain from batching at all."""
    if streams < 1:
        raise ValueError(f"a batch has at least one stream, not {streams}")
    single = decode_tps(model, nodes, layout, kv_tokens)
    rates = _rates(nodes)
    if single is None or rates is None:
        return None
    reason = no_compute_reason(model, nodes)
    if reason is not None:
        return Batch(streams, streams / single, f"{NO_BATCHING_GAIN}: {reason}")
    found = step(model, rates, layout, kv_tokens, streams, sequences=streams,
                 workers_repack=workers_repack)  # fmt: skip
    if found is None:
        return None
    return Batch(streams, found.seconds, found.bound)


@dataclass(frozen=True)
class Prompt:
    """A prompt of ``tokens`` computed on one group: the time to its first generated token."""

    tokens: int
    seconds: float

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds


def prompt_on(
    model: Model,
    nodes: Sequence[NodeRates],
    layout: Placement,
    tokens: int = PROMPT_TOKENS,
    *,
    workers_repack: bool = False,
) -> Prompt | None:
    """A prompt in steps of at most ``UBATCH_TOKENS``, each reading the KV cache so far; the
    last step's logits give the first token. None when a compute rate is unknown."""
    if tokens < 1:
        raise ValueError(f"a prompt has at least one token, not {tokens}")
    seconds, done = 0.0, 0
    while done < tokens:
        size = min(UBATCH_TOKENS, tokens - done)
        found = step(
            model, nodes, layout, done + size, size, workers_repack=workers_repack, outputs=1
        )
        if found is None:
            return None
        seconds, done = seconds + found.seconds, done + size
    return Prompt(tokens, seconds)


def prompt(
    model: Model,
    nodes: Sequence[InstanceType],
    layout: Placement,
    tokens: int = PROMPT_TOKENS,
    *,
    workers_repack: bool = False,
) -> Prompt | None:
    """``prompt_on`` for catalog types; None where a bandwidth or compute rate is unknown."""
    rates = _rates(nodes)
    if rates is None or no_compute_reason(model, nodes) is not None:
        return None
    return prompt_on(model, rates, layout, tokens, workers_repack=workers_repack)


def one_node(model: Model, context: int) -> Placement:
    """The whole model on one node with room for it (a measured machine's layout)."""
    return placement.place(model, context, 1, [10 * model.size_bytes + 2**40])


def measured_node(
    model: Model,
    *,
    decode_tps: float,
    prompt_tokens: int,
    prompt_tps: float,
    kv_tokens: int,
    label: str,
    plain: bool = False,
    hidden: float | None = None,
    one_row_rereads: bool = False,
) -> NodeRates:
    """A machine known by its own runs of ``model`` on one node: the bandwidth that makes the
    model predict its decode (at ``kv_tokens``), and the compute rate that makes it predict its
    prompt of ``prompt_tokens`` (one step), with the kernel it ran (``plain`` or repacked), and
    whether its repacked one-row passes read the weights again (``one_row_rereads``)."""
    if not 1 < prompt_tokens <= UBATCH_TOKENS:
        raise ValueError(f"a measured prompt is one step of 2-{UBATCH_TOKENS} tokens")
    layout = one_node(model, 2 * max(kv_tokens, prompt_tokens))
    (share,) = layout.shares
    cal = calibration()
    fixed = fixed_seconds(model, 0)
    left = 1 / decode_tps - fixed
    if left <= 0:
        raise ValueError(f"{label}: the per-layer overhead alone is slower than measured")
    bandwidth = streamed_bytes(model, share, kv_tokens) / (cal.eta * left) / 1e9
    memory = _read_seconds(model, share, bandwidth, prompt_tokens, sequences=1, kv=prompt_tokens)
    if one_row_rereads and not plain:
        memory += _reread_seconds(model, share, bandwidth, prompt_tokens, 1)
    # The arithmetic of a prompt outlasts its one read of the weights: it hides ``hidden`` of it.
    hidden = overlap() if hidden is None else hidden
    arithmetic = prompt_tokens / prompt_tps - fixed - (1 - hidden) * memory
    if arithmetic <= memory:
        raise ValueError(f"{label}: its prompt is faster than reading its weights")
    flops = _beyond_first(model, prompt_tokens) * prompt_flops(model, share) / arithmetic
    return NodeRates(
        bandwidth, None if plain else flops, flops if plain else None, label, one_row_rereads
    )


def batched_prediction(run: BatchedRun, sequences: int) -> float:
    """``run``'s aggregate decode of ``sequences`` sequences at once, as the model predicts it."""
    return _batched(run, sequences, overlap())


def _batched(run: BatchedRun, sequences: int, hidden: float) -> float:
    model = PRESETS[run.model]
    plain = "plain" in run.label
    node = measured_node(model, decode_tps=run.decode_tps, prompt_tokens=run.prompt_tokens,
                         prompt_tps=run.prompt_tps, kv_tokens=run.kv_tokens, label=run.label,
                         plain=plain, hidden=hidden)  # fmt: skip
    layout = one_node(model, 2 * run.kv_tokens * sequences)
    # One node: its own kernel is the main node's, whichever it is.
    main = NodeRates(node.bandwidth_gbps, node.plain_flops if plain else node.repacked_flops, None)
    found = step(
        model, [main], layout, run.kv_tokens, sequences, sequences=sequences, hidden=hidden
    )
    if found is None:
        raise ValueError(f"{run.label}: no compute rate")
    return sequences / found.seconds


# How much of a step's reads its extra arithmetic hides is solved so that the runs it can be
# compared with (Arm's 8B prompt, every row of the Neoverse-N2 tables) are all as near as one
# share can make them: the 8B's 14 tokens hide less of the reads than the N2's batches do.
OVERLAP_STEPS = 100


def _errors(hidden: float) -> list[float]:
    """Each asserted run's prediction over its measurement, at ``hidden``."""
    found = []
    for run in PROMPT_RUNS:
        if run.role == "asserted":
            found.append(_prompt_seconds(run, hidden=hidden) / run.seconds)
    for batched in BATCHED_RUNS:
        for sequences, measured in batched.aggregate_tps:
            found.append(_batched(batched, sequences, hidden) / measured)
    return found


@cache
def overlap() -> float:
    """The share of the shorter of a node's reads and its extra arithmetic that runs under the
    other: the one that minimises the largest relative error over ``_errors``' runs."""
    trials = [i / OVERLAP_STEPS for i in range(OVERLAP_STEPS)]
    return min(trials, key=lambda h: max(abs(math.log(e)) for e in _errors(h)))


def prompt_run_seconds(run: PromptRun, *, workers_repack: bool = False) -> float:
    """``run``'s prompt step as the model predicts it."""
    return _prompt_seconds(run, workers_repack=workers_repack)


def _prompt_seconds(
    run: PromptRun, *, workers_repack: bool = False, hidden: float | None = None
) -> float:
    model, nodes = PRESETS[run.model], [run.instance] * run.nodes
    if hidden is None:
        rates = _rates(nodes)
    else:  # a single node's own kernels (the plain ones are not needed): while solving overlap()
        bandwidth = node_bandwidth_gbps(run.instance)
        rates = (
            None
            if bandwidth is None
            else [NodeRates(bandwidth, _repacked_flops(run.instance, hidden), None)] * run.nodes
        )
    if rates is None:
        raise ValueError(f"{run.label}: no bandwidth for {run.instance.cpu_family}")
    found = step(model, rates, run.layout(), run.tokens, run.tokens,
                 workers_repack=workers_repack, hidden=hidden, outputs=1)  # fmt: skip
    if found is None:
        raise ValueError(f"{run.label}: no compute rate")
    return found.seconds


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
