"""``lrc status --stack S``: each serving group's phase now, read once from its main node. A
main node its channel cannot reach is looked up with the cloud: a stopped one (a spend guard's
power-off) is reported as ``stopped``, with the command that starts it."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

from infra.cli.deployed import NotReachable, reach, user_access
from infra.cli.options import command_parser, print_json, stack_options
from infra.core import outputs as keys
from infra.live import LiveError, live_cloud
from infra.observe.wait import GroupState, read_group


def stopped_groups(
    stack: str, found: dict[str, Any], states: list[GroupState], *, waiting: bool = False
) -> list[GroupState]:
    """The unreachable groups whose main node the cloud reports stopped, said so; the others
    with the node's state and, unless ``waiting`` already, the command that waits for them."""
    unreachable = [s for s in states if s.phase == "unreachable"]
    if not unreachable:
        return states
    mains = keys.main_ids(found)
    try:
        cloud = live_cloud(str(found.get(keys.CLOUD)))
        asked = [mains[s.group - 1] for s in unreachable]
        power = cloud.power_states(found, asked, user_access(stack, found))
    except LiveError:
        return states  # the channel's own error says enough
    return [
        said(state, power.get(mains[state.group - 1]), cloud.stopped_states, stack, waiting)
        for state in states
    ]


def said(
    state: GroupState, power: str | None, stopped: frozenset[str], stack: str, waiting: bool
) -> GroupState:
    """An unreachable group as its main node's power state explains it: stopped, with the
    command that starts it; or up but not answering yet (booting, its agent registering), with
    the command that waits for it."""
    if state.phase != "unreachable" or not power or (waiting and power not in stopped):
        return state
    if power in stopped:
        return dataclasses.replace(
            state, phase="stopped", detail=f"{power}: `lrc start --stack {stack}`"
        )
    return dataclasses.replace(
        state,
        detail=f"{state.detail}; the node is {power}: `lrc wait --stack {stack}` waits for it",
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = command_parser("status", __doc__, [stack_options()]).parse_args(argv)
    stack = args.stack
    try:
        found, channels = reach(stack)
    except NotReachable as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        states = [read_group(number, channel) for number, channel in enumerate(channels, 1)]
    except LiveError as error:  # this machine's side: no credentials, CLI or network
        print(f"error: stack {stack!r}: {error}", file=sys.stderr)
        return 2
    states = stopped_groups(stack, found, states)
    if args.json:
        print_json({"stack": stack, "groups": [dataclasses.asdict(s) for s in states]})
    else:
        print("\n".join(state.line() for state in states))
    return 0
