"""A deployed stack as the commands reach it: its outputs (Pulumi's Automation API), the user's
way into its account, and a command channel to each serving group's main node."""

from __future__ import annotations

from typing import Any

from infra.core import outputs as keys
from infra.core.limits import KUBERNETES
from infra.live import Access, Channel, LiveError, run_cli, stack_channels


class NotReachable(RuntimeError):
    """The stack's outputs or nodes cannot be reached; the message says why and what to do
    (exit 2)."""


def stack_outputs(stack: str) -> dict[str, Any]:
    """The deployed stack's outputs, from its Pulumi state (``pulumi stack output --json``, in
    the project's directory); ``PulumiError`` names what is missing (the CLI, a login, the
    stack, its passphrase)."""
    from infra.stack import pulumi_cli  # noqa: PLC0415
    from infra.stack.files import project_dir  # noqa: PLC0415

    return pulumi_cli.outputs(stack, project_dir())


def deployed_outputs(stack: str) -> dict[str, Any]:
    """The outputs of a stack that is deployed; NotReachable says why there are none."""
    from infra.stack.pulumi_cli import PulumiError  # noqa: PLC0415

    try:
        found = stack_outputs(stack)
    except PulumiError as error:
        raise NotReachable(f"cannot read the outputs of stack {stack!r}: {error}") from None
    if not found:
        raise NotReachable(
            f"stack {stack!r} has no outputs: deploy it with `pulumi up --stack {stack}`"
        )
    if found.get(keys.PLATFORM) == KUBERNETES:
        namespace = found.get(keys.KUBERNETES_NAMESPACE)
        raise NotReachable(
            f"stack {stack!r} runs on Kubernetes, whose pods this command cannot reach (it "
            f"reads VMs through the cloud's command channel): `kubectl -n {namespace} get "
            f"pods` and `kubectl -n {namespace} logs POD` show them, once the first half of "
            "connectCommand has set kubectl up"
        )
    return found


def user_access(stack: str, found: dict[str, Any]) -> Access:
    """The user's own way into the deployed stack's account: its region, and its stack file's
    values where there is one here (``gcp:project``)."""
    from infra.stack.files import stack_values  # noqa: PLC0415

    try:
        values = stack_values(stack)
    except Exception:  # noqa: BLE001 (a stack without a file here: the environment may say)
        values = {}
    return Access(str(found.get(keys.REGION, "")), values, runner=run_cli)


def reach(stack: str) -> tuple[dict[str, Any], list[Channel]]:
    """The stack's outputs and a channel to each serving group's main node."""
    found = deployed_outputs(stack)
    try:
        channels = stack_channels(found, access=user_access(stack, found))
    except LiveError as error:
        raise NotReachable(f"stack {stack!r}: {error}") from None
    return found, channels


def main_channels(stack: str) -> list[Channel]:
    return reach(stack)[1]
