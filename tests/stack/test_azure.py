"""The Azure (Cobalt 100) program under Pulumi mocks: NSG rules, NICs, image, disks, outputs,
and replicas behind the balancer node (``tests/stack/test_balancer_node.py`` for what every
cloud's has in common)."""

from __future__ import annotations

import ipaddress
import re
import shlex
from typing import Any

import pytest

from infra.clouds import FACTS
from infra.core import outputs
from infra.core.limits import METRICS_PORT
from infra.stack.backends.azure import DENY_PRIORITY, LOCKED_SSH_KEY
from tests.conftest import assert_valid_cloud_config
from tests.pulumi_mocks import (
    API_CIDRS,
    BASTION,
    DISKS,
    HOST_ENCRYPTION,
    NO_FLOW_LOGS,
    ONE_GROUP,
    REPLICAS,
    Deployment,
    azure_asg_id,
    custom_data_text,
    deploy,
    deployed,
    deployment,
    env_of,
    one_node,
    parsed_config,
    stack_config,
    tag_path,
    vm_stack_names,
)

AZURE_STACKS = [
    s for s in vm_stack_names() if stack_config(s)["llama-rpc-cluster:cloud"] == "azure"
]
VM = "azure-native:compute:VirtualMachine"
NIC = "azure-native:network:NetworkInterface"
RULE = "azure-native:network:SecurityRule"
NSG = "azure-native:network:NetworkSecurityGroup"
CLUSTER = "llama-rpc-cluster"
REPLICA2 = f"{CLUSTER}-replica2"
BALANCER = f"{CLUSTER}-balancer"

RESOURCE_GROUP = "llama-rpc-cluster-rg"
AZURE = "azure-cobalt"
# One group behind a Bastion host and API ranges (BASTION without its second group).
BASTION_ALONE = {**API_CIDRS, "bastion": True}


def rules_of(d: Deployment) -> dict[str, dict[str, Any]]:
    """The stack's NSG rules by name: all of them declared by the NSG itself."""
    [nsg] = d.of_type(NSG)
    return {rule["name"]: rule for rule in nsg.inputs["securityRules"]}


def test_there_is_an_azure_preset() -> None:
    assert "azure-cobalt" in AZURE_STACKS


@pytest.mark.parametrize("stack", AZURE_STACKS)
def test_nsg_admits_rpc_from_main_asg_only_and_denies_the_rest(stack: str) -> None:
    d = deployed(stack)
    rules = rules_of(d)
    assert set(rules) == {
        "g1-allow-rpc-from-main",
        "g1-allow-metrics-from-main",
        "deny-other-inbound",
    }
    # Declared by the NSG in one write: Azure refuses parallel writes to one NSG (429/409).
    assert not d.of_type(RULE)
    rpc = rules["g1-allow-rpc-from-main"]
    assert (rpc["direction"], rpc["access"], rpc["protocol"]) == ("Inbound", "Allow", "Tcp")
    assert rpc["destinationPortRange"] == "50052"
    assert rpc["sourceApplicationSecurityGroups"] == [asg("llama-rpc-cluster", "main")]
    assert rpc["destinationApplicationSecurityGroups"] == [asg("llama-rpc-cluster", "worker")]
    assert "sourceAddressPrefix" not in rpc
    deny = rules["deny-other-inbound"]
    assert (deny["direction"], deny["access"], deny["sourceAddressPrefix"]) == (
        "Inbound",
        "Deny",
        "*",
    )
    assert rpc["priority"] < deny["priority"] == DENY_PRIORITY < 65000  # above AllowVnetInBound
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
        assert ip["applicationSecurityGroups"] == [asg("llama-rpc-cluster", role)]
        assert "loadBalancerBackendAddressPools" not in ip  # no balancer with one group
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
        if vm.name == "llama-rpc-cluster-main":  # the API key's reader, as shipped
            assert inputs["identity"] == {"type": "SystemAssigned"}
        else:
            assert "identity" not in inputs, "no managed identity on a worker"
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
    # Six long model URLs put this stack's main node just over 49,151 plain bytes (65,535 in
    # base64), so its customData is gzipped, which cloud-init unpacks on every datasource.
    text = custom_data_text(main)
    env = env_of(text)
    assert env["LLAMA_NODE_IP"] == "10.42.0.10"
    assert env["RPC_WORKERS"] == "10.42.0.11:50052,10.42.0.12:50052"
    assert_valid_cloud_config(text, tmp_path)
    worker = d.named("llama-rpc-cluster-worker-1").inputs["osProfile"]["customData"]
    # A serving worker still reaches Azure's DNS and agent endpoint, outside the VNet.
    assert env_of(custom_data_text(worker))["PLATFORM_ADDRESSES"] == "168.63.129.16"


@pytest.mark.parametrize("stack", AZURE_STACKS)
def test_tags_and_outputs(stack: str) -> None:
    d = deployed(stack)
    for r in d.resources:
        if tag_path(r.typ) != "tags":  # the types Azure tags (its rules say which)
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
    assert out[outputs.HOURLY_COST_BASIS].startswith("unknown")
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


def test_a_model_that_fits_one_node_runs_without_workers() -> None:
    d = deployment(AZURE, **one_node())
    assert [v.name for v in d.of_type(VM)] == ["llama-rpc-cluster-main"]
    assert d.outputs[outputs.WORKER_PRIVATE_IPS] == [] and d.outputs[outputs.RPC_SERVERS] == ""


@pytest.mark.parametrize("stack", AZURE_STACKS)
def test_new_custom_data_replaces_the_vm_delete_first(stack: str) -> None:
    """Azure refuses a customData change on a VM: the change must plan a replacement, and the
    old VM (and NIC, which hold the fixed address) must go first."""
    d = deployed(stack)
    for vm in d.of_type(VM):
        options = d.options_of(vm)
        assert options.replace_on_changes == ["osProfile.customData"]
        assert options.delete_before_replace is True
    for nic in d.of_type(NIC):
        assert d.options_of(nic).delete_before_replace is True


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
    off = deployment(stack, **NO_FLOW_LOGS)
    assert not off.of_type("azure-native:network:FlowLog")


def test_a_bastion_gives_a_real_forward_to_the_api() -> None:
    d = deployment(AZURE, **BASTION_ALONE)
    [bastion] = d.of_type("azure-native:network:BastionHost")
    assert bastion.inputs["enableTunneling"] is True
    assert bastion.inputs["sku"] == {"name": "Standard"}
    [subnet] = [s for s in d.of_type("azure-native:network:Subnet") if "bastion" in s.name]
    assert subnet.inputs["subnetName"] == "AzureBastionSubnet"
    api = rules_of(d)["g1-allow-api-from-bastion"]
    assert api["sourceAddressPrefix"] == subnet.inputs["addressPrefix"]
    assert api["destinationPortRange"] == "8080"
    assert api["destinationApplicationSecurityGroups"] == [asg("llama-rpc-cluster", "main")]
    assert shlex.split(d.outputs[outputs.CONNECT_COMMAND]) == [
        "az", "network", "bastion", "tunnel",
        "--name", "llama-rpc-cluster-bastion",
        "--resource-group", "llama-rpc-cluster-rg",
        "--target-resource-id", "llama-rpc-cluster-main-id",
        "--resource-port", "8080", "--port", "8080",
    ]  # fmt: skip
    assert not any(line.startswith("tunnel:") for line in d.outputs[outputs.LIMITATIONS])
    assert any(
        line.startswith("tunnel:") for line in deployed("azure-cobalt").outputs[outputs.LIMITATIONS]
    )


def test_encryption_at_host_and_a_pinned_image_are_settings() -> None:
    d = deployment(AZURE, **HOST_ENCRYPTION)
    for vm in d.of_type(VM):
        assert vm.inputs["securityProfile"]["encryptionAtHost"] is True
        assert vm.inputs["storageProfile"]["imageReference"]["version"] == "24.04.202510010"


# --- replicas ------------------------------------------------------------------------------


def replicated(behind_bastion: bool = False) -> Deployment:
    """The preset with two serving groups behind the balancer node (and with a Bastion host
    and API ranges)."""
    return deployment(AZURE, **(BASTION if behind_bastion else REPLICAS))


def network(prefix: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """An address range, or None for a service tag or "*"."""
    try:
        return ipaddress.ip_network(prefix)
    except ValueError:
        return None


def asg(group: str, role: str) -> dict[str, str]:
    """A reference to a serving group's application security group, by its id."""
    return {"id": azure_asg_id(RESOURCE_GROUP, f"{group}-{role}-asg")}


@pytest.mark.parametrize("replicas", [1, 2])
def test_node_metrics_are_open_from_the_groups_main_node_only(replicas: int) -> None:
    d = replicated() if replicas == 2 else deployed("azure-cobalt")
    rules = rules_of(d)
    for prefix, group, priority in (("g1-", CLUSTER, 130), ("g2-", REPLICA2, 330))[:replicas]:
        metrics = rules[f"{prefix}allow-metrics-from-main"]
        assert (metrics["access"], metrics["protocol"]) == ("Allow", "Tcp")
        assert metrics["destinationPortRange"] == str(METRICS_PORT)
        assert metrics["sourceApplicationSecurityGroups"] == [asg(group, "main")]
        assert metrics["destinationApplicationSecurityGroups"] == [asg(group, "worker")]
        assert "sourceAddressPrefix" not in metrics
        assert metrics["priority"] == priority


@pytest.mark.parametrize("behind_bastion", [False, True])
def test_no_rule_opens_metrics_or_rpc_wider_than_the_cluster(behind_bastion: bool) -> None:
    vpc = parsed_config("azure-cobalt").vpc_cidr
    checked = 0
    for rule in rules_of(replicated(behind_bastion)).values():
        if rule["access"] != "Allow" or rule["destinationPortRange"] not in {"9100", "50052"}:
            continue
        checked += 1
        prefixes = [rule.get("sourceAddressPrefix"), *rule.get("sourceAddressPrefixes", [])]
        sources = [network(prefix) for prefix in prefixes if prefix]
        assert all(source and source.subnet_of(vpc) for source in sources), rule
        assert sources or rule["sourceApplicationSecurityGroups"], rule
    assert checked == 4  # RPC and metrics, per group


def test_replicas_are_groups_of_nodes_with_their_own_groups_and_placement() -> None:
    d = replicated()
    nics = {n.name: n.inputs["ipConfigurations"] for n in d.of_type(NIC) if BALANCER not in n.name}
    addresses = {name: ip["privateIPAddress"] for name, [ip] in nics.items()}
    assert addresses == {
        f"{CLUSTER}-main-nic": "10.42.0.10",
        f"{CLUSTER}-worker-1-nic": "10.42.0.11",
        f"{CLUSTER}-worker-2-nic": "10.42.0.12",
        f"{REPLICA2}-main-nic": "10.42.0.30",
        f"{REPLICA2}-worker-1-nic": "10.42.0.31",
        f"{REPLICA2}-worker-2-nic": "10.42.0.32",
    }
    for name, [ip] in nics.items():
        group = REPLICA2 if name.startswith(REPLICA2) else CLUSTER
        role = "main" if name.endswith("-main-nic") else "worker"
        assert ip["applicationSecurityGroups"] == [asg(group, role)]
    placements = {
        vm.name: vm.inputs["proximityPlacementGroup"]["id"]
        for vm in d.of_type(VM)
        if vm.name != BALANCER
    }
    for name, placement in placements.items():
        group = REPLICA2 if name.startswith(REPLICA2) else CLUSTER
        assert placement == f"{group}-ppg-id"
    ppgs = d.of_type("azure-native:compute:ProximityPlacementGroup")
    assert sorted(p.name for p in ppgs) == [f"{CLUSTER}-ppg", f"{REPLICA2}-ppg"]


def test_each_groups_workers_take_rpc_from_their_own_main_only() -> None:
    rules = rules_of(replicated(behind_bastion=True))
    for prefix, group, priority in (("g1-", CLUSTER, 100), ("g2-", REPLICA2, 300)):
        rpc = rules[f"{prefix}allow-rpc-from-main"]
        assert rpc["destinationPortRange"] == "50052"
        assert rpc["sourceApplicationSecurityGroups"] == [asg(group, "main")]
        assert rpc["destinationApplicationSecurityGroups"] == [asg(group, "worker")]
        assert rpc["priority"] == priority
        assert "sourceAddressPrefix" not in rpc
        for api in ("allow-api-from-allowed-cidrs", "allow-api-from-bastion"):
            assert rules[prefix + api]["destinationApplicationSecurityGroups"] == [
                asg(group, "main")
            ]
    # One NSG for the stack: every rule's priority is its own, and each comes before the deny.
    priorities = [rule["priority"] for rule in rules.values()]
    assert len(set(priorities)) == len(priorities)
    assert max(p for p in priorities if p != DENY_PRIORITY) < DENY_PRIORITY


def test_the_balancer_node_is_in_its_own_security_group_outside_any_placement() -> None:
    d = replicated()
    [ip] = d.named(f"{BALANCER}-nic").inputs["ipConfigurations"]
    assert ip["applicationSecurityGroups"] == [asg(CLUSTER, "balancer")]
    assert ip["privateIPAllocationMethod"] == "Static"
    vm = d.named(BALANCER).inputs
    assert "proximityPlacementGroup" not in vm
    assert vm["securityProfile"]["securityType"] == "TrustedLaunch"
    assert vm["tags"]["role"] == "balancer"
    disk_tags = d.named(f"{BALANCER}-os-disk-tags").inputs["properties"]["tags"]
    assert disk_tags["role"] == "balancer"


@pytest.mark.parametrize("behind_bastion", [False, True])
def test_the_balancer_node_takes_the_api_as_a_main_node_does_and_each_main_admits_it(
    behind_bastion: bool,
) -> None:
    rules = rules_of(replicated(behind_bastion))
    balancer = [asg(CLUSTER, "balancer")]
    into = {
        n: r for n, r in rules.items() if r.get("destinationApplicationSecurityGroups") == balancer
    }
    expected = {
        f"balancer-{rule}" for rule in ("allow-api-from-allowed-cidrs", "allow-api-from-bastion")
    }
    assert set(into) == (expected if behind_bastion else set())
    for name, rule in into.items():
        assert (rule["access"], rule["protocol"], rule["destinationPortRange"]) == (
            "Allow",
            "Tcp",
            "8080",
        )
        # The same sources as the first group's main node.
        assert {k: v for k, v in rule.items() if k.startswith("source")} == {
            k: v
            for k, v in rules[name.replace("balancer-", "g1-")].items()
            if k.startswith("source")
        }
        assert rule["priority"] > 2000 and rule["priority"] < DENY_PRIORITY
    for prefix, group, priority in (("g1-", CLUSTER, 140), ("g2-", REPLICA2, 340)):
        rule = rules[f"{prefix}allow-api-from-balancer"]
        assert rule["sourceApplicationSecurityGroups"] == balancer
        assert rule["destinationApplicationSecurityGroups"] == [asg(group, "main")]
        assert (rule["destinationPortRange"], rule["priority"]) == ("8080", priority)
    # Azure's load-balancer probes are admitted nowhere: no managed balancer probes the groups.
    assert not [r for r in rules.values() if r.get("sourceAddressPrefix") == "AzureLoadBalancer"]
    priorities = [rule["priority"] for rule in rules.values()]
    assert len(set(priorities)) == len(priorities)


def test_connect_command_reaches_the_balancer_node_with_replicas() -> None:
    """Bastion tunnels to the balancer node as to any VM; without Bastion, Run Command on it
    asks the balancer for the models."""
    command = replicated().outputs[outputs.CONNECT_COMMAND]
    assert "az vm run-command invoke" in command
    assert f"--name {BALANCER} " in command
    assert "curl -s http://10.42.0.5:8080/v1/models" in command
    tunnel = shlex.split(replicated(behind_bastion=True).outputs[outputs.CONNECT_COMMAND])
    assert tunnel[tunnel.index("--target-resource-id") + 1] == f"{BALANCER}-id"
    alone = shlex.split(deployment(AZURE, **BASTION_ALONE).outputs[outputs.CONNECT_COMMAND])
    assert alone[alone.index("--target-resource-id") + 1] == f"{CLUSTER}-main-id"
    for d in (replicated(), replicated(behind_bastion=True)):
        assert not any(line.startswith("balancer:") for line in d.outputs[outputs.LIMITATIONS])


def test_one_group_has_no_balancer_and_keeps_its_names_and_priorities() -> None:
    """A stack without replicas sees nothing replaced: the first group's resources keep the
    names (and NSG priorities) they had before there were groups."""
    d = deployment(AZURE, **BASTION_ALONE)
    assert not [r.name for r in d.resources if "balancer" in r.name]
    assert d.outputs[outputs.REPLICAS] == 1
    assert d.outputs[outputs.BALANCER_URL] is None
    assert {name: rule["priority"] for name, rule in rules_of(d).items()} == {
        "g1-allow-rpc-from-main": 100,
        "g1-allow-api-from-allowed-cidrs": 110,
        "g1-allow-api-from-bastion": 120,
        "g1-allow-metrics-from-main": 130,
        "deny-other-inbound": DENY_PRIORITY,
    }
    names = {r.name for r in d.resources}
    assert {
        f"{CLUSTER}-main-asg",
        f"{CLUSTER}-worker-asg",
        f"{CLUSTER}-ppg",
        f"{CLUSTER}-main-nic",
        f"{CLUSTER}-main",
    } <= names
    # ... and the first group of a replicated stack is that same group.
    assert names <= {r.name for r in replicated(behind_bastion=True).resources}


def test_adding_replicas_leaves_the_first_groups_vms_as_they_are() -> None:
    vm = "azure-native:compute:VirtualMachine"
    one = {r.name: r.inputs for r in deployment(AZURE, **ONE_GROUP).of_type(vm)}
    two = {r.name: r.inputs for r in replicated().of_type(vm)}
    assert one and all(two[name] == inputs for name, inputs in one.items())
