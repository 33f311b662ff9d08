"""What a cluster costs per hour: instances, NAT for egress, and disks, from the catalog.

A price the catalog does not have is left out of the total and named in ``unpriced``, never
guessed. Without an instance price there is no total at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.catalog import InstanceType, service_price

HOURS_PER_MONTH = 730
GP3_BASE_MIBPS = 125
GP3_BASE_IOPS = 3000
GCP_NAT_VM_CAP = 32


@dataclass(frozen=True)
class Disk:
    size_gb: int
    throughput_mibps: int


@dataclass(frozen=True)
class HourlyCost:
    instances: float | None
    nat: float | None
    disks: float | None
    unpriced: tuple[str, ...]
    sources: tuple[str, ...]

    @property
    def total(self) -> float | None:
        if self.instances is None:
            return None
        return round(self.instances + (self.nat or 0.0) + (self.disks or 0.0), 5)


def _price(provider: str, item: str) -> float | None:
    return service_price(provider, item).usd


def _aws_disks(disks: list[Disk]) -> float | None:
    per_gb = _price("aws", "disk_gb_month")
    per_mibps = _price("aws", "disk_mibps_month")
    per_iops = _price("aws", "disk_iops_month")
    if per_gb is None or per_mibps is None or per_iops is None:
        return None
    monthly = 0.0
    for disk in disks:
        # The stacks provision 4 IOPS per MiB/s: gp3 allows 0.25 MiB/s per IOPS.
        iops = max(GP3_BASE_IOPS, disk.throughput_mibps * 4)
        monthly += disk.size_gb * per_gb
        monthly += max(0, disk.throughput_mibps - GP3_BASE_MIBPS) * per_mibps
        monthly += max(0, iops - GP3_BASE_IOPS) * per_iops
    return monthly / HOURS_PER_MONTH


def _nat(provider: str, nodes: int) -> float | None:
    ip = _price(provider, "public_ip_hour")
    if provider == "gcp":
        per_vm = _price("gcp", "nat_vm_hour")
        if per_vm is None or ip is None:
            return None
        return per_vm * min(nodes, GCP_NAT_VM_CAP) + ip
    gateway = _price(provider, "nat_gateway_hour")
    if gateway is None or ip is None:
        return None
    return gateway + ip


def hourly_cost(instance: InstanceType, nodes: int, disks: list[Disk]) -> HourlyCost:
    provider = instance.provider
    instances = None if instance.hourly_usd is None else instance.hourly_usd * nodes
    nat = _nat(provider, nodes)
    disk_cost = _aws_disks(disks) if provider == "aws" else None
    unpriced = []
    if instances is None:
        unpriced.append(f"{instance.name} instances")
    if nat is None:
        unpriced.append("NAT gateway")
    if disk_cost is None:
        unpriced.append("disks")
    sources = [f"instances: {instance.price_source}, {instance.price_date or 'no date'}"]
    for item in ("nat_gateway_hour", "nat_vm_hour", "disk_gb_month"):
        price = service_price(provider, item)
        if price.usd is not None:
            sources.append(f"{item}: {price.source}, {price.date}")
    return HourlyCost(
        instances=None if instances is None else round(instances, 5),
        nat=None if nat is None else round(nat, 5),
        disks=None if disk_cost is None else round(disk_cost, 5),
        unpriced=tuple(unpriced),
        sources=tuple(sources),
    )


def download_usd(provider: str, model_bytes: int) -> float | None:
    """One-off: the model downloaded through the NAT gateway (per GB processed)."""
    price = service_price(provider, "nat_gb")
    if price.usd is None:
        return None
    unit_bytes = 1024**3 if "GiB" in price.unit else 1e9
    return round(model_bytes / unit_bytes * price.usd, 2)
