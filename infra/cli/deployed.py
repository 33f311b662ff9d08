"""A deployed stack as the commands reach it: its outputs (Pulumi's Automation API) and a
command channel to each serving group's main node."""

from __future__ import annotations

import os
from typing import Any

from infra.core import outputs as keys
from infra.core.limits import KUBERNETES
from infra.observe.channels import Channel, ChannelError, stack_channels


class NotReachable(RuntimeError):
    """The stack's outputs or nodes cannot be reached; the message says why (exit 2)."""


def stack_outputs(stack: str) -> dict[str, Any]:
    """The deployed stack's outputs, from its Pulumi state (the CLI must be logged in)."""
    from pulumi import automation  # noqa: PLC0415 (the Automation API: only when run)

    from infra.stack.files import REPO  # noqa: PLC0415

    selected = automation.select_stack(stack_name=stack, work_dir=str(REPO))
    return {key: item.value for key, item in selected.outputs().items()}


def deployed_outputs(stack: str) -> dict[str, Any]:
    """The outputs of a stack that is deployed; NotReachable says why there are none."""
    try:
        found = stack_outputs(stack)
    except Exception as error:  # noqa: BLE001 (any reason the outputs are unreadable is said)
        raise NotReachable(f"cannot read stack {stack!r}'s outputs: {error}") from None
    if not found:
        raise NotReachable(f"stack {stack!r} has no outputs: deploy it with `pulumi up`")
    if found.get(keys.PLATFORM) == KUBERNETES:
        namespace = found.get(keys.KUBERNETES_NAMESPACE)
        raise NotReachable(
            f"stack {stack!r} runs on Kubernetes, whose pods this command cannot reach (it "
            f"reads VMs through the cloud's command channel): `kubectl -n {namespace} get "
            f"pods` and `kubectl -n {namespace} logs POD` show them, once the first half of "
            "connectCommand has set kubectl up"
        )
    return found


def reach(stack: str) -> tuple[dict[str, Any], list[Channel]]:
    """The stack's outputs and a channel to each serving group's main node."""
    found = deployed_outputs(stack)
    try:
        channels = stack_channels(
            found,
            aws_ssm=lambda: _ssm_client(str(found[keys.REGION])),
            gcp_project=gcp_project(stack),
        )
    except ChannelError as error:
        raise NotReachable(f"stack {stack!r}: {error}") from None
    return found, channels


def main_channels(stack: str) -> list[Channel]:
    return reach(stack)[1]


def _ssm_client(region: str) -> Any:
    import boto3  # noqa: PLC0415

    return boto3.client("ssm", region_name=region)


def gcp_project(stack: str) -> str:
    from infra.stack.files import stack_values  # noqa: PLC0415

    try:
        configured = stack_values(stack).get("gcp:project")
    except Exception:  # noqa: BLE001 (a stack without a file here: the environment may name the project)
        configured = None
    return str(configured or os.environ.get("GOOGLE_CLOUD_PROJECT", ""))
