"""Where each node sits in the cluster's network, in the cloud and on this machine alike.

The private subnet is the network's first /24 (or the whole network when it is smaller) and the
public one its second /24 (NAT, Bastion). In the private subnet the main node is .10 and the
workers .11, .12, …: fixed addresses let the main node's boot data list the workers before they
exist, and keep the ``--rpc`` list stable when a node is replaced.
"""

from __future__ import annotations

import ipaddress

MAIN_HOST = 10  # the main node's host number; the workers follow it
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


def node_ips(subnet: ipaddress.IPv4Network, workers: int) -> list[str]:
    """The main node's address, then each worker's."""
    base = subnet.network_address + MAIN_HOST
    return [str(base + i) for i in range(workers + 1)]


def node_name(index: int) -> str:
    """``main`` for the first node, ``worker-1``, ``worker-2``, … after it (the ``--rpc`` order)."""
    return MAIN if index == 0 else f"worker-{index}"
