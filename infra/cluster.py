"""``LlamaRpcCluster``: the private network, the RPC firewall, the workers and the main node.

Workers get fixed private addresses (.11, .12, …) and the main node .10, so the main node's boot
data can list the workers before they exist and every node is created at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi

from infra import outputs
from infra.clouds import get_backend
from infra.clouds.base import NodeSpec
from infra.config import ClusterConfig
from infra.nodes import NodePlan


@dataclass(frozen=True)
class LlamaRpcClusterArgs:
    config: ClusterConfig


class LlamaRpcCluster(pulumi.ComponentResource):
    def __init__(
        self, name: str, args: LlamaRpcClusterArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("llama-rpc-cluster:index:LlamaRpcCluster", name, None, opts)
        config = args.config
        backend = get_backend(config.cloud)
        network = backend.network(name, config, self)
        firewall = backend.firewall(name, config, network, self)
        main_plan, *worker_plans = config.nodes

        def spec(plan: NodePlan) -> NodeSpec:
            main = plan.role == "main"
            instance = config.main_instance_type if main else config.instance_type
            return NodeSpec(
                name=f"{name}-{plan.name}",
                role=plan.role,
                private_ip=plan.boot.node_ip,
                instance_type=instance.name,
                disk_gb=config.main_disk_gb if main else config.worker_disk_gb,
                disk_throughput_mibps=config.disk_throughput_mibps if main else None,
                user_data=plan.user_data,
            )

        workers = [
            backend.node(spec(plan), config, network, firewall, self) for plan in worker_plans
        ]
        main = backend.node(spec(main_plan), config, network, firewall, self)

        price = config.hourly_usd
        self.outputs: dict[str, Any] = {
            outputs.CLOUD: config.cloud,
            outputs.REGION: config.region,
            outputs.INSTANCE_TYPE: config.instance_type.name,
            outputs.WORKER_COUNT: config.worker_count,
            outputs.MAIN_PRIVATE_IP: main.private_ip,
            outputs.WORKER_PRIVATE_IPS: pulumi.Output.all(*(w.private_ip for w in workers)),
            outputs.RPC_SERVERS: main_plan.boot.rpc_servers,
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
            "limitations": [f"{k}: {v}" for k, v in backend.limitations(config).items()],
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
