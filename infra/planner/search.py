"""The planner's search: for every Arm type, the smallest homogeneous cluster that holds a model,
with its predicted decode speed, time to serve and cost, ranked as the user asks.

Pure functions over the catalog: nothing here touches the network or a cloud account. A cluster
is ``count`` nodes of one type: a main node and ``count - 1`` RPC workers, all holding layers
(``infra.core.placement``), or, when the model fits on one node, that node alone (no RPC, which
would only add latency). With a target of streams or tokens/s (``infra.planner.target``), an option
is a set of such clusters, replicas behind one private balancer, priced and measured as a whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import cache, partial
from pathlib import Path

from infra import catalog
from infra.boot import patches
from infra.catalog import InstanceType
from infra.clouds import FACTS
from infra.core import costs, perf, pins, placement, sizing
from infra.core.limits import KUBERNETES, MAX_NODES, MAX_REPLICAS, MAX_WORKERS, VM
from infra.models import Model
from infra.planner import local_load
from infra.planner.base import SORTS, Option, Plan, PlanError, Rejection, check_sort
from infra.planner.serve import INTERNET_GBPS, PATHS, Timelines, time_to_serve

DEFAULT_CONTEXT = sizing.DEFAULT_CONTEXT
# The build's patch that makes RPC workers repack their weights as the main node does.
WORKER_REPACK_PATCH = "rpc-worker-repack"


@cache
def workers_repack(
    commit: str = pins.LLAMA_CPP_COMMIT, directory: Path = patches.PATCHES_DIR
) -> bool:
    """Whether the pinned build's RPC workers repack: its patch set has ``WORKER_REPACK_PATCH``
    (switched off on a node with GGML_RPC_REPACK=0). Upstream's do not."""
    return any(p.name.split("-", 1)[1].removesuffix(".patch") == WORKER_REPACK_PATCH
               for p in patches.patch_set(commit, directory))  # fmt: skip


def with_prompt(option: Option, model: Model, tokens: int) -> Option:
    """``option`` with its prompt of ``tokens`` computed (``perf.prompt``)."""
    if tokens < 1:
        raise PlanError("--prompt-tokens", f"must be at least 1, got {tokens}")
    nodes = [option.main_instance] + [option.instance] * option.workers
    found = perf.prompt(model, nodes, option.placement, tokens,
                        workers_repack=option.workers_repack)  # fmt: skip
    return replace(option, prompt=found)


def evaluate(
    model: Model,
    instance: InstanceType,
    count: int,
    context: int,
    *,
    slots: int = sizing.DEFAULT_SLOTS,
    download_gbps: float = INTERNET_GBPS,
    main: InstanceType | None = None,
    main_disk_gb: int | None = None,
    worker_disk_gb: int = sizing.WORKER_DISK_GB,
    disk_throughput_mibps: int | None = None,
    replicas: int = 1,
    loads: Sequence[int] = (),
    platform: str = VM,
) -> Option:
    """One cluster of ``count`` nodes (a ``main`` node, by default an ``instance`` too, and
    ``count - 1`` workers of ``instance``): where the layers go, whether they fit, what it
    costs, its speed. The disks default to what a stack gets by default. With ``replicas`` and
    ``loads`` (each group's streams at once), the set of groups (``with_replicas``)."""
    check_count(count)
    kubernetes = platform == KUBERNETES
    main_type = main or instance
    workers = count - 1
    nodes = [main_type] + [instance] * workers
    layout = placement.place(model, context, slots, [sizing.usable_memory_bytes(n) for n in nodes])
    main_disk = main_disk_gb or sizing.default_main_disk_gb(model.size_bytes)
    throughput = disk_throughput_mibps or sizing.main_disk_throughput_mibps(
        instance.provider, model.size_bytes, main_type, boot_disk=kubernetes
    )
    priced = costs.cluster_nodes(
        main_type,
        instance,
        workers,
        main_disk_gb=main_disk,
        worker_disk_gb=worker_disk_gb,
        main_disk_throughput_mibps=throughput,
        kubernetes=kubernetes,
    )
    disk_mibps = sizing.main_disk_read_mibps(main_type, main_disk, throughput, model.size_bytes)
    kv_tokens = int(context * perf.KV_FILL_FRACTION)
    repack = workers_repack()
    group = local_load.Group(model, main_type, instance, layout, disk_mibps)
    option = Option(
        instance=instance,
        count=count,
        placement=layout,
        cost=costs.hourly_cost(instance.provider, priced, control_plane=kubernetes),
        decode_tps=perf.decode_tps(model, nodes, layout, kv_tokens),
        serve=Timelines(
            {
                path: partial(
                    time_to_serve,
                    model,
                    main_type,
                    layout,
                    disk_mibps,
                    path=path,
                    internet_gbps=download_gbps,
                )
                for path in PATHS
            }
            | {
                local_load.PATH: partial(
                    local_load.time_to_serve, model, main_type, instance, layout, disk_mibps
                )
            }
        ),
        heal=Timelines(
            {
                path: partial(local_load.time_to_heal, group, path)
                for path in (local_load.HEAL_PATHS if workers else ())
            }
        ),
        download_usd=costs.download_usd(instance.provider, model.size_bytes),
        main_disk_gb=main_disk,
        worker_disk_gb=worker_disk_gb,
        main=main if main is not None and main != instance else None,
        slots=slots,
        priced=tuple(priced),
        platform=platform,
        prompt=perf.prompt(model, nodes, layout, workers_repack=repack),
        workers_repack=repack,
    )
    if replicas == 1 and not loads:
        return option
    return with_replicas(option, model, context, replicas, loads)


def group_load(
    option: Option,
    model: Model,
    context: int,
    loads: Sequence[int],
    batches: dict[int, perf.Batch | None] | None = None,
) -> perf.Load | None:
    """``option``'s group, copied once per entry of ``loads``, each decoding that many streams
    at once; None when its speed is unknown. ``batches`` keeps each batch size's step for the
    next call on the same group."""
    if any(not 1 <= b <= option.slots for b in loads):
        raise ValueError(f"a group's load {list(loads)} exceeds its {option.slots} slots")
    batches = {} if batches is None else batches
    nodes = [option.main_instance] + [option.instance] * option.workers
    kv_tokens = int(context * perf.KV_FILL_FRACTION)
    for b in set(loads) - set(batches):
        batches[b] = perf.batch_step(model, nodes, option.placement, kv_tokens, b,
                                     workers_repack=option.workers_repack)  # fmt: skip
    known = [batches[b] for b in loads]
    if not known or any(b is None for b in known):
        return None
    return perf.Load(tuple(b for b in known if b is not None))


def with_replicas(
    option: Option,
    model: Model,
    context: int,
    replicas: int,
    loads: Sequence[int],
    *,
    load: perf.Load | None = None,
) -> Option:
    """``option``'s group ``replicas`` times behind a private balancer: priced as the stack
    prices it (every group's nodes, one NAT, the balancer when there is more than one group),
    with each group decoding ``loads[g]`` streams at once (none: no ``load``; ``load``: already
    worked out by ``group_load``)."""
    if not 1 <= replicas <= MAX_REPLICAS:
        raise PlanError("replicas", f"{replicas} is outside 1-{MAX_REPLICAS} serving groups")
    if loads and len(loads) != replicas:
        raise ValueError(f"{len(loads)} loads for {replicas} groups")
    if load is None and loads:
        load = group_load(option, model, context, loads)
    download = option.download_usd
    return replace(
        option,
        replicas=replicas,
        load=load,
        cost=costs.hourly_cost(
            option.provider,
            list(option.priced) * replicas,
            # On Kubernetes, HAProxy runs as pods: no balancer node.
            balancer=replicas > 1 and not option.kubernetes,
            control_plane=option.kubernetes,
        ),
        # Every group's main node downloads the model.
        download_usd=None if download is None else round(download * replicas, 2),
    )


def fewest_nodes(model: Model, context: int, slots: int, instance: InstanceType) -> int | None:
    """The smallest cluster of this type that holds the model, every node holding layers; one
    node when it fits alone, None when even the largest cluster does not."""
    usable = sizing.usable_memory_bytes(instance)
    workers = placement.fewest_workers(
        model, context, slots, main_usable=usable, worker_usable=usable, most=MAX_WORKERS
    )
    return None if workers is None else workers + 1


def rejection_reason(model: Model, context: int, slots: int, instance: InstanceType) -> str:
    usable = sizing.usable_memory_bytes(instance)
    worst = placement.place(model, context, slots, [usable] * MAX_NODES).worst
    return (
        f"too small: even {MAX_NODES} nodes ({MAX_WORKERS} workers) would need "
        f"{worst.need_bytes / 1024**3:.1f} GiB on the busiest and one has "
        f"{usable / 1024**3:.1f} GiB usable"
    )


def check_count(count: int) -> None:
    if not 1 <= count <= MAX_NODES:
        raise PlanError(
            "--count",
            f"{count} is outside 1-{MAX_NODES} (a main node and up to {MAX_WORKERS} "
            "RPC workers, llama.cpp's limit)",
        )


def check_context(model: Model, context: int) -> None:
    if context < 1:
        raise PlanError("--context", f"must be a positive number of tokens, got {context}")
    if model.context_length is not None and context > model.context_length:
        raise PlanError(
            "--context",
            f"{context} tokens is more than {model.name} supports ({model.context_length}); "
            f"use at most {model.context_length}",
        )


def check_slots(slots: int) -> None:
    if not 1 <= slots <= sizing.MAX_SLOTS:
        raise PlanError(
            "--slots", f"{slots} is outside 1-{sizing.MAX_SLOTS} (requests served at once)"
        )


def regions(provider: str) -> list[str]:
    return sorted({e.region for e in catalog.load() if e.provider == provider})


def home_regions(providers: list[str] | None = None) -> list[tuple[str, str]]:
    """Each cloud's home region (``CloudFacts.home_region``, else its first in the catalog):
    where a plan looks unless given regions."""
    found = []
    for provider in providers or catalog.providers():
        known = regions(provider)
        home = FACTS[provider].home_region if provider in FACTS else ""
        found.append((provider, home if home in known else known[0]))
    return found


def arm_types(provider: str, region: str) -> list[InstanceType]:
    """The Arm types the catalog has for this provider and region; an error if there are none."""
    known_providers = catalog.providers()
    if provider not in known_providers:
        raise PlanError("--cloud", f"{provider!r} is not one of {', '.join(known_providers)}")
    found = [t for t in catalog.types_in(provider, region) if t.arch == "arm64"]
    if not found:
        raise PlanError(
            "--region",
            f"the catalog has no Arm instance types for {provider} in {region!r}; "
            f"known regions: {', '.join(regions(provider))}. Add the region with "
            f"`lrc catalog refresh --cloud {provider} --region {region}`",
        )
    return found


def plan(
    model: Model,
    context: int = DEFAULT_CONTEXT,
    where: Sequence[tuple[str, str]] | None = None,
    download_gbps: float = INTERNET_GBPS,
    slots: int = sizing.DEFAULT_SLOTS,
    *,
    sort: str = SORTS[0],
    platform: str = VM,
) -> Plan:
    """For each (provider, region) (by default each cloud's home region), every Arm type's
    smallest cluster that holds the model, ranked by ``sort`` (``Option.sort_key``)."""
    check_context(model, context)
    check_slots(slots)
    check_sort(sort)
    if where is None:
        where = home_regions()
    options: list[Option] = []
    rejected: list[Rejection] = []
    for provider, region in where:
        for instance in arm_types(provider, region):
            count = fewest_nodes(model, context, slots, instance)
            if count is None:
                reason = rejection_reason(model, context, slots, instance)
                rejected.append(Rejection(instance, reason))
                continue
            options.append(
                evaluate(
                    model,
                    instance,
                    count,
                    context,
                    slots=slots,
                    download_gbps=download_gbps,
                    platform=platform,
                )
            )
    return Plan(model, context, slots, options, rejected, download_gbps).sorted_by(sort)
