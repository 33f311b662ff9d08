"""Each cloud's command channel and leftovers audit against its real API or CLI: SSM and the
tagging and EC2 audit through botocore's Stubber, IAP SSH, Run Command and the label and tag
audits from recorded CLI output. Nothing here reaches a network."""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Sequence
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from infra.live import LIVE, Access, ChannelError, LiveError, run_cli
from infra.live.aws import SsmChannel
from infra.live.azure import RunCommandChannel
from infra.live.gcp import IapChannel
from infra.observe.status import STATUS_COMMAND

COMMAND_ID = "0b6c1f3e-2d4a-4c5b-9e8f-7a6b5c4d3e2f"  # SSM's ids are UUIDs


def aws_clients() -> tuple[dict[str, Any], dict[str, Stubber]]:
    clients = {
        name: boto3.client(
            name,
            region_name="us-east-1",
            aws_access_key_id="k",  # type: ignore[call-overload]
            aws_secret_access_key="s",
        )
        for name in ("ssm", "resourcegroupstaggingapi", "ec2")
    }
    return clients, {name: Stubber(client) for name, client in clients.items()}


def test_a_failed_ssm_command_is_an_error_with_its_output() -> None:
    clients, stubs = aws_clients()
    stubs["ssm"].add_response("send_command", {"Command": {"CommandId": COMMAND_ID}})
    stubs["ssm"].add_response(
        "get_command_invocation", {"Status": "Failed", "StandardErrorContent": "no such file"}
    )
    with stubs["ssm"], pytest.raises(ChannelError, match="SSM Failed on i-1: no such file"):
        SsmChannel(clients["ssm"], "i-1", sleep=lambda _: None).run(["cat", "x"], 60)


def test_the_aws_audit_lists_what_is_tagged_and_still_running() -> None:
    clients, stubs = aws_clients()
    arns = [
        "arn:aws:ec2:us-east-1:1:instance/i-gone",  # terminated: listed by tag a while longer
        "arn:aws:ec2:us-east-1:1:instance/i-alive",
        "arn:aws:ec2:us-east-1:1:natgateway/nat-1",
    ]
    stubs["resourcegroupstaggingapi"].add_response(
        "get_resources",
        {"ResourceTagMappingList": [{"ResourceARN": a} for a in arns]},
        {"TagFilters": [{"Key": "project", "Values": ["llama-rpc-cluster"]},
                        {"Key": "stack", "Values": ["aws-c8g"]}]},
    )  # fmt: skip
    stubs["ec2"].add_response(
        "describe_instances",
        {"Reservations": [{"Instances": [{"InstanceId": "i-alive"}, {"InstanceId": "i-new"}]}]},
    )
    access = Access("us-east-1", aws_clients=lambda service, region: clients[service])
    with stubs["resourcegroupstaggingapi"], stubs["ec2"]:
        found = LIVE["aws"].leftovers("aws-c8g", access)
    assert found == [
        "arn:aws:ec2:us-east-1:1:natgateway/nat-1",
        "arn:aws:ec2:us-east-1:1:instance/i-alive",
        "instance i-new (running, not yet in the tagging API)",
    ]


def recorded(outputs_by_command: dict[str, tuple[int, str]]) -> Any:
    """A CLI runner that answers from recorded output, keyed by the command's first words."""
    calls: list[list[str]] = []
    timeouts: list[float] = []

    def runner(argv: Sequence[str], timeout: float = 3600.0) -> subprocess.CompletedProcess[str]:
        calls.append(list(argv))
        timeouts.append(timeout)
        key = next(k for k in outputs_by_command if " ".join(argv).startswith(k))
        code, out = outputs_by_command[key]
        return subprocess.CompletedProcess(list(argv), code, out if code == 0 else "", out)

    runner.calls = calls  # type: ignore[attr-defined]
    runner.timeouts = timeouts  # type: ignore[attr-defined]
    return runner


def test_gcp_reads_the_node_through_iap_and_audits_by_label() -> None:
    runner = recorded({
        "gcloud compute ssh": (0, '{"phase": "serving"}\n'),
        "gcloud compute instances list": (0, '[{"name": "gcp-c4a-main"}]'),
        "gcloud compute disks list": (0, "[]"),
        "gcloud compute addresses list": (0, "[]"),
    })  # fmt: skip
    channel = IapChannel("gcp-c4a-main", "us-central1-c", "proj", runner)
    assert json.loads(channel.run(STATUS_COMMAND, 60))["phase"] == "serving"
    assert runner.calls[0][-1] == f"sudo {shlex.join(STATUS_COMMAND)}"
    assert runner.timeouts[0] == 60  # a hung gcloud gives up when the caller does
    assert "--tunnel-through-iap" in runner.calls[0]
    access = Access("us-central1", {"gcp:project": "proj"}, runner=runner)
    assert LIVE["gcp"].leftovers("gcp-c4a", access) == ["instance gcp-c4a-main"]
    assert "--filter=labels.stack=gcp-c4a AND labels.project=llama-rpc-cluster" in runner.calls[1]
    assert runner.calls[1][4:6] == ["--project", "proj"]
    failed = recorded({"gcloud compute": (1, "ERROR: (gcloud.compute.instances.list) denied")})
    with pytest.raises(LiveError, match=r"gcloud compute instances list: .*denied"):
        LIVE["gcp"].leftovers("gcp-c4a", Access("us-central1", access.values, runner=failed))


def test_azure_runs_the_command_through_run_command_and_audits_by_tag() -> None:
    message = 'Enable succeeded: \n[stdout]\n{"phase": "loading"}\n\n[stderr]\n'
    runner = recorded({
        "az vm run-command invoke": (0, json.dumps({"value": [{"message": message}]})),
        "az group list": (
            0, json.dumps([{"name": "rg1", "tags": {"project": "llama-rpc-cluster"}}])
        ),
        "az resource list": (0, json.dumps([{"name": "other", "tags": {"project": "else"}}])),
    })  # fmt: skip
    channel = RunCommandChannel("azure-cobalt-main", "rg1", runner)
    assert json.loads(channel.run(["cat", "status.json"], 60)) == {"phase": "loading"}
    assert runner.timeouts[0] == 60
    assert LIVE["azure"].leftovers("azure-cobalt", Access("eastus", runner=runner)) == ["group rg1"]
    failed = recorded({"az vm": (1, "ERROR: (AuthorizationFailed) no access")})
    with pytest.raises(ChannelError, match="AuthorizationFailed"):
        RunCommandChannel("vm", "rg", failed).run(["true"], 60)


def test_a_cloud_cli_that_hangs_gives_up_at_the_channels_timeout() -> None:
    with pytest.raises(ChannelError, match=r"sleep 30 did not finish in 0\.2 s"):
        run_cli(["sleep", "30"], timeout=0.2)
