"""Refresh the catalog's on-demand and spot prices from the providers' price APIs: one module
per provider (``aws``, ``azure``, ``gcp``), each with its ``SOURCE`` and ``quote(request)``.

Every refreshed row records the API as its source and today's date; its spot price goes to the
spot columns, with the spot source and date the provider's module gives. A type with no price in
the answer keeps its old price, and the report says so. The fetchers take their transport as an
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

from infra.catalog import CATALOG_FILE, SPOT_NOT_FETCHED, InstanceType, load
from infra.catalog.refresh.common import (
    FetchJson,
    PriceRequest,
    Prices,
    RefreshError,
    SpotPrice,
    http_json,
)

__all__ = [
    "PROVIDERS", "Quote", "RefreshError", "Report", "SpotPrice", "apply", "http_json", "refresh",
    "write",
]  # fmt: skip

# Each provider's price module, imported when used.
PROVIDERS = {
    "aws": "infra.catalog.refresh.aws",
    "azure": "infra.catalog.refresh.azure",
    "gcp": "infra.catalog.refresh.gcp",
}
COLUMNS = (
    "provider", "region", "instance_type", "arch", "cpu_family", "vcpus", "memory_gib",
    "network_gbps", "hourly_usd", "price_source", "price_date",
    "spot_hourly_usd", "spot_price_source", "spot_price_date",
)  # fmt: skip


@dataclass
class Report:
    provider: str
    region: str
    updated: list[tuple[str, float | None, float]] = field(default_factory=list)
    added: list[tuple[str, float]] = field(default_factory=list)
    not_found: list[str] = field(default_factory=list)
    spot_updated: list[tuple[str, float | None, float]] = field(default_factory=list)
    spot_not_found: list[str] = field(default_factory=list)
    spot_error: str = ""

    def lines(self) -> list[str]:
        def before(old: float | None) -> str:
            return "unknown" if old is None else f"${old:g}"

        out = [f"{self.provider} {self.region}:"]
        out += [f"  {name}: {before(old)} -> ${new:g}/h" for name, old, new in self.updated]
        out += [f"  {name}: added at ${price:g}/h" for name, price in self.added]
        out += [f"  {name}: no on-demand price found; row kept" for name in self.not_found]
        out += [
            f"  {name}: spot {before(old)} -> ${new:g}/h" for name, old, new in self.spot_updated
        ]
        out += [f"  {name}: no spot price found; spot kept" for name in self.spot_not_found]
        if self.spot_error:
            out.append(f"  spot prices not fetched ({self.spot_error}); spot columns kept")
        return out


def _row(entry: InstanceType) -> dict[str, str]:
    def text(value: float | None) -> str:
        # repr: the shortest text that reads back as the same number (a price of 7 significant
        # digits keeps them all; "g" would keep 6).
        return "unknown" if value is None else repr(value).removesuffix(".0")

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
        "spot_hourly_usd": text(entry.spot_hourly_usd),
        "spot_price_source": entry.spot_price_source,
        "spot_price_date": entry.spot_price_date,
    }


@dataclass(frozen=True)
class Quote:
    """Prices for one provider and region, and where and when they came from. ``prices`` are
    on-demand, all of ``source`` and ``date``; ``spot`` carry their own source and date."""

    provider: str
    region: str
    prices: dict[str, float]
    source: str
    date: str
    spot: dict[str, SpotPrice] = field(default_factory=dict)
    spot_error: str = ""  # why spot prices were not fetched: the spot columns are kept


def _with_spot(entry: InstanceType, spot: SpotPrice) -> InstanceType:
    return replace(
        entry, spot_hourly_usd=spot.usd, spot_price_source=spot.source, spot_price_date=spot.date
    )


def apply(entries: tuple[InstanceType, ...], quote: Quote) -> tuple[list[InstanceType], Report]:
    """The catalog with these prices set for ``region``; new rows copy the type's specs (never
    its prices) from another region."""
    report = Report(quote.provider, quote.region, spot_error=quote.spot_error)
    result = []
    seen = set()
    for entry in entries:
        if (entry.provider, entry.region) != (quote.provider, quote.region):
            result.append(entry)
            continue
        seen.add(entry.name)
        priced = entry
        spot = quote.spot.get(entry.name)
        if spot is not None:
            if spot.usd != entry.spot_hourly_usd:
                report.spot_updated.append((entry.name, entry.spot_hourly_usd, spot.usd))
            priced = _with_spot(priced, spot)
        elif not quote.spot_error:
            report.spot_not_found.append(entry.name)
        new = quote.prices.get(entry.name)
        if new is None:
            report.not_found.append(entry.name)
        else:
            if new != entry.hourly_usd:
                report.updated.append((entry.name, entry.hourly_usd, new))
            priced = replace(
                priced, hourly_usd=new, price_source=quote.source, price_date=quote.date
            )
        result.append(priced)
    templates = {e.name: e for e in entries if e.provider == quote.provider}
    for name, price in sorted(quote.prices.items()):
        if name not in seen and name in templates:
            row = replace(
                templates[name], region=quote.region, hourly_usd=price,
                price_source=quote.source, price_date=quote.date,
                spot_hourly_usd=None, spot_price_source=SPOT_NOT_FETCHED, spot_price_date="",
            )  # fmt: skip
            spot = quote.spot.get(name)
            result.append(row if spot is None else _with_spot(row, spot))
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
    ec2_client: Any = None,
    environ: Mapping[str, str] | None = None,
    path: Path = CATALOG_FILE,
    today: datetime.date | None = None,
    dry_run: bool = False,
) -> Report:
    """Fetch this provider's on-demand and spot prices for every type it has in the catalog, for
    ``region``."""
    if provider not in PROVIDERS:
        raise RefreshError(f"no price API for provider {provider!r}; known: {', '.join(PROVIDERS)}")
    entries = load(path)
    known = [e for e in entries if e.provider == provider]
    if not known:
        raise RefreshError(f"the catalog has no {provider} types to price")
    unique = list({e.name: e for e in known}.values())
    date = (today or datetime.datetime.now(datetime.UTC).date()).isoformat()
    request = PriceRequest(region, unique, fetch, aws_client, ec2_client=ec2_client, today=date)
    if environ is not None:
        request = replace(request, environ=environ)
    module = importlib.import_module(PROVIDERS[provider])
    prices: Prices = module.quote(request)
    quote = Quote(
        provider, region, prices.on_demand, module.SOURCE, date, prices.spot, prices.spot_error
    )
    updated, report = apply(entries, quote)
    if not dry_run:
        write(updated, path)
    return report
