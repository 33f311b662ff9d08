"""Every node of a cluster as the config describes it: its name, boot settings and rendered,
delivered user data. Built during the config check, so a boot setting the renderer rejects (or
user data over the cloud's limit) is refused before any resource is created.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from infra.boot import Delivery, NodeBoot, deliver, render
from infra.clouds import FACTS
from infra.layout import node_name
from infra.types import Role

if TYPE_CHECKING:
    from infra.stack.config import ClusterConfig


@dataclass(frozen=True)
class NodePlan:
    name: str  # "main", "worker-1", "replica2-main", ... (infra.layout.node_name)
    boot: NodeBoot
    user_data: Delivery
    group: int = 0  # the serving group (0-based) it belongs to

    @property
    def role(self) -> Role:
        return self.boot.role


def node_boots(config: ClusterConfig, group: int = 0) -> list[NodeBoot]:
    """A serving group's main node's and then each of its workers' boot settings: its workers
    take RPC from its own main node only."""
    facts = FACTS[config.cloud]
    platform = tuple(sorted(a for a in facts.metadata_addresses if ":" not in a))
    main_ip, *worker_ips = config.group_ips(group)
    # Behind a passthrough balancer requests arrive addressed to the balancer's IP. Set with or
    # without replicas, so that adding groups later leaves the first group's boot data (and its
    # nodes) as they are. The node's one interface is private; the cloud firewall decides.
    listen = "0.0.0.0" if facts.balancer_keeps_destination else None  # noqa: S104
    workers = [
        NodeBoot(
            role="worker",
            node_ip=ip,
            llama_cpp_commit=config.llama_cpp_commit,
            rpc_port=config.rpc_port,
            rpc_allowed_sources=(f"{main_ip}/32",),
            cluster_cidr=str(config.vpc_cidr),
            platform_addresses=platform,
        )
        for ip in worker_ips
    ]
    main = NodeBoot(
        role="main",
        node_ip=main_ip,
        # The metrics port admits the cluster's network (the top view reads it through here).
        cluster_cidr=str(config.vpc_cidr),
        llama_cpp_commit=config.llama_cpp_commit,
        rpc_port=config.rpc_port,
        rpc_workers=tuple(worker_ips),
        model_urls=config.model_urls,
        model_sha256=config.model_sha256,
        # A staged model lives in the stack's region: the private path reaches only that one.
        model_store_region=config.region,
        server_port=config.server_port,
        context_size=config.context_size,
        slots=config.slots,
        gpu_layers=config.placement.gpu_layers,
        tensor_split=config.placement.tensor_split,
        server_listen=listen,
    )
    return [main, *workers]


def plan_nodes(config: ClusterConfig) -> tuple[NodePlan, ...]:
    """Render and deliver every node's user data, group by group, each group's main node
    first; raises ``infra.boot.BootConfigError``."""
    return tuple(
        NodePlan(node_name(i, group), node, deliver(render(node), config.cloud), group)
        for group in range(config.replicas)
        for i, node in enumerate(node_boots(config, group))
    )
