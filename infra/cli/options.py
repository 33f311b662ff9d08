"""What every command shares: its parser under its ``lrc`` name, and the options every command
spells the same way (``--stack``, ``--cloud``, ``--json``)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

PROGRAM = "lrc"

DEPLOYED = "a deployed stack, as `pulumi up --stack` named it"
IN_STACKS = "a stack of stacks/, as `pulumi up --stack` names it"

# Every JSON document a command prints carries it; it grows when a key changes meaning or goes.
SCHEMA_VERSION = 1


class Adds(Protocol):
    """A parser or a group of its arguments."""

    def add_argument(self, *names: str, **options: Any) -> argparse.Action: ...


def command_parser(
    name: str, description: str | None, parents: Iterable[argparse.ArgumentParser] = ()
) -> argparse.ArgumentParser:
    """The parser of ``lrc NAME``: its usage and errors carry that name; a description written
    for the code (its ``double backticks``) reads with single ones, as the README's do."""
    shown = description.replace("``", "`") if description else description
    return argparse.ArgumentParser(
        prog=f"{PROGRAM} {name}", description=shown, parents=list(parents)
    )


def add_stack(target: Adds, meaning: str, **options: Any) -> None:
    target.add_argument("--stack", metavar="NAME", help=meaning, **options)


def add_cloud(target: Adds, clouds: Iterable[str], meaning: str, **options: Any) -> None:
    target.add_argument("--cloud", choices=sorted(clouds), help=meaning, **options)


def add_json(target: Adds) -> None:
    target.add_argument(
        "--json", action="store_true", help=f"print JSON (schemaVersion {SCHEMA_VERSION})"
    )


def json_option() -> argparse.ArgumentParser:
    """``--json``, as a parent parser."""
    parent = argparse.ArgumentParser(add_help=False)
    add_json(parent)
    return parent


def stack_options(meaning: str = DEPLOYED) -> argparse.ArgumentParser:
    """``--stack NAME`` (required) and ``--json``: the options of a command about one stack."""
    parent = argparse.ArgumentParser(add_help=False)
    add_stack(parent, meaning, required=True)
    add_json(parent)
    return parent


def json_text(document: Mapping[str, Any]) -> str:
    return json.dumps({"schemaVersion": SCHEMA_VERSION, **document}, indent=2) + "\n"


def print_json(document: Mapping[str, Any]) -> None:
    print(json_text(document), end="")
