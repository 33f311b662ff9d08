"""The address plan: serving groups side by side in the private /24, the balancer apart."""

from __future__ import annotations

import ipaddress

from infra.core import layout
from infra.core.limits import MAX_NODES, MAX_REPLICAS

SUBNET = ipaddress.IPv4Network("10.42.0.0/24")


def test_every_group_of_the_largest_size_fits_the_subnet_without_overlap() -> None:
    taken: set[str] = set()
    for group in range(MAX_REPLICAS):
        ips = layout.node_ips(SUBNET, MAX_NODES - 1, group)
        assert len(ips) == MAX_NODES
        assert all(ipaddress.IPv4Address(ip) in SUBNET for ip in ips)
        assert not taken & set(ips), f"group {group} overlaps another"
        taken |= set(ips)
    broadcast = str(SUBNET.broadcast_address)
    assert broadcast not in taken and layout.balancer_ip(SUBNET) not in taken
    # Every cloud reserves at most .0-.3 (and the last addresses) of a subnet.
    assert min(int(ipaddress.IPv4Address(ip)) for ip in taken) - int(SUBNET[0]) > 3
    assert int(ipaddress.IPv4Address(layout.balancer_ip(SUBNET))) - int(SUBNET[0]) > 3


def test_the_first_group_keeps_the_addresses_and_names_of_a_single_cluster() -> None:
    """Adding replicas to a deployed stack must leave its first group's nodes where they are."""
    assert layout.node_ips(SUBNET, 2, 0) == ["10.42.0.10", "10.42.0.11", "10.42.0.12"]
    assert layout.node_ips(SUBNET, 1, 1) == ["10.42.0.30", "10.42.0.31"]
    assert [layout.node_name(i) for i in range(3)] == ["main", "worker-1", "worker-2"]
    assert layout.node_name(1, 2) == "replica3-worker-1"
    assert layout.group_prefix(0) == ""
