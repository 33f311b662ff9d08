"""The planner's command line (``python -m infra.planner``): choose and price a cluster for a
model on every provider."""

from __future__ import annotations

import argparse
import difflib
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from infra import catalog, models
from infra.cli.naming import prog
from infra.cli.options import add_json, print_json
from infra.clouds import FACTS
from infra.core import sizing
from infra.core.limits import MAX_REPLICAS, PLATFORMS, VM
from infra.models import Model, ModelError
from infra.planner import base, report, search, serve, target
from infra.planner.base import PlanError, Target, TargetUnmet
from infra.stack import config, files

STACKS_DIR = Path(__file__).resolve().parents[2] / "stacks"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog("infra.planner"),
        description="The smallest Arm cluster of each type that holds a model, ranked per "
        "provider by cost per token (or --sort), with its predicted decode speed, time to serve "
        "and cost. Offline: prices come from "
        "the catalog (infra/catalog), each with its source and date.",
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
    p.add_argument(
        "--cloud",
        "--provider",
        dest="provider",
        action="append",
        choices=catalog.providers(),
        help="only this cloud (repeat for several; default: all)",
    )
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
    p.add_argument(
        "--stack",
        metavar="NAME",
        help="evaluate the cluster that stacks/Pulumi.NAME.yaml deploys (its model, types, "
        "disks, context, slots and replicas); with --streams or --aggregate-tps, the replicas "
        "of its group that meet the target",
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
        f"each provider's pick is its first (default {base.SORTS[0]}; {base.SORTS[1]} "
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
        help="draw each provider's pick: $/h, $/Mtok and predicted tok/s",
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
        help="for each provider's pick: one stream's predicted decode under every engine (the "
        "layer split, a draft model, tensor parallel, a pipeline, vLLM), each with its basis and "
        "why the stacks do not run it",
    )
    p.add_argument(
        "--draft-acceptance",
        type=float,
        metavar="FRACTION",
        help="with --engines: the drafted tokens the target accepts, 0-1 (default: the "
        "published figure for the model pair)",
    )
    p.add_argument("--stacks-dir", type=Path, default=STACKS_DIR, help=argparse.SUPPRESS)
    return p


def describe_model(args: argparse.Namespace) -> Model:
    custom = [args.size_gb, args.layers, args.kv_bytes_per_token]
    chosen = sum(x is not None for x in (args.model, args.gguf)) + any(
        x is not None for x in custom
    )
    if chosen != 1:
        raise ModelError(
            "model",
            "give exactly one of: a preset name, --gguf PATH or URL, --size-gb with "
            "--layers and --kv-bytes-per-token, or --stack NAME",
        )
    if args.model:
        return models.preset(args.model)
    if args.gguf:
        from infra.models import gguf_header  # noqa: PLC0415

        return gguf_header.describe(args.gguf)
    missing = [
        flag
        for flag, value in zip(
            ("--size-gb", "--layers", "--kv-bytes-per-token"), custom, strict=True
        )
        if value is None
    ]
    if missing:
        raise ModelError(
            missing[0], "a custom model needs --size-gb, --layers and --kv-bytes-per-token"
        )
    return models.custom(args.size_gb, args.layers, args.kv_bytes_per_token)


def _where(args: argparse.Namespace) -> list[tuple[str, str]]:
    providers = args.provider or [
        p for p in catalog.providers() if args.platform == VM or "platform" not in FACTS[p].refuses
    ]
    if args.region:
        if len(providers) != 1:
            raise PlanError("--region", "give exactly one --cloud with --region")
        return [(providers[0], args.region)]
    if args.all_regions:
        return [(p, r) for p in providers for r in search.regions(p)]
    return search.home_regions(providers)


def _instance_type(args: argparse.Namespace) -> catalog.InstanceType:
    for facts in FACTS.values():
        grace = facts.gpu_capacity_problem(args.instance_type)
        if grace is not None:
            raise PlanError("--instance-type", grace)
    matches = [
        t
        for t in catalog.load()
        if t.name == args.instance_type
        and (not args.provider or t.provider in args.provider)
        and (not args.region or t.region == args.region)
    ]
    if not matches:
        known = sorted({t.name for t in catalog.load()})
        close = difflib.get_close_matches(args.instance_type, known, n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise PlanError(
            "--instance-type",
            f"{args.instance_type!r} is not in the catalog; {hint}known: {', '.join(known)}",
        )
    return matches[0]


def _target(args: argparse.Namespace) -> Target | None:
    if args.streams is None and args.aggregate_tps is None:
        return None
    if args.streams is not None and args.aggregate_tps is not None:
        raise PlanError("--streams", "give one target: --streams or --aggregate-tps, not both")
    return Target(args.streams, args.aggregate_tps, args.min_tps)


def _single(args: argparse.Namespace, model: Model, goal: Target | None) -> base.Plan:
    """Evaluate the one cluster that --instance-type (and --count, or the fewest nodes that
    hold the model) names; with a target, the replicas of it that meet it."""
    instance = _instance_type(args)
    search.check_context(model, args.context)
    if args.slots is not None:
        search.check_slots(args.slots)
    if goal is not None:
        shape = target.Shape(count=args.count, slots=args.slots, platform=args.platform)
        if args.count is not None:
            search.check_count(args.count)
        return target.sized(model, args.context, instance, goal, shape,
                            download_gbps=args.download_gbps, sort=args.sort)  # fmt: skip
    args.slots = sizing.DEFAULT_SLOTS if args.slots is None else args.slots
    count = args.count
    if count is None:
        count = search.fewest_nodes(model, args.context, args.slots, instance)
        if count is None:
            raise PlanError(
                "--instance-type",
                f"{instance.name}: "
                + search.rejection_reason(model, args.context, args.slots, instance),
            )
    option = search.evaluate(
        model,
        instance,
        count,
        args.context,
        slots=args.slots,
        download_gbps=args.download_gbps,
        platform=args.platform,
    )
    return base.Plan(model, args.context, args.slots, [option], download_gbps=args.download_gbps)


def _stack(args: argparse.Namespace, goal: Target | None) -> base.Plan:
    """Evaluate the cluster a stack file deploys, as the program reads it (every serving group
    of it, all slots busy); with a target, the replicas of its group that meet it."""
    given = [flag for flag, value in (
        ("a model", args.model), ("--gguf", args.gguf), ("--size-gb", args.size_gb),
        ("--layers", args.layers), ("--kv-bytes-per-token", args.kv_bytes_per_token),
        ("--instance-type", args.instance_type), ("--count", args.count),
        ("--cloud", args.provider), ("--region", args.region),
        ("--context", args.context != sizing.DEFAULT_CONTEXT),
        ("--slots", args.slots is not None), ("--platform", args.platform != VM),
    ) if value]  # fmt: skip
    if given:
        raise PlanError("--stack", f"the stack file says what {given[0]} would; leave it out")
    try:  # Its types are the catalog's: the config check refuses any other.
        cfg = files.stack_config(args.stack)
    except files.StackFileError as error:
        raise PlanError("--stack", str(error)) from None
    except config.ConfigError as error:
        raise PlanError("--stack", f"stacks/Pulumi.{args.stack}.yaml: {error}") from None
    instance, main = cfg.instance_type, cfg.main_instance_type
    shape = target.Shape(
        count=cfg.worker_count + 1,
        slots=cfg.slots,
        main=main,
        main_disk_gb=cfg.main_disk_gb,
        worker_disk_gb=cfg.worker_disk_gb,
        disk_throughput_mibps=cfg.disk_throughput_mibps,
        platform=cfg.platform,
    )
    if goal is not None:
        return target.sized(cfg.model, cfg.context_size, instance, goal, shape,
                            download_gbps=args.download_gbps, sort=args.sort)  # fmt: skip
    option = search.evaluate(
        cfg.model,
        instance,
        cfg.worker_count + 1,
        cfg.context_size,
        slots=cfg.slots,
        download_gbps=args.download_gbps,
        main=main,
        main_disk_gb=cfg.main_disk_gb,
        worker_disk_gb=cfg.worker_disk_gb,
        disk_throughput_mibps=cfg.disk_throughput_mibps,
        platform=cfg.platform,
    )
    if cfg.replicas > 1:  # priced as the stack prices it; its speed with every slot busy
        loads = (cfg.slots,) * cfg.replicas
        option = search.with_replicas(option, cfg.model, cfg.context_size, cfg.replicas, loads)
    return base.Plan(
        cfg.model, cfg.context_size, cfg.slots, [option], download_gbps=args.download_gbps
    )


def write_stack(
    args: argparse.Namespace, result: base.Plan, option: base.Option, command: str
) -> Path:
    if not args.model_url:
        raise PlanError(
            "--model-url",
            "--write-stack needs the GGUF's download URL: give --model-url for "
            "each part, in order (https://..., or your own bucket)",
        )
    if not option.fits:
        raise PlanError(
            "--write-stack",
            f"{option.count} x {option.instance.name} does not "
            "hold the model; choose a cluster that fits",
        )
    if not all(c.isalnum() or c in "-_." for c in args.write_stack):
        raise PlanError("--write-stack", f"{args.write_stack!r}: use letters, digits, - _ .")
    settings = report.stack_settings(option, result, args.model_url, args.model_sha256)
    try:  # The program's own validation, before anything is written.
        config.from_settings(settings, region=option.instance.region)
    except config.ConfigError as error:
        raise PlanError("--write-stack", f"the stack would be rejected: {error}") from None
    path: Path = args.stacks_dir / f"Pulumi.{args.write_stack}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report.stack_yaml(option, result, settings, command))
    return path


def _check_flags(args: argparse.Namespace) -> None:
    """Flags that mean nothing without another are refused, not ignored."""
    if args.count is not None and not args.instance_type:
        raise PlanError("--count", "goes with --instance-type")
    for flag, given in (("--model-url", args.model_url), ("--model-sha256", args.model_sha256)):
        if given and not args.write_stack:
            raise PlanError(flag, "goes with --write-stack NAME, which writes it into the stack")
    if args.download_gbps <= 0:
        raise PlanError("--download-gbps", f"must be positive, got {args.download_gbps}")
    if args.platform != VM:
        without = [p for p in args.provider or () if "platform" in FACTS[p].refuses]
        if without:
            why = FACTS[without[0]].refuses["platform"]
            raise PlanError("--platform", f"--cloud {without[0]}: {why}; plan with --cloud aws")
        if args.write_stack:
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
    _check_flags(args)
    goal = _target(args)
    args.sort = args.sort or (target.default_sort(goal) if goal else base.SORTS[0])
    if args.stack:
        result = _stack(args, goal)
    elif args.instance_type:
        result = _single(args, describe_model(args), goal)
    elif goal is not None:
        result = target.plan(describe_model(args), args.context, _where(args), goal,
                             slots=args.slots, download_gbps=args.download_gbps,
                             sort=args.sort, platform=args.platform)  # fmt: skip
        if not result.options:
            raise TargetUnmet(goal.flag, target.unmet(result))
    else:
        result = search.plan(
            describe_model(args),
            args.context,
            _where(args),
            args.download_gbps,
            sizing.DEFAULT_SLOTS if args.slots is None else args.slots,
            platform=args.platform,
        )
    result = result.sorted_by(args.sort)
    shown = result.only(
        [
            o
            for o in result.options
            # With a target, --min-tps is each stream's speed and the sizing met it already.
            if goal is not None
            or args.min_tps is None
            or (o.decode_tps is not None and o.decode_tps >= args.min_tps)
        ]
    )
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
        report.chart(shown, args.chart)
        print(f"chart written to {args.chart}", file=sys.stderr)
    if args.write_stack:
        if args.stack:
            raise PlanError(
                "--write-stack",
                f"--stack reads stacks/Pulumi.{args.stack}.yaml; edit that file instead",
            )
        if not shown.options:
            raise PlanError("--write-stack", "there is no option to write")
        command = "python -m infra.planner " + shlex.join(argv)
        path = write_stack(args, shown, shown.options[0], command)
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
        print(f"error: {error}", file=sys.stderr)
        return 2
