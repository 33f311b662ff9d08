"""One stream's decode speed under each way of running a model across nodes, for one cluster.

A layer split (llama.cpp over RPC, what the stacks run) runs the nodes one after another, so one
stream is never faster than one node reading its share of the weights in turn: ``perf`` models
it. Two other shapes could do better, and the rest do no better:

- **a draft model** (speculative decoding): a small model of the same vocabulary proposes
  ``draft_max`` tokens on the main node; the cluster checks them all in one step of
  ``draft_max + 1`` tokens (``perf.step``: the weights read once, and the arithmetic of each
  token beyond the first, at the plain kernels' rate on workers that do not repack). Each step
  yields the accepted run: drafted tokens up to the first rejected one, and the target's own;
  the best draft length is chosen, or none when every one is slower;
- **tensor parallelism** (distributed-llama; llama.cpp's own tensor split over RPC): every node
  reads its slice of every layer at once, then the nodes exchange activations twice a layer;
- a pipeline (prima.cpp) or vLLM's pipeline or tensor split on CPUs reduce to one of the two
  above, with the reasons each is not offered.

Every figure here is a prediction from ``perf``'s calibrated terms, with its basis and sources.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from infra.catalog import InstanceType
from infra.core import perf, placement, sizing
from infra.core.placement import Placement
from infra.models import PRESETS, Model


@dataclass(frozen=True)
class DraftPair:
    """A draft model for a family of targets, and the acceptance a published run measured."""

    draft: str  # a preset
    acceptance: float  # accepted / drafted, as llama.cpp reports it
    draft_max: int  # the draft length that acceptance was measured at
    source: str
    # The lowest published rate for a pair like it (accepted / drafted at ``draft_max``): the
    # bottom of the range, as ``acceptance`` is its top.
    low_acceptance: float
    low_source: str

    @property
    def per_token(self) -> float:
        """The per-token acceptance the published rate implies at its draft length."""
        return per_token_acceptance(self.acceptance, self.draft_max)

    @property
    def per_token_range(self) -> tuple[float, float]:
        """The chance the target accepts each drafted token, lowest to highest published."""
        return per_token_acceptance(self.low_acceptance, self.draft_max), self.per_token


def accepted_run(acceptance: float, draft_max: int) -> float:
    """Tokens a step yields: the drafted tokens accepted until the first rejected one (each with
    chance ``acceptance``), and the target's own token after them:
    (1 - a^(k+1)) / (1 - a)."""
    if not 0 <= acceptance <= 1:
        raise ValueError(f"an acceptance is a chance per drafted token, not {acceptance}")
    if acceptance == 1:
        return draft_max + 1.0
    return (1 - acceptance ** (draft_max + 1)) / (1 - acceptance)


def per_token_acceptance(rate: float, draft_max: int) -> float:
    """The per-token acceptance whose accepted run, less the target's token, is ``rate`` of
    ``draft_max`` drafted (what llama.cpp reports), by bisection."""
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        if (accepted_run(middle, draft_max) - 1) / draft_max < rate:
            low = middle
        else:
            high = middle
    return (low + high) / 2


# The nearest published llama.cpp runs: Llama 3 and 3.1 share one 128,256-token vocabulary, so
# a Llama-3.1-8B drafts for its 70B and 405B (llama-server checks the vocabularies match).
LLAMA_8B_DRAFT = DraftPair(
    draft="llama-3.1-8b-q4_0",
    acceptance=0.587,
    draft_max=8,
    source="Llama-3-70B-Instruct Q4_K_M with a Llama-3-8B-Instruct Q4_K_M draft in "
    "llama-speculative, top-k 1, draft 8: 58.7 % accepted (devquasar.com, 'Speculative "
    "decoding tradeoffs: GPU with large models, Llama 70B / 8B'), 0.88 a token; a Llama-70B / "
    "8B distill pair in vLLM accepts 38.8-55.6 % by task (vllm-project/vllm#53987); no "
    "published run has a 405B target",
    low_acceptance=0.356,
    low_source="Llama-2-70B f16 with a Llama-2-7B Q8_0 draft in llama.cpp's speculative example, "
    "CPU only, default sampling, draft 8: 35.6 % accepted, 0.76 a token "
    "(ggml-org/llama.cpp#2926)",
)
DRAFT_PAIRS: dict[str, DraftPair] = {
    "llama-3.1-70b": LLAMA_8B_DRAFT,
    "llama-3.1-405b": LLAMA_8B_DRAFT,
}
# The draft lengths a plan tries (llama-server's --draft-max).
DRAFT_LENGTHS = range(1, 17)


def draft_pair(model: Model) -> DraftPair | None:
    """The draft paired with a preset's family (its name without the quantisation)."""
    return DRAFT_PAIRS.get(model.name.rsplit("-", 1)[0])


# Tensor parallelism's exchange: two all-reduces of the hidden state per layer (after attention
# and after the feed-forward), as distributed-llama and llama.cpp's tensor split do. Its bytes are
# distributed-llama's measured figure for Llama 3 8B (32 layers, width 4,096; Q80 activations):
# 544 kB a token for each node beyond the first (544 / 1,632 / 3,808 kB at 2 / 4 / 8 nodes, its
# README), scaled by width and layers.
TP_SYNCS_PER_LAYER = 2
TP_BYTES_PER_EXTRA_NODE_8B = 544e3
TP_REFERENCE_WIDTH, TP_REFERENCE_LAYERS = 4096, 32
# Assumed, not measured: one exchange's round trip inside a cluster placement group.
TP_ROUND_TRIP_SECONDS = 50e-6


@dataclass(frozen=True)
class EngineLine:
    """One engine's predicted single-stream decode on a cluster, and whether the product runs
    it (and if not, why)."""

    engine: str
    tps: float | None
    offered: bool
    basis: str
    why_not: str = ""
    sources: tuple[str, ...] = ()
    # A draft model's chosen draft length (0: no draft, it is slower); None for other engines.
    draft_max: int | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "engine": self.engine,
            "predictedDecodeTps": None if self.tps is None else round(self.tps, 2),
            "draftMax": self.draft_max,
            "offered": self.offered,
            "basis": self.basis,
            "whyNot": self.why_not or None,
            "sources": list(self.sources),
        }


@dataclass(frozen=True)
class Speculative:
    """A speculative step: the draft's tokens on the main node, then one check on the cluster."""

    tps: float
    tokens_per_step: float
    draft_seconds: float
    verify_seconds: float
    draft_max: int


def speculative(
    model: Model,
    nodes: Sequence[InstanceType],
    layout: Placement,
    kv_tokens: int,
    *,
    draft: Model,
    acceptance: float,
    draft_max: int,
    workers_repack: bool = False,
) -> Speculative | None:
    """One stream with a draft model on the main node: each step drafts ``draft_max`` tokens
    there, one after another, then the cluster checks them and one more in one step of
    ``draft_max + 1`` tokens (``perf.step``: the weights read once, the arithmetic of every token
    beyond the first at each node's kernel's rate, the logits of each), and the draft model
    takes in the same ``draft_max + 1`` tokens as one step of its own (llama.cpp's draft-simple
    mirrors every batch of the target's into the draft's context: common/speculative.cpp,
    ``process``); it yields the accepted run and the target's token (``accepted_run``,
    ``acceptance`` a chance per drafted token). None where a bandwidth or compute rate is
    unknown."""
    main = nodes[0]
    # The draft alone on the main node (the target's layers wait meanwhile).
    alone = placement.place(draft, max(kv_tokens, 1), 1, [sizing.usable_memory_bytes(main)])
    rates = [perf.node_rates(n) for n in nodes]
    known = [r for r in rates if r is not None]
    if len(known) < len(rates) or perf.no_compute_reason(model, nodes):
        return None
    return speculative_on(model, known, layout, kv_tokens, draft=draft, draft_layout=alone,
                          acceptance=acceptance, draft_max=draft_max,
                          workers_repack=workers_repack)  # fmt: skip


def speculative_on(
    model: Model,
    nodes: Sequence[perf.NodeRates],
    layout: Placement,
    kv_tokens: int,
    *,
    draft: Model,
    draft_layout: Placement,
    acceptance: float,
    draft_max: int,
    workers_repack: bool = False,
) -> Speculative | None:
    """``speculative`` on nodes known by their rates (a catalog type's, or a machine measured
    on its own: bench/calibrate.py); the draft runs on the first, placed as ``draft_layout``."""
    if draft_max < 1:
        raise ValueError(f"a draft has at least one token, not {draft_max}")
    tokens = accepted_run(acceptance, draft_max)
    decode = perf.step(draft, [nodes[0]], draft_layout, kv_tokens, 1)
    mirrored = perf.step(draft, [nodes[0]], draft_layout, kv_tokens, draft_max + 1, outputs=1)
    verify = perf.step(model, nodes, layout, kv_tokens, draft_max + 1,
                       workers_repack=workers_repack)  # fmt: skip
    if decode is None or mirrored is None or verify is None:
        return None
    draft_seconds = draft_max * decode.seconds + mirrored.seconds
    return Speculative(
        tokens / (draft_seconds + verify.seconds), tokens, draft_seconds, verify.seconds, draft_max
    )


def best_draft(
    model: Model,
    nodes: Sequence[InstanceType],
    layout: Placement,
    kv_tokens: int,
    *,
    draft: Model,
    acceptance: float,
    workers_repack: bool = False,
) -> Speculative | None:
    """The draft length (``DRAFT_LENGTHS``) that decodes fastest; None where unknown."""
    found = [
        speculative(
            model,
            nodes,
            layout,
            kv_tokens,
            draft=draft,
            acceptance=acceptance,
            draft_max=k,
            workers_repack=workers_repack,
        )
        for k in DRAFT_LENGTHS
    ]
    known = [f for f in found if f is not None]
    return max(known, key=lambda f: f.tps, default=None)


def tensor_parallel_tps(
    model: Model, nodes: Sequence[InstanceType], kv_tokens: int
) -> float | None:
    """One stream with every layer split across the nodes: each reads its slice at once (the
    slowest sets the pace), the fixed per-layer cost once, and the exchanges over the slowest
    node's network. None where a bandwidth, a network or the model's width is unknown."""
    networks = [n.network_gbps for n in nodes]
    bandwidths = [perf.node_bandwidth_gbps(n) for n in nodes]
    if model.embedding is None or None in networks or None in bandwidths:
        return None
    cal = perf.calibration()
    count = len(nodes)
    # What one token reads, as a layer split's node does (of the embeddings one row: nothing),
    # a slice of it on each node.
    active = model.weight_bytes_per_token / model.size_bytes
    weights = (model.size_bytes - model.input_bytes) * active
    window = model.sliding_window or kv_tokens
    kv = sum(
        per_token * (min(kv_tokens, window) if i in model.sliding_layers else kv_tokens)
        for i, per_token in enumerate(model.kv_per_layer)
    )
    read = (weights + kv) / count
    memory = max(read / (cal.eta * bw * 1e9) for bw in bandwidths if bw is not None)
    scale = (model.embedding / TP_REFERENCE_WIDTH) * (model.layers / TP_REFERENCE_LAYERS)
    exchanged = (count - 1) * TP_BYTES_PER_EXTRA_NODE_8B * scale
    network = min(n for n in networks if n is not None) * 1e9 / 8
    exchanges = model.layers * TP_SYNCS_PER_LAYER if count > 1 else 0
    seconds = (
        memory
        + model.layers * cal.layer_overhead_seconds
        + exchanges * TP_ROUND_TRIP_SECONDS
        + exchanged / network
    )
    return 1 / seconds


def engine_lines(
    model: Model,
    nodes: Sequence[InstanceType],
    layout: Placement,
    kv_tokens: int,
    *,
    acceptance: float | None = None,
    workers_repack: bool = False,
) -> list[EngineLine]:
    """Every engine's line for one cluster (``nodes``: the main node, then the workers).
    ``acceptance`` (a chance per drafted token) replaces the draft pair's range;
    ``workers_repack``: whether the build's workers repack (patch 0005), with a cluster of
    workers the draft line is also shown the other way."""
    count = len(nodes)
    split = perf.decode_tps(model, nodes, layout, kv_tokens)
    lines = [
        EngineLine(
            "llama.cpp layer split over RPC",
            split,
            True,
            "the nodes one after another, each reading its layers' weights (perf: calibrated "
            "on Arm's 405B run on 3 x c8g.16xlarge)",
        )
    ]
    # With workers, the draft line both ways: as the build runs them, and the other.
    for repack in (workers_repack, not workers_repack)[: 2 if count > 1 else 1]:
        lines.append(
            _draft_line(
                model, nodes, layout, kv_tokens, acceptance=acceptance, workers_repack=repack
            )
        )
    tp = tensor_parallel_tps(model, nodes, kv_tokens)
    lines.append(
        EngineLine(
            f"tensor parallel on {count} node{'s' if count > 1 else ''}",
            tp,
            False,
            f"each node reads 1/{count} of every layer at once; {TP_SYNCS_PER_LAYER} exchanges a "
            f"layer of distributed-llama's measured size, scaled by width and layers, at an "
            f"assumed {TP_ROUND_TRIP_SECONDS * 1e6:.0f} us round trip each, over the slowest "
            "node's network; kernels as fast as llama.cpp's (an assumption)"
            if tp is not None
            else "unknown: a node's bandwidth or network, or the model's width, is not known",
            "llama.cpp's tensor split runs across local devices only: over RPC it is an open "
            "pull request (ggml-org/llama.cpp#26610); distributed-llama has it, in its own "
            "model format, on 2^n nodes, with no authentication and no Arm server figures",
            (
                "ggml-org/llama.cpp#26610",
                "b4rtaz/distributed-llama README (544 / 1,632 / 3,808 kB a token for Llama 3 8B "
                "on 2 / 4 / 8 nodes)",
            ),
        )
    )
    lines.append(
        EngineLine(
            "pipeline (prima.cpp)",
            split,
            False,
            "one stream passes the stages one after another, as the layer split does",
            "a frozen 2025 fork of llama.cpp (HEAD of 2025-07-17) whose pipeline gives one "
            "stream nothing once the model fits in the nodes' memory",
            ("Lizonghang/prima.cpp#17", "Lizonghang/prima.cpp#21"),
        )
    )
    lines.append(
        EngineLine(
            "vLLM on CPUs",
            None,
            False,
            "not predicted: no multi-node CPU run to calibrate on but a TCP-bound one",
            "no Ray executor on CPUs (vllm-project/vllm#21602; #25386 closed); its Ray-free "
            "multi-node mode deadlocks across hosts (#46716, open) and its all-reduce goes over "
            "TCP (#46447: 5.47 tok/s at tensor parallel 4 on two Grace nodes)",
            (
                "vllm-project/vllm#21602",
                "vllm-project/vllm#46716",
                "vllm-project/vllm#46447",
            ),
        )
    )
    return lines


def workers_kernel(repack: bool) -> str:
    return "workers repack (patch 0005)" if repack else "workers as upstream (GGML_RPC_REPACK=0)"


def _draft_line(
    model: Model,
    nodes: Sequence[InstanceType],
    layout: Placement,
    kv_tokens: int,
    *,
    acceptance: float | None,
    workers_repack: bool,
) -> EngineLine:
    name = "llama.cpp layer split with a draft model"
    if len(nodes) > 1:
        name += f", {workers_kernel(workers_repack)}"
    pair = draft_pair(model)
    if pair is None:
        return EngineLine(
            name,
            None,
            True,
            f"not predicted: no draft model of {model.name}'s vocabulary among the presets "
            "(a stack's draftModel takes any of the same vocabulary)",
        )
    draft = PRESETS[pair.draft]
    given = acceptance is not None
    low, high = (acceptance, acceptance) if acceptance is not None else pair.per_token_range
    central = (low + high) / 2

    def best(a: float) -> Speculative | None:
        return best_draft(model, nodes, layout, kv_tokens, draft=draft, acceptance=a,
                          workers_repack=workers_repack)  # fmt: skip

    found, worst, most = best(central), best(low), best(high)
    plain = perf.decode_tps(model, nodes, layout, kv_tokens)
    cited = () if given else (pair.source, pair.low_source)
    if found is None or worst is None or most is None or plain is None:
        return EngineLine(name, None, True, "not predicted: a bandwidth or compute rate is unknown")
    accepted = (
        f"{central:.0%} a token (given)"
        if given
        else f"{central:.0%} a token ({low:.0%}-{high:.0%}: {worst.tps:.2f}-{most.tps:.2f} tok/s)"
    )
    basis = (
        f"{pair.draft} drafts {found.draft_max} token{'s' if found.draft_max > 1 else ''} a step "
        f"on the main node and takes in the checked ones ({found.draft_seconds * 1e3:.0f} ms), "
        f"the cluster checks them and one more in one step ({found.verify_seconds * 1e3:.0f} ms, "
        "perf.step): "
        f"{found.tokens_per_step:.2f} tokens a step at {accepted}; the best of draft "
        f"{DRAFT_LENGTHS.start}-{DRAFT_LENGTHS.stop - 1}"
    )
    if found.tps <= plain:
        return EngineLine(
            name,
            plain,
            True,
            f"no draft: slower ({found.tps:.2f} tok/s at its best, draft {found.draft_max}, "
            f"against {plain:.2f} without); " + basis,
            "",
            cited,
            draft_max=0,
        )
    return EngineLine(name, found.tps, True, basis, "", cited, found.draft_max)
