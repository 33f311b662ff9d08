"""Power on and state, each cloud's own way, with the user's credentials: AWS against moto's EC2
(in this process: instances run, stopped, started); GCP and Azure through their CLIs, whose
command lines are checked and whose answers are the CLIs' own."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import Any

import pytest

from infra.core import outputs
from infra.core.outputs import node_ids
from infra.live import LIVE, Access, PowerError


def two_groups(main_ids: list[str], worker_ids: list[list[str]], **more: Any) -> dict[str, Any]:
    groups = [
        {outputs.MAIN_INSTANCE_ID: main, outputs.WORKER_INSTANCE_IDS: workers}
        for main, workers in zip(main_ids, worker_ids, strict=True)
    ]
    return {**groups[0], outputs.GROUPS: groups, **more}


class Cli:
    """A cloud CLI that records each command line and answers as told."""

    def __init__(self, returncode: int = 0, stderr: str = "", stdout: str = "") -> None:
        self.argv: list[list[str]] = []
        self.returncode, self.stderr, self.stdout = returncode, stderr, stdout

    def __call__(self, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        assert timeout > 0
        self.argv.append(list(argv))
        return subprocess.CompletedProcess(list(argv), self.returncode, self.stdout, self.stderr)


def test_every_node_is_started_workers_before_their_main_node() -> None:
    found = two_groups(["m1", "m2"], [["w1", "w2"], ["w3"]])
    assert node_ids(found) == ["w1", "w2", "m1", "w3", "m2"]
    # The balancer node last: its groups pass HAProxy's checks as they come up.
    balanced = {**found, outputs.BALANCER_INSTANCE_ID: "b"}
    assert node_ids(balanced) == ["w1", "w2", "m1", "w3", "m2", "b"]
    # A stack from before serving groups: its top-level outputs.
    old = {outputs.MAIN_INSTANCE_ID: "m", outputs.WORKER_INSTANCE_IDS: ["w"]}
    assert node_ids(old) == ["w", "m"]
    # One group, or a stack from before the balancer node was an output: no balancer to start.
    assert node_ids({**old, outputs.BALANCER_INSTANCE_ID: None}) == ["w", "m"]


def test_aws_starts_stopped_instances_through_ec2() -> None:
    boto3 = pytest.importorskip("boto3")
    moto = pytest.importorskip("moto")
    aws, access = LIVE["aws"], Access("us-east-1")
    with moto.mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        made = ec2.run_instances(ImageId=image, MinCount=3, MaxCount=3, InstanceType="c8g.large")
        ids = [i["InstanceId"] for i in made["Instances"]]
        ec2.stop_instances(InstanceIds=ids)
        lines = aws.start({}, ids, access)
        assert [line.split(": ")[0] for line in lines] == ids
        assert {line.split(": ")[1] for line in lines} <= {"pending", "running"}
        states = ec2.describe_instances(InstanceIds=ids)["Reservations"][0]["Instances"]
        assert {i["State"]["Name"] for i in states} <= {"pending", "running"}
        with pytest.raises(PowerError, match="InvalidInstanceID"):
            aws.start({}, ["i-0123456789abcdef0"], access)
        assert set(aws.power_states({}, ids, access).values()) <= {"pending", "running"}
        ec2.stop_instances(InstanceIds=ids[:1])
        stopped = aws.power_states({}, ids, access)
        assert stopped[ids[0]] in aws.stopped_states
        assert not {stopped[i] for i in ids[1:]} & aws.stopped_states


def test_gcp_starts_every_node_in_the_stacks_zone_and_project() -> None:
    found = two_groups(["dev-main-a1"], [["dev-worker-1-b2"]], **{outputs.ZONE: "us-central1-a"})
    cli = Cli()
    access = Access("us-central1", {"gcp:project": "proj-1"}, runner=cli)
    assert LIVE["gcp"].start(found, node_ids(found), access) == [
        "dev-worker-1-b2: starting",
        "dev-main-a1: starting",
    ]
    assert cli.argv == [[
        "gcloud", "compute", "instances", "start", "dev-worker-1-b2", "dev-main-a1",
        "--zone", "us-central1-a", "--project", "proj-1",
    ]]  # fmt: skip
    unnamed = Access("us-central1", environ={}, runner=cli, which=lambda tool: None)
    with pytest.raises(PowerError, match="no GCP project"):
        LIVE["gcp"].start(found, ["x"], unnamed)
    refused = Cli(1, "ERROR: (gcloud.compute.instances.start) Could not fetch resource:\n"
                     " - The resource 'projects/proj-1/zones/us-central1-a/instances/x' was not "
                     "found")  # fmt: skip
    with pytest.raises(PowerError, match="was not found"):
        LIVE["gcp"].start(found, ["x"], Access("us-central1", access.values, runner=refused))


def test_azure_starts_each_vm_in_the_stacks_resource_group() -> None:
    found = two_groups(["mainabc"], [["worker1abc"]], **{outputs.RESOURCE_GROUP: "dev-rg1"})
    cli = Cli()
    LIVE["azure"].start(found, node_ids(found), Access("eastus", runner=cli))
    assert cli.argv == [
        ["az", "vm", "start", "--resource-group", "dev-rg1", "--name", vm, "--no-wait"]
        for vm in ("worker1abc", "mainabc")
    ]
    denied = Access("eastus", runner=Cli(1, "(AuthorizationFailed) The client ..."))
    with pytest.raises(PowerError, match="AuthorizationFailed"):
        LIVE["azure"].start(found, ["mainabc"], denied)


def test_gcp_and_azure_report_each_vms_state_through_their_clis() -> None:
    gcp = {outputs.ZONE: "us-central1-a"}
    cli = Cli(stdout="TERMINATED\n")
    access = Access("us-central1", {"gcp:project": "p"}, runner=cli)
    assert LIVE["gcp"].power_states(gcp, ["m"], access) == {"m": "TERMINATED"}
    assert cli.argv == [[
        "gcloud", "compute", "instances", "describe", "m", "--zone", "us-central1-a",
        "--project", "p", "--format=value(status)",
    ]]  # fmt: skip
    azure = {outputs.RESOURCE_GROUP: "rg"}
    cli = Cli(stdout="PowerState/deallocated\n")
    states = LIVE["azure"].power_states(azure, ["m"], Access("eastus", runner=cli))
    assert states == {"m": "PowerState/deallocated"}
    assert cli.argv[0][:7] == ["az", "vm", "get-instance-view", "--resource-group", "rg",
                               "--name", "m"]  # fmt: skip
    assert "TERMINATED" in LIVE["gcp"].stopped_states
    assert "PowerState/deallocated" in LIVE["azure"].stopped_states
    assert "stopped" in LIVE["aws"].stopped_states
    stopped = set().union(*(cloud.stopped_states for cloud in LIVE.values()))
    assert not {"running", "pending", "RUNNING", "PowerState/running"} & stopped
