"""Sizing for a target: how many serving groups (replicas behind a private balancer), of which
shape and how many slots each, serve a number of concurrent streams (``--streams``) or an
aggregate rate of generated tokens (``--aggregate-tps``). Whether replicas or one bigger group
meet it for less is ``infra.planner.verdict``.

A group's nodes decode one after another, so a group's speed is set by its nodes' bandwidth and
compute, not their number; several streams in one group share each read of the weights
(``perf.batch_step``). Replicas decode side by side: each adds its own bandwidth and compute, and
pays for its own weights' memory. Which wins depends on the model, the type and the target.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from infra.catalog import InstanceType
from infra.core import perf, sizing
from infra.core.limits import MAX_REPLICAS, VM
from infra.models import Model
from infra.planner import search
from infra.planner.base import SORTS, Option, Plan, Rejection, Target, TargetUnmet, check_sort
from infra.planner.serve import INTERNET_GBPS


@dataclass(frozen=True)
class Shape:
    """A fixed group to size replicas of (``--instance-type`` with ``--count``, ``--stack``)."""

    count: int | None = None  # None: the fewest nodes that hold the slots
    slots: int | None = None  # None: the planner chooses
    main: InstanceType | None = None
    main_disk_gb: int | None = None
    worker_disk_gb: int = sizing.WORKER_DISK_GB
    disk_throughput_mibps: int | None = None
    platform: str = VM


def default_sort(target: Target) -> str:
    """A rate target fixes the tokens generated, so the cheapest set per hour is the cheapest
    per token of it; for streams, $/Mtok weighs the speed each set gives them for its price."""
    return SORTS[1] if target.aggregate_tps is not None else SORTS[0]


def fewest_replicas(
    group: Option, model: Model, context: int, target: Target, least: int = 1
) -> Option | None:
    """The fewest copies of ``group`` (``least``..MAX_REPLICAS) that meet the target, or None;
    priced only once found."""
    batches: dict[int, perf.Batch | None] = {}
    for replicas in range(least, MAX_REPLICAS + 1):
        loads = target.loads(replicas, group.slots)
        if loads is None:
            continue
        load = search.group_load(group, model, context, loads, batches)
        if target.met(replicas, group.slots, load):
            return search.with_replicas(group, model, context, replicas, loads, load=load)
    return None


def groups(
    model: Model,
    context: int,
    instance: InstanceType,
    target: Target,
    *,
    shape: Shape = Shape(),
    download_gbps: float = INTERNET_GBPS,
) -> list[Option]:
    """One group of ``instance`` per slot count worth trying, each of the fewest nodes that hold
    its slots (or ``shape.count``)."""
    found = []
    for slots in [shape.slots] if shape.slots else target.slot_choices():
        count = shape.count or search.fewest_nodes(model, context, slots, instance)
        if count is None:
            continue
        group = search.evaluate(
            model,
            instance,
            count,
            context,
            slots=slots,
            download_gbps=download_gbps,
            main=shape.main,
            main_disk_gb=shape.main_disk_gb,
            worker_disk_gb=shape.worker_disk_gb,
            disk_throughput_mibps=shape.disk_throughput_mibps,
            platform=shape.platform,
        )
        if group.fits:
            found.append(group)
    return found


def candidates(made: Sequence[Option], model: Model, context: int, target: Target) -> list[Option]:
    """Every set of the ``made`` groups (``groups``) that meets the target: per group, the
    fewest replicas that do, and where one group does, the fewest replicas above one too (the
    verdict's other side when the slots are fixed)."""
    found = []
    for group in made:
        option = fewest_replicas(group, model, context, target)
        if option is not None and option.replicas == 1:
            found.append(option)
            option = fewest_replicas(group, model, context, target, least=2)
        if option is not None:
            found.append(option)
    return found


def ranked_first(options: Sequence[Option], sort: str) -> Option | None:
    """The first of ``options`` by ``sort`` (``Option.sort_key``), or None."""
    return min(options, key=lambda o: o.sort_key(sort), default=None)


def reach(made: Sequence[Option], model: Model, context: int, target: Target) -> Option | None:
    """The most ``MAX_REPLICAS`` groups of this type reach toward the target: the highest rate,
    or for streams the fastest stream; None when no group holds the model or has a speed."""
    best: Option | None = None
    # Streams are fastest spread over the most groups, one stream each at most.
    replicas = min(MAX_REPLICAS, target.streams or MAX_REPLICAS)
    for group in made:
        loads = target.loads(replicas, group.slots)
        if loads is None:
            continue
        option = search.with_replicas(group, model, context, replicas, loads)
        if option.load is None:
            continue
        key: Callable[[Option], float] = (
            (lambda o: o.load.aggregate_tps if o.load else 0.0)
            if target.streams is None
            else (lambda o: o.load.stream_tps if o.load else 0.0)
        )
        if best is None or key(option) > key(best):
            best = option
    return best


def shortfall(
    made: Sequence[Option],
    model: Model,
    context: int,
    instance: InstanceType,
    target: Target,
    *,
    shape: Shape = Shape(),
) -> tuple[str, float]:
    """Why no set of this type's ``made`` groups meets the target, and the nearest it comes
    (the rate, or for streams each stream's speed, of ``MAX_REPLICAS`` groups; 0 when there is
    none)."""
    slots = shape.slots or 1
    if shape.count is None and search.fewest_nodes(model, context, slots, instance) is None:
        return search.rejection_reason(model, context, slots, instance), 0.0
    if not made:
        held = f"{shape.count} x {instance.name}"
        return f"{held} does not hold the model at any slot count tried", 0.0
    best = reach(made, model, context, target)
    if best is None or best.load is None:
        if target.streams is not None and target.min_stream_tps is None:
            return f"{MAX_REPLICAS} groups of {slots} slot(s) serve too few streams", 0.0
        reason = search.evaluate(model, instance, 1, context).speed_unknown_reason()
        return reason or "no speed is predicted", 0.0
    each = f"{best.slots} slot{'s' if best.slots > 1 else ''} each"
    if target.streams is None:
        rate = best.load.aggregate_tps
        return f"{best.shape} with {each} reach {rate:,.1f} tok/s at most", rate
    speed = best.load.stream_tps
    return (
        f"at {target.streams} streams each stream gets {speed:.2f} tok/s at most "
        f"({best.shape}, {each})",
        speed,
    )


def plan(
    model: Model,
    context: int,
    where: Sequence[tuple[str, str]],
    target: Target,
    *,
    slots: int | None = None,
    download_gbps: float = INTERNET_GBPS,
    sort: str | None = None,
    platform: str = VM,
) -> Plan:
    """For each (provider, region) and Arm type, the best set that meets the target (by
    ``sort``), and the best of the other kind (replicas against one group) for ``verdict``."""
    search.check_context(model, context)
    if slots is not None:
        search.check_slots(slots)
    sort = sort or default_sort(target)
    check_sort(sort)
    options: list[Option] = []
    alternatives: list[Option] = []
    short: list[tuple[float, Rejection]] = []
    shape = Shape(slots=slots, platform=platform)
    for provider, region in where:
        for instance in search.arm_types(provider, region):
            made = groups(
                model, context, instance, target, shape=shape, download_gbps=download_gbps
            )
            found = candidates(made, model, context, target)
            best = ranked_first(found, sort)
            if best is None:
                reason, nearest = shortfall(made, model, context, instance, target, shape=shape)
                short.append((nearest, Rejection(instance, reason)))
                continue
            options.append(best)
            other = ranked_first(
                [o for o in found if (o.replicas > 1) != (best.replicas > 1)], sort
            )
            if other is not None:
                alternatives.append(other)
    return Plan(
        model,
        context,
        slots or sizing.DEFAULT_SLOTS,
        options,
        # The types that come nearest first: what the planner names when none meets it.
        [r for _, r in sorted(short, key=lambda pair: -pair[0])],
        download_gbps,
        target=target,
        alternatives=alternatives,
    ).sorted_by(sort)


def sized(
    model: Model,
    context: int,
    instance: InstanceType,
    target: Target,
    shape: Shape,
    *,
    download_gbps: float = INTERNET_GBPS,
    sort: str | None = None,
) -> Plan:
    """One type (``--instance-type``) or one fixed group (``--stack``): the best set of it that
    meets the target; an error naming the target's flag when none does."""
    sort = sort or default_sort(target)
    made = groups(model, context, instance, target, shape=shape, download_gbps=download_gbps)
    found = candidates(made, model, context, target)
    best = ranked_first(found, sort)
    if best is None:
        reason, _ = shortfall(made, model, context, instance, target, shape=shape)
        named = f"{shape.count} x {instance.name}" if shape.count else instance.name
        if shape.main is not None and shape.count and shape.main != instance:
            named = f"1 x {shape.main.name} + {shape.count - 1} x {instance.name}"
        raise TargetUnmet(
            target.flag,
            f"no set of up to {MAX_REPLICAS} replicas of {named} serves {target.describe()}: "
            f"{reason}",
        )
    other = ranked_first([o for o in found if (o.replicas > 1) != (best.replicas > 1)], sort)
    return Plan(
        model,
        context,
        shape.slots or sizing.DEFAULT_SLOTS,
        [best],
        download_gbps=download_gbps,
        sort=sort,
        target=target,
        alternatives=[other] if other else [],
    )


def unmet(plan: Plan) -> str:
    """Why a target plan has no option: the nearest any type comes."""
    target = plan.target
    if target is None:
        raise ValueError("the plan has no target")
    nearest = "; ".join(
        f"{r.instance.provider} {r.instance.name}: {r.reason}" for r in plan.rejected[:3]
    )
    return (
        f"no cluster in the catalog serves {target.describe()} within {MAX_REPLICAS} "
        f"replicas" + (f". Nearest: {nearest}" if nearest else "")
    )


def batching_basis() -> str:
    """How a group's throughput at several streams is predicted, for the assumptions."""
    return (
        "each decode step reads a node's weights once for all its streams and each stream's "
        f"KV cache at {perf.KV_FILL_FRACTION:.0%} of its context, and adds the arithmetic of "
        "every stream beyond the first at the node's compute rate, "
        f"{perf.overlap():.0%} of the shorter of the two hidden under the other (perf.step, held "
        f"to {perf.BATCHED_RUNS[0].source}); the compute rate is "
        f"{perf.AXION_PROMPT.label} ({perf.AXION_PROMPT.prompt_tps} tok/s, "
        f"{perf.AXION_PROMPT.source}), scaled by its own growth with threads, on RPC workers "
        f"that do not repack 1/{perf.plain_slowdown():.1f} of it ({perf.RPC_PROMPT.source}); "
        + "; ".join(f"{family}: {basis}" for family, basis in perf.COMPUTE_BASIS.items())
        + f"; other CPUs and models without a parameter count: {perf.NO_BATCHING_GAIN} (the "
        "streams share one stream's speed); a MoE's streams are assumed to share no expert; "
        "a balancer spreads streams evenly over the groups"
    )
