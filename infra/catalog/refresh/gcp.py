"""GCP prices: the Cloud Billing Catalog API, with an API key from ``GCP_BILLING_API_KEY``.
C4A is priced per vCPU-hour and GiB-hour, so a type's price is vCPUs x core price + GiB x RAM
price; its spot price likewise, from the "Spot Preemptible" SKUs of the same listing."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable
from typing import Any

from infra.catalog import InstanceType
from infra.catalog.refresh.common import FetchJson, PriceRequest, Prices, RefreshError, SpotPrice

SOURCE = "GCP Cloud Billing Catalog API (on-demand, per vCPU and GiB)"
SPOT_SOURCE = "GCP Cloud Billing Catalog API (Spot Preemptible, per vCPU and GiB)"
COMPUTE_SKUS_URL = "https://cloudbilling.googleapis.com/v1/services/6F81-5844-456A/skus"
KEY_VARIABLE = "GCP_BILLING_API_KEY"
# CPU families priced per resource: (core SKU, RAM SKU) description prefixes, on-demand ...
RESOURCE_SKUS = {"axion": ("C4A Arm Instance Core running in", "C4A Arm Instance Ram running in")}
# ... and spot (usage type "Preemptible", described "Spot Preemptible C4A ...").
SPOT_RESOURCE_SKUS = {
    family: (f"Spot Preemptible {core}", f"Spot Preemptible {ram}")
    for family, (core, ram) in RESOURCE_SKUS.items()
}
# The SKUs' ``category.usageType`` for each kind of price.
ON_DEMAND_USAGE = "OnDemand"
SPOT_USAGE = "Preemptible"


def _unit_price(sku: dict[str, Any]) -> float:
    info = sku["pricingInfo"][-1]  # the current price is the last entry
    rates = info["pricingExpression"]["tieredRates"]
    rate = next((r for r in rates if float(r.get("startUsageAmount", 0)) == 0), rates[0])
    money = rate["unitPrice"]
    return int(money.get("units") or 0) + int(money.get("nanos") or 0) / 1e9


def sku_pages(fetch: FetchJson, api_key: str) -> list[dict[str, Any]]:
    """Every SKU of Compute Engine, following the pages."""
    skus: list[dict[str, Any]] = []
    token = ""
    while True:
        query = {"key": api_key, "pageSize": "5000"} | ({"pageToken": token} if token else {})
        page = fetch(f"{COMPUTE_SKUS_URL}?{urllib.parse.urlencode(query)}")
        skus += page.get("skus", [])
        token = page.get("nextPageToken", "")
        if not token:
            return skus


def type_prices(
    skus: Iterable[dict[str, Any]],
    region: str,
    types: Iterable[InstanceType],
    resource_skus: dict[str, tuple[str, str]],
    usage_type: str,
) -> dict[str, float]:
    """$/h per type: vCPUs x the core SKU's price + GiB x the RAM SKU's, from the SKUs of
    ``usage_type`` that serve ``region`` (on-demand and spot are separate SKUs)."""
    resource: dict[str, float] = {}
    prefixes = {p for pair in resource_skus.values() for p in pair}
    for sku in skus:
        description = sku.get("description", "")
        prefix = next((p for p in prefixes if description.startswith(p)), None)
        usage = sku.get("category", {}).get("usageType")
        if prefix and usage == usage_type and region in sku.get("serviceRegions", []):
            resource[prefix] = _unit_price(sku)
    found = {}
    for entry in types:
        core, ram = resource_skus.get(entry.cpu_family, ("", ""))
        if core in resource and ram in resource:
            found[entry.name] = round(
                entry.vcpus * resource[core] + entry.memory_gib * resource[ram], 6
            )
    return found


def spot_prices(
    skus: Iterable[dict[str, Any]], region: str, types: Iterable[InstanceType], date: str
) -> dict[str, SpotPrice]:
    """Spot $/h per type, from the Spot Preemptible SKUs, dated ``date``."""
    usd = type_prices(skus, region, types, SPOT_RESOURCE_SKUS, SPOT_USAGE)
    return {name: SpotPrice(price, SPOT_SOURCE, date) for name, price in usd.items()}


def quote(request: PriceRequest) -> Prices:
    key = request.environ.get(KEY_VARIABLE)
    if not key:
        raise RefreshError(
            f"{KEY_VARIABLE} is not set: create an API key in a project with the Cloud "
            "Billing API enabled and export it"
        )
    skus = sku_pages(request.fetch, key)
    return Prices(
        type_prices(skus, request.region, request.types, RESOURCE_SKUS, ON_DEMAND_USAGE),
        spot_prices(skus, request.region, request.types, request.today),
    )
