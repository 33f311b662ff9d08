"""``lrc``: the product's one command, beside ``pulumi up`` and ``pulumi destroy``.

Each command is a module of this package, ``infra.cli.<name>``, imported only when run, so that
``lrc plan`` loads no cloud SDK.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from infra.cli.options import PROGRAM
from infra.core.pins import LLAMA_CPP_COMMIT

DISTRIBUTION = "llama-rpc-cluster"

# Each command's summary; its ``main(argv) -> int`` is in ``infra.cli.<name>``.
COMMANDS = {
    "plan": "size and price a cluster for a model on every cloud",
    "check": "read what a stack needs of its cloud account, before pulumi up",
    "wait": "after pulumi up: wait until every group of a stack serves",
    "status": "each serving group's phase, read once",
    "start": "start a stack's stopped nodes (a spend guard's) again",
    "top": "watch a deployed stack's nodes, live",
    "exec": "run a command as root on a group's main node",
    "stage": "copy a model's parts once into the cloud's object store",
    "prebuild": "build llama.cpp once for a CPU family and put it in the object store",
    "costrun": "deploy, benchmark, destroy and audit stacks; report what each cost",
    "k8s": "render a stack as a Kubernetes LeaderWorkerSet and its image recipe",
    "local": "a cluster on this machine, no cloud account",
    "catalog": "the instance catalog: show, refresh prices",
    "boot": "print the cloud-config a node boots with",
}
# Run as any other, not listed in the help: what the project's own files are written with.
DEVELOPER_COMMANDS = {
    "settings": "print Pulumi.yaml's config block or docs/settings.md's table, from the settings",
}


def version() -> str:
    from importlib import metadata  # noqa: PLC0415 (half of `lrc --help`'s time when at the top)

    try:
        own = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        own = "unknown"
    return f"{PROGRAM} {own} (llama.cpp {LLAMA_CPP_COMMIT[:12]})"


def usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = [
        f"usage: {PROGRAM} [--version] COMMAND [ARGS...]",
        "",
        "Private llama.cpp RPC clusters on Arm cloud CPUs. Create and destroy a stack with",
        "`pulumi up` and `pulumi destroy`; lrc does the rest.",
        "",
        "commands:",
        *(f"  {name:<{width}}  {summary}" for name, summary in COMMANDS.items()),
        "",
        f"`{PROGRAM} COMMAND --help` shows a command's options.",
    ]
    return "\n".join(lines)


def entry(name: str) -> Callable[[list[str]], int]:
    module = importlib.import_module(f"infra.cli.{name}")
    run: Callable[[list[str]], int] = module.main
    return run


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return dispatch(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:  # `lrc --help | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def dispatch(args: list[str]) -> int:
    """The command ``args`` name, run with the rest of them."""
    if args[:1] == ["help"]:  # `lrc help` as `git help`; `lrc help plan` as `lrc plan --help`
        args = [*args[1:2], "--help"]
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name == "--version":
        print(version())
        return 0
    if name not in COMMANDS | DEVELOPER_COMMANDS:
        close = difflib.get_close_matches(name, list(COMMANDS), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        print(f"{PROGRAM}: unknown command {name!r}; {hint}the commands: {', '.join(COMMANDS)}",
              file=sys.stderr)  # fmt: skip
        return 2
    if rest == ["--version"]:
        print(version())
        return 0
    return run(name, rest)


def run(name: str, rest: list[str]) -> int:
    """Command ``name`` with its arguments."""
    try:
        return entry(name)(rest)
    except SystemExit as stop:  # argparse's --help (0) and usage errors (2)
        return stop.code if isinstance(stop.code, int) else 1
    except BrokenPipeError:  # `lrc catalog show | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
