"""Every node of a checked cluster config: its name, boot settings and rendered, delivered user
data, group by group."""

from __future__ import annotations

from dataclasses import dataclass

from infra.boot import Delivery, NodeBoot, deliver, render
from infra.core.layout import node_name
from infra.core.limits import Role
from infra.stack.config import ClusterConfig


@dataclass(frozen=True)
class NodePlan:
    name: str  # "main", "worker-1", "replica2-main", ... (infra.core.layout.node_name)
    boot: NodeBoot
    user_data: Delivery
    group: int = 0  # the serving group (0-based) it belongs to

    @property
    def role(self) -> Role:
        return self.boot.role


def plan_nodes(config: ClusterConfig) -> tuple[NodePlan, ...]:
    """Every node's rendered, delivered user data, group by group, each group's main node
    first (``from_settings`` has rendered them once already, so this raises nothing)."""
    return tuple(
        NodePlan(node_name(i, group), node, deliver(render(node), config.cloud), group)
        for group in range(config.replicas)
        for i, node in enumerate(config.boots(group))
    )


def groups(plans: tuple[NodePlan, ...]) -> list[list[NodePlan]]:
    """The planned nodes of each serving group, main first."""
    count = max((plan.group for plan in plans), default=-1) + 1
    return [[plan for plan in plans if plan.group == group] for group in range(count)]
