"""The command channels that run a command as root on a stack's node and bring its output back:
AWS SSM ``send_command``, GCP SSH through Identity-Aware Proxy, Azure Run Command, and on the
local cluster ``lrc local exec``'s path. None opens a port: each goes through the
provider's own agent or tunnel, as ``connectCommand`` does.

``stack_channels(outputs, ...)`` gives one channel per serving group, to its main node.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from infra.boot.metrics_command import read_command
from infra.clouds import FACTS
from infra.core import outputs as keys

CLI_TIMEOUT_SECONDS = 3600.0


class Runner(Protocol):
    """Runs a cloud CLI; gives up (``ChannelError``) after ``timeout`` seconds."""

    def __call__(
        self, argv: Sequence[str], timeout: float = CLI_TIMEOUT_SECONDS
    ) -> subprocess.CompletedProcess[str]: ...


class ChannelError(RuntimeError):
    """The command did not run, or failed; the message says where and why."""


def run_cli(
    argv: Sequence[str], timeout: float = CLI_TIMEOUT_SECONDS
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            list(argv), capture_output=True, text=True, check=False, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise ChannelError(f"{' '.join(argv[:3])} did not finish in {timeout:g} s") from None


class Channel(Protocol):
    # The most output it brings back (characters); None: all of it.
    max_output: int | None

    def run(self, command: list[str], timeout: float) -> str: ...


RUN_SHELL_SCRIPT = "AWS-RunShellScript"


class SsmChannel:
    """AWS: ``AWS-RunShellScript`` through SSM, as root, polled until it ends. A command that one
    of ``documents`` runs exactly is sent as that document instead (the stack's metrics
    reading), so a watcher needs ``ssm:SendCommand`` on that document alone."""

    max_output = FACTS["aws"].command_output_chars

    def __init__(
        self,
        ssm: Any,
        instance_id: str,
        sleep: Callable[[float], None] = time.sleep,
        documents: Mapping[tuple[str, ...], str] | None = None,
    ):
        self.ssm, self.instance_id, self.sleep = ssm, instance_id, sleep
        self.documents = dict(documents or {})

    def run(self, command: list[str], timeout: float) -> str:
        document = self.documents.get(tuple(command))
        if document:
            sent = self.ssm.send_command(InstanceIds=[self.instance_id], DocumentName=document)
        else:
            sent = self.ssm.send_command(
                InstanceIds=[self.instance_id],
                DocumentName=RUN_SHELL_SCRIPT,
                Parameters={
                    "commands": [shlex.join(command)],
                    "executionTimeout": [str(int(timeout))],
                },
            )
        command_id = sent["Command"]["CommandId"]
        deadline = time.monotonic() + timeout + 60
        while True:
            self.sleep(2)
            try:
                result = self.ssm.get_command_invocation(
                    CommandId=command_id, InstanceId=self.instance_id
                )
            except self.ssm.exceptions.InvocationDoesNotExist:
                continue  # not registered yet
            if result["Status"] == "Success":
                return str(result["StandardOutputContent"])
            if result["Status"] in {"Failed", "Cancelled", "TimedOut", "Cancelling"}:
                raise ChannelError(
                    f"SSM {result['Status']} on {self.instance_id}: "
                    f"{result.get('StandardErrorContent', '').strip()[-500:]}"
                )
            if time.monotonic() > deadline:
                raise ChannelError(f"SSM command {command_id} still {result['Status']}")


class IapChannel:
    """GCP: SSH through Identity-Aware Proxy with gcloud, the command run with sudo."""

    max_output = FACTS["gcp"].command_output_chars

    def __init__(self, instance: str, zone: str, project: str, runner: Runner = run_cli):
        self.instance, self.zone, self.project, self.runner = instance, zone, project, runner

    def run(self, command: list[str], timeout: float) -> str:
        result = self.runner([
            "gcloud", "compute", "ssh", self.instance, "--zone", self.zone,
            "--project", self.project, "--tunnel-through-iap", "--quiet",
            "--command", f"sudo {shlex.join(command)}",
        ], timeout)  # fmt: skip
        if result.returncode != 0:
            raise ChannelError(
                f"gcloud compute ssh {self.instance}: {result.stderr.strip()[-500:]}"
            )
        return result.stdout


class RunCommandChannel:
    """Azure: Run Command (``RunShellScript``, as root); its message holds stdout and stderr.
    A VM runs one such command at a time."""

    max_output = FACTS["azure"].command_output_chars

    def __init__(self, vm: str, resource_group: str, runner: Runner = run_cli):
        self.vm, self.resource_group, self.runner = vm, resource_group, runner

    def run(self, command: list[str], timeout: float) -> str:
        result = self.runner([
            "az", "vm", "run-command", "invoke", "--resource-group", self.resource_group,
            "--name", self.vm, "--command-id", "RunShellScript",
            "--scripts", shlex.join(command), "--output", "json",
        ], timeout)  # fmt: skip
        if result.returncode != 0:
            raise ChannelError(f"az vm run-command on {self.vm}: {result.stderr.strip()[-500:]}")
        message = json.loads(result.stdout)["value"][0]["message"]
        stdout, _, stderr = message.partition("[stderr]")
        if "[stdout]" not in stdout:
            raise ChannelError(f"Run Command on {self.vm} said: {message[-500:]}")
        if stderr.strip() and not stdout.split("[stdout]", 1)[1].strip():
            raise ChannelError(f"Run Command on {self.vm}: {stderr.strip()[-500:]}")
        return str(stdout.split("[stdout]", 1)[1].strip("\n"))


def group_outputs(stack_outputs: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Each serving group's outputs, in order (a stack from before replicas: the top level)."""
    groups = stack_outputs.get(keys.GROUPS)
    return list(groups) if groups else [stack_outputs]


@dataclass(frozen=True)
class ChannelOptions:
    """What a channel needs beyond the stack's outputs: the user's SSM client (AWS), project
    (GCP) and the CLI runner (GCP, Azure)."""

    aws_ssm: Callable[[], Any] | None = None
    gcp_project: str = ""
    runner: Runner = run_cli


def named_output(stack_outputs: Mapping[str, Any], key: str, flag: str) -> str | None:
    """An output the channel needs; a stack deployed before the output existed names it in its
    ``connectCommand`` (``--zone``, ``--resource-group``)."""
    value = stack_outputs.get(key)
    if value:
        return str(value)
    found = re.search(rf"{flag}[ =](\S+)", str(stack_outputs.get(keys.CONNECT_COMMAND, "")))
    return found.group(1) if found else None


def _aws_channels(
    stack_outputs: Mapping[str, Any], mains: list[str], options: ChannelOptions
) -> list[Channel]:
    if options.aws_ssm is None:
        raise ChannelError("an SSM client is needed for an AWS stack")
    ssm = options.aws_ssm()
    document = stack_outputs.get(keys.METRICS_DOCUMENT)
    reading = tuple(read_command(SsmChannel.max_output))
    documents = {reading: str(document)} if document else {}
    return [SsmChannel(ssm, main, documents=documents) for main in mains]


def _gcp_channels(
    stack_outputs: Mapping[str, Any], mains: list[str], options: ChannelOptions
) -> list[Channel]:
    zone = named_output(stack_outputs, keys.ZONE, "--zone")
    if zone is None or not options.gcp_project:
        raise ChannelError(
            "a GCP stack's channel needs its zone (the stack's `zone` output) and project "
            "(gcp:project or GOOGLE_CLOUD_PROJECT)"
        )
    return [IapChannel(main, zone, options.gcp_project, options.runner) for main in mains]


def _azure_channels(
    stack_outputs: Mapping[str, Any], mains: list[str], options: ChannelOptions
) -> list[Channel]:
    group = named_output(stack_outputs, keys.RESOURCE_GROUP, "--resource-group")
    if group is None:
        raise ChannelError("the stack names no resource group (its `resourceGroup` output)")
    return [RunCommandChannel(main, group, options.runner) for main in mains]


# Each cloud's channels, by the stack's `cloud` output.
CHANNELS: Mapping[str, Callable[[Mapping[str, Any], list[str], ChannelOptions], list[Channel]]] = {
    "aws": _aws_channels,
    "gcp": _gcp_channels,
    "azure": _azure_channels,
}


def stack_channels(
    stack_outputs: Mapping[str, Any],
    *,
    aws_ssm: Callable[[], Any] | None = None,
    gcp_project: str = "",
    runner: Runner = run_cli,
) -> list[Channel]:
    """A channel to each serving group's main node, from the stack's outputs."""
    cloud = stack_outputs[keys.CLOUD]
    mains = [str(group[keys.MAIN_INSTANCE_ID]) for group in group_outputs(stack_outputs)]
    build = CHANNELS.get(cloud)
    if build is None:
        raise ChannelError(f"no command channel for cloud {cloud!r}")
    return build(stack_outputs, mains, ChannelOptions(aws_ssm, gcp_project, runner))
