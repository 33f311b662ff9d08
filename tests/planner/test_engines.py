"""The engines a plan compares for one stream: the layer split the stacks run, a draft model,
tensor parallelism, a pipeline and vLLM, each with its basis and why it is not offered; and the
NVIDIA Grace types, refused with the reason."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest

from infra import catalog
from infra.catalog import InstanceType
from infra.cli.plan import main
from infra.core import perf, placement, sizing
from infra.models import PRESETS
from infra.planner import engines
from tests.pulumi_mocks import refused

MODEL = PRESETS["llama-3.1-405b-q4_0"]
KV_TOKENS = 2048


def c8g(count: int = 3) -> list[InstanceType]:
    node = catalog.find("aws", "us-east-1", "c8g.16xlarge")
    assert node is not None
    return [node] * count


def layout(nodes: list[InstanceType]) -> placement.Placement:
    return placement.place(MODEL, 4096, 1, [sizing.usable_memory_bytes(n) for n in nodes])


def by_engine(lines: list[engines.EngineLine]) -> dict[str, engines.EngineLine]:
    return {line.engine.split(" on ")[0]: line for line in lines}


PLAIN_DRAFT = "llama.cpp layer split with a draft model, workers as upstream (GGML_RPC_REPACK=0)"
REPACKED_DRAFT = "llama.cpp layer split with a draft model, workers repack (patch 0005)"


def test_the_draft_line_is_the_best_draft_length_from_the_calibrated_step() -> None:
    """Arm's cluster: with upstream workers (plain kernels) a check of 9 tokens costs several
    decode steps, so the best draft is short and far below the old 5.69 tok/s; with workers that
    repack it pays more, at a longer draft."""
    nodes = c8g()
    lines = by_engine(engines.engine_lines(MODEL, nodes, layout(nodes), KV_TOKENS))
    split = lines["llama.cpp layer split over RPC"]
    plain, repacked = lines[PLAIN_DRAFT], lines[REPACKED_DRAFT]
    assert split.tps == perf.decode_tps(MODEL, nodes, layout(nodes), KV_TOKENS)
    assert split.tps is not None and plain.tps is not None and repacked.tps is not None
    pair = engines.LLAMA_8B_DRAFT
    central = sum(pair.per_token_range) / 2
    best = engines.best_draft(MODEL, nodes, layout(nodes), KV_TOKENS,
                              draft=PRESETS[pair.draft], acceptance=central)  # fmt: skip
    assert best is not None and plain.tps == pytest.approx(best.tps)
    assert best.draft_max <= 3 and split.tps < plain.tps < 2.6
    at_eight = engines.speculative(
        MODEL,
        nodes,
        layout(nodes),
        KV_TOKENS,
        draft=PRESETS[pair.draft],
        acceptance=central,
        draft_max=8,
    )
    assert at_eight is not None and at_eight.tps < best.tps and at_eight.tps < 2.0
    assert repacked.tps > plain.tps
    assert (
        f"drafts {best.draft_max} token" in plain.basis and "the best of draft 1-16" in plain.basis
    )
    high, low = plain.sources
    assert "58.7 % accepted" in high and "no published run has a 405B" in high
    assert "CPU only" in low and "ggml-org/llama.cpp#2926" in low
    assert pair.per_token_range == pytest.approx((0.76, 0.88), abs=0.005)


def test_the_accepted_run_stops_at_the_first_rejected_token() -> None:
    assert engines.accepted_run(0.0, 8) == 1  # the target's own token
    assert engines.accepted_run(1.0, 8) == 9
    assert engines.accepted_run(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    # 58.7 % of 8 drafted tokens accepted is 0.87 a token, not 0.587.
    per_token = engines.per_token_acceptance(0.587, 8)
    assert per_token == pytest.approx(0.88, abs=0.005)
    assert (engines.accepted_run(per_token, 8) - 1) / 8 == pytest.approx(0.587)
    assert engines.LLAMA_8B_DRAFT.per_token == pytest.approx(per_token)
    with pytest.raises(ValueError, match="chance"):
        engines.accepted_run(1.5, 8)


def test_a_speculative_step_is_its_tokens_over_the_draft_and_one_check() -> None:
    """Each step: ``draft_max`` draft tokens on the main node, one check of them and one more on
    the cluster (``perf.step`` of draft_max + 1 tokens), the accepted run out. Nothing accepted is
    slower than no draft at all."""
    nodes = c8g()
    draft = PRESETS["llama-3.1-8b-q4_0"]
    single = perf.decode_tps(MODEL, nodes, layout(nodes), KV_TOKENS)
    assert single is not None
    rates = [perf.node_rates(n) for n in nodes]
    found = {}
    for acceptance in (0.0, 0.5, 0.8, 1.0):
        step = engines.speculative(
            MODEL, nodes, layout(nodes), KV_TOKENS, draft=draft, acceptance=acceptance, draft_max=4
        )
        assert step is not None
        assert step.tokens_per_step == pytest.approx(engines.accepted_run(acceptance, 4))
        check = perf.step(MODEL, [r for r in rates if r], layout(nodes), KV_TOKENS, 5)
        assert check is not None and step.verify_seconds == pytest.approx(check.seconds)
        assert step.tps == pytest.approx(
            step.tokens_per_step / (step.draft_seconds + step.verify_seconds)
        )
        assert 1 / single < step.verify_seconds < 5 / single
        found[acceptance] = step.tps
    assert found[0.0] < single < found[0.8] < found[1.0]


def test_a_draft_that_never_pays_says_no_draft_slower() -> None:
    nodes = c8g()
    lines = by_engine(engines.engine_lines(MODEL, nodes, layout(nodes), KV_TOKENS, acceptance=0.1))
    line = lines[PLAIN_DRAFT]
    assert line.basis.startswith("no draft: slower") and line.draft_max == 0
    assert line.tps == perf.decode_tps(MODEL, nodes, layout(nodes), KV_TOKENS)
    assert line.sources == ()  # a given acceptance cites nothing


def test_tensor_parallel_reads_a_slice_of_each_layer_and_pays_for_its_exchanges() -> None:
    one, three = c8g(1), c8g(3)
    alone = engines.tensor_parallel_tps(MODEL, one, KV_TOKENS)
    split = engines.tensor_parallel_tps(MODEL, three, KV_TOKENS)
    assert alone is not None and split is not None
    # One node exchanges nothing: the layer split's speed on it, the hops aside.
    assert alone == pytest.approx(perf.decode_tps(MODEL, one, layout(one), KV_TOKENS))
    assert 2 * alone < split < 3 * alone  # the exchanges cost something
    slow = [dataclasses.replace(n, network_gbps=1.0) for n in three]
    slower = engines.tensor_parallel_tps(MODEL, slow, KV_TOKENS)
    assert slower is not None and slower < split
    widthless = dataclasses.replace(MODEL, embedding=None)
    assert engines.tensor_parallel_tps(widthless, three, KV_TOKENS) is None


def test_every_engine_not_offered_says_why_and_cites_its_sources() -> None:
    nodes = c8g()
    lines = engines.engine_lines(MODEL, nodes, layout(nodes), KV_TOKENS)
    assert [line.engine for line in lines] == [
        "llama.cpp layer split over RPC",
        PLAIN_DRAFT,
        REPACKED_DRAFT,
        "tensor parallel on 3 nodes",
        "pipeline (prima.cpp)",
        "vLLM on CPUs",
    ]
    # A draft model runs on a stack with draftModel; the rest are not offered, and say why.
    assert lines[1].offered and not lines[1].why_not
    for line in lines[3:]:
        assert not line.offered and line.why_not and line.sources, line
    assert "ggml-org/llama.cpp#26610" in lines[3].sources
    assert "vllm-project/vllm#46716" in lines[5].sources and lines[5].tps is None
    assert lines[4].tps == lines[0].tps  # a pipeline gives one stream nothing
    # A model with no draft of its vocabulary among the presets says so.
    small = PRESETS["qwen2.5-72b-q4_k_m"]
    small_layout = placement.place(small, 4096, 1, [sizing.usable_memory_bytes(nodes[0])])
    (_, draft, *_) = engines.engine_lines(small, nodes[:1], small_layout, KV_TOKENS)
    assert draft.tps is None
    assert "no draft model of qwen2.5-72b-q4_k_m's vocabulary" in draft.basis


def plan(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


ARMS = ("llama-3.1-405b-q4_0", "--instance-type", "c8g.16xlarge", "--count", "3")


def test_plan_engines_prints_every_engines_line_with_its_reasons(capsys) -> None:
    code, out, _ = plan(capsys, *ARMS, "--engines")
    assert code == 0
    shown = out.split("one stream under each engine (--engines):", 1)[1]
    assert "aws: 3 x c8g.16xlarge" in shown
    speed = r": \d\.\d\d tok/s \(runs here\)"
    for line in (
        r"layer split over RPC" + speed,
        r"with a draft model, workers as upstream \(GGML_RPC_REPACK=0\)" + speed,
        r"with a draft model, workers repack \(patch 0005\)" + speed,
    ):
        assert re.search(line, shown), line
    for engine in (
        "tensor parallel on 3 nodes: ",
        "pipeline (prima.cpp): ",
        "vLLM on CPUs: n/a",
    ):
        assert engine in shown, engine
    assert shown.count("why not: ") == 3 and shown.count("sources: ") == 5


def test_plan_engines_in_json_and_a_given_acceptance(capsys) -> None:
    code, out, _ = plan(capsys, *ARMS, "--engines", "--json")
    assert code == 0
    published: list[dict[str, Any]] = json.loads(out)["engines"]["aws"]
    assert {line["engine"] for line in published} >= {"vLLM on CPUs", "pipeline (prima.cpp)"}
    draft = next(line for line in published if line["engine"] == PLAIN_DRAFT)
    assert draft["predictedDecodeTps"] >= 1.9 and draft["offered"] and not draft["whyNot"]
    assert draft["draftMax"] == 2  # a short draft: the check costs several decode steps
    assert all(line["draftMax"] is None for line in published if "draft" not in line["engine"])
    code, out, _ = plan(capsys, *ARMS, "--engines", "--json", "--draft-acceptance", "0.6")
    given = next(
        line for line in json.loads(out)["engines"]["aws"] if line["engine"] == PLAIN_DRAFT
    )
    assert given["predictedDecodeTps"] < draft["predictedDecodeTps"]
    assert "60% a token (given)" in given["basis"] and given["sources"] == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--draft-acceptance", "0.5"), "--draft-acceptance: goes with --engines"),
        (("--engines", "--draft-acceptance", "1.5"), "0-1, not 1.5"),
    ],
)
def test_a_draft_acceptance_alone_or_out_of_range_is_refused(capsys, args, says) -> None:
    code, _, err = plan(capsys, *ARMS, *args)
    assert code != 0 and says in err


GRACE = [
    ("aws", "p6e-gb200.36xlarge"),
    ("gcp", "a4x-highgpu-4g"),
    ("azure", "Standard_ND128isr_GB200_v6"),
]


@pytest.mark.parametrize(("cloud", "name"), GRACE)
def test_grace_types_are_refused_by_the_config_and_the_planner(capsys, cloud, name) -> None:
    """They are Arm CPUs, sold only with their GPUs: refused naming the setting and why,
    before anything is created."""
    stack = {"aws": "aws-c8g", "gcp": "gcp-c4a", "azure": "azure-cobalt"}[cloud]
    message = refused(stack, {"llama-rpc-cluster:instanceType": name}, "instanceType")
    assert f"{name} is an NVIDIA Grace (GB200) type, sold as GPU capacity" in message
    assert "choose an Arm CPU type" in message
    code, _, err = plan(capsys, "llama-3.1-405b-q4_0", "--instance-type", name)
    assert code != 0 and "--instance-type" in err and "NVIDIA Grace (GB200)" in err
