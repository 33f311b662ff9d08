"""Print the cloud-config a node of the reference layout boots with.

python -m infra.boot --role worker|main [--cloud CLOUD] [--encoded]
"""

from __future__ import annotations

import argparse
import sys

from infra.boot.deliver import deliver
from infra.boot.node import example
from infra.boot.render import render
from infra.cli.naming import prog
from infra.cli.options import add_json, print_json
from infra.clouds import FACTS
from infra.core.limits import ROLES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog("infra.boot"), description="Print the cloud-config a node boots with."
    )
    parser.add_argument("--role", choices=ROLES, required=True)
    parser.add_argument(
        "--cloud",
        choices=sorted(FACTS),
        help="also report how this cloud receives it, and its size",
    )
    parser.add_argument(
        "--encoded", action="store_true", help="print the delivered value itself (with --cloud)"
    )
    add_json(parser)
    args = parser.parse_args(argv)
    user_data = render(example(args.role))
    if args.json:
        document: dict[str, object] = {"role": args.role, "userData": user_data}
        if args.cloud:
            delivered = deliver(user_data, args.cloud)
            document["delivery"] = {
                "cloud": args.cloud, "field": delivered.field, "gzipped": delivered.gzipped,
                "bytes": delivered.size, "limitBytes": delivered.limit, "value": delivered.value,
            }  # fmt: skip
        print_json(document)
        return 0
    if args.cloud:
        delivery = deliver(user_data, args.cloud)
        print(
            f"# {args.cloud}: {delivery.field}, {'gzip, ' if delivery.gzipped else ''}"
            f"{delivery.size:,} of {delivery.limit:,} bytes",
            file=sys.stderr,
        )
        if args.encoded:
            print(delivery.value)
            return 0
    sys.stdout.write(user_data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
