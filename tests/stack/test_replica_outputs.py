"""The output contract of a stack with replicas, the same on every cloud: the component builds
it, so one test pins it for the three presets under Pulumi mocks."""

from __future__ import annotations

import pytest

from infra.core import outputs
from tests.pulumi_mocks import REPLICAS, deployed, deployment

CLUSTER = "llama-rpc-cluster"
REPLICA2 = f"{CLUSTER}-replica2"
# How each cloud's mock names an instance: AWS's id is the mock's physical id, GCP's and Azure's
# instance output is the VM's name.
INSTANCE_ID = {"aws": "{}-id", "gcp": "{}", "azure": "{}"}


@pytest.mark.parametrize(
    ("stack", "cloud"), [("aws-c8g", "aws"), ("gcp-c4a", "gcp"), ("azure-cobalt", "azure")]
)
def test_replica_outputs_name_the_balancer_and_every_group(stack: str, cloud: str) -> None:
    out = deployment(stack, **REPLICAS).outputs
    subnet = out[outputs.MAIN_PRIVATE_IP].rsplit(".", 1)[0]
    assert out[outputs.CLOUD] == cloud and out[outputs.REPLICAS] == 2
    assert out[outputs.BALANCER_URL] == f"http://{subnet}.5:8080"
    groups = out[outputs.GROUPS]
    assert [set(g) for g in groups] == [set(outputs.GROUP_KEYS)] * 2
    first, second = groups
    assert {k: out[k] for k in outputs.GROUP_KEYS} == first  # the top level: the first group
    assert first[outputs.MAIN_PRIVATE_IP] == f"{subnet}.10"
    assert second[outputs.MAIN_PRIVATE_IP] == f"{subnet}.30"
    assert second[outputs.WORKER_PRIVATE_IPS] == [f"{subnet}.31", f"{subnet}.32"]
    assert second[outputs.RPC_SERVERS] == f"{subnet}.31:50052,{subnet}.32:50052"
    assert second[outputs.LLAMA_SERVER_URL] == f"http://{subnet}.30:8080"
    name = INSTANCE_ID[cloud]
    assert second[outputs.MAIN_INSTANCE_ID] == name.format(f"{REPLICA2}-main")
    assert second[outputs.WORKER_INSTANCE_IDS] == [
        name.format(f"{REPLICA2}-worker-{i}") for i in (1, 2)
    ]
    assert out[outputs.BALANCER_INSTANCE_ID] == name.format(f"{CLUSTER}-balancer")


@pytest.mark.parametrize(
    ("stack", "zone", "group"),
    [
        ("aws-c8g", "us-east-1a", None),
        ("gcp-c4a", "us-central1-a", None),
        ("azure-cobalt", None, "llama-rpc-cluster-rg"),
    ],
)
def test_every_stack_says_where_its_nodes_are(
    stack: str, zone: str | None, group: str | None
) -> None:
    """The command channels find the nodes by these outputs, not by reading connectCommand."""
    out = deployed(stack).outputs
    assert set(out) == {*outputs.ALL_KEYS, *outputs.DETAIL_KEYS}
    assert (out[outputs.ZONE], out[outputs.RESOURCE_GROUP]) == (zone, group)
