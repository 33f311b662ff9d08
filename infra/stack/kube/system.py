"""The NetworkPolicies an EKS cluster in the VPC CNI's strict mode needs for the pods the stack
does not render: the cluster's DNS (CoreDNS) and the LeaderWorkerSet controller.

In strict mode a pod starts with everything denied and stays so until a policy selects it
(aws/amazon-vpc-cni-k8s README, NETWORK_POLICY_ENFORCING_MODE: "you must have a network policy
defined for every pod in your cluster"; the EKS guide names CoreDNS). Each policy admits what its
pods serve and reaches what they need, nothing wider: CoreDNS answers port 53 and asks the VPC's
resolver and the Kubernetes API; the controller answers the API server's webhook calls and reaches
the Kubernetes API. The API is the ``kubernetes`` Service's address (the first of the service
range, which the pod dials) and the control plane's interfaces in the VPC (where kube-proxy
sends it).
"""

from __future__ import annotations

import ipaddress
from typing import Any

from infra.clouds import aws as aws_facts
from infra.core import pins
from infra.stack.kube.objects import DNS_PEER

# CoreDNS, as the stack's pods' egress policies name it.
DNS_NAMESPACE = DNS_PEER["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
DNS_PODS = DNS_PEER["podSelector"]["matchLabels"]
DNS_PORT = 53
CONTROLLER_NAMESPACE = pins.LWS_NAMESPACE
CONTROLLER_DEPLOYMENT = pins.LWS_DEPLOYMENT
CONTROLLER_PODS = pins.LWS_PODS
WEBHOOK_PORT = pins.LWS_WEBHOOK_PORT
API_PORT = 443


def kubernetes_service_address(service_range: str | None) -> str:
    """The ``kubernetes`` Service's ClusterIP (the first address of the service range) as a /32
    (or /128)."""
    if not service_range:
        raise ValueError("EKS reported no IPv4 service range for the cluster")
    network = ipaddress.ip_network(service_range)
    return f"{network[1]}/{network.max_prefixlen}"


def _ports(port: int, *protocols: str) -> list[dict[str, Any]]:
    return [{"protocol": protocol, "port": port} for protocol in protocols]


def _blocks(*cidrs: Any) -> list[dict[str, Any]]:
    return [{"ipBlock": {"cidr": cidr}} for cidr in cidrs]


def _policy(
    name: str,
    namespace: str,
    pods: dict[str, str],
    labels: dict[str, str],
    *,
    ingress: list[dict[str, Any]],
    egress: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "podSelector": {"matchLabels": dict(pods)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": ingress,
            "egress": egress,
        },
    }


def dns_policy(name: str, labels: dict[str, str], *, vpc_cidr: str, api: Any) -> dict[str, Any]:
    """CoreDNS: port 53 from anywhere a pod of the cluster is (its clients), to the VPC's resolver
    (its upstream), and the Kubernetes API (which it watches for Services)."""
    dns = [*_ports(DNS_PORT, "UDP", "TCP")]
    return _policy(
        f"{name}-cluster-dns",
        DNS_NAMESPACE,
        DNS_PODS,
        labels,
        ingress=[{"ports": dns}],
        egress=[
            {"to": _blocks(vpc_cidr, aws_facts.VPC_RESOLVER_LINK_LOCAL), "ports": dns},
            {"to": _blocks(vpc_cidr, api), "ports": _ports(API_PORT, "TCP")},
        ],
    )


def controller_policy(
    name: str, labels: dict[str, str], *, vpc_cidr: str, api: Any
) -> dict[str, Any]:
    """The LWS controller: its webhook from the control plane (its interfaces are in the VPC),
    and the Kubernetes API."""
    return _policy(
        f"{name}-lws-controller",
        CONTROLLER_NAMESPACE,
        CONTROLLER_PODS,
        labels,
        ingress=[{"from": _blocks(vpc_cidr), "ports": _ports(WEBHOOK_PORT, "TCP")}],
        egress=[{"to": _blocks(vpc_cidr, api), "ports": _ports(API_PORT, "TCP")}],
    )
