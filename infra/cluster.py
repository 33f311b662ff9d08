"""``LlamaRpcCluster``: the private network, the RPC firewall, the workers and the main node.

Workers get fixed private addresses (.11, .12, …) and the main node .10, so the main node's boot
data can list the workers before they exist and every node is created at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi

from infra import boot, outputs
from infra.clouds import get_backend
from infra.clouds.base import NodeSpec
from infra.config import ClusterConfig


@dataclass(frozen=True)
class LlamaRpcClusterArgs:
    config: ClusterConfig


def node_boots(config: ClusterConfig) -> tuple[boot.NodeBoot, list[boot.NodeBoot]]:
    """The main node's and each worker's boot settings."""
    workers = [
        boot.NodeBoot(
            role="worker",
            node_ip=ip,
            llama_cpp_commit=config.llama_cpp_commit,
            rpc_port=config.rpc_port,
            rpc_allowed_sources=(f"{config.main_ip}/32",),
        )
        for ip in config.worker_ips
    ]
    main = boot.NodeBoot(
        role="main",
        node_ip=config.main_ip,
        llama_cpp_commit=config.llama_cpp_commit,
        rpc_port=config.rpc_port,
        rpc_workers=tuple(config.worker_ips),
        model_urls=config.model.urls,
        model_sha256=config.model.sha256,
        server_port=config.server_port,
        context_size=config.context_size,
        slots=config.slots,
        gpu_layers=config.placement.gpu_layers,
        tensor_split=config.placement.tensor_split,
    )
    return main, workers


class LlamaRpcCluster(pulumi.ComponentResource):
    def __init__(
        self, name: str, args: LlamaRpcClusterArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("llama-rpc-cluster:index:LlamaRpcCluster", name, None, opts)
        config = args.config
        backend = get_backend(config.cloud)
        network = backend.network(name, config, self)
        firewall = backend.firewall(name, config, network, self)
        main_boot, worker_boots = node_boots(config)

        def spec(
            node_name: str, node: boot.NodeBoot, disk_gb: int, throughput: int | None
        ) -> NodeSpec:
            instance = config.main_instance_type if node.role == "main" else config.instance_type
            return NodeSpec(
                name=node_name,
                role=node.role,
                private_ip=node.node_ip,
                instance_type=instance.name,
                disk_gb=disk_gb,
                disk_throughput_mibps=throughput,
                user_data=boot.deliver(boot.render(node), config.cloud),
            )

        workers = [
            backend.node(
                spec(f"{name}-worker-{i}", node, config.worker_disk_gb, None),
                config,
                network,
                firewall,
                self,
            )
            for i, node in enumerate(worker_boots, start=1)
        ]
        main = backend.node(
            spec(f"{name}-main", main_boot, config.main_disk_gb, config.disk_throughput_mibps),
            config,
            network,
            firewall,
            self,
        )

        price = config.hourly_usd
        self.outputs: dict[str, Any] = {
            outputs.CLOUD: config.cloud,
            outputs.REGION: config.region,
            outputs.INSTANCE_TYPE: config.instance_type.name,
            outputs.WORKER_COUNT: config.worker_count,
            outputs.MAIN_PRIVATE_IP: main.private_ip,
            outputs.WORKER_PRIVATE_IPS: pulumi.Output.all(*(w.private_ip for w in workers)),
            outputs.RPC_SERVERS: main_boot.rpc_servers,
            outputs.LLAMA_SERVER_URL: f"http://{config.main_ip}:{config.server_port}",
            outputs.MAIN_INSTANCE_ID: main.instance_id,
            outputs.WORKER_INSTANCE_IDS: pulumi.Output.all(*(w.instance_id for w in workers)),
            outputs.CONNECT_COMMAND: backend.connect_command(config, network, main),
            outputs.HOURLY_COST_USD: price,
            outputs.LLAMA_CPP_COMMIT: config.llama_cpp_commit,
        }
        self.details: dict[str, Any] = {
            "hourlyCostBasis": _cost_basis(config),
            "mainInstanceType": config.main_instance_type.name,
            "limitations": [f"{k}: {v}" for k, v in backend.limitations.items()],
        }
        self.register_outputs({**self.outputs, **self.details})


def _cost_basis(config: ClusterConfig) -> str:
    main, worker = config.main_instance_type, config.instance_type
    if config.hourly_usd is None:
        return f"unknown: no catalog price for {main.name} or {worker.name} in {config.region}"
    return (
        f"instances only: 1 x {main.name} ${main.hourly_usd}/h + {config.worker_count} x "
        f"{worker.name} ${worker.hourly_usd}/h, {worker.price_source}, {worker.price_date}; "
        "NAT gateway, disks and data transfer are extra"
    )
