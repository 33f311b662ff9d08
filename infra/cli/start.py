"""``lrc start --stack S``: start a stack's nodes that a spend guard (stopAfterIdleMinutes,
stopAfterHours) or anyone else stopped, with the user's own cloud credentials. Each node boots
from its disk: nothing is rebuilt or downloaded again. ``lrc wait --stack S`` then shows every
group serving."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from infra.cli.deployed import NotReachable, deployed_outputs, user_access
from infra.cli.options import command_parser, print_json, stack_options
from infra.core import outputs as keys
from infra.live import AccessError, LiveError, live_cloud


def main(argv: Sequence[str] | None = None) -> int:
    args = command_parser("start", __doc__, [stack_options()]).parse_args(argv)
    stack = args.stack
    try:
        found = deployed_outputs(stack)
    except NotReachable as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        cloud = live_cloud(str(found.get(keys.CLOUD)))
        lines = cloud.start(found, keys.node_ids(found), user_access(stack, found))
    except AccessError as error:  # this machine's side: no credentials, CLI or network
        print(f"error: stack {stack!r}: {error}", file=sys.stderr)
        return 2
    except LiveError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.json:
        print_json({"stack": stack, "nodes": lines})
    else:
        print("\n".join(lines))
        print(f"\n`lrc wait --stack {stack}` shows every group serving again")
    return 0
