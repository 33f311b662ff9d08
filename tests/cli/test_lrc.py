"""``lrc``: one command for everything beside ``pulumi up``, installed by the project and run
from any directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra.cli import lrc as cli
from infra.cli import options
from infra.core.pins import LLAMA_CPP_COMMIT
from tests.conftest import LRC as INSTALLED
from tests.conftest import REPO


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    shown = capsys.readouterr().out
    for name, summary in cli.COMMANDS.items():
        assert f"  {name}" in shown and summary in shown
    for name, summary in cli.DEVELOPER_COMMANDS.items():  # run as any other, not listed
        assert f"  {name} " not in shown and summary not in shown
    assert cli.main([]) == 2  # nothing asked: the usage, as an error


def test_every_command_is_a_module_of_the_command_line_package() -> None:
    modules = {path.stem for path in (REPO / "infra" / "cli").glob("*.py")}
    assert set(cli.COMMANDS) | set(cli.DEVELOPER_COMMANDS) <= modules
    # What is not a command is what the commands share.
    shared = {"__init__", "lrc", "options", "deployed"}
    assert modules - set(cli.COMMANDS) - set(cli.DEVELOPER_COMMANDS) == shared


@pytest.mark.parametrize("name", [*cli.COMMANDS, *cli.DEVELOPER_COMMANDS])
def test_each_command_answers_help_version_and_a_usage_error_under_its_lrc_name(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([name, "--help"]) == 0
    assert capsys.readouterr().out.startswith(f"usage: lrc {name} ")
    assert cli.main([name, "--version"]) == 0
    assert capsys.readouterr().out.strip() == cli.version()
    assert cli.main([name, "--no-such-option"]) == 2
    assert f"usage: lrc {name}" in capsys.readouterr().err


def test_the_version_names_the_release_and_the_llama_cpp_it_builds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["--version"]) == 0
    shown = capsys.readouterr().out.strip()
    assert shown.startswith("lrc ") and LLAMA_CPP_COMMIT[:12] in shown
    assert "unknown" not in shown  # the project is installed: its version is known


def test_an_unknown_command_is_a_usage_error_naming_the_commands(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["deploy"]) == 2
    assert (
        "unknown command 'deploy'; the commands: plan, check, wait, status, start, top, exec"
        in capsys.readouterr().err
    )


def test_the_installed_command_runs_from_outside_the_checkout(tmp_path: Path) -> None:
    assert INSTALLED.is_file(), "the project's environment installs lrc (uv sync)"
    help_ = subprocess.run([INSTALLED, "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert help_.returncode == 0 and "commands:" in help_.stdout
    planned = subprocess.run(
        [INSTALLED, "plan", "llama-3.1-8b-q4_0", "--cloud", "aws", "--json"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["options"]
    # The boot files come with it: a node's cloud-config renders from here too.
    booted = subprocess.run(
        [INSTALLED, "boot", "--role", "worker"], capture_output=True, text=True, cwd=tmp_path
    )
    assert booted.returncode == 0 and booted.stdout.startswith("#cloud-config"), booted.stderr


# Where each command prints JSON: the command itself, or those of its subcommands that report.
JSON_COMMANDS = {
    "plan": [["plan"]], "check": [["check"]], "wait": [["wait"]], "status": [["status"]],
    "start": [["start"]], "top": [["top"]], "exec": [["exec"]], "stage": [["stage"]],
    "boot": [["boot"]], "k8s": [["k8s", "render"]], "prebuild": [["prebuild"]],
    "costrun": [["costrun", "status"]],
    "local": [["local", "up"], ["local", "status"], ["local", "top"], ["local", "start"]],
    "catalog": [["catalog", "show"]],
}  # fmt: skip


def test_every_command_prints_json_with_its_schema_version(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert set(JSON_COMMANDS) == set(cli.COMMANDS)
    for paths in JSON_COMMANDS.values():
        for path in paths:
            assert cli.main([*path, "--help"]) == 0
            shown = " ".join(capsys.readouterr().out.split())
            assert f"--json print JSON (schemaVersion {options.SCHEMA_VERSION})" in shown, path


@pytest.mark.slow
@pytest.mark.parallel_safe
@pytest.mark.parametrize("editable", [True, False], ids=["editable", "wheel"])
def test_the_tool_install_gives_every_command_in_any_directory(
    editable: bool, tmp_path: Path
) -> None:
    """`uv tool install --editable .`, as the README says, and `uv tool install .`, as a wheel
    goes (into directories of the test's; uv reads the package registry as an install does):
    every command from outside the checkout, the planner's chart, a node's boot and the shipped
    stacks included."""
    uv = shutil.which("uv") or str(Path.home() / ".local" / "bin" / "uv")
    env = {**os.environ, "UV_TOOL_DIR": str(tmp_path / "tools"),
           "UV_TOOL_BIN_DIR": str(tmp_path / "bin")}  # fmt: skip
    installed = subprocess.run(
        [uv, "tool", "install", "--python", sys.executable, *(["--editable"] if editable else []),
         "."],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=600,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    lrc = tmp_path / "bin" / "lrc"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    no_credentials = {
        **os.environ, "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/none",
        "AWS_EC2_METADATA_DISABLED": "true",
    }  # fmt: skip
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "LRC_PROJECT_DIR"):
        no_credentials.pop(name, None)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [lrc, *args], capture_output=True, text=True, cwd=elsewhere, env=no_credentials
        )

    listed = run("--help")
    assert listed.returncode == 0
    for name in cli.COMMANDS:
        assert f"  {name}" in listed.stdout
        shown = run(name, "--help")
        assert shown.returncode == 0 and shown.stdout.startswith(f"usage: lrc {name}"), name
    # Those that need no cloud, for real: a plan of a shipped stack with its chart, a node's
    # boot, the catalog; and a stack read before the account is asked.
    planned = run("plan", "--stack", "aws-c8g", "--json", "--chart", "c.png")
    assert planned.returncode == 0 and json.loads(planned.stdout)["options"], planned.stderr
    assert (elsewhere / "c.png").stat().st_size > 0
    assert run("boot", "--role", "main").stdout.startswith("#cloud-config")
    assert run("catalog", "show", "--cloud", "aws").returncode == 0
    checked = run("check", "--stack", "aws-c8g")
    assert (checked.returncode, checked.stderr.split(":")[:2]) == (
        2,
        ["preflight", " no AWS credentials"],
    )
    if not editable:  # the wheel's own copy of the files, not the checkout's
        site = next((tmp_path / "tools").rglob("site-packages"))
        assert (site / "infra" / "_files" / "cloud-init" / "scripts" / "lib.sh").is_file()
        assert (site / "infra" / "_files" / "stacks" / "Pulumi.aws-c8g.yaml").is_file()


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path: Path) -> None:
    """`lrc catalog show | head`: a reader that is gone before the output comes (here `true`)."""
    result = subprocess.run(
        ["bash", "-c", '"$LRC" catalog show | true; echo "${PIPESTATUS[0]}"'],
        env={**os.environ, "LRC": str(INSTALLED)}, capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert result.stdout.strip() == "1"
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr


def test_an_unknown_catalog_price_names_the_refresh_that_fetches_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["catalog", "show"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split()[:3] == ["cloud", "region", "instance"]
    advised = {
        row.split("(run `", 1)[1].split("`", 1)[0] for row in rows if "unknown (run `" in row
    }
    assert advised, "the fixture catalog has rows without a spot price"
    for command in advised:
        words = command.split()
        assert words[:3] == ["lrc", "catalog", "refresh"] and "--cloud" in words
        # The advice parses: argparse reads every option before it reaches --help.
        assert cli.main([*words[1:], "--help"]) == 0
        capsys.readouterr()


@pytest.mark.parametrize("name", ["check", "top"])
def test_a_stack_is_named_with_stack(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([name, "--stack", "no-such-stack"]) == 2
    assert "no-such-stack" in capsys.readouterr().err  # read as the stack, and not found
    assert cli.main([name]) == 2
    assert "the following arguments are required: --stack" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args",
    [
        ["check", "aws-c8g"],
        ["top", "aws-c8g"],
        ["k8s", "render", "aws-c8g", "--image", "r/i:1"],
        ["plan", "llama-3.1-8b-q4_0", "--provider", "aws"],
        ["catalog", "show", "--provider", "aws"],
        ["stage", "--region", "us-east-1", "--provider", "aws", "--bucket", "b", "--url", "https://h/a"],
        ["costrun", "run", "--stacks", "aws-c8g", "--dry-run"],
        ["local", "supervise", "/tmp/no-such-cluster"],
    ],
    ids=["bare-stack-check", "bare-stack-top", "bare-stack-k8s", "provider-plan",
         "provider-catalog", "provider-stage", "stacks-costrun", "local-supervise"],
)  # fmt: skip
def test_the_older_spellings_are_usage_errors(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A bare stack name, ``--provider`` and the cost run's ``--stacks a,b`` are gone: each is
    refused under the command's ``lrc`` name, and nothing is read or started."""
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: lrc {args[0]}") and "error:" in err


def test_a_cloud_is_named_with_cloud(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", "llama-3.1-8b-q4_0", "--cloud", "gcp", "--json"]) == 0
    assert {o["provider"] for o in json.loads(capsys.readouterr().out)["options"]} == {"gcp"}
    assert cli.main(["plan", "llama-3.1-8b-q4_0", "--cloud", "oci"]) == 2
    assert "--cloud" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args",
    [
        ["plan", "llama-3.1-8b-q4_0", "--cloud", "aws", "--json"],
        ["catalog", "show", "--json"],
        ["boot", "--role", "main", "--cloud", "azure", "--json"],
    ],
    ids=["plan", "catalog", "boot"],
)
def test_json_output_names_its_schema(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(args) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["schemaVersion"] == options.SCHEMA_VERSION
    assert len(document) > 1  # and says something


def test_the_boot_document_is_what_the_node_gets(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["boot", "--role", "worker", "--cloud", "aws", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["userData"].startswith("#cloud-config")
    delivery = document["delivery"]
    assert delivery["cloud"] == "aws" and delivery["bytes"] <= delivery["limitBytes"]


def test_help_as_a_command_and_a_typo_get_an_answer(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["help"]) == 0 and capsys.readouterr().out.startswith("usage: lrc ")
    assert cli.main(["help", "plan"]) == 0
    assert capsys.readouterr().out.startswith("usage: lrc plan ")
    assert cli.main(["plna"]) == 2
    assert "unknown command 'plna'; did you mean 'plan'?" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ("aws-c8g", "'aws-c8g' is a stack: `lrc plan --stack aws-c8g`"),
        ("gpt-oss-120b", "any other model is described by its GGUF's header, read over HTTP: "
                         "`lrc plan --gguf https://"),
    ],
)  # fmt: skip
def test_a_model_the_presets_lack_is_answered_with_the_way_to_plan_it(
    model: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["plan", model]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err


def test_check_as_json_says_why_it_has_no_answer(
    no_aws_credentials: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["check", "--stack", "aws-c8g", "--json"]) == 2
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert document["ready"] is None and document["error"].startswith("no AWS credentials")


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_help_reads_as_the_readme_does(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Single backticks, as the README writes a command; no RST's doubled ones."""
    assert cli.main([name, "--help"]) == 0
    assert "``" not in capsys.readouterr().out
