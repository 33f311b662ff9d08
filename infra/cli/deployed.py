"""A deployed stack as the commands reach it: its outputs (Pulumi's Automation API) and a
command channel to each serving group's main node."""

from __future__ import annotations

from infra.core import outputs as keys
from infra.observe.channels import Channel, ChannelError, stack_channels


class NotReachable(RuntimeError):
    """The stack's outputs or nodes cannot be reached; the message says why (exit 2)."""


def main_channels(stack: str) -> list[Channel]:
    from infra import top  # noqa: PLC0415 (the Automation API: only when run)

    try:
        found = top.stack_outputs(stack)
    except Exception as error:  # noqa: BLE001 (any reason the outputs are unreadable is said)
        raise NotReachable(f"cannot read stack {stack!r}'s outputs: {error}") from None
    if not found:
        raise NotReachable(f"stack {stack!r} has no outputs: deploy it with `pulumi up`")
    try:
        return stack_channels(
            found,
            aws_ssm=lambda: top._ssm_client(str(found[keys.REGION])),
            gcp_project=top._gcp_project(stack),
        )
    except ChannelError as error:
        raise NotReachable(f"stack {stack!r}: {error}") from None
