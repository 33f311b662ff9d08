"""The input rules of Azure Resource Manager for every resource type the program creates
(``infra.conformance.rules``): names (pulumi-azure-native appends 8 random hex characters to the
logical name, with no separator and no limit of its own), tags, the values and combinations the
program's inputs must keep, the writes Azure serialises, and the inputs whose change replaces a
resource (create-only properties and the parent's names).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from infra.clouds import azure
from infra.conformance.rules import (
    After,
    AutoName,
    Between,
    Name,
    OneAtATime,
    OneOf,
    Registered,
    Requires,
    ResourceRules,
    Stack,
    Tags,
    Text,
    by_type,
)

NAMES = "https://learn.microsoft.com/azure/azure-resource-manager/management/resource-name-rules"
TAGS = (
    "https://learn.microsoft.com/azure/azure-resource-manager/management/tag-resources#limitations"
)
PULUMI_AZURE = "pulumi/pulumi-azure-native provider/pkg/provider (random auto-names)"
REPLACEMENT = "pulumi/pulumi-azure-native provider/pkg/gen (create-only properties replace)"
AUTONAME = AutoName(random=8, separator="", max_length=None)
# Most Microsoft.Network names: 1-80 letters, digits, '_', '.', '-'; a letter or digit first,
# a letter, digit or '_' last.
NETWORK_NAME = re.compile(r"[A-Za-z0-9](?:[\w.-]*\w)?")
NETWORK_MEANING = "1-80 letters, digits, '_', '.', '-', starting alnum and ending alnum or '_'"
# Role assignment conditions (ABAC): "Currently the only accepted value is '2.0'".
CONDITIONS = "https://learn.microsoft.com/rest/api/authorization/role-assignments/create"
# Key Vault: names of 3-24 characters, global (the vault's DNS name); objects' names of
# letters, digits and '-' up to 127; a secret's value at most 25 KB; soft delete kept 7-90 days.
KEY_VAULT_NAMES = "https://learn.microsoft.com/azure/azure-resource-manager/management/resource-name-rules#microsoftkeyvault"
KEY_VAULT_OBJECTS = "https://learn.microsoft.com/azure/key-vault/general/about-keys-secrets-certificates#object-identifiers"
KEY_VAULT_SOFT_DELETE = "https://learn.microsoft.com/azure/key-vault/general/soft-delete-overview"
KEY_VAULT_REST = "https://learn.microsoft.com/rest/api/keyvault/keyvault/vaults/create-or-update"
# Custom role properties: Name (roleName) unique in the tenant, at most 512 characters;
# Description at most 1024; Id a GUID; AssignableScopes and Actions required.
CUSTOM_ROLES = "https://learn.microsoft.com/azure/role-based-access-control/custom-roles#custom-role-properties"
PARENT = ("resourceGroupName", "location")
# A network write waits for the previous one on the same parent: parallel ones get 429
# RetryableErrorDueToAnotherOperation / 409 AnotherOperationInProgress (pulumi-azure-native#699,
# #1024, #3720; Azure/azure-sdk-for-python#556).
SERIALISED = "pulumi/pulumi-azure-native#699 and #3720; Azure/azure-sdk-for-python#556"


def network_name(prop: str, low: int = 1, high: int = 80) -> Name:
    return Name(
        prop, NETWORK_NAME, low, high, NETWORK_MEANING, f"{NAMES}; {PULUMI_AZURE}", AUTONAME
    )


def tags(path: str = "tags", max_name: int = 512) -> Tags:
    def problem(found: Mapping[str, str]) -> str | None:
        return azure.tag_set_problem(found, max_name)

    return Tags(path, problem, TAGS)


def _owned_nic_detached(resource: Registered, stack: Stack) -> str | None:
    """A NIC that is a resource of the stack must outlive its VM: a VM that deletes it on
    replacement leaves the new VM pointing at a NIC that is gone."""
    profile = resource.inputs.get("networkProfile") or {}
    for nic in profile.get("networkInterfaces") or []:
        owner = stack.owner(nic.get("id"))
        if owner is not None and nic.get("deleteOption", "Detach") != "Detach":
            return (
                f"networkInterfaces deleteOption {nic.get('deleteOption')!r} deletes {owner.name}, "
                "a resource of its own, with the VM; set Detach"
            )
    return None


def _custom_data(resource: Registered, _stack: Stack) -> str | None:
    data = str((resource.inputs.get("osProfile") or {}).get("customData", ""))
    if len(data) > azure.FACTS.user_data.limit_bytes:
        return (
            f"customData of {len(data)} characters; Azure takes {azure.FACTS.user_data.limit_bytes}"
        )
    return None


def _unique_priorities(resource: Registered, _stack: Stack) -> str | None:
    seen: dict[tuple[str, int], str] = {}
    for rule in resource.inputs.get("securityRules") or []:
        key = (rule.get("direction"), rule.get("priority"))
        if key in seen:
            return f"rules {seen[key]} and {rule.get('name')} share priority {key[1]}"
        seen[key] = rule.get("name")
    return None


def _rule_names(resource: Registered, _stack: Stack) -> str | None:
    for rule in resource.inputs.get("securityRules") or []:
        name = str(rule.get("name", ""))
        if not (1 <= len(name) <= 80 and NETWORK_NAME.fullmatch(name)):
            return f"security rule name {name!r}: {NETWORK_MEANING}"
    return None


SECURITY_RULE_VALUES = (
    Between("securityRules.*.priority", 100, 4096, NAMES),
    OneOf("securityRules.*.direction", ("Inbound", "Outbound"), NAMES),
    OneOf("securityRules.*.access", ("Allow", "Deny"), NAMES),
    Text("securityRules.*.description", 140, "pulumi_azure_native.network.SecurityRule docs"),
    Requires(_rule_names, NAMES),
    Requires(
        _unique_priorities,
        "https://learn.microsoft.com/azure/virtual-network/network-security-groups-overview#security-rules",
    ),
)

RULES = by_type(
    ResourceRules(
        "azure-native:resources:ResourceGroup",
        (
            tags(),
            Name(
                "resourceGroupName",
                azure.RESOURCE_GROUP_NAME,
                1,
                90,
                "1-90 letters, digits, _ ( ) - and ., not ending in '.'",
                f"{NAMES}; {PULUMI_AZURE}",
                AUTONAME,
            ),
        ),
        replaced_on=("resourceGroupName", "location"),
        source=REPLACEMENT,
    ),
    ResourceRules(
        "azure-native:network:PublicIPAddress",
        (
            tags(),
            network_name("publicIpAddressName"),
            OneOf("sku.name", ("Standard",), "Basic public IPs are retired (2025-09-30)"),
            OneOf("publicIPAllocationMethod", ("Static",), "a Standard public IP is static"),
        ),
        replaced_on=(*PARENT, "publicIpAddressName", "sku", "publicIPAddressVersion"),
        source=REPLACEMENT,
    ),
    ResourceRules(
        "azure-native:network:NatGateway",
        (tags(), network_name("natGatewayName")),
        replaced_on=(*PARENT, "natGatewayName", "zones"),
        source=REPLACEMENT,
    ),
    ResourceRules(
        "azure-native:network:VirtualNetwork",
        (tags(), network_name("virtualNetworkName", 2, 64)),
        replaced_on=(*PARENT, "virtualNetworkName"),
        source=REPLACEMENT,
    ),
    ResourceRules(
        "azure-native:network:NetworkSecurityGroup",
        (tags(), network_name("networkSecurityGroupName"), *SECURITY_RULE_VALUES),
        replaced_on=(*PARENT, "networkSecurityGroupName"),
        source=REPLACEMENT,
    ),
    ResourceRules(
        "azure-native:network:SecurityRule",
        (
            Name(
                "securityRuleName",
                NETWORK_NAME,
                1,
                80,
                NETWORK_MEANING,
                f"{NAMES}; {PULUMI_AZURE}",
                AUTONAME,
            ),
            Between("priority", 100, 4096, NAMES),
            Text("description", 140, "pulumi_azure_native.network.SecurityRule docs"),
            OneAtATime("networkSecurityGroupName", "one write to an NSG at a time", SERIALISED),
        ),
        replaced_on=("resourceGroupName", "networkSecurityGroupName", "securityRuleName"),
        source=REPLACEMENT,
    ),
    ResourceRules(
        "azure-native:network:Subnet",
        (
            network_name("subnetName"),
            OneAtATime("virtualNetworkName", "one subnet of a VNet at a time", SERIALISED),
        ),
        replaced_on=("resourceGroupName", "virtualNetworkName", "subnetName"),
        source=REPLACEMENT,
    ),
    ResourceRules(
        "azure-native:storage:StorageAccount",
        (
            tags(max_name=128),
            Name(
                "accountName",
                re.compile(r"[a-z0-9]+"),
                3,
                24,
                "3-24 lowercase letters and digits",
                f"{NAMES}; {PULUMI_AZURE}",
                AUTONAME,
            ),
            OneOf(
                "minimumTlsVersion",
                ("TLS1_2",),
                "https://learn.microsoft.com/azure/storage/common/transport-layer-security-configure-minimum-version",
            ),
        ),
        replaced_on=(*PARENT, "accountName", "isHnsEnabled"),
        source=REPLACEMENT,
    ),
    ResourceRules(
        "azure-native:network:FlowLog",
        (
            tags(),
            network_name("flowLogName"),
            Name(
                "networkWatcherName",
                azure.NETWORK_WATCHER_NAME,
                1,
                80,
                NETWORK_MEANING,
                NAMES,
                autoname=None,
            ),
            Between(
                "retentionPolicy.days",
                0,
                365,
                "https://learn.microsoft.com/azure/network-watcher/vnet-flow-logs-overview",
            ),
            After(
                ("azure-native:network:Subnet",),
                "Azure enables the region's Network Watcher when a VNet is written",
                "https://learn.microsoft.com/azure/network-watcher/network-watcher-create",
            ),
        ),
        replaced_on=("resourceGroupName", "networkWatcherName", "flowLogName", "location"),
        source=REPLACEMENT,
    ),
    ResourceRules(
        "azure-native:network:BastionHost",
        (
            tags(),
            network_name("bastionHostName"),
            OneOf("sku.name", ("Standard", "Premium"), "native-client tunnels need Standard"),
        ),
        replaced_on=(*PARENT, "bastionHostName"),
        source=REPLACEMENT,
    ),
    ResourceRules(
        "azure-native:network:ApplicationSecurityGroup",
        (tags(), network_name("applicationSecurityGroupName")),
        replaced_on=(*PARENT, "applicationSecurityGroupName"),
        source=REPLACEMENT,
    ),
    ResourceRules(
        "azure-native:compute:ProximityPlacementGroup",
        (tags(), network_name("proximityPlacementGroupName")),
        replaced_on=(*PARENT, "proximityPlacementGroupName"),
        source=REPLACEMENT,
    ),
    ResourceRules(
        "azure-native:network:NetworkInterface",
        (tags(), network_name("networkInterfaceName")),
        replaced_on=(*PARENT, "networkInterfaceName"),
        source=REPLACEMENT,
        held=("ipConfigurations.*.privateIPAddress",),
        held_source=(
            'PrivateIPAddressIsAllocated ("is using the private IP address ... which is '
            'already allocated to resource", F5Networks/terraform-azure-bigip-module#63)'
        ),
    ),
    ResourceRules(
        "azure-native:compute:VirtualMachine",
        (
            tags(),
            Name(
                "vmName",
                re.compile(
                    r"[^\\/\"\[\]:|<>+=;,?*@&_][^\\/\"\[\]:|<>+=;,?*@&]*[^\\/\"\[\]:|<>+=;,?*@&.-]"
                ),
                1,
                64,
                "a Linux VM name: no \\ / \" [ ] : | < > + = ; , ? * @ &, not starting with '_' "
                "or ending with '.' or '-'",
                f"{NAMES}; {PULUMI_AZURE}",
                AUTONAME,
            ),
            Requires(
                lambda r, _: (
                    None
                    if 1
                    <= len(str((r.inputs.get("osProfile") or {}).get("computerName", "x")))
                    <= 64
                    else "osProfile.computerName holds 1-64 characters on Linux"
                ),
                "pulumi_azure_native.compute.OSProfileArgs (computerName)",
            ),
            Requires(
                _owned_nic_detached,
                "pulumi_azure_native.compute.NetworkInterfaceReferenceArgs (deleteOption)",
            ),
            Requires(
                _custom_data, "https://learn.microsoft.com/azure/virtual-machines/custom-data"
            ),
        ),
        # Azure refuses an osProfile change (customData, computerName) on a VM; the program
        # replaces the node instead (replace_on_changes).
        replaced_on=(*PARENT, "vmName", "zones", "osProfile.computerName"),
        source=REPLACEMENT,
    ),
    ResourceRules(
        "azure-native:resources:TagAtScope",
        (tags("properties.tags"),),
        replaced_on=("scope",),
        source=REPLACEMENT,
    ),
    ResourceRules(
        "azure-native:keyvault:Vault",
        (
            tags(),
            Name(
                "vaultName",
                re.compile(r"[A-Za-z](?:-?[A-Za-z0-9])*"),
                3,
                24,
                "a vault name: a letter first, then letters, digits and single hyphens, ending in "
                "a letter or digit (global: it is the vault's DNS name)",
                KEY_VAULT_NAMES,
                None,
            ),
            Between("properties.softDeleteRetentionInDays", 7, 90, KEY_VAULT_SOFT_DELETE),
            OneOf("properties.sku.name", ("standard", "premium"), KEY_VAULT_REST),
            OneOf("properties.sku.family", ("A",), KEY_VAULT_REST),
            Requires(
                lambda r, _: (
                    None
                    if (r.inputs.get("properties") or {}).get("tenantId")
                    else "properties.tenantId is required"
                ),
                KEY_VAULT_REST,
            ),
        ),
        replaced_on=(*PARENT, "vaultName"),
        source=REPLACEMENT,
    ),
    ResourceRules(
        "azure-native:keyvault:Secret",
        (
            tags(),
            Name(
                "secretName",
                re.compile(r"[0-9A-Za-z-]+"),
                1,
                127,
                "a secret name: letters, digits and '-'",
                KEY_VAULT_OBJECTS,
                None,
            ),
            Text("properties.value", 25_600, KEY_VAULT_OBJECTS, required=True),
        ),
        replaced_on=("resourceGroupName", "vaultName", "secretName"),
        source=REPLACEMENT,
    ),
    ResourceRules(
        "azure-native:authorization:RoleDefinition",
        (
            Name(
                "roleDefinitionId",
                re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"),
                36,
                36,
                "a GUID",
                CUSTOM_ROLES,
                None,
            ),
            Text("roleName", 512, CUSTOM_ROLES, required=True),
            Text("description", 1024, CUSTOM_ROLES),
            OneOf("roleType", ("CustomRole",), CUSTOM_ROLES),
            Requires(
                lambda r, _: (
                    None
                    if r.inputs.get("assignableScopes")
                    and all(a.get("actions") for a in r.inputs.get("permissions") or [{}])
                    else "a custom role names its assignable scopes and at least one action"
                ),
                CUSTOM_ROLES,
            ),
        ),
        replaced_on=("scope", "roleDefinitionId"),
        source=REPLACEMENT,
    ),
    ResourceRules(
        "azure-native:authorization:RoleAssignment",
        (
            Text(
                "description",
                2048,
                "https://learn.microsoft.com/rest/api/authorization/role-assignments/create",
            ),
            OneOf("conditionVersion", ("2.0",), CONDITIONS),
        ),
        replaced_on=("principalId", "scope", "roleDefinitionId"),
        source=REPLACEMENT,
    ),
)
