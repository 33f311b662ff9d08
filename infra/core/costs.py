"""What a cluster costs per hour: its instances, the NAT for its egress, its disks, and the
balancer node in front of its serving groups when it has more than one; on Kubernetes, the
control plane.

One function for the stack's ``hourlyCostUsd`` output and for the planner, so both give the same
figure for the same cluster. Prices come from the catalog (instances.csv, services.csv: each with
its source and date); what each cloud charges for (the disk and NAT models) from its facts. A
price the catalog does not have is left out of the total and named in ``unpriced``, never
guessed; without an instance price there is no total at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from infra import catalog
from infra.catalog import InstanceType, service_price
from infra.clouds import FACTS
from infra.core.sizing import WORKER_DISK_GB

HOURS_PER_MONTH = 730
# What no figure here includes: it depends on use, not on the cluster's shape.
NOT_COUNTED = "data transfer, flow-log storage, and an Azure Bastion"
# The managed Kubernetes control plane's row in services.csv (per cluster-hour).
CONTROL_PLANE_ITEM = "kubernetes_control_plane_hour"
# How ``unpriced`` names a balancer node whose instance type the catalog does not price.
BALANCER_NODE = "the balancer node"


@dataclass(frozen=True)
class PricedNode:
    """One VM as it is billed: its type and its boot disk."""

    instance: InstanceType
    disk_gb: int
    disk_throughput_mibps: int | None = None  # None: the disk type's baseline
    # A boot disk beside the model's, at the baseline (a main node with a model disk); 0: none.
    system_disk_gb: int = 0


@dataclass(frozen=True)
class HourlyCost:
    instances: float | None
    nat: float | None
    disks: float | None
    unpriced: tuple[str, ...]  # parts whose price the catalog lacks
    sources: tuple[str, ...]  # where each price came from, and its date
    instance_counts: tuple[tuple[str, int, float | None], ...]  # (type, count, $/h each)
    # The balancer node: its instance and, where the disk is priced, its system disk. None: no
    # balancer, or its instance price is unknown (unpriced).
    balancer: float | None = None
    # The balancer node's system disk alone: what it costs once stopped (its spend guard stops
    # it with the groups). None: no balancer, or the disk is not priced.
    balancer_disk: float | None = None
    # The NAT with no node running (the gateway and its address go on; GCP's per-VM part stops).
    nat_stopped: float | None = None
    # A managed Kubernetes control plane (EKS), billed while the cluster exists. None: none.
    control_plane: float | None = None
    # Whether the disks outlive stopped nodes: a VM's do; a node group scaled to zero
    # terminates its nodes, disks and all.
    disks_kept_stopped: bool = True

    @property
    def stopped(self) -> float | None:
        """What the cluster costs an hour with every instance stopped (AWS stop, GCP stop,
        Azure deallocate), the balancer node's too: its disks (the balancer node's among them)
        and its NAT, which go on; on Kubernetes, with its node groups scaled to zero: the NAT
        and the control plane. Parts the catalog does not price are left out, as in ``total``
        (``unpriced`` names them); None when no part is priced."""
        disks = self.disks if self.disks_kept_stopped else None
        kept = (self.nat_stopped, disks, self.balancer_disk, self.control_plane)
        parts = [p for p in kept if p is not None]
        return round(sum(parts), 5) if parts else None

    @property
    def total(self) -> float | None:
        if self.instances is None:
            return None
        parts = (self.instances, self.nat, self.disks, self.balancer, self.control_plane)
        return round(sum(part or 0.0 for part in parts), 5)

    @property
    def basis(self) -> str:
        """The figure's parts in words, for people reading an output."""
        if self.instances is None:
            return f"unknown: no catalog price for {', '.join(self.unpriced)}"
        nodes = " + ".join(
            f"{count} x {name} ${price}/h" for name, count, price in self.instance_counts
        )
        parts = [f"instances {nodes}"]
        if self.nat is not None:
            parts.append(f"NAT ${self.nat}/h")
        if self.disks is not None:
            parts.append(f"disks ${self.disks}/h")
        if self.balancer is not None:
            parts.append(f"balancer ${self.balancer}/h")
        if self.control_plane is not None:
            parts.append(f"Kubernetes control plane ${self.control_plane}/h")
        if self.stopped is not None:
            parts.append(f"with every instance stopped ${self.stopped}/h")
        text = "; ".join(parts)
        if self.unpriced:
            text += f"; without {', '.join(self.unpriced)} (no catalog price)"
        return f"{text}; not counted: {NOT_COUNTED}; {'; '.join(self.sources)}"


def kubernetes_worker_disk(
    main: InstanceType,
    worker: InstanceType,
    main_disk_gb: int,
    worker_disk_gb: int,
    main_throughput_mibps: int | None,
) -> tuple[int, int | None]:
    """On Kubernetes, a worker node's disk and its throughput (None: the baseline): where
    workers share the main node's type they share its node group, and the leader may land on any
    of its nodes, so each has the main node's disk."""
    if main.name == worker.name:
        return max(main_disk_gb, worker_disk_gb), main_throughput_mibps
    return worker_disk_gb, None


def cluster_nodes(
    main: InstanceType,
    worker: InstanceType,
    workers: int,
    *,
    main_disk_gb: int,
    worker_disk_gb: int,
    main_disk_throughput_mibps: int | None,
    kubernetes: bool = False,
) -> list[PricedNode]:
    """The main node (whose disk the model loads from) and each worker, as the stack creates
    them: workers' disks at the type's baseline throughput, as is a main node's boot disk where
    its model has a disk of its own. On Kubernetes (``kubernetes``) the model is on the node's
    one disk, and workers of the main node's type have its disk."""
    own_disk = FACTS[main.provider].model_disk and not kubernetes
    system_gb = WORKER_DISK_GB if own_disk else 0
    worker_disk: tuple[int, int | None] = (worker_disk_gb, None)
    if kubernetes:
        worker_disk = kubernetes_worker_disk(
            main, worker, main_disk_gb, worker_disk_gb, main_disk_throughput_mibps
        )
    return [PricedNode(main, main_disk_gb, main_disk_throughput_mibps, system_gb)] + [
        PricedNode(worker, *worker_disk)
    ] * workers


def _priced(provider: str, usage: dict[str, float]) -> float | None:
    total = 0.0
    for item, quantity in usage.items():
        price = service_price(provider, item).usd
        if price is None:
            if quantity:
                return None
            continue
        total += price * quantity
    return total


def hourly_cost(
    provider: str,
    nodes: Sequence[PricedNode],
    *,
    balancer: bool = False,
    control_plane: bool = False,
) -> HourlyCost:
    """Every node of every serving group, and the private balancer in front of the groups
    (``balancer``: there is one when a stack has more than one group); with ``control_plane``,
    the managed Kubernetes control plane the nodes join (``CONTROL_PLANE_ITEM``)."""
    facts = FACTS[provider]
    counts: dict[str, tuple[int, float | None]] = {}
    for node in nodes:
        count, _ = counts.get(node.instance.name, (0, None))
        counts[node.instance.name] = (count + 1, node.instance.hourly_usd)
    unpriced = [f"{name} instances" for name, (_, price) in counts.items() if price is None]
    instances = None if unpriced else sum(node.instance.hourly_usd or 0.0 for node in nodes)
    # The balancer node reaches its package through the NAT too (and stops with the groups).
    balancer_behind_nat = 1 if balancer and nodes else 0
    nat = _priced(provider, facts.nat.hourly_usage(len(nodes) + balancer_behind_nat))
    if nat is None:
        unpriced.append(facts.nat.name)
    # Priced once per size: a group's workers share one (the planner prices many clusters).
    disk_prices: dict[tuple[int, int | None], float | None] = {}

    def monthly_disk(gb: int, throughput_mibps: int | None) -> float | None:
        if (gb, throughput_mibps) not in disk_prices:
            usage = facts.disk.monthly_usage(gb, throughput_mibps)
            disk_prices[gb, throughput_mibps] = _priced(provider, usage)
        return disk_prices[gb, throughput_mibps]

    monthly_disks = [monthly_disk(node.disk_gb, node.disk_throughput_mibps) for node in nodes] + [
        monthly_disk(node.system_disk_gb, None) for node in nodes if node.system_disk_gb
    ]
    disks = None
    if any(cost is None for cost in monthly_disks):
        unpriced.append(f"{facts.disk.name} disks")
    else:
        disks = sum(cost or 0.0 for cost in monthly_disks) / HOURS_PER_MONTH
    sources = sorted(
        {
            f"instances: {n.instance.price_source}, {n.instance.price_date or 'no date'}"
            for n in nodes
        }
    )
    fast = facts.fast_network_min_vcpus
    if fast is not None and any(node.instance.vcpus >= fast for node in nodes):
        unpriced.append(facts.fast_network_name)  # billed on top; no price in the catalog
    balancer_usd = balancer_disk = None
    if balancer and nodes:
        balancer_node = balancer_cost(provider, nodes[0].instance.region)
        balancer_usd, balancer_disk = balancer_node.usd, balancer_node.disk_usd
        if balancer_usd is None:
            unpriced.append(BALANCER_NODE)
        elif not balancer_node.disk_priced and f"{facts.disk.name} disks" not in unpriced:
            unpriced.append(f"{facts.disk.name} disks")
        if balancer_node.source:
            sources.append(f"balancer node: {balancer_node.source}")
    plane_usd = None
    if control_plane:
        plane = service_price(provider, CONTROL_PLANE_ITEM)
        plane_usd = plane.usd
        if plane_usd is None:
            unpriced.append("the Kubernetes control plane")
        else:
            sources.append(f"{CONTROL_PLANE_ITEM}: {plane.source}, {plane.date}")
    usage_items = {*facts.nat.hourly_usage(1), *facts.disk.monthly_usage(1, None)}
    for item in sorted(usage_items):
        price = service_price(provider, item)
        if price.usd is not None:
            sources.append(f"{item}: {price.source}, {price.date}")
    return HourlyCost(
        instances=None if instances is None else round(instances, 5),
        nat=None if nat is None else round(nat, 5),
        disks=None if disks is None else round(disks, 5),
        unpriced=tuple(unpriced),
        sources=tuple(sources),
        instance_counts=tuple((name, count, price) for name, (count, price) in counts.items()),
        balancer=balancer_usd,
        balancer_disk=balancer_disk,
        control_plane=plane_usd,
        disks_kept_stopped=not control_plane,
        nat_stopped=_rounded(_priced(provider, facts.nat.hourly_usage(0))),
    )


@dataclass(frozen=True)
class BalancerNodeCost:
    usd: float | None  # its instance and, where priced, its system disk; None: unpriced
    disk_priced: bool
    source: str  # the instance price's source and date; "" when the catalog lacks the type
    disk_usd: float | None = None  # its system disk alone, $/h (stopped); None: unpriced


def balancer_cost(provider: str, region: str) -> BalancerNodeCost:
    """The balancer node's $/h: its instance (``CloudFacts.balancer_instance_type``, from the
    catalog) and its system disk at the disk's baseline, where the catalog prices it."""
    facts = FACTS[provider]
    node = catalog.find(provider, region, facts.balancer_instance_type)
    disk = _priced(provider, facts.disk.monthly_usage(WORKER_DISK_GB, None))
    disk_usd = None if disk is None else round(disk / HOURS_PER_MONTH, 5)
    if node is None or node.hourly_usd is None:
        return BalancerNodeCost(None, disk is not None, "", disk_usd)
    usd = node.hourly_usd + (disk or 0.0) / HOURS_PER_MONTH
    source = f"{node.price_source}, {node.price_date or 'no date'}"
    return BalancerNodeCost(round(usd, 5), disk is not None, source, disk_usd)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 5)


def download_usd(provider: str, model_bytes: int) -> float | None:
    """One-off: the model downloaded through the NAT gateway (per GB processed)."""
    price = service_price(provider, "nat_gb")
    if price.usd is None:
        return None
    unit_bytes = 1024**3 if "GiB" in price.unit else 1e9
    return round(model_bytes / unit_bytes * price.usd, 2)
