"""Azure, live, with the user's own login (the Azure CLI, ``az login``):

- the preflight's reads (Resource Manager): whether the subscription can have each size in the
  region (resource SKUs and their restrictions), the family and regional vCPU quotas (limit and
  use), the stack's own VMs, told apart by their tags, for the flow log, the region's
  Network Watcher and Microsoft.Insights' registration, and the caller's own permissions (the
  role assignments a key, a staged model or a spend guard makes);
- the command channel: Run Command (``RunShellScript``, as root);
- power: ``az vm start`` and the VMs' power states;
- the cost run's audit: resource groups and resources tagged with the stack;
- the object store: Blob Storage, uncommitted blocks of ``KEY`` whose ids say the piece number
  and MD5 (checked by the server), committed in order with the sha256: the blob appears only
  when whole.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shlex
import threading
from collections.abc import Mapping
from typing import Any

from infra.clouds import azure as azure_facts
from infra.clouds.base import VcpuQuota
from infra.core import outputs as keys
from infra.core.layout import PROJECT
from infra.live.base import (
    LOGIN_TIMEOUT_SECONDS,
    SHA256_METADATA,
    Access,
    Channel,
    ChannelError,
    LiveCloud,
    LiveError,
    Piece,
    PowerError,
    Reader,
    Runner,
    StageError,
    Store,
    cli_text,
    named_output,
    power_call,
    run_cli,
)
from infra.preflight.account import Account, QuotaReading, Unread
from infra.preflight.api import ApiError, JsonApi
from infra.preflight.needs import Needs

BASE = "https://management.azure.com/"
SKUS_API = "2021-07-01"
COMPUTE_API = "2024-11-01"
NETWORK_API = "2024-05-01"
RESOURCES_API = "2021-04-01"
AUTHORIZATION_API = "2022-04-01"
INSTALL = "install the Azure CLI (https://learn.microsoft.com/cli/azure/install-azure-cli)"
LOGIN = "no Azure login: run `az login` (and `az account set --subscription ...`)"
INCREASE = (
    "the portal's Quotas page (https://portal.azure.com/#view/Microsoft_Azure_Capacity/"
    "QuotaMenuBlade/~/myQuotas), Compute, {name} in {region}, to {{value}} (`az vm list-usage "
    "--location {region}` shows them)"
)


def _token(access: Access) -> tuple[str, str]:
    """The user's Resource Manager token and subscription id."""
    argv = ["az", "account", "get-access-token", "--resource", BASE, "--output", "json"]
    found = json.loads(cli_text(access, argv, install=INSTALL, login=LOGIN))
    return str(found["accessToken"]), str(found["subscription"])


def _resource_group(stack_outputs: Mapping[str, Any], error: type[LiveError]) -> str:
    group = named_output(stack_outputs, keys.RESOURCE_GROUP, "--resource-group")
    if group is None:
        raise error("the stack names no resource group (its `resourceGroup` output)")
    return group


# --- the preflight's reads ------------------------------------------------------------------------


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


def _lacking(
    api: JsonApi, subscription: str, needs: Needs, unread: list[Unread]
) -> frozenset[str] | None:
    """The needs' rights the caller lacks, from Resource Manager's list of the caller's own
    permissions. It answers per resource group, and the stack's does not exist before its first
    `up`: the subscription's first group shows what the caller holds there, the subscription's
    grants included."""
    if not needs.rights:
        return None
    try:
        groups = api.get(
            f"subscriptions/{subscription}/resourcegroups",
            {"api-version": RESOURCES_API, "$top": "1"},
        ).get("value", [])
        if not groups:
            unread.append(Unread("your permissions", "the subscription has no resource group"))
            return None
        granted = [
            (p.get("actions", []), p.get("notActions", []))
            for page in api.pages(
                f"subscriptions/{subscription}/resourceGroups/{groups[0]['name']}/providers/"
                "Microsoft.Authorization/permissions",
                {"api-version": AUTHORIZATION_API},
            )
            for p in page.get("value", [])
        ]
    except ApiError as error:
        unread.append(Unread("your permissions", str(error)))
        return None
    actions = {right.action for right in needs.rights}
    return frozenset(a for a in actions if not azure_facts.permits(granted, a))


def read_account(needs: Needs, api: JsonApi, subscription: str) -> Account:
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
    lacking = _lacking(api, subscription, needs, unread)
    return Account(
        "azure",
        needs.region,
        unavailable=unavailable,
        quotas=tuple(readings),
        network_watcher=watcher,
        insights_registered=registered,
        key_vault_registered=vaults,
        lacking=lacking,
        unread=tuple(unread),
    )


# --- the command channel --------------------------------------------------------------------------


class RunCommandChannel:
    """Run Command (``RunShellScript``, as root); its message holds stdout and stderr. A VM runs
    one such command at a time."""

    max_output = azure_facts.FACTS.command_output_chars

    def __init__(self, vm: str, resource_group: str, runner: Runner = run_cli):
        self.vm, self.resource_group, self.runner = vm, resource_group, runner

    def run(self, command: list[str], timeout: float) -> str:
        result = self.runner([
            "az", "vm", "run-command", "invoke", "--resource-group", self.resource_group,
            "--name", self.vm, "--command-id", "RunShellScript",
            "--scripts", shlex.join(command), "--output", "json",
        ], timeout)  # fmt: skip
        if result.returncode != 0:
            raise ChannelError(f"az vm run-command on {self.vm}: {result.stderr.strip()[-500:]}")
        message = json.loads(result.stdout)["value"][0]["message"]
        stdout, _, stderr = message.partition("[stderr]")
        if "[stdout]" not in stdout:
            raise ChannelError(f"Run Command on {self.vm} said: {message[-500:]}")
        if stderr.strip() and not stdout.split("[stdout]", 1)[1].strip():
            raise ChannelError(f"Run Command on {self.vm}: {stderr.strip()[-500:]}")
        return str(stdout.split("[stdout]", 1)[1].strip("\n"))


# --- the object store -----------------------------------------------------------------------------


def _container_of(bucket: str) -> tuple[str, str]:
    """``ACCOUNT/CONTAINER``, as ``--bucket`` names a Blob Storage container."""
    if not re.fullmatch(r"[^/\s]+/[^/\s]+", bucket):
        raise StageError(f"--bucket {bucket}: give ACCOUNT/CONTAINER for Blob Storage")
    account, _, container = bucket.partition("/")
    return account, container


class BlobStore:
    def __init__(self, container: Any, account: str) -> None:
        self.container, self.account = container, account  # an azure ContainerClient
        self.ids: dict[tuple[str, int], str] = {}
        self.lock = threading.Lock()

    def url(self, key: str) -> str:
        return f"az://{self.account}/{self.container.container_name}/{key}"

    def check_region(self, region: str) -> None:
        """The account's region is the management plane's to say, which staging does not
        reach; the stack's service endpoint admits the account's own region."""

    def have(self, key: str) -> str | None:
        properties = self._properties(key)
        found = (properties.metadata or {}).get(SHA256_METADATA) if properties else None
        return str(found) if found else None

    def _properties(self, key: str) -> Any:
        from azure.core.exceptions import ResourceNotFoundError  # noqa: PLC0415

        try:
            return self.container.get_blob_client(key).get_blob_properties()
        except ResourceNotFoundError:
            return None

    def earlier(self, key: str) -> dict[int, Piece]:
        from azure.core.exceptions import ResourceNotFoundError  # noqa: PLC0415

        try:
            _committed, uncommitted = self.container.get_blob_client(key).get_block_list(
                "uncommitted"
            )
        except ResourceNotFoundError:
            return {}
        found: dict[int, Piece] = {}
        for block in uncommitted:
            number, _, md5 = base64.b64decode(block.id).decode(errors="replace").partition("-")
            if number.isdigit() and len(md5) == 32:
                found[int(number)] = Piece(block.size, md5)
                self.ids[key, int(number)] = block.id
        return found

    def put(self, key: str, number: int, data: bytes) -> None:
        md5 = hashlib.md5(data, usedforsecurity=False).hexdigest()
        # One length for every id of a blob, as Blob Storage requires: 6 digits, '-', 32 hex.
        block_id = base64.b64encode(f"{number:06d}-{md5}".encode()).decode()
        self.container.get_blob_client(key).stage_block(block_id, data, validate_content=True)
        with self.lock:
            self.ids[key, number] = block_id

    def finish(self, key: str, numbers: list[int], sha256: str) -> None:
        blob = self.container.get_blob_client(key)
        blob.commit_block_list(
            [self.ids[key, n] for n in numbers], metadata={SHA256_METADATA: sha256}
        )

    def discard(self, key: str) -> None:
        """Uncommitted blocks go when their blob's block list is committed: a blob already
        there keeps its own blocks and metadata; one that was not goes again."""
        blob = self.container.get_blob_client(key)
        properties = self._properties(key)
        if properties is None:
            blob.commit_block_list([])
            blob.delete_blob()
            return
        committed, _uncommitted = blob.get_block_list("committed")
        blob.commit_block_list([b.id for b in committed], metadata=properties.metadata)


def _blob_service(account: str, endpoint: str | None, access: Access) -> Any:
    """The Blob service with the user's credentials: a connection string when one is set; a
    service principal or workload identity from the environment (``AZURE_CLIENT_ID``, through
    ``DefaultAzureCredential``); else the Azure CLI's login, checked first, so that no login is
    one line in seconds rather than every credential type's timeouts in turn."""
    from azure.storage.blob import BlobServiceClient  # noqa: PLC0415

    if connection := access.environ.get("AZURE_STORAGE_CONNECTION_STRING"):
        return BlobServiceClient.from_connection_string(connection)
    url = endpoint or f"https://{account}.blob.core.windows.net"
    if access.environ.get("AZURE_CLIENT_ID"):
        from azure.identity import DefaultAzureCredential  # noqa: PLC0415

        return BlobServiceClient(account_url=url, credential=DefaultAzureCredential())
    from azure.identity import AzureCliCredential  # noqa: PLC0415

    _token(access)  # az there and logged in, or CredentialsError with the fix
    credential = AzureCliCredential(process_timeout=int(LOGIN_TIMEOUT_SECONDS))
    return BlobServiceClient(account_url=url, credential=credential)


class Azure(LiveCloud):
    name = "azure"
    provider_settings = ()
    # Azure's power state codes.
    stopped_states = frozenset(
        {"PowerState/deallocating", "PowerState/deallocated", "PowerState/stopped"}
    )
    store_name = "Blob Storage"
    store_credentials = "your Azure login (az login) and a Storage Blob Data Contributor role on it"
    sdk_packages = ("azure",)

    def program_reader(self, settings: Mapping[str, Any]) -> Reader:  # noqa: ARG002 (the LiveCloud interface)
        """The provider's own token and subscription (``getClientToken``, ``getClientConfig``)."""

        def read(needs: Needs) -> Account:
            import pulumi_azure_native as azure_native  # noqa: PLC0415

            token = azure_native.authorization.get_client_token().token
            subscription = azure_native.authorization.get_client_config().subscription_id
            return read_account(needs, JsonApi(BASE, token), subscription)

        return read

    def cli_reader(self, access: Access) -> Reader:
        def read(needs: Needs) -> Account:
            token, subscription = _token(access)
            return read_account(needs, JsonApi(BASE, token, access.transport), subscription)

        return read

    def credentials(self, access: Access) -> list[str]:
        try:
            _token(access)
        except LiveError as error:
            return [str(error)]
        return []

    def channels(
        self, stack_outputs: Mapping[str, Any], mains: list[str], access: Access
    ) -> list[Channel]:
        group = _resource_group(stack_outputs, ChannelError)
        _token(access)  # az there and logged in: else one line with the fix, not a node's
        return [RunCommandChannel(main, group, access.runner) for main in mains]

    def start(self, stack_outputs: Mapping[str, Any], ids: list[str], access: Access) -> list[str]:
        """``az vm start`` for each node (a deallocated VM is allocated again and boots)."""
        group = _resource_group(stack_outputs, PowerError)
        for node in ids:
            argv = ["az", "vm", "start", "--resource-group", group, "--name", node, "--no-wait"]
            power_call(argv, access.runner)
        return [f"{node}: starting" for node in ids]

    def power_states(
        self, stack_outputs: Mapping[str, Any], ids: list[str], access: Access
    ) -> dict[str, str]:
        """Each VM's power state code (PowerState/running, PowerState/deallocated, ...)."""
        group = _resource_group(stack_outputs, PowerError)
        query = "instanceView.statuses[?starts_with(code, 'PowerState/')].code | [0]"
        return {
            node: power_call(["az", "vm", "get-instance-view", "--resource-group", group,
                              "--name", node, "--query", query, "--output", "tsv"],
                             access.runner).strip()
            for node in ids
        }  # fmt: skip

    def leftovers(self, stack: str, access: Access) -> list[str]:
        """Resource groups and resources tagged with the stack."""
        leftovers = []
        for kind in ("group", "resource"):
            result = access.runner([
                "az", kind, "list", "--tag", f"stack={stack}", "--output", "json",
            ])  # fmt: skip
            if result.returncode != 0:
                raise LiveError(f"az {kind} list: {result.stderr.strip()[-300:]}")
            for item in json.loads(result.stdout or "[]"):
                if item.get("tags", {}).get("project") == PROJECT:
                    leftovers.append(f"{kind} {item['name']}")
        return leftovers

    def check_bucket(self, bucket: str) -> None:
        _container_of(bucket)

    def open_store(
        self,
        bucket: str,
        *,
        region: str,
        endpoint: str | None,
    ) -> Store:
        """Azure's credentials (``az login``; ``AZURE_STORAGE_CONNECTION_STRING`` when set);
        ``endpoint``: a Blob endpoint URL."""
        account, container = _container_of(bucket)
        service = _blob_service(account, endpoint, Access(region))
        return BlobStore(service.get_container_client(container), account)
