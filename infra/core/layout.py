"""Where each node sits in the cluster's network, in the cloud and on this machine alike.

The private subnet is the network's first /24 (or the whole network when it is smaller) and the
public one its second /24 (NAT, Bastion). In the private subnet the main node is .10 and the
workers .11, .12, …: fixed addresses let the main node's boot data list the workers before they
exist, and keep the ``--rpc`` list stable when a node is replaced.

With replicas, serving group ``g`` (0-based) starts ``GROUP_STRIDE`` addresses after the one
before it: mains at .10, .30, .50, …, each group's workers after its main. Group 0 is laid out
as a single cluster is, so adding replicas leaves its nodes where they are. The private balancer
in front of the groups takes .5.
"""

from __future__ import annotations

import ipaddress

# The Pulumi project, and the prefix of every resource the program names.
PROJECT = "llama-rpc-cluster"

MAIN_HOST = 10  # the main node's host number; the workers follow it
GROUP_STRIDE = 20  # host numbers per serving group: a main and up to 15 workers, then a gap
BALANCER_HOST = 5  # the private balancer's address (every cloud reserves at most .0-.3)
SUBNET_PREFIX = 24
MAIN = "main"


def private_subnet(network: ipaddress.IPv4Network) -> ipaddress.IPv4Network:
    if network.prefixlen >= SUBNET_PREFIX:
        return network
    return next(network.subnets(new_prefix=SUBNET_PREFIX))


def public_subnet(network: ipaddress.IPv4Network) -> ipaddress.IPv4Network:
    subnets = network.subnets(new_prefix=SUBNET_PREFIX)
    next(subnets)
    return next(subnets)


def kubernetes_subnets(
    network: ipaddress.IPv4Network,
) -> tuple[ipaddress.IPv4Network, ipaddress.IPv4Network]:
    """EKS: the public /24 halved, the NAT's subnet and, in a second zone, the control plane's
    (EKS takes subnets in two zones); the nodes and their pods keep the private /24."""
    nat, control_plane = public_subnet(network).subnets(new_prefix=SUBNET_PREFIX + 1)
    return nat, control_plane


def node_ips(subnet: ipaddress.IPv4Network, workers: int, group: int = 0) -> list[str]:
    """A serving group's main node address, then each of its workers'."""
    base = subnet.network_address + MAIN_HOST + GROUP_STRIDE * group
    return [str(base + i) for i in range(workers + 1)]


def balancer_ip(subnet: ipaddress.IPv4Network) -> str:
    return str(subnet.network_address + BALANCER_HOST)


def group_prefix(group: int) -> str:
    """What a serving group's resource names start with: nothing for the first (a cluster
    without replicas keeps its names), ``replica2-``, ``replica3-``, … for the others."""
    return "" if group == 0 else f"replica{group + 1}-"


def group_name(cluster: str, group: int) -> str:
    """The name a serving group's resources start with: the cluster's for the first group, then
    ``<cluster>-replica2``, ``<cluster>-replica3``, …"""
    return f"{cluster}-{group_prefix(group)}".rstrip("-")


def node_name(index: int, group: int = 0) -> str:
    """``main`` for a group's first node, ``worker-1``, ``worker-2``, … after it (the ``--rpc``
    order), after the group's prefix."""
    return group_prefix(group) + (MAIN if index == 0 else f"worker-{index}")
