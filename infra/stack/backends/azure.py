"""Azure Cobalt 100: a VNet with a NAT gateway (new VNets have no default outbound access),
an NSG whose rules name application security groups per role and serving group and deny all
other inbound traffic explicitly, accelerated NICs without public IPs, a proximity placement
group per serving group, and a balancer node (HAProxy, ``infra.boot.balancer``) in front of the
groups when there are several.

Baseline (Azure security benchmark): Trusted Launch (secure boot, vTPM), no managed identity on
any node but where a feature needs one (the main node's, with read access to a staged model's
containers; with a spend guard, each node's, the balancer node's too, which may deallocate that
node and nothing else),
VNet flow logs to a storage account of the stack, tags on every resource including the OS
disks, and optionally encryption at host and a Bastion host for the tunnel.
"""

from __future__ import annotations

import functools
import hashlib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import pulumi
import pulumi_azure_native as azure
import pulumi_random as random

from infra.boot.balancer import render as render_balancer
from infra.boot.deliver import deliver
from infra.clouds import azure as azure_facts
from infra.clouds.base import FLOW_LOG_RETENTION_DAYS
from infra.clouds.stores import blob_object, listed_prefixes
from infra.core import layout, outputs, sizing
from infra.core.limits import METRICS_PORT
from infra.stack.backends.base import (
    BalancerPlace,
    CloudBackend,
    GroupSpec,
    Node,
    NodeSpec,
    node_options,
)
from infra.stack.config import AZURE_API_KEY_SECRET, ClusterConfig

IMAGE: azure.compute.ImageReferenceArgsDict = {
    "publisher": "Canonical",
    "offer": "ubuntu-24_04-lts",
    "sku": "server-arm64",  # Generation 2, as Cobalt 100 requires
    "version": "latest",
}
# Trusted Launch covers Dpsv6, Dplsv6 and Epsv6 (Arm64):
# https://learn.microsoft.com/azure/virtual-machines/trusted-launch#virtual-machines-sizes
SECURITY_TYPE = "TrustedLaunch"
BASTION_SUBNET = "AzureBastionSubnet"  # the name Azure requires
ADMIN_USER = "azureuser"
# Azure will not create a Linux VM with passwords off and no SSH key. Without sshPublicKey the
# VM gets this public key, whose private half was destroyed when it was made: nobody can log in
# over SSH; use Run Command or Bastion.
LOCKED_SSH_KEY = (
    "ssh-rsa "
    "AAAAB3NzaC1yc2EAAAADAQABAAABgQCdf1yAEh//IQFQOejlGri52+p3SkOs0ZhULsynGnkjl6mjURXBag5AHj5f"
    "kTwm6D9YHwdgdB03UQjzRhtsY12ll/SLG2P0fbdYuT0XHtTkRQIinqc+irFrQssQxRtKJaPWSuj+dI5Vs0WXNOyP"
    "JZ3uQBdMpsRNFCH7nXWZS/hF6XEmkNLCX8wWDqDH2sBh3oCfdP7QC4pTOcolvaRVFEVvMIzPayCEFFuhCWy3tNvs"
    "dvnl8TAM5bVbSlNaomRJUXiNEIJNJtPgy9o2CeQjzNAcx67t0fc0R5xuaRvIrgTmVqVzBuUmwax+E1Vvq0aiPrro"
    "/prwYiuL2EmB7F+X2vks/93U25OISIzmRpXvmsDJa/fBfvemDOerbAuqDLyq4I7sAtYnh5kE2E0tem1tlWfGrN1b"
    "w/Hoa4fLwyPmUGOVrQrXwgHSrxy8MssiznW5rM2G7m5Xn7QoQ8jCdHjF8A5lXpQ79HH/xHQ6BjVt6H6hDhtDh3n0"
    "9wbosWh2EM0stTc="
    " llama-rpc-cluster: private half destroyed"
)
DENY_PRIORITY = 4000  # above Azure's default AllowVnetInBound (65000)
# The NSG is shared: each serving group's rules take the first group's priorities (100-140)
# plus this much per group (300-340 for the second, ... 1900-1940 for the tenth).
GROUP_PRIORITY_STRIDE = 200
# The balancer node's own inbound rules (with a balancer), after every group's (at most 1940).
BALANCER_PRIORITY = 3000
# Storage Blob Data Reader: read and list blobs, nothing else (a built-in role, the same id in
# every subscription):
# https://learn.microsoft.com/azure/role-based-access-control/built-in-roles/storage#storage-blob-data-reader
BLOB_DATA_READER = "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1"
# Key Vault Secrets User: read a secret's value, nothing else (a built-in role, the same id in
# every subscription), given to the main node's identity on the API key's secret alone:
# https://learn.microsoft.com/azure/role-based-access-control/built-in-roles/security#key-vault-secrets-user
KEY_VAULT_SECRETS_USER = "4633458b-17de-408a-b874-0445c86b69e6"
# Soft-deleted vaults keep their name this long; the least Azure takes (a destroyed stack's
# vault is gone after a week; each stack's vault name is its own, so none waits for it).
VAULT_RETENTION_DAYS = 7
VAULT_NAME_RANDOM = 16  # "lrc" and 16 letters and digits: 19 of the 24 characters allowed
# A spend guard's one permission: deallocate (stop the compute charge of) a VM, given to each
# node's identity on that node alone, through a custom role of the stack's resource group.
# https://learn.microsoft.com/azure/role-based-access-control/permissions/compute
DEALLOCATE_ACTION = "Microsoft.Compute/virtualMachines/deallocate/action"
# The service endpoint that routes the subnet's traffic to Azure Storage over Azure's backbone.
STORAGE_SERVICE = "Microsoft.Storage"


# A role assignment's condition (Azure ABAC, syntax version 2.0) narrows Storage Blob Data
# Reader to the staged model's blobs, as the AWS and GCP grants name their objects:
# https://learn.microsoft.com/azure/storage/blobs/storage-auth-abac-attributes
BLOB_READ = "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/read"
BLOB_PATH = "@Resource[Microsoft.Storage/storageAccounts/blobServices/containers/blobs:path]"
BLOB_PREFIX = "@Request[Microsoft.Storage/storageAccounts/blobServices/containers/blobs:prefix]"
CONDITION_VERSION = "2.0"


def _any_of(attribute: str, values: list[str]) -> str:
    quoted = ", ".join(f"'{value}'" for value in values)  # names hold no quote (network_rules)
    return f"{attribute} ForAnyOfAnyValues:StringEquals {{{quoted}}}"


def blob_read_condition(keys: list[str]) -> str:
    """The condition under which the main node's identity reads a container: a blob only if it
    is one of ``keys``; a listing only of the prefixes rclone lists to read them
    (``clouds.stores.listed_prefixes``). A part at the container's top is read after a listing
    without a prefix, which no condition can name: the container's names are then listed."""
    reads = (
        f"(!(ActionMatches{{'{BLOB_READ}'}} AND NOT SubOperationMatches{{'Blob.List'}})) "
        f"OR ({_any_of(BLOB_PATH, sorted(set(keys)))})"
    )
    prefixes = listed_prefixes(sorted(set(keys)))
    if "" in prefixes:
        return f"({reads})"
    lists = (
        f"(!(ActionMatches{{'{BLOB_READ}'}} AND SubOperationMatches{{'Blob.List'}})) "
        f"OR ({_any_of(BLOB_PREFIX, prefixes)})"
    )
    return f"({reads}) AND ({lists})"


def staged_blobs(urls: tuple[str, ...]) -> dict[tuple[str, str], list[str]]:
    """The keys that az:// model URLs read, by (account, container)."""
    found: dict[tuple[str, str], list[str]] = {}
    for account, container, key in filter(None, map(blob_object, urls)):
        found.setdefault((account, container), []).append(key)
    return found


def staged_containers(urls: tuple[str, ...]) -> list[tuple[str, str]]:
    """(account, container) of each container that az:// model URLs read, once each."""
    blobs = [blob for blob in map(blob_object, urls) if blob]
    return sorted({(account, container) for account, container, _ in blobs})


def container_scope(subscription: str, group: str, account: str, container: str) -> str:
    """The ARM id of a blob container: the narrowest scope a data role can be given at."""
    return (
        f"/subscriptions/{subscription}/resourceGroups/{group}/providers/Microsoft.Storage/"
        f"storageAccounts/{account}/blobServices/default/containers/{container}"
    )


def deallocate_role_id(resource_group_id: str) -> str:
    """The deallocate role's GUID, the same on every update of the stack."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{resource_group_id}/llama-rpc-deallocate"))


def guarded(config: ClusterConfig) -> bool:
    """The stack sets a spend guard: each node stops itself."""
    return bool(config.stop_after_idle_minutes or config.stop_after_hours)


def role_definition(subscription: str, role: str) -> str:
    return f"/subscriptions/{subscription}/providers/Microsoft.Authorization/roleDefinitions/{role}"


@dataclass(frozen=True)
class GroupSecurity:
    """A serving group's application security groups, which its NSG rules name."""

    main: azure.network.ApplicationSecurityGroup
    worker: azure.network.ApplicationSecurityGroup


@dataclass(frozen=True)
class AzureNetwork:
    resource_group: azure.resources.ResourceGroup
    subnet: azure.network.Subnet
    security_group: azure.network.NetworkSecurityGroup
    bastion: azure.network.BastionHost | None
    # Each serving group's, made before the NSG, which declares every rule at once.
    group_security: tuple[GroupSecurity, ...]
    # The balancer node's place and application security group, with a balancer: made before
    # the NSG too.
    balancer: BalancerPlace[azure.network.ApplicationSecurityGroup] | None = None
    # With a spend guard: the custom role that lets a node deallocate itself.
    deallocate_role: azure.authorization.RoleDefinition | None = None
    # With an API key: the stack's Key Vault, which keeps it.
    key_vault: azure.keyvault.Vault | None = None


@dataclass(frozen=True)
class AzureGroup:
    """One serving group's application security groups and placement."""

    main: azure.network.ApplicationSecurityGroup
    worker: azure.network.ApplicationSecurityGroup
    placement: azure.compute.ProximityPlacementGroup


def inbound_rule(
    name: str, priority: int, spec: dict[str, Any]
) -> azure.network.SecurityRuleArgsDict:
    """One inbound rule of the stack's NSG, as the NSG declares it."""
    rule = {"name": name, "priority": priority, "direction": "Inbound", "source_port_range": "*"}
    return cast(azure.network.SecurityRuleArgsDict, {**rule, **spec})


def group_rule_name(index: int, rule: str) -> str:
    """A serving group's rule: ``g1-allow-rpc-from-main``, ``g2-…``, in the one NSG."""
    return f"g{index + 1}-{rule}"


def _api_port(config: ClusterConfig) -> dict[str, Any]:
    return {"access": "Allow", "protocol": "Tcp", "destination_port_range": str(config.server_port)}


def _api_sources(config: ClusterConfig) -> dict[str, tuple[int, dict[str, Any]]]:
    """Who reaches the API from outside the cluster, by rule and priority offset: Bastion's
    subnet (the tunnel) and apiAllowedCidrs."""
    rules: dict[str, tuple[int, dict[str, Any]]] = {}
    if config.api_allowed_cidrs:
        rules["allow-api-from-allowed-cidrs"] = (
            10,
            {"source_address_prefixes": list(config.api_allowed_cidrs)},
        )
    if config.bastion:
        rules["allow-api-from-bastion"] = (20, {"source_address_prefix": str(config.public_subnet)})
    return rules


def group_rules(
    config: ClusterConfig,
    index: int,
    main: pulumi.Input[str],
    worker: pulumi.Input[str],
    balancer: pulumi.Input[str] | None = None,
) -> list[azure.network.SecurityRuleArgsDict]:
    """A serving group's inbound rules, by the ids of its application security groups: its
    workers take RPC and node metrics from its own main node only; the API from Bastion,
    apiAllowedCidrs and (``balancer``, with one) the balancer node. The first group's
    priorities are 100-140, each further group's GROUP_PRIORITY_STRIDE higher."""
    api = {"destination_application_security_groups": [{"id": main}]}
    api_port = _api_port(config)
    rules: dict[str, tuple[int, dict[str, Any]]] = {
        "allow-rpc-from-main": (
            100,
            {
                "access": "Allow",
                "protocol": "Tcp",
                "source_application_security_groups": [{"id": main}],
                "destination_application_security_groups": [{"id": worker}],
                "destination_port_range": str(config.rpc_port),
            },
        ),
        "allow-metrics-from-main": (
            130,
            {
                "access": "Allow",
                "protocol": "Tcp",
                "source_application_security_groups": [{"id": main}],
                "destination_application_security_groups": [{"id": worker}],
                "destination_port_range": str(METRICS_PORT),
            },
        ),
    }
    for rule, (offset, source) in _api_sources(config).items():
        rules[rule] = (100 + offset, {**api_port, **api, **source})
    if balancer is not None:
        rules["allow-api-from-balancer"] = (
            140,
            {**api_port, **api, "source_application_security_groups": [{"id": balancer}]},
        )
    return [
        inbound_rule(group_rule_name(index, rule), base + GROUP_PRIORITY_STRIDE * index, spec)
        for rule, (base, spec) in sorted(rules.items(), key=lambda item: item[1][0])
    ]


def balancer_rules(
    config: ClusterConfig, balancer: pulumi.Input[str]
) -> list[azure.network.SecurityRuleArgsDict]:
    """The balancer node's inbound rules: the API from Bastion and apiAllowedCidrs, as a main
    node takes it (``balancer`` is the id of its application security group)."""
    api = {**_api_port(config), "destination_application_security_groups": [{"id": balancer}]}
    return [
        inbound_rule(f"balancer-{rule}", BALANCER_PRIORITY + offset, {**api, **source})
        for rule, (offset, source) in sorted(_api_sources(config).items(), key=lambda i: i[1][0])
    ]


DENY_RULE = inbound_rule(
    "deny-other-inbound",
    DENY_PRIORITY,
    {
        "access": "Deny",
        "protocol": "*",
        "source_address_prefix": "*",
        "destination_address_prefix": "*",
        "destination_port_range": "*",
    },
)


def _os_disk_id(profile: azure.compute.outputs.StorageProfileResponse | None) -> str:
    disk = profile.os_disk.managed_disk if profile and profile.os_disk else None
    if disk is None or not disk.id:
        raise ValueError("the VM reported no managed OS disk")
    return disk.id


class AzureBackend(CloudBackend[AzureNetwork, AzureGroup]):
    facts = azure_facts.FACTS
    # The API key's secret (``keep_api_key``, before any node): each main node's grant is on it.
    api_key_secret: azure.keyvault.Secret | None = None

    def limitations(self, config: ClusterConfig) -> Mapping[str, str]:
        found = dict(self.facts.limitations)
        if not config.bastion:
            found["tunnel"] = (
                "no port forward without `bastion: true`: connectCommand queries the API with "
                "Run Command"
            )
        return found

    def network(
        self,
        name: str,
        config: ClusterConfig,
        parent: pulumi.Resource,
        *,
        zone: str | None,  # noqa: ARG002 (the Backend interface)
    ) -> AzureNetwork:
        """Nodes in no zone: a proximity placement group per serving group keeps them close."""
        opts = pulumi.ResourceOptions(parent=parent)
        tags = self.tags(config, "network")
        group = azure.resources.ResourceGroup(
            f"{name}-rg", location=config.region, tags=tags, opts=opts
        )
        rg = group.name
        nat_ip = azure.network.PublicIPAddress(
            f"{name}-nat-ip",
            resource_group_name=rg,
            sku={"name": "Standard"},
            public_ip_allocation_method="Static",
            tags=tags,
            opts=opts,
        )
        nat = azure.network.NatGateway(
            f"{name}-nat",
            resource_group_name=rg,
            sku={"name": "Standard"},
            public_ip_addresses=[{"id": nat_ip.id}],
            tags=tags,
            opts=opts,
        )
        vnet = azure.network.VirtualNetwork(
            f"{name}-vnet",
            resource_group_name=rg,
            address_space={"address_prefixes": [str(config.vpc_cidr)]},
            tags=tags,
            opts=opts,
        )
        security = tuple(
            GroupSecurity(
                *(
                    azure.network.ApplicationSecurityGroup(
                        f"{layout.group_name(name, index)}-{role}-asg",
                        resource_group_name=rg,
                        tags=self.tags(config, role),
                        opts=opts,
                    )
                    for role in ("main", "worker")
                )
            )
            for index in range(config.replicas)
        )
        balancer = None
        if config.balancer_boot is not None:
            balancer_security = azure.network.ApplicationSecurityGroup(
                f"{name}-balancer-asg",
                resource_group_name=rg,
                tags=self.tags(config, "balancer"),
                opts=opts,
            )
            balancer = BalancerPlace(config.balancer_boot, balancer_security)
        balancer_id = balancer.firewall.id if balancer is not None else None
        # Every rule in the NSG's one write: Azure serialises the writes to an NSG and answers
        # parallel ones (a rule each) with 429 or 409, which the provider may not retry.
        rules = [
            rule
            for index, group in enumerate(security)
            for rule in group_rules(config, index, group.main.id, group.worker.id, balancer_id)
        ]
        if balancer_id is not None:
            rules += balancer_rules(config, balancer_id)
        nsg = azure.network.NetworkSecurityGroup(
            f"{name}-nsg",
            resource_group_name=rg,
            security_rules=[*rules, DENY_RULE],
            tags=tags,
            opts=opts,
        )
        subnet = azure.network.Subnet(
            f"{name}-private",
            resource_group_name=rg,
            virtual_network_name=vnet.name,
            address_prefix=str(config.private_subnet),
            nat_gateway={"id": nat.id},
            network_security_group={"id": nsg.id},
            default_outbound_access=False,
            # A staged model's blobs over Azure's backbone, not the NAT gateway.
            service_endpoints=(
                [{"service": STORAGE_SERVICE}] if staged_containers(config.fetched_urls) else None
            ),
            opts=opts,
        )
        subnets = [subnet]
        bastion = None
        if config.bastion:
            bastion, bastion_subnet = self._bastion(
                name=name, config=config, group=group, vnet=vnet, after=subnet, tags=tags, opts=opts
            )
            subnets.append(bastion_subnet)
        if config.flow_logs:
            self._flow_logs(
                name=name,
                config=config,
                group=group,
                vnet=vnet,
                after=subnets,
                tags=tags,
                opts=opts,
            )
        role = self._deallocate_role(name, group, opts) if guarded(config) else None
        vault = (
            self._key_vault(name, config, group, nat_ip, opts) if config.api_key != "none" else None
        )
        return AzureNetwork(group, subnet, nsg, bastion, security, balancer, role, vault)

    def _key_vault(
        self,
        name: str,
        config: ClusterConfig,
        group: azure.resources.ResourceGroup,
        nat_ip: azure.network.PublicIPAddress,
        opts: pulumi.ResourceOptions,
    ) -> azure.keyvault.Vault:
        """The stack's Key Vault: role-based access only, its secrets readable from the NAT
        gateway's address alone (the nodes' way out); Resource Manager, which the program writes
        the key through, is not behind the vault's firewall. Its name is global and random,
        kept in the state."""
        suffix = random.RandomString(
            f"{name}-key-vault-name", length=VAULT_NAME_RANDOM, special=False, upper=False,
            opts=opts,
        )  # fmt: skip
        tenant = azure.authorization.get_client_config_output(
            opts=pulumi.InvokeOutputOptions(parent=opts.parent)
        ).tenant_id
        properties: azure.keyvault.VaultPropertiesArgsDict = {
            "tenant_id": tenant,
            "sku": {"family": azure.keyvault.SkuFamily.A, "name": azure.keyvault.SkuName.STANDARD},
            "enable_rbac_authorization": True,
            "soft_delete_retention_in_days": VAULT_RETENTION_DAYS,
            "network_acls": {
                "default_action": "Deny",
                "bypass": "None",
                "ip_rules": [{"value": nat_ip.ip_address.apply(lambda ip: ip or "")}],
            },
        }
        return azure.keyvault.Vault(
            f"{name}-key-vault",
            vault_name=pulumi.Output.concat("lrc", suffix.result),
            resource_group_name=group.name,
            properties=properties,
            tags=self.tags(config, "network"),
            opts=opts,
        )

    def keep_api_key(
        self,
        name: str,
        config: ClusterConfig,
        network: AzureNetwork,
        key: pulumi.Output[str],
        parent: pulumi.Resource,
    ) -> None:
        """The key as a secret of the stack's Key Vault; each main node's identity may read that
        secret alone (``node``), and finds the vault by its VM's tag (``KEY_VAULT_TAG``)."""
        if network.key_vault is None:
            raise ValueError("the Key Vault is made with the network when the stack has a key")
        self.api_key_secret = azure.keyvault.Secret(
            f"{name}-api-key",
            resource_group_name=network.resource_group.name,
            vault_name=network.key_vault.name,
            secret_name=AZURE_API_KEY_SECRET,
            properties={"value": key, "content_type": "text/plain"},
            tags=self.tags(config, "main"),
            opts=pulumi.ResourceOptions(parent=parent),
        )

    def _deallocate_role(
        self, name: str, group: azure.resources.ResourceGroup, opts: pulumi.ResourceOptions
    ) -> azure.authorization.RoleDefinition:
        """The stack's custom role of one action, assignable in its resource group only. Its id
        (a GUID) and name are unique in the tenant: both come from the resource group's id."""
        return azure.authorization.RoleDefinition(
            f"{name}-deallocate-role",
            role_definition_id=group.id.apply(deallocate_role_id),
            scope=group.id,
            role_name=pulumi.Output.concat("llama-rpc-cluster VM deallocate (", group.name, ")"),
            description="llama-rpc-cluster: a node's spend guard deallocates its own VM",
            role_type="CustomRole",
            permissions=[{"actions": [DEALLOCATE_ACTION]}],
            assignable_scopes=[group.id],
            opts=opts,
        )

    def _flow_logs(
        self,
        *,
        name: str,
        config: ClusterConfig,
        group: azure.resources.ResourceGroup,
        vnet: azure.network.VirtualNetwork,
        after: list[azure.network.Subnet],
        tags: dict[str, str],
        opts: pulumi.ResourceOptions,
    ) -> None:
        """VNet flow logs (NSG flow logs are retired) into a storage account of the stack:
        https://learn.microsoft.com/azure/network-watcher/vnet-flow-logs-overview. The region's
        Network Watcher is the subscription's (one per region), not the stack's: the
        ``networkWatcher`` setting names it and the preflight checks that it exists."""
        # Storage account names are global: derive one from the group's id (subscription and
        # stack), 3-24 lowercase letters and digits.
        account_name = group.id.apply(
            lambda group_id: "lrcflow" + hashlib.sha256(group_id.encode()).hexdigest()[:16]
        )
        account = azure.storage.StorageAccount(
            f"{name}-flow-logs",
            account_name=account_name,
            resource_group_name=group.name,
            kind=azure.storage.Kind.STORAGE_V2,
            sku={"name": azure.storage.SkuName.STANDARD_LRS},
            allow_blob_public_access=False,
            # Shared-key access keeps its default (on): turning it off would mean giving the flow
            # log a managed identity to write with, not set up here.
            enable_https_traffic_only=True,
            minimum_tls_version=azure.storage.MinimumTlsVersion.TLS1_2,
            tags=tags,
            opts=opts,
        )
        watcher = config.network_watcher
        if watcher is None:  # the config check sets it on Azure
            raise ValueError("networkWatcher is not set")
        azure.network.FlowLog(
            f"{name}-flow-logs",
            resource_group_name=watcher.resource_group,
            network_watcher_name=watcher.name,
            location=config.region,
            target_resource_id=vnet.id,
            storage_id=account.id,
            enabled=True,
            retention_policy={"days": FLOW_LOG_RETENTION_DAYS, "enabled": True},
            tags=tags,
            # After the VNet's subnets: Azure enables a region's watcher when a VNet is written.
            opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=after)),
        )

    def _bastion(
        self,
        *,
        name: str,
        config: ClusterConfig,
        group: azure.resources.ResourceGroup,
        vnet: azure.network.VirtualNetwork,
        after: azure.network.Subnet,
        tags: dict[str, str],
        opts: pulumi.ResourceOptions,
    ) -> tuple[azure.network.BastionHost, azure.network.Subnet]:
        """A Standard Bastion with native-client tunnelling, the only way in from outside:
        https://learn.microsoft.com/azure/bastion/connect-vm-native-client-linux"""
        subnet = azure.network.Subnet(
            f"{name}-bastion",
            subnet_name=BASTION_SUBNET,
            resource_group_name=group.name,
            virtual_network_name=vnet.name,
            address_prefix=str(config.public_subnet),
            # One subnet of a VNet at a time: parallel writes get 409 AnotherOperationInProgress.
            opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[after])),
        )
        address = azure.network.PublicIPAddress(
            f"{name}-bastion-ip",
            resource_group_name=group.name,
            sku={"name": "Standard"},
            public_ip_allocation_method="Static",
            tags=tags,
            opts=opts,
        )
        host = azure.network.BastionHost(
            f"{name}-bastion",
            resource_group_name=group.name,
            sku={"name": "Standard"},
            enable_tunneling=True,
            ip_configurations=[
                {
                    "name": "bastion",
                    "subnet": {"id": subnet.id},
                    "public_ip_address": {"id": address.id},
                }
            ],
            tags=tags,
            opts=opts,
        )
        return host, subnet

    def group(
        self, spec: GroupSpec, config: ClusterConfig, network: AzureNetwork, parent: pulumi.Resource
    ) -> AzureGroup:
        """A serving group's application security groups (made with the NSG that names them,
        ``group_rules``) and its proximity placement group."""
        opts = pulumi.ResourceOptions(parent=parent)
        name = spec.name
        rg = network.resource_group.name
        security = network.group_security[spec.index]
        placement = azure.compute.ProximityPlacementGroup(
            f"{name}-ppg",
            resource_group_name=rg,
            proximity_placement_group_type="Standard",
            intent={
                "vm_sizes": sorted({config.instance_type.name, config.main_instance_type.name})
            },
            tags=self.tags(config, "network"),
            opts=opts,
        )
        return AzureGroup(main=security.main, worker=security.worker, placement=placement)

    def _vm(
        self,
        name: str,
        config: ClusterConfig,
        network: AzureNetwork,
        *,
        role: str,
        vm_size: str,
        private_ip: str,
        disk_gb: int,
        custom_data: str,
        security: azure.network.ApplicationSecurityGroup,
        placement: azure.compute.ProximityPlacementGroup | None,
        identity: bool,
        extra_tags: Mapping[str, pulumi.Input[str]],
        parent: pulumi.Resource,
    ) -> azure.compute.VirtualMachine:
        """What every VM of the stack has: an accelerated NIC of its own at its fixed address,
        in its application security group, with no public IP; Trusted Launch; SSH by key only
        (a locked key without ``sshPublicKey``); its tags, on its OS disk too; and its boot
        data, a change of which replaces it."""
        tags = self.tags(config, role)
        # The NIC holds the node's fixed address: a replacement NIC must come after the old one.
        nic = azure.network.NetworkInterface(
            f"{name}-nic",
            resource_group_name=network.resource_group.name,
            enable_accelerated_networking=True,  # required by Cobalt 100
            ip_configurations=[
                {
                    "name": "private",
                    "primary": True,
                    "private_ip_allocation_method": "Static",
                    "private_ip_address": private_ip,
                    "subnet": {"id": network.subnet.id},
                    "application_security_groups": [{"id": security.id}],
                }
            ],
            tags=tags,
            opts=node_options(parent),
        )
        key = config.ssh_public_key or LOCKED_SSH_KEY
        storage: azure.compute.StorageProfileArgsDict = {
            "image_reference": {**IMAGE, "version": config.image or IMAGE["version"]},
            "os_disk": {
                "create_option": azure.compute.DiskCreateOptionTypes.FROM_IMAGE,
                "disk_size_gb": disk_gb,
                "caching": azure.compute.CachingTypes.READ_WRITE,
                "delete_option": azure.compute.DiskDeleteOptionTypes.DELETE,
                # Managed disks are encrypted at rest by the platform.
                "managed_disk": {
                    "storage_account_type": azure.compute.StorageAccountTypes.PREMIUM_LRS
                },
            },
        }
        os_profile: azure.compute.OSProfileArgsDict = {
            "computer_name": name,
            "admin_username": ADMIN_USER,
            "custom_data": custom_data,
            "linux_configuration": {
                "disable_password_authentication": True,
                "ssh": {
                    "public_keys": [
                        {"path": f"/home/{ADMIN_USER}/.ssh/authorized_keys", "key_data": key}
                    ]
                },
            },
        }
        vm = azure.compute.VirtualMachine(
            name,
            resource_group_name=network.resource_group.name,
            hardware_profile={"vm_size": vm_size},
            storage_profile=storage,
            os_profile=os_profile,
            network_profile={
                "network_interfaces": [
                    {
                        "id": nic.id,
                        "primary": True,
                        # The NIC is a resource of its own, holding the node's fixed address:
                        # deleted with the VM, a replacement VM would point at a NIC that is gone.
                        "delete_option": azure.compute.DeleteOptions.DETACH,
                    }
                ]
            },
            identity=(
                {"type": azure.compute.ResourceIdentityType.SYSTEM_ASSIGNED} if identity else None
            ),
            security_profile={
                "security_type": SECURITY_TYPE,
                "uefi_settings": {"secure_boot_enabled": True, "v_tpm_enabled": True},
                "encryption_at_host": config.encryption_at_host,
            },
            proximity_placement_group={"id": placement.id} if placement is not None else None,
            tags={**tags, **extra_tags},
            # Azure refuses a customData change on an existing VM ("Changing property
            # 'customData' is not allowed"): new boot data means a new node.
            # https://learn.microsoft.com/azure/virtual-machines/custom-data
            opts=node_options(parent, replace_on_changes=["osProfile.customData"]),
        )
        # The OS disk takes none of the VM's tags. The VM's id is among them, so a replaced VM's
        # new disk is tagged again.
        azure.resources.TagAtScope(
            f"{name}-os-disk-tags",
            scope=vm.storage_profile.apply(_os_disk_id),
            properties={"tags": {**tags, azure_facts.DISK_VM_TAG: vm.vm_id}},
            opts=pulumi.ResourceOptions(parent=parent),
        )
        return vm

    def node(
        self,
        spec: NodeSpec,
        config: ClusterConfig,
        network: AzureNetwork,
        group: AzureGroup,
        parent: pulumi.Resource,
    ) -> Node:
        opts = pulumi.ResourceOptions(parent=parent)
        main = spec.role == "main"
        containers = staged_containers(config.fetched_urls) if main else []
        keyed = main and network.key_vault is not None
        extra_tags: dict[str, pulumi.Input[str]] = {}
        if keyed and network.key_vault is not None:
            # The main node finds its vault by this tag (instance metadata): its boot data
            # names no output, so a new vault would replace no node. The VM's alone: its OS
            # disk carries another of the program's.
            extra_tags[azure_facts.KEY_VAULT_TAG] = network.key_vault.name
        vm = self._vm(
            spec.name,
            config,
            network,
            role=spec.role,
            vm_size=spec.instance_type,
            private_ip=spec.private_ip,
            disk_gb=spec.disk_gb,
            custom_data=spec.user_data.value,
            security=group.main if main else group.worker,
            placement=group.placement,
            # A managed identity only where a feature needs one: a staged model's reader, the
            # API key's reader, and each node's spend guard.
            identity=bool(containers) or keyed or network.deallocate_role is not None,
            extra_tags=extra_tags,
            parent=parent,
        )
        if containers:
            self._model_readers(spec.name, config, vm, containers, parent)
        if keyed and network.key_vault is not None:
            self._key_reader(spec.name, vm=vm, parent=parent)
        if network.deallocate_role is not None:
            self._deallocate_grant(spec.name, vm, network.deallocate_role, opts)
        return Node(
            instance_id=vm.name,
            private_ip=pulumi.Output.from_input(spec.private_ip),
            resource_id=vm.id,
        )

    @staticmethod
    def _deallocate_grant(
        name: str,
        vm: azure.compute.VirtualMachine,
        role: azure.authorization.RoleDefinition,
        opts: pulumi.ResourceOptions,
    ) -> None:
        """The spend guard's one grant to a VM's own identity: the deallocate role, on that VM."""
        azure.authorization.RoleAssignment(
            f"{name}-deallocate",
            principal_id=vm.identity.apply(
                lambda identity: identity.principal_id if identity else ""
            ),
            principal_type=azure.authorization.PrincipalType.SERVICE_PRINCIPAL,
            role_definition_id=role.id,
            scope=vm.id,  # this VM alone
            description="llama-rpc-cluster: the node's spend guard deallocates it",
            opts=opts,
        )

    def _key_reader(
        self,
        name: str,
        *,
        vm: azure.compute.VirtualMachine,
        parent: pulumi.Resource,
    ) -> None:
        """Key Vault Secrets User for the main node's identity, on the API key's secret alone."""
        secret = self.api_key_secret
        if secret is None:
            raise ValueError("the API key's secret is kept before the nodes are made")
        subscription = azure.authorization.get_client_config_output(
            opts=pulumi.InvokeOutputOptions(parent=parent)
        ).subscription_id
        azure.authorization.RoleAssignment(
            f"{name}-api-key-read",
            principal_id=vm.identity.apply(
                lambda identity: identity.principal_id if identity else ""
            ),
            principal_type=azure.authorization.PrincipalType.SERVICE_PRINCIPAL,
            role_definition_id=subscription.apply(
                lambda sub: role_definition(sub, KEY_VAULT_SECRETS_USER)
            ),
            # The secret's own id: Azure refuses an assignment at a scope that does not exist
            # yet, so it waits for the secret.
            scope=secret.id,
            description="llama-rpc-cluster: the main node reads the API key",
            opts=pulumi.ResourceOptions(parent=parent),
        )

    def _model_readers(
        self,
        name: str,
        config: ClusterConfig,
        vm: azure.compute.VirtualMachine,
        containers: list[tuple[str, str]],
        parent: pulumi.Resource,
    ) -> None:
        """Storage Blob Data Reader for the VM's identity on each container a staged model is
        in, on the model's blobs alone (``blob_read_condition``). The storage account's resource
        group is a setting (modelStoreResourceGroup): a blob URL does not name it. The account
        must be in the stack's subscription."""
        group = config.model_store_resource_group
        if group is None:  # the config check requires it with az:// URLs
            raise ValueError("modelStoreResourceGroup is not set")
        subscription = azure.authorization.get_client_config_output(
            opts=pulumi.InvokeOutputOptions(parent=parent)
        ).subscription_id
        principal = vm.identity.apply(lambda identity: identity.principal_id if identity else "")
        role = subscription.apply(lambda sub: role_definition(sub, BLOB_DATA_READER))
        keys = staged_blobs(config.fetched_urls)
        for i, (account, container) in enumerate(containers):
            scope = functools.partial(
                container_scope, group=group, account=account, container=container
            )
            azure.authorization.RoleAssignment(
                f"{name}-model-read-{i}",
                principal_id=principal,
                # Said, so Azure does not look a just-made identity up in Entra ID and miss it.
                principal_type=azure.authorization.PrincipalType.SERVICE_PRINCIPAL,
                role_definition_id=role,
                scope=subscription.apply(scope),
                condition=blob_read_condition(keys[account, container]),
                condition_version=CONDITION_VERSION,
                description="llama-rpc-cluster: the main node reads the staged model",
                opts=pulumi.ResourceOptions(parent=parent),
            )

    def balancer(
        self,
        name: str,
        config: ClusterConfig,
        network: AzureNetwork,
        *,
        groups: Sequence[AzureGroup],  # noqa: ARG002 (each group's rules admit the balancer)
        mains: Sequence[Node],  # noqa: ARG002 (HAProxy takes the mains' fixed addresses)
        parent: pulumi.Resource,
    ) -> Node | None:
        """The balancer node at the balancer's fixed address: HAProxy (``infra.boot.balancer``)
        sends each request to a group with a free slot, and queues it for the first to free one
        when none has. Its rules are in the NSG (``balancer_rules``, and each group's
        ``allow-api-from-balancer``); it has no placement group, and a managed identity only
        with a spend guard, which may deallocate this VM and nothing else."""
        if network.balancer is None:
            return None
        boot, security = network.balancer.boot, network.balancer.firewall
        role = network.deallocate_role if boot.guard is not None else None
        # New groups or timeouts mean a new balancer node: cloud-init reads user data once.
        vm = self._vm(
            f"{name}-balancer",
            config,
            network,
            role="balancer",
            vm_size=self.facts.balancer_instance_type,
            private_ip=boot.listen_ip,
            disk_gb=sizing.WORKER_DISK_GB,
            custom_data=deliver(render_balancer(boot), "azure").value,
            security=security,
            placement=None,
            identity=role is not None,
            extra_tags={},
            parent=parent,
        )
        if role is not None:
            self._deallocate_grant(
                f"{name}-balancer", vm, role, pulumi.ResourceOptions(parent=parent)
            )
        return Node(
            instance_id=vm.name,
            private_ip=pulumi.Output.from_input(boot.listen_ip),
            resource_id=vm.id,
        )

    def location(self, network: AzureNetwork) -> dict[str, pulumi.Input[str] | None]:
        return {outputs.ZONE: None, outputs.RESOURCE_GROUP: network.resource_group.name}

    def connect_command(
        self, config: ClusterConfig, network: AzureNetwork, main: Node, balancer: Node | None
    ) -> pulumi.Output[str]:
        """A Bastion tunnel to the balancer node (or the first group's main node without one),
        or, without Bastion, Run Command on that VM asking its API for the models."""
        port = config.server_port
        target = balancer or main
        if network.bastion is not None and target.resource_id is not None:
            return pulumi.Output.concat(
                "az network bastion tunnel --name ",
                network.bastion.name,
                " --resource-group ",
                network.resource_group.name,
                " --target-resource-id ",
                target.resource_id,
                f" --resource-port {port} --port {port}",
            )
        address = config.entry_ip
        return pulumi.Output.concat(
            "az vm run-command invoke --command-id RunShellScript --resource-group ",
            network.resource_group.name,
            " --name ",
            target.instance_id,
            f" --scripts 'curl -s http://{address}:{port}/v1/models'",
        )
