"""The GCP (Axion C4A) program under Pulumi mocks: firewall, disks, NICs, image, zone, outputs,
and replicas behind the balancer node (``tests/stack/test_balancer_node.py`` for what every
cloud's has in common)."""

from __future__ import annotations

import ipaddress
import re
import shlex

import pytest

from infra.clouds.gcp import IAP_RANGE, label_problem, service_account_id
from infra.core import outputs
from infra.core.limits import METRICS_PORT
from tests.conftest import assert_valid_cloud_config
from tests.pulumi_mocks import (
    API_CIDRS,
    NO_FLOW_LOGS,
    ONE_GROUP,
    REPLICAS,
    Deployment,
    deploy,
    deployed,
    deployment,
    env_of,
    one_node,
    parsed_config,
    ready_account,
    refused,
    stack_config,
    vm_stack_names,
)

GCP_STACKS = [s for s in vm_stack_names() if stack_config(s)["llama-rpc-cluster:cloud"] == "gcp"]
INSTANCE = "gcp:compute/instance:Instance"
FIREWALL = "gcp:compute/firewall:Firewall"
INSTANCE_GROUP = "gcp:compute/instanceGroup:InstanceGroup"
CLUSTER = "llama-rpc-cluster"
REPLICA2 = f"{CLUSTER}-replica2"
# GCP resources that take labels; the network pieces and firewall rules take none.
LABELLED = {INSTANCE}


def test_there_is_a_gcp_preset() -> None:
    assert "gcp-c4a" in GCP_STACKS


@pytest.mark.parametrize("stack", GCP_STACKS)
def test_firewall_opens_rpc_only_from_the_main_tag(stack: str) -> None:
    d = deployed(stack)
    rules = {r.name: r.inputs for r in d.of_type(FIREWALL)}
    assert set(rules) == {
        "llama-rpc-cluster-worker-rpc-from-main",
        "llama-rpc-cluster-main-api-from-iap",
        "llama-rpc-cluster-worker-metrics-from-main",
    }
    rpc = rules["llama-rpc-cluster-worker-rpc-from-main"]
    assert rpc["direction"] == "INGRESS"
    assert rpc["allows"] == [{"protocol": "tcp", "ports": ["50052"]}]
    assert rpc["sourceTags"] == ["llama-rpc-cluster-main"]
    assert rpc["targetTags"] == ["llama-rpc-cluster-worker"]
    assert "sourceRanges" not in rpc
    api = rules["llama-rpc-cluster-main-api-from-iap"]
    assert api["allows"] == [{"protocol": "tcp", "ports": ["8080"]}]
    assert api["sourceRanges"] == [IAP_RANGE]
    assert api["targetTags"] == ["llama-rpc-cluster-main"]
    for rule in rules.values():
        assert "0.0.0.0/0" not in rule.get("sourceRanges", [])


@pytest.mark.parametrize("stack", GCP_STACKS)
def test_nodes_are_private_c4a_with_hyperdisk_gvnic_and_shielded_boot(stack: str) -> None:
    d = deployed(stack)
    instances = d.of_type(INSTANCE)
    config = stack_config(stack)
    assert len(instances) == config["llama-rpc-cluster:workerCount"] + 1
    zones = {r.inputs["zone"] for r in instances}
    assert zones == {"us-central1-a"}  # one zone, the first by name that offers the types
    for r in instances:
        inputs = r.inputs
        [nic] = inputs["networkInterfaces"]
        assert not nic.get("accessConfigs"), "no external IP"
        assert nic["nicType"] == "GVNIC"
        disk = inputs["bootDisk"]["initializeParams"]
        assert disk["type"] == "hyperdisk-balanced"
        assert disk["image"].endswith("ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-arm64")
        assert inputs["shieldedInstanceConfig"]["enableSecureBoot"] is True
        assert inputs["networkPerformanceConfig"]["totalEgressBandwidthTier"] == "TIER_1"
        assert inputs["machineType"].startswith("c4a-")
        role = "main" if r.name.endswith("-main") else "worker"
        assert inputs["tags"] == [f"llama-rpc-cluster-{role}"]
    [nat] = d.of_type("gcp:compute/routerNat:RouterNat")
    assert nat.inputs["sourceSubnetworkIpRangesToNat"] == "ALL_SUBNETWORKS_ALL_IP_RANGES"


@pytest.mark.parametrize("stack", GCP_STACKS)
def test_user_data_goes_in_metadata_and_wires_the_workers(stack: str, tmp_path) -> None:
    d = deployed(stack)
    main = d.named("llama-rpc-cluster-main").inputs
    text = main["metadata"]["user-data"]
    env = env_of(text)
    assert env["LLAMA_NODE_IP"] == main["networkInterfaces"][0]["networkIp"] == "10.42.0.10"
    assert env["RPC_WORKERS"] == "10.42.0.11:50052,10.42.0.12:50052"
    worker = d.named("llama-rpc-cluster-worker-2").inputs
    worker_env = env_of(worker["metadata"]["user-data"])
    assert worker_env["LLAMA_NODE_IP"] == "10.42.0.12"
    assert worker_env["RPC_ALLOWED_SOURCES"] == "10.42.0.10/32"
    assert worker_env["PLATFORM_ADDRESSES"] == ""  # GCP's are link-local, allowed already
    assert_valid_cloud_config(text, tmp_path)


@pytest.mark.parametrize("stack", GCP_STACKS)
def test_labels_and_outputs(stack: str) -> None:
    d = deployed(stack)
    for r in d.resources:
        if r.typ in LABELLED:
            assert r.inputs["labels"]["stack"] == stack
            assert (
                r.inputs["bootDisk"]["initializeParams"]["labels"]["project"] == "llama-rpc-cluster"
            )
    out = d.outputs
    assert set(outputs.ALL_KEYS) <= set(out)
    assert out[outputs.CLOUD] == "gcp"
    assert out[outputs.RPC_SERVERS] == ",".join(
        f"{ip}:50052" for ip in out[outputs.WORKER_PRIVATE_IPS]
    )
    # The command names the project, so it works whatever gcloud's default project is.
    assert shlex.split(out[outputs.CONNECT_COMMAND]) == [
        "gcloud",
        "compute",
        "start-iap-tunnel",
        "llama-rpc-cluster-main",
        "8080",
        "--local-host-port=localhost:8080",
        "--zone",
        "us-central1-a",
        "--project",
        "my-project",
    ]
    assert any(line.startswith("placement:") for line in out[outputs.LIMITATIONS])
    assert out[outputs.HOURLY_COST_USD] is None or out[outputs.HOURLY_COST_USD] > 0


def test_zone_is_one_that_offers_both_types() -> None:
    unavailable = {"us-central1-a": {"c4a-highcpu-72"}}
    d = deploy("gcp-c4a", account=lambda needs: ready_account(needs, unavailable))
    assert {r.inputs["zone"] for r in d.of_type(INSTANCE)} == {"us-central1-b"}


def test_label_rules() -> None:
    assert label_problem({"team": "ml-infra", "cost_center": "42"}) is None
    assert label_problem({"x" * 64: "v"}) is not None
    assert label_problem({"9team": "v"}) is not None


def test_a_model_that_fits_one_node_runs_without_workers() -> None:
    d = deployment("gcp-c4a", **one_node())
    assert [i.name for i in d.of_type(INSTANCE)] == ["llama-rpc-cluster-main"]
    assert d.outputs[outputs.WORKER_PRIVATE_IPS] == [] and d.outputs[outputs.RPC_SERVERS] == ""


@pytest.mark.parametrize("stack", GCP_STACKS)
def test_new_boot_data_replaces_a_node_delete_first(stack: str) -> None:
    """Metadata changes apply in place, and cloud-init reads user-data on first boot only: a
    changed user-data must replace the node, deleting first (its address is fixed)."""
    d = deployed(stack)
    for instance in d.of_type(INSTANCE):
        options = d.options_of(instance)
        assert options.replace_on_changes == ["metadata"]
        assert options.delete_before_replace is True


@pytest.mark.parametrize("stack", GCP_STACKS)
def test_ssh_keys_accounts_and_flow_logs(stack: str) -> None:
    d = deployed(stack)
    [account] = d.of_type("gcp:serviceaccount/account:Account")
    for instance in d.of_type(INSTANCE):
        metadata = instance.inputs["metadata"]
        assert metadata["block-project-ssh-keys"] == "TRUE"
        assert metadata["enable-oslogin"] == "TRUE"
        if instance.name.endswith("-main"):
            email = instance.inputs["serviceAccount"]["email"]
            assert email == f"{account.inputs['accountId']}@my-project.iam.gserviceaccount.com"
        else:
            assert "serviceAccount" not in instance.inputs, "workers run without an account"
    assert not d.of_type("gcp:projects/iAMMember:IAMMember"), "the account has no roles"
    [subnet] = d.of_type("gcp:compute/subnetwork:Subnetwork")
    assert subnet.inputs["logConfig"]["flowSampling"] > 0
    off = deployment(stack, **NO_FLOW_LOGS)
    assert "logConfig" not in off.of_type("gcp:compute/subnetwork:Subnetwork")[0].inputs


def test_each_stack_has_its_own_service_account() -> None:
    [account] = deployed("gcp-c4a").of_type("gcp:serviceaccount/account:Account")
    account_id = account.inputs["accountId"]
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])", account_id) and 6 <= len(account_id) <= 30
    assert service_account_id("llama-rpc-cluster", "gcp-c4a") == account_id
    others = {service_account_id("llama-rpc-cluster", s) for s in ("gcp-c4a-2", "prod", "x" * 40)}
    assert account_id not in others and len(others) == 3
    assert all(6 <= len(i) <= 30 for i in others)


def test_a_pinned_image_is_used_for_every_node() -> None:
    image = "projects/ubuntu-os-cloud/global/images/ubuntu-2404-noble-arm64-v20251001"
    d = deploy("gcp-c4a", {"llama-rpc-cluster:image": image})
    for instance in d.of_type(INSTANCE):
        assert instance.inputs["bootDisk"]["initializeParams"]["image"] == image


def test_a_staged_s3_model_is_refused_where_nodes_cannot_read_s3() -> None:
    model = {**stack_config("gcp-c4a")["llama-rpc-cluster:model"], "sha256": []}
    staged = {**model, "urls": ["s3://my-models/m.gguf"]}
    says = refused("gcp-c4a", {"llama-rpc-cluster:model": staged}, "model.urls")
    assert (
        "'s3://my-models/m.gguf': gcp nodes read a staged model from gs:// URLs only, their own "
        "cloud's store; give an https URL or a gs:// one"
    ) in says
    short = {**model, "urls": ["s3://b/m.gguf"]}
    says = refused("gcp-c4a", {"llama-rpc-cluster:model": short}, "model.urls")
    assert "is not s3://BUCKET/KEY with a bucket name S3 allows" in says


# --- replicas ------------------------------------------------------------------------------


def replicated(stack: str = "gcp-c4a") -> Deployment:
    """A preset with two serving groups behind the balancer node."""
    return deployment(stack, **REPLICAS)


def allowed_ports(rule: dict) -> set[int]:
    return {int(port) for allow in rule["allows"] for port in allow["ports"]}


@pytest.mark.parametrize("stack", GCP_STACKS)
def test_node_metrics_are_open_from_the_groups_main_node_only(stack: str) -> None:
    for d, groups in ((deployed(stack), [CLUSTER]), (replicated(stack), [CLUSTER, REPLICA2])):
        rules = {r.name: r.inputs for r in d.of_type(FIREWALL)}
        for group in groups:
            metrics = rules[f"{group}-worker-metrics-from-main"]
            assert metrics["direction"] == "INGRESS"
            assert metrics["allows"] == [{"protocol": "tcp", "ports": [str(METRICS_PORT)]}]
            assert metrics["sourceTags"] == [f"{group}-main"]
            assert metrics["targetTags"] == [f"{group}-worker"]
            assert "sourceRanges" not in metrics


@pytest.mark.parametrize("replicas", [1, 2])
def test_no_rule_opens_metrics_or_rpc_wider_than_the_cluster(replicas: int) -> None:
    d = replicated() if replicas == 2 else deployed("gcp-c4a")
    vpc = parsed_config("gcp-c4a").vpc_cidr
    checked = 0
    for rule in d.of_type(FIREWALL):
        ports = allowed_ports(rule.inputs)
        if ports & {METRICS_PORT, 50052}:
            checked += 1
            sources = [ipaddress.ip_network(s) for s in rule.inputs.get("sourceRanges", [])]
            assert all(source.subnet_of(vpc) for source in sources), rule.name
            assert sources or rule.inputs["sourceTags"], rule.name
            assert ports <= {METRICS_PORT, 50052}, rule.name
    assert checked == 2 * replicas  # RPC and metrics, per group


def test_replicas_are_groups_of_nodes_at_their_layout_addresses() -> None:
    d = replicated()
    instances = {r.name: r.inputs for r in d.of_type(INSTANCE) if r.name != f"{CLUSTER}-balancer"}
    expected = {
        f"{CLUSTER}-main": "10.42.0.10",
        f"{CLUSTER}-worker-1": "10.42.0.11",
        f"{CLUSTER}-worker-2": "10.42.0.12",
        f"{REPLICA2}-main": "10.42.0.30",
        f"{REPLICA2}-worker-1": "10.42.0.31",
        f"{REPLICA2}-worker-2": "10.42.0.32",
    }
    assert {name: i["networkInterfaces"][0]["networkIp"] for name, i in instances.items()} == (
        expected
    )
    for name, inputs in instances.items():
        group = REPLICA2 if name.startswith(REPLICA2) else CLUSTER
        role = "main" if name.endswith("-main") else "worker"
        assert inputs["tags"] == [f"{group}-{role}"]
        assert inputs["zone"] == "us-central1-a"  # one zone: the instance group's
    main = env_of(instances[f"{REPLICA2}-main"]["metadata"]["user-data"])
    assert main["RPC_WORKERS"] == "10.42.0.31:50052,10.42.0.32:50052"
    worker = env_of(instances[f"{REPLICA2}-worker-1"]["metadata"]["user-data"])
    assert worker["RPC_ALLOWED_SOURCES"] == "10.42.0.30/32"
    # llama-server listens on every address, as it did behind the passthrough balancer that
    # came before the balancer node: a deployed stack's nodes are not replaced for it.
    for name in (f"{CLUSTER}-main", f"{REPLICA2}-main"):
        assert env_of(instances[name]["metadata"]["user-data"])["SERVER_LISTEN"] == "0.0.0.0"
    one = {r.name: r.inputs for r in deployment("gcp-c4a", **ONE_GROUP).of_type(INSTANCE)}
    assert one and all(instances[name] == inputs for name, inputs in one.items())


def test_each_groups_workers_take_rpc_from_their_own_main_only() -> None:
    rules = {r.name: r.inputs for r in replicated().of_type(FIREWALL)}
    rpc = {name: rule for name, rule in rules.items() if 50052 in allowed_ports(rule)}
    assert set(rpc) == {f"{CLUSTER}-worker-rpc-from-main", f"{REPLICA2}-worker-rpc-from-main"}
    for group in (CLUSTER, REPLICA2):
        rule = rpc[f"{group}-worker-rpc-from-main"]
        assert rule["sourceTags"] == [f"{group}-main"]
        assert rule["targetTags"] == [f"{group}-worker"]
        assert "sourceRanges" not in rule
    # No rule lets the first group's main node reach the second group's workers, or back.
    for rule in rpc.values():
        assert rule["sourceTags"][0].removesuffix("-main") == (
            rule["targetTags"][0].removesuffix("-worker")
        )


def test_the_balancer_node_takes_the_api_from_iap_and_api_cidrs_and_reaches_each_main() -> None:
    d = deployment("gcp-c4a", **REPLICAS, **API_CIDRS)
    rules = {r.name: r.inputs for r in d.of_type(FIREWALL)}
    tag = f"{CLUSTER}-balancer"
    assert d.named(tag).inputs["tags"] == [tag]
    into = {name: rule for name, rule in rules.items() if tag in rule.get("targetTags", [])}
    assert set(into) == {f"{tag}-api-from-iap"}
    api = into[f"{tag}-api-from-iap"]
    assert api["direction"] == "INGRESS"
    assert api["sourceRanges"] == [IAP_RANGE, *API_CIDRS["apiAllowedCidrs"]]
    assert allowed_ports(api) == {8080}
    # Each group's main node admits the balancer node on the API port, and no other group's.
    for group in (CLUSTER, REPLICA2):
        rule = rules[f"{group}-main-api-from-balancer"]
        assert rule["sourceTags"] == [tag] and rule["targetTags"] == [f"{group}-main"]
        assert allowed_ports(rule) == {8080} and "sourceRanges" not in rule
        # ... and keeps its own API rule, for a tunnel to that group alone.
        assert rules[f"{group}-main-api-from-iap"]["targetTags"] == [f"{group}-main"]
    from_balancer = [r for r in rules.values() if tag in r.get("sourceTags", [])]
    assert len(from_balancer) == 2
    # Google's health-check probers are admitted nowhere: no managed balancer probes the groups.
    for rule in rules.values():
        assert not any(r.startswith(("35.191.", "130.211.")) for r in rule.get("sourceRanges", []))


def test_connect_command_tunnels_to_the_balancer_node_with_replicas() -> None:
    """IAP reaches the balancer node as it reaches any VM: the tunnel ends there."""
    replicas, alone = replicated().outputs, deployed("gcp-c4a").outputs
    assert shlex.split(replicas[outputs.CONNECT_COMMAND])[3] == f"{CLUSTER}-balancer"
    assert shlex.split(alone[outputs.CONNECT_COMMAND])[3] == f"{CLUSTER}-main"
    for out in (replicas, alone):
        assert not any(line.startswith("balancer:") for line in out[outputs.LIMITATIONS])


def test_one_group_has_no_balancer_and_keeps_its_names() -> None:
    """A stack without replicas sees nothing replaced: the first group's resources keep the
    names they had before there were groups."""
    d = deployed("gcp-c4a")
    # The instance group keeps the stack's zone; it has no members.
    assert not [r.name for r in d.resources if "balancer" in r.name]
    [group] = d.of_type(INSTANCE_GROUP)
    assert "instances" not in group.inputs
    assert d.outputs[outputs.REPLICAS] == 1
    assert d.outputs[outputs.BALANCER_URL] is None
    assert [set(g) for g in d.outputs[outputs.GROUPS]] == [set(outputs.GROUP_KEYS)]
    assert {r.name for r in d.of_type(INSTANCE)} == {
        f"{CLUSTER}-main",
        f"{CLUSTER}-worker-1",
        f"{CLUSTER}-worker-2",
    }
    rules = {r.name: r.inputs for r in d.of_type(FIREWALL)}
    assert rules[f"{CLUSTER}-worker-rpc-from-main"]["sourceTags"] == [f"{CLUSTER}-main"]
    assert rules[f"{CLUSTER}-main-api-from-iap"]["targetTags"] == [f"{CLUSTER}-main"]
    # ... and the first group of a replicated stack is that same group.
    replicated_names = {r.name for r in replicated().resources}
    assert {r.name for r in d.resources} <= replicated_names


def test_tier_1_networking_is_named_unpriced_in_the_hourly_cost() -> None:
    """Tier_1 is billed on top of a node of 32 vCPUs or more; the catalog has no price for it,
    so the figure says it is left out rather than quietly leaving it out."""
    d = deployed("gcp-c4a")
    tiers = {
        r.inputs["networkPerformanceConfig"]["totalEgressBandwidthTier"]
        for r in d.of_type(INSTANCE)
    }
    assert tiers == {"TIER_1"}
    assert "without" in d.outputs["hourlyCostBasis"]
    assert "Tier_1 networking" in d.outputs["hourlyCostBasis"].split("without", 1)[1]
