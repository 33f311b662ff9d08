"""Azure prices: the Retail Prices API (``prices.azure.com``), without authentication."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable
from typing import Any

from infra.catalog.refresh.common import FetchJson, PriceRequest

SOURCE = "Azure Retail Prices API (Consumption, Linux)"
PRICES_URL = "https://prices.azure.com/api/retail/prices"


def _is_linux_on_demand(item: dict[str, Any]) -> bool:
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
        url: str | None = f"{PRICES_URL}?{encoded}"
        rows = []
        while url:
            page = fetch(url)
            rows += [i for i in page.get("Items", []) if _is_linux_on_demand(i)]
            url = page.get("NextPageLink")
        if rows:
            latest = max(rows, key=lambda i: i.get("effectiveStartDate", ""))
            found[name] = float(latest["retailPrice"])
    return found


def prices(request: PriceRequest) -> dict[str, float]:
    return azure_prices(request.fetch, request.region, request.names)
