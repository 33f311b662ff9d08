"""``python -m infra.top STACK``: what every node of a deployed stack is doing, refreshed live
(``infra.observe.top``).

    lrc top --stack STACK [--interval S] [--once | --json]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from infra.cli.deployed import NotReachable, reach
from infra.cli.naming import prog
from infra.cli.options import add_json, add_stack, json_text, stack_of
from infra.observe.top import DEFAULT_INTERVAL_SECONDS, run, stack_groups
from infra.observe.topview import Row, rows_data


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog("infra.top"), description=(__doc__ or "").split("\n")[0]
    )
    add_stack(parser, "a deployed stack, as `pulumi up --stack` named it")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_SECONDS)
    parser.add_argument("--once", action="store_true", help="print one frame and stop")
    add_json(parser)  # one reading's rows, over one interval
    args = parser.parse_args(argv)
    args.stack = stack_of(parser, args)
    if args.interval <= 0:
        parser.error(f"--interval {args.interval}: give a positive number of seconds")
    try:
        found, channels = reach(args.stack)
    except NotReachable as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    def as_json(rows: list[Row]) -> str:
        return json_text({"stack": args.stack, "interval": args.interval, "nodes": rows_data(rows)})

    return run(
        args.stack, stack_groups(found, channels), interval=args.interval, once=args.once,
        draw_rows=as_json if args.json else None,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
