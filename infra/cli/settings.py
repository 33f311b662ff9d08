"""``lrc settings --pulumi-yaml | --readme``: the settings as Pulumi.yaml's ``config:`` block or
as docs/settings.md's table, from their one declaration (``infra.stack.settings``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from infra.cli.options import command_parser
from infra.stack.settings import project_file_block, readme_table


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("settings", __doc__)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--pulumi-yaml", action="store_true", help="the config: block")
    which.add_argument("--readme", action="store_true", help="the Markdown table")
    args = parser.parse_args(argv)
    sys.stdout.write(project_file_block() if args.pulumi_yaml else readme_table())
    return 0
