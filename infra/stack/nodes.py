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
    name: str  # "main", "worker-1", ... (infra.layout.node_name)
    boot: NodeBoot
    user_data: Delivery

    @property
    def role(self) -> Role:
        return self.boot.role


def node_boots(config: ClusterConfig) -> list[NodeBoot]:
    """The main node's and then each worker's boot settings."""
    platform = tuple(sorted(a for a in FACTS[config.cloud].metadata_addresses if ":" not in a))
    workers = [
        NodeBoot(
            role="worker",
            node_ip=ip,
            llama_cpp_commit=config.llama_cpp_commit,
            rpc_port=config.rpc_port,
            rpc_allowed_sources=(f"{config.main_ip}/32",),
            cluster_cidr=str(config.vpc_cidr),
            platform_addresses=platform,
        )
        for ip in config.worker_ips
    ]
    main = NodeBoot(
        role="main",
        node_ip=config.main_ip,
        llama_cpp_commit=config.llama_cpp_commit,
        rpc_port=config.rpc_port,
        rpc_workers=tuple(config.worker_ips),
        model_urls=config.model_urls,
        model_sha256=config.model_sha256,
        # A staged model lives in the stack's region: the private path reaches only that one.
        model_store_region=config.region,
        server_port=config.server_port,
        context_size=config.context_size,
        slots=config.slots,
        gpu_layers=config.placement.gpu_layers,
        tensor_split=config.placement.tensor_split,
    )
    return [main, *workers]


def plan_nodes(config: ClusterConfig) -> tuple[NodePlan, ...]:
    """Render and deliver every node's user data; raises ``infra.boot.BootConfigError``."""
    return tuple(
        NodePlan(node_name(i), node, deliver(render(node), config.cloud))
        for i, node in enumerate(node_boots(config))
    )
