"""``lrc wait``: after ``pulumi up``, until every serving group serves, each phase as it comes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from infra.cli import deployed as deployed_module
from infra.cli import lrc
from infra.core import outputs
from infra.live import ChannelError
from infra.observe.status import STATUS_COMMAND
from infra.observe.wait import WaitError, wait_until_serving


class Scripted:
    """A main node's channel that answers the status command from a script, one per read."""

    max_output = None

    def __init__(self, *answers: str | Exception) -> None:
        self.answers: Iterator[str | Exception] = iter(answers)
        self.last: str | Exception = ""

    def run(self, command: list[str], timeout: float) -> str:
        assert command == STATUS_COMMAND and timeout > 0
        self.last = next(self.answers, self.last)
        if isinstance(self.last, Exception):
            raise self.last
        return self.last


def status(phase: str, **more: Any) -> str:
    return json.dumps({"phase": phase, **more})


def test_each_groups_phase_is_reported_once_as_it_changes_until_all_serve() -> None:
    one = Scripted(status("building"), status("downloading"), status("serving"))
    two = Scripted(ChannelError("InvocationDoesNotExist"), status("loading"), status("serving"))
    seen: list[str] = []
    naps: list[float] = []
    states = wait_until_serving(
        [one, two], timeout=600, interval=15, report=lambda s: seen.append(s.line()),
        clock=lambda: 0.0, sleep=naps.append,
    )  # fmt: skip
    assert [s.phase for s in states] == ["serving", "serving"]
    assert seen == [
        "group 1: building",
        "group 2: unreachable (InvocationDoesNotExist)",
        "group 1: downloading",
        "group 2: loading",
        "group 1: serving",
        "group 2: serving",
    ]
    assert naps == [15, 15]


def test_the_download_and_the_load_are_reported_by_the_percent() -> None:
    """A new line per new percent (not per byte), with the bytes; a size not yet known shows
    what came so far; the load counts the weights sent to the workers."""
    gb = 10**9
    node = Scripted(
        status("downloading", download_done_bytes=3 * gb, download_total_bytes=None),
        status("downloading", download_done_bytes=94 * gb, download_total_bytes=229 * gb),
        status("downloading", download_done_bytes=94 * gb + 5, download_total_bytes=229 * gb),
        status("downloading", download_done_bytes=229 * gb - 1, download_total_bytes=229 * gb),
        status("loading", download_done_bytes=229 * gb, load_sent_bytes=0, load_total_bytes=None),
        status("loading", load_sent_bytes=120 * gb, load_total_bytes=190 * gb),
        status("serving", load_sent_bytes=190 * gb, load_total_bytes=190 * gb),
    )
    seen: list[str] = []
    wait_until_serving(
        [node], timeout=600, report=lambda s: seen.append(s.line()), clock=lambda: 0.0,
        sleep=lambda _: None,
    )  # fmt: skip
    assert seen == [
        "group 1: downloading 3.0 GB so far",
        "group 1: downloading 41% (94.0 of 229.0 GB)",
        "group 1: downloading 99% (229.0 of 229.0 GB)",
        "group 1: loading 0.0 GB so far",
        "group 1: loading 63% (120.0 of 190.0 GB)",
        "group 1: serving",
    ]


def test_a_failed_group_stops_the_wait_with_its_error() -> None:
    failed = Scripted(status("failed", last_error="checksum mismatch for part-00002"))
    with pytest.raises(WaitError, match="group 2: failed \\(checksum mismatch for part-00002\\)"):
        wait_until_serving([Scripted(status("serving")), failed], timeout=600, sleep=lambda _: None)


def test_the_wait_ends_at_its_timeout_naming_who_is_not_serving() -> None:
    now = iter(range(0, 10_000, 100))
    with pytest.raises(WaitError, match="not serving after 250 s: group 1: loading"):
        wait_until_serving(
            [Scripted(status("loading"))], timeout=250, clock=lambda: float(next(now)),
            sleep=lambda _: None,
        )  # fmt: skip


def test_the_command_reads_the_stack_and_waits(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    deployed = {
        outputs.CLOUD: "aws", outputs.REGION: "us-east-1", outputs.MAIN_INSTANCE_ID: "i-1",
        outputs.GROUPS: [{outputs.MAIN_INSTANCE_ID: "i-1"}],
    }  # fmt: skip
    monkeypatch.setattr(deployed_module, "stack_outputs", lambda stack: deployed)
    monkeypatch.setattr(
        deployed_module, "stack_channels",
        lambda found, **_: [Scripted(status("loading"), status("serving"))],
    )  # fmt: skip
    assert lrc.main(["wait", "--stack", "aws-c8g", "--interval", "0.01"]) == 0
    captured = capsys.readouterr()
    assert "group 1: loading" in captured.err and "group 1: serving" in captured.err
    assert "stack 'aws-c8g' serves" in captured.out
    assert lrc.main(["wait", "--stack", "aws-c8g", "--interval", "0.01", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["schemaVersion"] == 1 and document["serving"] is True
    assert [g["phase"] for g in document["groups"]] == ["serving"]
    monkeypatch.setattr(deployed_module, "stack_outputs", lambda stack: {})
    assert lrc.main(["wait", "--stack", "aws-c8g"]) == 2
    assert "has no outputs: deploy it with `pulumi up --stack aws-c8g`" in capsys.readouterr().err


def test_status_reads_each_group_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    deployed = {
        outputs.CLOUD: "aws", outputs.REGION: "us-east-1", outputs.MAIN_INSTANCE_ID: "i-1",
    }  # fmt: skip
    monkeypatch.setattr(deployed_module, "stack_outputs", lambda stack: deployed)
    monkeypatch.setattr(
        deployed_module, "stack_channels",
        lambda found, **_: [Scripted(status("serving")), Scripted(status("downloading"))],
    )  # fmt: skip
    assert lrc.main(["status", "--stack", "aws-c8g"]) == 0
    assert capsys.readouterr().out.splitlines() == ["group 1: serving", "group 2: downloading"]
    assert lrc.main(["status", "--stack", "aws-c8g", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["schemaVersion"] == 1 and document["stack"] == "aws-c8g"
    assert [g["phase"] for g in document["groups"]] == ["serving", "downloading"]


def test_exec_runs_a_command_on_a_groups_main_node(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ran: list[tuple[int, list[str]]] = []

    class Recording:
        max_output = None

        def __init__(self, group: int) -> None:
            self.group = group

        def run(self, command: list[str], timeout: float) -> str:
            ran.append((self.group, command))
            return f"ran on group {self.group}\n"

    monkeypatch.setattr(deployed_module, "stack_outputs", lambda stack: {outputs.CLOUD: "aws"})
    monkeypatch.setattr(
        deployed_module, "stack_channels", lambda found, **_: [Recording(1), Recording(2)]
    )
    assert lrc.main(["exec", "--stack", "s", "--", "journalctl", "-n", "5"]) == 0
    assert capsys.readouterr().out == "ran on group 1\n"
    assert lrc.main(["exec", "--stack", "s", "--group", "2", "--", "uptime"]) == 0
    assert ran == [(1, ["journalctl", "-n", "5"]), (2, ["uptime"])]
    capsys.readouterr()
    assert lrc.main(["exec", "--stack", "s", "--json", "--", "uptime"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["schemaVersion"] == 1 and document["output"] == "ran on group 1\n"
    assert lrc.main(["exec", "--stack", "s", "--group", "3", "--", "uptime"]) == 2
    assert "--group 3: the stack has 2 serving group(s)" in capsys.readouterr().err
    assert lrc.main(["exec", "--stack", "s"]) == 2  # no command
    capsys.readouterr()
    assert lrc.main(["exec", "--stack", "s", "--timeout", "0", "--", "uptime"]) == 2
    assert "--timeout 0: give a positive number of seconds" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [
        ["wait", "--stack", "aws-eks"],
        ["status", "--stack", "aws-eks"],
        ["exec", "--stack", "aws-eks", "--", "uptime"],
        ["start", "--stack", "aws-eks"],
        ["top", "--stack", "aws-eks", "--once"],
    ],
    ids=lambda c: c[0],
)
def test_a_kubernetes_stack_is_refused_with_kubectls_way_in(
    command: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the EKS stack exports (under mocks): the commands that read VMs say so, and name
    kubectl, before they ask for any channel."""
    from tests.pulumi_mocks import deployed as mocked

    found = mocked("aws-eks").outputs
    monkeypatch.setattr(deployed_module, "stack_outputs", lambda stack: found)

    def no_channels(*_: Any, **__: Any) -> Any:
        raise AssertionError("a channel was asked for")

    monkeypatch.setattr(deployed_module, "stack_channels", no_channels)
    assert lrc.main(command) == 2
    err = capsys.readouterr().err
    assert "runs on Kubernetes" in err and "kubectl -n llama-rpc-cluster get pods" in err
