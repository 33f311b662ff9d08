"""``lrc exec --stack S [--group N] -- COMMAND...``: run a command as root on a serving group's
main node, through the cloud's command channel (SSM, IAP SSH, Run Command), and print its output.
The workers take no commands: they have no identity and admit nothing but their main node."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from infra.cli.deployed import NotReachable, main_channels
from infra.cli.options import command_parser, print_json, stack_options
from infra.live import AccessError, ChannelError


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("exec", __doc__, [stack_options()])
    parser.add_argument("--group", type=int, default=1, help="the serving group (default 1)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds (default 600)")
    parser.add_argument("command_line", nargs=argparse.REMAINDER, help="-- COMMAND...")
    args = parser.parse_args(argv)
    command = args.command_line[1:] if args.command_line[:1] == ["--"] else args.command_line
    stack = args.stack
    if not command:
        parser.error("give a command after --: lrc exec --stack NAME -- COMMAND...")
    if args.timeout <= 0:
        parser.error(f"--timeout {args.timeout:g}: give a positive number of seconds")
    try:
        channels = main_channels(stack)
    except NotReachable as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not 1 <= args.group <= len(channels):
        parser.error(f"--group {args.group}: the stack has {len(channels)} serving group(s)")
    try:
        output = channels[args.group - 1].run(command, args.timeout)
    except AccessError as error:  # this machine's side: no credentials, CLI or network
        print(f"error: stack {stack!r}: {error}", file=sys.stderr)
        return 2
    except ChannelError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.json:
        print_json({"stack": stack, "group": args.group, "command": command, "output": output})
    else:
        sys.stdout.write(output)
    return 0
