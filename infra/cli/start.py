"""``lrc start --stack S``: start a stack's nodes that a spend guard (stopAfterIdleMinutes,
stopAfterHours) or anyone else stopped, with the user's own cloud credentials. Each node boots
from its disk: nothing is rebuilt or downloaded again. ``lrc wait --stack S`` then shows every
group serving."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from infra.cli.deployed import NotReachable, deployed_outputs
from infra.cli.naming import prog
from infra.cli.options import add_json, add_stack, print_json, stack_of
from infra.cli.power import StartError, start


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog("infra.cli.start"), description=__doc__)
    add_stack(parser, "a deployed stack, as `pulumi up --stack` named it")
    add_json(parser)
    args = parser.parse_args(argv)
    stack = stack_of(parser, args)
    try:
        found = deployed_outputs(stack)
    except NotReachable as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        lines = start(stack, found)
    except StartError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.json:
        print_json({"stack": stack, "nodes": lines})
    else:
        print("\n".join(lines))
        print(f"\n`lrc wait --stack {stack}` shows every group serving again")
    return 0
