"""``lrc start``: a stopped stack's nodes started again with the user's credentials, and ``lrc
status`` naming a stopped group, through the cloud's CLI (each cloud's calls: tests/live/
test_power.py)."""

from __future__ import annotations

import json

import pytest

from infra.cli import deployed as deployed_module
from infra.cli import lrc
from infra.core import outputs
from tests.live.test_power import Cli, two_groups


def test_the_command_starts_the_stack_and_points_at_lrc_wait(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    found = two_groups(
        ["mainabc"], [["worker1abc"]], **{outputs.CLOUD: "azure", outputs.RESOURCE_GROUP: "rg"}
    )
    monkeypatch.setattr(deployed_module, "stack_outputs", lambda stack: found)
    cli = Cli()
    monkeypatch.setattr(deployed_module, "run_cli", cli)
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
    monkeypatch.setattr(deployed_module, "run_cli", Cli(1, "denied"))
    monkeypatch.setattr(deployed_module, "stack_outputs", lambda stack: found)
    assert lrc.main(["start", "--stack", "azure-cobalt"]) == 1
    assert "denied" in capsys.readouterr().err


def test_the_command_starts_the_balancer_node_with_the_groups(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A spend guard stops the balancer node with its groups: `lrc start` starts it again, after
    them, on every cloud."""
    found = two_groups(
        ["main1", "main2"], [["w1"], ["w2"]],
        **{outputs.CLOUD: "azure", outputs.RESOURCE_GROUP: "rg",
           outputs.BALANCER_INSTANCE_ID: "lrc-balancer"},
    )  # fmt: skip
    monkeypatch.setattr(deployed_module, "stack_outputs", lambda stack: found)
    cli = Cli()
    monkeypatch.setattr(deployed_module, "run_cli", cli)
    assert lrc.main(["start", "--stack", "azure-cobalt", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["nodes"] == [
        f"{vm}: starting" for vm in ("w1", "main1", "w2", "main2", "lrc-balancer")
    ]
    assert [argv[6] for argv in cli.argv] == ["w1", "main1", "w2", "main2", "lrc-balancer"]
    gcp = {**found, outputs.CLOUD: "gcp", outputs.ZONE: "us-central1-a"}
    monkeypatch.setattr(deployed_module, "stack_outputs", lambda stack: gcp)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "proj-1")
    cli = Cli()
    monkeypatch.setattr(deployed_module, "run_cli", cli)
    assert lrc.main(["start", "--stack", "gcp-c4a"]) == 0
    assert "lrc-balancer: starting" in capsys.readouterr().out
    assert cli.argv[0][4:9] == ["w1", "main1", "w2", "main2", "lrc-balancer"]


def test_status_says_a_stopped_group_is_stopped_and_how_to_start_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from infra.live import ChannelError
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
    monkeypatch.setattr(deployed_module, "run_cli", cli)
    assert lrc.main(["status", "--stack", "azure-cobalt"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "group 1: serving",
        "group 2: stopped (PowerState/deallocated: `lrc start --stack azure-cobalt`)",
    ]
    assert [argv[6] for argv in cli.argv] == ["main2"]  # only the unreachable group's node
    monkeypatch.setattr(deployed_module, "run_cli", Cli(1, "AuthorizationFailed"))
    assert lrc.main(["status", "--stack", "azure-cobalt"]) == 0
    assert "group 2: unreachable (az vm run-command on main2" in capsys.readouterr().out
