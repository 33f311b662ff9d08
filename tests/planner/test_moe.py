"""A mixture of experts in the performance model: a step reads the experts its tokens chose and
computes them as often as they were chosen; a MoE layer costs a step more than its reads. Held to
Arm's DeepSeek-R1 run on Graviton4 (decode sets the layer cost; its 20-token prompt is asserted
with the other prompts in test_prompt)."""

from __future__ import annotations

import dataclasses

import pytest

from infra.core import perf, placement, sizing
from infra.models import PRESETS

R1 = PRESETS["deepseek-r1-q4_0"]


def test_arms_deepseek_decode_sets_a_moe_layers_cost() -> None:
    anchor = perf.MOE_ANCHOR
    assert anchor in perf.CHECKS and anchor.role == "derives" and "deepseek-cpu" in anchor.source
    model, node = PRESETS[anchor.model], anchor.instance
    layout = placement.place(model, 2 * anchor.kv_tokens, 1, [sizing.usable_memory_bytes(node)])
    assert perf.decode_tps(model, [node], layout, anchor.kv_tokens) == pytest.approx(12.24)
    # Its reads alone would decode a fifth faster: the layer cost is what the kernels add.
    seconds = perf.moe_layer_seconds() * model.layers
    assert 0.1 < seconds * anchor.decode_tps < 0.3
    dense = dataclasses.replace(model, active_bytes=None, experts=0, experts_used=0)
    assert perf.fixed_seconds(dense, 0) == pytest.approx(perf.fixed_seconds(model, 0) - seconds)


def test_the_moe_prompt_is_one_of_the_asserted_runs() -> None:
    assert perf.MOE_PROMPT in perf.PROMPT_RUNS and perf.MOE_PROMPT.role == "asserted"
    predicted = perf.prompt_run_seconds(perf.MOE_PROMPT)
    assert predicted == pytest.approx(perf.MOE_PROMPT.seconds, rel=perf.PROMPT_TOLERANCE)


@pytest.mark.parametrize("tokens", [1, 2, 4, 20, 512])
def test_a_step_reads_the_experts_chosen_and_computes_each_as_often(tokens: int) -> None:
    active = R1.weight_bytes_per_token / R1.size_bytes
    assert R1.read_share(1) == pytest.approx(active)
    # Every token's weights are read once; the routed experts as many as some token chose.
    assert active <= R1.read_share(tokens) <= min(1.0, tokens * active) + 1e-12
    # Beyond one pass over its reads, a step multiplies each expert once more for each further
    # token that chose it: never more than a dense step's tokens - 1.
    assert 0 <= R1.reuse_share(tokens) <= (tokens - 1) * active + 1e-12
    dense = PRESETS["llama-3.1-70b-q4_0"]
    assert (dense.read_share(tokens), dense.reuse_share(tokens)) == (1.0, tokens - 1)


def test_a_moe_read_and_reuse_add_up_to_its_tokens_choices() -> None:
    """Each token uses the active share once: what a step reads plus what it reuses is every
    token's worth."""
    active = R1.weight_bytes_per_token / R1.size_bytes
    for tokens in (1, 3, 20, 100):
        assert R1.read_share(tokens) + R1.reuse_share(tokens) == pytest.approx(tokens * active)


def test_a_moe_without_expert_counts_reads_each_tokens_experts_as_its_own() -> None:
    unknown = dataclasses.replace(R1, experts=0, experts_used=0)
    active = R1.weight_bytes_per_token / R1.size_bytes
    assert unknown.read_share(4) == pytest.approx(4 * active)
    assert unknown.reuse_share(4) == pytest.approx(3 * active)


@pytest.mark.parametrize(
    ("name", "size_gb", "active_b", "kv_bytes", "experts"),
    [
        ("kimi-k2-q2_k_xl", 381.0, 32e9, 61 * 576 * 2, (384, 8)),
        ("kimi-k2-q8_0", 1090.0, 32e9, 61 * 576 * 2, (384, 8)),
        ("deepseek-v3.1-q2_k_xl", 256.0, 37e9, 61 * 576 * 2, (256, 8)),
        ("deepseek-v3.1-q5_k_xl", 485.0, 37e9, 61 * 576 * 2, (256, 8)),
        ("deepseek-v3.1-q8_0", 715.0, 37e9, 61 * 576 * 2, (256, 8)),
        ("qwen3-235b-a22b-q4_k_m", 142.15, 22e9, 94 * 4 * 128 * 2 * 2, (128, 8)),
    ],
)
def test_the_largest_open_moe_presets_carry_their_published_shape(
    name: str, size_gb: float, active_b: float, kv_bytes: int, experts: tuple[int, int]
) -> None:
    model = PRESETS[name]
    assert model.size_gb == pytest.approx(size_gb) and model.active_parameters == active_b
    assert model.kv_bytes_per_token == kv_bytes  # latent attention: one K row of 576, no V
    assert (model.experts, model.experts_used) == experts
    assert model.weight_bytes_per_token == pytest.approx(
        size_gb * 1e9 * active_b / model.parameters
    )
