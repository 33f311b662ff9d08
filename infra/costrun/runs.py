"""A cost run as a whole: its targets, their predictions and timeouts, the run's directory and
record (``run.json``), its stacks run one after another or at once, its status from the events,
and the cleanup of a crashed run."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from infra.core.units import duration as shown_duration
from infra.core.units import money
from infra.costrun import report
from infra.costrun.events import (
    RUN_FILE,
    EventLog,
    last,
    needs_cleanup,
    new_run_id,
    phase_of,
    read_events,
    stack_dirs,
)
from infra.costrun.pipeline import RunOptions, predicted_usd, run_stack
from infra.costrun.target import StepError, Target

Echo = Callable[[str, dict[str, Any]], None]


class CostRunError(RuntimeError):
    """A cost run cannot start or be read; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class LocalRun:
    """The local cluster a run measures: the model (default: Gemma 3 270M) and its nodes."""

    model: Path | None = None
    workers: int | None = None
    threads: int | None = None
    draft_model: Path | None = None
    timeout: float | None = None  # seconds until it serves


def local_target(asked: LocalRun, cluster_id: str = "costrun") -> Target:
    from infra.costrun.local import LocalTarget  # noqa: PLC0415
    from infra.local.model import real_model  # noqa: PLC0415
    from infra.local.options import UpOptions  # noqa: PLC0415
    from infra.local.source import cache_dir, sdist_tree  # noqa: PLC0415

    cache = cache_dir()
    options = UpOptions(
        workers=2 if asked.workers is None else asked.workers,
        model=asked.model or real_model(cache),
        source=sdist_tree(cache, download=False),
        cache=cache,
        cluster_id=cluster_id,
        cidr="10.216.1.0/24",
        threads=asked.threads,
        worker_wait_seconds=600,
        machines=True,
        draft_model=asked.draft_model,
    )
    return LocalTarget(options, timeout=asked.timeout or 1800.0)


def cloud_target(stack: str) -> Target:
    from infra.costrun.cloud import PulumiTarget  # noqa: PLC0415

    target = PulumiTarget(stack)
    if target.config.kubernetes:
        raise CostRunError(
            f"--stack {stack}: a cost run measures a stack's VMs through the cloud's command "
            "channel, which an EKS stack's pods do not have; run it on a VM stack"
        )
    return target


def stack_targets(stacks: Sequence[str]) -> list[Target]:
    if len(set(stacks)) != len(stacks) or not stacks:
        raise CostRunError(f"--stack {' --stack '.join(stacks)}: give each stack once")
    return [cloud_target(name) for name in stacks]


def predictions(targets: Sequence[Target]) -> tuple[list[dict[str, Any]], float | None]:
    """Each target's prediction and what its run is predicted to cost; the total (None when
    one is unknown)."""
    rows: list[dict[str, Any]] = []
    total: float | None = 0.0
    for target in targets:
        prediction = target.predict()
        usd = predicted_usd(prediction)
        total = None if usd is None or total is None else total + usd
        rows.append(
            {"stack": target.name, **target.describe(), "predicted": prediction.to_json(),
             "predicted_run_usd": usd}
        )  # fmt: skip
    return rows, total


def default_timeout(serve_seconds: float | None) -> float:
    """Half again the predicted time to serve, and at least an hour: a slow download or build
    is not a failure, a node that never serves is."""
    return max(3600.0, math.ceil(1.5 * serve_seconds)) if serve_seconds else 3600.0


def timeouts(rows: Sequence[dict[str, Any]], given: float | None) -> dict[str, float]:
    """Each stack's timeout: ``given``, or its default; a timeout the prediction says cannot be
    met only spends money, and is refused."""
    chosen = {}
    for row in rows:
        serve = row["predicted"]["serve_seconds"].get("total")
        chosen[row["stack"]] = given or default_timeout(serve)
        if serve is not None and given is not None and given < serve:
            raise CostRunError(
                f"--timeout {given:g}s: {row['stack']} is predicted to serve after "
                f"{shown_duration(serve)}; give at least --timeout {math.ceil(serve / 60)}m "
                "(a number alone is seconds)"
            )
    return chosen


def unpriced(rows: Sequence[dict[str, Any]]) -> dict[str, list[str]]:
    """Each stack whose predicted price leaves out a part the catalog cannot price (a disk,
    Tier_1 networking), with those parts: its price is a floor, marked ``+``."""
    return {
        row["stack"]: list(row["predicted"].get("unpriced") or [])
        for row in rows
        if row["predicted"].get("unpriced")
    }


def check_budget(
    max_usd: float | None, total: float | None, partial: Mapping[str, list[str]] | None = None
) -> None:
    """Refuse a run predicted over ``max_usd``, or one whose price is unknown or partial: a
    ceiling is only kept against a price that counts every part."""
    if max_usd is None:
        return
    if total is None or total > max_usd:
        raise CostRunError(
            f"--max-usd {max_usd:g}: the run is predicted at "
            f"{'an unknown cost' if total is None else money(total)}; raise --max-usd or run "
            "fewer stacks"
        )
    if partial:
        left_out = "; ".join(f"{stack}: {', '.join(parts)}" for stack, parts in partial.items())
        raise CostRunError(
            f"--max-usd {max_usd:g}: the run's predicted {money(total)} leaves out what the "
            f"catalog cannot price ({left_out}), which may take it over; a ceiling is kept only "
            "for stacks priced in full: leave --max-usd out to run these, and watch `lrc "
            "costrun status`"
        )


def _target_spec(target: Target, threads: int | None) -> dict[str, Any]:
    """Enough to find the stack again for `cleanup`."""
    from infra.costrun.local import LocalTarget  # noqa: PLC0415

    if isinstance(target, LocalTarget):
        draft = target.options.draft_model
        return {"kind": "local", "model": str(target.options.model),
                "workers": target.options.workers, "threads": threads,
                "draft_model": str(draft) if draft else None}  # fmt: skip
    return {"kind": "pulumi", "stack": target.name}


def new_run(
    out: Path,
    targets: Sequence[Target],
    *,
    command: str,
    predicted: float | None,
    local: bool = False,
    threads: int | None = None,
) -> Path:
    """The run's directory under ``out``, with its record."""
    run_id = new_run_id()
    run_dir = out / run_id
    run_dir.mkdir(parents=True)
    (run_dir / RUN_FILE).write_text(json.dumps({
        "id": run_id,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "stacks": [t.name for t in targets],
        "local": local,
        "command": command,
        "host": {"cpus": os.cpu_count(), "arch": platform.machine()},
        "predicted_usd": predicted,
        "targets": {t.name: _target_spec(t, threads) for t in targets},
    }, indent=2) + "\n")  # fmt: skip
    return run_dir


def run_all(
    run_dir: Path,
    targets: Sequence[Target],
    options: RunOptions,
    timeouts: dict[str, float],
    *,
    parallel: bool,
    echo: Echo,
) -> bool:
    """Every stack's steps, each under its own timeout; whether every one succeeded."""

    def options_for(target: Target) -> RunOptions:
        return dataclasses.replace(options, timeout_seconds=timeouts[target.name])

    logs = [EventLog(run_dir / t.name, echo=echo) for t in targets]
    if parallel and len(targets) > 1:
        with ThreadPoolExecutor(len(targets)) as pool:
            pairs = zip(targets, logs, strict=True)
            results = list(
                pool.map(lambda pair: run_stack(pair[0], pair[1], options_for(pair[0])), pairs)
            )
    else:
        results = [run_stack(t, log, options_for(t)) for t, log in zip(targets, logs, strict=True)]
    return all(results)


def run_dir_of(out: Path, run: str) -> Path:
    run_dir = out / run
    if not (run_dir / RUN_FILE).is_file():
        raise CostRunError(f"no cost run {run!r} in {out}/")
    return run_dir


def status_rows(run_dir: Path) -> list[dict[str, Any]]:
    """Each stack's phase, time since ``up`` and what it has cost so far (at its predicted
    hourly price)."""
    rows: list[dict[str, Any]] = []
    for directory in stack_dirs(run_dir):
        events = read_events(directory / "events.jsonl")
        predicted = (last(events, "predicted") or {}).get("prediction", {})
        up = last(events, "up")
        end = last(events, "destroyed") or last(events, "finished")
        elapsed = ((end or {"at": time.time()})["at"] - up["at"]) if up else 0.0
        spent = (predicted.get("hourly_usd") or 0) * elapsed / 3600 if up else 0.0
        rows.append({"stack": directory.name, "phase": phase_of(events),
                     "elapsedSeconds": round(elapsed, 1), "spentUsd": round(spent, 4)})  # fmt: skip
    return rows


def cleanup(run_dir: Path, echo: Echo, said: Callable[[str], None]) -> bool:
    """Destroy and audit every stack of the run that may still exist, then write the report
    again; whether nothing was left behind."""
    specs = json.loads((run_dir / RUN_FILE).read_text()).get("targets", {})
    failed = False
    for directory in stack_dirs(run_dir):
        log = EventLog(directory, echo=echo)
        if not needs_cleanup(log.events()):
            said(f"{directory.name}: nothing to clean up")
            continue
        target = _target_again(directory.name, specs.get(directory.name, {}))
        log.emit("destroy", reason="cleanup")
        try:
            target.destroy()
            log.emit("destroyed")
        except StepError as error:
            log.emit("error", message=f"destroy failed: {error}")
        leftovers = target.leftovers()
        log.emit("audited", leftovers=leftovers)
        failed |= bool(leftovers)
    report.write(run_dir)
    return not failed


def _target_again(name: str, spec: dict[str, Any]) -> Target:
    if spec.get("kind") == "local":
        asked = LocalRun(
            model=Path(spec["model"]), workers=spec["workers"], threads=spec["threads"],
            draft_model=Path(spec["draft_model"]) if spec.get("draft_model") else None,
            timeout=600.0,
        )  # fmt: skip
        return local_target(asked)
    return cloud_target(spec.get("stack", name))
