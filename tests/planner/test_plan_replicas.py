"""The planner with a target of streams or tokens/s: replicas sized to meet it, priced as the
stack prices them (every group, one NAT, the balancer), the batched-decode model under them, and
the verdict between replicas and one bigger group. Prices are the fixture catalog's; expected
figures are computed from the catalog and the model's own parts, never pinned."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path

import pytest
import yaml

from infra import catalog
from infra.catalog import InstanceType
from infra.cli.plan import main
from infra.clouds import FACTS
from infra.core import costs, perf, sizing
from infra.core.limits import MAX_REPLICAS
from infra.models import PRESETS, Model
from infra.planner import base, report, search, target, verdict
from infra.planner.base import Target
from infra.planner.target import Shape
from infra.stack import config, files
from infra.stack.settings import DEFAULT_MAX_HOURLY_USD

EIGHT_B = PRESETS["llama-3.1-8b-q4_0"]
SEVENTY_B = PRESETS["llama-3.1-70b-q4_0"]
AWS = [("aws", "us-east-1")]
CONTEXT = 4096
URL = "https://models.example.com/llama-3.1-8b-q4_0.gguf"


def aws(name: str) -> InstanceType:
    found = catalog.find("aws", "us-east-1", name)
    assert found is not None
    return found


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def group(model: Model, instance: InstanceType, slots: int, count: int = 1) -> base.Option:
    option = search.evaluate(model, instance, count, CONTEXT, slots=slots)
    assert option.fits
    return option


# The batched-decode model


def test_one_stream_in_a_batch_is_the_single_stream_decode_speed() -> None:
    for name, model in PRESETS.items():
        for instance in (aws("r8g.16xlarge"), aws("c7g.16xlarge")):
            count = search.fewest_nodes(model, CONTEXT, 1, instance)
            if count is None:
                continue
            option = group(model, instance, 1, count)
            nodes = [instance] * count
            batch = perf.batch_step(model, nodes, option.placement, 2048, 1)
            assert batch is not None and option.decode_tps is not None, name
            assert batch.aggregate_tps == pytest.approx(option.decode_tps, rel=1e-9), name


def test_more_streams_raise_the_groups_rate_and_slow_each_stream() -> None:
    option = group(EIGHT_B, aws("r8g.4xlarge"), 64)
    nodes = [option.instance]
    batches = [perf.batch_step(EIGHT_B, nodes, option.placement, 2048, b) for b in range(1, 65)]
    rates = [b.aggregate_tps for b in batches if b is not None]
    speeds = [b.stream_tps for b in batches if b is not None]
    assert len(rates) == 64
    assert all(later >= earlier for earlier, later in itertools.pairwise(rates))
    assert all(later <= earlier for earlier, later in itertools.pairwise(speeds))
    # Memory-bound at first: a second stream adds its KV cache and its arithmetic, not another
    # read of the weights.
    assert rates[1] > 1.6 * rates[0] and batches[1] is not None
    assert batches[1].bound == "memory bandwidth"


def test_a_batch_never_computes_faster_than_the_published_prompt_rate() -> None:
    """The compute bound is the anchor's own prompt rate on the anchor's node: a full batch of
    short streams comes near it and never passes it."""
    anchor = perf.AXION_PROMPT
    model, instance = PRESETS[anchor.model], anchor.instance
    option = search.evaluate(model, instance, 1, 512, slots=64)
    assert option.fits
    batch = perf.batch_step(model, [instance], option.placement, 128, 64)
    assert batch is not None and batch.bound == "compute"
    assert 0.85 * anchor.prompt_tps < batch.aggregate_tps < anchor.prompt_tps
    # Its flops: 2 per parameter but the embeddings' and the output head's (a prompt's logits are
    # its last token's) per prompt token beyond the first, from the published table less one
    # read of the weights: a little above the prompt's average.
    flops = perf.compute_flops(instance)
    matrices = (model.input_bytes + model.output_bytes) / model.size_bytes
    per_token = 2 * (model.parameters or 0) * (1 - matrices)
    assert flops == pytest.approx(anchor.flops)
    assert anchor.prompt_tps * per_token < flops < 1.1 * anchor.prompt_tps * per_token


def test_compute_grows_with_cores_as_the_published_runs_did_not_linearly() -> None:
    small, large = aws("c8g.4xlarge"), aws("c8g.16xlarge")
    ratio = (perf.compute_flops(large) or 0) / (perf.compute_flops(small) or 1)
    published = perf.AXION_PROMPT.prompt_tps / perf.AXION_PROMPT.half_threads_prompt_tps
    assert ratio == pytest.approx(published**2)  # two doublings of the cores
    assert ratio < 4


def test_without_a_compute_rate_no_batching_gain_is_assumed_and_said() -> None:
    graviton3 = aws("c7g.16xlarge")
    option = group(EIGHT_B, graviton3, 8)
    batch = perf.batch_step(EIGHT_B, [graviton3], option.placement, 2048, 8)
    assert batch is not None and option.decode_tps is not None
    assert batch.aggregate_tps == pytest.approx(option.decode_tps)
    assert batch.bound.startswith(perf.NO_BATCHING_GAIN)
    assert "graviton3" in batch.bound
    custom = dataclasses.replace(EIGHT_B, parameters=None, source="custom")
    unknown = perf.batch_step(custom, [aws("c8g.4xlarge")], option.placement, 2048, 8)
    assert unknown is not None and "parameter count is unknown" in unknown.bound


def test_a_moes_streams_read_at_most_all_its_experts() -> None:
    moe = PRESETS["deepseek-r1-q4_k_m"]
    instance = aws("r8g.24xlarge")
    count = search.fewest_nodes(moe, CONTEXT, 64, instance)
    assert count is not None
    option = group(moe, instance, 64, count)
    nodes = [instance] * count
    one = perf.batch_step(moe, nodes, option.placement, 2048, 1)
    many = perf.batch_step(moe, nodes, option.placement, 2048, 64)
    assert one is not None and many is not None
    weights = sum(perf.computed_weight_bytes(moe, s) for s in option.placement.shares)
    active = weights * moe.weight_bytes_per_token / moe.size_bytes
    assert 64 * active > weights  # 64 streams could touch every expert: capped at all of them
    # The step never reads more than every weight plus 64 streams' KV cache.
    kv = sum(perf.kv_bytes_read(moe, s, 2048) for s in option.placement.shares)
    cal = perf.calibration()
    slowest = min(perf.node_bandwidth_gbps(n) or 0 for n in nodes) * 1e9 * cal.eta
    fixed = moe.layers * cal.layer_overhead_seconds + (count - 1) * cal.hop_seconds
    rates = [perf.node_rates(n) for n in nodes]
    found = perf.step(moe, [r for r in rates if r], option.placement, 2048, 64, sequences=64)
    assert found is not None and found.seconds == pytest.approx(many.step_seconds)
    assert found.memory_seconds <= (weights + 64 * kv) / slowest
    assert many.step_seconds <= found.memory_seconds + found.compute_seconds + fixed


# Sizing replicas for a target


def test_replicas_grow_with_streams_for_a_fixed_group() -> None:
    instance, slots = aws("c8g.4xlarge"), 4
    counts = []
    for streams in range(1, 41):
        plan = target.sized(EIGHT_B, CONTEXT, instance, Target(streams=streams), Shape(slots=4))
        best = plan.options[0]
        assert best.slots == slots and best.replicas == math.ceil(streams / slots)
        assert best.load is not None and best.load.streams == streams
        counts.append(best.replicas)
    assert counts == sorted(counts) and counts[-1] == MAX_REPLICAS


def test_replicas_grow_with_streams_at_a_speed_per_stream() -> None:
    """With each stream held to a speed, more streams take more replicas of the best type."""
    needed = []
    for streams in (4, 8, 16, 32, 64):
        plan = target.plan(EIGHT_B, CONTEXT, AWS, Target(streams=streams, min_stream_tps=10))
        for option in plan.options:
            assert option.load is not None and option.load.stream_tps >= 10
            assert option.replicas * option.slots >= streams
        needed.append(min(o.nodes for o in plan.options if o.instance.name == "c8g.4xlarge"))
    assert needed == sorted(needed) and needed[-1] > needed[0]


@pytest.mark.parametrize("rate", [50.0, 400.0, 1500.0])
def test_an_aggregate_target_is_met_by_the_fewest_replicas(rate: float) -> None:
    goal = Target(aggregate_tps=rate)
    plan = target.plan(EIGHT_B, CONTEXT, AWS, goal)
    assert plan.options and plan.sort == "usd-per-hour"
    for option in plan.options:
        assert option.load is not None and option.tps is not None
        assert option.tps >= rate
        assert option.load.streams == option.replicas * option.slots  # every slot busy
        if option.replicas > 1:  # one group fewer would fall short
            fewer = search.with_replicas(
                group(EIGHT_B, option.instance, option.slots, option.count),
                EIGHT_B,
                CONTEXT,
                option.replicas - 1,
                (option.slots,) * (option.replicas - 1),
            )
            assert fewer.tps is not None and fewer.tps < rate


def test_the_set_is_priced_as_every_group_one_nat_and_the_balancer() -> None:
    one = group(EIGHT_B, aws("c8g.4xlarge"), 4)
    for replicas in (1, 2, 5, MAX_REPLICAS):
        option = search.with_replicas(one, EIGHT_B, CONTEXT, replicas, (4,) * replicas)
        cost, alone = option.cost, one.cost
        assert cost.instances == pytest.approx(replicas * (alone.instances or 0), abs=1e-4)
        assert cost.disks == pytest.approx(replicas * (alone.disks or 0), abs=1e-4)
        # AWS's NAT is charged per gateway: the set shares one.
        assert cost.nat == pytest.approx(alone.nat or 0)
        # The balancer node: a c8g.large and its 30 GB system disk at gp3's baseline.
        balancer = costs.balancer_cost("aws", "us-east-1").usd
        assert balancer is not None and balancer == pytest.approx(
            0.07976 + 30 * 0.08 / costs.HOURS_PER_MONTH, abs=1e-5
        )
        expected = replicas * (alone.total or 0) - (replicas - 1) * (alone.nat or 0)
        expected += balancer if replicas > 1 else 0.0
        assert option.hourly_usd == pytest.approx(expected, abs=1e-4)
        assert option.balancer_usd == (balancer if replicas > 1 else None)
        assert option.group_cost.total == alone.total
        assert option.spot_instances_usd is None  # the fixture has no c8g.4xlarge spot price
        assert option.usd_per_million_tokens == pytest.approx(
            (option.hourly_usd or 0) / ((option.tps or 1) * 3600) * 1e6, abs=0.01
        )


def test_a_sets_price_is_the_price_its_stack_reports() -> None:
    """The stack written for a set prices itself (``hourlyCostUsd``) as the planner did."""
    plan = target.plan(SEVENTY_B, CONTEXT, AWS, Target(aggregate_tps=80))
    for option in plan.options[:5]:
        settings = target_settings(option, plan)
        cfg = config.from_settings(settings, region=option.instance.region)
        assert cfg.replicas == option.replicas and cfg.slots == option.slots
        assert cfg.hourly_cost.total == pytest.approx(option.hourly_usd)


def target_settings(option: base.Option, plan: base.Plan) -> dict[str, object]:
    return report.stack_settings(option, plan, [URL], [])


def test_an_unpriced_balancer_marks_the_total_partial_never_guessed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = catalog.find

    def without_balancer(provider: str, region: str, name: str) -> catalog.InstanceType | None:
        return (
            None if name == FACTS[provider].balancer_instance_type else real(provider, region, name)
        )

    monkeypatch.setattr(catalog, "find", without_balancer)
    one = group(EIGHT_B, aws("c8g.4xlarge"), 4)
    two = search.with_replicas(one, EIGHT_B, CONTEXT, 2, (4, 4))
    assert one.cost.unpriced == () and not one.price_is_partial
    assert two.price_is_partial and two.cost.balancer is None
    assert two.cost.unpriced == (costs.BALANCER_NODE,)
    expected = 2 * (one.cost.instances or 0) + 2 * (one.cost.disks or 0) + (one.cost.nat or 0)
    assert two.hourly_usd == pytest.approx(expected, abs=1e-4)


# Replicas or one bigger group


def verdict_agrees_with_its_figures(found: verdict.Verdict) -> None:
    replicas, one = found.replicas, found.one_group
    assert replicas is not None and one is not None
    assert replicas.replicas > 1 and one.replicas == 1
    for option in (replicas, one):
        assert option.load is not None

    def cheaper(of_replicas: float | None, of_one: float | None) -> str:
        assert of_replicas is not None and of_one is not None
        if math.isclose(of_replicas, of_one):
            return verdict.SAME
        return verdict.REPLICAS if of_replicas < of_one else verdict.ONE_GROUP

    hour = cheaper(replicas.hourly_usd, one.hourly_usd)
    mtok = cheaper(replicas.usd_per_million_tokens, one.usd_per_million_tokens)
    assert (found.per_hour, found.per_mtok) == (hour, mtok)


def test_one_group_wins_when_its_slots_share_the_weights() -> None:
    """Sixteen streams with no speed asked of them: one node's sixteen slots against two nodes
    of eight, on the same type, and across every AWS type."""
    fixed = target.sized(EIGHT_B, CONTEXT, aws("c8g.4xlarge"), Target(streams=16), Shape())
    found = verdict.verdict(fixed, "aws")
    assert found is not None
    verdict_agrees_with_its_figures(found)
    assert found.per_hour == verdict.ONE_GROUP
    assert found.one_group is not None and found.one_group.nodes == 1
    assert "share each read of the weights" in found.why and "balancer" in found.why
    searched = verdict.verdict(target.plan(EIGHT_B, CONTEXT, AWS, Target(streams=16)), "aws")
    assert searched is not None
    verdict_agrees_with_its_figures(searched)
    assert (searched.per_hour, searched.per_mtok) == (verdict.ONE_GROUP, verdict.ONE_GROUP)


def test_replicas_win_when_one_group_would_need_a_bigger_type() -> None:
    """Thirty-two streams at 12 tok/s each: one group needs a node whose compute serves them
    all, and compute grows slower than the cores within a node; small replicas do it for less."""
    goal = Target(streams=32, min_stream_tps=12)
    found = verdict.verdict(target.plan(EIGHT_B, CONTEXT, AWS, goal), "aws")
    assert found is not None
    verdict_agrees_with_its_figures(found)
    assert (found.per_hour, found.per_mtok) == (verdict.REPLICAS, verdict.REPLICAS)
    assert found.replicas is not None and found.one_group is not None
    assert found.one_group.instance.vcpus > found.replicas.instance.vcpus
    assert "side by side" in found.why


def test_a_split_verdict_says_which_wins_per_token() -> None:
    """Per hour and per token can disagree (a set with room to spare costs more per hour and
    less per token): the verdict names both, and why."""
    split = []
    rates = [Target(aggregate_tps=rate) for rate in (20.0, 40.0, 60.0, 80.0, 150.0, 300.0)]
    chats = [Target(streams=streams, min_stream_tps=12) for streams in (16, 24)]
    asked = [*itertools.product((EIGHT_B, SEVENTY_B), rates), *((EIGHT_B, c) for c in chats)]
    for model, goal in asked:
        found = verdict.verdict(target.plan(model, CONTEXT, AWS, goal), "aws")
        assert found is not None
        if found.replicas is None or found.one_group is None:
            continue
        verdict_agrees_with_its_figures(found)
        if found.per_hour != found.per_mtok:
            split.append(found)
            assert "per token the other way" in found.why
            assert found.per_mtok in found.why
    assert split


def test_when_no_single_group_is_fast_enough_replicas_win_and_say_why() -> None:
    goal = Target(aggregate_tps=60)
    plan = target.sized(SEVENTY_B, CONTEXT, aws("c8g.8xlarge"), goal, Shape())
    found = verdict.verdict(plan, "aws")
    assert found is not None and found.one_group is None and found.replicas is not None
    assert (found.per_hour, found.per_mtok) == (verdict.REPLICAS, verdict.REPLICAS)
    assert "one after another" in found.why


# The command line


def test_streams_json_has_the_sets_keys_and_the_verdict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "llama-3.1-8b-q4_0", "--cloud", "aws", "--streams", "24",
                       "--json")  # fmt: skip
    assert code == 0
    document = json.loads(out)
    assert document["target"] == {"streams": 24, "aggregateTps": None, "minStreamTps": None}
    assert document["sort"] == "usd-per-mtok"
    for option in document["options"]:
        assert option["replicas"] * option["slots"] >= 24
        assert option["nodes"] == option["replicas"] * option["count"]
        assert option["streams"] == 24 and sum(option["streamsPerGroup"]) == 24
        assert len(option["streamsPerGroup"]) == option["replicas"]
        assert option["aggregateTps"] >= option["streamTps"] > 0
        assert option["batchBound"] in ("memory bandwidth", "compute") or option[
            "batchBound"
        ].startswith(perf.NO_BATCHING_GAIN)
        parts = option["hourlyUsdParts"]
        assert set(parts) == {"instances", "nat", "disks", "balancer", "controlPlane"}
        assert (parts["balancer"] is not None) == (option["replicas"] > 1)
        assert parts["controlPlane"] is None and option["platform"] == "vm"
        assert option["groupHourlyUsd"] <= option["hourlyUsd"]
        assert option["usdPerMillionTokens"] == pytest.approx(
            option["hourlyUsd"] / (option["aggregateTps"] * 3600) * 1e6, abs=0.011
        )
    verdict = document["replicasVerdict"]["aws"]
    assert set(verdict) == {"replicas", "oneGroup", "cheaperPerHour", "cheaperPerMtok", "why"}
    assert verdict["replicas"]["replicas"] > 1 and verdict["oneGroup"]["replicas"] == 1
    assert "throughput" in document["assumptions"] and "target" in document["assumptions"]


def test_without_a_target_the_json_keeps_one_group(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "llama-3.1-8b-q4_0", "--cloud", "aws", "--json")
    assert code == 0
    document = json.loads(out)
    assert document["target"] is None and document["replicasVerdict"] == {}
    for option in document["options"]:
        assert option["replicas"] == 1 and option["aggregateTps"] is None
        assert option["hourlyUsdParts"]["balancer"] is None


def test_the_table_shows_groups_slots_and_the_verdict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "llama-3.1-8b-q4_0", "--cloud", "aws", "--aggregate-tps", "400")
    assert code == 0
    assert "for 400 tok/s in all; sorted by $ per hour" in out
    assert "groups x nodes  slots" in out
    assert "replicas or one bigger group" in out and "Cheaper per hour:" in out
    assert "  aws: replicas: " in out and "Why: " in out


def test_write_stack_writes_the_replicas_and_slots_the_target_took(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = run(capsys, "llama-3.1-8b-q4_0", "--cloud", "aws", "--streams", "32",
                         "--min-tps", "15", "--json", "--write-stack", "busy", "--model-url", URL,
                         "--stacks-dir", str(tmp_path))  # fmt: skip
    assert code == 0, err
    pick = json.loads(out)["options"][0]
    assert pick["replicas"] > 1
    written = yaml.safe_load((tmp_path / "Pulumi.busy.yaml").read_text())["config"]
    assert written["llama-rpc-cluster:replicas"] == pick["replicas"]
    assert written["llama-rpc-cluster:slots"] == pick["slots"]
    assert written["llama-rpc-cluster:instanceType"] == pick["instanceType"]
    assert written["llama-rpc-cluster:workerCount"] == pick["workers"]
    header = (tmp_path / "Pulumi.busy.yaml").read_text().splitlines()[0]
    assert f"{pick['replicas']} groups of" in header and "behind a private balancer" in header
    # Without a target the key is left out: the stack's default, one group.
    code, _, err = run(capsys, "llama-3.1-8b-q4_0", "--cloud", "aws", "--write-stack", "plain",
                       "--model-url", URL, "--stacks-dir", str(tmp_path))  # fmt: skip
    assert code == 0, err
    plain = yaml.safe_load((tmp_path / "Pulumi.plain.yaml").read_text())["config"]
    assert "llama-rpc-cluster:replicas" not in plain


def test_a_fixed_group_takes_replicas_of_itself(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "llama-3.1-8b-q4_0", "--instance-type", "c8g.4xlarge", "--count",
                       "1", "--slots", "4", "--streams", "10", "--json")  # fmt: skip
    assert code == 0
    option = json.loads(out)["options"][0]
    assert (option["replicas"], option["count"], option["slots"]) == (3, 1, 4)
    assert option["streamsPerGroup"] == [4, 3, 3]


def test_a_stack_is_sized_in_replicas_of_its_own_group(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """aws-small's model is described by size only: no parameter count, so no batching gain is
    assumed, and its one slot per group makes replicas equal streams."""
    code, out, _ = run(capsys, "--stack", "aws-small", "--streams", "3", "--json")
    assert code == 0
    option = json.loads(out)["options"][0]
    assert (option["replicas"], option["slots"], option["count"]) == (3, 1, 3)
    assert option["batchBound"].startswith(perf.NO_BATCHING_GAIN)


@pytest.mark.parametrize(
    ("args", "flag", "message"),
    [
        (["--streams", "0"], "--streams", "must be at least 1"),
        (["--streams", "-4"], "--streams", "must be at least 1"),
        (["--aggregate-tps", "0"], "--aggregate-tps", "must be a positive number"),
        (["--aggregate-tps", "-10"], "--aggregate-tps", "must be a positive number"),
        (["--aggregate-tps", "nan"], "--aggregate-tps", "must be a positive number"),
        (["--streams", "4", "--aggregate-tps", "10"], "--streams", "not both"),
        (["--streams", "4", "--min-tps", "0"], "--min-tps", "must be positive"),
        (["--streams", "4", "--count", "2"], "--count", "goes with --instance-type"),
    ],
)
def test_a_target_flag_that_cannot_work_is_an_error_naming_it(
    capsys: pytest.CaptureFixture[str], args: list[str], flag: str, message: str
) -> None:
    code, _, err = run(capsys, "llama-3.1-8b-q4_0", *args)
    assert code == 2 and f"{flag}: " in err and message in err


def test_a_stack_refuses_a_slots_flag_with_a_target(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "--stack", "aws-small", "--streams", "4", "--slots", "2")
    assert code == 2 and "--stack: " in err and "--slots" in err


@pytest.mark.parametrize(
    ("args", "flag", "nearest"),
    [
        (["llama-3.1-8b-q4_0", "--streams", str(MAX_REPLICAS * sizing.MAX_SLOTS + 1)],
         "--streams", "more than 10 replicas of 64 slots"),
        (["llama-3.1-405b-q4_0", "--aggregate-tps", "5000"], "--aggregate-tps", "Nearest: "),
        (["llama-3.1-8b-q4_0", "--instance-type", "c8g.2xlarge", "--count", "1", "--slots", "1",
          "--aggregate-tps", "1000"], "--aggregate-tps", "reach"),
        (["llama-3.1-8b-q4_0", "--instance-type", "c8g.large", "--count", "1",
          "--aggregate-tps", "10"], "--aggregate-tps", "1 x c8g.large does not hold"),
        (["--stack", "aws-small", "--aggregate-tps", "100000"], "--aggregate-tps",
         "replicas of 3 x c8g.large"),
        (["llama-3.1-70b-q4_0", "--cloud", "aws", "--streams", "8", "--min-tps", "500"],
         "--streams", "each stream gets"),
    ],
)  # fmt: skip
def test_a_target_nothing_meets_names_the_flag_and_exits_1(
    capsys: pytest.CaptureFixture[str], args: list[str], flag: str, nearest: str
) -> None:
    code, out, err = run(capsys, *args)
    assert code == 1 and out == ""
    assert err.startswith(f"error: {flag}: ") and nearest in err
    assert str(MAX_REPLICAS) in err


def test_a_stack_with_replicas_is_priced_and_measured_as_a_whole(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--stack`` on a stack of three groups: the price the program gives the stack, and every
    slot of every group busy."""
    values = yaml.safe_load((files.REPO / "stacks" / "Pulumi.aws-c8g.yaml").read_text())["config"]
    values |= {"llama-rpc-cluster:replicas": 3, "llama-rpc-cluster:slots": 2}
    cfg = files.config_of(values)
    monkeypatch.setattr(files, "stack_config", lambda name: cfg)
    code, out, _ = run(capsys, "--stack", "anything", "--json")
    assert code == 0
    option = json.loads(out)["options"][0]
    assert option["replicas"] == 3 and option["slots"] == 2
    assert option["hourlyUsd"] == pytest.approx(cfg.hourly_cost.total)
    assert option["streamsPerGroup"] == [2, 2, 2]
    assert option["hourlyUsdParts"]["balancer"] is not None


def test_with_fixed_slots_one_group_is_still_weighed_against_replicas() -> None:
    """--slots 8 and three streams: one group meets it; the verdict still prices two."""
    plan = target.sized(EIGHT_B, CONTEXT, aws("c8g.4xlarge"), Target(streams=3), Shape(slots=8))
    found = verdict.verdict(plan, "aws")
    assert found is not None and found.replicas is not None and found.one_group is not None
    assert found.replicas.replicas == 2 and found.replicas.load is not None
    assert [g.streams for g in found.replicas.load.groups] == [2, 1]
    verdict_agrees_with_its_figures(found)
    assert found.per_hour == verdict.ONE_GROUP


def test_a_set_that_costs_more_than_the_default_ceiling_carries_its_own() -> None:
    """A stack costs at most maxHourlyUsd ($100/h by default); a set the planner sized past it
    was chosen for its price, so the stack it writes raises the ceiling to just above it."""
    plan = target.plan(SEVENTY_B, CONTEXT, AWS, Target(aggregate_tps=80))
    option = plan.options[0]
    assert (option.hourly_usd or 0) < DEFAULT_MAX_HOURLY_USD
    assert "maxHourlyUsd" not in target_settings(option, plan)
    dear = dataclasses.replace(option, cost=dataclasses.replace(option.cost, instances=150.0))
    assert dear.hourly_usd is not None and dear.hourly_usd > DEFAULT_MAX_HOURLY_USD
    settings = target_settings(dear, plan)
    assert settings["maxHourlyUsd"] == math.ceil(dear.hourly_usd) + 1
    config.from_settings(settings, region=option.instance.region)  # accepted
