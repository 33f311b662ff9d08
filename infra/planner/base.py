"""The planner's vocabulary, below its search and its targets: an ``Option`` (one cluster,
evaluated), a ``Plan`` (the ranked options), a ``Target`` (what a set must serve) and the
planner's ``PlanError``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from infra.catalog import InstanceType
from infra.core import costs, perf, sizing
from infra.core.errors import SettingError
from infra.core.limits import KUBERNETES, MAX_REPLICAS, VM
from infra.core.placement import Placement
from infra.models import Model
from infra.planner.serve import INTERNET_GBPS, ServeTime

# How options are ranked; the first is the default. A provider's pick is its first option.
SORTS = ("usd-per-mtok", "usd-per-hour", "tps")


# Slot counts tried per group for an aggregate rate: every count up to 8, then coarser steps
# (past a few slots a group is bound by compute, and more slots only cost KV memory).
AGGREGATE_SLOT_CHOICES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64)


class PlanError(SettingError):
    """Planner input that cannot work; names the option to fix."""


class TargetUnmet(PlanError):
    """No set within the replica limit meets the target: the planner exits 1, as when nothing
    meets --min-tps."""


def check_sort(by: str) -> None:
    if by not in SORTS:
        raise PlanError("--sort", f"{by!r} is not one of {', '.join(SORTS)}")


@dataclass(frozen=True)
class Option:
    """One cluster: ``count`` nodes of ``instance`` (the main node may be another type,
    ``main``), evaluated for a model and context; or, with ``replicas`` > 1, that many such
    serving groups behind a private balancer. ``cost`` and ``tps`` are the whole set's."""

    instance: InstanceType
    count: int
    placement: Placement
    cost: costs.HourlyCost
    decode_tps: float | None
    serve: Mapping[str, ServeTime] = field(compare=False)  # by download path (PATHS)
    download_usd: float | None
    main_disk_gb: int
    worker_disk_gb: int
    main: InstanceType | None = None  # None: the main node is an ``instance`` too
    slots: int = sizing.DEFAULT_SLOTS  # requests each group serves at once
    replicas: int = 1  # serving groups, each ``count`` nodes
    # Each group's streams at a target load (None: no target; ``decode_tps`` is the speed).
    load: perf.Load | None = None
    # One group as billed (its nodes and disks); ``cost`` is every group's, one NAT and the
    # balancer.
    priced: tuple[costs.PricedNode, ...] = field(default=(), compare=False, repr=False)
    # "kubernetes": the nodes in an EKS cluster (its control plane priced, no balancer node).
    platform: str = VM
    # One group computing a prompt (``perf.prompt``: its rate and the time to its first token);
    # None where a compute rate is unknown.
    prompt: perf.Prompt | None = field(default=None, compare=False)
    workers_repack: bool = False  # whether its RPC workers repack (patch 0005 in the build)
    # After a lost worker, by how the group loads again (local_load.HEAL_PATHS); none alone.
    heal: Mapping[str, ServeTime] = field(default_factory=dict, compare=False)

    @property
    def kubernetes(self) -> bool:
        return self.platform == KUBERNETES

    @property
    def main_instance(self) -> InstanceType:
        return self.main or self.instance

    @property
    def provider(self) -> str:
        return self.instance.provider

    @property
    def name(self) -> str:
        """The cluster's types: ``r8g.8xlarge``, or ``r8g.4xlarge + r8g.8xlarge`` when the main
        node is another type."""
        if self.main is None or self.main == self.instance:
            return self.instance.name
        return f"{self.main.name} + {self.instance.name}"

    @property
    def group_shape(self) -> str:
        """``3 x r8g.8xlarge``, or ``1 x r8g.4xlarge + 2 x r8g.8xlarge`` with another main."""
        if self.main is None or self.main == self.instance:
            return f"{self.count} x {self.instance.name}"
        return f"1 x {self.main.name} + {self.workers} x {self.instance.name}"

    @property
    def shape(self) -> str:
        """The group's shape, or ``2 groups of 3 x r8g.8xlarge`` with replicas."""
        if self.replicas == 1:
            return self.group_shape
        return f"{self.replicas} groups of {self.group_shape}"

    @property
    def nodes(self) -> int:
        """Every node of every group."""
        return self.count * self.replicas

    @property
    def tps(self) -> float | None:
        """What the option generates: every stream of every group at the target load, or one
        stream's decode speed without a target."""
        if self.load is not None:
            return self.load.aggregate_tps
        return self.decode_tps

    @property
    def stream_tps(self) -> float | None:
        """Each stream's speed: at the target load when there is one."""
        if self.load is not None:
            return self.load.stream_tps
        return self.decode_tps

    @property
    def group_cost(self) -> costs.HourlyCost:
        """One serving group alone: its nodes, its own NAT and no balancer."""
        return costs.hourly_cost(self.provider, self.priced, control_plane=self.kubernetes)

    @property
    def balancer_usd(self) -> float | None:
        return self.cost.balancer

    @property
    def fits(self) -> bool:
        return self.placement.fits

    @property
    def need_bytes(self) -> int:
        """Memory the busiest node needs (weights, KV cache, buffers)."""
        return self.placement.worst.need_bytes

    @property
    def usable_bytes(self) -> int:
        return sizing.usable_memory_bytes(self.instance)

    @property
    def workers(self) -> int:
        return self.count - 1

    @property
    def needs_rpc(self) -> bool:
        return self.count > 1

    @property
    def hourly_usd(self) -> float | None:
        return self.cost.total

    @property
    def price_is_partial(self) -> bool:
        """A total that leaves out a part the catalog cannot price (for example a disk)."""
        return self.hourly_usd is not None and bool(self.cost.unpriced)

    @property
    def spot_instances_usd(self) -> float | None:
        """The nodes at their spot price, where every one has one: instances only (NAT and
        disks stay on-demand), shown apart from ``hourly_usd``, never added to it."""
        nodes = [self.main_instance] + [self.instance] * self.workers
        prices = [n.spot_hourly_usd for n in nodes]
        if any(p is None for p in prices):
            return None
        return round(sum(p for p in prices if p is not None) * self.replicas, 5)

    @property
    def spot_price_date(self) -> str:
        """The oldest of the nodes' spot price dates."""
        return min(self.main_instance.spot_price_date, self.instance.spot_price_date)

    @property
    def usd_per_million_tokens(self) -> float | None:
        if self.hourly_usd is None or not self.tps:
            return None
        return round(self.hourly_usd / (self.tps * 3600) * 1e6, 2)

    def speed_unknown_reason(self) -> str | None:
        """Why no speed is predicted, or None when one is."""
        if self.decode_tps is not None:
            return None
        missing = sorted({t.cpu_family for t in (self.main_instance, self.instance)
                          if perf.node_bandwidth_gbps(t) is None})  # fmt: skip
        return f"speed unknown: no published memory bandwidth for {', '.join(missing)}"

    def sort_key(self, by: str = SORTS[0]) -> tuple[int, float, int]:
        """Options that can be compared on ``by`` come first, fully priced before partially
        priced; those that cannot (an unknown speed or price) follow, ranked by what is known."""
        price = self.hourly_usd
        size = self.nodes * self.instance.vcpus
        if by == "tps":
            if self.tps is not None:
                return (0, -self.tps, size)
            # Without a speed: after every row with one, the cheapest first.
            return (1, price if price is not None else float("inf"), size)
        if by == "usd-per-hour" or self.usd_per_million_tokens is None:
            # Without a speed, $/Mtok cannot rank the option: it follows every one that has it.
            tier = 0 if by == "usd-per-hour" else 2
            if price is None:
                return (tier + 2, 0.0, size)
            return (tier + (1 if self.price_is_partial else 0), price, size)
        return (1 if self.price_is_partial else 0, self.usd_per_million_tokens, size)


@dataclass(frozen=True)
class Rejection:
    instance: InstanceType
    reason: str


@dataclass(frozen=True)
class Plan:
    model: Model
    context: int
    slots: int
    options: list[Option]  # ranked by ``sort``; the first per provider is its pick
    rejected: list[Rejection] = field(default_factory=list)
    download_gbps: float = INTERNET_GBPS  # the internet path's download rate
    sort: str = SORTS[0]
    # A target of streams or tokens/s (``infra.planner.target.Target``): each option is then
    # sized to meet it. ``alternatives``: per type, the best option of the other kind (one
    # group where the option has replicas, replicas where it has one group), for the verdict.
    target: Target | None = None
    alternatives: list[Option] = field(default_factory=list)

    def recommendation(self, provider: str) -> Option | None:
        return next((o for o in self.options if o.provider == provider and o.fits), None)

    def picks(self) -> list[Option]:
        """Each provider's pick, in the order of ``sort``: a cluster that does not hold the model
        (one evaluated as asked, with ``--instance-type``) is nobody's pick."""
        seen: dict[str, Option] = {}
        for option in self.options:
            if option.fits:
                seen.setdefault(option.provider, option)
        return list(seen.values())

    def only(self, options: Sequence[Option]) -> Plan:
        """This plan with only ``options`` (a filter's survivors): picks come from them."""
        return replace(self, options=list(options))

    def sorted_by(self, by: str) -> Plan:
        check_sort(by)
        return replace(self, options=sorted(self.options, key=lambda o: o.sort_key(by)), sort=by)


@dataclass(frozen=True)
class Target:
    """What the set must serve: ``streams`` at once or ``aggregate_tps`` tokens/s in all, and,
    with ``min_stream_tps`` (``--min-tps``), each stream at least that fast when all are busy."""

    streams: int | None = None
    aggregate_tps: float | None = None
    min_stream_tps: float | None = None

    def __post_init__(self) -> None:
        if (self.streams is None) == (self.aggregate_tps is None):
            raise PlanError("--streams", "give one target: --streams N or --aggregate-tps X")
        if self.streams is not None:
            most = MAX_REPLICAS * sizing.MAX_SLOTS
            if self.streams < 1:
                raise PlanError("--streams", f"must be at least 1, got {self.streams}")
            if self.streams > most:
                raise TargetUnmet(
                    "--streams",
                    f"{self.streams} is more than {MAX_REPLICAS} replicas of {sizing.MAX_SLOTS} "
                    f"slots serve ({most}); plan for at most {most} and run several stacks",
                )
        if self.aggregate_tps is not None and not (
            math.isfinite(self.aggregate_tps) and self.aggregate_tps > 0
        ):
            raise PlanError(
                "--aggregate-tps",
                f"must be a positive number of tokens/s, got {self.aggregate_tps}",
            )
        if self.min_stream_tps is not None and not self.min_stream_tps > 0:
            raise PlanError("--min-tps", f"must be positive, got {self.min_stream_tps}")

    @property
    def flag(self) -> str:
        return "--streams" if self.streams is not None else "--aggregate-tps"

    def describe(self) -> str:
        text = (
            f"{self.streams} concurrent stream{'s' if self.streams != 1 else ''}"
            if self.streams is not None
            else f"{self.aggregate_tps:g} tok/s in all"
        )
        if self.min_stream_tps is not None:
            text += f", each stream at least {self.min_stream_tps:g} tok/s"
        return text

    def loads(self, replicas: int, slots: int) -> tuple[int, ...] | None:
        """Each group's streams at the target's load: the streams spread evenly (a balancer's
        ideal), or every slot busy for a rate; None when the groups have too few slots."""
        if self.streams is None:
            return (slots,) * replicas
        if replicas * slots < self.streams:
            return None
        base, extra = divmod(self.streams, replicas)
        if base == 0:  # more groups than streams: an idle group helps no one
            return None
        return tuple(base + (1 if g < extra else 0) for g in range(replicas))

    def slot_choices(self) -> list[int]:
        if self.streams is None:
            return [s for s in AGGREGATE_SLOT_CHOICES if s <= sizing.MAX_SLOTS]
        fewest = {math.ceil(self.streams / r) for r in range(1, MAX_REPLICAS + 1)}
        return sorted(s for s in fewest if s <= sizing.MAX_SLOTS)

    def met(self, replicas: int, slots: int, load: perf.Load | None) -> bool:
        """Whether ``replicas`` groups of ``slots`` slots, at ``load``, meet the target."""
        if self.min_stream_tps is not None and (
            load is None or load.stream_tps < self.min_stream_tps
        ):
            return False
        if self.streams is not None:
            return replicas * slots >= self.streams
        return load is not None and load.aggregate_tps >= (self.aggregate_tps or 0.0)

    def met_by(self, option: Option) -> bool:
        return self.met(option.replicas, option.slots, option.load)

    def to_json(self) -> dict[str, Any]:
        return {
            "streams": self.streams,
            "aggregateTps": self.aggregate_tps,
            "minStreamTps": self.min_stream_tps,
        }
