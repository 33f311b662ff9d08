"""The one reader of a stack's settings, as Pulumi resolves them, in every command: a stack whose
``apiKey`` is a Pulumi secret (``{secure: ...}`` in its file, as ``pulumi config set --secret``
writes it) is read without decrypting it where only its presence matters; a stack that takes
values from an ESC environment, or keeps its config in Pulumi Cloud, is read through the Pulumi
CLI (here a stand-in on PATH, answering ``pulumi config --json`` as the CLI does), and so is a
secret whose value is needed."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.cli import check, lrc
from infra.live import Access, Reader
from infra.preflight.account import Account
from infra.stack import files
from infra.stack.pulumi_cli import Secret

P = "llama-rpc-cluster:"
FakeBin = tuple[Path, Callable[[str, str], Path]]
SECURE = {"secure": "v1:Qmh3aGRzZmRzZGY=:hx8LR3kGxXn6Pp0sK1WWrQ0d0o3bQ2I="}
SALT = "v1:Pyf8Ud1TxIo=:v1:Z3h4dGVzdA==:Tm90IGEgcmVhbCBzYWx0"


def shipped(name: str) -> dict[str, Any]:
    """A shipped stack file's values, as written."""
    path = files.REPO / "stacks" / f"Pulumi.{name}.yaml"
    values: dict[str, Any] = yaml.safe_load(path.read_text())["config"]
    return values


def write_stack(stacks: Path, name: str, document: dict[str, Any]) -> None:
    stacks.mkdir(exist_ok=True)
    (stacks / f"Pulumi.{name}.yaml").write_text(yaml.safe_dump(document, sort_keys=False))


@pytest.fixture
def stacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stacks directory of the test's: the shipped aws-small as ``t-secret``, its apiKey a
    Pulumi secret and the passphrase provider's salt beside it, as `pulumi config set --secret`
    leaves the file."""
    directory = tmp_path / "stacks"
    values = shipped("aws-small") | {f"{P}apiKey": SECURE}
    write_stack(directory, "t-secret", {"encryptionsalt": SALT, "config": values})
    monkeypatch.setattr(files, "STACKS_DIR", directory)
    return directory


def pulumi_answering(
    fake_bin: FakeBin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    shown: dict[str, Any], revealed: dict[str, Any] | None = None,
) -> Path:  # fmt: skip
    """A stand-in ``pulumi`` first on PATH: ``config --json`` prints ``shown`` (with
    ``--show-secrets``, ``revealed``) in the CLI's own shape, and each command line is logged."""
    directory, write = fake_bin
    answers = tmp_path / "answers"
    answers.mkdir()
    for name, values in (("shown", shown), ("revealed", revealed or shown)):
        entries = {
            key: {"secret": True} if isinstance(value, Secret)
            else {"value": json.dumps(value), "objectValue": value, "secret": False}
            if isinstance(value, dict | list)
            else {"value": str(value), "secret": name == "revealed" and key.endswith("apiKey")}
            for key, value in values.items()
        }  # fmt: skip
        (answers / f"{name}.json").write_text(json.dumps(entries))
    log = tmp_path / "pulumi.log"
    write(
        "pulumi",
        f"""echo "$*" >> {log}
case "$*" in
  "config --json --show-secrets"*) cat {answers}/revealed.json ;;
  "config --json"*) cat {answers}/shown.json ;;
  "stack output --json"*) echo '{{"cloud": "aws", "region": "us-east-1", "mainInstanceId": "i"}}';;
  *) echo "error: unexpected: $*" >&2; exit 1 ;;
esac
""",
    )
    monkeypatch.setenv("PATH", f"{directory}{os.pathsep}{os.environ['PATH']}")
    return log


def no_pulumi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No Pulumi CLI anywhere on PATH."""
    empty = tmp_path / "no-pulumi"
    empty.mkdir(exist_ok=True)
    kept = [d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "pulumi").exists()]
    monkeypatch.setenv("PATH", os.pathsep.join([str(empty), *kept]))


def ready(cloud: str, access: Access) -> Reader:
    """An account that has whatever is asked of it."""
    return lambda needs: Account(
        cloud, needs.region, zone_offers={f"{needs.region}a": frozenset(needs.types)}
    )


def test_a_secret_api_key_is_known_set_without_pulumi(
    stacks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_pulumi(monkeypatch, tmp_path)
    values = files.stack_values("t-secret")
    assert values[f"{P}apiKey"] == Secret(f"{P}apiKey")
    config = files.stack_config("t-secret")
    assert config.api_key == "given"  # the nodes read the stack's own key, not a generated one
    assert config.boots(0)[0].api_key_file


@pytest.mark.parametrize(
    "command",
    [
        ["check"],
        ["plan"],
        ["costrun", "run", "--dry-run"],
        ["k8s", "render", "--image", "registry.example.com/llama:1@sha256:" + "0" * 64],
    ],
    ids=lambda c: c[0],
)
def test_every_command_reads_a_stack_whose_api_key_is_a_secret(
    command: list[str],
    stacks: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What broke after the documented `pulumi config set --secret apiKey KEY`: each command
    refused the stack (`apiKey: must be a non-empty string`)."""
    no_pulumi(monkeypatch, tmp_path)
    name, *rest = command
    if name == "k8s":  # a pod needs a whole CPU beside what Kubernetes keeps: not on c8g.large
        values = shipped("aws-small") | {f"{P}apiKey": SECURE, f"{P}instanceType": "c8g.2xlarge"}
        write_stack(stacks, "t-secret", {"encryptionsalt": SALT, "config": values})
    if name == "check":
        code = check.main(["--stack", "t-secret"], reader_for=ready)
    else:
        extra = ["--out", str(tmp_path / "out")] if name == "costrun" else []
        code = lrc.main([name, *rest[:1], "--stack", "t-secret", *rest[1:], *extra])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "apiKey" not in err


def test_the_api_key_is_decrypted_by_pulumi_only_where_its_value_is_needed(
    stacks: Path, fake_bin: FakeBin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = shipped("aws-small")
    log = pulumi_answering(
        fake_bin, tmp_path, monkeypatch,
        shown=plain | {f"{P}apiKey": Secret(f"{P}apiKey")},
        revealed=plain | {f"{P}apiKey": "k" * 32},
    )  # fmt: skip
    assert isinstance(files.stack_values("t-secret")[f"{P}apiKey"], Secret)
    assert not log.exists()  # the file alone said enough
    assert files.stack_values("t-secret", reveal=True)[f"{P}apiKey"] == "k" * 32
    assert log.read_text().split() == [
        "config", "--json", "--show-secrets", "--stack", "t-secret", "--non-interactive",
    ]  # fmt: skip


def test_a_secret_that_a_setting_reads_is_decrypted_by_pulumi(
    stacks: Path, fake_bin: FakeBin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value the program reads as any other (here the AWS profile), kept as a secret."""
    values = shipped("aws-small")
    write_stack(stacks, "t-profile", {"config": values | {"aws:profile": SECURE}})
    pulumi_answering(fake_bin, tmp_path, monkeypatch, shown=values | {"aws:profile": "team"})
    assert files.stack_values("t-profile")["aws:profile"] == "team"
    no_pulumi(monkeypatch, tmp_path)
    with pytest.raises(files.StackFileError, match=r"aws:profile is read through the Pulumi CLI"):
        files.stack_values("t-profile")


def test_values_from_an_esc_environment_are_read_through_pulumi(
    stacks: Path,
    fake_bin: FakeBin,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The region comes from the environment's pulumiConfig, not the file; Pulumi merges them
    (`pulumi config --json`), as `pulumi up` does."""
    values = shipped("aws-small")
    in_file = {key: value for key, value in values.items() if key != "aws:region"}
    write_stack(stacks, "t-esc", {"environment": ["myorg/aws-prod"], "config": in_file})
    log = pulumi_answering(fake_bin, tmp_path, monkeypatch, shown=values)
    assert files.stack_config("t-esc").region == "us-east-1"
    assert lrc.main(["plan", "--stack", "t-esc"]) == 0
    assert "config --json --stack t-esc" in log.read_text()
    capsys.readouterr()
    no_pulumi(monkeypatch, tmp_path)
    assert lrc.main(["plan", "--stack", "t-esc"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err]
    assert "its ESC environment (myorg/aws-prod) is read through the Pulumi CLI" in err
    assert "install it (https://www.pulumi.com/docs/install/)" in err


def test_a_stack_whose_config_pulumi_cloud_keeps_needs_no_file_here(
    stacks: Path,
    fake_bin: FakeBin,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pulumi_answering(fake_bin, tmp_path, monkeypatch, shown=shipped("aws-small"))
    assert files.stack_config("team-stack").instance_type.name == "c8g.large"
    assert check.main(["--stack", "team-stack"], reader_for=ready) == 0
    capsys.readouterr()
    no_pulumi(monkeypatch, tmp_path)
    assert check.main(["--stack", "team-stack"], reader_for=ready) == 2
    err = capsys.readouterr().err
    assert "stack 'team-stack': no " in err and "Pulumi.team-stack.yaml; the stacks are" in err


def test_the_commands_that_reach_a_deployed_stack_read_its_secret_stack_file(
    *,
    stacks: Path,
    no_aws_credentials: None,
    fake_bin: FakeBin,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`lrc status` reads the outputs through Pulumi and the stack file (its aws:profile) as
    every command does: with no AWS credentials here, the one line that says so."""
    pulumi_answering(fake_bin, tmp_path, monkeypatch, shown=shipped("aws-small"))
    for command in (["status"], ["start"], ["exec", "--", "uptime"]):
        assert lrc.main([command[0], "--stack", "t-secret", *command[1:]]) == 2
        err = capsys.readouterr().err.strip()
        assert err.splitlines() == [err] and "no AWS credentials" in err


def test_the_stacks_are_those_of_the_project_lrc_runs_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LRC_PROJECT_DIR, else this directory's Pulumi project or one above it (this project's
    name, its stackConfigDir), else lrc's own: the checkout, or the copy a wheel carries."""
    monkeypatch.delenv(files.PROJECT_VARIABLE, raising=False)
    mine = tmp_path / "my-copy"
    (mine / "config" / "deep").mkdir(parents=True)
    (mine / "Pulumi.yaml").write_text("name: llama-rpc-cluster\nstackConfigDir: config\n")
    other = tmp_path / "other"
    other.mkdir()
    (other / "Pulumi.yaml").write_text("name: something-else\n")
    assert files.find_project(mine / "config" / "deep") == mine
    assert files._stacks_dir(mine) == mine / "config"
    assert files.find_project(other) == files.REPO  # another project's directory: lrc's own
    assert files.find_project(other, {files.PROJECT_VARIABLE: str(mine)}) == mine
    assert (files.REPO / "stacks" / "Pulumi.aws-c8g.yaml").is_file()
