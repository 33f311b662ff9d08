"""Azure Cobalt 100: a VNet with a NAT gateway (new VNets have no default outbound access),
an NSG whose rules name application security groups per role and deny all other inbound traffic
explicitly, accelerated NICs without public IPs, and a proximity placement group.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import pulumi
import pulumi_azure_native as azure

from infra.clouds.base import CloudBackend, Node, NodeSpec
from infra.config import ClusterConfig

IMAGE: azure.compute.ImageReferenceArgsDict = {
    "publisher": "Canonical",
    "offer": "ubuntu-24_04-lts",
    "sku": "server-arm64",  # Generation 2, as Cobalt 100 requires
    "version": "latest",
}
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
# Cobalt 100 sizes carry a "p" among the feature letters: Standard_D64ps_v6, Standard_E32pds_v6.
_ARM_SIZE = re.compile(r"Standard_[A-Z]+\d+[a-z]*p[a-z]*_v\d+")
DENY_PRIORITY = 4000  # above Azure's default AllowVnetInBound (65000)


@dataclass(frozen=True)
class AzureNetwork:
    resource_group: azure.resources.ResourceGroup
    subnet: azure.network.Subnet
    security_group: azure.network.NetworkSecurityGroup
    placement: azure.compute.ProximityPlacementGroup


@dataclass(frozen=True)
class AzureFirewall:
    main: azure.network.ApplicationSecurityGroup
    worker: azure.network.ApplicationSecurityGroup


class AzureBackend(CloudBackend[AzureNetwork, AzureFirewall]):
    name = "azure"
    arm_examples = "Cobalt 100: Standard_D64ps_v6, Standard_E64ps_v6, Standard_D64pls_v6"
    limitations: ClassVar[Mapping[str, str]] = {
        "prices": "no Cobalt 100 list price was found in any checked source; hourlyCostUsd is "
        "null until the catalog has one",
        "tunnel": "no port forward is created: reach the API with Run Command, or through an "
        "Azure Bastion you already have",
    }

    def is_arm(self, instance_type: str) -> bool:
        return _ARM_SIZE.fullmatch(instance_type) is not None

    def tag_problem(self, tags: Mapping[str, str]) -> str | None:
        for key, value in tags.items():
            if len(key) > 512 or len(value) > 256 or set(key) & set("<>%&\\?/"):
                return (
                    f"tag {key!r}: Azure tag names hold at most 512 characters and none of "
                    "< > % & \\ ? /, and values at most 256 characters"
                )
        return None

    def network(self, name: str, config: ClusterConfig, parent: pulumi.Resource) -> AzureNetwork:
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
        nsg = azure.network.NetworkSecurityGroup(
            f"{name}-nsg", resource_group_name=rg, tags=tags, opts=opts
        )
        subnet = azure.network.Subnet(
            f"{name}-private",
            resource_group_name=rg,
            virtual_network_name=vnet.name,
            address_prefix=str(config.private_subnet),
            nat_gateway={"id": nat.id},
            network_security_group={"id": nsg.id},
            default_outbound_access=False,
            opts=opts,
        )
        placement = azure.compute.ProximityPlacementGroup(
            f"{name}-ppg",
            resource_group_name=rg,
            proximity_placement_group_type="Standard",
            intent={
                "vm_sizes": sorted({config.instance_type.name, config.main_instance_type.name})
            },
            tags=tags,
            opts=opts,
        )
        return AzureNetwork(group, subnet, nsg, placement)

    def firewall(
        self, name: str, config: ClusterConfig, network: AzureNetwork, parent: pulumi.Resource
    ) -> AzureFirewall:
        opts = pulumi.ResourceOptions(parent=parent)
        rg = network.resource_group.name
        main, worker = (
            azure.network.ApplicationSecurityGroup(
                f"{name}-{role}-asg",
                resource_group_name=rg,
                tags=self.tags(config, role),
                opts=opts,
            )
            for role in ("main", "worker")
        )
        rule = {"direction": "Inbound", "source_port_range": "*"}
        rules: list[dict[str, object]] = [
            {
                **rule,
                "name": "allow-rpc-from-main",
                "priority": 100,
                "access": "Allow",
                "protocol": "Tcp",
                "source_application_security_groups": [{"id": main.id}],
                "destination_application_security_groups": [{"id": worker.id}],
                "destination_port_range": str(config.rpc_port),
            }
        ]
        if config.api_allowed_cidrs:
            rules.append(
                {
                    **rule,
                    "name": "allow-api-from-allowed-cidrs",
                    "priority": 110,
                    "access": "Allow",
                    "protocol": "Tcp",
                    "source_address_prefixes": list(config.api_allowed_cidrs),
                    "destination_application_security_groups": [{"id": main.id}],
                    "destination_port_range": str(config.server_port),
                }
            )
        rules.append(
            {
                **rule,
                "name": "deny-all-other-inbound",
                "priority": DENY_PRIORITY,
                "access": "Deny",
                "protocol": "*",
                "source_address_prefix": "*",
                "destination_address_prefix": "*",
                "destination_port_range": "*",
            }
        )
        for spec in rules:
            rule_name = str(spec.pop("name"))
            azure.network.SecurityRule(  # type: ignore[call-overload]  # rules built as data
                f"{name}-{rule_name}",
                resource_group_name=rg,
                network_security_group_name=network.security_group.name,
                security_rule_name=rule_name,
                **spec,
                opts=opts,
            )
        return AzureFirewall(main=main, worker=worker)

    def node(
        self,
        spec: NodeSpec,
        config: ClusterConfig,
        network: AzureNetwork,
        firewall: AzureFirewall,
        parent: pulumi.Resource,
    ) -> Node:
        opts = pulumi.ResourceOptions(parent=parent)
        tags = self.tags(config, spec.role)
        rg = network.resource_group.name
        group = firewall.main if spec.role == "main" else firewall.worker
        nic = azure.network.NetworkInterface(
            f"{spec.name}-nic",
            resource_group_name=rg,
            enable_accelerated_networking=True,  # required by Cobalt 100
            ip_configurations=[
                {
                    "name": "private",
                    "primary": True,
                    "private_ip_allocation_method": "Static",
                    "private_ip_address": spec.private_ip,
                    "subnet": {"id": network.subnet.id},
                    "application_security_groups": [{"id": group.id}],
                }
            ],
            tags=tags,
            opts=opts,
        )
        key = config.ssh_public_key or LOCKED_SSH_KEY
        storage: azure.compute.StorageProfileArgsDict = {
            "image_reference": IMAGE,
            "os_disk": {
                "create_option": azure.compute.DiskCreateOptionTypes.FROM_IMAGE,
                "disk_size_gb": spec.disk_gb,
                "caching": azure.compute.CachingTypes.READ_WRITE,
                "delete_option": azure.compute.DiskDeleteOptionTypes.DELETE,
                # Managed disks are encrypted at rest by the platform.
                "managed_disk": {
                    "storage_account_type": azure.compute.StorageAccountTypes.PREMIUM_LRS
                },
            },
        }
        os_profile: azure.compute.OSProfileArgsDict = {
            "computer_name": spec.name,
            "admin_username": ADMIN_USER,
            "custom_data": spec.user_data.value,
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
            spec.name,
            resource_group_name=rg,
            hardware_profile={"vm_size": spec.instance_type},
            storage_profile=storage,
            os_profile=os_profile,
            network_profile={
                "network_interfaces": [
                    {
                        "id": nic.id,
                        "primary": True,
                        "delete_option": azure.compute.DeleteOptions.DELETE,
                    }
                ]
            },
            identity={"type": azure.compute.ResourceIdentityType.SYSTEM_ASSIGNED},
            proximity_placement_group={"id": network.placement.id},
            tags=tags,
            opts=opts,
        )
        return Node(instance_id=vm.name, private_ip=pulumi.Output.from_input(spec.private_ip))

    def connect_command(
        self, config: ClusterConfig, network: AzureNetwork, main: Node
    ) -> pulumi.Output[str]:
        return pulumi.Output.concat(
            "az vm run-command invoke --command-id RunShellScript --resource-group ",
            network.resource_group.name,
            " --name ",
            main.instance_id,
            f" --scripts 'curl -s http://{config.main_ip}:{config.server_port}/v1/models'",
        )
