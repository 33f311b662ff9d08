"""The live operations' registry: every cloud of the facts has one, each implements every
operation, and the commands that reach the same account from the same inputs reach it the same
way (the GCP project, the missing-credentials sentences). Nothing here reaches a network: gcloud
is a script of the test's on PATH."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
import yaml

from infra.cli import check, deployed, lrc
from infra.clouds import FACTS
from infra.core import outputs
from infra.costrun.cloud import PulumiTarget
from infra.live import LIVE, Access, LiveCloud, Reader
from infra.stack import files

OPERATIONS = sorted(LiveCloud.__abstractmethods__)
# What each cloud states about itself beside its operations (the interface's annotations).
STATEMENTS = sorted(LiveCloud.__annotations__)


def test_every_cloud_with_facts_has_its_live_operations() -> None:
    assert set(LIVE) == set(FACTS)
    assert all(cloud.name == name for name, cloud in LIVE.items())


@pytest.mark.parametrize("name", sorted(LIVE))
def test_each_cloud_implements_every_live_operation_in_its_own_module(name: str) -> None:
    assert {"cli_reader", "program_reader", "credentials", "channels", "start"} <= set(OPERATIONS)
    assert {"power_states", "leftovers", "check_bucket", "open_store"} <= set(OPERATIONS)
    implementation = type(LIVE[name])
    for operation in OPERATIONS:
        method = getattr(implementation, operation)
        assert method.__module__ == f"infra.live.{name}", f"{name} lacks {operation}"
        assert not getattr(method, "__isabstractmethod__", False), f"{name} lacks {operation}"
    missing = [s for s in STATEMENTS if not any(s in vars(c) for c in implementation.__mro__[:-3])]
    assert not missing, f"{name} does not say {missing}"


def test_a_cloud_that_leaves_an_operation_out_cannot_be_made() -> None:
    every = {op: getattr(type(LIVE["aws"]), op) for op in OPERATIONS}
    del every["leftovers"]
    partial = type("Partial", (LiveCloud,), every)
    with pytest.raises(TypeError, match="leftovers"):
        partial()


# --- the same account from the same inputs -------------------------------------------------------

GCLOUD = """echo "$*" >> "$GCLOUD_LOG"
case "$1 $2" in
  "config get-value") echo "$GCLOUD_CONFIG_PROJECT" ;;
  "auth print-access-token") echo token ;;
  "compute ssh") echo '{"phase": "serving"}' ;;
  "compute instances"|"compute disks"|"compute addresses") echo '[]' ;;
  *) echo "unexpected: $*" >&2; exit 2 ;;
esac
"""


@pytest.fixture
def gcloud(
    fake_bin: tuple[Path, Callable[[str, str], Path]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Path:
    """A gcloud of the test's on PATH, logging each command line; its configured project is
    GCLOUD_CONFIG_PROJECT's."""
    directory, write = fake_bin
    write("gcloud", GCLOUD)
    log = tmp_path / "gcloud.log"
    monkeypatch.setenv("PATH", f"{directory}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("GCLOUD_LOG", str(log))
    return log


def gcp_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, project: str | None) -> str:
    """The shipped GCP stack as ``gcp-test`` in a stacks directory of the test's, with
    ``gcp:project`` when given."""
    values = files.stack_values("gcp-c4a")
    if project:
        values["gcp:project"] = project
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "Pulumi.gcp-test.yaml").write_text(yaml.safe_dump({"config": values}))
    monkeypatch.setattr(files, "STACKS_DIR", stacks)
    return "gcp-test"


def asked_projects(log: Path, command: str) -> set[str]:
    """The ``--project`` of every logged gcloud command line that starts with ``command``."""
    found = set()
    for line in log.read_text().splitlines():
        if line.startswith(command):
            words = line.split()
            found.add(words[words.index("--project") + 1])
    return found


@pytest.mark.parametrize(
    ("in_stack_file", "in_environment", "in_gcloud", "expected"),
    [
        ("from-file", "from-env", "from-config", "from-file"),
        (None, "from-env", "from-config", "from-env"),
        (None, None, "from-config", "from-config"),
    ],
    ids=["stack-file", "environment", "gcloud-config"],
)
def test_check_status_and_the_cost_run_read_the_same_gcp_project(
    *,
    in_stack_file: str | None,
    in_environment: str | None,
    in_gcloud: str,
    expected: str,
    gcloud: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The stack file's gcp:project, then GOOGLE_CLOUD_PROJECT, then gcloud's own, whichever
    command asks."""
    stack = gcp_stack(tmp_path, monkeypatch, in_stack_file)
    if in_environment:
        monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", in_environment)
    else:
        monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    monkeypatch.setenv("GCLOUD_CONFIG_PROJECT", in_gcloud)

    # lrc check: the Compute Engine API, asked with the project in every path.
    asked: list[str] = []

    def denied(
        url: str,
        headers: Mapping[str, str],
        body: bytes | None = None,
    ) -> tuple[int, bytes]:
        asked.append(url)
        return 403, b'{"error": {"code": 403, "message": "recorded"}}'

    def reader_for(cloud: str, access: Access) -> Reader:
        return LIVE[cloud].cli_reader(dataclasses.replace(access, transport=denied))

    check.main(["--stack", stack], reader_for=reader_for)
    assert "preflight:" not in capsys.readouterr().err
    # The project in every path (Resource Manager's: projects/PROJECT:testIamPermissions).
    checked = {re.split(r"[/:]", url.split("/projects/", 1)[1], maxsplit=1)[0] for url in asked}

    # lrc status: the main node through IAP SSH.
    found = {
        outputs.CLOUD: "gcp", outputs.REGION: "us-central1", outputs.ZONE: "us-central1-a",
        outputs.MAIN_INSTANCE_ID: "gcp-test-main",
    }  # fmt: skip
    monkeypatch.setattr(deployed, "stack_outputs", lambda name: found)
    assert lrc.main(["status", "--stack", stack]) == 0
    assert capsys.readouterr().out.strip() == "group 1: serving"

    # The cost run: its credentials check and its audit.
    target = PulumiTarget(stack)
    assert target.live.credentials(target.access) == []
    assert target.leftovers() == []

    assert checked == asked_projects(gcloud, "compute ssh") == {expected}
    assert asked_projects(gcloud, "compute instances list") == {expected}


def test_check_and_the_cost_run_name_missing_credentials_alike(
    no_aws_credentials: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no gcloud, no az
    for stack in ("aws-c8g", "gcp-c4a", "azure-cobalt"):
        assert check.main(["--stack", stack]) == 2
        said = capsys.readouterr().err.strip().removeprefix("preflight: ")
        target = PulumiTarget(stack)
        assert said in target.live.credentials(target.access), stack
        assert said.startswith(("no AWS credentials", "gcloud is not on PATH", "az is not on"))


def test_every_aws_call_uses_the_stacks_profile(
    no_aws_credentials: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The preflight, the credentials check and every client (channels, power, audits) read the
    account of the stack file's ``aws:profile``, the one `pulumi up` deploys to."""
    from infra.live import aws as live_aws

    credentials = tmp_path / "credentials"
    credentials.write_text("[team]\naws_access_key_id = AKIATEAM\naws_secret_access_key = s\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    team = Access("us-east-1", {"aws:profile": "team"})
    assert LIVE["aws"].credentials(team) == []
    assert LIVE["aws"].credentials(Access("us-east-1")) == [live_aws.NO_CREDENTIALS]
    for service in ("ssm", "ec2", "resourcegroupstaggingapi"):
        signer = live_aws.client(team, service)._request_signer
        assert signer._credentials.access_key == "AKIATEAM", service
