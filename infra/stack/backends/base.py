"""The small interface every cloud implements: a network, each serving group's firewall and
placement, nodes, and the balancer node in front of the groups.

The component (``infra.stack.component``) only talks to this interface. A cloud is added with its
facts (``infra.clouds``), its module here, its catalog rows, and a line in each registry; the
component, the config check, the outputs and the tests stay as they are.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

import pulumi

from infra.boot import Delivery
from infra.boot.balancer import BalancerBoot
from infra.clouds import CloudFacts
from infra.core import outputs
from infra.core.limits import Role
from infra.stack.config import ClusterConfig

NetworkT = TypeVar("NetworkT")
GroupT = TypeVar("GroupT")
FirewallT = TypeVar("FirewallT")


@dataclass(frozen=True)
class BalancerPlace(Generic[FirewallT]):
    """The balancer node's place, made with the network when the stack has a balancer boot
    (``ClusterConfig.balancer_boot``): the boot, and what the cloud's firewall rules know the
    node by (a security group, a network tag), which every group's main node admits."""

    boot: BalancerBoot
    firewall: FirewallT


@dataclass(frozen=True)
class GroupSpec:
    """One serving group: a main node and its workers (``replicas`` of them per stack)."""

    index: int  # 0-based
    # What its resources' names start with: the cluster's name for the first group (a stack
    # without replicas keeps its names), then "<cluster>-replica2", "<cluster>-replica3", ...
    name: str
    main_ip: str
    worker_ips: tuple[str, ...]


@dataclass(frozen=True)
class NodeSpec:
    """One VM: its name, role, fixed private address, size, disk and boot data."""

    name: str
    role: Role
    private_ip: str
    instance_type: str
    disk_gb: int
    disk_throughput_mibps: int | None
    user_data: Delivery


@dataclass(frozen=True)
class Node:
    instance_id: pulumi.Output[str]
    private_ip: pulumi.Output[str]
    # The cloud's own id of the VM resource (ARM id on Azure), where a command needs it.
    resource_id: pulumi.Output[str] | None = None


def node_options(parent: pulumi.Resource, **options: Any) -> pulumi.ResourceOptions:
    """Options for a resource that holds a fixed private address (a VM, a NIC): the old one is
    deleted before its replacement is created, since the address can only be used once
    (AWS answers a create-first replacement with InvalidIPAddress.InUse)."""
    return pulumi.ResourceOptions(parent=parent, delete_before_replace=True, **options)


class CloudBackend(ABC, Generic[NetworkT, GroupT]):
    # The cloud's limits and rules (no SDK), checked by the config before this backend runs.
    facts: ClassVar[CloudFacts]

    def limitations(self, config: ClusterConfig) -> Mapping[str, str]:  # noqa: ARG002 (the Backend interface)
        """What this cloud cannot do for this stack, in words (capability -> what instead)."""
        return self.facts.limitations

    @abstractmethod
    def network(
        self, name: str, config: ClusterConfig, parent: pulumi.Resource, *, zone: str | None
    ) -> NetworkT:
        """The private network, its egress path, and anything the nodes share. ``zone``: where a
        new stack's nodes go; a stack keeps the zone it was created in, unless ``zone`` is a
        setting (``config.zone``), whose change moves (rebuilds) it."""

    @abstractmethod
    def group(
        self, spec: GroupSpec, config: ClusterConfig, network: NetworkT, parent: pulumi.Resource
    ) -> GroupT:
        """One serving group's firewall and placement: RPC open from the group's own main node
        to its workers only, node metrics from inside the cluster's network only, the API from
        the tunnel, apiAllowedCidrs and the balancer; nothing else inbound."""

    @abstractmethod
    def node(
        self,
        spec: NodeSpec,
        config: ClusterConfig,
        network: NetworkT,
        group: GroupT,
        parent: pulumi.Resource,
    ) -> Node:
        """One VM, without a public address, booting from ``spec.user_data``."""

    @abstractmethod
    def balancer(
        self,
        name: str,
        config: ClusterConfig,
        network: NetworkT,
        *,
        groups: Sequence[GroupT],
        mains: Sequence[Node],
        parent: pulumi.Resource,
    ) -> Node | None:
        """The balancer node at its place in ``network`` (None: the stack has none), booting from
        its boot: HAProxy sends each request on the server port to a group's main node with a
        free slot, of those that answer ``GET /health`` with 200. Its firewall admits the server
        port from the tunnel and apiAllowedCidrs, as a main node's does, and each main node
        admits it."""

    def keep_api_key(
        self,
        name: str,
        config: ClusterConfig,
        network: NetworkT,
        key: pulumi.Output[str],
        parent: pulumi.Resource,
    ) -> None:
        """Keep the key where the main nodes read it at boot with their own identity, and grant
        them that read alone. The config check refuses a key where the cloud keeps none."""
        raise NotImplementedError(f"{self.facts.name} keeps no API key")

    @abstractmethod
    def connect_command(
        self, config: ClusterConfig, network: NetworkT, main: Node, balancer: Node | None
    ) -> pulumi.Output[str]:
        """How a user reaches the API from a laptop: a command that forwards
        localhost:<serverPort> to the balancer node when there is one, or else ``main``, the first
        group's main node."""

    def location(self, network: NetworkT) -> dict[str, pulumi.Input[str] | None]:  # noqa: ARG002 (the Backend interface)
        """Where the nodes are, as the command channels name it: the zone and the resource
        group (``outputs.ZONE``, ``outputs.RESOURCE_GROUP``), None where a cloud has none."""
        return {outputs.ZONE: None, outputs.RESOURCE_GROUP: None}

    def metrics_document(
        self,
        name: str,  # noqa: ARG002 (the Backend interface)
        config: ClusterConfig,  # noqa: ARG002 (the Backend interface)
        parent: pulumi.Resource,  # noqa: ARG002 (the Backend interface)
    ) -> pulumi.Output[str] | None:
        """The command a watcher can be granted alone, where the cloud has such a grant (the
        name the channel sends it by); None: the channel runs any command it is given."""
        return None

    def tags(self, config: ClusterConfig, role: str) -> dict[str, Any]:
        """The tags every resource carries: the user's, then project, stack and role."""
        return {
            **config.tags,
            "project": pulumi.get_project(),
            "stack": self.facts.tag_value(pulumi.get_stack()),
            "role": role,
        }
