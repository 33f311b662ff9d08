"""Options every command spells the same way."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any


def add_stack(parser: argparse.ArgumentParser, meaning: str) -> None:
    """``--stack NAME``; a bare NAME, the older spelling, still works."""
    parser.add_argument("--stack", dest="stack_option", metavar="NAME", help=meaning)
    parser.add_argument("stack", nargs="?", help=argparse.SUPPRESS)


def stack_of(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The one stack the command is about (a usage error, exit 2, when none or two are given)."""
    given: list[str] = [str(name) for name in (args.stack_option, args.stack) if name]
    if len(given) != 1:
        parser.error("give the stack once: --stack NAME")
    return given[0]


# Every JSON document a command prints carries it; it grows when a key changes meaning or goes.
SCHEMA_VERSION = 1


def json_text(document: Mapping[str, Any]) -> str:
    return json.dumps({"schemaVersion": SCHEMA_VERSION, **document}, indent=2) + "\n"


def print_json(document: Mapping[str, Any]) -> None:
    print(json_text(document), end="")


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help=f"print JSON (schemaVersion {SCHEMA_VERSION})"
    )
