"""What the preflight read of a cloud account: facts only, each reader fills what its cloud has."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from infra.clouds.azure import NetworkWatcher
from infra.clouds.base import VcpuQuota


@dataclass(frozen=True)
class QuotaReading:
    quota: VcpuQuota
    limit: float | None  # None: the account did not say
    used: float | None  # by every instance in the region, this stack's included
    own: float = 0.0  # by this stack's own nodes, already running
    # How to ask for more, with the value to ask for in {value}.
    increase: str = ""


@dataclass(frozen=True)
class Unread:
    """A fact the preflight could not read, and why: it is not checked, and said so."""

    what: str
    why: str

    def __str__(self) -> str:
        return f"{self.what} was not checked: {self.why}"


@dataclass(frozen=True)
class Account:
    cloud: str
    region: str
    # Zone -> the needed instance types it offers (AWS and GCP: zones that need no opt-in and
    # are up); None: not read.
    zone_offers: Mapping[str, frozenset[str]] | None = None
    # AWS: each zone's id (use1-az3), the same place in every account, as zone names are not.
    zone_ids: Mapping[str, str] = field(default_factory=dict)
    # Azure: instance type -> why the subscription cannot have it in the region (not offered,
    # or restricted); a type absent here is available.
    unavailable: Mapping[str, str] = field(default_factory=dict)
    quotas: tuple[QuotaReading, ...] = ()
    # Azure: the region's Network Watcher, if it has one; Microsoft.Insights registered.
    network_watcher: NetworkWatcher | None = None
    insights_registered: bool | None = None
    key_vault_registered: bool | None = None  # Microsoft.KeyVault, with an API key
    # The needs' rights (their actions) the deployer lacks; None: not read.
    lacking: frozenset[str] | None = None
    # AWS: the stack's model volumes a new throughput would modify while their last change is
    # not completed: volume id -> (its state, its throughput now, when the change started).
    busy_volumes: Mapping[str, tuple[str, int, str]] = field(default_factory=dict)
    unread: tuple[Unread, ...] = ()

    def zones_offering(
        self, types: tuple[str, ...], refused_ids: frozenset[str] = frozenset()
    ) -> list[str]:
        """The zones, by name, that offer every type (and whose id is not one of
        ``refused_ids``)."""
        offers = self.zone_offers or {}
        return sorted(
            zone
            for zone, found in offers.items()
            if set(types) <= found and self.zone_ids.get(zone) not in refused_ids
        )
