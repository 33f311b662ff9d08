"""``lrc start``: a stopped stack's nodes started again with the user's credentials. AWS against
moto's EC2 (in this process: instances run, stopped, started); GCP and Azure through their CLIs,
whose command lines are checked and whose answers are the CLIs' own."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from typing import Any

import pytest

from infra.cli import deployed as deployed_module
from infra.cli import lrc, power
from infra.cli.power import StartError, node_ids, start_aws, start_azure, start_gcp
from infra.core import outputs


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
    # A stack from before serving groups: its top-level outputs.
    old = {outputs.MAIN_INSTANCE_ID: "m", outputs.WORKER_INSTANCE_IDS: ["w"]}
    assert node_ids(old) == ["w", "m"]


def test_aws_starts_stopped_instances_through_ec2() -> None:
    boto3 = pytest.importorskip("boto3")
    moto = pytest.importorskip("moto")
    with moto.mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        made = ec2.run_instances(ImageId=image, MinCount=3, MaxCount=3, InstanceType="c8g.large")
        ids = [i["InstanceId"] for i in made["Instances"]]
        ec2.stop_instances(InstanceIds=ids)
        lines = start_aws(ids, ec2=ec2)
        assert [line.split(": ")[0] for line in lines] == ids
        assert {line.split(": ")[1] for line in lines} <= {"pending", "running"}
        states = ec2.describe_instances(InstanceIds=ids)["Reservations"][0]["Instances"]
        assert {i["State"]["Name"] for i in states} <= {"pending", "running"}
        with pytest.raises(StartError, match="InvalidInstanceID"):
            start_aws(["i-0123456789abcdef0"], ec2=ec2)
        assert set(power.power_state_aws(ids, ec2=ec2).values()) <= {"pending", "running"}
        ec2.stop_instances(InstanceIds=ids[:1])
        stopped = power.power_state_aws(ids, ec2=ec2)
        assert stopped[ids[0]] in power.STOPPED_STATES
        assert not {stopped[i] for i in ids[1:]} & power.STOPPED_STATES


def test_gcp_starts_every_node_in_the_stacks_zone_and_project() -> None:
    found = two_groups(["dev-main-a1"], [["dev-worker-1-b2"]], **{outputs.ZONE: "us-central1-a"})
    cli = Cli()
    assert start_gcp(found, node_ids(found), project="proj-1", runner=cli) == [
        "dev-worker-1-b2: starting",
        "dev-main-a1: starting",
    ]
    assert cli.argv == [[
        "gcloud", "compute", "instances", "start", "dev-worker-1-b2", "dev-main-a1",
        "--zone", "us-central1-a", "--project", "proj-1",
    ]]  # fmt: skip
    with pytest.raises(StartError, match="project"):
        start_gcp(found, ["x"], project="", runner=cli)
    refused = Cli(1, "ERROR: (gcloud.compute.instances.start) Could not fetch resource:\n"
                     " - The resource 'projects/proj-1/zones/us-central1-a/instances/x' was not "
                     "found")  # fmt: skip
    with pytest.raises(StartError, match="was not found"):
        start_gcp(found, ["x"], project="proj-1", runner=refused)


def test_azure_starts_each_vm_in_the_stacks_resource_group() -> None:
    found = two_groups(["mainabc"], [["worker1abc"]], **{outputs.RESOURCE_GROUP: "dev-rg1"})
    cli = Cli()
    start_azure(found, node_ids(found), runner=cli)
    assert cli.argv == [
        ["az", "vm", "start", "--resource-group", "dev-rg1", "--name", vm, "--no-wait"]
        for vm in ("worker1abc", "mainabc")
    ]
    with pytest.raises(StartError, match="AuthorizationFailed"):
        start_azure(found, ["mainabc"], runner=Cli(1, "(AuthorizationFailed) The client ..."))


def test_the_command_starts_the_stack_and_points_at_lrc_wait(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    found = two_groups(
        ["mainabc"], [["worker1abc"]], **{outputs.CLOUD: "azure", outputs.RESOURCE_GROUP: "rg"}
    )
    monkeypatch.setattr(deployed_module, "stack_outputs", lambda stack: found)
    cli = Cli()
    monkeypatch.setattr(power, "run_cli", cli)
    assert lrc.main(["start", "--stack", "azure-cobalt"]) == 0
    out = capsys.readouterr().out
    assert "mainabc: starting" in out and "lrc wait --stack azure-cobalt" in out
    assert len(cli.argv) == 2
    assert lrc.main(["start", "--stack", "azure-cobalt", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["schemaVersion"] == 1 and document["nodes"][-1] == "mainabc: starting"
    monkeypatch.setattr(deployed_module, "stack_outputs", lambda stack: {})
    assert lrc.main(["start", "--stack", "azure-cobalt"]) == 2
    assert "has no outputs" in capsys.readouterr().err
    monkeypatch.setattr(power, "run_cli", Cli(1, "denied"))
    monkeypatch.setattr(deployed_module, "stack_outputs", lambda stack: found)
    assert lrc.main(["start", "--stack", "azure-cobalt"]) == 1
    assert "denied" in capsys.readouterr().err


def test_gcp_and_azure_report_each_vms_state_through_their_clis() -> None:
    gcp = {outputs.ZONE: "us-central1-a"}
    cli = Cli(stdout="TERMINATED\n")
    assert power.power_state_gcp(gcp, ["m"], project="p", runner=cli) == {"m": "TERMINATED"}
    assert cli.argv == [[
        "gcloud", "compute", "instances", "describe", "m", "--zone", "us-central1-a",
        "--project", "p", "--format=value(status)",
    ]]  # fmt: skip
    azure = {outputs.RESOURCE_GROUP: "rg"}
    cli = Cli(stdout="PowerState/deallocated\n")
    assert power.power_state_azure(azure, ["m"], runner=cli) == {"m": "PowerState/deallocated"}
    assert cli.argv[0][:7] == ["az", "vm", "get-instance-view", "--resource-group", "rg",
                               "--name", "m"]  # fmt: skip
    assert {"TERMINATED", "PowerState/deallocated", "stopped"} <= power.STOPPED_STATES
    assert not {"RUNNING", "PowerState/running", "running"} & power.STOPPED_STATES


def test_status_says_a_stopped_group_is_stopped_and_how_to_start_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from infra.observe.channels import ChannelError
    from tests.cli.test_wait import Scripted, status

    found = two_groups(
        ["main1", "main2"],
        [["w1"], ["w2"]],
        **{outputs.CLOUD: "azure", outputs.RESOURCE_GROUP: "rg"},
    )
    monkeypatch.setattr(deployed_module, "stack_outputs", lambda stack: found)
    unreachable = ChannelError("az vm run-command on main2: the VM is not running")
    monkeypatch.setattr(
        deployed_module, "stack_channels",
        lambda found, **_: [Scripted(status("serving")), Scripted(unreachable)],
    )  # fmt: skip
    cli = Cli(stdout="PowerState/deallocated\n")
    monkeypatch.setattr(power, "run_cli", cli)
    assert lrc.main(["status", "--stack", "azure-cobalt"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "group 1: serving",
        "group 2: stopped (PowerState/deallocated: `lrc start --stack azure-cobalt`)",
    ]
    assert [argv[6] for argv in cli.argv] == ["main2"]  # only the unreachable group's node
    monkeypatch.setattr(power, "run_cli", Cli(1, "AuthorizationFailed"))
    assert lrc.main(["status", "--stack", "azure-cobalt"]) == 0
    assert "group 2: unreachable (az vm run-command on main2" in capsys.readouterr().out
