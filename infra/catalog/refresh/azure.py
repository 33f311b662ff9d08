"""Azure prices: the Retail Prices API (``prices.azure.com``), without authentication. One
query per type answers both prices: a Linux pay-as-you-go row is on-demand, a row whose skuName
or meterName ends with " Spot" is spot; Windows, Low Priority and Dev/Test rows are dropped."""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

from infra.catalog.refresh.common import FetchJson, PriceRequest, Prices, SpotPrice

SOURCE = "Azure Retail Prices API (Consumption, Linux)"
SPOT_SOURCE = "Azure Retail Prices API (Consumption, Linux Spot)"
PRICES_URL = "https://prices.azure.com/api/retail/prices"


def _is_linux_hourly(item: dict[str, Any]) -> bool:
    names = f"{item.get('skuName', '')} {item.get('meterName', '')}"
    return (
        item.get("type") == "Consumption"
        and not item.get("productName", "").endswith("Windows")
        and "Low Priority" not in names
        and item.get("unitOfMeasure") == "1 Hour"
    )


def _is_spot(item: dict[str, Any]) -> bool:
    names = (item.get("skuName", ""), item.get("meterName", ""))
    return any(name.endswith(" Spot") for name in names)


def _is_linux_on_demand(item: dict[str, Any]) -> bool:
    names = f"{item.get('skuName', '')} {item.get('meterName', '')}"
    return _is_linux_hourly(item) and "Spot" not in names


def _is_linux_spot(item: dict[str, Any]) -> bool:
    return _is_linux_hourly(item) and _is_spot(item)


def _latest(
    items: Iterable[dict[str, Any]], keep: Callable[[dict[str, Any]], bool]
) -> float | None:
    rows = [i for i in items if keep(i)]
    if not rows:
        return None
    return float(max(rows, key=lambda i: i.get("effectiveStartDate", ""))["retailPrice"])


def on_demand_price(items: Iterable[dict[str, Any]]) -> float | None:
    """The newest Linux pay-as-you-go $/h among one type's rows (all pages)."""
    return _latest(items, _is_linux_on_demand)


def spot_price(items: Iterable[dict[str, Any]]) -> float | None:
    """The newest Linux spot $/h among one type's rows (all pages)."""
    return _latest(items, _is_linux_spot)


def retail_items(fetch: FetchJson, region: str, name: str) -> list[dict[str, Any]]:
    """Every Consumption row of one type in one region, following the pages."""
    query = (
        f"serviceName eq 'Virtual Machines' and armRegionName eq '{region}' "
        f"and armSkuName eq '{name}' and priceType eq 'Consumption'"
    )
    encoded = urllib.parse.urlencode({"$filter": query}, quote_via=urllib.parse.quote)
    url: str | None = f"{PRICES_URL}?{encoded}"
    items: list[dict[str, Any]] = []
    while url:
        page = fetch(url)
        items += page.get("Items", [])
        url = page.get("NextPageLink")
    return items


def quote(request: PriceRequest) -> Prices:
    on_demand: dict[str, float] = {}
    spot: dict[str, SpotPrice] = {}
    for name in request.names:
        items = retail_items(request.fetch, request.region, name)
        price = on_demand_price(items)
        if price is not None:
            on_demand[name] = price
        spot_usd = spot_price(items)
        if spot_usd is not None:
            spot[name] = SpotPrice(spot_usd, SPOT_SOURCE, request.today)
    return Prices(on_demand, spot)
