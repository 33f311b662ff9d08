"""The balancer node in front of the serving groups (replicas > 1), the same on every cloud under
Pulumi mocks: one VM at the balancer's address, of the cloud's balancer type, with no public
address and no identity, booting the cloud-config ``infra.boot.balancer`` renders for the stack
(HAProxy: least connections, each group's slots as its limit, /health checks, timeouts that
outlast a slot's whole context); no managed balancer; its price in hourlyCostUsd. A stack with
one group has none. Each cloud's firewall for it: the cloud's own test module."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from infra.boot.balancer import HAPROXY_CONFIG_PATH, render, staged_path
from infra.clouds import FACTS
from infra.core import costs
from tests.pulumi_mocks import (
    CLOUD_STACKS,
    REPLICAS,
    Deployment,
    custom_data_text,
    deployed,
    deployment,
    overrides_of,
    parsed_config,
    user_data_text,
)

P = "llama-rpc-cluster:"
NAME = "llama-rpc-cluster-balancer"
STACKS = CLOUD_STACKS
OPTIONS = overrides_of(REPLICAS)
# The balancer node's $/h in the fixture catalog: its instance (c8g.large, c4a-standard-1,
# Standard_D2pls_v6) and, where the catalog prices it, its 30 GB system disk (gp3 at $0.08 a
# GB-month, 730 hours a month).
BALANCER_USD = {"aws": 0.07976 + 30 * 0.08 / 730, "gcp": 0.0449, "azure": 0.05}
VM_TYPE = {
    "aws": "aws:ec2/instance:Instance",
    "gcp": "gcp:compute/instance:Instance",
    "azure": "azure-native:compute:VirtualMachine",
}
# Every managed load balancer type of the three providers' SDKs the program could have used.
MANAGED_BALANCERS = (
    "aws:lb/",
    "aws:alb/",
    "aws:elb/",
    "gcp:compute/forwardingRule:",
    "gcp:compute/globalForwardingRule:",
    "gcp:compute/regionBackendService:",
    "gcp:compute/backendService:",
    "azure-native:network:LoadBalancer",
    "azure-native:network:ApplicationGateway",
)


def replicated(cloud: str) -> Deployment:
    return deployment(STACKS[cloud], **REPLICAS)


def balancer_node(cloud: str, d: Deployment) -> dict[str, Any]:
    [node] = [r for r in d.of_type(VM_TYPE[cloud]) if r.name == NAME]
    return node.inputs


def boot_text(cloud: str, inputs: dict[str, Any]) -> str:
    if cloud == "aws":
        return user_data_text(inputs)
    if cloud == "gcp":
        text: str = inputs["metadata"]["user-data"]
        return text
    return custom_data_text(inputs["osProfile"]["customData"])


def placed(cloud: str, d: Deployment, inputs: dict[str, Any]) -> tuple[str, str, bool, bool]:
    """(size, private address, has a public address, has an identity) of a VM."""
    if cloud == "aws":
        return (
            inputs["instanceType"],
            inputs["privateIp"],
            inputs["associatePublicIpAddress"] is not False,
            "iamInstanceProfile" in inputs,
        )
    if cloud == "gcp":
        [nic] = inputs["networkInterfaces"]
        return (
            inputs["machineType"],
            nic["networkIp"],
            bool(nic.get("accessConfigs")),
            "serviceAccount" in inputs,
        )
    [ip] = d.named(f"{NAME}-nic").inputs["ipConfigurations"]
    return (
        inputs["hardwareProfile"]["vmSize"],
        ip["privateIPAddress"],
        "publicIPAddress" in ip,
        "identity" in inputs,
    )


@pytest.mark.parametrize("cloud", list(STACKS))
def test_the_balancer_node_is_private_and_boots_the_shared_haproxy(cloud: str) -> None:
    d = replicated(cloud)
    config = parsed_config(STACKS[cloud], OPTIONS)
    inputs = balancer_node(cloud, d)
    size, address, public, identity = placed(cloud, d, inputs)
    assert size == FACTS[cloud].balancer_instance_type
    assert address == config.balancer_boot.listen_ip and address.endswith(".5")
    assert not public and not identity
    boot = config.balancer_boot
    assert boot is not None
    text = boot_text(cloud, inputs)
    assert text == render(boot)
    [haproxy] = [
        f
        for f in yaml.safe_load(text)["write_files"]
        if f["path"] == staged_path(HAPROXY_CONFIG_PATH)
    ]
    cfg = haproxy["content"]
    assert config.slots == 2
    for group, ip in enumerate(config.main_ips):
        assert f"server group{group + 1} {ip}:8080 maxconn 2" in cfg
    assert f"bind {config.balancer_boot.listen_ip}:8080" in cfg
    assert "balance leastconn" in cfg and "option httpchk GET /health" in cfg
    timeout = config.generation_timeout_seconds
    for kind in ("server", "queue", "client"):
        assert f"timeout {kind} {timeout}s" in cfg
    # A slot's whole context at the predicted decode speed, two streams at once: far longer
    # than the managed balancers' defaults (60 s to 600 s).
    assert timeout > 600, timeout


@pytest.mark.parametrize("cloud", list(STACKS))
def test_no_managed_balancer_and_none_at_all_without_replicas(cloud: str) -> None:
    two, one = replicated(cloud), deployed(STACKS[cloud])
    for d in (two, one):
        assert not [r.name for r in d.resources if r.typ.startswith(MANAGED_BALANCERS)]
    assert NAME not in {r.name for r in one.of_type(VM_TYPE[cloud])}
    assert not [r.name for r in one.resources if "balancer" in r.name]
    # With replicas, the node and its firewall alone carry its name.
    assert {r.name for r in two.resources if "balancer" in r.name and r.name.startswith(NAME)}


@pytest.mark.parametrize("cloud", list(STACKS))
def test_the_balancer_node_is_priced_in_the_hourly_cost(cloud: str) -> None:
    one = parsed_config(STACKS[cloud]).hourly_cost
    two = parsed_config(STACKS[cloud], {f"{P}replicas": 2}).hourly_cost
    price = BALANCER_USD[cloud]
    assert one.balancer is None
    assert two.balancer == pytest.approx(price, abs=1e-5)
    assert costs.BALANCER_NODE not in two.unpriced
    assert any(source.startswith("balancer node: ") for source in two.sources)
    if one.total is not None:  # the fixture catalog prices the groups' instances
        # Each group as one group costs (its NAT share is the cloud's own rule), and the node.
        groups = 2 * ((one.instances or 0) + (one.disks or 0))
        assert two.total == pytest.approx(groups + (two.nat or 0) + price, abs=1e-4)
    # Stopped, its instance does not go on (its spend guard stops it with the groups), its disk
    # does where the catalog prices it.
    assert two.balancer_disk is None or 0 < two.balancer_disk < price
    kept = [p for p in (two.nat_stopped, two.disks, two.balancer_disk) if p is not None]
    assert two.stopped == (pytest.approx(sum(kept), abs=1e-5) if kept else None)
    # The catalog without the type: named unpriced, never guessed.
    assert costs.balancer_cost(cloud, "nowhere-1").usd is None


# What carries a balancer node's package download out: on Azure, the subnet itself (made with
# its NAT gateway), which every VM's NIC already waits for.
ROUTE_OUT = {
    "aws": "aws:ec2/routeTableAssociation:RouteTableAssociation::llama-rpc-cluster-private-routes",
    "gcp": "gcp:compute/routerNat:RouterNat::llama-rpc-cluster-nat",
    "azure": "azure-native:network:Subnet::llama-rpc-cluster-private",
}


@pytest.mark.parametrize("cloud", list(STACKS))
def test_the_balancer_node_is_made_once_its_route_out_is(cloud: str) -> None:
    """HAProxy comes through the NAT: a node made before its route out carries traffic would
    spend its installer's attempts on a mirror it cannot reach."""
    stack = replicated(cloud).stack()
    [node] = [r for r in stack.resources if r.type == VM_TYPE[cloud] and r.name == NAME]
    route = stack.find(ROUTE_OUT[cloud])
    assert route is not None
    assert stack.waits_for(node, route)
