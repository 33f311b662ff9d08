"""The Azure (Cobalt 100) program under Pulumi mocks: NSG rules, NICs, image, disks, outputs."""

from __future__ import annotations

import base64
import re
import shlex

import pytest

from infra import outputs
from infra.clouds import FACTS
from infra.stack.providers.azure import DENY_PRIORITY, LOCKED_SSH_KEY
from tests.conftest import assert_valid_cloud_config
from tests.pulumi_mocks import (
    DISKS,
    deploy,
    deployed,
    env_of,
    refused,
    stack_config,
    stack_names,
)

AZURE_STACKS = [s for s in stack_names() if stack_config(s)["llama-rpc-cluster:cloud"] == "azure"]
VM = "azure-native:compute:VirtualMachine"
NIC = "azure-native:network:NetworkInterface"
RULE = "azure-native:network:SecurityRule"
UNTAGGABLE = {RULE, "azure-native:network:Subnet", "azure-native:resources:TagAtScope"}


def test_there_is_an_azure_preset() -> None:
    assert "azure-cobalt" in AZURE_STACKS


@pytest.mark.parametrize("stack", AZURE_STACKS)
def test_nsg_admits_rpc_from_main_asg_only_and_denies_the_rest(stack: str) -> None:
    d = deployed(stack)
    rules = {r.inputs["securityRuleName"]: r.inputs for r in d.of_type(RULE)}
    assert set(rules) == {"allow-rpc-from-main", "deny-all-other-inbound"}
    rpc = rules["allow-rpc-from-main"]
    assert (rpc["direction"], rpc["access"], rpc["protocol"]) == ("Inbound", "Allow", "Tcp")
    assert rpc["destinationPortRange"] == "50052"
    assert rpc["sourceApplicationSecurityGroups"] == [{"id": "llama-rpc-cluster-main-asg-id"}]
    assert rpc["destinationApplicationSecurityGroups"] == [
        {"id": "llama-rpc-cluster-worker-asg-id"}
    ]
    assert "sourceAddressPrefix" not in rpc
    deny = rules["deny-all-other-inbound"]
    assert (deny["direction"], deny["access"], deny["sourceAddressPrefix"]) == (
        "Inbound",
        "Deny",
        "*",
    )
    assert rpc["priority"] < deny["priority"] == DENY_PRIORITY < 65000  # above AllowVnetInBound
    for rule in rules.values():
        assert rule["networkSecurityGroupName"] == "llama-rpc-cluster-nsg"
    [subnet] = d.of_type("azure-native:network:Subnet")
    assert subnet.inputs["networkSecurityGroup"] == {"id": "llama-rpc-cluster-nsg-id"}
    assert subnet.inputs["natGateway"] == {"id": "llama-rpc-cluster-nat-id"}
    assert subnet.inputs["defaultOutboundAccess"] is False


@pytest.mark.parametrize("stack", AZURE_STACKS)
def test_nics_are_accelerated_private_and_in_their_role_group(stack: str) -> None:
    d = deployed(stack)
    nics = d.of_type(NIC)
    assert len(nics) == stack_config(stack)["llama-rpc-cluster:workerCount"] + 1
    for nic in nics:
        assert nic.inputs["enableAcceleratedNetworking"] is True
        [ip] = nic.inputs["ipConfigurations"]
        assert "publicIPAddress" not in ip
        assert ip["privateIPAllocationMethod"] == "Static"
        assert ip["privateIPAddress"].startswith("10.42.0.")
        role = "main" if nic.name.endswith("-main-nic") else "worker"
        assert ip["applicationSecurityGroups"] == [{"id": f"llama-rpc-cluster-{role}-asg-id"}]
    assert not [r for r in d.of_type("azure-native:network:PublicIPAddress") if "nat" not in r.name]


@pytest.mark.parametrize("stack", AZURE_STACKS)
def test_vms_cobalt_gen2_image_placement_identity_no_password(stack: str, tmp_path) -> None:
    d = deployed(stack)
    vms = d.of_type(VM)
    for vm in vms:
        inputs = vm.inputs
        image = inputs["storageProfile"]["imageReference"]
        assert (image["publisher"], image["offer"]) == ("Canonical", "ubuntu-24_04-lts")
        assert (image["sku"], image["version"]) == ("server-arm64", "latest")
        assert inputs["hardwareProfile"]["vmSize"].endswith("ps_v6")
        assert inputs["proximityPlacementGroup"] == {"id": "llama-rpc-cluster-ppg-id"}
        assert "identity" not in inputs, "no managed identity: nothing on a node calls Azure"
        security = inputs["securityProfile"]
        assert security["securityType"] == "TrustedLaunch"
        assert security["uefiSettings"] == {"secureBootEnabled": True, "vTpmEnabled": True}
        assert security["encryptionAtHost"] is False
        profile = inputs["osProfile"]
        assert "adminPassword" not in profile
        linux = profile["linuxConfiguration"]
        assert linux["disablePasswordAuthentication"] is True
        assert linux["ssh"]["publicKeys"][0]["keyData"] == LOCKED_SSH_KEY
        custom = profile["customData"]
        assert len(custom) <= FACTS["azure"].user_data.limit_bytes
    main = d.named("llama-rpc-cluster-main").inputs["osProfile"]["customData"]
    text = base64.b64decode(main).decode()  # fits uncompressed: about 30 KB of 65,535
    env = env_of(text)
    assert env["LLAMA_NODE_IP"] == "10.42.0.10"
    assert env["RPC_WORKERS"] == "10.42.0.11:50052,10.42.0.12:50052"
    assert_valid_cloud_config(text, tmp_path)
    worker = d.named("llama-rpc-cluster-worker-1").inputs["osProfile"]["customData"]
    # A serving worker still reaches Azure's DNS and agent endpoint, outside the VNet.
    assert env_of(base64.b64decode(worker).decode())["PLATFORM_ADDRESSES"] == "168.63.129.16"


@pytest.mark.parametrize("stack", AZURE_STACKS)
def test_tags_and_outputs(stack: str) -> None:
    d = deployed(stack)
    for r in d.resources:
        if r.typ in UNTAGGABLE or r.typ.startswith("llama-rpc-cluster:"):
            continue
        assert r.inputs["tags"]["stack"] == stack, r.name
        assert r.inputs["tags"]["project"] == "llama-rpc-cluster"
    out = d.outputs
    assert set(outputs.ALL_KEYS) <= set(out)
    assert out[outputs.CLOUD] == "azure" and out[outputs.REGION] == "eastus"
    assert out[outputs.RPC_SERVERS] == ",".join(
        f"{ip}:50052" for ip in out[outputs.WORKER_PRIVATE_IPS]
    )
    # The catalog has no Cobalt 100 price: null, not a guess.
    assert out[outputs.HOURLY_COST_USD] is None
    assert out["hourlyCostBasis"].startswith("unknown")
    assert "az vm run-command invoke" in out[outputs.CONNECT_COMMAND]


def test_a_user_ssh_key_replaces_the_locked_one() -> None:
    key = (
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBzVqzN8t0cJ9ZfQ6m5n3o1rNQ2x2Y5q4u7w8e9r0t1y me@laptop"
    )
    d = deploy("azure-cobalt", {"llama-rpc-cluster:sshPublicKey": key})
    for vm in d.of_type(VM):
        assert (
            vm.inputs["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"][0]["keyData"] == key
        )


@pytest.mark.parametrize(
    ("key", "overrides", "says"),
    [
        (
            "instanceType",
            {"llama-rpc-cluster:instanceType": "Standard_D64s_v6"},
            "Standard_D64s_v6 is not an Arm instance type",
        ),
        (
            "instanceType",
            {"llama-rpc-cluster:instanceType": "Standard_D2ps_v6"},
            "not in the instance catalog for azure eastus",
        ),
        (
            "azure-native:location",
            {"azure-native:location": "westeurope"},
            "the instance catalog has no azure types in westeurope",
        ),
        (
            "sshPublicKey",
            {"llama-rpc-cluster:sshPublicKey": "hunter2"},
            "not an OpenSSH public key",
        ),
        (
            "tags",
            {"llama-rpc-cluster:tags": {"cost/center": "42"}},
            "tag 'cost/center': Azure tag names",
        ),
    ],
)
def test_bad_input_is_refused_naming_the_setting(key: str, overrides: dict, says: str) -> None:
    assert says in refused("azure-cobalt", overrides, key)


def test_a_model_that_fits_one_node_runs_without_workers() -> None:
    big = "Standard_E96ps_v6"  # 672 GiB holds the 405B preset alone
    d = deploy("azure-cobalt", {"llama-rpc-cluster:workerCount": 0,
                                "llama-rpc-cluster:instanceType": big,
                                "llama-rpc-cluster:mainInstanceType": big})  # fmt: skip
    assert [v.name for v in d.of_type(VM)] == ["llama-rpc-cluster-main"]
    assert d.outputs[outputs.WORKER_PRIVATE_IPS] == [] and d.outputs[outputs.RPC_SERVERS] == ""


@pytest.mark.parametrize("stack", AZURE_STACKS)
def test_new_custom_data_replaces_the_vm_delete_first(stack: str) -> None:
    """Azure refuses a customData change on a VM: the change must plan a replacement, and the
    old VM (and NIC, which hold the fixed address) must go first."""
    d = deployed(stack)
    for vm in d.of_type(VM):
        options = d.options[vm.name]
        assert options.replace_on_changes == ["osProfile.customData"]
        assert options.delete_before_replace is True
    for nic in d.of_type(NIC):
        assert d.options[nic.name].delete_before_replace is True


@pytest.mark.parametrize("stack", AZURE_STACKS)
def test_os_disks_are_tagged_and_flow_logs_kept(stack: str) -> None:
    d = deployed(stack)
    tagged = {r.inputs["scope"]: r.inputs["properties"]["tags"] for r in d.of_type(
        "azure-native:resources:TagAtScope")}  # fmt: skip
    vms = d.of_type(VM)
    assert len(tagged) == len(vms)
    for vm in vms:
        tags = tagged[f"{DISKS}/{vm.name}-os"]
        assert tags["stack"] == stack and tags["project"] == "llama-rpc-cluster"
        assert tags["vm"] == f"{vm.name}-vm-id"  # a replaced VM's new disk is tagged again
    [flow] = d.of_type("azure-native:network:FlowLog")
    [account] = d.of_type("azure-native:storage:StorageAccount")
    assert flow.inputs["targetResourceId"] == "llama-rpc-cluster-vnet-id"
    assert flow.inputs["storageId"] == "llama-rpc-cluster-flow-logs-id"
    assert re.fullmatch(r"[a-z0-9]{3,24}", account.inputs["accountName"])
    assert account.inputs["allowBlobPublicAccess"] is False
    off = deploy(stack, {"llama-rpc-cluster:flowLogs": False})
    assert not off.of_type("azure-native:network:FlowLog")


def test_a_bastion_gives_a_real_forward_to_the_api() -> None:
    d = deploy("azure-cobalt", {"llama-rpc-cluster:bastion": True})
    [bastion] = d.of_type("azure-native:network:BastionHost")
    assert bastion.inputs["enableTunneling"] is True
    assert bastion.inputs["sku"] == {"name": "Standard"}
    [subnet] = [s for s in d.of_type("azure-native:network:Subnet") if "bastion" in s.name]
    assert subnet.inputs["subnetName"] == "AzureBastionSubnet"
    rules = {r.inputs["securityRuleName"]: r.inputs for r in d.of_type(RULE)}
    api = rules["allow-api-from-bastion"]
    assert api["sourceAddressPrefix"] == subnet.inputs["addressPrefix"]
    assert api["destinationPortRange"] == "8080"
    assert api["destinationApplicationSecurityGroups"] == [{"id": "llama-rpc-cluster-main-asg-id"}]
    assert shlex.split(d.outputs[outputs.CONNECT_COMMAND]) == [
        "az", "network", "bastion", "tunnel",
        "--name", "llama-rpc-cluster-bastion",
        "--resource-group", "llama-rpc-cluster-rg",
        "--target-resource-id", "llama-rpc-cluster-main-id",
        "--resource-port", "8080", "--port", "8080",
    ]  # fmt: skip
    assert not any(line.startswith("tunnel:") for line in d.outputs["limitations"])
    assert any(
        line.startswith("tunnel:") for line in deployed("azure-cobalt").outputs["limitations"]
    )


def test_encryption_at_host_and_a_pinned_image_are_settings() -> None:
    d = deploy(
        "azure-cobalt",
        {"llama-rpc-cluster:encryptionAtHost": True, "llama-rpc-cluster:image": "24.04.202510010"},
    )
    for vm in d.of_type(VM):
        assert vm.inputs["securityProfile"]["encryptionAtHost"] is True
        assert vm.inputs["storageProfile"]["imageReference"]["version"] == "24.04.202510010"
