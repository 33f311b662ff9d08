"""``lrc catalog``: show the catalog, or refresh its prices from the price APIs."""

from __future__ import annotations

import dataclasses
import re
import sys
import urllib.error
from collections.abc import Sequence

from infra import catalog
from infra.catalog import refresh
from infra.cli.options import PROGRAM, add_cloud, command_parser, json_option, print_json


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("catalog", __doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    show = commands.add_parser("show", help="print the catalog's rows", parents=[json_option()])
    add_cloud(show, refresh.PROVIDERS, "only this cloud's rows")
    update = commands.add_parser(
        "refresh", help="fetch on-demand and spot prices and update the CSV"
    )
    add_cloud(update, refresh.PROVIDERS, "the cloud whose prices to fetch", required=True)
    update.add_argument("--region", help="default: every region the catalog has for it")
    update.add_argument("--dry-run", action="store_true", help="report, change nothing")
    args = parser.parse_args(argv)
    shown = [e for e in catalog.load() if args.cloud in (None, e.provider)]
    if args.command == "show" and args.json:
        rows = [dataclasses.asdict(e) for e in shown]
        print_json({"instances": rows})
        return 0
    if args.command == "show":
        print(f"{'cloud':<6} {'region':<12} {'instance type':<18} {'vCPU':>8} {'memory':>9}  "
              f"{'$/h':<12} price source and date; spot $/h")  # fmt: skip
        for e in shown:
            # An unknown price says how to fetch it, for this row's cloud and region.
            fetch = f"run `{PROGRAM} catalog refresh --cloud {e.provider} --region {e.region}`"
            price = "unknown" if e.hourly_usd is None else f"${e.hourly_usd:g}/h"
            source = f"{e.price_source} {e.price_date}" if e.hourly_usd is not None else fetch
            spot = (
                f"spot ${e.spot_hourly_usd:g}/h ({e.spot_price_source} {e.spot_price_date})"
                if e.spot_hourly_usd is not None
                else f"spot unknown ({fetch})"
            )
            size = f"{e.vcpus:>3} vCPU {e.memory_gib:>5g} GiB"
            print(f"{e.provider:<6} {e.region:<12} {e.name:<18} {size}  {price:<12} "
                  f"{source}; {spot}")  # fmt: skip
        return 0
    if args.region and not re.fullmatch(r"[a-z][a-z0-9-]*[a-z0-9]", args.region):
        print(f"error: --region {args.region!r} is not a region name (us-east-1, eastus, "
              "us-central1)", file=sys.stderr)  # fmt: skip
        return 2
    regions = (
        [args.region]
        if args.region
        else sorted({e.region for e in catalog.load() if e.provider == args.cloud})
    )
    try:
        for region in regions:
            report = refresh.refresh(args.cloud, region, dry_run=args.dry_run)
            print("\n".join(report.lines()))
    except (refresh.RefreshError, urllib.error.URLError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # botocore's errors: missing credentials, access denied
        if type(error).__module__.startswith("botocore"):
            print(f"error: AWS Price List API: {error}", file=sys.stderr)
            return 2
        raise
    return 0
