"""Spend guards on every cloud, under mocks: each node's boot gets its guard and how to stop
(a power-off on AWS and GCP, its own deallocation on Azure), the balancer node's too, with the
groups' limits; an EC2 instance that powers itself off stops, and an Azure node's identity may
deallocate that node and nothing else. Without the settings no node has a guard, and no
identity or role is made for one. The balancer node's instance is an output (``lrc start``
starts it with the groups)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from infra.boot import GUARD_UNIT
from infra.boot.balancer import GUARD_STATS_SOCKET
from infra.clouds import FACTS
from infra.core import outputs, sizing
from infra.stack.backends.azure import DEALLOCATE_ACTION, deallocate_role_id
from tests.pulumi_mocks import (
    CLOUD_STACKS,
    GUARDED,
    NO_KEY,
    REPLICAS,
    Deployment,
    cloud_of,
    custom_data_text,
    deployed,
    deployment,
    env_of,
    principal_of,
    user_data_text,
    vm_stack_names,
)

NODE_TYPES = {
    "aws": "aws:ec2/instance:Instance",
    "gcp": "gcp:compute/instance:Instance",
    "azure": "azure-native:compute:VirtualMachine",
}
ROLE_DEFINITION = "azure-native:authorization:RoleDefinition"
ROLE_ASSIGNMENT = "azure-native:authorization:RoleAssignment"


def user_data(cloud: str, node: Any) -> str:
    if cloud == "azure":
        return custom_data_text(node.inputs["osProfile"]["customData"])
    if cloud == "gcp":
        return str(node.inputs["metadata"]["user-data"])
    return user_data_text(node.inputs)


def nodes(d: Deployment, cloud: str) -> list[Any]:
    """The serving groups' nodes."""
    return [r for r in d.of_type(NODE_TYPES[cloud]) if not r.name.endswith("-balancer")]


def instance_id(cloud: str, node: Any) -> str:
    """A node's instance output as the mocks answer: AWS's id, GCP's and Azure's VM name."""
    return f"{node.name}-id" if cloud == "aws" else str(node.name)


def balancer_node(d: Deployment, cloud: str) -> Any:
    [balancer] = [r for r in d.of_type(NODE_TYPES[cloud]) if r.name.endswith("-balancer")]
    return balancer


@pytest.mark.parametrize("stack", CLOUD_STACKS.values())
def test_every_node_gets_the_guard_and_its_clouds_way_to_stop(stack: str) -> None:
    cloud = cloud_of(stack)
    guarded = deployment(stack, **GUARDED)
    assert len(nodes(guarded, cloud)) == 6  # two groups of three
    for node in nodes(guarded, cloud):
        text = user_data(cloud, node)
        env = env_of(text)
        assert (env["STOP_AFTER_IDLE_SECONDS"], env["STOP_AFTER_SECONDS"]) == ("1800", "43200")
        # A boot that has not served within the build, the download, the wait and the load.
        assert int(env["SERVE_DEADLINE_SECONDS"]) > sizing.SERVE_BUILD_SECONDS + 900 + 3600
        assert env["STOP_BY"] == FACTS[cloud].stop_by
        assert f"/etc/systemd/system/{GUARD_UNIT}" in text and GUARD_UNIT in text.split("runcmd")[1]
    plain = deployed(stack)
    for node in nodes(plain, cloud):
        text = user_data(cloud, node)
        assert "STOP_AFTER" not in text and GUARD_UNIT not in text


@pytest.mark.parametrize("stack", CLOUD_STACKS.values())
def test_the_balancer_node_has_its_groups_guard_and_its_instance_is_an_output(stack: str) -> None:
    """The balancer node stops with its groups: the same limits and serve deadline as their
    nodes, the same way to stop, HAProxy's stats read by the guard; without a guard, none."""
    cloud = cloud_of(stack)
    guarded = deployment(stack, **GUARDED)
    balancer = balancer_node(guarded, cloud)
    text = user_data(cloud, balancer)
    env = env_of(text)
    main = env_of(user_data(cloud, nodes(guarded, cloud)[-1]))
    assert env["LLAMA_ROLE"] == "balancer"
    for limit in ("STOP_AFTER_IDLE_SECONDS", "STOP_AFTER_SECONDS", "SERVE_DEADLINE_SECONDS",
                  "GUARD_INTERVAL_SECONDS", "STOP_BY"):  # fmt: skip
        assert env[limit] == main[limit], limit
    assert env["STOP_BY"] == FACTS[cloud].stop_by
    assert GUARD_UNIT in text.split("runcmd")[1]
    assert f"stats socket {GUARD_STATS_SOCKET} mode 600 level user" in text
    paths = {f["path"] for f in yaml.safe_load(text)["write_files"]}
    assert ("/opt/llama-rpc/bin/llama-rpc-deallocate" in paths) == (cloud == "azure")
    out = guarded.outputs
    assert out[outputs.BALANCER_INSTANCE_ID] == instance_id(cloud, balancer)
    assert outputs.node_ids(out)[-1] == out[outputs.BALANCER_INSTANCE_ID]
    assert len(outputs.node_ids(out)) == 7  # two groups of three, and the balancer node
    plain = deployment(stack, **REPLICAS)
    assert GUARD_UNIT not in user_data(cloud, balancer_node(plain, cloud))
    assert "stats socket" not in user_data(cloud, balancer_node(plain, cloud))
    assert plain.outputs[outputs.BALANCER_INSTANCE_ID] == instance_id(
        cloud, balancer_node(plain, cloud)
    )
    assert deployed(stack).outputs[outputs.BALANCER_INSTANCE_ID] is None  # one group, none


def test_an_azure_node_stops_by_deallocating_itself() -> None:
    assert FACTS["azure"].stop_by == "azure-deallocate"
    assert FACTS["aws"].stop_by == FACTS["gcp"].stop_by == "poweroff"


@pytest.mark.parametrize("stack", [s for s in vm_stack_names() if cloud_of(s) == "aws"])
def test_an_ec2_node_that_powers_itself_off_stops(stack: str) -> None:
    for node in nodes(deployed(stack), "aws"):
        assert node.inputs["instanceInitiatedShutdownBehavior"] == "stop"
    balancer = balancer_node(deployment(stack, **GUARDED), "aws")
    assert balancer.inputs["instanceInitiatedShutdownBehavior"] == "stop"
    assert "iamInstanceProfile" not in balancer.inputs  # a power-off needs no right


def test_a_gcp_balancer_node_stops_by_powering_off_with_no_service_account() -> None:
    """Compute Engine stops a VM its guest powers off (TERMINATED, its disk kept): no API right,
    so the balancer node stays without a service account."""
    balancer = balancer_node(deployment(CLOUD_STACKS["gcp"], **GUARDED), "gcp")
    assert not balancer.inputs.get("serviceAccount")


AZURE = CLOUD_STACKS["azure"]


def test_each_azure_node_may_deallocate_itself_and_nothing_else() -> None:
    d = deployment(AZURE, **GUARDED)
    [group] = d.of_type("azure-native:resources:ResourceGroup")
    group_id = d.states[group.typ, group.name][0]
    [role] = d.of_type(ROLE_DEFINITION)
    assert role.inputs["permissions"] == [{"actions": [DEALLOCATE_ACTION]}]
    assert role.inputs["assignableScopes"] == [group_id] and role.inputs["scope"] == group_id
    assert role.inputs["roleDefinitionId"] == deallocate_role_id(group_id)
    assert role.inputs["roleType"] == "CustomRole"
    role_id = d.states[role.typ, role.name][0]
    vms = [*nodes(d, "azure"), balancer_node(d, "azure")]
    assert all(vm.inputs["identity"] == {"type": "SystemAssigned"} for vm in vms)
    assignments = {
        a.inputs["scope"]: a.inputs
        for a in d.of_type(ROLE_ASSIGNMENT)
        if a.inputs["roleDefinitionId"] == role_id
    }
    assert len(assignments) == len(vms)
    for vm in vms:
        granted = assignments[d.states[vm.typ, vm.name][0]]  # scope: this VM's id alone
        assert granted["principalId"] == principal_of(vm.name)  # its own identity
        assert granted["roleDefinitionId"] == role_id
        assert granted["principalType"] == "ServicePrincipal"


def test_an_unguarded_azure_stack_without_a_key_makes_no_identity_and_no_role() -> None:
    d = deployment(AZURE, **NO_KEY)
    assert not d.of_type(ROLE_DEFINITION) and not d.of_type(ROLE_ASSIGNMENT)
    assert all("identity" not in vm.inputs for vm in nodes(d, "azure"))
    replicas = deployment(AZURE, **REPLICAS, **NO_KEY)
    assert not replicas.of_type(ROLE_DEFINITION) and not replicas.of_type(ROLE_ASSIGNMENT)
    assert not balancer_node(replicas, "azure").inputs.get("identity")


def test_the_deallocate_roles_id_is_a_guid_fixed_by_the_resource_group() -> None:
    first = deallocate_role_id("/subscriptions/s/resourceGroups/a")
    assert first == deallocate_role_id("/subscriptions/s/resourceGroups/a")
    assert first != deallocate_role_id("/subscriptions/s/resourceGroups/b")
    assert len(first) == 36 and first.count("-") == 4


def test_the_serve_deadline_grows_with_the_download() -> None:
    small = sizing.serve_deadline_seconds(1_000_000_000, 900, 3600)
    large = sizing.serve_deadline_seconds(400_000_000_000, 900, 3600)
    assert small == 3600 + 50 + 900 + 3600
    assert large - small == (400_000_000_000 - 1_000_000_000) // 20_000_000
