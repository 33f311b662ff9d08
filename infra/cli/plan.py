"""``lrc plan``: choose and price a cluster for a model on every cloud (``infra.planner``)."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from infra import catalog, models
from infra.cli.options import PROGRAM, add_cloud, add_json, add_stack, command_parser, print_json
from infra.core import perf, sizing
from infra.core.limits import MAX_REPLICAS, PLATFORMS, VM
from infra.models import ModelError
from infra.planner import base, chart, report, request, search, serve
from infra.planner.base import PlanError, TargetUnmet
from infra.stack.files import writable_stacks_dir


def parser() -> argparse.ArgumentParser:
    p = command_parser(
        "plan",
        "The smallest Arm cluster of each type that holds a model, ranked per cloud by cost "
        "per token (or --sort), with its predicted decode speed, time to serve and cost. "
        "Offline: prices come from the catalog (infra/catalog), each with its source and date.",
    )
    p.add_argument("model", nargs="?", help=f"a preset: {', '.join(models.PRESETS)}")
    p.add_argument(
        "--gguf",
        metavar="PATH",
        help="describe the model from a GGUF's header "
        "(the first part of a split file); only headers are read",
    )
    p.add_argument("--size-gb", type=float, help="custom model: file size in GB (10^9 bytes)")
    p.add_argument("--layers", type=int, help="custom model: number of layers")
    p.add_argument(
        "--kv-bytes-per-token",
        type=int,
        help="custom model: f16 KV cache bytes per token (layers x 2 x kv_heads x head_dim x 2)",
    )
    p.add_argument(
        "--context",
        type=int,
        default=sizing.DEFAULT_CONTEXT,
        help="context size in tokens (default %(default)s)",
    )
    p.add_argument(
        "--slots",
        type=int,
        help="requests served at once by a group, each with --context tokens of KV cache "
        f"(default {sizing.DEFAULT_SLOTS}; with --streams or --aggregate-tps the planner "
        "chooses unless given)",
    )
    add_cloud(p, catalog.providers(), "only this cloud (repeat for several; default: all)",
              action="append")  # fmt: skip
    p.add_argument(
        "--region",
        help="the region to plan in (with one --cloud; default: each cloud's home region, "
        "us-east-1, us-central1, eastus)",
    )
    p.add_argument(
        "--all-regions",
        action="store_true",
        help="plan in every region the catalog has (`lrc catalog show` lists them)",
    )
    p.add_argument(
        "--instance-type",
        help="evaluate this type instead of searching (the fewest nodes that hold the model, "
        "or --count; with a target, replicas of that group)",
    )
    p.add_argument("--count", type=int, help="with --instance-type: the number of nodes")
    add_stack(
        p,
        "evaluate the cluster that stacks/Pulumi.NAME.yaml deploys (its model, types, disks, "
        "context, slots and replicas); with --streams or --aggregate-tps, the replicas of its "
        "group that meet the target",
    )
    p.add_argument(
        "--platform",
        choices=PLATFORMS,
        default=VM,
        help="how the nodes run: `kubernetes` prices them as an EKS cluster (its control plane, "
        "HAProxy as pods instead of a balancer node, the model on each node's one disk); AWS "
        "only (default %(default)s)",
    )
    p.add_argument(
        "--sort",
        choices=base.SORTS,
        help="rank by $ per million tokens (where a speed is known), $ per hour or tokens/s; "
        f"each cloud's pick is its first (default {base.SORTS[0]}; {base.SORTS[1]} "
        "with --aggregate-tps: the cheapest set that meets it)",
    )
    p.add_argument(
        "--min-tps",
        type=float,
        help="only clusters predicted to decode at least this many tokens/s (with a target: "
        "each stream, when every stream is served at once)",
    )
    p.add_argument(
        "--streams",
        type=int,
        help="target: serve this many streams at once; each option becomes the replicas "
        f"(serving groups behind a private balancer, at most {MAX_REPLICAS}) that do",
    )
    p.add_argument(
        "--aggregate-tps",
        type=float,
        metavar="TPS",
        help="target: generate this many tokens/s across all streams; each option becomes "
        "the replicas that do",
    )
    p.add_argument(
        "--download-gbps",
        type=float,
        default=serve.INTERNET_GBPS,
        help="the model host's download rate, for the internet path's time to serve "
        "(default %(default)s)",
    )
    add_json(p)
    p.add_argument(
        "--chart",
        metavar="FILE.png",
        type=Path,
        help="draw each cloud's pick: $/h, $/Mtok and predicted tok/s",
    )
    p.add_argument(
        "-v", "--verbose", action="store_true", help="also list the types rejected, and why"
    )
    p.add_argument(
        "--write-stack",
        metavar="NAME",
        help="write stacks/Pulumi.NAME.yaml for the first option shown",
    )
    p.add_argument(
        "--model-url",
        action="append",
        default=[],
        help="with --write-stack: the GGUF's https URL (repeat for each split part)",
    )
    p.add_argument(
        "--model-sha256",
        action="append",
        default=[],
        help="with --write-stack: each part's sha256, in order",
    )
    p.add_argument(
        "--engines",
        action="store_true",
        help="for each cloud's pick: one stream's predicted decode under every engine (the "
        "layer split, a draft model, tensor parallel, a pipeline, vLLM), each with its basis and "
        "why the stacks do not run it",
    )
    p.add_argument(
        "--draft-acceptance",
        type=float,
        metavar="FRACTION",
        help="with --engines: the chance the target accepts each drafted token, 0-1 (default: "
        "a range around the published figure for the model pair)",
    )
    p.add_argument(
        "--prompt-tokens",
        type=int,
        default=perf.PROMPT_TOKENS,
        help="the prompt the time to first token (TTFT) and the prompt rate are predicted for "
        "(default %(default)s)",
    )
    p.add_argument("--stacks-dir", type=Path, default=writable_stacks_dir(), help=argparse.SUPPRESS)
    return p


def request_of(args: argparse.Namespace) -> request.Request:
    fields = {field.name for field in dataclasses.fields(request.Request)}
    asked = {name: value for name, value in vars(args).items() if name in fields}
    return request.Request(**{**asked, "clouds": tuple(args.cloud or ())})


def check_output_flags(args: argparse.Namespace) -> None:
    """What to print or write: flags that mean nothing without another are refused, not
    ignored, before anything is planned."""
    for flag, given in (("--model-url", args.model_url), ("--model-sha256", args.model_sha256)):
        if given and not args.write_stack:
            raise PlanError(flag, "goes with --write-stack NAME, which writes it into the stack")
    if args.write_stack and args.stack:
        written = f"stacks/Pulumi.{args.stack}.yaml"
        raise PlanError("--write-stack", f"--stack reads {written}; edit that file instead")
    if args.write_stack and args.platform != VM:
        raise PlanError(
            "--platform",
            "--write-stack writes a VM stack; set platform and kubernetesImage in it "
            "afterwards (docs/kubernetes.md)",
        )
    if args.draft_acceptance is not None:
        if not args.engines:
            raise PlanError("--draft-acceptance", "goes with --engines")
        if not 0 <= args.draft_acceptance <= 1:
            raise PlanError(
                "--draft-acceptance",
                f"is the fraction of drafted tokens accepted, 0-1, not {args.draft_acceptance}",
            )


def run(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    check_output_flags(args)
    asked = request_of(args)
    result = request.plan(asked)
    shown = request.shown(asked, result)
    if args.prompt_tokens != perf.PROMPT_TOKENS:
        shown = shown.only([search.with_prompt(o, shown.model, args.prompt_tokens)
                            for o in shown.options])  # fmt: skip
    lines = report.engines(shown, args.draft_acceptance) if args.engines else None
    if args.json:
        print_json(report.to_json(shown) | ({} if lines is None else report.engines_json(lines)))
    else:
        print(report.table(shown, verbose=args.verbose))
        if lines is not None:
            print(report.engines_text(lines))
    if not shown.options:
        print(f"\n{report.nothing_shown(result, args.min_tps)}", file=sys.stderr)
    if args.chart:
        chart.draw(shown, args.chart)
        print(f"chart written to {args.chart}", file=sys.stderr)
    if args.write_stack:
        command = f"{PROGRAM} plan {shlex.join(argv)}"
        path = request.write_stack(args.stacks_dir, args.write_stack, shown,
                                   urls=args.model_url, sums=args.model_sha256,
                                   command=command)  # fmt: skip
        print(
            f"stack written to {path}; deploy it with `pulumi up --stack {args.write_stack}`",
            file=sys.stderr,
        )
    not_fitting = [o for o in result.options if not o.fits]
    for option in not_fitting:
        print(f"error: {report.does_not_fit(result, option)}", file=sys.stderr)
    return 0 if shown.options and not not_fitting else 1


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return run(argv)
    except TargetUnmet as error:  # a question with no answer, as when nothing meets --min-tps
        print(f"error: {error}", file=sys.stderr)
        return 1
    except (ModelError, PlanError) as error:
        print(f"error: {error}{_model_hint(argv, str(error))}", file=sys.stderr)
        return 2


def _model_hint(argv: Sequence[str] | None, said: str) -> str:
    """What an unknown model name may have meant: a stack's name, or a model the presets lack,
    which its GGUF describes."""
    if "unknown preset" not in said:
        return ""
    from infra.stack.files import stack_names  # noqa: PLC0415

    given = [word for word in (argv or []) if not word.startswith("-")]
    named = next((word for word in given if word in stack_names()), None)
    if named:
        return f"; {named!r} is a stack: `lrc plan --stack {named}`"
    return (
        "; any other model is described by its GGUF's header, read over HTTP: `lrc plan --gguf "
        "https://huggingface.co/ORG/REPO/resolve/main/MODEL.gguf`"
    )
