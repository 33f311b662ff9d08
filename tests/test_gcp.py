"""The GCP (Axion C4A) program under Pulumi mocks: firewall, disks, NICs, image, zone, outputs."""

from __future__ import annotations

import pulumi
import pytest

from infra import outputs
from infra.clouds.gcp import IAP_RANGE, label_problem
from tests.conftest import assert_valid_cloud_config
from tests.pulumi_mocks import RecordingMocks, deploy, deployed, env_of, stack_config, stack_names

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
    assert out[outputs.CONNECT_COMMAND].startswith(
        "gcloud compute start-iap-tunnel llama-rpc-cluster-main 8080"
    )
    assert "--zone us-central1-a" in out[outputs.CONNECT_COMMAND]
    assert any(line.startswith("placement:") for line in out["limitations"])
    assert out[outputs.HOURLY_COST_USD] == pytest.approx(1.4368 + 2 * 2.72736)


def test_zone_is_one_that_offers_both_types() -> None:
    mocks = RecordingMocks(unavailable={"us-central1-a": {"c4a-highcpu-72"}})
    d = deploy("gcp-c4a", mocks=mocks)
    assert {r.inputs["zone"] for r in d.of_type(INSTANCE)} == {"us-central1-b"}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"llama-rpc-cluster:instanceType": "n2-standard-64"},
            "n2-standard-64 is not an Arm instance type",
        ),
        (
            {"llama-rpc-cluster:instanceType": "c4a-standard-4"},
            "not in the instance catalog for gcp us-central1",
        ),
        ({"gcp:region": "europe-west4"}, "not in the instance catalog for gcp europe-west4"),
        (
            {"llama-rpc-cluster:tags": {"Team": "ml"}},
            "label key 'Team' must start with a lowercase letter",
        ),
        ({"llama-rpc-cluster:tags": {"team": "ML Infra"}}, "label value 'ML Infra'"),
    ],
)
def test_bad_input_is_refused_before_anything_is_created(overrides: dict, message: str) -> None:
    mocks = RecordingMocks()
    with pytest.raises(pulumi.RunError) as error:
        deploy("gcp-c4a", overrides, mocks=mocks)
    assert message in str(error.value)
    assert mocks.resources == []


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
