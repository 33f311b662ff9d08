"""``lrc status --stack S``: each serving group's phase now, read once from its main node."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence

from infra.cli.deployed import NotReachable, main_channels
from infra.cli.naming import prog
from infra.cli.options import add_json, add_stack, print_json, stack_of
from infra.observe.wait import read_group


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog("infra.cli.status"), description=__doc__)
    add_stack(parser, "a deployed stack, as `pulumi up --stack` named it")
    add_json(parser)
    args = parser.parse_args(argv)
    stack = stack_of(parser, args)
    try:
        channels = main_channels(stack)
    except NotReachable as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    states = [read_group(number, channel) for number, channel in enumerate(channels, 1)]
    if args.json:
        print_json({"stack": stack, "groups": [dataclasses.asdict(s) for s in states]})
    else:
        print("\n".join(state.line() for state in states))
    return 0
