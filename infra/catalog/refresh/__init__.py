"""Refresh the catalog's on-demand prices from the providers' price APIs: one module per
provider (``aws``, ``azure``, ``gcp``), each with its ``SOURCE`` and ``prices(request)``.

Every refreshed row records the API as its source and today's date. A type with no price in the
answer keeps its old row, and the report says so. The fetchers take their transport as an
argument, so tests replay recorded responses instead of calling the network.
"""

from __future__ import annotations

import csv
import datetime
import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from infra.catalog import CATALOG_FILE, InstanceType, load
from infra.catalog.refresh.common import FetchJson, PriceRequest, RefreshError, http_json

__all__ = ["PROVIDERS", "Quote", "RefreshError", "Report", "apply", "http_json", "refresh", "write"]

# Each provider's price module, imported when used.
PROVIDERS = {
    "aws": "infra.catalog.refresh.aws",
    "azure": "infra.catalog.refresh.azure",
    "gcp": "infra.catalog.refresh.gcp",
}
COLUMNS = (
    "provider", "region", "instance_type", "arch", "cpu_family", "vcpus", "memory_gib",
    "network_gbps", "hourly_usd", "price_source", "price_date",
)  # fmt: skip


@dataclass
class Report:
    provider: str
    region: str
    updated: list[tuple[str, float | None, float]] = field(default_factory=list)
    added: list[tuple[str, float]] = field(default_factory=list)
    not_found: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"{self.provider} {self.region}:"]
        for name, old, new in self.updated:
            before = "unknown" if old is None else f"${old:g}"
            out.append(f"  {name}: {before} -> ${new:g}/h")
        out += [f"  {name}: added at ${price:g}/h" for name, price in self.added]
        out += [f"  {name}: no on-demand price found; row kept" for name in self.not_found]
        return out


def _row(entry: InstanceType) -> dict[str, str]:
    def text(value: float | None) -> str:
        return "unknown" if value is None else f"{value:g}"

    return {
        "provider": entry.provider,
        "region": entry.region,
        "instance_type": entry.name,
        "arch": entry.arch,
        "cpu_family": entry.cpu_family,
        "vcpus": str(entry.vcpus),
        "memory_gib": f"{entry.memory_gib:g}",
        "network_gbps": text(entry.network_gbps),
        "hourly_usd": text(entry.hourly_usd),
        "price_source": entry.price_source,
        "price_date": entry.price_date,
    }


@dataclass(frozen=True)
class Quote:
    """Prices for one provider and region, and where and when they came from."""

    provider: str
    region: str
    prices: dict[str, float]
    source: str
    date: str


def apply(entries: tuple[InstanceType, ...], quote: Quote) -> tuple[list[InstanceType], Report]:
    """The catalog with these prices set for ``region``; new rows copy the type's specs from
    another region."""
    report = Report(quote.provider, quote.region)
    result = []
    seen = set()
    for entry in entries:
        if (entry.provider, entry.region) != (quote.provider, quote.region):
            result.append(entry)
            continue
        seen.add(entry.name)
        new = quote.prices.get(entry.name)
        if new is None:
            report.not_found.append(entry.name)
            result.append(entry)
            continue
        if new != entry.hourly_usd:
            report.updated.append((entry.name, entry.hourly_usd, new))
        result.append(
            replace(entry, hourly_usd=new, price_source=quote.source, price_date=quote.date)
        )
    templates = {e.name: e for e in entries if e.provider == quote.provider}
    for name, price in sorted(quote.prices.items()):
        if name not in seen and name in templates:
            result.append(
                replace(templates[name], region=quote.region, hourly_usd=price,
                        price_source=quote.source, price_date=quote.date)
            )  # fmt: skip
            report.added.append((name, price))
    return result, report


def write(entries: Iterable[InstanceType], path: Path = CATALOG_FILE) -> None:
    partial = path.with_suffix(".partial")
    with partial.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(_row(e) for e in entries)
    partial.replace(path)
    load.cache_clear()


def refresh(
    provider: str,
    region: str,
    *,
    fetch: FetchJson = http_json,
    aws_client: Any = None,
    environ: Mapping[str, str] | None = None,
    path: Path = CATALOG_FILE,
    today: datetime.date | None = None,
    dry_run: bool = False,
) -> Report:
    """Fetch this provider's prices for every type it has in the catalog, for ``region``."""
    if provider not in PROVIDERS:
        raise RefreshError(f"no price API for provider {provider!r}; known: {', '.join(PROVIDERS)}")
    entries = load(path)
    known = [e for e in entries if e.provider == provider]
    if not known:
        raise RefreshError(f"the catalog has no {provider} types to price")
    unique = list({e.name: e for e in known}.values())
    request = PriceRequest(region, unique, fetch, aws_client)
    if environ is not None:
        request = replace(request, environ=environ)
    module = importlib.import_module(PROVIDERS[provider])
    prices: dict[str, float] = module.prices(request)
    date = (today or datetime.datetime.now(datetime.UTC).date()).isoformat()
    updated, report = apply(entries, Quote(provider, region, prices, module.SOURCE, date))
    if not dry_run:
        write(updated, path)
    return report
