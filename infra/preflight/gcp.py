"""The preflight's reads on Google Cloud (Compute Engine API): the region's zones that are up and
which of them offer the machine types, the region's CPU quotas (limit and use), and the vCPUs of
the stack's own running VMs, told apart by their labels."""

from __future__ import annotations

import re

from infra.clouds import gcp as gcp_facts
from infra.clouds.base import VcpuQuota
from infra.preflight.account import Account, QuotaReading, Unread
from infra.preflight.api import ApiError, JsonApi
from infra.preflight.needs import Needs

BASE = "https://compute.googleapis.com/compute/v1/"
# A VM that is stopped or suspended holds no CPU quota.
IDLE_STATES = {"STOPPED", "STOPPING", "TERMINATED", "SUSPENDED", "SUSPENDING"}
INCREASE = (
    "the Quotas page, https://console.cloud.google.com/iam-admin/quotas?project={project}, "
    "{metric} in {region}, to {{value}}"
)


def vcpus_of(machine_type: str) -> int:
    """A C4A (or other predefined) type's vCPUs, the number its name ends with."""
    found = re.search(r"-(\d+)$", machine_type)
    return int(found.group(1)) if found else 0


def _zone_offers(api: JsonApi, project: str, needs: Needs) -> dict[str, frozenset[str]]:
    up = {
        zone["name"]
        for page in api.pages(f"projects/{project}/zones")
        for zone in page.get("items", [])
        if zone.get("status") == "UP" and zone.get("region", "").endswith(f"/{needs.region}")
    }
    offers: dict[str, set[str]] = {zone: set() for zone in up}
    names = "|".join(needs.types)  # machine type names hold no regular-expression syntax
    for page in api.pages(
        f"projects/{project}/aggregated/machineTypes", {"filter": f'name eq "({names})"'}
    ):
        for scope, found in page.get("items", {}).items():
            zone = scope.removeprefix("zones/")
            if zone in offers:
                offers[zone] |= {m["name"] for m in found.get("machineTypes", [])}
    return {zone: frozenset(types) for zone, types in offers.items()}


def _own_vcpus(api: JsonApi, project: str, needs: Needs) -> dict[VcpuQuota, float]:
    labels = " AND ".join(f'(labels.{k} = "{v}")' for k, v in sorted(needs.tags.items()))
    own: dict[VcpuQuota, float] = {}
    for page in api.pages(f"projects/{project}/aggregated/instances", {"filter": labels}):
        for scope, found in page.get("items", {}).items():
            if not scope.startswith(f"zones/{needs.region}-"):
                continue
            for vm in found.get("instances", []):
                if vm.get("status") in IDLE_STATES:
                    continue
                machine = str(vm.get("machineType", "")).rsplit("/", 1)[-1]
                quota = gcp_facts.vcpu_quota(machine)
                own[quota] = own.get(quota, 0.0) + vcpus_of(machine)
    return own


def read(needs: Needs, api: JsonApi, project: str) -> Account:
    unread: list[Unread] = []
    zone_offers = None
    try:
        zone_offers = _zone_offers(api, project, needs)
    except ApiError as error:
        unread.append(Unread("which zones offer the machine types", str(error)))
    quotas: dict[str, tuple[float, float]] = {}
    try:
        region = api.get(f"projects/{project}/regions/{needs.region}")
        quotas = {
            q["metric"]: (q.get("limit", 0.0), q.get("usage", 0.0))
            for q in region.get("quotas", [])
        }
    except ApiError as error:
        unread.append(Unread(f"the CPU quotas of {needs.region}", str(error)))
    own: dict[VcpuQuota, float] = {}
    try:
        own = _own_vcpus(api, project, needs)
    except ApiError as error:
        unread.append(Unread("the stack's own running VMs", str(error)))
    readings = []
    for quota in needs.quota_needs():
        limit, used = quotas.get(quota.id, (None, None))
        if quota.id not in quotas and not any(u.what.startswith("the CPU quotas") for u in unread):
            # regions.get leaves out what it cannot say (its quotaStatusWarning): not zero.
            unread.append(Unread(f"the quota {quota.id}", f"{needs.region} reports none"))
        readings.append(
            QuotaReading(
                quota,
                limit,
                used,
                own.get(quota, 0.0),
                INCREASE.format(project=project, metric=quota.id, region=needs.region),
            )
        )
    return Account(
        "gcp", needs.region, zone_offers=zone_offers, quotas=tuple(readings), unread=tuple(unread)
    )
