"""``lrc status``, ``wait``, ``top`` and ``exec`` on a stack this machine cannot reach: no Pulumi
CLI, no such stack, no passphrase; each cloud with no credentials, no CLI, no login or no route
to its API; and a stopped node. Each ends in one line that names the fix (exit 2 for this
machine's side, as a setting is), never a traceback; a stopped node is said to be stopped, with
the command that starts it. The clouds' CLIs and Pulumi's are stand-ins on PATH answering as the
real ones do; SSM is botocore's own client, stubbed."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import EndpointConnectionError, NoCredentialsError
from botocore.stub import Stubber

from infra.cli import deployed, lrc
from infra.core import outputs
from infra.live import aws as live_aws
from infra.stack import files

FakeBin = tuple[Path, Callable[[str, str], Path]]
COMMANDS = [
    ["status"],
    ["wait", "--interval", "0.01", "--timeout", "1"],
    ["top", "--once", "--interval", "0.01"],
    ["exec", "--", "uptime"],
]
AWS = {
    outputs.CLOUD: "aws", outputs.REGION: "us-east-1", outputs.MAIN_INSTANCE_ID: "i-0abc",
    outputs.MAIN_PRIVATE_IP: "10.0.1.10", outputs.WORKER_PRIVATE_IPS: ["10.0.1.11"],
}  # fmt: skip
GCP = {
    outputs.CLOUD: "gcp", outputs.REGION: "us-central1", outputs.ZONE: "us-central1-a",
    outputs.MAIN_INSTANCE_ID: "gcp-c4a-main", outputs.MAIN_PRIVATE_IP: "10.0.1.10",
    outputs.WORKER_PRIVATE_IPS: ["10.0.1.11"],
}  # fmt: skip
AZURE = {
    outputs.CLOUD: "azure", outputs.REGION: "eastus", outputs.RESOURCE_GROUP: "rg1",
    outputs.MAIN_INSTANCE_ID: "azure-cobalt-main", outputs.MAIN_PRIVATE_IP: "10.0.1.10",
    outputs.WORKER_PRIVATE_IPS: ["10.0.1.11"],
}  # fmt: skip
STACK_OF = {"aws": "aws-small", "gcp": "gcp-c4a", "azure": "azure-cobalt"}


def lrc_said(
    command: list[str], stack: str, capsys: pytest.CaptureFixture[str]
) -> tuple[int, list[str], str]:
    """``lrc COMMAND --stack STACK``: its exit code, its error lines, its output."""
    name, *rest = command
    code = lrc.main([name, "--stack", stack, *rest])
    captured = capsys.readouterr()
    return code, [line for line in captured.err.splitlines() if line.strip()], captured.out


def only_path(monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
    """PATH holds ``directory`` (the test's stand-ins) and the few system tools they run, no
    cloud CLI of this machine's."""
    system = directory.parent / "system-bin"
    system.mkdir(exist_ok=True)
    for tool in ("bash", "env", "cat"):
        found = shutil.which(tool)
        if found and not (system / tool).exists():
            (system / tool).symlink_to(found)
    monkeypatch.setenv("PATH", f"{directory}{os.pathsep}{system}")


# --- before any cloud: the Pulumi CLI and the stack ----------------------------------------------

PULUMI_NO_STACK = "echo \"error: no stack named '$4' found\" >&2; exit 255\n"
PULUMI_PASSPHRASE = (
    'echo "error: constructing secrets manager of type \\"passphrase\\": passphrase must be set '
    'with PULUMI_CONFIG_PASSPHRASE or PULUMI_CONFIG_PASSPHRASE_FILE environment variables" >&2\n'
    "exit 255\n"
)
PULUMI_NO_LOGIN = (
    'echo "error: PULUMI_ACCESS_TOKEN must be set for login during non-interactive CLI '
    'sessions" >&2; exit 255\n'
)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize(
    ("pulumi", "fix"),
    [
        (None, "install it (https://www.pulumi.com/docs/install/)"),
        (PULUMI_NO_STACK, "create it with `pulumi up --stack aws-small`"),
        (PULUMI_PASSPHRASE, "set PULUMI_CONFIG_PASSPHRASE"),
        (PULUMI_NO_LOGIN, "`pulumi login`"),
    ],
    ids=["no-cli", "no-stack", "passphrase", "no-login"],
)
def test_a_stack_pulumi_cannot_give_is_one_line_naming_the_fix(
    *,
    command: list[str],
    pulumi: str | None,
    fix: str,
    fake_bin: FakeBin,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    directory, write = fake_bin
    if pulumi is not None:
        write("pulumi", pulumi)
    only_path(monkeypatch, directory)
    code, err, _ = lrc_said(command, "aws-small", capsys)
    assert code == 2
    assert len(err) == 1 and err[0].startswith("error: cannot read the outputs of stack")
    assert fix in err[0] and "'aws-small''s" not in err[0]


def test_the_outputs_come_from_pulumi_in_the_projects_directory(
    fake_bin: FakeBin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory, write = fake_bin
    log = tmp_path / "pulumi.log"
    write("pulumi", f'echo "$PWD $*" >> {log}\necho \'{{"cloud": "aws", "apiKey": "[secret]"}}\'\n')
    only_path(monkeypatch, directory)
    assert deployed.stack_outputs("aws-small") == {"cloud": "aws", "apiKey": "[secret]"}
    where, *args = log.read_text().split()
    assert Path(where) == files.project_dir()
    # No --show-secrets: nothing lrc reads from the outputs is a secret.
    assert args == ["stack", "output", "--json", "--stack", "aws-small", "--non-interactive"]


# --- AWS: SSM through botocore -------------------------------------------------------------------


class Session:
    """A boto3 session whose clients are the test's (stubbed) ones."""

    def __init__(self, clients: dict[str, Any]) -> None:
        self.clients = clients

    def get_credentials(self) -> object:
        return object()

    def client(self, service: str, endpoint_url: str | None = None) -> Any:
        return self.clients[service]


class Raising:
    """An SSM client whose every call raises ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def send_command(self, **_: Any) -> Any:
        raise self.error


def aws_clients() -> tuple[dict[str, Any], dict[str, Stubber]]:
    clients = {
        name: boto3.client(
            name, region_name="us-east-1",
            aws_access_key_id="k", aws_secret_access_key="s",  # type: ignore[call-overload]
        )
        for name in ("ssm", "ec2")
    }  # fmt: skip
    return clients, {name: Stubber(client) for name, client in clients.items()}


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_aws_without_credentials_is_one_line_naming_them(
    command: list[str],
    no_aws_credentials: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(deployed, "stack_outputs", lambda stack: AWS)
    code, err, _ = lrc_said(command, "aws-small", capsys)
    assert code == 2 and len(err) == 1
    assert "no AWS credentials: set AWS_PROFILE (after `aws sso login`)" in err[0]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize(
    ("error", "fix"),
    [
        (NoCredentialsError(), "no AWS credentials: set AWS_PROFILE"),
        (
            EndpointConnectionError(endpoint_url="https://ssm.us-east-1.amazonaws.com/"),
            "check this machine's network (a VPN, a proxy: HTTPS_PROXY)",
        ),
    ],
    ids=["credentials-gone", "no-route"],
)
def test_aws_refusing_this_machine_is_one_line_naming_the_fix(
    command: list[str],
    error: Exception,
    fix: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Credentials that were found but fail at the call (an SSO session expired), and no route
    to SSM's endpoint (a VPN down): the call's name and the fix, before any node is judged."""
    monkeypatch.setattr(deployed, "stack_outputs", lambda stack: AWS)
    session = Session({"ssm": Raising(error), "ec2": None})
    monkeypatch.setattr(live_aws, "session", lambda region, profile=None: session)
    code, err, _ = lrc_said(command, "aws-small", capsys)
    assert code == 2 and len(err) == 1
    assert err[0].startswith("error: stack 'aws-small': SSM SendCommand: ") and fix in err[0]


def test_an_expired_aws_token_is_named_with_its_renewal() -> None:
    clients, stubs = aws_clients()
    stubs["ssm"].add_client_error("send_command", "ExpiredTokenException", "expired")
    channel = live_aws.SsmChannel(clients["ssm"], "i-0abc", sleep=lambda _: None)
    with stubs["ssm"], pytest.raises(live_aws.CredentialsError, match="aws sso login"):
        channel.run(["uptime"], 60)


def stopped_aws(monkeypatch: pytest.MonkeyPatch, state: str = "stopped") -> dict[str, Stubber]:
    """SSM answers InvalidInstanceId (as for a stopped node, or one whose agent has not
    registered yet) as many times as asked; EC2 says the node is stopped."""
    clients, stubs = aws_clients()
    for _ in range(3):
        stubs["ssm"].add_client_error(
            "send_command", "InvalidInstanceId",
            "Instances [[i-0abc]] not in a valid state for account 123456789012",
        )  # fmt: skip
        stubs["ec2"].add_response(
            "describe_instances",
            {"Reservations": [
                {"Instances": [{"InstanceId": "i-0abc", "State": {"Name": state}}]}
            ]},
        )  # fmt: skip
    monkeypatch.setattr(live_aws, "session", lambda region, profile=None: Session(clients))
    monkeypatch.setattr(deployed, "stack_outputs", lambda stack: AWS)
    return stubs


def test_aws_status_says_a_stopped_node_is_stopped_and_how_to_start_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stubs = stopped_aws(monkeypatch)
    with stubs["ssm"], stubs["ec2"]:
        code, err, out = lrc_said(["status"], "aws-small", capsys)
    assert code == 0 and not err
    assert out.splitlines() == ["group 1: stopped (stopped: `lrc start --stack aws-small`)"]


def test_aws_status_says_a_running_node_ssm_does_not_know_yet_is_waited_for(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stubs = stopped_aws(monkeypatch, state="running")
    with stubs["ssm"], stubs["ec2"]:
        code, err, out = lrc_said(["status"], "aws-small", capsys)
    assert code == 0 and not err
    [line] = out.splitlines()
    assert line.startswith("group 1: unreachable (SSM SendCommand: SSM cannot reach i-0abc")
    assert line.endswith("the node is running: `lrc wait --stack aws-small` waits for it)")


def test_wait_stops_at_a_stopped_node_naming_lrc_start(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stubs = stopped_aws(monkeypatch)
    with stubs["ssm"], stubs["ec2"]:
        code, err, _ = lrc_said(["wait", "--interval", "0.01"], "aws-small", capsys)
    assert code == 1
    assert err[-1] == "error: group 1: stopped (stopped: `lrc start --stack aws-small`)"


def test_a_node_ssm_does_not_know_yet_is_waited_for() -> None:
    """Right after `pulumi up` SSM answers InvalidInstanceId while the agent registers: the
    node is unreachable for now, not an error of this machine's."""
    from infra.observe.wait import read_group

    clients, stubs = aws_clients()
    stubs["ssm"].add_client_error("send_command", "InvalidInstanceId", "not in a valid state")
    with stubs["ssm"]:
        state = read_group(1, live_aws.SsmChannel(clients["ssm"], "i-0abc"))
    assert state.phase == "unreachable"
    assert "not running, or its SSM agent has not registered yet" in state.detail


# --- GCP and Azure: their CLIs -------------------------------------------------------------------

GCLOUD_NO_LOGIN = """case "$1 $2" in
  "config get-value") echo proj ;;
  *) echo "ERROR: (gcloud.auth.print-access-token) You do not currently have an active \\
account selected." >&2
     printf 'Please run:\\n\\n  $ gcloud auth login\\n\\nto obtain new credentials.\\n' >&2
     exit 1 ;;
esac
"""
GCLOUD_STOPPED = """case "$*" in
  "config get-value project"*) echo proj ;;
  "auth print-access-token"*) echo token ;;
  "compute ssh gcp-c4a-main"*)
    echo "ERROR: (gcloud.compute.ssh) Instance [gcp-c4a-main] in zone [us-central1-a] is \\
not running." >&2; exit 1 ;;
  "compute instances describe"*) echo TERMINATED ;;
  *) echo "unexpected: $*" >&2; exit 2 ;;
esac
"""
AZ_NO_LOGIN = """echo "ERROR: Please run 'az login' to setup account." >&2; exit 1
"""
AZ_STOPPED = """case "$*" in
  "account get-access-token"*) echo '{"accessToken": "t", "subscription": "s"}' ;;
  "vm run-command invoke"*)
    echo "ERROR: (Conflict) Operation 'RunCommand' is not allowed since the VM \\
azure-cobalt-main is deallocated." >&2; exit 1 ;;
  "vm get-instance-view"*) echo PowerState/deallocated ;;
  *) echo "unexpected: $*" >&2; exit 2 ;;
esac
"""


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize(
    ("cloud", "cli", "script", "fix"),
    [
        ("gcp", "gcloud", None, "gcloud is not on PATH: install the Google Cloud CLI"),
        ("gcp", "gcloud", GCLOUD_NO_LOGIN, "no gcloud login: run `gcloud auth login`"),
        ("azure", "az", None, "az is not on PATH: install the Azure CLI"),
        ("azure", "az", AZ_NO_LOGIN, "no Azure login: run `az login`"),
    ],
    ids=["gcp-no-cli", "gcp-no-login", "azure-no-cli", "azure-no-login"],
)
def test_a_cloud_cli_missing_or_logged_out_is_one_line_naming_the_fix(
    *,
    command: list[str],
    cloud: str,
    cli: str,
    script: str | None,
    fix: str,
    fake_bin: FakeBin,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    directory, write = fake_bin
    if script is not None:
        write(cli, script)
    only_path(monkeypatch, directory)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "proj")
    monkeypatch.setattr(deployed, "stack_outputs", lambda stack: GCP if cloud == "gcp" else AZURE)
    code, err, _ = lrc_said(command, STACK_OF[cloud], capsys)
    assert code == 2 and len(err) == 1
    assert err[0].startswith(f"error: stack '{STACK_OF[cloud]}': ") and fix in err[0]


@pytest.mark.parametrize(
    ("cloud", "cli", "script", "state"),
    [
        ("gcp", "gcloud", GCLOUD_STOPPED, "TERMINATED"),
        ("azure", "az", AZ_STOPPED, "PowerState/deallocated"),
    ],
)
def test_a_stopped_node_is_said_stopped_with_lrc_start(
    *,
    cloud: str,
    cli: str,
    script: str,
    state: str,
    fake_bin: FakeBin,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    directory, write = fake_bin
    write(cli, script)
    only_path(monkeypatch, directory)
    monkeypatch.setattr(deployed, "stack_outputs", lambda stack: GCP if cloud == "gcp" else AZURE)
    stack = STACK_OF[cloud]
    code, err, out = lrc_said(["status"], stack, capsys)
    assert (code, err) == (0, [])
    assert out.splitlines() == [f"group 1: stopped ({state}: `lrc start --stack {stack}`)"]
    code, err, _ = lrc_said(["wait", "--interval", "0.01"], stack, capsys)
    assert code == 1
    assert err[-1] == f"error: group 1: stopped ({state}: `lrc start --stack {stack}`)"


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_start_without_credentials_or_cli_is_one_line_naming_the_fix(
    cloud: str,
    no_aws_credentials: None,
    fake_bin: FakeBin,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    only_path(monkeypatch, fake_bin[0])
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "proj")
    found = {"aws": AWS, "gcp": GCP, "azure": AZURE}[cloud]
    monkeypatch.setattr(deployed, "stack_outputs", lambda stack: found)
    code, err, _ = lrc_said(["start"], STACK_OF[cloud], capsys)
    assert code == 2 and len(err) == 1
    fix = {
        "aws": "no AWS credentials: set AWS_PROFILE",
        "gcp": "gcloud is not on PATH: install the Google Cloud CLI",
        "azure": "az is not on PATH: install the Azure CLI",
    }[cloud]
    assert fix in err[0]
