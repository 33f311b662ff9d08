"""The local cluster's network on this machine: while it is up, nothing the host addresses to the
cluster's range leaves the machine, and a range the host already routes is refused.

Every address is first asked of the kernel's routing (``ip route get``, which sends nothing);
the one connection attempted goes to an address the kernel has just said it will not send to.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.core import layout
from infra.local.netns import NetnsError, VpcNetwork, run
from tests.conftest import require_netns

pytestmark = pytest.mark.netns

CIDR = ipaddress.IPv4Network("10.217.0.0/16")


def two_groups(cluster_id: str, cidr: ipaddress.IPv4Network) -> VpcNetwork:
    """Two serving groups of a main node and a worker, and the balancer, as `up` lays them out."""
    subnet = layout.private_subnet(cidr)
    first, second = layout.node_ips(subnet, 1, group=0), layout.node_ips(subnet, 1, group=1)
    return VpcNetwork(
        cluster_id,
        cidr,
        ("main", "w1", "g2main", "g2w1", "balancer"),
        (*first, *second, layout.balancer_ip(subnet)),
    )


def route(address: str) -> subprocess.CompletedProcess[str]:
    return run("ip", "-o", "route", "get", address, check=False)


@pytest.fixture
def network() -> Iterator[VpcNetwork]:
    require_netns()
    made = two_groups("rt", CIDR)
    made.create()
    yield made
    made.destroy()


def test_nothing_addressed_to_the_range_leaves_the_machine(network: VpcNetwork) -> None:
    subnet = layout.private_subnet(CIDR)
    main, others = network.node_ips[0], network.node_ips[1:]
    assert network.main_is_routed_here()
    assert f" dev {network.host_interface} " in route(main).stdout
    # Every other node (workers, the second group's main node, the balancer), the range's
    # edges and addresses no node has: the kernel refuses them instead of using the default.
    unused = [str(subnet.network_address + 200), str(CIDR.network_address + 7 * 256 + 9)]
    edges = [str(CIDR.network_address), str(CIDR.broadcast_address)]
    for address in [*others, *unused, *edges]:
        answer = route(address)
        assert answer.returncode != 0, (address, answer.stdout)
        assert "unreachable" in answer.stderr or "No route to host" in answer.stderr, answer
    # And a connection to the balancer fails at once, in this machine.
    balancer = network.node_ips[-1]
    with socket.socket() as probe, pytest.raises(OSError) as refused:
        probe.settimeout(5)
        probe.connect((balancer, 8080))
    assert refused.value.errno == errno.EHOSTUNREACH


def test_the_range_is_released_when_the_cluster_goes(network: VpcNetwork) -> None:
    network.destroy()
    assert str(CIDR) not in run("ip", "-o", "route", "show").stdout
    assert not any(Path(f"/run/netns/{ns}").exists() for ns in network.namespaces())


def test_a_range_the_machine_already_routes_is_refused_before_anything_is_made() -> None:
    require_netns()
    taken = "10.217.64.0/24"  # inside the cluster's range: a LAN or VPN of this machine's
    run("ip", "link", "add", "lrc-taken", "type", "veth", "peer", "name", "lrc-taken-peer")
    try:
        run("ip", "link", "set", "lrc-taken", "up")
        run("ip", "route", "add", taken, "dev", "lrc-taken")
        network = two_groups("rf", CIDR)
        with pytest.raises(NetnsError, match=r"--cidr 10\.217\.0\.0/16 overlaps .*10\.217\.64"):
            network.create()
        assert not any(Path(f"/run/netns/{ns}").exists() for ns in network.namespaces())
        assert f"{taken} dev lrc-taken" in run("ip", "-o", "route", "show").stdout
    finally:
        run("ip", "link", "del", "lrc-taken", check=False)
