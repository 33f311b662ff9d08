"""``LlamaRpcCluster``: the private network, and in it one or more serving groups (a main node
and its workers, each group with its own RPC firewall and placement), behind a balancer node
when there is more than one.

Every node gets a fixed private address (``infra.core.layout``): a group's main node .10 (.30, .50,
… for the next groups) and its workers after it, so a main node's boot data can list its
workers before they exist and every node is created at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_random as random

from infra.core import layout, outputs
from infra.stack.backends import get_backend
from infra.stack.backends.base import GroupSpec, Node, NodeSpec
from infra.stack.config import ClusterConfig
from infra.stack.nodes import NodePlan, groups, plan_nodes

API_KEY_LENGTH = 48  # letters and digits: about 285 bits


@dataclass(frozen=True)
class LlamaRpcClusterArgs:
    config: ClusterConfig
    # The zone a new stack's nodes are created in (the preflight chooses it; None on Azure). An
    # existing stack keeps the zone it was created in, unless the ``zone`` setting moves it.
    zone: str | None = None


class LlamaRpcCluster(pulumi.ComponentResource):
    def __init__(
        self, name: str, args: LlamaRpcClusterArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("llama-rpc-cluster:index:LlamaRpcCluster", name, None, opts)
        config = args.config
        backend = get_backend(config.cloud)
        network = backend.network(name, config, self, zone=args.zone)
        api_key = stack_api_key(name, config, self)
        if api_key is not None:
            backend.keep_api_key(name, config, network, api_key, self)

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

        planned = groups(plan_nodes(config))
        serving, mains, workers = [], [], []
        for index, (main_plan, *worker_plans) in enumerate(planned):
            group = backend.group(
                GroupSpec(
                    index=index,
                    name=layout.group_name(name, index),
                    main_ip=main_plan.boot.node_ip,
                    worker_ips=tuple(plan.boot.node_ip for plan in worker_plans),
                ),
                config,
                network,
                self,
            )
            serving.append(group)
            workers.append(
                [backend.node(spec(plan), config, network, group, self) for plan in worker_plans]
            )
            mains.append(backend.node(spec(main_plan), config, network, group, self))
        balancer_node = backend.balancer(
            name, config, network, groups=serving, mains=mains, parent=self
        )

        def group_outputs(main_plan: NodePlan, main: Node, nodes: list[Node]) -> dict[str, Any]:
            return {
                outputs.MAIN_PRIVATE_IP: main.private_ip,
                outputs.WORKER_PRIVATE_IPS: pulumi.Output.all(*(n.private_ip for n in nodes)),
                outputs.RPC_SERVERS: main_plan.boot.rpc_servers,
                outputs.LLAMA_SERVER_URL: f"http://{main_plan.boot.node_ip}:{config.server_port}",
                outputs.MAIN_INSTANCE_ID: main.instance_id,
                outputs.WORKER_INSTANCE_IDS: pulumi.Output.all(*(n.instance_id for n in nodes)),
            }

        per_group = [
            group_outputs(plans[0], main, nodes)
            for plans, main, nodes in zip(planned, mains, workers, strict=True)
        ]
        cost = config.hourly_cost
        balancer = config.balancer_boot
        self.outputs: dict[str, Any] = {
            outputs.CLOUD: config.cloud,
            outputs.REGION: config.region,
            outputs.INSTANCE_TYPE: config.instance_type.name,
            outputs.WORKER_COUNT: config.worker_count,
            **per_group[0],
            outputs.CONNECT_COMMAND: backend.connect_command(
                config, network, mains[0], balancer_node
            ),
            outputs.API_KEY: api_key,
            outputs.HOURLY_COST_USD: cost.total,
            outputs.STOPPED_HOURLY_COST_USD: cost.stopped,
            outputs.LLAMA_CPP_COMMIT: config.llama_cpp_commit,
            outputs.REPLICAS: config.replicas,
            outputs.BALANCER_URL: balancer and f"http://{balancer.listen_ip}:{balancer.port}",
            outputs.GROUPS: per_group,
            outputs.BALANCER_INSTANCE_ID: balancer_node.instance_id if balancer_node else None,
            outputs.METRICS_DOCUMENT: backend.metrics_document(name, config, self),
            **backend.location(network),
        }
        self.details: dict[str, Any] = {
            outputs.HOURLY_COST_BASIS: cost.basis,
            outputs.MAIN_INSTANCE_TYPE: config.main_instance_type.name,
            outputs.LIMITATIONS: [f"{k}: {v}" for k, v in backend.limitations(config).items()],
        }
        self.register_outputs({**self.outputs, **self.details})


def stack_api_key(
    name: str, config: ClusterConfig, parent: pulumi.Resource
) -> pulumi.Output[str] | None:
    """The stack's API key, a secret: the apiKey setting's, or one generated for the stack (a
    provider resource, kept in the state, so every `up` keeps the same key); None without one."""
    if config.api_key == "none":
        return None
    if config.api_key == "given":
        from infra.core.layout import PROJECT  # noqa: PLC0415

        return pulumi.Config(PROJECT).require_secret("apiKey")
    generated = random.RandomPassword(
        f"{name}-api-key",
        length=API_KEY_LENGTH,
        special=False,  # a word a header, a file and a shell carry as it is
        opts=pulumi.ResourceOptions(parent=parent),
    )
    return pulumi.Output.secret(generated.result)
