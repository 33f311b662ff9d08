"""Everything that talks to a live cloud account, one module per cloud (``aws``, ``gcp``,
``azure``), each implementing ``LiveCloud``: the preflight's account reader, the command channel,
power on and state, the credentials check, the cost run's leftovers audit and the object store a
model is staged into. The commands, the program's preflight, the cost run and staging ask
``LIVE[cloud]``; a fourth cloud is one module and one line here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infra.core.outputs import CLOUD, main_ids
from infra.live import aws, azure, gcp
from infra.live.base import (
    CLI_TIMEOUT_SECONDS,
    Access,
    AccessError,
    Channel,
    ChannelError,
    CredentialsError,
    LiveCloud,
    LiveError,
    Piece,
    PowerError,
    Reader,
    Runner,
    StageError,
    Store,
    missing_cli,
    run_cli,
)

LIVE: Mapping[str, LiveCloud] = {
    cloud.name: cloud for cloud in (aws.Aws(), gcp.Gcp(), azure.Azure())
}


def live_cloud(name: str) -> LiveCloud:
    """The cloud's live operations; ``LiveError`` for a cloud there are none for."""
    if name not in LIVE:
        raise LiveError(f"no live operations for cloud {name!r}: the clouds are {', '.join(LIVE)}")
    return LIVE[name]


def stack_channels(stack_outputs: Mapping[str, Any], *, access: Access) -> list[Channel]:
    """A command channel to each serving group's main node, from the stack's outputs."""
    cloud = live_cloud(str(stack_outputs.get(CLOUD)))
    return cloud.channels(stack_outputs, main_ids(stack_outputs), access)


__all__ = [
    "CLI_TIMEOUT_SECONDS",
    "LIVE",
    "Access",
    "AccessError",
    "Channel",
    "ChannelError",
    "CredentialsError",
    "LiveCloud",
    "LiveError",
    "Piece",
    "PowerError",
    "Reader",
    "Runner",
    "StageError",
    "Store",
    "live_cloud",
    "missing_cli",
    "run_cli",
    "stack_channels",
]
