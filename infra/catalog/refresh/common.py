"""What every price refresh shares: its errors, its transport, and the request it answers."""

from __future__ import annotations

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


@dataclass(frozen=True)
class PriceRequest:
    """The types of one provider to price in one region, and the means to ask."""

    region: str
    types: Sequence[InstanceType]
    fetch: FetchJson = http_json
    aws_client: Any = None  # a boto3 ``pricing`` client; made on demand
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))

    @property
    def names(self) -> list[str]:
        return sorted(t.name for t in self.types)
