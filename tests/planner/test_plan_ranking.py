"""The planner compares providers fairly: a speed from cited anchors for every provider that has
one, like-for-like cost, the ranking the user asks for, and clear answers when a cluster cannot
work."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from pathlib import Path

import pytest

from infra import catalog
from infra.cli.plan import main
from infra.core import costs, perf
from infra.models import PRESETS
from infra.planner import base, chart, report, search
from infra.stack import config, files
from tests import pulumi_mocks

PRODUCT_CATALOG = Path(catalog.__file__).parent
ASSERTED = [a for a in perf.CHECKS if a.role == "asserted"]  # the fitted two are exact
REPORTED = [a for a in perf.CHECKS if a.role == "reported"]
WHERE_AWS = [("aws", "us-east-1")]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def prediction(anchor: perf.Anchor) -> float:
    model = PRESETS[anchor.model]
    option = search.evaluate(model, anchor.instance, anchor.nodes, 2 * anchor.kv_tokens)
    assert option.fits and option.decode_tps is not None
    return option.decode_tps


# --- speed: anchors, and Axion's derived bandwidth ---


@pytest.mark.parametrize("anchor", ASSERTED, ids=lambda a: a.label)
def test_every_asserted_anchor_is_predicted_within_15_percent(anchor: perf.Anchor) -> None:
    assert anchor.source
    assert prediction(anchor) == pytest.approx(anchor.decode_tps, rel=perf.CHECK_TOLERANCE)


@pytest.mark.parametrize("anchor", REPORTED, ids=lambda a: a.label)
def test_a_reported_anchor_says_why_it_is_not_asserted(anchor: perf.Anchor) -> None:
    assert anchor.note and anchor.source
    print(f"{anchor.label}: predicted {prediction(anchor):.1f}, published {anchor.decode_tps}")


def test_the_anchors_cover_graviton_and_axion_with_two_quantisations() -> None:
    families = {(a.instance.cpu_family, a.model) for a in ASSERTED}
    assert {("graviton4", "afm-4.5b-q4_0"), ("graviton4", "afm-4.5b-q8_0")} <= families
    assert ("axion", "afm-4.5b-q8_0") in families  # Q4_0 sets Axion's bandwidth; Q8_0 checks it
    assert perf.AXION_ANCHOR.role == "derives" and perf.AXION_ANCHOR.model == "afm-4.5b-q4_0"
    for anchor in perf.ANCHORS:  # the fitted two, exact by construction
        assert prediction(anchor) == pytest.approx(anchor.decode_tps, rel=1e-6)


def test_axions_bandwidth_in_the_catalog_is_the_one_its_anchor_gives() -> None:
    for path in (PRODUCT_CATALOG, Path(catalog.directory())):
        axion = catalog.cpu_families(path / catalog.CPUS_NAME)["axion"]
        assert axion.cores_per_socket is not None and axion.socket_memory_bandwidth_gbps
        derived = perf.derived_socket_bandwidth_gbps(perf.AXION_ANCHOR, axion.cores_per_socket)
        assert axion.socket_memory_bandwidth_gbps == pytest.approx(derived, rel=0.005), path
        assert "AFM-4.5B" in axion.source and "derived" in axion.source


def test_a_faster_axion_anchor_gives_axion_more_bandwidth() -> None:
    faster = dataclasses.replace(perf.AXION_ANCHOR, decode_tps=perf.AXION_ANCHOR.decode_tps * 1.1)
    assert perf.derived_socket_bandwidth_gbps(
        faster, 72
    ) > 1.1 * perf.derived_socket_bandwidth_gbps(perf.AXION_ANCHOR, 72)


def test_every_row_has_a_speed_and_an_unpriced_one_no_cost_per_token() -> None:
    """Every family's bandwidth is known (Cobalt 100's a measured figure); this catalog prices
    no Azure row, which then has a speed but no $/Mtok."""
    plan = search.plan(PRESETS["llama-3.1-405b-q4_0"])
    providers = {o.provider for o in plan.options}
    assert providers == {"aws", "gcp", "azure"}
    for option in plan.options:
        assert option.decode_tps and option.speed_unknown_reason() is None, option.name
        if option.provider == "azure":
            assert option.hourly_usd is None and option.usd_per_million_tokens is None
        else:
            assert option.usd_per_million_tokens, option.name


# --- ranking ---


def test_the_default_ranking_is_cost_per_token_and_each_pick_follows_the_sort() -> None:
    plan = search.plan(PRESETS["deepseek-r1-q4_k_m"], where=WHERE_AWS)
    assert plan.sort == "usd-per-mtok"
    per_mtok = [o.usd_per_million_tokens for o in plan.options]
    assert all(v is not None for v in per_mtok) and per_mtok == sorted(per_mtok)  # type: ignore[type-var]
    by_hour = plan.sorted_by("usd-per-hour")
    by_speed = plan.sorted_by("tps")
    cheapest_hour = min(o.hourly_usd or 0 for o in plan.options)
    assert by_hour.recommendation("aws").hourly_usd == cheapest_hour  # type: ignore[union-attr]
    fastest = max(o.decode_tps or 0 for o in plan.options)
    assert by_speed.recommendation("aws").decode_tps == fastest  # type: ignore[union-attr]
    # The case: the cheapest per hour is not the cheapest per token.
    per_hour_pick = by_hour.recommendation("aws")
    per_token_pick = plan.recommendation("aws")
    assert per_hour_pick and per_token_pick and per_hour_pick is not per_token_pick
    assert per_token_pick.usd_per_million_tokens < per_hour_pick.usd_per_million_tokens  # type: ignore[operator]


def _priced(option: base.Option, hourly: float | None, unpriced: tuple[str, ...]) -> base.Option:
    cost = costs.HourlyCost(hourly, None, None, unpriced, (), ())
    return dataclasses.replace(option, cost=cost)


def test_partial_and_unknown_prices_never_rank_above_a_full_price() -> None:
    model = PRESETS["llama-3.1-70b-q4_0"]
    one = search.evaluate(model, catalog.find("aws", "us-east-1", "r8g.4xlarge"), 1, 4096)  # type: ignore[arg-type]
    full = _priced(one, 2.0, ())
    partial = _priced(one, 0.5, ("disks",))  # cheaper, but leaves out its disks
    unknown = _priced(one, None, ("instances",))
    no_speed = dataclasses.replace(_priced(one, 0.1, ()), decode_tps=None)
    plan = base.Plan(model, 4096, 1, [unknown, no_speed, partial, full])
    assert plan.sorted_by("usd-per-mtok").options == [full, partial, no_speed, unknown]
    assert plan.sorted_by("usd-per-hour").options == [no_speed, full, partial, unknown]
    assert plan.sorted_by("tps").options[-1] is no_speed
    table = report.table(plan.sorted_by("usd-per-mtok"))
    row = next(line for line in table.splitlines() if "$0.50+" in line)
    assert "+ disks: price unknown" in row
    assert "unranked: no $/Mtok" in next(line for line in table.splitlines() if "$0.10" in line)
    assert "price unknown" in next(line for line in table.splitlines() if "unknown  " in line)


def test_gcp_rows_that_leave_out_disks_are_marked_in_table_json_and_chart(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "llama-3.1-405b-q4_0", "--cloud", "gcp", "--json")
    assert code == 0
    for option in json.loads(out)["options"]:
        assert option["pricePartial"] and option["unpriced"]
    plan = search.plan(PRESETS["llama-3.1-405b-q4_0"])
    picks, panels = chart.panels(plan)
    assert [o.provider for o in picks] == ["aws", "azure", "gcp"]  # every provider, known or not
    by_provider = {o.provider: i for i, o in enumerate(picks)}
    cost, per_mtok, speed = panels
    assert cost.marks[by_provider["gcp"]] == "+" and cost.marks[by_provider["aws"]] == ""
    assert per_mtok.values[by_provider["azure"]] is None  # unpriced here
    assert speed.values[by_provider["azure"]] is not None
    assert per_mtok.values[by_provider["gcp"]] is not None
    assert "unknown" in chart.LEGEND
    assert [o.shape for o in picks][by_provider["aws"]] == "1 x r8g.12xlarge"


# --- the command line ---


def test_min_tps_summary_and_written_stack_name_a_shown_cluster(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = run(capsys, "llama-3.1-405b-q4_0", "--cloud", "aws", "--min-tps", "1.5",
                       "--write-stack", "fast", "--model-url", "https://example.invalid/m.gguf",
                       "--stacks-dir", str(tmp_path))  # fmt: skip
    assert code == 0
    summary = re.search(r"^\* aws: (\d+) x (\S+),", out, re.MULTILINE)
    assert summary
    count, name = int(summary[1]), summary[2]
    rows = [line for line in out.splitlines() if line.startswith(("* aws", "  aws"))]
    assert any(f" {name} " in row and row.startswith("*") for row in rows)
    shown = search.evaluate(PRESETS["llama-3.1-405b-q4_0"],
                            catalog.find("aws", "us-east-1", name), count, 4096)  # type: ignore[arg-type]  # fmt: skip
    assert shown.decode_tps and shown.decode_tps >= 1.5
    written = (tmp_path / "Pulumi.fast.yaml").read_text()
    assert f"instanceType: {name}" in written and f"workerCount: {count - 1}" in written


def test_nothing_at_min_tps_says_what_is_fastest_and_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(capsys, "llama-3.1-405b-q4_0", "--cloud", "gcp", "--min-tps", "50")
    assert code == 1
    assert "9 cluster(s) hold the model, none predicted at 50 tok/s; the fastest is" in err
    code, out, err = run(capsys, "llama-3.1-405b-q4_0", "--instance-type", "c8g.16xlarge",
                         "--count", "1", "--min-tps", "100", "--json")  # fmt: skip
    assert code == 1 and json.loads(out)["options"] == []
    assert "no cluster in the catalog holds this model" in err and "(--count 2)" in err


def test_instance_type_alone_gets_the_fewest_nodes_that_hold_the_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "llama-3.1-405b-q4_0", "--instance-type", "c8g.16xlarge", "--json")
    assert code == 0
    [option] = json.loads(out)["options"]
    expected = search.fewest_nodes(PRESETS["llama-3.1-405b-q4_0"], 4096, 1,
                                   catalog.find("aws", "us-east-1", "c8g.16xlarge"))  # type: ignore[arg-type]  # fmt: skip
    assert option["count"] == expected and option["fits"]


def test_a_cluster_that_does_not_fit_says_why_and_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ("llama-3.1-405b-q4_0", "--instance-type", "c8g.16xlarge", "--count", "1")
    code, out, err = run(capsys, *args)
    assert code == 1
    [row] = [line for line in out.splitlines() if "DOES NOT FIT" in line]
    assert re.search(r"\$2\.\d\d +n/a +n/a +n/a ", row), row  # no speed, $/Mtok or serve time
    # Nothing that cannot hold the model is anyone's pick, or said to fit.
    assert not row.startswith("*") and "* aws:" not in out and "fits on one" not in out
    assert re.search(r"needs [\d.]+ GiB and has [\d.]+ GiB usable; 2 nodes .* \(--count 2\)", err)
    code, out, _ = run(capsys, *args, "--json")
    assert code == 1 and json.loads(out)["picks"] == {}


def test_a_type_too_small_for_any_cluster_is_an_error_naming_the_option(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(capsys, "llama-3.1-405b-q4_0", "--instance-type", "c8g.large")
    assert code == 2
    assert "error: --instance-type: c8g.large: too small" in err
    code, _, err = run(capsys, "llama-3.1-405b-q4_0", "--instance-type", "r8g.8xlarg")
    assert code == 2 and "did you mean r8g.8xlarge" in err


def test_stack_evaluates_the_cluster_its_file_deploys(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--stack", "aws-r8g", "--json")
    assert code == 0
    [option] = json.loads(out)["options"]
    cfg = files.stack_config("aws-r8g")
    assert (option["instanceType"], option["mainInstanceType"], option["count"]) == (
        cfg.instance_type.name,
        cfg.main_instance_type.name,
        cfg.worker_count + 1,
    )
    assert option["mainInstanceType"] != option["instanceType"]
    assert [p["layers"] for p in option["placement"]] == [s.layers for s in cfg.placement.shares]
    assert option["hourlyUsd"] == cfg.hourly_cost.total
    document = json.loads(out)
    assert document["context"] == cfg.context_size
    assert document["model"]["name"] == cfg.model.name


def test_a_mixed_cluster_reads_as_what_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--stack", "aws-r8g")
    assert code == 0
    assert "* aws: 1 x r8g.4xlarge + 2 x r8g.8xlarge, a main node and 2 RPC workers; $" in out
    assert "lowest" not in out.split("* aws:")[1].splitlines()[0]  # one cluster won nothing


def test_axion_rows_beyond_the_anchors_size_say_they_are_extrapolated() -> None:
    plan = search.plan(PRESETS["llama-3.1-405b-q4_0"], where=[("gcp", "us-central1")])
    for option in plan.options:
        note = perf.extrapolation_note(option.instance)
        assert (note is not None) == (option.instance.vcpus > 16)
        if note:
            assert note in report.table(plan)
    aws = catalog.find("aws", "us-east-1", "r8g.8xlarge")
    assert aws is not None and perf.extrapolation_note(aws) is None


def test_unknown_speeds_under_the_speed_sort_follow_by_price(monkeypatch) -> None:
    families = catalog.cpu_families()
    axion = dataclasses.replace(families["axion"], socket_memory_bandwidth_gbps=None)
    monkeypatch.setattr(catalog, "cpu_families", lambda path=None: {**families, "axion": axion})
    plan = search.plan(PRESETS["llama-3.1-70b-q4_0"]).sorted_by("tps")
    unknown = [o for o in plan.options if o.decode_tps is None]
    assert unknown and plan.options[-len(unknown) :] == unknown
    prices = [o.hourly_usd for o in unknown if o.hourly_usd is not None]
    assert prices == sorted(prices)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--stack", "nope"], "error: --stack: stack 'nope': no stacks/Pulumi.nope.yaml"),
        (["--stack", "aws-r8g", "--context", "2048"], "what --context would; leave it out"),
        (
            ["--stack", "aws-r8g", "--write-stack", "x", "--model-url", "https://e.invalid/m"],
            "error: --write-stack: --stack reads stacks/Pulumi.aws-r8g.yaml; edit that file",
        ),
        (["--stack", "aws-r8g", "llama-3.1-8b-q4_0"], "error: --stack: the stack file says"),
        (["--stack", "aws-r8g", "--instance-type", "r8g.large"], "leave it out"),
    ],
)
def test_stack_refuses_what_it_cannot_use(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, _, err = run(capsys, *args)
    assert code == 2 and message in err


def test_a_written_stack_never_joins_the_mock_sweep(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in pulumi_mocks.REPOSITORY_STACKS:
        assert (files.STACKS_DIR / f"Pulumi.{name}.yaml").is_file(), name
    monkeypatch.setattr(files, "STACKS_DIR", tmp_path)
    for name in pulumi_mocks.REPOSITORY_STACKS:
        (tmp_path / f"Pulumi.{name}.yaml").write_text("config: {}\n")
    code, _, _ = run(capsys, "llama-3.1-8b-q4_0", "--cloud", "aws", "--write-stack", "mine",
                     "--model-url", "https://example.invalid/m.gguf",
                     "--stacks-dir", str(tmp_path))  # fmt: skip
    assert code == 0 and "mine" in files.stack_names()
    assert "mine" not in pulumi_mocks.stack_names()


def test_every_shipped_stack_is_swept() -> None:
    """The stacks git tracks (a checkout without git: the stacks there, as shipped) are the
    ones the mock tiers sweep, so a new shipped stack cannot skip them."""
    if (files.REPO / ".git").exists():
        tracked = subprocess.run(["git", "ls-files", "stacks/"], cwd=files.REPO, text=True,
                                 capture_output=True, check=True).stdout.split()  # fmt: skip
        names = sorted(Path(t).name.removeprefix("Pulumi.").removesuffix(".yaml") for t in tracked)
    else:
        names = files.stack_names()
    assert names == sorted(pulumi_mocks.REPOSITORY_STACKS)


@pytest.mark.parametrize(
    ("given", "expected"),
    [("Llama-3.1-70B-Q4_0", "llama-3.1-70b-q4_0"), ("qwen2.5-72b", "qwen2.5-72b-q4_k_m")],
)
def test_a_stacks_preset_takes_the_names_the_planner_takes(given: str, expected: str) -> None:
    model = {"preset": given, "urls": ["https://example.invalid/m.gguf"], "sha256": ["0" * 64]}
    settings = {"cloud": "aws", "instanceType": "r8g.16xlarge", "workerCount": 0, "model": model}
    assert config.from_settings(settings, "us-east-1").model.name == expected
    settings["model"] = {**model, "preset": "llama-3.1-70b"}
    with pytest.raises(config.ConfigError, match="comes in q4_0, q4_k_m, q8_0"):
        config.from_settings(settings, "us-east-1")


def test_spot_prices_have_their_own_dated_column_never_mixed_with_on_demand(
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = PRESETS["llama-3.1-405b-q4_0"]
    c8g = catalog.find("aws", "us-east-1", "c8g.16xlarge")
    assert c8g is not None and c8g.spot_hourly_usd is not None  # the fixture's one spot price
    option = search.evaluate(model, c8g, 3, 4096)
    assert option.spot_instances_usd == pytest.approx(3 * c8g.spot_hourly_usd)
    without_spot = dataclasses.replace(c8g, spot_hourly_usd=None)
    assert search.evaluate(model, without_spot, 3, 4096).hourly_usd == option.hourly_usd
    assert search.evaluate(model, without_spot, 3, 4096).spot_instances_usd is None
    code, out, _ = run(capsys, "llama-3.1-405b-q4_0", "--instance-type", "c8g.16xlarge",
                       "--count", "3")  # fmt: skip
    assert code == 0
    assert f"${3 * c8g.spot_hourly_usd:,.2f} ({c8g.spot_price_date})" in out


def test_the_kubernetes_platform_prices_the_control_plane_and_no_balancer_node(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The same group on EKS: the control plane's hourly price on top, HAProxy as pods instead
    of a balancer node, and the model on each node's one disk (so no second disk on the main
    node, and workers of its type with its disk)."""
    group = ["llama-3.1-70b-q4_0", "--instance-type", "c8g.8xlarge", "--count", "2", "--json"]
    code, out, _ = run(capsys, *group)
    assert code == 0
    [vm] = json.loads(out)["options"]
    code, out, _ = run(capsys, *group, "--platform", "kubernetes")
    assert code == 0
    document = json.loads(out)
    [eks] = document["options"]
    plane = catalog.service_price("aws", costs.CONTROL_PLANE_ITEM).usd
    assert plane is not None
    assert eks["platform"] == "kubernetes" and vm["platform"] == "vm"
    assert eks["hourlyUsdParts"]["controlPlane"] == plane
    assert vm["hourlyUsdParts"]["controlPlane"] is None
    assert eks["hourlyUsdParts"]["instances"] == vm["hourlyUsdParts"]["instances"]
    assert "platform" in document["assumptions"]
    # The priced nodes are the EKS stack's: one group's node disks as its launch templates have.
    model = PRESETS["llama-3.1-70b-q4_0"]
    c8g = catalog.find("aws", "us-east-1", "c8g.8xlarge")
    assert c8g is not None
    option = search.evaluate(model, c8g, 2, 4096, platform="kubernetes")
    main, worker = option.priced
    assert main.system_disk_gb == 0 and (worker.disk_gb, worker.disk_throughput_mibps) == (
        main.disk_gb,
        main.disk_throughput_mibps,
    )
    assert eks["hourlyUsd"] == costs.hourly_cost("aws", option.priced, control_plane=True).total
    # With replicas: no balancer node.
    code, out, _ = run(capsys, *group, "--platform", "kubernetes", "--streams", "3", "--slots", "1")
    assert code == 0
    for found in json.loads(out)["options"]:
        assert found["replicas"] > 1 and found["hourlyUsdParts"]["balancer"] is None
        assert found["hourlyUsdParts"]["controlPlane"] == plane


def test_the_kubernetes_platform_plans_on_aws_only(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "llama-3.1-8b-q4_0", "--platform", "kubernetes", "--json")
    assert code == 0
    assert {o["provider"] for o in json.loads(out)["options"]} == {"aws"}
    for args, words in [
        (["--cloud", "gcp"], "error: --platform: --cloud gcp: the kubernetes platform is EKS's"),
        (["--write-stack", "x", "--model-url", "https://e.invalid/m"], "set platform and"),
    ]:
        code, _, err = run(capsys, "llama-3.1-8b-q4_0", "--platform", "kubernetes", *args)
        assert code == 2 and words in err, err
    code, _, err = run(capsys, "--stack", "aws-eks", "--platform", "kubernetes")
    assert code == 2 and "what --platform would; leave it out" in err
