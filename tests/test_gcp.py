"""The GCP (Axion C4A) program under Pulumi mocks: firewall, disks, NICs, image, zone, outputs."""

from __future__ import annotations

import re
import shlex

import pytest

from infra import outputs
from infra.clouds.gcp import IAP_RANGE, label_problem, service_account_id
from tests.conftest import assert_valid_cloud_config
from tests.pulumi_mocks import (
    RecordingMocks,
    deploy,
    deployed,
    env_of,
    refused,
    stack_config,
    stack_names,
)

GCP_STACKS = [s for s in stack_names() if stack_config(s)["llama-rpc-cluster:cloud"] == "gcp"]
INSTANCE = "gcp:compute/instance:Instance"
FIREWALL = "gcp:compute/firewall:Firewall"
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
    assert any(line.startswith("placement:") for line in out["limitations"])
    assert out[outputs.HOURLY_COST_USD] is None or out[outputs.HOURLY_COST_USD] > 0


def test_zone_is_one_that_offers_both_types() -> None:
    mocks = RecordingMocks(unavailable={"us-central1-a": {"c4a-highcpu-72"}})
    d = deploy("gcp-c4a", mocks=mocks)
    assert {r.inputs["zone"] for r in d.of_type(INSTANCE)} == {"us-central1-b"}


@pytest.mark.parametrize(
    ("key", "overrides", "says"),
    [
        (
            "instanceType",
            {"llama-rpc-cluster:instanceType": "n2-standard-64"},
            "n2-standard-64 is not an Arm instance type",
        ),
        (
            "instanceType",
            {"llama-rpc-cluster:instanceType": "c4a-standard-4"},
            "not in the instance catalog for gcp us-central1",
        ),
        ("gcp:region", {"gcp:region": "europe-west4"}, "the instance catalog has no gcp types"),
        (
            "tags",
            {"llama-rpc-cluster:tags": {"Team": "ml"}},
            "label key 'Team' must start with a lowercase letter",
        ),
        ("tags", {"llama-rpc-cluster:tags": {"team": "ML Infra"}}, "label value 'ML Infra'"),
    ],
)
def test_bad_input_is_refused_naming_the_setting(key: str, overrides: dict, says: str) -> None:
    assert says in refused("gcp-c4a", overrides, key)


def test_label_rules() -> None:
    assert label_problem({"team": "ml-infra", "cost_center": "42"}) is None
    assert label_problem({"x" * 64: "v"}) is not None
    assert label_problem({"9team": "v"}) is not None


def test_a_model_that_fits_one_node_runs_without_workers() -> None:
    big = "c4a-highmem-72"  # 576 GiB holds the 405B preset alone
    d = deploy("gcp-c4a", {"llama-rpc-cluster:workerCount": 0,
                           "llama-rpc-cluster:instanceType": big,
                           "llama-rpc-cluster:mainInstanceType": big})  # fmt: skip
    assert [i.name for i in d.of_type(INSTANCE)] == ["llama-rpc-cluster-main"]
    assert d.outputs[outputs.WORKER_PRIVATE_IPS] == [] and d.outputs[outputs.RPC_SERVERS] == ""


@pytest.mark.parametrize("stack", GCP_STACKS)
def test_new_boot_data_replaces_a_node_delete_first(stack: str) -> None:
    """Metadata changes apply in place, and cloud-init reads user-data on first boot only: a
    changed user-data must replace the node, deleting first (its address is fixed)."""
    d = deployed(stack)
    for instance in d.of_type(INSTANCE):
        options = d.options[instance.name]
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
    off = deploy(stack, {"llama-rpc-cluster:flowLogs": False})
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
