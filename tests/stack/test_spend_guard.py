"""Spend guards on every cloud, under mocks: each node's boot gets its guard and how to stop
(a power-off on AWS and GCP, its own deallocation on Azure), an EC2 instance that powers itself
off stops, and an Azure node's identity may deallocate that node and nothing else. Without the
settings no node has a guard, and no identity or role is made for one."""

from __future__ import annotations

from typing import Any

import pytest

from infra.boot import GUARD_UNIT
from infra.clouds import FACTS
from infra.core import sizing
from infra.stack.backends.azure import DEALLOCATE_ACTION, deallocate_role_id
from tests.pulumi_mocks import (
    CLOUD_STACKS,
    GUARDED,
    NO_KEY,
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
    """The serving groups' nodes. A balancer node has no guard: like the NAT gateway and the
    disks, it goes on while the groups are stopped (``HourlyCost.stopped``)."""
    return [r for r in d.of_type(NODE_TYPES[cloud]) if not r.name.endswith("-balancer")]


@pytest.mark.parametrize("stack", CLOUD_STACKS.values())
def test_every_node_gets_the_guard_and_its_clouds_way_to_stop(stack: str) -> None:
    cloud = cloud_of(stack)
    guarded = deployment(stack, **GUARDED)
    assert len(nodes(guarded, cloud)) == 6  # two groups of three
    [balancer] = [r for r in guarded.of_type(NODE_TYPES[cloud]) if r.name.endswith("-balancer")]
    assert GUARD_UNIT not in user_data(cloud, balancer)
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


def test_an_azure_node_stops_by_deallocating_itself() -> None:
    assert FACTS["azure"].stop_by == "azure-deallocate"
    assert FACTS["aws"].stop_by == FACTS["gcp"].stop_by == "poweroff"


@pytest.mark.parametrize("stack", [s for s in vm_stack_names() if cloud_of(s) == "aws"])
def test_an_ec2_node_that_powers_itself_off_stops(stack: str) -> None:
    for node in nodes(deployed(stack), "aws"):
        assert node.inputs["instanceInitiatedShutdownBehavior"] == "stop"


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
    vms = nodes(d, "azure")
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
