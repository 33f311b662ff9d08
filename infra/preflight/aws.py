"""The preflight's reads on AWS: the region's availability zones that need no opt-in and which of
them offer the instance types (EC2), the On-Demand vCPU quotas (Service Quotas), and the vCPUs
of the instances running in the region, the stack's own told apart by its tags (EC2)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from infra.clouds import aws as aws_facts
from infra.clouds.base import VcpuQuota
from infra.preflight.account import Account, QuotaReading, Unread
from infra.preflight.needs import Needs

# What an instance counts against its quota in while it runs (stopped ones do not count).
RUNNING_STATES = ["pending", "running"]
INCREASE = (
    "`aws service-quotas request-service-quota-increase --region {region} --service-code ec2 "
    "--quota-code {code} --desired-value {{value}}`"
)


def _why(error: Exception) -> str:
    if isinstance(error, ClientError):
        found = error.response.get("Error", {})
        return f"{found.get('Code', 'error')}: {found.get('Message', '')}".strip(": ")
    return str(error)


def _zones(ec2: Any, types: tuple[str, ...]) -> dict[str, frozenset[str]]:
    """Zones that need no opt-in (no Local or Wavelength Zone) and are available, with the
    types each offers."""
    listed = ec2.describe_availability_zones(
        Filters=[
            {"Name": "opt-in-status", "Values": ["opt-in-not-required"]},
            {"Name": "zone-type", "Values": ["availability-zone"]},
        ]
    )["AvailabilityZones"]
    zones = {z["ZoneName"] for z in listed if z.get("State") == "available"}
    offers: dict[str, set[str]] = {zone: set() for zone in zones}
    arguments: dict[str, Any] = {
        "LocationType": "availability-zone",
        "Filters": [{"Name": "instance-type", "Values": list(types)}],
    }
    while True:
        page = ec2.describe_instance_type_offerings(**arguments)
        for offer in page["InstanceTypeOfferings"]:
            if offer["Location"] in offers:
                offers[offer["Location"]].add(offer["InstanceType"])
        if not page.get("NextToken"):
            return {zone: frozenset(found) for zone, found in offers.items()}
        arguments["NextToken"] = page["NextToken"]


def _running(
    ec2: Any, needs: Needs, quota_of: Callable[[str], VcpuQuota | None]
) -> tuple[dict[VcpuQuota, float], dict[VcpuQuota, float]]:
    """vCPUs of every On-Demand instance running in the region, and of the stack's own, by
    quota."""
    used: dict[VcpuQuota, float] = {}
    own: dict[VcpuQuota, float] = {}
    arguments: dict[str, Any] = {
        "Filters": [{"Name": "instance-state-name", "Values": RUNNING_STATES}]
    }
    while True:
        page = ec2.describe_instances(**arguments)
        for reservation in page["Reservations"]:
            for instance in reservation["Instances"]:
                quota = quota_of(instance["InstanceType"])
                if quota is None or instance.get("InstanceLifecycle"):  # spot: its own quotas
                    continue
                cpu = instance.get("CpuOptions", {})
                vcpus = float(cpu.get("CoreCount", 0) * cpu.get("ThreadsPerCore", 1))
                used[quota] = used.get(quota, 0.0) + vcpus
                tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
                if all(tags.get(k) == v for k, v in needs.tags.items()):
                    own[quota] = own.get(quota, 0.0) + vcpus
        if not page.get("NextToken"):
            return used, own
        arguments["NextToken"] = page["NextToken"]


def read(needs: Needs, ec2: Any, service_quotas: Any) -> Account:
    """Read the account with an EC2 and a Service Quotas client of the stack's region."""
    unread: list[Unread] = []
    zone_offers = None
    try:
        zone_offers = _zones(ec2, needs.types)
    except (ClientError, BotoCoreError) as error:
        unread.append(Unread("which zones offer the instance types", _why(error)))
    used: dict[VcpuQuota, float] | None = None
    own: dict[VcpuQuota, float] = {}
    try:
        used, own = _running(ec2, needs, aws_facts.vcpu_quota)
    except (ClientError, BotoCoreError) as error:
        unread.append(Unread("the vCPUs already running in the region", _why(error)))
    readings = []
    for quota in needs.quota_needs():
        limit = None
        try:
            found = service_quotas.get_service_quota(ServiceCode="ec2", QuotaCode=quota.id)
            limit = float(found["Quota"]["Value"])
        except (ClientError, BotoCoreError) as error:
            unread.append(Unread(f"the quota {quota.id}", _why(error)))
        readings.append(
            QuotaReading(
                quota,
                limit,
                None if used is None else used.get(quota, 0.0),
                own.get(quota, 0.0),
                INCREASE.format(region=needs.region, code=quota.id),
            )
        )
    return Account(
        "aws", needs.region, zone_offers=zone_offers, quotas=tuple(readings), unread=tuple(unread)
    )
