"""What a stack asks of its cloud account (``ClusterConfig.needs`` makes it from a stack's
checked configuration)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from infra.clouds import FACTS
from infra.clouds.azure import NetworkWatcher
from infra.clouds.base import Right, VcpuQuota
from infra.core.layout import PROJECT


@dataclass(frozen=True)
class Needs:
    cloud: str
    region: str
    stack: str  # the stack's name, as Pulumi gives it
    # Every node of every serving group, and the balancer node: instance type -> how many.
    nodes: Mapping[str, int]
    vcpus: Mapping[str, int]  # instance type -> vCPUs of one
    zone: str | None = None  # the ``zone`` setting
    network_watcher: NetworkWatcher | None = None  # Azure, with flow logs on
    key_vault: bool = False  # Azure, with an API key: the stack makes a Key Vault
    # The balancer node's type, among ``nodes``, when the stack has one (replicas > 1 on VMs).
    balancer: str | None = None
    # Zones, by id, where the stack's platform refuses a subnet it needs (EKS: the control
    # plane's, which the nodes' subnet is too): never chosen, and a ``zone`` setting there is
    # refused.
    refused_zone_ids: frozenset[str] = frozenset()
    # What the deployer must be allowed beyond making resources (granting roles), each with the
    # setting that asks for it.
    rights: tuple[Right, ...] = ()
    # AWS VMs: the main nodes' model volumes' throughput (MiB/s): a change is a ModifyVolume,
    # which EC2 refuses while the volume's last change is not completed.
    model_disk_throughput: int | None = None
    project: str = PROJECT
    # The tags (labels) every node of the stack carries, to tell its own nodes from others.
    tags: Mapping[str, str] = field(default_factory=dict)

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(sorted(self.nodes))

    def quota_needs(self) -> dict[VcpuQuota, int]:
        """vCPUs the stack's nodes count against each quota, every group included."""
        found: dict[VcpuQuota, int] = {}
        for name, count in self.nodes.items():
            quota = FACTS[self.cloud].vcpu_quota(name)
            if quota is not None:
                found[quota] = found.get(quota, 0) + count * self.vcpus[name]
        return found

    @property
    def total_vcpus(self) -> int:
        return sum(count * self.vcpus[name] for name, count in self.nodes.items())
