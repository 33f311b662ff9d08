"""GCP prices: the Cloud Billing Catalog API, with an API key from ``GCP_BILLING_API_KEY``.
C4A is priced per vCPU-hour and GiB-hour, so a type's price is vCPUs x core price + GiB x RAM
price."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable
from typing import Any

from infra.catalog import InstanceType
from infra.catalog.refresh.common import FetchJson, PriceRequest, RefreshError

SOURCE = "GCP Cloud Billing Catalog API (on-demand, per vCPU and GiB)"
COMPUTE_SKUS_URL = "https://cloudbilling.googleapis.com/v1/services/6F81-5844-456A/skus"
KEY_VARIABLE = "GCP_BILLING_API_KEY"
# CPU families priced per resource: (core SKU, RAM SKU) description prefixes.
RESOURCE_SKUS = {"axion": ("C4A Arm Instance Core running in", "C4A Arm Instance Ram running in")}


def _unit_price(sku: dict[str, Any]) -> float:
    info = sku["pricingInfo"][-1]  # the current price is the last entry
    rates = info["pricingExpression"]["tieredRates"]
    rate = next((r for r in rates if float(r.get("startUsageAmount", 0)) == 0), rates[0])
    money = rate["unitPrice"]
    return int(money.get("units") or 0) + int(money.get("nanos") or 0) / 1e9


def gcp_prices(
    fetch: FetchJson, region: str, types: Iterable[InstanceType], api_key: str
) -> dict[str, float]:
    resource: dict[str, float] = {}
    prefixes = {p for pair in RESOURCE_SKUS.values() for p in pair}
    token = ""
    while True:
        query = {"key": api_key, "pageSize": "5000"} | ({"pageToken": token} if token else {})
        page = fetch(f"{COMPUTE_SKUS_URL}?{urllib.parse.urlencode(query)}")
        for sku in page.get("skus", []):
            description = sku.get("description", "")
            prefix = next((p for p in prefixes if description.startswith(p)), None)
            on_demand = sku.get("category", {}).get("usageType") == "OnDemand"
            if prefix and on_demand and region in sku.get("serviceRegions", []):
                resource[prefix] = _unit_price(sku)
        token = page.get("nextPageToken", "")
        if not token:
            break
    found = {}
    for entry in types:
        core, ram = RESOURCE_SKUS.get(entry.cpu_family, ("", ""))
        if core in resource and ram in resource:
            found[entry.name] = round(
                entry.vcpus * resource[core] + entry.memory_gib * resource[ram], 6
            )
    return found


def prices(request: PriceRequest) -> dict[str, float]:
    key = request.environ.get(KEY_VARIABLE)
    if not key:
        raise RefreshError(
            f"{KEY_VARIABLE} is not set: create an API key in a project with the Cloud "
            "Billing API enabled and export it"
        )
    return gcp_prices(request.fetch, request.region, request.types, key)
