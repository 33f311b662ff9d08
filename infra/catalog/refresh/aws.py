"""AWS prices: the Price List API (``boto3`` ``pricing.get_products``), with credentials that
may call ``pricing:GetProducts``."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from infra.catalog.refresh.common import PriceRequest, RefreshError

SOURCE = "AWS Price List API (get_products, on-demand Linux)"


def filters(region: str, instance_type: str) -> list[dict[str, str]]:
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


def _on_demand_usd(item: dict[str, Any]) -> set[float]:
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
                "Filters": filters(region, name),
                "MaxResults": 100,
            }
            if token:
                kwargs["NextToken"] = token
            page = client.get_products(**kwargs)
            for text in page.get("PriceList", []):
                prices |= _on_demand_usd(json.loads(text))
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


def prices(request: PriceRequest) -> dict[str, float]:
    client = request.aws_client
    if client is None:
        import boto3  # noqa: PLC0415 (only the AWS refresh needs it)

        # The Price List API is served from us-east-1 whatever region is priced.
        client = boto3.client("pricing", region_name="us-east-1")
    return aws_prices(client, request.region, request.names)
