"""What the account lacks for the stack, each with the fix; and the zone a new stack goes to."""

from __future__ import annotations

from dataclasses import dataclass

from infra.clouds import FACTS
from infra.clouds.azure import REGIONAL_CORES
from infra.clouds.gcp import ALL_REGIONS_CPUS
from infra.preflight.account import Account, QuotaReading
from infra.preflight.needs import Needs

# Quotas that count every vCPU of the stack, whatever its family.
TOTALS = frozenset({REGIONAL_CORES, ALL_REGIONS_CPUS})
# Quotas of the whole account, not of the stack's region.
PROJECT_WIDE = frozenset({ALL_REGIONS_CPUS})


@dataclass(frozen=True)
class Problem:
    what: str  # the setting or prerequisite it is about
    message: str  # what is wrong and how to fix it

    def __str__(self) -> str:
        return f"{self.what}: {self.message}"


EKS_REFUSES = (
    "where EKS refuses a cluster's subnets (docs.aws.amazon.com/eks/latest/userguide/"
    "network-reqs.html)"
)


def _refused_zone(needs: Needs, account: Account) -> Problem | None:
    """A ``zone`` setting whose zone id the platform refuses (EKS's, by id)."""
    zone_id = account.zone_ids.get(needs.zone or "")
    if zone_id is None or zone_id not in needs.refused_zone_ids:
        return None
    usable = account.zones_offering(needs.types, needs.refused_zone_ids)
    return Problem(
        "zone",
        f"{needs.zone} is {zone_id} in this account, {EKS_REFUSES}; choose another zone"
        + (f" ({', '.join(usable)} offer the types)" if usable else "")
        + ", or remove the setting to let the program choose",
    )


def _offered(needs: Needs, account: Account) -> list[Problem]:
    if account.zone_offers is None:
        if FACTS[needs.cloud].zone_suffix is None or needs.zone is not None:
            return []
        why = "; ".join(str(u) for u in account.unread if "zone" in u.what)
        return [
            Problem(
                "zone",
                f"the program could not read which zones of {needs.region} offer "
                f"{', '.join(needs.types)} ({why}); set zone to one that does",
            )
        ]
    if needs.zone is not None:
        found = _refused_zone(needs, account) or _zone_lacks(needs, account)
        return [found] if found else []
    return _no_zone(needs, account)


def _zone_lacks(needs: Needs, account: Account) -> Problem | None:
    """The ``zone`` setting's zone lacks one of the types."""
    offered = (account.zone_offers or {}).get(needs.zone or "", frozenset())
    missing = [t for t in needs.types if t not in offered]
    if not missing:
        return None
    elsewhere = account.zones_offering(needs.types)
    hint = (
        f"zones that offer them: {', '.join(elsewhere)}"
        if elsewhere
        else "no zone of the region offers them all"
    )
    return Problem(
        "zone",
        f"{needs.zone} does not offer {', '.join(missing)} ({hint}); choose another "
        "zone, or remove the setting to let the program choose",
    )


def _no_zone(needs: Needs, account: Account) -> list[Problem]:
    """No zone the program may choose offers every type."""
    types = needs.types
    if account.zones_offering(types, needs.refused_zone_ids):
        return []
    if account.zones_offering(types):  # in refused zones alone
        ids = sorted({account.zone_ids[z] for z in account.zones_offering(types)})
        return [
            Problem(
                "instanceType",
                f"the zones of {needs.region} that offer {' and '.join(types)} are "
                f"{', '.join(ids)}, {EKS_REFUSES}; choose types offered in another zone, or "
                "another region",
            )
        ]
    offers = account.zone_offers or {}
    where = "; ".join(
        f"{t} in {', '.join(sorted(z for z, f in offers.items() if t in f)) or 'none'}"
        for t in types
    )
    return [
        Problem(
            "instanceType",
            f"no zone of {needs.region} offers {' and '.join(types)} together ({where}); "
            "choose types offered in one zone, or another region",
        )
    ]


def _quota(needs: Needs, reading: QuotaReading, need: int) -> Problem | None:
    if reading.limit is None:
        return None
    quota = reading.quota
    name = f"{quota.name} ({quota.id})"
    others = max(0.0, (reading.used or 0.0) - reading.own)
    # The nodes it counts: every node for a total, a family's own for a family's quota.
    counted = sorted(
        (name, count)
        for name, count in needs.nodes.items()
        if quota in TOTALS or FACTS[needs.cloud].vcpu_quota(name) == quota
    )
    shape = (
        f"{need} vCPUs: {' + '.join(f'{n} x {t}' for t, n in counted)}"
        if counted
        else f"{need} vCPUs"
    )
    ask = int(others + need)
    how = reading.increase.format(value=ask)
    where = "" if reading.quota in PROJECT_WIDE else f" in {needs.region}"
    if need > reading.limit:
        return Problem(
            "quota",
            f"{name}{where} is {reading.limit:g} vCPUs; the stack needs {shape}. "
            f"Ask for {ask}: {how}",
        )
    if need > reading.limit - others:
        return Problem(
            "quota",
            f"{name}{where} is {reading.limit:g} vCPUs and other instances use "
            f"{others:g}; the stack needs {shape}. Stop some, or ask for {ask}: {how}",
        )
    return None


def _quotas(needs: Needs, account: Account) -> list[Problem]:
    wanted = needs.quota_needs()
    found = []
    for reading in account.quotas:
        # A family's quota, or a total over every family (Azure's of the region, Google
        # Cloud's of the project).
        if reading.quota in TOTALS:
            need = needs.total_vcpus
        elif reading.quota in wanted:
            need = wanted[reading.quota]
        else:
            continue
        problem = _quota(needs, reading, need)
        if problem:
            found.append(problem)
    return found


def _azure(needs: Needs, account: Account) -> list[Problem]:
    found = [
        Problem(
            "replicas",
            f"{name}, the balancer node's size (with replicas above 1): {why}; choose another "
            "region, or one serving group",
        )
        if name == needs.balancer
        else Problem(
            "instanceType" if name in needs.types else "mainInstanceType",
            f"{name}: {why}; choose another size or region",
        )
        for name, why in sorted(account.unavailable.items())
    ]
    wanted = needs.network_watcher
    if wanted is None:
        return found
    have = account.network_watcher
    if have is None and "network watcher" not in {u.what for u in account.unread}:
        found.append(
            Problem(
                "networkWatcher",
                f"the subscription has no Network Watcher in {needs.region}, which the flow "
                f"log needs: `az network watcher configure --resource-group "
                f"{wanted.resource_group} --locations {needs.region} --enabled true` (create "
                f"the group first with `az group create -n {wanted.resource_group} -l "
                f"{needs.region}` if it does not exist), or set flowLogs to false",
            )
        )
    elif have is not None and (
        have.resource_group.lower(),
        have.name.lower(),
    ) != (wanted.resource_group.lower(), wanted.name.lower()):
        found.append(
            Problem(
                "networkWatcher",
                f"the region's Network Watcher is {have} (one per region and subscription), "
                f"not {wanted}; set it with `pulumi config set networkWatcher {have}`",
            )
        )
    if account.insights_registered is False:
        found.append(
            Problem(
                "flowLogs",
                "the subscription has not registered Microsoft.Insights, which flow logs "
                "need: `az provider register --namespace Microsoft.Insights` (it takes a few "
                "minutes), or set flowLogs to false",
            )
        )
    if account.key_vault_registered is False:
        found.append(
            Problem(
                "apiKey",
                "the subscription has not registered Microsoft.KeyVault, whose vault keeps the "
                "stack's API key: `az provider register --namespace Microsoft.KeyVault` (it "
                "takes a few minutes), or set apiKey to none with --cors-origins in serverArgs",
            )
        )
    return found


def _rights(needs: Needs, account: Account) -> list[Problem]:
    """Rights the deployer lacks, read from the cloud's own permission check: without them the
    stack would stop half-way, after its nodes exist."""
    lacking = account.lacking or frozenset()
    return [
        Problem(
            right.setting,
            f"your identity may not {right.action}, which {right.what} needs: ask for "
            f"{right.roles}, or {right.way_out}",
        )
        for right in needs.rights
        if right.action in lacking
    ]


def _volumes(account: Account) -> list[Problem]:
    """A new throughput for a model volume whose last change EC2 is still making."""
    return [
        Problem(
            "diskThroughputMibps",
            f"the model volume {volume} is still {state} from a change started {started}, and "
            "EC2 takes another change of a volume only once the last is completed (at most four "
            "a day): wait for it (`aws ec2 describe-volumes-modifications --volume-ids "
            f"{volume}`), or keep diskThroughputMibps at {now} until then",
        )
        for volume, (state, now, started) in sorted(account.busy_volumes.items())
    ]


def problems(needs: Needs, account: Account) -> list[Problem]:
    """Everything the account lacks for the stack; empty when it has all it was asked for."""
    return [
        *_offered(needs, account),
        *_quotas(needs, account),
        *_azure(needs, account),
        *_rights(needs, account),
        *_volumes(account),
    ]


def zone_for(needs: Needs, account: Account) -> str | None:
    """The zone to create a new stack's nodes in: the ``zone`` setting, else the first zone by
    name that offers every type, outside the zones the platform refuses (None on Azure, which
    places nodes in no zone, or when the offers were not read and none was set)."""
    if needs.zone is not None:
        return needs.zone
    zones = account.zones_offering(needs.types, needs.refused_zone_ids)
    return zones[0] if zones else None
