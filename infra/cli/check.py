"""``lrc check --stack S``: ask the cloud account, read-only, whether it has what the
stack needs (quotas, the types offered in its zone or region, Azure's Network Watcher and
Microsoft.Insights), with your own credentials, as ``pulumi up`` does before it creates anything.

Exits 0 when the account is ready, 1 with each problem and its fix when it is not, 2 when the
stack or its settings are wrong or no credentials are found.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from infra import preflight
from infra.cli.options import IN_STACKS, command_parser, print_json, stack_options
from infra.live import Access, LiveError, Reader, live_cloud
from infra.preflight.account import Account
from infra.stack.files import StackFileError, config_of, stack_values
from infra.stack.settings import ConfigError

# The stack's cloud and the user's way into its account -> the account's reader.
ReaderFactory = Callable[[str, Access], Reader]


def cli_reader(cloud: str, access: Access) -> Reader:
    return live_cloud(cloud).cli_reader(access)


def _report(needs: preflight.Needs, account: Account, found: list[preflight.Problem]) -> str:
    lines = [f"{needs.stack}: {needs.cloud} {needs.region}"]
    nodes = ", ".join(f"{count} x {name}" for name, count in sorted(needs.nodes.items()))
    lines.append(f"  nodes: {nodes} ({needs.total_vcpus} vCPUs)")
    zone = preflight.zone_for(needs, account)
    if zone is not None:
        how = "the zone setting" if needs.zone else "the first that offers every type"
        lines.append(f"  zone: {zone} ({how}; a deployed stack keeps the zone it was created in)")
    for reading in account.quotas:
        limit = "unknown" if reading.limit is None else f"{reading.limit:g}"
        used = "unknown" if reading.used is None else f"{reading.used:g}"
        lines.append(
            f"  quota {reading.quota.name} ({reading.quota.id}): {limit} vCPUs, {used} in use, "
            f"{reading.own:g} of them this stack's"
        )
    lines += [f"  not checked: {unread}" for unread in account.unread]
    if found:
        lines.append("NOT READY:")
        lines += [f"  - {problem}" for problem in found]
    else:
        lines.append("ready: the account has what the stack needs")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, reader_for: ReaderFactory = cli_reader) -> int:
    description = "Check, read-only, that the cloud account has what a stack needs."
    args = command_parser("check", description, [stack_options(IN_STACKS)]).parse_args(argv)
    try:
        values = stack_values(args.stack)
        config = config_of(values)
        needs = config.needs(args.stack)
        account = reader_for(config.cloud, Access(config.region, values))(needs)
    except (StackFileError, ConfigError, LiveError) as error:
        print(f"preflight: {error}", file=sys.stderr)
        if args.json:  # a reader of the JSON gets a document, saying why there is no answer
            print_json({"stack": args.stack, "ready": None, "error": str(error)})
        return 2
    found = preflight.problems(needs, account)
    if args.json:
        report = {
            "stack": args.stack,
            "ready": not found,
            "zone": preflight.zone_for(needs, account),
            "problems": [{"about": p.what, "message": p.message} for p in found],
            "notChecked": [str(u) for u in account.unread],
        }
        print_json(report)
    else:
        print(_report(needs, account, found))
    return 1 if found else 0
