"""``LlamaRpcCluster``: the private network, the RPC firewall, the workers and the main node.

Workers get fixed private addresses (.11, .12, …) and the main node .10, so the main node's boot
data can list the workers before they exist and every node is created at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi

from infra import outputs
from infra.stack.config import ClusterConfig
from infra.stack.nodes import NodePlan
from infra.stack.providers import get_backend
from infra.stack.providers.base import NodeSpec


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

        cost = config.hourly_cost
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
            outputs.HOURLY_COST_USD: cost.total,
            outputs.LLAMA_CPP_COMMIT: config.llama_cpp_commit,
        }
        self.details: dict[str, Any] = {
            "hourlyCostBasis": cost.basis,
            "mainInstanceType": config.main_instance_type.name,
            "limitations": [f"{k}: {v}" for k, v in backend.limitations(config).items()],
        }
        self.register_outputs({**self.outputs, **self.details})
