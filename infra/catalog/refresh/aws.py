"""AWS prices: on-demand from the Price List API (``boto3`` ``pricing.get_products``), spot from
EC2's spot price history (``ec2.describe_spot_price_history`` in the region), with credentials
that may call ``pricing:GetProducts`` and ``ec2:DescribeSpotPriceHistory``.

A spot price differs per availability zone: the catalog records the lowest current one of the
region's zones, dated by the day that price took effect."""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Mapping
from typing import Any

from infra.catalog.refresh.common import PriceRequest, Prices, RefreshError, SpotPrice

SOURCE = "AWS Price List API (get_products, on-demand Linux)"
SPOT_SOURCE = "EC2 spot price history (Linux/UNIX), lowest of {zones} zones"
SPOT_PRODUCT = "Linux/UNIX"


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


def _moment(value: datetime.datetime | str) -> datetime.datetime:
    """A record's Timestamp: boto3 gives a datetime, a recorded JSON response a string."""
    if isinstance(value, datetime.datetime):
        return value
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


def spot_from_history(records: Iterable[Mapping[str, Any]]) -> dict[str, SpotPrice]:
    """The lowest current Linux spot $/h of each type across the zones that quote it.

    ``records`` are ``SpotPriceHistory`` entries: a zone's current price is its newest record.
    The date is that record's Timestamp date (when the price took effect)."""
    newest: dict[tuple[str, str], tuple[datetime.datetime, float]] = {}
    for record in records:
        if record.get("ProductDescription") != SPOT_PRODUCT:
            continue
        key = (record["InstanceType"], record["AvailabilityZone"])
        moment = _moment(record["Timestamp"])
        if key not in newest or moment > newest[key][0]:
            newest[key] = (moment, float(record["SpotPrice"]))
    zones: dict[str, list[tuple[float, datetime.datetime]]] = {}
    for (name, _zone), (moment, usd) in newest.items():
        zones.setdefault(name, []).append((usd, moment))
    found = {}
    for name, quotes in sorted(zones.items()):
        usd, moment = min(quotes, key=lambda q: (q[0], -q[1].timestamp()))
        source = SPOT_SOURCE.format(zones=len(quotes))
        found[name] = SpotPrice(usd, source, moment.date().isoformat())
    return found


def spot_history(client: Any, names: Iterable[str], now: datetime.datetime) -> list[dict[str, Any]]:
    """Every page of ``describe_spot_price_history`` for these types as of ``now``: each zone's
    price in effect then (the last change before the start time)."""
    records: list[dict[str, Any]] = []
    token = None
    while True:
        kwargs: dict[str, Any] = {
            "InstanceTypes": sorted(names),
            "ProductDescriptions": [SPOT_PRODUCT],
            "StartTime": now,
        }
        if token:
            kwargs["NextToken"] = token
        page = client.describe_spot_price_history(**kwargs)
        records += page.get("SpotPriceHistory", [])
        token = page.get("NextToken")
        if not token:
            return records


def quote(request: PriceRequest) -> Prices:
    pricing, ec2 = request.aws_client, request.ec2_client
    if pricing is None or ec2 is None:
        import boto3  # noqa: PLC0415 (only the AWS refresh needs it)

        if pricing is None:  # the Price List API is served from us-east-1 for every region
            pricing = boto3.client("pricing", region_name="us-east-1")
        if ec2 is None:  # spot prices are the region's own
            ec2 = boto3.client("ec2", region_name=request.region)
    on_demand = aws_prices(pricing, request.region, request.names)
    try:
        history = spot_history(ec2, request.names, datetime.datetime.now(datetime.UTC))
    except Exception as error:  # botocore's: access denied to ec2:DescribeSpotPriceHistory
        if not type(error).__module__.startswith("botocore"):
            raise
        return Prices(on_demand, spot_error=f"EC2 DescribeSpotPriceHistory: {error}")
    return Prices(on_demand, spot_from_history(history))
