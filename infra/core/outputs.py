"""The output contract: the same keys for every provider (and for the local cluster), and how a
deployed stack's groups and nodes are read from it.

The program exports these names and the tests read them; neither spells a key by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CLOUD = "cloud"
REGION = "region"
INSTANCE_TYPE = "instanceType"
WORKER_COUNT = "workerCount"
MAIN_PRIVATE_IP = "mainPrivateIp"
WORKER_PRIVATE_IPS = "workerPrivateIps"
RPC_SERVERS = "rpcServers"
LLAMA_SERVER_URL = "llamaServerUrl"
MAIN_INSTANCE_ID = "mainInstanceId"
WORKER_INSTANCE_IDS = "workerInstanceIds"
CONNECT_COMMAND = "connectCommand"
# The key every API request but /health carries: a Pulumi secret (`pulumi stack output apiKey
# --show-secrets`); None without one, and on the local cluster (its file: `lrc local status`).
API_KEY = "apiKey"
HOURLY_COST_USD = "hourlyCostUsd"
# What the stack still costs an hour with every instance stopped, the balancer node's too
# (disks, NAT).
STOPPED_HOURLY_COST_USD = "stoppedHourlyCostUsd"
LLAMA_CPP_COMMIT = "llamaCppCommit"
# Replicas: how many serving groups, the private balancer in front of them (None with one
# group: there is none), and each group's own outputs (GROUP_KEYS), in order. The keys above
# that name one main node or its workers are the first group's.
REPLICAS = "replicas"
BALANCER_URL = "balancerUrl"
GROUPS = "groups"
# The balancer node's instance (VM name on GCP and Azure): a spend guard stops it with its
# groups and ``lrc start`` starts it with them. None without a balancer node (one group; on
# Kubernetes, where HAProxy runs as pods; on the local cluster, where it is a process).
BALANCER_INSTANCE_ID = "balancerInstanceId"
# The one command a watcher (`top`) can be granted alone: on AWS, the name of the stack's SSM
# document that takes one reading of a group's metrics; None where a cloud's command channel
# has no such grant (GCP, Azure) and on the local cluster.
METRICS_DOCUMENT = "metricsDocument"
# Where the nodes are, for the command channels: the zone (AWS, GCP; None on Azure, whose nodes
# are regional, and locally) and Azure's resource group (None elsewhere).
ZONE = "zone"
RESOURCE_GROUP = "resourceGroup"

ALL_KEYS = (
    CLOUD,
    REGION,
    INSTANCE_TYPE,
    WORKER_COUNT,
    MAIN_PRIVATE_IP,
    WORKER_PRIVATE_IPS,
    RPC_SERVERS,
    LLAMA_SERVER_URL,
    MAIN_INSTANCE_ID,
    WORKER_INSTANCE_IDS,
    CONNECT_COMMAND,
    API_KEY,
    HOURLY_COST_USD,
    STOPPED_HOURLY_COST_USD,
    LLAMA_CPP_COMMIT,
    REPLICAS,
    BALANCER_URL,
    GROUPS,
    BALANCER_INSTANCE_ID,
    METRICS_DOCUMENT,
    ZONE,
    RESOURCE_GROUP,
)
# Details beside the contract, for people: what the hourly figure counts and leaves out, the
# main node's type, and what the cloud cannot do for this stack.
HOURLY_COST_BASIS = "hourlyCostBasis"
MAIN_INSTANCE_TYPE = "mainInstanceType"
LIMITATIONS = "limitations"
DETAIL_KEYS = (HOURLY_COST_BASIS, MAIN_INSTANCE_TYPE, LIMITATIONS)
# The kubernetes platform's details: the platform, the EKS cluster's name and the namespace of
# the stack's objects (what kubectl needs).
PLATFORM = "platform"
KUBERNETES_CLUSTER = "kubernetesCluster"
KUBERNETES_NAMESPACE = "kubernetesNamespace"
KUBERNETES_KEYS = (PLATFORM, KUBERNETES_CLUSTER, KUBERNETES_NAMESPACE)
# What each entry of GROUPS holds.
GROUP_KEYS = (
    MAIN_PRIVATE_IP,
    WORKER_PRIVATE_IPS,
    RPC_SERVERS,
    LLAMA_SERVER_URL,
    MAIN_INSTANCE_ID,
    WORKER_INSTANCE_IDS,
)


def rpc_servers(worker_ips: list[str], port: int) -> str:
    """``--rpc`` list for llama-server: ``ip:port`` in worker order, comma-separated."""
    return ",".join(f"{ip}:{port}" for ip in worker_ips)


def group_outputs(stack_outputs: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Each serving group's outputs, in order (a stack from before replicas: the top level)."""
    groups = stack_outputs.get(GROUPS)
    return list(groups) if groups else [stack_outputs]


def main_ids(stack_outputs: Mapping[str, Any]) -> list[str]:
    """Each serving group's main node, in order."""
    return [str(group[MAIN_INSTANCE_ID]) for group in group_outputs(stack_outputs)]


def node_ids(stack_outputs: Mapping[str, Any]) -> list[str]:
    """Every node of the stack, each group's workers before its main node (a main node that
    comes up first waits for them anyway), and the balancer node last, where there is one (its
    groups pass HAProxy's checks as they come up)."""
    ids: list[str] = []
    for group in group_outputs(stack_outputs):
        ids += [str(worker) for worker in group.get(WORKER_INSTANCE_IDS) or []]
        ids.append(str(group[MAIN_INSTANCE_ID]))
    balancer = stack_outputs.get(BALANCER_INSTANCE_ID)
    if balancer:
        ids.append(str(balancer))
    return ids
