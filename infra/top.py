"""``python -m infra.top STACK``: what every node of a deployed stack is doing, refreshed live
(``infra.observe.top``).

    python -m infra.top STACK [--interval S] [--once]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from infra.cli.naming import prog
from infra.cli.options import add_stack, stack_of
from infra.core import outputs as keys
from infra.observe.channels import ChannelError, stack_channels
from infra.observe.top import DEFAULT_INTERVAL_SECONDS, run, stack_groups


def stack_outputs(stack: str) -> dict[str, Any]:
    """The deployed stack's outputs, from its Pulumi state (the CLI must be logged in)."""
    from pulumi import automation  # noqa: PLC0415

    from infra.stack.files import REPO  # noqa: PLC0415

    selected = automation.select_stack(stack_name=stack, work_dir=str(REPO))
    return {key: item.value for key, item in selected.outputs().items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog("infra.top"), description=(__doc__ or "").split("\n")[0]
    )
    add_stack(parser, "a deployed stack, as `pulumi up --stack` named it")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_SECONDS)
    parser.add_argument("--once", action="store_true", help="print one frame and stop")
    args = parser.parse_args(argv)
    args.stack = stack_of(parser, args)
    if args.interval <= 0:
        parser.error(f"--interval {args.interval}: give a positive number of seconds")
    try:
        found = stack_outputs(args.stack)
    except Exception as error:  # noqa: BLE001 (any reason the outputs are unreadable ends in exit 2, with it)
        print(f"cannot read stack {args.stack!r}'s outputs: {error}", file=sys.stderr)
        return 2
    if not found:
        print(f"stack {args.stack!r} has no outputs: deploy it with `pulumi up`", file=sys.stderr)
        return 2
    try:
        channels = stack_channels(
            found,
            aws_ssm=lambda: _ssm_client(str(found[keys.REGION])),
            gcp_project=_gcp_project(args.stack),
        )
    except ChannelError as error:
        print(f"stack {args.stack!r}: {error}", file=sys.stderr)
        return 2
    return run(args.stack, stack_groups(found, channels), interval=args.interval, once=args.once)


def _ssm_client(region: str) -> Any:
    import boto3  # noqa: PLC0415

    return boto3.client("ssm", region_name=region)


def _gcp_project(stack: str) -> str:
    from infra.stack.files import stack_values  # noqa: PLC0415

    try:
        configured = stack_values(stack).get("gcp:project")
    except Exception:  # noqa: BLE001 (a stack without a file here: the environment may name the project)
        configured = None
    return str(configured or os.environ.get("GOOGLE_CLOUD_PROJECT", ""))


if __name__ == "__main__":
    sys.exit(main())
