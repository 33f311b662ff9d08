"""What ``lrc plan`` is asked, answered: a model (a preset, a GGUF's header or a custom size) or a
stack file, where to look, and an optional target; the plan, and the stack file it writes."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from infra import catalog, models
from infra.clouds import FACTS
from infra.core import sizing
from infra.core.limits import VM
from infra.models import Model, ModelError
from infra.planner import base, report, search, serve, target
from infra.planner.base import PlanError, Target, TargetUnmet
from infra.stack import config, files


@dataclass(frozen=True)
class Request:
    """Each field is the ``lrc plan`` option of its name; its errors name that option."""

    model: str | None = None  # a preset
    gguf: str | None = None
    size_gb: float | None = None
    layers: int | None = None
    kv_bytes_per_token: int | None = None
    context: int = sizing.DEFAULT_CONTEXT
    slots: int | None = None
    clouds: tuple[str, ...] = ()  # none: every cloud the platform runs on
    region: str | None = None
    all_regions: bool = False
    instance_type: str | None = None
    count: int | None = None
    stack: str | None = None
    platform: str = VM
    sort: str | None = None  # none: the target's default, else the first of base.SORTS
    min_tps: float | None = None
    streams: int | None = None
    aggregate_tps: float | None = None
    download_gbps: float = serve.INTERNET_GBPS

    def target(self) -> Target | None:
        if self.streams is None and self.aggregate_tps is None:
            return None
        if self.streams is not None and self.aggregate_tps is not None:
            raise PlanError("--streams", "give one target: --streams or --aggregate-tps, not both")
        return Target(self.streams, self.aggregate_tps, self.min_tps)

    def ranking(self) -> str:
        goal = self.target()
        return self.sort or (target.default_sort(goal) if goal else base.SORTS[0])


CUSTOM_FLAGS = ("--size-gb", "--layers", "--kv-bytes-per-token")


def describe_model(request: Request) -> Model:
    custom: tuple[float | None, int | None, int | None] = (
        request.size_gb, request.layers, request.kv_bytes_per_token,
    )  # fmt: skip
    chosen = sum(x is not None for x in (request.model, request.gguf)) + any(
        x is not None for x in custom
    )
    if chosen != 1:
        raise ModelError(
            "model",
            "give exactly one of: a preset name, --gguf PATH or URL, --size-gb with "
            "--layers and --kv-bytes-per-token, or --stack NAME",
        )
    if request.model:
        return models.preset(request.model)
    if request.gguf:
        from infra.models import gguf_header  # noqa: PLC0415

        return gguf_header.describe(request.gguf)
    size_gb, layers, kv_bytes_per_token = custom
    if size_gb is None or layers is None or kv_bytes_per_token is None:
        missing = [flag for flag, value in zip(CUSTOM_FLAGS, custom, strict=True) if value is None]
        raise ModelError(
            missing[0], "a custom model needs --size-gb, --layers and --kv-bytes-per-token"
        )
    return models.custom(size_gb, layers, kv_bytes_per_token)


def _where(request: Request) -> list[tuple[str, str]]:
    clouds = list(request.clouds) or [
        p
        for p in catalog.providers()
        if request.platform == VM or "platform" not in FACTS[p].refuses
    ]
    if request.region:
        if len(clouds) != 1:
            raise PlanError("--region", "give exactly one --cloud with --region")
        return [(clouds[0], request.region)]
    if request.all_regions:
        return [(p, r) for p in clouds for r in search.regions(p)]
    return search.home_regions(clouds)


def _instance_type(request: Request, name: str) -> catalog.InstanceType:
    for facts in FACTS.values():
        grace = facts.gpu_capacity_problem(name)
        if grace is not None:
            raise PlanError("--instance-type", grace)
    matches = [
        t
        for t in catalog.load()
        if t.name == name
        and (not request.clouds or t.provider in request.clouds)
        and (not request.region or t.region == request.region)
    ]
    if not matches:
        known = sorted({t.name for t in catalog.load()})
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise PlanError(
            "--instance-type", f"{name!r} is not in the catalog; {hint}known: {', '.join(known)}"
        )
    return matches[0]


def _single(request: Request, name: str, model: Model, goal: Target | None) -> base.Plan:
    """Evaluate the one cluster that --instance-type (and --count, or the fewest nodes that
    hold the model) names; with a target, the replicas of it that meet it."""
    instance = _instance_type(request, name)
    search.check_context(model, request.context)
    if request.slots is not None:
        search.check_slots(request.slots)
    if goal is not None:
        shape = target.Shape(count=request.count, slots=request.slots, platform=request.platform)
        if request.count is not None:
            search.check_count(request.count)
        return target.sized(model, request.context, instance, goal, shape,
                            download_gbps=request.download_gbps,
                            sort=request.ranking())  # fmt: skip
    slots = sizing.DEFAULT_SLOTS if request.slots is None else request.slots
    count = request.count
    if count is None:
        count = search.fewest_nodes(model, request.context, slots, instance)
        if count is None:
            raise PlanError(
                "--instance-type",
                f"{instance.name}: "
                + search.rejection_reason(model, request.context, slots, instance),
            )
    option = search.evaluate(
        model,
        instance,
        count,
        request.context,
        slots=slots,
        download_gbps=request.download_gbps,
        platform=request.platform,
    )
    return base.Plan(model, request.context, slots, [option], download_gbps=request.download_gbps)


def _stack(request: Request, stack: str, goal: Target | None) -> base.Plan:
    """Evaluate the cluster a stack file deploys, as the program reads it (every serving group
    of it, all slots busy); with a target, the replicas of its group that meet it."""
    given = [flag for flag, value in (
        ("a model", request.model), ("--gguf", request.gguf), ("--size-gb", request.size_gb),
        ("--layers", request.layers), ("--kv-bytes-per-token", request.kv_bytes_per_token),
        ("--instance-type", request.instance_type), ("--count", request.count),
        ("--cloud", request.clouds), ("--region", request.region),
        ("--context", request.context != sizing.DEFAULT_CONTEXT),
        ("--slots", request.slots is not None), ("--platform", request.platform != VM),
    ) if value]  # fmt: skip
    if given:
        raise PlanError("--stack", f"the stack file says what {given[0]} would; leave it out")
    try:  # Its types are the catalog's: the config check refuses any other.
        cfg = files.stack_config(stack)
    except files.StackFileError as error:
        raise PlanError("--stack", str(error)) from None
    except config.ConfigError as error:
        raise PlanError("--stack", f"stacks/Pulumi.{stack}.yaml: {error}") from None
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
                            download_gbps=request.download_gbps,
                            sort=request.ranking())  # fmt: skip
    option = search.evaluate(
        cfg.model,
        instance,
        cfg.worker_count + 1,
        cfg.context_size,
        slots=cfg.slots,
        download_gbps=request.download_gbps,
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
        cfg.model, cfg.context_size, cfg.slots, [option], download_gbps=request.download_gbps
    )


def check(request: Request) -> None:
    """Options that mean nothing without another, or that the platform cannot take, are refused
    rather than ignored."""
    if request.count is not None and not request.instance_type:
        raise PlanError("--count", "goes with --instance-type")
    if request.download_gbps <= 0:
        raise PlanError("--download-gbps", f"must be positive, got {request.download_gbps}")
    if request.platform != VM:
        without = [p for p in request.clouds if "platform" in FACTS[p].refuses]
        if without:
            why = FACTS[without[0]].refuses["platform"]
            raise PlanError("--platform", f"--cloud {without[0]}: {why}; plan with --cloud aws")


def plan(request: Request) -> base.Plan:
    """Every option asked for, ranked (``Request.ranking``); with a target that nothing meets,
    ``TargetUnmet``."""
    check(request)
    goal = request.target()
    if request.stack:
        result = _stack(request, request.stack, goal)
    elif request.instance_type:
        result = _single(request, request.instance_type, describe_model(request), goal)
    elif goal is not None:
        result = target.plan(describe_model(request), request.context, _where(request), goal,
                             slots=request.slots, download_gbps=request.download_gbps,
                             sort=request.ranking(), platform=request.platform)  # fmt: skip
        if not result.options:
            raise TargetUnmet(goal.flag, target.unmet(result))
    else:
        result = search.plan(
            describe_model(request),
            request.context,
            _where(request),
            request.download_gbps,
            sizing.DEFAULT_SLOTS if request.slots is None else request.slots,
            platform=request.platform,
        )
    return result.sorted_by(request.ranking())


def shown(request: Request, result: base.Plan) -> base.Plan:
    """The options the answer shows: with --min-tps and no target, those that decode as fast
    (with a target, --min-tps is each stream's speed and the sizing met it already)."""
    if request.target() is not None or request.min_tps is None:
        return result.only(list(result.options))
    floor = request.min_tps
    return result.only(
        [o for o in result.options if o.decode_tps is not None and o.decode_tps >= floor]
    )


def write_stack(
    stacks_dir: Path,
    name: str,
    result: base.Plan,
    *,
    urls: list[str],
    sums: list[str],
    command: str,
) -> Path:
    """``stacks_dir/Pulumi.NAME.yaml`` for the plan's first option, once the program's own
    check accepts it; ``command`` is how it was asked, for its header."""
    if not result.options:
        raise PlanError("--write-stack", "there is no option to write")
    option = result.options[0]
    if not urls:
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
    if not all(c.isalnum() or c in "-_." for c in name):
        raise PlanError("--write-stack", f"{name!r}: use letters, digits, - _ .")
    settings = report.stack_settings(option, result, urls, sums)
    header = report.stack_header(option, result, command)
    try:
        return files.write_stack_file(stacks_dir, name, settings, option.instance.region, header)
    except config.ConfigError as error:
        raise PlanError("--write-stack", f"the stack would be rejected: {error}") from None
