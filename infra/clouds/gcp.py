"""Google Axion (C4A): a custom VPC, Cloud NAT for egress, firewall rules by network tag,
Hyperdisk Balanced disks, gVNIC, Tier_1 networking, and IAP for access. No external IPs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import pulumi
import pulumi_gcp as gcp

from infra.clouds.base import CloudBackend, Node, NodeSpec
from infra.config import ClusterConfig

IMAGE = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-arm64"
# Google's IAP TCP forwarding range: the only source allowed to the main node's API port.
IAP_RANGE = "35.235.240.0/20"
BOOT_EGRESS_PORTS = ("80", "443")
# Axion (C4A, N4A) and Ampere Altra (T2A) are Google's Arm families.
_ARM_TYPE = re.compile(r"(c4a|n4a|t2a)-[a-z0-9-]+")
_LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")
# C4A takes Tier_1 networking from 32 vCPUs up.
TIER_1_MIN_VCPUS = 32
HYPERDISK_MIN_THROUGHPUT = 140


def label_problem(labels: Mapping[str, str]) -> str | None:
    """Why these labels break GCP's rules, or None."""
    for key, value in labels.items():
        if not _LABEL_KEY.fullmatch(key):
            return (
                f"label key {key!r} must start with a lowercase letter and hold at most 63 "
                "lowercase letters, digits, '_' or '-'"
            )
        if not _LABEL_VALUE.fullmatch(value):
            return (
                f"label value {value!r} (key {key!r}) may hold at most 63 lowercase letters, "
                "digits, '_' or '-'"
            )
    return None


def choose_zone(zones: Sequence[str], offers: Callable[[str], bool]) -> str:
    """The first zone (by name) where ``offers(zone)`` holds."""
    for zone in sorted(zones):
        if offers(zone):
            return zone
    raise ValueError("no zone in this region offers the machine types; choose another region")


@dataclass(frozen=True)
class GcpNetwork:
    network: gcp.compute.Network
    subnet: gcp.compute.Subnetwork
    zone: pulumi.Output[str]
    service_account: gcp.serviceaccount.Account


@dataclass(frozen=True)
class GcpFirewall:
    main_tag: str
    worker_tag: str


class GcpBackend(CloudBackend[GcpNetwork, GcpFirewall]):
    name = "gcp"
    arm_examples = "Axion: c4a-standard-*, c4a-highmem-*, c4a-highcpu-*"
    limitations: ClassVar[Mapping[str, str]] = {
        "placement": "C4A has no compact placement policy; all nodes share one zone instead",
        "labels": "networks, subnets, routers, NAT and firewall rules take no labels; "
        "their names carry the project instead",
    }

    def is_arm(self, instance_type: str) -> bool:
        return _ARM_TYPE.fullmatch(instance_type) is not None

    def tag_problem(self, tags: Mapping[str, str]) -> str | None:
        return label_problem(tags)

    def network(self, name: str, config: ClusterConfig, parent: pulumi.Resource) -> GcpNetwork:
        opts = pulumi.ResourceOptions(parent=parent)
        needed = sorted({config.instance_type.name, config.main_instance_type.name})

        def offers(zone: str) -> bool:
            found = gcp.compute.get_machine_types(
                zone=zone, filter=" OR ".join(f'name = "{t}"' for t in needed)
            ).machine_types
            return {m.name for m in found} >= set(needed)

        zones = gcp.compute.get_zones_output(
            region=config.region, status="UP", opts=pulumi.InvokeOutputOptions(parent=parent)
        ).names
        zone = zones.apply(lambda names: choose_zone(names, offers))
        network = gcp.compute.Network(
            f"{name}-vpc", auto_create_subnetworks=False, description="llama-rpc-cluster", opts=opts
        )
        subnet = gcp.compute.Subnetwork(
            f"{name}-private",
            network=network.id,
            region=config.region,
            ip_cidr_range=str(config.private_subnet),
            private_ip_google_access=True,
            opts=opts,
        )
        router = gcp.compute.Router(
            f"{name}-router", network=network.id, region=config.region, opts=opts
        )
        gcp.compute.RouterNat(
            f"{name}-nat",
            router=router.name,
            region=config.region,
            nat_ip_allocate_option="AUTO_ONLY",
            source_subnetwork_ip_ranges_to_nat="ALL_SUBNETWORKS_ALL_IP_RANGES",
            opts=opts,
        )
        account = gcp.serviceaccount.Account(
            f"{name}-node",
            account_id=f"{name[:24]}-node",
            display_name="llama-rpc-cluster nodes (no roles)",
            opts=opts,
        )
        return GcpNetwork(network, subnet, zone, account)

    def firewall(
        self, name: str, config: ClusterConfig, network: GcpNetwork, parent: pulumi.Resource
    ) -> GcpFirewall:
        opts = pulumi.ResourceOptions(parent=parent)
        main_tag, worker_tag = f"{name}-main", f"{name}-worker"
        gcp.compute.Firewall(
            f"{name}-worker-rpc-from-main",
            network=network.network.id,
            direction="INGRESS",
            allows=[{"protocol": "tcp", "ports": [str(config.rpc_port)]}],
            source_tags=[main_tag],
            target_tags=[worker_tag],
            description="llama.cpp RPC from the main node only",
            opts=opts,
        )
        gcp.compute.Firewall(
            f"{name}-main-api-from-iap",
            network=network.network.id,
            direction="INGRESS",
            allows=[{"protocol": "tcp", "ports": [str(config.server_port)]}],
            source_ranges=[IAP_RANGE, *config.api_allowed_cidrs],
            target_tags=[main_tag],
            description="llama-server API through IAP (and apiAllowedCidrs)",
            opts=opts,
        )
        return GcpFirewall(main_tag=main_tag, worker_tag=worker_tag)

    def node(
        self,
        spec: NodeSpec,
        config: ClusterConfig,
        network: GcpNetwork,
        firewall: GcpFirewall,
        parent: pulumi.Resource,
    ) -> Node:
        labels = self.tags(config, spec.role)
        instance = config.main_instance_type if spec.role == "main" else config.instance_type
        throughput = max(HYPERDISK_MIN_THROUGHPUT, spec.disk_throughput_mibps or 0)
        tier = "TIER_1" if instance.vcpus >= TIER_1_MIN_VCPUS else "DEFAULT"
        vm = gcp.compute.Instance(
            spec.name,
            machine_type=spec.instance_type,
            zone=network.zone,
            boot_disk={
                "auto_delete": True,
                "initialize_params": {
                    "image": IMAGE,
                    "size": spec.disk_gb,
                    "type": "hyperdisk-balanced",  # C4A takes Hyperdisk only
                    "provisioned_throughput": throughput,
                    "labels": labels,
                },
            },
            network_interfaces=[
                {
                    "subnetwork": network.subnet.id,
                    "network_ip": spec.private_ip,
                    "nic_type": "GVNIC",  # required by C4A
                    # No access_configs: no external IP; egress goes through Cloud NAT.
                }
            ],
            network_performance_config={"total_egress_bandwidth_tier": tier},
            metadata={"user-data": spec.user_data.value, "enable-oslogin": "TRUE"},
            tags=[firewall.main_tag if spec.role == "main" else firewall.worker_tag],
            labels=labels,
            service_account={"email": network.service_account.email, "scopes": ["cloud-platform"]},
            shielded_instance_config={
                "enable_secure_boot": True,
                "enable_vtpm": True,
                "enable_integrity_monitoring": True,
            },
            allow_stopping_for_update=True,
            opts=pulumi.ResourceOptions(parent=parent),
        )
        return Node(instance_id=vm.name, private_ip=vm.network_interfaces[0].network_ip)

    def connect_command(
        self, config: ClusterConfig, network: GcpNetwork, main: Node
    ) -> pulumi.Output[str]:
        port = config.server_port
        return pulumi.Output.concat(
            "gcloud compute start-iap-tunnel ",
            main.instance_id,
            f" {port} --local-host-port=localhost:{port} --zone ",
            network.zone,
        )
