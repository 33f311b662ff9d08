"""What the account lacks for the stack, each with the fix; and the zone a new stack goes to."""

from __future__ import annotations

from dataclasses import dataclass

from infra.clouds import FACTS
from infra.clouds.azure import REGIONAL_CORES
from infra.preflight.account import Account, QuotaReading
from infra.preflight.needs import Needs


@dataclass(frozen=True)
class Problem:
    what: str  # the setting or prerequisite it is about
    message: str  # what is wrong and how to fix it

    def __str__(self) -> str:
        return f"{self.what}: {self.message}"


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
    types = needs.types
    if needs.zone is not None:
        offered = account.zone_offers.get(needs.zone, frozenset())
        missing = [t for t in types if t not in offered]
        if not missing:
            return []
        elsewhere = account.zones_offering(types)
        hint = (
            f"zones that offer them: {', '.join(elsewhere)}"
            if elsewhere
            else "no zone of the region offers them all"
        )
        return [
            Problem(
                "zone",
                f"{needs.zone} does not offer {', '.join(missing)} ({hint}); choose another "
                "zone, or remove the setting to let the program choose",
            )
        ]
    if account.zones_offering(types):
        return []
    where = "; ".join(
        f"{t} in {', '.join(sorted(z for z, f in account.zone_offers.items() if t in f)) or 'none'}"
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
    shape = (
        f"{need} vCPUs: {' + '.join(f'{n} x {t}' for t, n in sorted(needs.nodes.items()))}"
        if needs.nodes
        else f"{need} vCPUs"
    )
    ask = int(others + need)
    how = reading.increase.format(value=ask)
    if need > reading.limit:
        return Problem(
            "quota",
            f"{name} in {needs.region} is {reading.limit:g} vCPUs; the stack needs {shape}. "
            f"Ask for {ask}: {how}",
        )
    if need > reading.limit - others:
        return Problem(
            "quota",
            f"{name} in {needs.region} is {reading.limit:g} vCPUs and other instances use "
            f"{others:g}; the stack needs {shape}. Stop some, or ask for {ask}: {how}",
        )
    return None


def _quotas(needs: Needs, account: Account) -> list[Problem]:
    wanted = needs.quota_needs()
    found = []
    for reading in account.quotas:
        # A family's quota, or Azure's total over every family of the region.
        if reading.quota == REGIONAL_CORES:
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
                "takes a few minutes), or set apiKey to none",
            )
        )
    return found


def problems(needs: Needs, account: Account) -> list[Problem]:
    """Everything the account lacks for the stack; empty when it has all it was asked for."""
    return [*_offered(needs, account), *_quotas(needs, account), *_azure(needs, account)]


def zone_for(needs: Needs, account: Account) -> str | None:
    """The zone to create a new stack's nodes in: the ``zone`` setting, else the first zone by
    name that offers every type (None on Azure, which places nodes in no zone, or when the
    offers were not read and none was set)."""
    if needs.zone is not None:
        return needs.zone
    zones = account.zones_offering(needs.types)
    return zones[0] if zones else None
