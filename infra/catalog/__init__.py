"""The instance catalog: Arm instance types per provider and region, with dated list prices.

Data, not code: ``instances.csv`` records each type's size, network, on-demand $/h and where and
when that price came from. Prices are never fetched while a stack runs. A price that could not
be found is ``unknown`` (``hourly_usd`` is None), never a guess.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from pathlib import Path

CATALOG_FILE = Path(__file__).with_name("instances.csv")
GIB = 1024**3


@dataclass(frozen=True)
class InstanceType:
    provider: str
    region: str
    name: str
    arch: str
    cpu_family: str
    vcpus: int
    memory_gib: float
    network_gbps: float | None
    hourly_usd: float | None
    price_source: str
    price_date: str

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)


def _number(text: str) -> float | None:
    return None if text in ("", "unknown") else float(text)


@cache
def load(path: Path = CATALOG_FILE) -> tuple[InstanceType, ...]:
    with path.open(newline="") as f:
        return tuple(
            InstanceType(
                provider=row["provider"],
                region=row["region"],
                name=row["instance_type"],
                arch=row["arch"],
                cpu_family=row["cpu_family"],
                vcpus=int(row["vcpus"]),
                memory_gib=float(row["memory_gib"]),
                network_gbps=_number(row["network_gbps"]),
                hourly_usd=_number(row["hourly_usd"]),
                price_source=row["price_source"],
                price_date=row["price_date"],
            )
            for row in csv.DictReader(f)
        )


def find(provider: str, region: str, name: str) -> InstanceType | None:
    """The catalog entry for one type in one region, if there is one."""
    for entry in load():
        if (entry.provider, entry.region, entry.name) == (provider, region, name):
            return entry
    return None


def types_in(provider: str, region: str) -> list[InstanceType]:
    return [e for e in load() if e.provider == provider and e.region == region]


def regions_of(provider: str, name: str) -> list[str]:
    return sorted({e.region for e in load() if e.provider == provider and e.name == name})


CPUS_FILE = Path(__file__).with_name("cpus.csv")
SERVICES_FILE = Path(__file__).with_name("services.csv")


@dataclass(frozen=True)
class CpuFamily:
    """A memory-bandwidth class: what decode speed on CPUs depends on."""

    name: str
    label: str
    cores_per_socket: int | None
    memory: str
    socket_memory_bandwidth_gbps: float | None
    source: str


@dataclass(frozen=True)
class ServicePrice:
    """A network or disk price (NAT gateway, disk) for one provider; None when unknown."""

    provider: str
    item: str
    usd: float | None
    unit: str
    source: str
    date: str


@cache
def cpu_families(path: Path = CPUS_FILE) -> dict[str, CpuFamily]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return {
        row["cpu_family"]: CpuFamily(
            name=row["cpu_family"],
            label=row["label"],
            cores_per_socket=None
            if row["cores_per_socket"] == "unknown"
            else int(row["cores_per_socket"]),
            memory=row["memory"],
            socket_memory_bandwidth_gbps=_number(row["socket_memory_bandwidth_gbps"]),
            source=row["source"],
        )
        for row in rows
    }


@cache
def service_prices(path: Path = SERVICES_FILE) -> dict[tuple[str, str], ServicePrice]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return {
        (row["provider"], row["item"]): ServicePrice(
            provider=row["provider"],
            item=row["item"],
            usd=_number(row["usd"]),
            unit=row["unit"],
            source=row["source"],
            date=row["date"],
        )
        for row in rows
    }


def service_price(provider: str, item: str) -> ServicePrice:
    price = service_prices().get((provider, item))
    if price is None:
        return ServicePrice(provider, item, None, "", "not in the catalog", "")
    return price


def providers() -> list[str]:
    return sorted({e.provider for e in load()})
