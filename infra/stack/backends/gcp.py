"""Google Axion (C4A): a custom VPC, Cloud NAT for egress, firewall rules by network tag (per
serving group), Hyperdisk Balanced disks, gVNIC, Tier_1 networking, IAP for access, and a
balancer node (HAProxy, ``infra.boot.balancer``) in front of the groups when there are several.
No external IPs.

Baseline (CIS Google Cloud): no default network, subnet flow logs, project-wide SSH keys
blocked with OS Login on, Shielded VM, no default service account: the main node runs as a
service account of the stack with no roles but read access to a staged model's objects, and
workers and the balancer node run with none.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra.boot.balancer import render as render_balancer
from infra.boot.deliver import deliver
from infra.clouds import gcp as gcp_facts
from infra.clouds.base import Provisioned
from infra.clouds.gcp import IAP_RANGE
from infra.clouds.stores import gcs_object, listed_prefixes
from infra.core import outputs, sizing
from infra.core.limits import METRICS_PORT
from infra.stack.backends.base import (
    BalancerPlace,
    CloudBackend,
    GroupSpec,
    Node,
    NodeSpec,
    node_options,
)
from infra.stack.config import ClusterConfig

# The family resolves when a disk is created; the provider does not diff a node whose image
# came from it when the family moves on, so a new Ubuntu image replaces nothing.
IMAGE = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-arm64"
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

    Reads are allowed on exactly the objects' names, and listing on the bucket only with the
    prefixes rclone lists to read them (``clouds.stores.listed_prefixes``)."""
    conditions: list[tuple[str, str, str]] = []
    for bucket in sorted({bucket for bucket, _ in objects}):
        keys = sorted({key for b, key in objects if b == bucket})
        for names in _chunks(keys, NAMES_PER_CONDITION):
            expression = " || ".join(
                f"resource.name == {json.dumps(f'projects/_/buckets/{bucket}/objects/{key}')}"
                for key in names
            )
            conditions.append((bucket, "read the staged model's objects", expression))
        for names in _chunks(listed_prefixes(keys), NAMES_PER_CONDITION - 1):  # and one &&
            listed = " || ".join(f"{LIST_PREFIX} == {json.dumps(prefix)}" for prefix in names)
            bucket_name = json.dumps(f"projects/_/buckets/{bucket}")
            expression = f"resource.name == {bucket_name} && ({listed})"
            conditions.append((bucket, "list only where the staged model is", expression))
    return conditions


# Reads a secret's versions, nothing else:
# https://cloud.google.com/secret-manager/docs/access-control#secretmanager.secretAccessor
KEY_READER_ROLE = "roles/secretmanager.secretAccessor"
KEY_STORE_API = "secretmanager.googleapis.com"


@dataclass(frozen=True)
class GcpNetwork:
    network: gcp.compute.Network
    subnet: gcp.compute.Subnetwork
    zone: pulumi.Output[str]
    project: pulumi.Output[str]
    main_account: gcp.serviceaccount.Account
    # The balancer node's place and network tag, with a balancer: each group's main nodes
    # admit the tag.
    balancer: BalancerPlace[str] | None = None
    # Cloud NAT, the nodes' only way out (the balancer node's package comes through it).
    nat: gcp.compute.RouterNat | None = None


@dataclass(frozen=True)
class GcpGroup:
    """One serving group's network tags: its firewall rules name them."""

    main_tag: str
    worker_tag: str


class GcpBackend(CloudBackend[GcpNetwork, GcpGroup]):
    facts = gcp_facts.FACTS

    def network(
        self, name: str, config: ClusterConfig, parent: pulumi.Resource, *, zone: str | None
    ) -> GcpNetwork:
        opts = pulumi.ResourceOptions(parent=parent)
        if zone is None:
            raise ValueError("GCP VMs need a zone (the preflight chooses one)")
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
        nat = gcp.compute.RouterNat(
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
        staged = [obj for obj in map(gcs_object, config.fetched_urls) if obj]
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
        # The stack's zone, kept: every VM is created in this group's zone, which ignores
        # later changes unless the zone is a setting (a zone that sorts first later, or one
        # down for an update, must not move the cluster; a zone change replaces every VM). An
        # empty unmanaged instance group costs nothing. Its description is kept as it was made:
        # a new one would replace it, and with it the zone.
        anchor = gcp.compute.InstanceGroup(
            f"{name}-mains",
            zone=zone,
            network=network.id,
            description="the stack's zone",
            opts=pulumi.ResourceOptions(
                parent=parent,
                ignore_changes=["description"] if config.zone else ["zone", "description"],
            ),
        )
        boot = config.balancer_boot
        balancer = BalancerPlace(boot, f"{name}-balancer") if boot is not None else None
        return GcpNetwork(network, subnet, anchor.zone, project, account, balancer, nat)

    def group(
        self, spec: GroupSpec, config: ClusterConfig, network: GcpNetwork, parent: pulumi.Resource
    ) -> GcpGroup:
        """Rules by network tag, per serving group: its workers take RPC from its own main node
        only. C4A has no compact placement policy (the limitations say so): no placement."""
        opts = pulumi.ResourceOptions(parent=parent)
        name = spec.name
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
        gcp.compute.Firewall(
            f"{name}-worker-metrics-from-main",
            network=network.network.id,
            direction="INGRESS",
            allows=[{"protocol": "tcp", "ports": [str(METRICS_PORT)]}],
            source_tags=[main_tag],
            target_tags=[worker_tag],
            description="node metrics (prometheus-node-exporter), read by the group's main node",
            opts=opts,
        )
        if network.balancer is not None:
            gcp.compute.Firewall(
                f"{name}-main-api-from-balancer",
                network=network.network.id,
                direction="INGRESS",
                allows=[{"protocol": "tcp", "ports": [str(config.server_port)]}],
                source_tags=[network.balancer.firewall],
                target_tags=[main_tag],
                description="requests and health checks from the balancer node",
                opts=opts,
            )
        return GcpGroup(main_tag=main_tag, worker_tag=worker_tag)

    def _vm(
        self,
        name: str,
        config: ClusterConfig,
        network: GcpNetwork,
        *,
        role: str,
        machine_type: str,
        private_ip: str,
        disk_gb: int,
        disk: Provisioned,
        user_data: str,
        tag: str,
        service_account: gcp.compute.InstanceServiceAccountArgsDict | None,
        fast_network: bool,
        parent: pulumi.Resource,
        depends_on: Sequence[pulumi.Resource] = (),
    ) -> gcp.compute.Instance:
        """What every VM of the stack has: a Hyperdisk Balanced boot disk, gVNIC and no external
        IP, OS Login with project SSH keys blocked, Shielded VM, its network tag, and its boot
        data, a change of which replaces it."""
        labels = self.tags(config, role)
        return gcp.compute.Instance(
            name,
            machine_type=machine_type,
            zone=network.zone,
            boot_disk={
                "auto_delete": True,
                "initialize_params": {
                    "image": config.image or IMAGE,
                    "size": disk_gb,
                    "type": "hyperdisk-balanced",  # C4A takes Hyperdisk only
                    "provisioned_throughput": disk.throughput_mibps,
                    "provisioned_iops": disk.iops,
                    "labels": labels,
                },
            },
            network_interfaces=[
                {
                    "subnetwork": network.subnet.id,
                    "network_ip": private_ip,
                    "nic_type": "GVNIC",  # required by C4A
                    # No access_configs: no external IP; egress goes through Cloud NAT.
                }
            ],
            network_performance_config={
                "total_egress_bandwidth_tier": "TIER_1" if fast_network else "DEFAULT"
            },
            metadata={
                "user-data": user_data,
                "enable-oslogin": "TRUE",
                "block-project-ssh-keys": "TRUE",
            },
            tags=[tag],
            labels=labels,
            service_account=service_account,
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
            opts=node_options(parent, replace_on_changes=["metadata"], depends_on=list(depends_on)),
        )

    def node(
        self,
        spec: NodeSpec,
        config: ClusterConfig,
        network: GcpNetwork,
        group: GcpGroup,
        parent: pulumi.Resource,
    ) -> Node:
        main = spec.role == "main"
        instance = config.main_instance_type if main else config.instance_type
        fast = self.facts.fast_network_min_vcpus
        vm = self._vm(
            spec.name,
            config,
            network,
            role=spec.role,
            machine_type=spec.instance_type,
            private_ip=spec.private_ip,
            disk_gb=spec.disk_gb,
            disk=self.facts.disk.provision(spec.disk_throughput_mibps),
            user_data=spec.user_data.value,
            tag=group.main_tag if main else group.worker_tag,
            # Workers run the RPC server, the most exposed process: no account, no token. The
            # main node's scope is Google's recommended cloud-platform: its account's roles
            # (none, or the staged model's IAM conditions) decide what the token may do.
            service_account=(
                {"email": network.main_account.email, "scopes": ["cloud-platform"]}
                if main
                else None
            ),
            fast_network=fast is not None and instance.vcpus >= fast,
            parent=parent,
        )
        return Node(instance_id=vm.name, private_ip=vm.network_interfaces[0].network_ip)

    def balancer(
        self,
        name: str,
        config: ClusterConfig,
        network: GcpNetwork,
        *,
        groups: Sequence[GcpGroup],  # noqa: ARG002 (each group admits the balancer's tag)
        mains: Sequence[Node],  # noqa: ARG002 (HAProxy takes the mains' fixed addresses)
        parent: pulumi.Resource,
    ) -> Node | None:
        """The balancer node at the balancer's fixed address: HAProxy (``infra.boot.balancer``)
        sends each request to a group with a free slot, and queues it for the first to free one
        when none has. The server port is open to it from IAP (connectCommand tunnels to it)
        and apiAllowedCidrs, as a main node's is; it has no service account."""
        if network.balancer is None:
            return None
        boot, tag = network.balancer.boot, network.balancer.firewall
        balancer_name = f"{name}-balancer"
        gcp.compute.Firewall(
            f"{balancer_name}-api-from-iap",
            network=network.network.id,
            direction="INGRESS",
            allows=[{"protocol": "tcp", "ports": [str(config.server_port)]}],
            source_ranges=[IAP_RANGE, *config.api_allowed_cidrs],
            target_tags=[tag],
            description="llama-server API, balanced, through IAP (and apiAllowedCidrs)",
            opts=pulumi.ResourceOptions(parent=parent),
        )
        # New groups or timeouts mean a new balancer node: cloud-init reads user data once.
        vm = self._vm(
            balancer_name,
            config,
            network,
            role="balancer",
            machine_type=self.facts.balancer_instance_type,
            private_ip=boot.listen_ip,
            disk_gb=sizing.WORKER_DISK_GB,
            disk=self.facts.disk.provision(None),
            user_data=deliver(render_balancer(boot), "gcp").value,
            tag=tag,
            service_account=None,
            fast_network=False,
            parent=parent,
            # Its package comes through Cloud NAT: made once the NAT is.
            depends_on=[network.nat] if network.nat is not None else [],
        )
        return Node(instance_id=vm.name, private_ip=vm.network_interfaces[0].network_ip)

    def keep_api_key(
        self,
        name: str,
        config: ClusterConfig,
        network: GcpNetwork,
        key: pulumi.Output[str],
        parent: pulumi.Resource,
    ) -> None:
        """A Secret Manager secret (Google encrypts it at rest), its one version, and for the
        main nodes' service account the accessor role on that secret alone: the node reads it
        at boot (llama-rpc-secret)."""
        opts = pulumi.ResourceOptions(parent=parent)
        # The project's Secret Manager API, on (left on by destroy: other stacks may use it).
        api = gcp.projects.Service(
            f"{name}-secret-manager-api",
            service=KEY_STORE_API,
            disable_on_destroy=False,
            disable_dependent_services=False,
            opts=opts,
        )
        secret = gcp.secretmanager.Secret(
            f"{name}-api-key",
            secret_id=config.api_key_secret_id,
            replication={"auto": {}},
            labels=self.tags(config, "main"),
            opts=pulumi.ResourceOptions(parent=parent, depends_on=[api]),
        )
        gcp.secretmanager.SecretVersion(
            f"{name}-api-key-version", secret=secret.id, secret_data=key, opts=opts
        )
        gcp.secretmanager.SecretIamMember(
            f"{name}-main-api-key",
            secret_id=secret.id,
            role=KEY_READER_ROLE,
            member=network.main_account.email.apply(lambda email: f"serviceAccount:{email}"),
            opts=opts,
        )

    def location(self, network: GcpNetwork) -> dict[str, pulumi.Input[str] | None]:
        return {outputs.ZONE: network.zone, outputs.RESOURCE_GROUP: None}

    def connect_command(
        self, config: ClusterConfig, network: GcpNetwork, main: Node, balancer: Node | None
    ) -> pulumi.Output[str]:
        """An IAP tunnel to the balancer node, or the first group's main node without one."""
        port = config.server_port
        return pulumi.Output.concat(
            "gcloud compute start-iap-tunnel ",
            (balancer or main).instance_id,
            f" {port} --local-host-port=localhost:{port} --zone ",
            network.zone,
            " --project ",
            network.project,
        )
