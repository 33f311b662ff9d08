"""A cost run of the local cluster, for real: machines up, serving, the benchmark script on the
main node (requests and llama-bench through the workers) while every node is read, the bytes
per generated token between the main node and its workers, down, the audit, and the report."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from infra.cli import costrun as cli
from infra.local.model import cached_model, real_model
from infra.local.source import cache_dir
from tests.conftest import require_machines

# Built before the runs: each measures its cluster's time to serve, which a build would swell.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.netns,
    pytest.mark.machines,
    pytest.mark.usefixtures("host_build"),
]


def test_a_local_cost_run_measures_destroys_audits_and_reports(
    llama_source: Path, tmp_path: Path, capsys
) -> None:
    require_machines()
    model = cached_model(llama_source, cache_dir())
    bench = "--requests 3 --repetitions 2 --predict 16 --prompt-words 32"
    code = cli.main([
        "run", "--local", "--model", str(model), "--threads", "1", "--out", str(tmp_path),
        "--bench", bench, "--timeout", "20m",
    ])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    (run_dir,) = tmp_path.iterdir()
    report = json.loads((run_dir / "report.json").read_text())
    (stack,) = report["stacks"]
    assert stack["ok"] and stack["leftovers"] == [] and stack["phase"] == "done"
    measured = stack["measured"]
    requests = measured["requests"]
    assert requests["count"] == 3 and requests["predicted_tokens"] == 16
    assert measured["decode_tps"]["mean"] > 0 and measured["decode_tps"]["runs"] == 2
    assert measured["prompt_tps"]["mean"] > measured["decode_tps"]["mean"]
    assert 0 < measured["serve_seconds"]["total"] < 1200
    assert stack["llama_cpp_commit"] and stack["nodes"]["workers"] == 2
    # Every machine was read through the benchmark: its cgroup's CPU, its processes' memory,
    # its VPC interface (llama-bench sends the weights to the workers again).
    usage = stack["usage"]
    cores = os.cpu_count() or 1
    assert set(usage["nodes"]) == {"main", "w1", "w2"} and usage["failed_readings"] == 0
    for name, node in usage["nodes"].items():
        # At most every core of this machine (the readings' times are a few ms apart).
        assert 0 < node["cpu_mean_percent"] <= node["cpu_peak_percent"] <= cores * 125, name
        assert node["memory_peak_bytes"] > 10 << 20, name
        assert node["received_bytes"] > 0 and node["sent_bytes"] > 0, name
    assert usage["how"]["cpu"].startswith("the machine's cgroup")
    assert 0 < usage["kv_cache"]["peak_ratio"] < 1
    # Bytes per token within what ggml-rpc must send (tests/observe/test_usage.py: the band).
    figures = stack["rpc_bytes"]["model"]
    assert figures["in_band"], figures
    assert figures["n_embd"] == 256 and figures["hidden_state_crossings"] == 4
    assert stack["unmeasured"] == []
    # The same report again from the events alone.
    written = (run_dir / "report.md").read_text()
    assert cli.main(["report", run_dir.name, "--out", str(tmp_path)]) == 0
    assert (run_dir / "report.md").read_text().splitlines()[4:] == written.splitlines()[4:]
    assert "| nothing | ok |" in written
    assert "| node | role | CPU mean % | CPU peak % | peak memory |" in written
    assert "x its hidden state of 1.0 KiB (n_embd 256 x f32)" in written


def test_a_local_cost_run_with_a_draft_model_reports_its_acceptance(
    llama_source: Path, tmp_path: Path, capsys
) -> None:
    """Gemma 3 270M drafting for itself under another name (test_draft_model.py says why), bound
    into the main machine beside the model: the report carries llama-server's drafted and
    accepted tokens over the benchmark's sampled requests, and their decode as the stack's."""
    require_machines()
    model = real_model(cache_dir())
    draft = tmp_path / "draft" / "gemma-3-270m-draft.gguf"
    draft.parent.mkdir()
    draft.hardlink_to(model)
    out = tmp_path / "runs"
    bench = "--requests 2 --predict 32 --prompt-words 32 --no-llama-bench"
    code = cli.main([
        "run", "--local", "--model", str(model), "--draft-model", str(draft), "--workers", "1",
        "--threads", "1",
        "--out", str(out), "--bench", bench, "--timeout", "20m",
    ])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    (run_dir,) = out.iterdir()
    report = json.loads((run_dir / "report.json").read_text())
    (stack,) = report["stacks"]
    assert stack["ok"] and stack["leftovers"] == [] and stack["draft_model"] == draft.name
    measured = stack["measured"]
    drafted = measured["draft"]
    print(f"drafted {drafted}, decode {measured['decode_tps']}")
    # What the model proposes for itself, sampled at 0.8: most of it is what it then picks.
    assert 0 < drafted["accepted"] <= drafted["drafted"] and drafted["ratio"] >= 0.5, drafted
    assert measured["decode_measured_by"] == "requests" and measured["decode_tps"]["mean"] > 0
    written = (run_dir / "report.md").read_text()
    assert f"- draft model {draft.name}: {drafted['accepted']} of {drafted['drafted']}" in written
