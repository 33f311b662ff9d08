"""Cost runs without a cloud: the pipeline against a fake target that fails where it is told to,
the cloud target against an Automation API stand-in, botocore's Stubber (SSM, tagging, EC2) and
recorded gcloud and az output. Nothing here reaches a network."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from botocore.stub import ANY

from infra.boot import metrics_command
from infra.cli import costrun as cli
from infra.core import outputs, perf
from infra.core.units import money
from infra.costrun import report, rpc_bytes, runs
from infra.costrun.channel_probe import ChannelProbe
from infra.costrun.cloud import PulumiTarget
from infra.costrun.events import EventLog, needs_cleanup, read_events
from infra.costrun.pipeline import BENCH_COMMAND, RunOptions, predicted_usd, run_stack
from infra.costrun.target import Prediction, StepError, parse_status
from infra.live.aws import SsmChannel
from infra.models import PRESETS
from infra.observe.status import STATUS_COMMAND
from infra.observe.usage import UsageUnavailable
from infra.planner import engines, search
from infra.stack.files import config_of, stack_config, stack_values
from tests.conftest import REPO
from tests.live.test_channels import COMMAND_ID, aws_clients, recorded
from tests.observe.test_usage import SimulatedCluster

BENCH = {
    "schema": 1,
    "requests": {
        "count": 2, "prompt_tokens": 100, "predicted_tokens": 50,
        "prompt_tps": {"mean": 90.0, "stdev": 1.0, "runs": 2},
        "decode_tps": {"mean": 9.0, "stdev": 0.5, "runs": 2},
    },
    "llama_bench": {
        "prompt_tokens": 128, "gen_tokens": 64, "threads": 64,
        "prompt_tps": {"mean": 100.0, "stdev": 2.0, "runs": 3},
        "decode_tps": {"mean": 10.0, "stdev": 0.2, "runs": 3},
    },
}  # fmt: skip


class FakeTarget:
    """A stack that records each call and fails at the step it is told to."""

    provider = "aws"

    def __init__(
        self, name: str = "fake", fail: str = "", hourly: float | None = 3.6,
        unpriced: tuple[str, ...] = (),
    ) -> None:  # fmt: skip
        self.name, self.fail, self.hourly, self.unpriced = name, fail, hourly, unpriced
        self.calls: list[str] = []
        self.statuses = [{"phase": "building"}, {"phase": "loading"}, {"phase": "serving"}]
        self.destroyed = False
        self.cluster = SimulatedCluster(workers=2, hidden_bytes=2560, vocab=262144)
        self.cluster_traffic_at_bench: int | None = None
        self.prompt_tokens = 128  # what llama-bench's prompt is in BENCH

    def _step(self, name: str) -> None:
        self.calls.append(name)
        if self.fail == name:
            raise StepError(f"{name} broke")
        if self.fail == f"{name}:interrupt":
            raise KeyboardInterrupt

    def describe(self) -> dict[str, Any]:
        return {"provider": "aws", "nodes": {"main": "m", "workers": 2, "worker": "w"}}

    def predict(self) -> Prediction:
        return Prediction(
            hourly_usd=self.hourly, serve_seconds={"total": 600.0}, decode_tps=12.0,
            prompt_tokens=self.prompt_tokens, prompt_tps=80.0,
            one_off_usd=1.0, price_source="test prices, 2026-01-01", unpriced=self.unpriced,
        )  # fmt: skip

    def preflight(self) -> list[str]:
        self.calls.append("preflight")
        return ["no credentials: log in"] if self.fail == "preflight" else []

    def up(self) -> dict[str, Any]:
        self._step("up")
        return {outputs.MAIN_INSTANCE_ID: "i-main"}

    def node_status(self) -> dict[str, Any]:
        self._step("status")
        if self.fail == "node":
            return {"phase": "failed", "last_error": "checksum mismatch for the model"}
        if self.fail == "slow":
            return {"phase": "loading"}
        return self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]

    def run_on_main(self, command: list[str], timeout: float) -> str:
        self._step("bench")
        self.cluster_traffic_at_bench = self.cluster.counters["main"][2]
        assert command[: len(BENCH_COMMAND)] == list(BENCH_COMMAND)
        with self.cluster.lock:  # the benchmark's own requests, whatever else is refused
            self.cluster._complete(40)
        return "Traceback: nothing useful" if self.fail == "garbage" else json.dumps(BENCH)

    def usage_probe(self) -> SimulatedCluster:
        if self.fail == "usage":
            raise UsageUnavailable("no way to read these nodes")
        if self.fail == "usage:crash":
            raise FileNotFoundError("no cluster.json")
        return self.cluster

    def activation_shape(self) -> rpc_bytes.ActivationShape:
        return rpc_bytes.ActivationShape("gemma3", self.cluster.hidden // 4, self.cluster.vocab)

    def destroy(self) -> None:
        self._step("destroy")
        self.destroyed = True

    def leftovers(self) -> list[str]:
        self.calls.append("audit")
        return [] if self.destroyed else ["arn:aws:ec2:us-east-1:1:instance/i-main"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def run(target: FakeTarget, tmp_path: Path, **options: Any) -> tuple[bool, list[dict[str, Any]]]:
    clock = Clock()
    log = EventLog(tmp_path / target.name)
    ok = run_stack(
        target, log, RunOptions(poll_seconds=60, **options), clock=clock, sleep=clock.sleep
    )
    return ok, log.events()


def names(events: list[dict[str, Any]]) -> list[str]:
    return [e["event"] for e in events]


def test_a_stack_is_deployed_measured_destroyed_and_audited(tmp_path: Path) -> None:
    target = FakeTarget()
    ok, events = run(target, tmp_path)
    assert ok
    assert target.calls == [
        "preflight", "up", "status", "status", "status", "bench", "destroy", "audit",
    ]  # fmt: skip
    assert names(events)[:5] == ["preflight", "predicted", "up", "up_done", "wait"]
    assert names(events)[-5:] == ["destroy", "destroyed", "audit", "audited", "finished"]
    finished = events[-1]
    # Two polls of 60 s on the fake clock: $3.6/h for 120 s, plus the $1 one-off.
    assert finished["spent_usd"] == pytest.approx(3.6 * 120 / 3600 + 1.0)


@pytest.mark.parametrize("step", ["up", "status", "bench", "garbage"])
def test_a_failure_half_way_still_destroys_and_audits(tmp_path: Path, step: str) -> None:
    target = FakeTarget(fail=step)
    ok, events = run(target, tmp_path)
    assert not ok
    assert target.calls[-2:] == ["destroy", "audit"]
    error = next(e for e in events if e["event"] == "error")
    assert ("broke" if step != "garbage" else "printed no JSON") in error["message"]
    assert events[-1] == {**events[-1], "event": "finished", "ok": False}


def test_nothing_is_created_when_preflight_finds_something_missing(tmp_path: Path) -> None:
    target = FakeTarget(fail="preflight")
    ok, events = run(target, tmp_path)
    assert not ok and target.calls == ["preflight"]
    assert "preflight: no credentials: log in" in events[1]["message"]


def test_a_failed_destroy_is_reported_by_the_audit(tmp_path: Path) -> None:
    target = FakeTarget(fail="destroy")
    ok, events = run(target, tmp_path)
    assert not ok
    audited = next(e for e in events if e["event"] == "audited")
    assert audited["leftovers"] == ["arn:aws:ec2:us-east-1:1:instance/i-main"]
    stack = report.stack_report("fake", events)
    assert stack["leftovers"] == audited["leftovers"] and not stack["ok"]


def test_a_node_that_fails_stops_the_wait_at_once_with_its_error(tmp_path: Path) -> None:
    target = FakeTarget(fail="node")
    ok, events = run(target, tmp_path)
    assert not ok and target.calls.count("status") == 1
    assert "the main node failed: checksum mismatch" in events_message(events)


def events_message(events: list[dict[str, Any]]) -> str:
    return next(e["message"] for e in events if e["event"] == "error")


def test_a_stack_that_never_serves_stops_at_the_timeout(tmp_path: Path) -> None:
    target = FakeTarget(fail="slow")
    ok, events = run(target, tmp_path, timeout_seconds=300)
    assert not ok and target.destroyed
    assert "not serving after 300 s (phase loading" in events_message(events)


def test_a_run_that_goes_over_its_budget_is_stopped_and_destroyed(tmp_path: Path) -> None:
    target = FakeTarget(fail="slow", hourly=36.0)  # $0.6 a minute, $1 at once
    ok, events = run(target, tmp_path, max_usd=2.0)
    assert not ok and target.destroyed
    assert "over budget" in events_message(events)
    assert events[-1]["spent_usd"] == pytest.approx(2.2)  # stopped at the first poll over


def test_sigint_destroys_audits_and_then_stops(tmp_path: Path) -> None:
    target = FakeTarget(fail="status:interrupt")
    clock = Clock()
    log = EventLog(tmp_path / "fake")
    with pytest.raises(KeyboardInterrupt):
        run_stack(target, log, RunOptions(), clock=clock, sleep=clock.sleep)
    assert target.calls[-2:] == ["destroy", "audit"]
    assert "interrupted" in names(log.events())


def test_keep_leaves_the_stack_up_and_says_so(tmp_path: Path) -> None:
    target = FakeTarget()
    ok, events = run(target, tmp_path, keep=True)
    assert ok and not target.destroyed and "destroy" not in target.calls
    assert "kept" in names(events)


def test_the_benchmark_reads_every_node_and_measures_bytes_per_token_first(
    tmp_path: Path,
) -> None:
    target = FakeTarget()
    ok, events = run(target, tmp_path)
    assert ok
    order = names(events)
    assert order.index("bench") < order.index("rpc_bytes") < order.index("bench_done")
    # The usage comes back after the benchmark's result is recorded.
    assert order.index("bench_done") < order.index("usage") < order.index("destroy")
    # The requests that measure bytes per token went before the benchmark script, and the
    # usage is the benchmark's alone.
    assert 0 < target.cluster_traffic_at_bench < target.cluster.counters["main"][2]
    stack = report.stack_report("fake", events)
    measured = stack["rpc_bytes"]["measured"]
    # The simulated cluster's own figures: two hidden states and control bytes into w1, one
    # back; one into w2 and the logits back.
    w1, w2 = 2 * 2560 + 3000 + 2560, 2560 + 3000 + 262144 * 4
    assert measured["total_bytes_per_token"]["mean"] == w1 + w2
    model = stack["rpc_bytes"]["model"]
    assert model["hidden_state_bytes"] == 2560 and model["hidden_state_crossings"] == 4
    assert model["ratio_to_hidden_state"] == round((w1 + w2) / 2560, 2)
    usage = stack["usage"]
    assert set(usage["nodes"]) == {"main", "w1", "w2"} and usage["readings"] >= 2
    assert usage["nodes"]["w2"]["sent_bytes"] > 262144 * 4 * (40 - 8)
    assert usage["how"] == {"bytes": "simulated"} and stack["unmeasured"] == []
    assert "- read from: bytes, simulated" in report.usage_lines(stack)
    markdown = report.markdown({**report.build(tmp_path), "stacks": [stack]})
    assert "| node | role | CPU mean % | CPU peak % | peak memory |" in markdown
    assert f"| {report._size(w1 + w2)} |" in markdown  # the summary table's column
    assert f"{model['ratio_to_hidden_state']:.1f} x its hidden state of 2.5 KiB" in markdown
    assert "crosses 4 times, and its logits, 1.00 MiB of 262144 x f32, once" in markdown


def test_the_prompt_and_first_token_are_measured_beside_their_prediction(
    tmp_path: Path,
) -> None:
    target = FakeTarget()
    ok, events = run(target, tmp_path)
    assert ok
    stack = report.stack_report("fake", events)
    measured, predicted = stack["measured"], stack["predicted"]
    # The requests' 100 tokens at 90 tok/s; the planner's 128 at 80.
    assert measured["first_token_seconds"] == pytest.approx(100 / 90, abs=1e-3)
    assert predicted["first_token_seconds"] == pytest.approx(128 / 80, abs=1e-3)
    markdown = report.markdown({**report.build(tmp_path), "stacks": [stack]})
    assert "| 100.0 ± 2.0 / 80.0 |" in markdown  # llama-bench's 128 tokens, predicted for 128
    assert (
        "- first token: measured 1.11 s after 100 tokens; predicted 1.60 s after 128 tokens"
        in markdown
    )
    # A prediction for another prompt than llama-bench ran is not set beside it.
    other = FakeTarget("other")
    other.prompt_tokens = 512
    ok, events = run(other, tmp_path)
    assert ok
    markdown = report.markdown(
        {**report.build(tmp_path), "stacks": [report.stack_report("other", events)]}
    )
    assert "| 100.0 ± 2.0 / n/a |" in markdown


@pytest.mark.parametrize(
    ("fail", "reason"),
    [
        ("usage", "no way to read these nodes"),
        ("usage:crash", "FileNotFoundError: no cluster.json"),
    ],
)
def test_usage_that_cannot_be_measured_is_reported_with_the_reason(
    tmp_path: Path, fail: str, reason: str
) -> None:
    target = FakeTarget(fail=fail)
    ok, events = run(target, tmp_path)
    assert ok and "bench" in target.calls
    stack = report.stack_report("fake", events)
    assert stack["usage"] is None and stack["rpc_bytes"] is None
    assert stack["unmeasured"] == [{"what": "usage and bytes per token", "reason": reason}]
    assert report.usage_lines(stack) == [f"- usage and bytes per token: {reason}", ""]


def test_a_failed_bytes_measurement_leaves_the_benchmark_and_the_usage(tmp_path: Path) -> None:
    target = FakeTarget()

    def refused(body: Any, timeout: float) -> dict[str, Any]:
        raise ConnectionRefusedError("llama-server is not answering")

    target.cluster.complete = refused  # type: ignore[method-assign]
    ok, events = run(target, tmp_path)
    assert ok and "bench" in target.calls
    stack = report.stack_report("fake", events)
    assert stack["rpc_bytes"] is None and stack["usage"]["nodes"]["main"]["role"] == "main"
    (unmeasured,) = stack["unmeasured"]
    assert unmeasured["what"] == "bytes per token"
    assert "ConnectionRefusedError: llama-server is not answering" in unmeasured["reason"]


class DraftTarget(FakeTarget):
    """A stack with a draft model: its requests report what llama-server drafted and accepted."""

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "draft_model": "llama-3.1-8b-q4_0"}

    def predict(self) -> Prediction:
        return dataclasses.replace(
            super().predict(), decode_tps=15.0, draft_acceptance=0.587, draft_basis="a blog"
        )

    def run_on_main(self, command: list[str], timeout: float) -> str:
        bench = json.loads(super().run_on_main(command, timeout))
        bench["requests"] |= {
            "temperature": 0.8,
            "decode_tps": {"mean": 21.0, "stdev": 1.0, "runs": 2},
            "draft": {"drafted": 80, "accepted": 52, "ratio": 0.65},
        }
        return json.dumps(bench)


def test_a_draft_models_acceptance_is_in_the_report_and_decode_is_what_it_serves(
    tmp_path: Path,
) -> None:
    """The requests go through llama-server and its draft, llama-bench runs the model alone: the
    stack's decode (and so its $/Mtok) is the requests', beside the acceptance predicted."""
    ok, events = run(DraftTarget(), tmp_path)
    assert ok
    stack = report.stack_report("fake", events)
    measured = stack["measured"]
    assert measured["draft"] == {"drafted": 80, "accepted": 52, "ratio": 0.65}
    assert measured["decode_tps"]["mean"] == 21.0 and measured["decode_measured_by"] == "requests"
    assert measured["decode_tps_without_draft"]["mean"] == 10.0  # llama-bench's
    assert stack["usd_per_million_tokens"] == round(3.6 / (21.0 * 3600) * 1e6, 3)
    assert stack["predicted"]["draft_acceptance"] == 0.587
    markdown = report.markdown({**report.build(tmp_path), "stacks": [stack]})
    assert "- draft model: llama-3.1-8b-q4_0" in markdown
    assert (
        "- draft model llama-3.1-8b-q4_0: 52 of 80 drafted tokens accepted (65.0%) over the "
        "requests at temperature 0.8; decode is the requests' (llama-bench runs the model "
        "alone: 10.0 ± 0.2 tok/s)"
    ) in markdown
    assert "- the prediction assumed 58.7% accepted: a blog" in markdown
    # Without a draft, decode stays llama-bench's and nothing is said of drafts.
    _, plain = run(FakeTarget(), tmp_path / "plain")
    stack = report.stack_report("plain", plain)
    assert stack["measured"]["decode_measured_by"] == "llama-bench"
    assert stack["measured"]["draft"] is stack["measured"]["decode_tps_without_draft"] is None
    assert "draft" not in report.markdown({**report.build(tmp_path), "stacks": [stack]})


@pytest.mark.parametrize(
    ("draft", "acceptance"), [("llama-3.1-8b-q4_0", 0.587), ("llama-3.1-8b-q8_0", None)]
)
def test_a_stacks_draft_is_predicted_at_its_pairs_published_acceptance(
    draft: str, acceptance: float | None
) -> None:
    """The planner's pair (lrc plan --engines): the 405B drafted by Llama-3.1-8B Q4_0 decodes
    faster than without it, at 58.7 %; a draft with no published figure is predicted without
    it, and the prediction says so."""
    target = PulumiTarget("aws-c8g")
    plain = target.predict()
    url = "s3://my-models/llama-3.1-8b/draft.gguf"
    values = {**stack_values("aws-c8g"), "llama-rpc-cluster:draftModel": {"preset": draft,
              "urls": [url]}, "llama-rpc-cluster:draftMax": 8}  # fmt: skip
    target.config = config_of(values, "aws-c8g")
    prediction = target.predict()
    assert prediction.draft_acceptance == acceptance
    assert target.describe()["draft_model"] == draft
    c = target.config
    if acceptance is None:
        assert "no published acceptance for llama-3.1-8b-q8_0" in prediction.draft_basis
        # The draft takes room on the main node: the split moves, the figure barely.
        assert prediction.decode_tps == pytest.approx(plain.decode_tps, rel=0.05)
        return
    assert "devquasar.com" in prediction.draft_basis
    nodes = [c.main_instance_type] + [c.instance_type] * c.worker_count
    kv_tokens = int(c.context_size * perf.KV_FILL_FRACTION)
    # The workers compute as the build's patch set says (as `lrc plan` predicts them).
    found = engines.speculative(
        c.model, nodes, c.placement, kv_tokens, draft=PRESETS[draft],
        acceptance=engines.LLAMA_8B_DRAFT.per_token, draft_max=8,
        workers_repack=search.workers_repack(),
    )  # fmt: skip
    assert found is not None and prediction.decode_tps == found.tps
    assert found.draft_max == 8  # the stack's draftMax, not the best draft length
    prompt = perf.prompt(c.model, nodes, c.placement, 128, workers_repack=search.workers_repack())
    assert prompt is not None and prediction.prompt_tokens == 128
    assert prediction.prompt_tps == round(prompt.tps, 2)


def test_the_predicted_cost_counts_serve_bench_destroy_and_one_off() -> None:
    prediction = FakeTarget(hourly=3.6).predict()
    assert predicted_usd(prediction) == pytest.approx(3.6 * (600 + 600 + 300) / 3600 + 1.0)
    assert predicted_usd(FakeTarget(hourly=None).predict()) is None


@pytest.fixture
def fake_targets(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeTarget]:
    made: dict[str, FakeTarget] = {}

    def cloud(stack: str) -> FakeTarget:
        made[stack] = FakeTarget(
            stack, fail="destroy" if stack == "leaky" else "",
            unpriced=("Hyperdisk Balanced disks",) if stack.startswith("partial") else (),
        )  # fmt: skip
        return made[stack]

    monkeypatch.setattr(runs, "cloud_target", cloud)
    monkeypatch.setattr("infra.costrun.pipeline.time.sleep", lambda _: None)
    return made


def test_the_command_refuses_a_run_predicted_over_max_usd(tmp_path, fake_targets, capsys) -> None:
    code = cli.main(
        ["run", "--stack", "a", "--stack", "b", "--max-usd", "4.5", "--out", str(tmp_path)]
    )
    assert code == 2
    # Each: $3.6/h over 600 s to serve, 600 s of benchmark, 300 s of destroy, and $1 at once.
    assert "--max-usd 4.5: the run is predicted at $5.00" in capsys.readouterr().err
    assert all(t.calls == [] for t in fake_targets.values()) and not list(tmp_path.iterdir())


def test_a_dry_run_creates_nothing(tmp_path, fake_targets, capsys) -> None:
    assert cli.main(["run", "--stack", "a", "--dry-run", "--out", str(tmp_path)]) == 0
    assert "predicted cost of the run: $2.50" in capsys.readouterr().out
    assert fake_targets["a"].calls == [] and not list(tmp_path.iterdir())


def test_a_dry_run_of_the_shipped_stacks_reads_as_the_planner_does(tmp_path, capsys) -> None:
    """Dollars to the cent and serve times in minutes, as the planner shows them; a price the
    catalog lacks is said so, with the parts it lacks, never printed as None."""
    stacks = ["aws-c8g", "gcp-c4a", "azure-cobalt"]
    picked = [word for stack in stacks for word in ("--stack", stack)]
    assert cli.main(["run", *picked, "--dry-run", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "None" not in out
    for stack in stacks:
        [line] = [row for row in out.splitlines() if row.startswith(stack)]
        cost = stack_config(stack).hourly_cost
        # As the planner marks a price that leaves a part out; an unknown one is said so.
        plus = "+" if cost.unpriced and cost.total is not None else ""
        hourly = (
            f"{money(cost.total)}{plus}/h"
            if cost.total is not None
            else "$/h unknown (no catalog price for "
        )
        assert hourly in line and re.search(r"serve \d+ min", line), line
        assert line.endswith(plus) and ("+" in line) == bool(plus), line
    assert "gcp-c4a" in out and "+: these prices leave out what the catalog cannot price (" in out
    assert not list(tmp_path.iterdir())


def test_a_ceiling_is_not_kept_against_a_partial_price(tmp_path, fake_targets, capsys) -> None:
    """A run whose predicted price leaves a part out may go over --max-usd unseen: refused."""
    args = ["run", "--stack", "partial", "--max-usd", "100", "--out", str(tmp_path)]
    assert cli.main(args) == 2
    captured = capsys.readouterr()
    assert "this run $2.50+" in captured.out and "predicted cost of the run: $2.50+" in captured.out
    assert "--max-usd 100: the run's predicted $2.50 leaves out what the catalog cannot price " in (
        captured.err
    )
    assert "partial: Hyperdisk Balanced disks" in captured.err
    assert fake_targets["partial"].calls == [] and not list(tmp_path.iterdir())
    assert cli.main(["run", "--stack", "whole", "--max-usd", "100", "--dry-run"]) == 0


def test_the_dry_run_as_json(tmp_path, fake_targets, capsys) -> None:
    args = ["run", "--stack", "whole", "--stack", "partial", "--dry-run", "--json"]
    assert cli.main(args) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["schemaVersion"] == 1 and document["priceIsPartial"] is True
    assert document["predictedRunUsd"] == pytest.approx(5.0)
    assert document["unpriced"] == {"partial": ["Hyperdisk Balanced disks"]}
    assert [s["stack"] for s in document["stacks"]] == ["whole", "partial"]
    assert document["timeoutSeconds"] == {"whole": 3600, "partial": 3600}
    assert cli.main(["run", "--stack", "whole", "--json", "--out", str(tmp_path)]) == 2
    assert "--json goes with --dry-run" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--timeout", "45"], "--timeout 45s: aws-c8g is predicted to serve after "),
        (["--workers", "3"], "--workers is for --local"),
        (["--model", "m.gguf"], "--model is for --local"),
        (["--threads", "2"], "--threads is for --local"),
        (["--stack", "aws-eks"], "--stack aws-eks: a cost run measures a stack's VMs"),
    ],
)
def test_an_option_that_cannot_work_for_a_stack_is_refused(tmp_path, capsys, extra, says) -> None:
    args = ["run", "--stack", "aws-c8g", "--dry-run", "--out", str(tmp_path), *extra]
    assert cli.main(args) == 2
    assert says in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_the_default_timeout_leaves_a_slow_stack_time_to_serve() -> None:
    """Azure's stack is predicted to serve after 94 min: an hour's timeout would tear it down
    while it loads. The default is half again the prediction, and at least an hour."""
    azure = PulumiTarget("azure-cobalt").predict().serve_seconds["total"]
    assert runs.default_timeout(azure) == max(3600, math.ceil(1.5 * azure)) >= azure
    assert runs.default_timeout(600) == 3600 and runs.default_timeout(None) == 3600
    assert runs.default_timeout(5619.5) == 8430


def test_the_command_reports_every_stack_and_fails_loudly_on_a_leftover(
    tmp_path, fake_targets, capsys
) -> None:
    code = cli.main(
        ["run", "--stack", "good", "--stack", "leaky", "--parallel", "--out", str(tmp_path)]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert "LEFT BEHIND by leaky: ['arn:aws:ec2:us-east-1:1:instance/i-main']" in err
    (run_dir,) = tmp_path.iterdir()
    written = json.loads((run_dir / "report.json").read_text())
    assert written["schema_version"] == report.SCHEMA_VERSION
    stacks = {s["stack"]: s for s in written["stacks"]}
    assert stacks["good"]["ok"] and stacks["good"]["leftovers"] == []
    assert stacks["good"]["measured"]["decode_tps"]["mean"] == 10.0
    # $3.6/h at 10 tok/s: 100 $ per million tokens.
    assert stacks["good"]["usd_per_million_tokens"] == 100.0
    assert not stacks["leaky"]["ok"]
    markdown = (run_dir / "report.md").read_text()
    assert "| good | 1 x m + 2 x w |" in markdown and "instance/i-main" in markdown
    assert (run_dir / "report.png").read_bytes()[:4] == b"\x89PNG"


def test_a_crashed_run_is_cleaned_up_and_reported(
    tmp_path, fake_targets, monkeypatch, capsys
) -> None:
    run_dir = tmp_path / "crashed"
    (run_dir).mkdir()
    (run_dir / "run.json").write_text(json.dumps({"id": "crashed", "targets": {}}))
    log = EventLog(run_dir / "s1")
    for event in ("preflight", "up", "up_done", "wait"):
        log.emit(event)
    EventLog(run_dir / "s2").emit("preflight")  # never got to `up`: nothing to clean
    assert needs_cleanup(log.events())
    assert cli.main(["cleanup", "crashed", "--out", str(tmp_path)]) == 0
    assert fake_targets["s1"].calls == ["destroy", "audit"] and "s2" not in fake_targets
    assert not needs_cleanup(read_events(run_dir / "s1" / "events.jsonl"))
    capsys.readouterr()
    assert cli.main(["status", "crashed", "--out", str(tmp_path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["schemaVersion"] == 1 and shown["run"] == "crashed"
    assert {row["stack"] for row in shown["stacks"]} == {"s1", "s2"}
    assert cli.main(["status", "crashed", "--out", str(tmp_path)]) == 0
    assert (run_dir / "report.md").exists()


def test_an_unknown_stack_is_named_with_the_ones_there_are(tmp_path, capsys) -> None:
    assert cli.main(["run", "--stack", "aws-c9g", "--dry-run", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "stack 'aws-c9g': no stacks/Pulumi.aws-c9g.yaml" in err and "aws-c8g" in err


# --- the cloud target ---------------------------------------------------------------------------


class FakeStack:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def up(self, on_output: Any = None) -> Any:
        self.calls.append("up")
        on_output("Updating (aws-c8g):\n")
        on_output("    + aws:ec2:Instance llama-rpc-cluster-main creating (12s)\n")

        class Output:
            def __init__(self, value: Any) -> None:
                self.value = value

        class Result:
            def __init__(self) -> None:
                self.outputs = {
                    outputs.CLOUD: Output("aws"),
                    outputs.MAIN_PRIVATE_IP: Output("10.0.0.10"),
                    outputs.WORKER_PRIVATE_IPS: Output(["10.0.0.11", "10.0.0.12"]),
                    outputs.MAIN_INSTANCE_ID: Output("i-0main"),
                    outputs.CONNECT_COMMAND: Output("aws ssm start-session --target i-0main"),
                }

        return Result()

    def destroy(self, on_output: Any = None) -> None:
        self.calls.append("destroy")
        on_output("Destroying (aws-c8g):\n")


class FakeAutomation:
    """Stands in for ``pulumi.automation``: records which stack and program it was asked for."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def create_or_select_stack(self, stack_name: str, work_dir: str) -> FakeStack:
        where = "the project" if Path(work_dir) == REPO else work_dir
        self.calls.append(f"select {stack_name} in {where}")
        return FakeStack(self.calls)


def test_pulumis_own_output_is_shown_as_the_stack_deploys(capsys) -> None:
    """`pulumi up` takes minutes: its lines reach the terminal as it prints them."""
    target = PulumiTarget("aws-c8g", automation=FakeAutomation())
    target.up()
    target.destroy()
    err = capsys.readouterr().err
    assert "  aws-c8g | Updating (aws-c8g):" in err
    assert "  aws-c8g |     + aws:ec2:Instance llama-rpc-cluster-main creating (12s)" in err
    assert "  aws-c8g | Destroying (aws-c8g):" in err
    kept: list[str] = []
    PulumiTarget("aws-c8g", automation=FakeAutomation(), pulumi_output=kept.append).up()
    assert kept[0] == "Updating (aws-c8g):\n"


def test_the_cloud_target_deploys_reads_benchmarks_and_destroys_through_the_real_apis() -> None:
    automation = FakeAutomation()
    clients, stubs = aws_clients()
    target = PulumiTarget(
        "aws-c8g", automation=automation, aws_clients=lambda service, region: clients[service],
        which=lambda tool: f"/usr/bin/{tool}",
    )  # fmt: skip
    ssm = stubs["ssm"]
    for command, stdout in (
        (shlex.join(STATUS_COMMAND), '{"phase": "serving"}'),
        (shlex.join([*BENCH_COMMAND, "--requests", "2"]), json.dumps(BENCH)),
    ):
        ssm.add_response(
            "send_command", {"Command": {"CommandId": COMMAND_ID}},
            {"InstanceIds": ["i-0main"], "DocumentName": "AWS-RunShellScript",
             "Parameters": {"commands": [command], "executionTimeout": [ANY]}},
        )  # fmt: skip
        ssm.add_client_error("get_command_invocation", "InvocationDoesNotExist")
        ssm.add_response(
            "get_command_invocation", {"Status": "InProgress"},
            {"CommandId": COMMAND_ID, "InstanceId": "i-0main"},
        )  # fmt: skip
        ssm.add_response(
            "get_command_invocation", {"Status": "Success", "StandardOutputContent": stdout},
            {"CommandId": COMMAND_ID, "InstanceId": "i-0main"},
        )  # fmt: skip
    with ssm:
        assert target.up()[outputs.MAIN_INSTANCE_ID] == "i-0main"
        channel = target.channel()
        assert isinstance(channel, SsmChannel)
        channel.sleep = lambda _: None
        target.channel = lambda: channel  # type: ignore[method-assign]
        assert target.node_status() == {"phase": "serving"}
        bench = target.run_on_main([*BENCH_COMMAND, "--requests", "2"], timeout=600)
        assert json.loads(bench) == BENCH
        target.destroy()
    ssm.assert_no_pending_responses()
    assert automation.calls == ["select aws-c8g in the project", "up", "destroy"]
    described = target.describe()
    assert described["nodes"]["main"] == "c8g.16xlarge" and described["provider"] == "aws"
    probe = target.usage_probe()  # the first group, through the same channel
    assert isinstance(probe, ChannelProbe) and probe.channel is channel
    assert probe.roles == {"main": "main", "worker-1": "worker", "worker-2": "worker"}
    assert target.activation_shape() is None
    prediction = target.predict()
    assert prediction.hourly_usd == target.config.hourly_cost.total
    assert set(prediction.serve_seconds) == {"boot", "build", "download", "load", "total"}


def test_preflight_names_each_missing_tool_and_login(no_aws_credentials) -> None:
    aws = PulumiTarget("aws-c8g", which=lambda tool: None)
    missing = aws.preflight()
    assert missing[0].startswith("the Pulumi CLI is not on PATH")
    assert missing[1].startswith("no AWS credentials: set AWS_PROFILE")
    logged_out = recorded({
        "gcloud auth print-access-token": (1, "ERROR: (gcloud.auth.print-access-token) You do "
                                              "not currently have an active account selected."),
    })  # fmt: skip
    gcp = PulumiTarget(
        "gcp-c4a", which=lambda tool: f"/usr/bin/{tool}", runner=logged_out, environ={}
    )
    assert gcp.preflight() == [
        "no gcloud login: run `gcloud auth login` (ERROR: (gcloud.auth.print-access-token) You "
        "do not currently have an active account selected.)"
    ]
    no_project = recorded({"gcloud auth": (0, "token\n"), "gcloud config": (0, "\n")})
    gcp = PulumiTarget(
        "gcp-c4a", which=lambda tool: f"/usr/bin/{tool}", runner=no_project, environ={}
    )
    assert gcp.preflight() == [
        "no GCP project: set `gcp:project` in the stack file, GOOGLE_CLOUD_PROJECT, or gcloud's "
        "own (`gcloud config set project PROJECT`)"
    ]
    azure = PulumiTarget("azure-cobalt", which=lambda tool: None if tool == "az" else "/bin/x")
    assert azure.preflight() == [
        "az is not on PATH: install the Azure CLI "
        "(https://learn.microsoft.com/cli/azure/install-azure-cli)"
    ]


def test_a_local_run_without_the_llama_cpp_source_says_how_to_fetch_it(
    tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("LLAMA_RPC_CACHE", str(tmp_path / "empty"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert cli.main(["run", "--local", "--model", str(model), "--dry-run"]) == 2
    assert "run `lrc local fetch-source`" in capsys.readouterr().err


def test_the_one_off_download_is_paid_by_every_groups_main_node_unless_staged() -> None:
    from infra.core import costs
    from infra.stack.files import config_of, stack_values

    target = PulumiTarget("aws-c8g", which=lambda tool: None)
    once = costs.download_usd("aws", target.config.model.size_bytes)
    assert once and target.predict().one_off_usd == once
    values = stack_values("aws-c8g")
    target.config = config_of({**values, "llama-rpc-cluster:replicas": 3})
    assert target.predict().one_off_usd == pytest.approx(3 * once)
    model = {**values["llama-rpc-cluster:model"], "sha256": []}
    model["urls"] = [f"s3://models/part-{i}.gguf" for i in range(len(model["urls"]))]
    target.config = config_of({**values, "llama-rpc-cluster:model": model})
    assert target.predict().one_off_usd == 0.0


def test_a_nodes_status_text_is_shown_without_its_control_characters() -> None:
    """The status file is the service user's to write: its text reaches the operator's terminal
    with escapes, carriage returns and bidirectional overrides shown, not acted on."""
    status = parse_status(
        json.dumps({"phase": "serving\x1b[2J", "last_error": "ok\r\u202efake", "n": 1})
    )
    assert status == {"phase": "serving\\x1b[2J", "last_error": "ok\\x0d\\u202efake", "n": 1}
    with pytest.raises(StepError, match=r"not JSON yet: '\\\\x1b\]0;owned"):
        parse_status("\x1b]0;owned\x07")


def test_the_prompt_predicted_is_the_one_the_benchmark_runs() -> None:
    script = (metrics_command.SCRIPTS / metrics_command.BENCH).read_text()
    found = re.search(r'"--prompt-words", type=int, default=(\d+)', script)
    assert found is not None and int(found[1]) == metrics_command.BENCH_PROMPT_TOKENS


def test_the_report_says_a_partial_price_and_the_nodes_in_words(
    tmp_path, fake_targets, capsys
) -> None:
    """report.md marks the $ of a stack whose price leaves a part out, names the part, and
    says the nodes as the table does (it printed a Python dict)."""
    assert cli.main(["run", "--stack", "whole", "--stack", "partial", "--out", str(tmp_path)]) == 0
    (run_dir,) = tmp_path.iterdir()
    written = json.loads((run_dir / "report.json").read_text())
    stacks = {s["stack"]: s for s in written["stacks"]}
    assert stacks["partial"]["price_partial"] and not stacks["whole"]["price_partial"]
    assert stacks["partial"]["unpriced"] == ["Hyperdisk Balanced disks"]
    markdown = (run_dir / "report.md").read_text()
    assert "- nodes: 1 x m + 2 x w" in markdown and "{'main'" not in markdown
    [partial_row] = [line for line in markdown.splitlines() if line.startswith("| partial |")]
    [whole_row] = [line for line in markdown.splitlines() if line.startswith("| whole |")]
    assert "| 3.6000+ | 1.0000+ | 100.00+ |" in partial_row
    assert "| 3.6000 | 1.0000 | 100.00 |" in whole_row
    assert "+: the price leaves out what the catalog cannot price (partial: Hyperdisk" in markdown
    assert (run_dir / "report.png").stat().st_size > 0


class Axis:
    """What a chart's panel was asked to draw."""

    def __init__(self) -> None:
        self.bars: list[tuple[list[float], list[float], dict[str, Any]]] = []
        self.labels: list[list[str]] = []
        self.texts: list[tuple[float, str]] = []

    def bar(self, where: list[float], heights: list[float], width: float, **kw: Any) -> str:
        self.bars.append((where, heights, kw))
        return "bars"

    def bar_label(self, bars: str, labels: list[str], fontsize: int) -> None:
        self.labels.append(labels)

    def text(self, x: float, y: float, text: str, **_: Any) -> None:
        self.texts.append((x, text))


def test_the_chart_draws_no_bar_for_a_missing_figure_and_marks_a_partial_price() -> None:
    axis = Axis()
    report._bars(axis, [0.0, 1.0, 2.0], [7.5, None, 5.7], 0.6, "measured",
                 spread=[0.5, None, None], marks=["", "", "+"])  # fmt: skip
    [(where, heights, options)] = axis.bars
    assert (where, heights) == ([0.0, 2.0], [7.5, 5.7])  # no 0 bar where a figure is missing
    assert options["yerr"] == [0.5, 0]  # the measured spread
    assert axis.labels == [["7.50", "5.70+"]] and axis.texts == [(1.0, "n/a")]
