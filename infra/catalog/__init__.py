"""The instance catalog: Arm instance types per provider and region, with dated list prices.

Data, not code: ``instances.csv`` records each type's size, network, on-demand $/h and where and
when that price came from, then in columns of their own its spot $/h, source and date (a spot
price never lands in ``hourly_usd``, an on-demand one never in ``spot_hourly_usd``); ``cpus.csv``
each CPU family's memory bandwidth; ``services.csv`` the NAT and disk prices; ``disks.csv``
each type's throughput to its network disks, where the cloud publishes one per type. Prices
are never fetched while a stack runs. A price that could not be found is ``unknown``
(``hourly_usd`` or ``spot_hourly_usd`` is None), never a guess. A CSV without the spot columns
reads as spot unknown.

The CSVs are read from this package unless the environment variable ``LLAMA_RPC_CATALOG_DIR``
names another directory holding the same four files (the tests point it at a catalog of their
own, so a price refresh cannot change what they expect). It is read whenever a table is loaded
without an explicit path; each file is parsed once and kept, keyed by its path, so switching
directories needs no cache clearing. ``CATALOG_FILE`` and its siblings always name this
package's own files, which ``lrc catalog refresh`` updates.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

PACKAGE_DIR = Path(__file__).parent
DIRECTORY_VARIABLE = "LLAMA_RPC_CATALOG_DIR"
INSTANCES_NAME = "instances.csv"
CPUS_NAME = "cpus.csv"
SERVICES_NAME = "services.csv"
DISKS_NAME = "disks.csv"
# The product's own files, whatever the environment says.
CATALOG_FILE = PACKAGE_DIR / INSTANCES_NAME
CPUS_FILE = PACKAGE_DIR / CPUS_NAME
SERVICES_FILE = PACKAGE_DIR / SERVICES_NAME
DISKS_FILE = PACKAGE_DIR / DISKS_NAME
GIB = 1024**3
# The spot source of a row no refresh has priced (and of a CSV without the spot columns).
SPOT_NOT_FETCHED = "not fetched: run lrc catalog refresh"

T = TypeVar("T")


def directory() -> Path:
    """The directory the catalog is read from: ``$LLAMA_RPC_CATALOG_DIR``, else this package."""
    chosen = os.environ.get(DIRECTORY_VARIABLE)
    return Path(chosen) if chosen else PACKAGE_DIR


class _Table(Generic[T]):
    """One of the catalog's CSV files, parsed once per path.

    Called with no path it reads the file of its name in ``directory()``. ``cache_clear()``
    forgets every parsed file (the price refresh calls it after rewriting one).
    """

    def __init__(self, name: str, parse: Callable[[list[dict[str, str]]], T]) -> None:
        self.name = name
        self._parse = parse
        self._parsed: dict[Path, T] = {}
        # By the variable's value ("" when unset): the planner looks types up in tight loops.
        self._in_directory: dict[str, T] = {}

    def __call__(self, path: Path | None = None) -> T:
        if path is not None:
            return self._read(path)
        chosen = os.environ.get(DIRECTORY_VARIABLE, "")
        if chosen not in self._in_directory:
            path = directory() / self.name
            if chosen and not path.is_file():
                raise FileNotFoundError(f"{DIRECTORY_VARIABLE}={chosen}: no {self.name} there")
            self._in_directory[chosen] = self._read(path)
        return self._in_directory[chosen]

    def _read(self, path: Path) -> T:
        if path not in self._parsed:
            with path.open(newline="") as f:
                self._parsed[path] = self._parse(list(csv.DictReader(f)))
        return self._parsed[path]

    def cache_clear(self) -> None:
        self._parsed.clear()
        self._in_directory.clear()


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
    # The spot price, apart from the on-demand one; unknown until a refresh fetches it.
    spot_hourly_usd: float | None = None
    spot_price_source: str = SPOT_NOT_FETCHED
    spot_price_date: str = ""

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)


def _number(text: str) -> float | None:
    return None if text in ("", "unknown") else float(text)


def _instances(rows: list[dict[str, str]]) -> tuple[InstanceType, ...]:
    # A CSV written before the spot columns existed, or a row short of them, reads as unknown.
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
            spot_hourly_usd=_number(row.get("spot_hourly_usd") or ""),
            spot_price_source=row.get("spot_price_source") or SPOT_NOT_FETCHED,
            spot_price_date=row.get("spot_price_date") or "",
        )
        for row in rows
    )


# Every instance type, in the file's order: ``load()`` or ``load(path)``.
load = _Table(INSTANCES_NAME, _instances)


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


def _cpu_families(rows: list[dict[str, str]]) -> dict[str, CpuFamily]:
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


def _service_prices(rows: list[dict[str, str]]) -> dict[tuple[str, str], ServicePrice]:
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


# CPU families by name: ``cpu_families()`` or ``cpu_families(path)``.
cpu_families = _Table(CPUS_NAME, _cpu_families)
# NAT and disk prices by (provider, item): ``service_prices()`` or ``service_prices(path)``.
service_prices = _Table(SERVICES_NAME, _service_prices)


@dataclass(frozen=True)
class DiskBandwidth:
    """How fast one instance type reaches its network disks (AWS's EBS-optimized figures),
    whatever the disks themselves could give. A small type runs at its maximum for a while
    (``burst_minutes``, from a fresh start) and at its baseline after."""

    provider: str
    instance_type: str
    baseline_mbps: float  # MB/s (10^6 bytes)
    max_mbps: float
    burst_minutes: float
    source: str
    date: str

    def mibps_for(self, size_bytes: float) -> float:
        """The average MiB/s of moving ``size_bytes`` from a fresh start: at the maximum while
        the burst lasts, at the baseline after."""
        burst_bytes = self.max_mbps * 1e6 * self.burst_minutes * 60
        if size_bytes <= burst_bytes or self.max_mbps == self.baseline_mbps:
            mbps = self.max_mbps
        else:
            seconds = self.burst_minutes * 60 + (size_bytes - burst_bytes) / (
                self.baseline_mbps * 1e6
            )
            mbps = size_bytes / seconds / 1e6
        return mbps * 1e6 / 1024**2


def _disk_bandwidths(rows: list[dict[str, str]]) -> dict[tuple[str, str], DiskBandwidth]:
    return {
        (row["provider"], row["instance_type"]): DiskBandwidth(
            provider=row["provider"],
            instance_type=row["instance_type"],
            baseline_mbps=float(row["baseline_mbps"]),
            max_mbps=float(row["max_mbps"]),
            burst_minutes=float(row["burst_minutes"]),
            source=row["source"],
            date=row["date"],
        )
        for row in rows
    }


# Disk bandwidth by (provider, instance type): ``disk_bandwidths()`` or ``disk_bandwidths(path)``.
disk_bandwidths = _Table(DISKS_NAME, _disk_bandwidths)


def disk_bandwidth(provider: str, instance_type: str) -> DiskBandwidth | None:
    """The type's published disk bandwidth; None where the catalog has none (the disk's own
    throughput is then the only limit the planner knows)."""
    return disk_bandwidths().get((provider, instance_type))


def service_price(provider: str, item: str) -> ServicePrice:
    price = service_prices().get((provider, item))
    if price is None:
        return ServicePrice(provider, item, None, "", "not in the catalog", "")
    return price


def providers() -> list[str]:
    return sorted({e.provider for e in load()})
