"""``lrc boot --role worker|main [--cloud CLOUD] [--encoded]``: print the cloud-config a node of
the reference layout boots with."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from infra.boot.deliver import deliver, for_cloud
from infra.boot.node import example
from infra.boot.render import render
from infra.cli.options import add_cloud, command_parser, json_option, print_json
from infra.clouds import FACTS
from infra.core.limits import ROLES

# Where the example's boot files beyond its user data would be kept (a stack's own path).
EXAMPLE_PATH = "/llama-rpc-cluster/example/boot"


def main(argv: Sequence[str] | None = None) -> int:
    description = "Print the cloud-config a node boots with."
    parser = command_parser("boot", description, [json_option()])
    parser.add_argument(
        "--role", choices=ROLES, required=True,
        help="a worker (ggml-rpc-server) or a group's main node (llama-server)",
    )  # fmt: skip
    add_cloud(parser, FACTS, "also report how this cloud receives it, and its size")
    parser.add_argument(
        "--encoded", action="store_true", help="print the delivered value itself (with --cloud)"
    )
    args = parser.parse_args(argv)
    node = example(args.role)
    if args.cloud:  # as the cloud boots it: AWS's user data holds the first steps only
        node = for_cloud(
            node, args.cloud, FACTS[args.cloud].region_example, f"{EXAMPLE_PATH}/{args.role}"
        )
    user_data = render(node)
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
