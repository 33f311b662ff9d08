"""``lrc top --stack S``: what every node of a deployed stack is doing, refreshed live."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from infra.cli.deployed import NotReachable, reach
from infra.cli.options import command_parser, json_text, stack_options
from infra.live import LiveError
from infra.observe.top import DEFAULT_INTERVAL_SECONDS, run, stack_groups
from infra.observe.topview import Row, rows_data


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("top", __doc__, [stack_options()])  # --json: one reading's rows
    parser.add_argument(
        "--interval", type=float, default=DEFAULT_INTERVAL_SECONDS,
        help="seconds between frames, at least (default %(default)g; a channel may be slower)",
    )  # fmt: skip
    parser.add_argument("--once", action="store_true", help="print one frame and stop")
    args = parser.parse_args(argv)
    if args.interval <= 0:
        parser.error(f"--interval {args.interval}: give a positive number of seconds")
    try:
        found, channels = reach(args.stack)
    except NotReachable as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    def as_json(rows: list[Row]) -> str:
        return json_text({"stack": args.stack, "interval": args.interval, "nodes": rows_data(rows)})

    try:
        return run(
            args.stack, stack_groups(found, channels), interval=args.interval, once=args.once,
            draw_rows=as_json if args.json else None,
        )  # fmt: skip
    except LiveError as error:  # this machine's side: no credentials, CLI or network
        print(f"error: stack {args.stack!r}: {error}", file=sys.stderr)
        return 2
