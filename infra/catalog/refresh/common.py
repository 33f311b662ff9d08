"""What every price refresh shares: its errors, its transport, and the request it answers."""

from __future__ import annotations

import datetime
import json
import os
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infra.catalog import InstanceType

FetchJson = Callable[[str], dict[str, Any]]


class RefreshError(RuntimeError):
    """A price API answered with something unusable, or a setting is missing."""


def http_json(url: str) -> dict[str, Any]:
    """GET a JSON document (the real transport; tests pass their own)."""
    if not url.startswith("https://"):
        raise RefreshError(f"refusing a non-https price URL: {url}")
    with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310 (https only)
        result: dict[str, Any] = json.load(response)
        return result


def utc_today() -> str:
    return datetime.datetime.now(datetime.UTC).date().isoformat()


@dataclass(frozen=True)
class PriceRequest:
    """The types of one provider to price in one region, and the means to ask."""

    region: str
    types: Sequence[InstanceType]
    fetch: FetchJson = http_json
    aws_client: Any = None  # a boto3 ``pricing`` client; made on demand
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    ec2_client: Any = None  # a boto3 ``ec2`` client in ``region`` (spot prices); made on demand
    today: str = field(default_factory=utc_today)  # the date a price read today is dated

    @property
    def names(self) -> list[str]:
        return sorted(t.name for t in self.types)


@dataclass(frozen=True)
class SpotPrice:
    """One type's spot $/h, where it came from and its date. Kept apart from on-demand prices."""

    usd: float
    source: str
    date: str


@dataclass(frozen=True)
class Prices:
    """What one provider's price APIs answered for one region: on-demand and spot $/h by type.

    ``spot_error`` says why no spot prices were read, when the API refused (the on-demand
    prices are still good)."""

    on_demand: dict[str, float]
    spot: dict[str, SpotPrice] = field(default_factory=dict)
    spot_error: str = ""
