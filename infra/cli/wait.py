"""``lrc wait --stack S``: after ``pulumi up``, wait until every serving group of the stack
serves, showing each group's boot phase as it changes."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence

from infra.cli.deployed import NotReachable, reach
from infra.cli.options import command_parser, print_json, stack_options
from infra.cli.status import stopped_groups
from infra.live import LiveError
from infra.observe.wait import GroupState, WaitError, wait_until_serving


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("wait", __doc__, [stack_options()])
    parser.add_argument(
        "--timeout", type=float, default=7200, help="seconds to wait (default 7200)"
    )
    parser.add_argument("--interval", type=float, default=15, help="seconds between reads")
    args = parser.parse_args(argv)
    stack = args.stack
    if args.timeout <= 0 or args.interval <= 0:
        parser.error("--timeout and --interval: give positive numbers of seconds")
    try:
        found, channels = reach(stack)
    except NotReachable as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    started = time.monotonic()

    def report(state: GroupState) -> None:
        print(f"{time.monotonic() - started:6.0f}s  {state.line()}", file=sys.stderr)

    try:
        states = wait_until_serving(
            channels, timeout=args.timeout, interval=args.interval, report=report,
            explain=lambda states: stopped_groups(stack, found, states, waiting=True),
        )  # fmt: skip
    except LiveError as error:  # this machine's side: no credentials, CLI or network
        print(f"error: stack {stack!r}: {error}", file=sys.stderr)
        return 2
    except WaitError as error:
        print(f"error: {error}", file=sys.stderr)
        if args.json:
            print_json({"stack": stack, "serving": False, "error": str(error)})
        return 1
    if args.json:
        groups = [dataclasses.asdict(state) for state in states]
        print_json({"stack": stack, "serving": True, "groups": groups})
    else:
        print(f"stack {stack!r} serves: every group answered `serving`")
    return 0
