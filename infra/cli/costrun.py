"""lrc costrun: provider-comparison cost runs.

lrc costrun run --stack aws-c8g --stack gcp-c4a --stack azure-cobalt [--bench ARGS]
    [--max-usd N] [--timeout 45m] [--parallel] [--keep] [--dry-run] [--out runs/]
lrc costrun run --local [--model PATH] [--workers N] [--draft-model PATH]
lrc costrun status|report|cleanup RUN [--out runs/]
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from infra.cli.options import PROGRAM, add_stack, command_parser, json_option, print_json
from infra.core.units import duration as shown_duration
from infra.core.units import money
from infra.costrun import report, runs
from infra.costrun.pipeline import RunOptions
from infra.costrun.runs import CostRunError, LocalRun
from infra.costrun.target import Target

DEFAULT_OUT = Path("runs")


def duration(text: str) -> float:
    """``90``, ``90s``, ``45m``, ``2h``: seconds."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|m|min|h)?", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r}: give a duration like 90s, 45m or 2h")
    return float(match.group(1)) * {"s": 1, None: 1, "m": 60, "min": 60, "h": 3600}[match.group(2)]


def parser() -> argparse.ArgumentParser:
    top = command_parser("costrun", __doc__.splitlines()[0])
    sub = top.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="deploy, measure, destroy, audit and report each stack")
    which = run.add_mutually_exclusive_group(required=True)
    add_stack(which, "a stack of stacks/ (repeat for several)", action="append")
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
    run.add_argument(
        "--out", type=Path, default=DEFAULT_OUT,
        help="where the run's directory goes (default runs/, under this directory)",
    )  # fmt: skip
    run.add_argument("--json", action="store_true", help="with --dry-run: the predictions as JSON")
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
        reports = [json_option()] if name == "status" else []
        command = sub.add_parser(name, help=text, parents=reports)
        command.add_argument("run", help="the run's id (a directory under --out)")
        command.add_argument(
            "--out", type=Path, default=DEFAULT_OUT,
            help="where the run's directory is (default runs/, under this directory)",
        )  # fmt: skip
    return top


def targets_from(args: argparse.Namespace) -> list[Target]:
    local = LocalRun(args.model, args.workers, args.threads, args.draft_model, args.timeout)
    if args.local:
        return [runs.local_target(local)]
    # The local cluster's options mean nothing to a stack, whose file says what it runs.
    for flag, given in (("--model", local.model), ("--workers", local.workers),
                        ("--threads", local.threads),
                        ("--draft-model", local.draft_model)):  # fmt: skip
        if given is not None:
            raise CostRunError(f"{flag} is for --local; a stack's file says its model and nodes")
    return runs.stack_targets(args.stack)


def _echo(started: float) -> runs.Echo:
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


def _prediction_line(row: dict[str, Any]) -> str:
    """A stack's predicted figures, each price marked ``+`` where it leaves out a part the
    catalog cannot price, as the planner marks it."""
    predicted = row["predicted"]
    serve = predicted["serve_seconds"].get("total")
    hourly = predicted["hourly_usd"]
    decode = predicted["decode_tps"]
    plus = "+" if predicted.get("unpriced") else ""
    return (
        f"{row['stack']:<16} serve {'n/a' if serve is None else shown_duration(serve)}"
        f"{_slowest(predicted['serve_seconds'])}, "
        f"decode {'n/a' if decode is None else f'{decode:.2f}'} tok/s, "
        + (
            f"{money(hourly)}{plus}/h"
            if hourly is not None
            else f"$/h unknown ({predicted['note'].removeprefix('unknown: ')})"
        )
        + f", this run {money(row['predicted_run_usd'])}"
        + (plus if row["predicted_run_usd"] is not None else "")
    )


def _slowest(phases: dict[str, float | None]) -> str:
    """The phase that takes most of a long time to serve, so that a slow row says why."""
    parts = {k: v for k, v in phases.items() if k != "total" and v}
    total = phases.get("total") or 0
    if not parts or total < 1800:
        return ""
    name, seconds = max(parts.items(), key=lambda item: item[1])
    return f" ({name} {shown_duration(seconds)})" if seconds >= total / 2 else ""


def run(args: argparse.Namespace) -> int:
    targets = targets_from(args)
    if args.json and not args.dry_run:
        raise CostRunError("--json goes with --dry-run; a run writes report.json")
    rows, total = runs.predictions(targets)
    partial = runs.unpriced(rows)
    timeouts = runs.timeouts(rows, args.timeout)
    if args.json:
        print_json({
            "stacks": rows,
            "predictedRunUsd": total,
            "priceIsPartial": bool(partial),
            "unpriced": partial,
            "timeoutSeconds": timeouts,
        })  # fmt: skip
    else:
        for row in rows:
            print(_prediction_line(row))
        print(f"predicted cost of the run: {money(total)}{'+' if partial and total else ''}")
        if partial:
            left_out = "; ".join(f"{stack}: {', '.join(p)}" for stack, p in partial.items())
            print(f"+: these prices leave out what the catalog cannot price ({left_out})")
    runs.check_budget(args.max_usd, total, partial)
    if args.dry_run:
        return 0
    command = shlex.join([PROGRAM, "costrun", *args.argv])
    run_dir = runs.new_run(args.out, targets, command=command, predicted=total,
                           local=args.local, threads=args.threads)  # fmt: skip
    print(f"run {run_dir.name}: events in {run_dir}/<stack>/events.jsonl", file=sys.stderr)
    options = RunOptions(
        bench_args=tuple(shlex.split(args.bench)),
        max_usd=args.max_usd,
        keep=args.keep,
        poll_seconds=2 if args.local else 15,
    )
    ok = runs.run_all(run_dir, targets, options, timeouts, parallel=args.parallel,
                      echo=_echo(time.monotonic()))  # fmt: skip
    written = report.write(run_dir)
    print(f"report: {run_dir / 'report.md'}")
    for stack in written["stacks"]:
        if stack["leftovers"]:
            print(f"LEFT BEHIND by {stack['stack']}: {stack['leftovers']}", file=sys.stderr)
    return 0 if ok else 1


def status(args: argparse.Namespace) -> int:
    rows = runs.status_rows(runs.run_dir_of(args.out, args.run))
    if args.json:
        print_json({"run": args.run, "stacks": rows})
        return 0
    print(f"{'stack':<16} {'phase':<10} {'elapsed':>9} {'$ so far':>10}")
    for row in rows:
        print(f"{row['stack']:<16} {row['phase']:<10} {row['elapsedSeconds']:>8.0f}s "
              f"{money(float(row['spentUsd']), 4):>10}")  # fmt: skip
    return 0


def report_again(args: argparse.Namespace) -> int:
    run_dir = runs.run_dir_of(args.out, args.run)
    report.write(run_dir)
    print(run_dir / "report.md")
    return 0


def cleanup(args: argparse.Namespace) -> int:
    run_dir = runs.run_dir_of(args.out, args.run)
    return 0 if runs.cleanup(run_dir, _echo(time.monotonic()), print) else 1


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": run, "status": status, "report": report_again, "cleanup": cleanup,
}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.argv = list(sys.argv[2:] if argv is None else argv)  # None: run as `lrc costrun ...`
    from infra.local.source import SourceError  # noqa: PLC0415
    from infra.stack.config import ConfigError  # noqa: PLC0415
    from infra.stack.files import StackFileError  # noqa: PLC0415

    try:
        return COMMANDS[args.command](args)
    except (CostRunError, ConfigError, StackFileError, SourceError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
