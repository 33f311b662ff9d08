"""Planner benchmark: plan every preset on every provider, and check the speed model's anchors.

    uv run python bench/plan.py [--repetitions N]

Writes bench/results/plan.json:

- plan_all_presets_seconds: wall time to plan all presets on all providers once (best of N
  runs; target well under 1 s in total).
- anchors: each published decode figure against the prediction for its cluster: the two the
  model is fitted to, the checks (AFM-4.5B on Graviton4 and Axion; one of them sets Axion's
  bandwidth) and one reported only (Llama-2-7B Q4_0 on r7g.16xlarge, llama.cpp PR #5780, 2024).
- prompt_anchors: each published step of several tokens against the model: Arm's 405B (sets the
  plain kernels' rate) and 8B prompts, and every row of llama.cpp #13886's Neoverse-N2
  batched-bench tables; with compute's overlap and plain_slowdown.
- picks: each provider's recommendation for every preset.
- targets: replicas sized for a target (``--streams``, ``--aggregate-tps``) on every provider:
  wall time (best of N), each provider's pick and the verdict between replicas and one group.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from infra import catalog, planner  # noqa: E402
from infra.core import perf  # noqa: E402
from infra.models import PRESETS, Model  # noqa: E402
from infra.planner import base, search, target, verdict  # noqa: E402

RESULTS = REPO / "bench" / "results" / "plan.json"


def plan_everything() -> dict[str, planner.Plan]:
    return {name: planner.plan(model) for name, model in PRESETS.items()}


# Targets a user might ask for: many chats on a small model, a rate on a mid-size one.
TARGETS = (
    ("llama-3.1-8b-q4_0", base.Target(streams=32, min_stream_tps=15)),
    ("llama-3.1-70b-q4_0", base.Target(aggregate_tps=60)),
)


def plan_targets() -> list[planner.Plan]:
    where = [(p, r) for p in catalog.providers() for r in search.regions(p)]
    return [target.plan(PRESETS[name], 4096, where, goal) for name, goal in TARGETS]


def target_rows(plans: list[planner.Plan]) -> list[dict[str, Any]]:
    rows = []
    for (name, goal), result in zip(TARGETS, plans, strict=True):
        for found in verdict.verdicts(result):
            pick = result.recommendation(found.provider)
            rows.append({
                "model": name,
                "target": goal.describe(),
                "provider": found.provider,
                "pick": verdict.to_json(pick),
                "cheaperPerHour": found.per_hour,
                "cheaperPerMtok": found.per_mtok,
                "why": found.why,
            })  # fmt: skip
    return rows


def predicted_tps(
    model: Model, instance: catalog.InstanceType, nodes: int, kv_tokens: int
) -> float:
    option = planner.evaluate(model, instance, nodes, 2 * kv_tokens)
    assert option.fits and option.decode_tps is not None
    return option.decode_tps


def anchors() -> list[dict[str, object]]:
    rows = []
    for anchor in (*perf.ANCHORS, *perf.CHECKS):
        predicted = predicted_tps(
            PRESETS[anchor.model], anchor.instance, anchor.nodes, anchor.kv_tokens
        )
        role = "fitted" if anchor in perf.ANCHORS else anchor.role
        rows.append({"anchor": anchor.label, "published": anchor.decode_tps,
                     "predicted": round(predicted, 3), "role": role,
                     "error": round(predicted / anchor.decode_tps - 1, 3)})  # fmt: skip
    return rows


def prompt_anchors() -> list[dict[str, object]]:
    """Each published step of several tokens against the model's prediction: Arm's prompts
    (seconds of one step) and llama.cpp #13886's batched decode (aggregate tok/s)."""
    rows: list[dict[str, object]] = []
    for run in perf.PROMPT_RUNS:
        predicted = perf.prompt_run_seconds(run)
        rows.append({"anchor": run.label, "published_seconds": run.seconds,
                     "predicted_seconds": round(predicted, 4), "role": run.role,
                     "error": round(predicted / run.seconds - 1, 3)})  # fmt: skip
    for batched in perf.BATCHED_RUNS:
        for sequences, published in batched.aggregate_tps:
            predicted = perf.batched_prediction(batched, sequences)
            rows.append({"anchor": f"{batched.label}, {sequences} sequences",
                         "published_tps": published, "predicted_tps": round(predicted, 3),
                         "role": "asserted",
                         "error": round(predicted / published - 1, 3)})  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repetitions", type=int, default=5)
    args = parser.parse_args()
    timings, target_timings = [], []
    for _ in range(args.repetitions):
        started = time.perf_counter()
        plans = plan_everything()
        timings.append(time.perf_counter() - started)
        started = time.perf_counter()
        targeted = plan_targets()
        target_timings.append(time.perf_counter() - started)
    picks = {
        name: {
            provider: {
                "instanceType": best.instance.name,
                "count": best.count,
                "layers": list(best.placement.layers),
                "hourlyUsd": best.hourly_usd,
                "predictedDecodeTps": None
                if best.decode_tps is None
                else round(best.decode_tps, 3),
            }
            for provider in catalog.providers()
            if (best := result.recommendation(provider)) is not None
        }
        for name, result in plans.items()
    }
    calibration = perf.calibration()
    results = {
        "machine": {"cpus": len(os.sched_getaffinity(0)), "arch": platform.machine()},
        "presets": len(PRESETS),
        "providers": catalog.providers(),
        "catalog_rows": len(catalog.load()),
        "plan_all_presets_seconds": round(min(timings), 4),
        "plan_all_presets_seconds_runs": [round(t, 4) for t in timings],
        "calibration": {
            "eta": round(calibration.eta, 4),
            "layer_overhead_ms": round(calibration.layer_overhead_seconds * 1e3, 4),
            "rpc_hop_ms": round(calibration.hop_seconds * 1e3, 3),
        },
        "anchors": anchors(),
        "prompt_anchors": prompt_anchors(),
        "picks": picks,
        "plan_targets_seconds": round(min(target_timings), 4),
        "plan_targets_seconds_runs": [round(t, 4) for t in target_timings],
        "compute": {
            "anchor": perf.AXION_PROMPT.label,
            "prompt_tps": perf.AXION_PROMPT.prompt_tps,
            "threads_scaling_exponent": round(perf.AXION_PROMPT.scaling_exponent, 4),
            "overlap": perf.overlap(),
            "plain_slowdown": round(perf.plain_slowdown(), 3),
            "basis": perf.COMPUTE_BASIS,
        },
        "targets": target_rows(targeted),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(
        json.dumps(
            {
                k: results[k]
                for k in (
                    "plan_all_presets_seconds",
                    "plan_targets_seconds",
                    "calibration",
                    "anchors",
                    "prompt_anchors",
                )
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
