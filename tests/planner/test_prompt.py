"""Steps of several tokens (a prompt, a draft's check, several streams) held to every published run
they can be compared with: Arm's two Graviton4 prompts, the Neoverse-N2 batched-bench tables of
llama.cpp #13886 and the Axion pp512 run; the time to first token a plan shows comes from them."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from infra import catalog
from infra.boot.patches import patch_set
from infra.cli.plan import main
from infra.core import perf, pins, placement, sizing
from infra.models import PRESETS
from infra.planner import search


def within(predicted: float, measured: float) -> bool:
    return abs(predicted / measured - 1) <= perf.PROMPT_TOLERANCE


@pytest.mark.parametrize("run", [r for r in perf.PROMPT_RUNS if r.role == "asserted"],
                         ids=lambda r: r.model)  # fmt: skip
def test_a_published_prompt_is_predicted_within_20_percent(run: perf.PromptRun) -> None:
    predicted = perf.prompt_run_seconds(run)
    assert within(predicted, run.seconds), f"{run.label}: {predicted:.4f} s, not {run.seconds}"
    assert "arm-learning-paths" in run.source


def test_arms_405b_prompt_sets_the_plain_kernels_and_costs_several_decode_steps() -> None:
    """Upstream workers keep their weights as sent (plain kernels): solved from Arm's run, they
    compute several times slower than a repacked node; a 5-token step then costs about three
    decode steps, as Arm measured, not one (the audit's 623 ms); workers that repack halve it."""
    run = perf.RPC_PROMPT
    assert run.role == "derives" and run.layers == (27, 50, 49)
    assert perf.prompt_run_seconds(run) == pytest.approx(run.seconds)
    assert 2 < perf.plain_slowdown() < 8
    decode_step = 0.60968  # Arm: 609.68 ms per decoded token
    assert perf.prompt_run_seconds(run) > 3 * decode_step
    assert perf.prompt_run_seconds(run, workers_repack=True) < 0.5 * run.seconds
    # Its plain rate is what a worker of the catalog computes with.
    c8g = run.instance
    plain, repacked = perf.compute_flops(c8g, perf.PLAIN), perf.compute_flops(c8g)
    assert plain is not None and repacked is not None
    assert repacked / plain == pytest.approx(perf.plain_slowdown())
    with pytest.raises(ValueError, match="kernel"):
        perf.compute_flops(c8g, "fast")


@pytest.mark.parametrize(
    ("run", "sequences"),
    [(run, s) for run in perf.BATCHED_RUNS for s, _ in run.aggregate_tps],
    ids=lambda x: x if isinstance(x, int) else x.label.split(", ")[-1],
)
def test_the_neoverse_n2_batched_bench_is_predicted_within_20_percent(
    run: perf.BatchedRun, sequences: int
) -> None:
    measured = dict(run.aggregate_tps)[sequences]
    predicted = perf.batched_prediction(run, sequences)
    assert within(predicted, measured), f"{run.label} at {sequences}: {predicted:.1f}"
    assert "#13886" in run.source


def test_the_overlap_is_a_share_and_the_runs_move_with_it() -> None:
    hidden = perf.overlap()
    assert 0 <= hidden < 1
    run = perf.BATCHED_RUNS[0]
    # Hiding none of the reads makes a batch slower than the model says; hiding all, faster.
    assert perf._batched(run, 8, 0.0) < perf.batched_prediction(run, 8) < perf._batched(run, 8, 0.9)


def test_the_axion_pp512_run_is_reproduced() -> None:
    anchor = perf.AXION_PROMPT
    model, instance = PRESETS[anchor.model], anchor.instance
    layout = placement.place(model, 1024, 1, [sizing.usable_memory_bytes(instance)])
    rates = perf.node_rates(instance)
    assert rates is not None
    found = perf.prompt_on(model, [rates], layout, anchor.prompt_tokens)
    assert found is not None
    assert found.tps == pytest.approx(anchor.prompt_tps, rel=0.02)


def test_a_measured_node_reproduces_the_runs_it_was_measured_by() -> None:
    """A machine known by its own decode and prompt (this one, for bench/calibrate.py) predicts
    both back; a prompt faster than a read of the weights is refused."""
    model = PRESETS["llama-3.1-8b-q4_0"]
    node = perf.measured_node(model, decode_tps=20.0, prompt_tokens=128, prompt_tps=150.0,
                              kv_tokens=64, label="here")  # fmt: skip
    layout = perf.one_node(model, 256)
    one = perf.step(model, [node], layout, 64, 1)
    prompt = perf.step(model, [node], layout, 128, 128, outputs=1)
    assert one is not None and prompt is not None
    assert one.seconds == pytest.approx(1 / 20.0)
    assert prompt.seconds == pytest.approx(128 / 150.0)
    with pytest.raises(ValueError, match="faster than reading"):
        perf.measured_node(model, decode_tps=20.0, prompt_tokens=128, prompt_tps=1e6,
                           kv_tokens=64, label="too fast")  # fmt: skip


def c8g(count: int) -> list[catalog.InstanceType]:
    node = catalog.find("aws", "us-east-1", "c8g.16xlarge")
    assert node is not None
    return [node] * count


def test_a_prompt_is_computed_in_steps_of_a_ubatch() -> None:
    model, nodes = PRESETS["llama-3.1-405b-q4_0"], c8g(3)
    layout = placement.place(model, 4096, 1, [sizing.usable_memory_bytes(n) for n in nodes])
    rates = [r for r in map(perf.node_rates, nodes) if r is not None]
    found = perf.prompt(model, nodes, layout, 1000)
    first = perf.step(model, rates, layout, 512, 512, outputs=1)
    second = perf.step(model, rates, layout, 1000, 488, outputs=1)
    assert found is not None and first is not None and second is not None
    assert found.seconds == pytest.approx(first.seconds + second.seconds)
    assert found.tps == pytest.approx(1000 / found.seconds)
    one = perf.step(model, rates, layout, 2048, 1)
    decode = perf.decode_tps(model, nodes, layout, 2048)
    assert one is not None and decode is not None and one.seconds == pytest.approx(1 / decode)
    # Repacking workers is worth most where the workers hold most of the layers.
    faster = perf.prompt(model, nodes, layout, 1000, workers_repack=True)
    assert faster is not None and faster.seconds < 0.6 * found.seconds
    # No compute rate (Graviton3): no time to first token.
    graviton3 = catalog.find("aws", "us-east-1", "c7g.16xlarge")
    assert graviton3 is not None and perf.prompt(model, [graviton3] * 3, layout) is None


def test_the_build_says_whether_its_workers_repack(tmp_path: Path) -> None:
    """The patch set's 0005 (RPC workers repack) decides the plans' default; the pinned set
    decides today's."""
    commit = "c" * 40
    (tmp_path / commit).mkdir()
    (tmp_path / commit / "0001-other.patch").write_text(PATCH)
    assert not search.workers_repack(commit, tmp_path)
    (tmp_path / commit / "0005-rpc-worker-repack.patch").write_text(PATCH)
    assert search.workers_repack.__wrapped__(commit, tmp_path)
    pinned = any(p.name.endswith("-rpc-worker-repack.patch")
                 for p in patch_set(pins.LLAMA_CPP_COMMIT))  # fmt: skip
    assert search.workers_repack() == pinned


PATCH = "What it does\n\nSwitch: GGML_RPC_REPACK=0\nUpstream: none\n\n--- a/x\n+++ b/x\n"


def plan_json(capsys, *args: str) -> dict[str, object]:
    assert main([*args, "--json"]) == 0
    document: dict[str, object] = json.loads(capsys.readouterr().out)
    return document


ARMS = ("llama-3.1-405b-q4_0", "--instance-type", "c8g.16xlarge", "--count", "3")


def test_every_plan_row_carries_its_prompt_rate_and_time_to_first_token(capsys) -> None:
    document = plan_json(capsys, *ARMS)
    (row,) = document["options"]  # type: ignore[misc]
    assert row["promptTokens"] == perf.PROMPT_TOKENS
    assert row["workersRepack"] is search.workers_repack()
    assert row["predictedFirstTokenSeconds"] == pytest.approx(
        perf.PROMPT_TOKENS / row["predictedPromptTps"], rel=0.01
    )
    # Minutes on Arm's cluster: a 1,000-token prompt at a few tokens a second.
    assert 60 < row["predictedFirstTokenSeconds"] < 20 * 60
    assert "TTFT" in document["assumptions"]["prompt"]  # type: ignore[index]
    shorter = plan_json(capsys, *ARMS, "--prompt-tokens", "100")["options"][0]  # type: ignore[index]
    assert shorter["promptTokens"] == 100
    assert shorter["predictedFirstTokenSeconds"] < row["predictedFirstTokenSeconds"]
    assert main([*ARMS]) == 0
    table = capsys.readouterr().out
    header = next(line for line in table.splitlines() if "instance type" in line)
    assert "TTFT" in header and "assumptions:" in table and "prompt: TTFT" in table


def test_a_prompt_length_below_one_is_refused(capsys) -> None:
    assert main([*ARMS, "--prompt-tokens", "0"]) == 2
    assert "--prompt-tokens" in capsys.readouterr().err


def test_an_option_without_a_compute_rate_has_no_first_token() -> None:
    graviton3 = catalog.find("aws", "us-east-1", "c7g.16xlarge")
    assert graviton3 is not None
    option = search.evaluate(PRESETS["llama-3.1-8b-q4_0"], graviton3, 1, 4096)
    assert option.prompt is None
    custom = dataclasses.replace(PRESETS["llama-3.1-8b-q4_0"], parameters=None, source="custom")
    node = catalog.find("aws", "us-east-1", "c8g.4xlarge")
    assert node is not None
    assert search.evaluate(custom, node, 1, 4096).prompt is None
    assert math.isfinite(search.evaluate(PRESETS["llama-3.1-8b-q4_0"], node, 1, 4096)
                         .prompt.seconds)  # type: ignore[union-attr]  # fmt: skip


def test_a_tied_head_is_read_whole_by_the_node_that_computes_the_logits() -> None:
    """With the output head tied to the embeddings (Gemma), one node's logits multiply the whole
    embedding matrix each token, as the last worker's copy does in a split: the bytes a token
    streams are the same either way (the main node's own copy serves one row)."""
    tied = dataclasses.replace(PRESETS["llama-3.1-8b-q4_0"], tied_embeddings=True)
    alone = perf.one_node(tied, 4096)
    (share,) = alone.shares
    assert perf.computed_weight_bytes(tied, share) == share.weight_bytes
    room = [10 * tied.size_bytes] * 3
    split = placement.split(tied, 4096, 1, [0, 16, 16], room)
    streamed = sum(perf.computed_weight_bytes(tied, s) for s in split.shares)
    assert streamed == share.weight_bytes
    untied = PRESETS["llama-3.1-8b-q4_0"]
    (plain,) = perf.one_node(untied, 4096).shares
    assert perf.computed_weight_bytes(untied, plain) == plain.weight_bytes - untied.input_bytes
    assert perf.token_flops(tied) > perf.token_flops(untied)  # type: ignore[operator]


def test_cobalt_100_computes_at_the_neoverse_n2s_measured_rates() -> None:
    """Cobalt 100 is a Neoverse N2: #13886's runs give its rates, repacked and plain, at 64
    threads; a 64-vCPU Cobalt VM predicts the N2's own 128-token prompt back."""
    node = catalog.find("azure", "eastus", "Standard_D64ps_v6")
    assert node is not None and node.cpu_family == "cobalt100" and node.vcpus == perf.N2_THREADS
    assert "cobalt100" in perf.COMPUTE_BASIS and "#13886" in perf.COMPUTE_BASIS["cobalt100"]
    repacked, plain = (perf.compute_flops(node, k) for k in (perf.REPACKED, perf.PLAIN))
    assert (
        repacked
        and plain
        and repacked / plain
        == pytest.approx(
            perf._n2_flops(perf.REPACKED, perf.overlap())
            / perf._n2_flops(perf.PLAIN, perf.overlap())
        )
    )
    run = perf.BATCHED_RUNS[0]
    measured = perf.measured_node(PRESETS[run.model], decode_tps=run.decode_tps,
                                  prompt_tokens=run.prompt_tokens, prompt_tps=run.prompt_tps,
                                  kv_tokens=run.kv_tokens, label="n2")  # fmt: skip
    assert repacked == pytest.approx(measured.repacked_flops)
