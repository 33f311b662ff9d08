"""Every node of a checked cluster config: its name, boot settings and rendered, delivered user
data, group by group."""

from __future__ import annotations

from dataclasses import dataclass

from infra.boot import Delivery, NodeBoot
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
    first: those ``from_settings`` made when it checked them (``ClusterConfig.user_data``)."""
    return tuple(
        NodePlan(node_name(i, group), boot, user_data, group)
        for group, delivered in enumerate(config.user_data)
        for i, (boot, user_data) in enumerate(zip(config.boots(group), delivered, strict=True))
    )


def groups(plans: tuple[NodePlan, ...]) -> list[list[NodePlan]]:
    """The planned nodes of each serving group, main first."""
    count = max((plan.group for plan in plans), default=-1) + 1
    return [[plan for plan in plans if plan.group == group] for group in range(count)]
