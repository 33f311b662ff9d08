"""python -m infra.costrun: provider-comparison cost runs.

python -m infra.costrun run --stacks aws-c8g,gcp-c4a,azure-cobalt [--bench ARGS]
    [--max-usd N] [--timeout 45m] [--parallel] [--keep] [--dry-run] [--out runs/]
python -m infra.costrun run --local [--model PATH] [--workers N] [--draft-model PATH]
python -m infra.costrun status|report|cleanup RUN [--out runs/]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import re
import shlex
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from infra.cli.naming import prog
from infra.cli.options import add_json, print_json
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

DEFAULT_OUT = Path("runs")


class CostRunError(RuntimeError):
    """A cost run cannot start or be read; the message says why and what to do."""


def duration(text: str) -> float:
    """``90``, ``90s``, ``45m``, ``2h``: seconds."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|m|min|h)?", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r}: give a duration like 90s, 45m or 2h")
    return float(match.group(1)) * {"s": 1, None: 1, "m": 60, "min": 60, "h": 3600}[match.group(2)]


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog=prog("infra.costrun"), description=__doc__.splitlines()[0])
    sub = top.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="deploy, measure, destroy, audit and report each stack")
    which = run.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--stack", action="append", metavar="NAME", help="a stack of stacks/ (repeat for several)"
    )
    which.add_argument("--stacks", help=argparse.SUPPRESS)  # the older spelling: a,b,c
    which.add_argument("--local", action="store_true", help="the local cluster (machines; root)")
    run.add_argument(
        "--bench", default="", help="arguments for llama-rpc-bench on the main node, quoted"
    )
    run.add_argument(
        "--max-usd", type=float, help="refuse a run predicted over it; stop one going over"
    )
    run.add_argument(
        "--timeout",
        type=duration,
        help="per stack, from up until it serves (default: 1.5 x its predicted time to serve, "
        "at least 1h)",
    )
    run.add_argument("--parallel", action="store_true", help="all stacks at once")
    run.add_argument("--keep", action="store_true", help="leave the stacks up (and costing)")
    run.add_argument("--dry-run", action="store_true", help="predictions only; nothing is created")
    run.add_argument("--out", type=Path, default=DEFAULT_OUT)
    run.add_argument("--model", type=Path, help="--local: a GGUF (default: Gemma 3 270M)")
    run.add_argument("--workers", type=int, help="--local: RPC workers (default 2)")
    run.add_argument("--threads", type=int, help="--local: threads per node")
    run.add_argument(
        "--draft-model", type=Path, help="--local: a draft model of the model's vocabulary"
    )
    for name, text in (
        ("status", "each stack's phase, elapsed time and $ so far"),
        ("report", "write report.md, report.json and report.png again from the events"),
        ("cleanup", "destroy and audit every stack of a crashed run that may still exist"),
    ):
        command = sub.add_parser(name, help=text)
        command.add_argument("run", help="the run's id (a directory under --out)")
        command.add_argument("--out", type=Path, default=DEFAULT_OUT)
        if name == "status":
            add_json(command)
    return top


def _local_target(args: argparse.Namespace, cluster_id: str = "costrun") -> Target:
    from infra.costrun.local import LocalTarget  # noqa: PLC0415
    from infra.local.model import real_model  # noqa: PLC0415
    from infra.local.options import UpOptions  # noqa: PLC0415
    from infra.local.source import cache_dir, sdist_tree  # noqa: PLC0415

    cache = cache_dir()
    model = args.model or real_model(cache)
    options = UpOptions(
        workers=2 if args.workers is None else args.workers,
        model=model,
        source=sdist_tree(cache, download=False),
        cache=cache,
        cluster_id=cluster_id,
        cidr="10.216.1.0/24",
        threads=args.threads,
        worker_wait_seconds=600,
        machines=True,
        draft_model=args.draft_model,
    )
    return LocalTarget(options, timeout=args.timeout or 1800.0)


def _cloud_target(stack: str) -> Target:
    from infra.costrun.cloud import PulumiTarget  # noqa: PLC0415

    target = PulumiTarget(stack)
    if target.config.kubernetes:
        raise CostRunError(
            f"--stack {stack}: a cost run measures a stack's VMs through the cloud's command "
            "channel, which an EKS stack's pods do not have; run it on a VM stack"
        )
    return target


def targets_from(args: argparse.Namespace) -> list[Target]:
    if args.local:
        return [_local_target(args)]
    # The local cluster's options mean nothing to a stack, whose file says what it runs.
    for flag, given in (("--model", args.model), ("--workers", args.workers),
                        ("--threads", args.threads),
                        ("--draft-model", args.draft_model)):  # fmt: skip
        if given is not None:
            raise CostRunError(f"{flag} is for --local; a stack's file says its model and nodes")
    names = args.stack or [n.strip() for n in args.stacks.split(",") if n.strip()]
    if len(set(names)) != len(names) or not names:
        raise CostRunError(f"--stack {' --stack '.join(names)}: give each stack once")
    return [_cloud_target(name) for name in names]


def _echo(started: float) -> Callable[[str, dict[str, Any]], None]:
    lock = threading.Lock()

    def echo(stack: str, event: dict[str, Any]) -> None:
        detail = event.get("phase") or event.get("message") or ""
        if event["event"] == "finished":
            detail = f"{'ok' if event['ok'] else 'FAILED'}, ${event['spent_usd']:.4f}"
        if event["event"] == "audited":
            detail = "nothing left" if not event["leftovers"] else f"LEFT: {event['leftovers']}"
        with lock:
            print(
                f"{time.monotonic() - started:7.0f}s  {stack:<16} {event['event']:<11} {detail}",
                file=sys.stderr,
            )

    return echo


def _dry_run(targets: list[Target]) -> tuple[list[dict[str, Any]], float | None]:
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


def run(args: argparse.Namespace) -> int:
    targets = targets_from(args)
    rows, total = _dry_run(targets)
    for row in rows:
        predicted = row["predicted"]
        usd = row["predicted_run_usd"]
        serve = predicted["serve_seconds"].get("total")
        hourly = predicted["hourly_usd"]
        print(
            f"{row['stack']:<16} serve {'n/a' if serve is None else shown_duration(serve)}, "
            f"decode {_number(predicted['decode_tps'])} tok/s, "
            + (
                f"{money(hourly)}/h"
                if hourly is not None
                else f"$/h unknown ({predicted['note'].removeprefix('unknown: ')})"
            )
            + f", this run {money(usd)}"
        )
    print(f"predicted cost of the run: {money(total)}")
    timeouts = {}
    for row in rows:  # a timeout the prediction says cannot be met only spends money
        serve = row["predicted"]["serve_seconds"].get("total")
        timeouts[row["stack"]] = args.timeout or default_timeout(serve)
        if serve is not None and args.timeout is not None and args.timeout < serve:
            raise CostRunError(
                f"--timeout {args.timeout:g}s: {row['stack']} is predicted to serve after "
                f"{shown_duration(serve)}; give at least --timeout {math.ceil(serve / 60)}m "
                "(a number alone is seconds)"
            )
    if args.max_usd is not None and (total is None or total > args.max_usd):
        raise CostRunError(
            f"--max-usd {args.max_usd}: the run is predicted at "
            f"{'an unknown cost' if total is None else money(total)}; raise --max-usd or run "
            "fewer stacks"
        )
    if args.dry_run:
        return 0
    run_id = new_run_id()
    run_dir = args.out / run_id
    run_dir.mkdir(parents=True)
    (run_dir / RUN_FILE).write_text(json.dumps({
        "id": run_id,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "stacks": [t.name for t in targets],
        "local": bool(args.local),
        "command": shlex.join(["python", "-m", "infra.costrun", *sys.argv[1:]]),
        "host": {"cpus": os.cpu_count(), "arch": platform.machine()},
        "predicted_usd": total,
        "targets": {t.name: _target_spec(t, args) for t in targets},
    }, indent=2) + "\n")  # fmt: skip
    print(f"run {run_id}: events in {run_dir}/<stack>/events.jsonl", file=sys.stderr)
    options = RunOptions(
        bench_args=tuple(shlex.split(args.bench)),
        max_usd=args.max_usd,
        keep=args.keep,
        poll_seconds=2 if args.local else 15,
    )

    def options_for(target: Target) -> RunOptions:
        return dataclasses.replace(options, timeout_seconds=timeouts[target.name])

    echo = _echo(time.monotonic())
    logs = [EventLog(run_dir / t.name, echo=echo) for t in targets]
    if args.parallel and len(targets) > 1:
        with ThreadPoolExecutor(len(targets)) as pool:
            pairs = zip(targets, logs, strict=True)
            results = list(
                pool.map(lambda pair: run_stack(pair[0], pair[1], options_for(pair[0])), pairs)
            )
    else:
        results = [run_stack(t, log, options_for(t)) for t, log in zip(targets, logs, strict=True)]
    written = report.write(run_dir)
    print(f"report: {run_dir / 'report.md'}")
    for stack in written["stacks"]:
        if stack["leftovers"]:
            print(f"LEFT BEHIND by {stack['stack']}: {stack['leftovers']}", file=sys.stderr)
    return 0 if all(results) else 1


def _target_spec(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    """Enough to find the stack again for `cleanup`."""
    from infra.costrun.local import LocalTarget  # noqa: PLC0415

    if isinstance(target, LocalTarget):
        draft = target.options.draft_model
        return {"kind": "local", "model": str(target.options.model),
                "workers": target.options.workers, "threads": args.threads,
                "draft_model": str(draft) if draft else None}  # fmt: skip
    return {"kind": "pulumi", "stack": target.name}


def _run_dir(args: argparse.Namespace) -> Path:
    run_dir: Path = args.out / args.run
    if not (run_dir / RUN_FILE).is_file():
        raise CostRunError(f"no cost run {args.run!r} in {args.out}/")
    return run_dir


def status(args: argparse.Namespace) -> int:
    run_dir = _run_dir(args)
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
    if args.json:
        print_json({"run": args.run, "stacks": rows})
        return 0
    print(f"{'stack':<16} {'phase':<10} {'elapsed':>9} {'$ so far':>10}")
    for row in rows:
        print(f"{row['stack']:<16} {row['phase']:<10} {row['elapsedSeconds']:>8.0f}s "
              f"{money(float(row['spentUsd']), 4):>10}")  # fmt: skip
    return 0


def report_again(args: argparse.Namespace) -> int:
    run_dir = _run_dir(args)
    report.write(run_dir)
    print(run_dir / "report.md")
    return 0


def cleanup(args: argparse.Namespace) -> int:
    run_dir = _run_dir(args)
    specs = json.loads((run_dir / RUN_FILE).read_text()).get("targets", {})
    failed = False
    for directory in stack_dirs(run_dir):
        log = EventLog(directory, echo=_echo(time.monotonic()))
        if not needs_cleanup(log.events()):
            print(f"{directory.name}: nothing to clean up")
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
    return 1 if failed else 0


def _target_again(name: str, spec: dict[str, Any]) -> Target:
    if spec.get("kind") == "local":
        args = argparse.Namespace(
            model=Path(spec["model"]), workers=spec["workers"], threads=spec["threads"],
            draft_model=Path(spec["draft_model"]) if spec.get("draft_model") else None,
            timeout=600.0,
        )  # fmt: skip
        return _local_target(args)
    return _cloud_target(spec.get("stack", name))


COMMANDS = {"run": run, "status": status, "report": report_again, "cleanup": cleanup}


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from infra.local.source import SourceError  # noqa: PLC0415
    from infra.stack.config import ConfigError  # noqa: PLC0415
    from infra.stack.files import StackFileError  # noqa: PLC0415

    try:
        return COMMANDS[args.command](args)
    except (CostRunError, ConfigError, StackFileError, SourceError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"
