"""``lrc wait --stack S``: after ``pulumi up``, wait until every serving group of the stack
serves, showing each group's boot phase as it changes."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from infra.cli.naming import prog
from infra.cli.options import add_stack, stack_of
from infra.core import outputs as keys
from infra.observe.channels import ChannelError, stack_channels
from infra.observe.wait import GroupState, WaitError, wait_until_serving


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog("infra.cli.wait"), description=__doc__)
    add_stack(parser, "a deployed stack, as `pulumi up --stack` named it")
    parser.add_argument(
        "--timeout", type=float, default=7200, help="seconds to wait (default 7200)"
    )
    parser.add_argument("--interval", type=float, default=15, help="seconds between reads")
    args = parser.parse_args(argv)
    stack = stack_of(parser, args)
    if args.timeout <= 0 or args.interval <= 0:
        parser.error("--timeout and --interval: give positive numbers of seconds")
    from infra import top  # noqa: PLC0415 (the Automation API: only when run)

    try:
        outputs = top.stack_outputs(stack)
    except Exception as error:  # noqa: BLE001 (any reason the outputs are unreadable ends in exit 2, with it)
        print(f"cannot read stack {stack!r}'s outputs: {error}", file=sys.stderr)
        return 2
    if not outputs:
        print(f"stack {stack!r} has no outputs: deploy it with `pulumi up`", file=sys.stderr)
        return 2
    try:
        channels = stack_channels(
            outputs,
            aws_ssm=lambda: top._ssm_client(str(outputs[keys.REGION])),
            gcp_project=top._gcp_project(stack),
        )
    except ChannelError as error:
        print(f"stack {stack!r}: {error}", file=sys.stderr)
        return 2
    started = time.monotonic()

    def report(state: GroupState) -> None:
        print(f"{time.monotonic() - started:6.0f}s  {state.line()}", file=sys.stderr)

    try:
        wait_until_serving(channels, timeout=args.timeout, interval=args.interval, report=report)
    except WaitError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"stack {stack!r} serves: every group answered `serving`")
    return 0
