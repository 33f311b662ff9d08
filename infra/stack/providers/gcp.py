"""Google Axion (C4A): a custom VPC, Cloud NAT for egress, firewall rules by network tag,
Hyperdisk Balanced disks, gVNIC, Tier_1 networking, and IAP for access. No external IPs.

Baseline (CIS Google Cloud): no default network, subnet flow logs, project-wide SSH keys
blocked with OS Login on, Shielded VM, no default service account: the main node runs as a
service account of the stack with no roles but read access to a staged model's objects, and
workers run with none.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra.clouds import gcp as gcp_facts
from infra.clouds.gcp import IAP_RANGE
from infra.network_rules import gcs_object
from infra.stack.config import ClusterConfig
from infra.stack.providers.base import CloudBackend, Node, NodeSpec, node_options

# The family resolves when a disk is created; the provider does not diff a node whose image
# came from it when the family moves on, so a new Ubuntu image replaces nothing.
IMAGE = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-arm64"
# C4A takes Tier_1 networking from 32 vCPUs up.
TIER_1_MIN_VCPUS = 32
# Read-only on objects (storage.objects.get and .list), narrowed by an IAM condition.
OBJECT_VIEWER = "roles/storage.objectViewer"
# IAM takes at most 12 logical operators in one condition expression (the limits in
# https://cloud.google.com/iam/docs/conditions-overview): names per condition.
NAMES_PER_CONDITION = 12
# The prefix an objects.list request asks for (a Cloud Storage API attribute of IAM Conditions);
# "" for any other request.
LIST_PREFIX = 'api.getAttribute("storage.googleapis.com/objectListPrefix", "")'


def _chunks(names: Sequence[str], size: int) -> list[list[str]]:
    return [list(names[i : i + size]) for i in range(0, len(names), size)]


def staged_model_conditions(objects: Sequence[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(bucket, title, expression) of each IAM condition under which the main node's account
    may read a staged model's objects, and nothing else in any bucket.

    rclone (fetch-model.sh) reads an object's metadata, lists the "directory" that holds it
    (the prefix up to its last '/'), then reads it in ranges; for a missing object it lists the
    key as a directory (KEY/), which lets the boot say "no such object". Reads are allowed on
    exactly the objects' names, and listing on the bucket only with those prefixes."""
    conditions: list[tuple[str, str, str]] = []
    for bucket in sorted({bucket for bucket, _ in objects}):
        keys = sorted({key for b, key in objects if b == bucket})
        for names in _chunks(keys, NAMES_PER_CONDITION):
            expression = " || ".join(
                f"resource.name == {json.dumps(f'projects/_/buckets/{bucket}/objects/{key}')}"
                for key in names
            )
            conditions.append((bucket, "read the staged model's objects", expression))
        # A key's directory ("" at the bucket's top), and the key itself as one.
        prefixes = sorted({key.rpartition("/")[0] + "/" if "/" in key else "" for key in keys})
        prefixes += [f"{key}/" for key in keys]
        for names in _chunks(prefixes, NAMES_PER_CONDITION - 1):  # and one &&
            listed = " || ".join(f"{LIST_PREFIX} == {json.dumps(prefix)}" for prefix in names)
            bucket_name = json.dumps(f"projects/_/buckets/{bucket}")
            expression = f"resource.name == {bucket_name} && ({listed})"
            conditions.append((bucket, "list only where the staged model is", expression))
    return conditions


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
    project: pulumi.Output[str]
    main_account: gcp.serviceaccount.Account


@dataclass(frozen=True)
class GcpFirewall:
    main_tag: str
    worker_tag: str


class GcpBackend(CloudBackend[GcpNetwork, GcpFirewall]):
    facts = gcp_facts.FACTS

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
            # Google's APIs, a staged model's bucket among them, over Google's network.
            private_ip_google_access=True,
            # Flow logs (CIS GCP 3.8), sampled: a record per flow every 5 minutes at most.
            log_config=(
                {
                    "aggregation_interval": "INTERVAL_5_MIN",
                    "flow_sampling": 0.5,
                    "metadata": "INCLUDE_ALL_METADATA",
                }
                if config.flow_logs
                else None
            ),
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
        # Account ids are unique per GCP project: one per stack, so two stacks never share one.
        account = gcp.serviceaccount.Account(
            f"{name}-main-sa",
            account_id=gcp_facts.service_account_id(pulumi.get_project(), pulumi.get_stack()),
            display_name=f"llama-rpc-cluster {pulumi.get_stack()} main node (no roles)",
            opts=opts,
        )
        staged = [obj for obj in map(gcs_object, config.model_urls) if obj]
        # The bucket's IAM policy takes conditions only with uniform bucket-level access on.
        for i, (bucket, title, expression) in enumerate(staged_model_conditions(staged)):
            gcp.storage.BucketIAMMember(
                f"{name}-main-model-read-{i}",
                bucket=bucket,
                role=OBJECT_VIEWER,
                member=account.email.apply(lambda email: f"serviceAccount:{email}"),
                condition={"title": title, "expression": expression},
                opts=opts,
            )
        project = gcp.organizations.get_client_config_output(
            opts=pulumi.InvokeOutputOptions(parent=parent)
        ).project
        return GcpNetwork(network, subnet, zone, project, account)

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
        main = spec.role == "main"
        instance = config.main_instance_type if main else config.instance_type
        disk = self.facts.disk.provision(spec.disk_throughput_mibps)
        tier = "TIER_1" if instance.vcpus >= TIER_1_MIN_VCPUS else "DEFAULT"
        vm = gcp.compute.Instance(
            spec.name,
            machine_type=spec.instance_type,
            zone=network.zone,
            boot_disk={
                "auto_delete": True,
                "initialize_params": {
                    "image": config.image or IMAGE,
                    "size": spec.disk_gb,
                    "type": "hyperdisk-balanced",  # C4A takes Hyperdisk only
                    "provisioned_throughput": disk.throughput_mibps,
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
            metadata={
                "user-data": spec.user_data.value,
                "enable-oslogin": "TRUE",
                "block-project-ssh-keys": "TRUE",
            },
            tags=[firewall.main_tag if main else firewall.worker_tag],
            labels=labels,
            # Workers run the RPC server, the most exposed process: no account, no token. The
            # main node's scope is Google's recommended cloud-platform: its account's roles (none,
            # or the staged model's IAM conditions) decide what the token may do.
            service_account=(
                {"email": network.main_account.email, "scopes": ["cloud-platform"]}
                if main
                else None
            ),
            shielded_instance_config={
                "enable_secure_boot": True,
                "enable_vtpm": True,
                "enable_integrity_monitoring": True,
            },
            allow_stopping_for_update=True,
            # A metadata change is applied in place and cloud-init, which reads user-data on
            # first boot only, would never see it: new boot data means a new node. (The
            # provider updates metadata without replacement:
            # https://registry.terraform.io/providers/hashicorp/google/latest/docs/resources/compute_instance#metadata)
            opts=node_options(parent, replace_on_changes=["metadata"]),
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
            " --project ",
            network.project,
        )
