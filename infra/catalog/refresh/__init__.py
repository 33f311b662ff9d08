"""Refresh the catalog's on-demand prices from the providers' price APIs.

- AWS: the Price List API (``boto3`` ``pricing.get_products``), no account setup beyond
  credentials that may call ``pricing:GetProducts``.
- Azure: the Retail Prices API (``prices.azure.com``), no authentication.
- GCP: the Cloud Billing Catalog API with an API key from ``GCP_BILLING_API_KEY``; C4A is priced
  per vCPU-hour and GiB-hour, so a type's price is vCPUs x core price + GiB x RAM price.

Every refreshed row records the API as its source and today's date. A type with no price in the
answer keeps its old row, and the report says so. The fetchers take their transport as an
argument, so tests replay recorded responses instead of calling the network.
"""

from __future__ import annotations

import csv
import datetime
import json
import os
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from infra.catalog import CATALOG_FILE, InstanceType, load

FetchJson = Callable[[str], dict[str, Any]]
AZURE_PRICES_URL = "https://prices.azure.com/api/retail/prices"
GCP_COMPUTE_SKUS_URL = "https://cloudbilling.googleapis.com/v1/services/6F81-5844-456A/skus"
GCP_KEY_VARIABLE = "GCP_BILLING_API_KEY"
# CPU families priced per resource on GCP: (core SKU, RAM SKU) description prefixes.
GCP_RESOURCE_SKUS = {
    "axion": ("C4A Arm Instance Core running in", "C4A Arm Instance Ram running in")
}
AWS_SOURCE = "AWS Price List API (get_products, on-demand Linux)"
AZURE_SOURCE = "Azure Retail Prices API (Consumption, Linux)"
GCP_SOURCE = "GCP Cloud Billing Catalog API (on-demand, per vCPU and GiB)"
COLUMNS = (
    "provider", "region", "instance_type", "arch", "cpu_family", "vcpus", "memory_gib",
    "network_gbps", "hourly_usd", "price_source", "price_date",
)  # fmt: skip


class RefreshError(RuntimeError):
    """A price API answered with something unusable, or a setting is missing."""


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


def http_json(url: str) -> dict[str, Any]:
    """GET a JSON document (the real transport; tests pass their own)."""
    if not url.startswith("https://"):
        raise RefreshError(f"refusing a non-https price URL: {url}")
    with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310 (https only)
        result: dict[str, Any] = json.load(response)
        return result


# --- AWS ------------------------------------------------------------------------------------


def _aws_filters(region: str, instance_type: str) -> list[dict[str, str]]:
    terms = {
        "regionCode": region,
        "instanceType": instance_type,
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
        "marketoption": "OnDemand",
    }
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in terms.items()]


def _aws_on_demand_usd(item: dict[str, Any]) -> set[float]:
    prices = set()
    for term in item.get("terms", {}).get("OnDemand", {}).values():
        for dimension in term.get("priceDimensions", {}).values():
            if dimension.get("unit", "Hrs") != "Hrs":
                continue
            usd = float(dimension["pricePerUnit"]["USD"])
            if usd > 0:
                prices.add(usd)
    return prices


def aws_prices(client: Any, region: str, names: Iterable[str]) -> dict[str, float]:
    """On-demand Linux $/h per type, from a boto3 ``pricing`` client (us-east-1 endpoint)."""
    found = {}
    for name in names:
        prices: set[float] = set()
        token = None
        while True:
            kwargs: dict[str, Any] = {
                "ServiceCode": "AmazonEC2",
                "Filters": _aws_filters(region, name),
                "MaxResults": 100,
            }
            if token:
                kwargs["NextToken"] = token
            page = client.get_products(**kwargs)
            for text in page.get("PriceList", []):
                prices |= _aws_on_demand_usd(json.loads(text))
            token = page.get("NextToken")
            if not token:
                break
        if len(prices) > 1:
            raise RefreshError(
                f"AWS lists several on-demand prices for {name} in {region}: {prices}"
            )
        if prices:
            found[name] = prices.pop()
    return found


# --- Azure ----------------------------------------------------------------------------------


def _azure_is_linux_on_demand(item: dict[str, Any]) -> bool:
    names = f"{item.get('skuName', '')} {item.get('meterName', '')}"
    return (
        item.get("type") == "Consumption"
        and not item.get("productName", "").endswith("Windows")
        and "Spot" not in names
        and "Low Priority" not in names
        and item.get("unitOfMeasure") == "1 Hour"
    )


def azure_prices(fetch: FetchJson, region: str, names: Iterable[str]) -> dict[str, float]:
    found = {}
    for name in names:
        query = (
            f"serviceName eq 'Virtual Machines' and armRegionName eq '{region}' "
            f"and armSkuName eq '{name}' and priceType eq 'Consumption'"
        )
        encoded = urllib.parse.urlencode({"$filter": query}, quote_via=urllib.parse.quote)
        url: str | None = f"{AZURE_PRICES_URL}?{encoded}"
        rows = []
        while url:
            page = fetch(url)
            rows += [i for i in page.get("Items", []) if _azure_is_linux_on_demand(i)]
            url = page.get("NextPageLink")
        if rows:
            latest = max(rows, key=lambda i: i.get("effectiveStartDate", ""))
            found[name] = float(latest["retailPrice"])
    return found


# --- GCP ------------------------------------------------------------------------------------


def _gcp_unit_price(sku: dict[str, Any]) -> float:
    info = sku["pricingInfo"][-1]  # the current price is the last entry
    rates = info["pricingExpression"]["tieredRates"]
    rate = next((r for r in rates if float(r.get("startUsageAmount", 0)) == 0), rates[0])
    money = rate["unitPrice"]
    return int(money.get("units") or 0) + int(money.get("nanos") or 0) / 1e9


def gcp_prices(
    fetch: FetchJson, region: str, types: Iterable[InstanceType], api_key: str
) -> dict[str, float]:
    resource: dict[str, float] = {}
    prefixes = {p for pair in GCP_RESOURCE_SKUS.values() for p in pair}
    token = ""
    while True:
        query = {"key": api_key, "pageSize": "5000"} | ({"pageToken": token} if token else {})
        page = fetch(f"{GCP_COMPUTE_SKUS_URL}?{urllib.parse.urlencode(query)}")
        for sku in page.get("skus", []):
            description = sku.get("description", "")
            prefix = next((p for p in prefixes if description.startswith(p)), None)
            on_demand = sku.get("category", {}).get("usageType") == "OnDemand"
            if prefix and on_demand and region in sku.get("serviceRegions", []):
                resource[prefix] = _gcp_unit_price(sku)
        token = page.get("nextPageToken", "")
        if not token:
            break
    found = {}
    for entry in types:
        core, ram = GCP_RESOURCE_SKUS.get(entry.cpu_family, ("", ""))
        if core in resource and ram in resource:
            found[entry.name] = round(
                entry.vcpus * resource[core] + entry.memory_gib * resource[ram], 6
            )
    return found


# --- the catalog file -------------------------------------------------------------------------


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
    environ: dict[str, str] | None = None,
    path: Path = CATALOG_FILE,
    today: datetime.date | None = None,
    dry_run: bool = False,
) -> Report:
    """Fetch this provider's prices for every type it has in the catalog, for ``region``."""
    entries = load(path)
    known = {e.name: e for e in entries if e.provider == provider}
    if not known:
        raise RefreshError(f"the catalog has no {provider} types to price")
    names = sorted(known)
    if provider == "aws":
        if aws_client is None:
            import boto3  # noqa: PLC0415 (only the AWS refresh needs it)

            # The Price List API is served from us-east-1 whatever region is priced.
            aws_client = boto3.client("pricing", region_name="us-east-1")
        prices, source = aws_prices(aws_client, region, names), AWS_SOURCE
    elif provider == "azure":
        prices, source = azure_prices(fetch, region, names), AZURE_SOURCE
    elif provider == "gcp":
        key = (os.environ if environ is None else environ).get(GCP_KEY_VARIABLE)
        if not key:
            raise RefreshError(
                f"{GCP_KEY_VARIABLE} is not set: create an API key in a project with the Cloud "
                "Billing API enabled and export it"
            )
        prices, source = gcp_prices(fetch, region, known.values(), key), GCP_SOURCE
    else:
        raise RefreshError(f"no price API for provider {provider!r}")
    date = (today or datetime.datetime.now(datetime.UTC).date()).isoformat()
    updated, report = apply(entries, Quote(provider, region, prices, source, date))
    if not dry_run:
        write(updated, path)
    return report
