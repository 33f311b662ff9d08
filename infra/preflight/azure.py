"""The preflight's reads on Azure (Resource Manager): whether the subscription can have each size
in the region (resource SKUs and their restrictions), the family and regional vCPU quotas (limit
and use), the stack's own VMs, told apart by their tags, and, for the flow log, the region's
Network Watcher and Microsoft.Insights' registration."""

from __future__ import annotations

import re

from infra.clouds import azure as azure_facts
from infra.clouds.base import VcpuQuota
from infra.preflight.account import Account, QuotaReading, Unread
from infra.preflight.api import ApiError, JsonApi
from infra.preflight.needs import Needs

BASE = "https://management.azure.com/"
SKUS_API = "2021-07-01"
COMPUTE_API = "2024-11-01"
NETWORK_API = "2024-05-01"
RESOURCES_API = "2021-04-01"
INCREASE = (
    "the portal's Quotas page (https://portal.azure.com/#view/Microsoft_Azure_Capacity/"
    "QuotaMenuBlade/~/myQuotas), Compute, {name} in {region}, to {{value}} (`az vm list-usage "
    "--location {region}` shows them)"
)


def vcpus_of(size: str) -> int:
    found = re.fullmatch(r"Standard_[A-Z]+(\d+)[a-z]*_v\d+", size)
    return int(found.group(1)) if found else 0


def _unavailable(api: JsonApi, subscription: str, needs: Needs) -> dict[str, str]:
    skus = {
        sku["name"]: sku
        for page in api.pages(
            f"subscriptions/{subscription}/providers/Microsoft.Compute/skus",
            {"api-version": SKUS_API, "$filter": f"location eq '{needs.region}'"},
        )
        for sku in page.get("value", [])
        if sku.get("resourceType") == "virtualMachines"
    }
    found = {}
    for name in needs.types:
        sku = skus.get(name)
        if sku is None:
            found[name] = f"not offered in {needs.region}"
            continue
        for restriction in sku.get("restrictions", []):
            if restriction.get("type") == "Location" and needs.region in [
                v.lower() for v in restriction.get("values", [])
            ]:
                found[name] = (
                    f"not available to this subscription in {needs.region} "
                    f"({restriction.get('reasonCode', 'restricted')})"
                )
    return found


def _usages(api: JsonApi, subscription: str, region: str) -> dict[str, tuple[float, float]]:
    """Each quota of the region by its name, lowercased: (limit, current value)."""
    return {
        usage["name"]["value"].lower(): (float(usage["limit"]), float(usage["currentValue"]))
        for page in api.pages(
            f"subscriptions/{subscription}/providers/Microsoft.Compute/locations/{region}/usages",
            {"api-version": COMPUTE_API},
        )
        for usage in page.get("value", [])
    }


def _own_vcpus(api: JsonApi, subscription: str, needs: Needs) -> dict[VcpuQuota, float]:
    own: dict[VcpuQuota, float] = {}
    for page in api.pages(
        f"subscriptions/{subscription}/providers/Microsoft.Compute/virtualMachines",
        {"api-version": COMPUTE_API},
    ):
        for vm in page.get("value", []):
            tags = vm.get("tags") or {}
            if vm.get("location") != needs.region or any(
                tags.get(k) != v for k, v in needs.tags.items()
            ):
                continue
            size = vm.get("properties", {}).get("hardwareProfile", {}).get("vmSize", "")
            for quota in (azure_facts.vcpu_quota(size), azure_facts.REGIONAL_CORES):
                if quota is not None:
                    own[quota] = own.get(quota, 0.0) + vcpus_of(size)
    return own


def _watcher(api: JsonApi, subscription: str, region: str) -> azure_facts.NetworkWatcher | None:
    for page in api.pages(
        f"subscriptions/{subscription}/providers/Microsoft.Network/networkWatchers",
        {"api-version": NETWORK_API},
    ):
        for watcher in page.get("value", []):
            if watcher.get("location", "").lower() == region.lower():
                group = re.search(r"/resourceGroups/([^/]+)/", watcher["id"], re.IGNORECASE)
                return azure_facts.NetworkWatcher(group.group(1) if group else "", watcher["name"])
    return None


def _registered(
    api: JsonApi, subscription: str, namespace: str, unread: list[Unread]
) -> bool | None:
    """Whether the subscription registered a resource provider (None: not read, and why)."""
    try:
        provider = api.get(
            f"subscriptions/{subscription}/providers/{namespace}", {"api-version": RESOURCES_API}
        )
    except ApiError as error:
        unread.append(Unread(f"{namespace}'s registration", str(error)))
        return None
    return bool(provider.get("registrationState") == "Registered")


def read(needs: Needs, api: JsonApi, subscription: str) -> Account:
    unread: list[Unread] = []
    unavailable: dict[str, str] = {}
    try:
        unavailable = _unavailable(api, subscription, needs)
    except ApiError as error:
        unread.append(Unread("which sizes the subscription may use", str(error)))
    usages: dict[str, tuple[float, float]] | None = None
    try:
        usages = _usages(api, subscription, needs.region)
    except ApiError as error:
        unread.append(Unread(f"the vCPU quotas of {needs.region}", str(error)))
    own: dict[VcpuQuota, float] = {}
    try:
        own = _own_vcpus(api, subscription, needs)
    except ApiError as error:
        unread.append(Unread("the stack's own VMs", str(error)))
    readings = []
    for quota in [*needs.quota_needs(), azure_facts.REGIONAL_CORES]:
        limit, used = (usages or {}).get(quota.id.lower(), (None, None))
        if usages is not None and limit is None:
            unread.append(Unread(f"the quota {quota.name}", f"{needs.region} reports none"))
        increase = INCREASE.format(name=quota.name, region=needs.region)
        readings.append(QuotaReading(quota, limit, used, own.get(quota, 0.0), increase))
    watcher, registered, vaults = None, None, None
    if needs.network_watcher is not None:
        try:
            watcher = _watcher(api, subscription, needs.region)
        except ApiError as error:
            unread.append(Unread("network watcher", str(error)))
        registered = _registered(api, subscription, "Microsoft.Insights", unread)
    if needs.key_vault:
        vaults = _registered(api, subscription, "Microsoft.KeyVault", unread)
    return Account(
        "azure",
        needs.region,
        unavailable=unavailable,
        quotas=tuple(readings),
        network_watcher=watcher,
        insights_registered=registered,
        key_vault_registered=vaults,
        unread=tuple(unread),
    )
