"""The small interface every cloud implements: a network, the RPC firewall, and nodes.

The component (``infra.cluster``) only talks to this interface, so a cloud is added by writing
one module and registering it; the component, the outputs and the tests stay as they are.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

import pulumi

from infra.boot import Delivery, Role
from infra.config import ClusterConfig

NetworkT = TypeVar("NetworkT")
FirewallT = TypeVar("FirewallT")


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


class CloudBackend(ABC, Generic[NetworkT, FirewallT]):
    name: ClassVar[str]
    # Examples of Arm types, for the error a user sees when they give an x86 type.
    arm_examples: ClassVar[str]
    # What this cloud cannot do, in words (capability -> what happens instead). Empty: nothing.
    limitations: ClassVar[Mapping[str, str]] = {}

    @abstractmethod
    def is_arm(self, instance_type: str) -> bool:
        """Whether a type name is an Arm type, from the provider's naming rules."""

    def tag_problem(self, tags: Mapping[str, str]) -> str | None:
        """Why the user's tags break this cloud's rules, or None."""
        return None

    @abstractmethod
    def network(self, name: str, config: ClusterConfig, parent: pulumi.Resource) -> NetworkT:
        """The private network, its egress path, and anything the nodes share."""

    @abstractmethod
    def firewall(
        self, name: str, config: ClusterConfig, network: NetworkT, parent: pulumi.Resource
    ) -> FirewallT:
        """RPC open from the main node to the workers only; nothing else inbound."""

    @abstractmethod
    def node(
        self,
        spec: NodeSpec,
        config: ClusterConfig,
        network: NetworkT,
        firewall: FirewallT,
        parent: pulumi.Resource,
    ) -> Node:
        """One VM, without a public address, booting from ``spec.user_data``."""

    @abstractmethod
    def connect_command(
        self, config: ClusterConfig, network: NetworkT, main: Node
    ) -> pulumi.Output[str]:
        """How a user reaches the main node's API from a laptop (a private tunnel)."""

    def tags(self, config: ClusterConfig, role: str) -> dict[str, Any]:
        """The tags every resource carries: the user's, then project, stack and role."""
        return {
            **config.tags,
            "project": pulumi.get_project(),
            "stack": pulumi.get_stack(),
            "role": role,
        }
