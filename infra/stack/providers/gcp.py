"""Google Axion (C4A): a custom VPC, Cloud NAT for egress, firewall rules by network tag (per
serving group), Hyperdisk Balanced disks, gVNIC, Tier_1 networking, IAP for access, and an
internal passthrough Network Load Balancer in front of the groups when there are several. No
external IPs.

Baseline (CIS Google Cloud): no default network, subnet flow logs, project-wide SSH keys
blocked with OS Login on, Shielded VM, no default service account: the main node runs as a
service account of the stack with no roles but read access to a staged model's objects, and
workers run with none.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra.clouds import gcp as gcp_facts
from infra.clouds.gcp import HEALTH_CHECK_RANGES, IAP_RANGE
from infra.clouds.stores import gcs_object, listed_prefixes
from infra.core import outputs
from infra.core.limits import METRICS_PORT
from infra.stack.config import ClusterConfig
from infra.stack.providers.base import (
    HEALTH_INTERVAL_SECONDS,
    HEALTH_PATH,
    HEALTH_THRESHOLD,
    CloudBackend,
    GroupSpec,
    Node,
    NodeSpec,
    node_options,
)

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
HEALTH_TIMEOUT_SECONDS = 5


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
    # The balancer's backends (replicas > 1): an unmanaged instance group in the nodes' zone,
    # made with the network since each main node joins it as it is made.
    mains: gcp.compute.InstanceGroup | None = None


@dataclass(frozen=True)
class GcpGroup:
    """One serving group's network tags: its firewall rules name them."""

    main_tag: str
    worker_tag: str


class GcpBackend(CloudBackend[GcpNetwork, GcpGroup]):
    facts = gcp_facts.FACTS

    def limitations(self, config: ClusterConfig) -> Mapping[str, str]:
        if config.replicas == 1:
            return self.facts.limitations
        return {
            **self.facts.limitations,
            # "load-balanced targets aren't supported":
            # https://cloud.google.com/iap/docs/tcp-forwarding-overview
            "balancer": "IAP TCP forwarding does not reach load-balanced targets, and a main "
            "node reaches the balancer's address as itself: connectCommand forwards to the "
            "first group's main node only; clients inside the VPC (or a network connected to "
            "it and admitted by apiAllowedCidrs) use balancerUrl",
        }

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
        # unmanaged instance group costs nothing; with replicas it holds the main nodes, the
        # balancer's backends.
        mains = gcp.compute.InstanceGroup(
            f"{name}-mains",
            zone=zone,
            network=network.id,
            description="the stack's zone; with replicas, the balancer's backends",
            opts=pulumi.ResourceOptions(
                parent=parent, ignore_changes=[] if config.zone else ["zone"]
            ),
        )
        return GcpNetwork(
            network, subnet, mains.zone, project, account, mains if config.replicas > 1 else None
        )

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
        return GcpGroup(main_tag=main_tag, worker_tag=worker_tag)

    def node(
        self,
        spec: NodeSpec,
        config: ClusterConfig,
        network: GcpNetwork,
        group: GcpGroup,
        parent: pulumi.Resource,
    ) -> Node:
        labels = self.tags(config, spec.role)
        main = spec.role == "main"
        instance = config.main_instance_type if main else config.instance_type
        disk = self.facts.disk.provision(spec.disk_throughput_mibps)
        fast = self.facts.fast_network_min_vcpus
        tier = "TIER_1" if fast is not None and instance.vcpus >= fast else "DEFAULT"
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
                    "provisioned_iops": disk.iops,
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
            tags=[group.main_tag if main else group.worker_tag],
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
        if main and network.mains is not None:
            # A replaced VM drops out of its instance group, and a new one by the same name is
            # not added back while the group's inputs stay the same: the membership is its own
            # resource, replaced with the VM (the provider's advice:
            # https://www.pulumi.com/registry/packages/gcp/api-docs/compute/instancegroupmembership/;
            # replace_with needs a Pulumi CLI from December 2025 on), and removed before the
            # new one is added, since the new VM has the same URL.
            gcp.compute.InstanceGroupMembership(
                f"{spec.name}-balanced",
                instance=vm.self_link,
                instance_group=network.mains.name,
                zone=network.zone,
                opts=pulumi.ResourceOptions(
                    parent=parent, delete_before_replace=True, replace_with=[vm]
                ),
            )
        return Node(instance_id=vm.name, private_ip=vm.network_interfaces[0].network_ip)

    def balancer(
        self,
        name: str,
        config: ClusterConfig,
        network: GcpNetwork,
        *,
        groups: Sequence[GcpGroup],
        mains: Sequence[Node],  # noqa: ARG002 (the Backend interface)
        parent: pulumi.Resource,
    ) -> None:
        """An internal passthrough Network Load Balancer at the balancer's fixed address: the
        server port to every main node whose /health answers 200. The main nodes joined its
        instance group as they were made (``node``). It keeps the client's address, so the
        API rules (IAP, apiAllowedCidrs) decide who reaches the API through it too."""
        opts = pulumi.ResourceOptions(parent=parent)
        if network.mains is None or config.balancer_ip is None:
            raise ValueError("the balancer is made only for replicas > 1")
        port = config.server_port
        gcp.compute.Firewall(
            f"{name}-main-api-from-health-checks",
            network=network.network.id,
            direction="INGRESS",
            allows=[{"protocol": "tcp", "ports": [str(port)]}],
            source_ranges=list(HEALTH_CHECK_RANGES),
            target_tags=[group.main_tag for group in groups],
            description="the internal balancer's health checks (Google's probe ranges)",
            opts=opts,
        )
        health = gcp.compute.RegionHealthCheck(
            f"{name}-health",
            region=config.region,
            http_health_check={"port": port, "request_path": HEALTH_PATH},
            check_interval_sec=HEALTH_INTERVAL_SECONDS,
            timeout_sec=HEALTH_TIMEOUT_SECONDS,
            healthy_threshold=HEALTH_THRESHOLD,
            unhealthy_threshold=HEALTH_THRESHOLD,
            description="llama-server answers /health with 200 once its model is loaded",
            opts=opts,
        )
        servers = gcp.compute.RegionBackendService(
            f"{name}-servers",
            region=config.region,
            load_balancing_scheme="INTERNAL",
            protocol="TCP",
            network=network.network.id,
            health_checks=health.id,
            backends=[{"group": network.mains.self_link, "balancing_mode": "CONNECTION"}],
            # No connection_tracking_policy: its idle timeout is refused unless every request
            # of a client address goes to one group (CLIENT_IP affinity, PER_SESSION tracking),
            # which defeats the balancer. Its default (PASSTHROUGH_IDLE_TIMEOUT_SECONDS) equals
            # llama-server's own timeout.
            description="every serving group's llama-server",
            opts=opts,
        )
        gcp.compute.ForwardingRule(
            f"{name}-balancer",
            region=config.region,
            load_balancing_scheme="INTERNAL",
            ip_protocol="TCP",
            ports=[str(port)],
            network=network.network.id,
            subnetwork=network.subnet.id,
            ip_address=config.balancer_ip,
            allow_global_access=False,  # clients in the stack's region only
            backend_service=servers.id,
            labels=self.tags(config, "balancer"),
            opts=opts,
        )

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
        self, config: ClusterConfig, network: GcpNetwork, main: Node
    ) -> pulumi.Output[str]:
        """An IAP tunnel to the first group's main node, with replicas too. IAP TCP forwarding
        does not support load-balanced targets (https://cloud.google.com/iap/docs/
        tcp-forwarding-overview); a tunnel to the balancer's address through a destination
        group (https://cloud.google.com/iap/docs/tcp-by-host) would be one. And a tunnel to a
        main node cannot go on to the balancer: a backend reaches the balancer's address as
        itself (the guest agent's local route). The limitations say so."""
        port = config.server_port
        return pulumi.Output.concat(
            "gcloud compute start-iap-tunnel ",
            main.instance_id,
            f" {port} --local-host-port=localhost:{port} --zone ",
            network.zone,
            " --project ",
            network.project,
        )
