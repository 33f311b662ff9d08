"""lrc local: a llama.cpp RPC cluster on this machine.

lrc local up [--machines] [--workers N] [--replicas N] [--model PATH] [--context N] [--json]
lrc local status [--json]
lrc local top [--interval S] [--once]   (each node's CPU, memory, traffic, tokens/s)
lrc local exec NODE -- COMMAND...     (a shell on a node: the local SSM or IAP)
lrc local journal NODE [JOURNALCTL ARGS...]
lrc local reboot NODE
lrc local start                       (machines a spend guard powered off, again)
lrc local down
lrc local image | fetch-source        (install steps: the node image, the source)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from infra.boot import BootConfigError
from infra.cli.options import command_parser, json_option, json_text, print_json
from infra.clouds import FACTS
from infra.core import outputs
from infra.core.limits import DEFAULT_DRAFT_MAX, MAX_REPLICAS
from infra.core.pins import LLAMA_CPP_COMMIT
from infra.core.sizing import DEFAULT_CONTEXT, DEFAULT_SLOTS
from infra.local import access, cluster, top
from infra.local import image as node_image
from infra.local.machines import unavailable_reason
from infra.local.model import GEMMA_NOTICE, real_model, real_model_terms
from infra.local.options import (
    DEFAULT_CIDR,
    LocalClusterError,
    OptionError,
    UpOptions,
    can_use_netns,
)
from infra.local.source import SourceError, cache_dir, sdist_tree
from infra.local.spec import ClusterSpec
from infra.observe.status import phase_text
from infra.observe.topview import Row, rows_data


def _print_contract(contract: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(contract)
        return
    width = max(len(k) for k in contract)
    for key, value in contract.items():
        if key == outputs.GROUPS:
            for number, group in enumerate(value, 1):
                print(f"{key if number == 1 else '':<{width}}  {_group_line(number, group)}")
            continue
        if value is None:
            shown = "none (one serving group)" if key == outputs.BALANCER_URL else "none"
        else:
            shown = ", ".join(value) if isinstance(value, list) else value
        print(f"{key:<{width}}  {shown}")


def _group_line(number: int, group: dict[str, Any]) -> str:
    workers = ", ".join(group[outputs.WORKER_PRIVATE_IPS]) or "none"
    return (
        f"group {number}: main {group[outputs.MAIN_PRIVATE_IP]}, workers {workers}, "
        f"{group[outputs.LLAMA_SERVER_URL]}"
    )


def _up(args: argparse.Namespace) -> int:
    cache = args.cache
    source = args.source or sdist_tree(cache)
    model = args.model or real_model(cache)
    if args.model is None:
        print(
            f"model: Gemma 3 270M Q4_K_M ({model}). {GEMMA_NOTICE}; a copy is in "
            f"{real_model_terms()}",
            file=sys.stderr,
        )
    netns = can_use_netns() and not args.loopback
    if not netns:
        print(
            "note: no network namespaces (needs root, iproute2 and nftables): the nodes share "
            "loopback addresses and the RPC firewall is not applied",
            file=sys.stderr,
        )
    machines = args.machines and _machines_possible(netns, cache)
    options = UpOptions(
        workers=args.workers,
        model=model,
        source=source,
        cache=cache,
        cluster_id=args.id,
        cidr=args.cidr,
        commit=args.commit,
        model_sha256=args.model_sha256,
        threads=args.threads,
        context_size=args.context,
        slots=args.slots,
        node_memory_bytes=int(args.node_memory_gib * 1024**3) if args.node_memory_gib else None,
        worker_wait_seconds=args.worker_wait,
        netns=netns,
        machines=machines,
        deliveries=tuple(args.delivery),
        replicas=args.replicas,
        api_key=args.api_key,
        stop_after_idle_minutes=args.stop_after_idle_minutes,
        stop_after_hours=args.stop_after_hours,
        server_args=tuple(args.server_arg),
        patches_off=tuple(args.patches_off.split(",")) if args.patches_off else (),
        draft_model=args.draft_model,
        draft_max=args.draft_max,
        worker_local=args.worker_local,
        staged=args.staged,
    )
    contract = cluster.up(
        options,
        timeout=args.timeout,
        progress=None if args.json else lambda text: print(f"  {text}", file=sys.stderr),
    )
    _print_contract(contract, args.json)
    if not args.json:
        print(f"\ntry:  {_try_command(ClusterSpec.load(cache, args.id))}")
    return 0


def _try_command(spec: ClusterSpec) -> str:
    """A completion through the cluster's entry point: the balancer when there is one."""
    url = spec.entry_url()
    keyed = ""
    if spec.api_key_file:
        keyed = f' -H "Authorization: Bearer $(sudo cat {spec.api_key_file})"'
    request = f"""curl -s {url}/completion{keyed} -d '{{"prompt": "Hello", "n_predict": 16}}'"""
    return spec.from_entry(request)


def _machines_possible(netns: bool, cache: Path) -> bool:
    """Whether machines can run here; if not, says why (the nodes then run as processes)."""
    reason = unavailable_reason() or (None if netns else "machines need network namespaces")
    if reason is None and node_image.cached(cache) is None:
        try:
            node_image.build(cache, progress=lambda text: print(f"  {text}", file=sys.stderr))
        except node_image.ImageError as error:
            reason = str(error)
    if reason:
        print(f"note: {reason}: the nodes run as processes instead of machines", file=sys.stderr)
    return reason is None


def _deliveries(text: str) -> list[str]:
    clouds = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in clouds if c not in FACTS]
    if not clouds or unknown:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give clouds from {', '.join(FACTS)}, separated by commas"
        )
    return clouds


def _run_on_node(args: argparse.Namespace) -> int:
    spec = ClusterSpec.load(args.cache, args.id)
    command = args.command_line[1:] if args.command_line[:1] == ["--"] else args.command_line
    if not command:
        raise LocalClusterError("give a command after the node: exec NODE -- COMMAND...")
    argv = access.exec_argv(spec, args.node, command)
    return subprocess.run(argv, check=False).returncode


def _journal(args: argparse.Namespace) -> int:
    spec = ClusterSpec.load(args.cache, args.id)
    extra = args.journal_args[1:] if args.journal_args[:1] == ["--"] else args.journal_args
    return subprocess.run(access.journal_argv(spec, args.node, extra), check=False).returncode


def _reboot(args: argparse.Namespace) -> int:
    spec = ClusterSpec.load(args.cache, args.id)
    access.reboot(spec, args.node)
    print(f"{args.node} rebooted; `lrc local status` shows it come back")
    return 0


def _start(args: argparse.Namespace) -> int:
    started, contract = cluster.start(
        args.cache,
        args.id,
        timeout=args.timeout,
        progress=None if args.json else lambda text: print(f"  {text}", file=sys.stderr),
    )
    if args.json:
        print_json({"started": started, "outputs": contract})
    else:
        print(f"started: {', '.join(started) or 'none (every machine was running)'}; serving")
    return 0


def _status(args: argparse.Namespace) -> int:
    spec = ClusterSpec.load(args.cache, args.id)
    statuses = cluster.read_status(spec)
    checks = None if spec.balancer is None else spec.balancer.balancer().checks()
    if args.json:
        document = {
            "outputs": spec.contract(),
            "apiKeyFile": None if spec.api_key_file is None else str(spec.api_key_file),
            "placement": list(spec.placement),
            "nodes": statuses,
            "balancer": checks,
        }
        print_json(document)
        return 0
    _print_contract(spec.contract(), False)
    if spec.api_key_file:
        print(f"API key: in {spec.api_key_file} (root's); send it as `Authorization: Bearer KEY`")
    print(f"\ncontext {spec.context_size} tokens per request, {spec.slots} slot(s):")
    recorded = statuses["main"].get("placement") or []
    for planned in spec.placement:
        placed = next((p for p in recorded if p["node"] == planned["node"]), None)
        seen = f"placed {placed['layers']}" if placed else "not loaded yet"
        print(f"  {planned['node']:<9} planned {planned['layers']:>3}, {seen}")
    print()
    stopped = set(cluster.stopped_machines(spec))
    groups = spec.groups()
    for number, nodes in enumerate(groups, 1):
        indent = ""
        if checks is not None:
            check = checks.get(f"group{number}") or checks.get("error") or {}
            seen = check.get("status", "not checked")
            if check.get("check"):
                seen += f", check {check['check']}, requests: {check['requests']}"
            print(f"group {number} (balancer: {seen})")
            indent = "  "
        for node in nodes:
            status = statuses[node.name]
            phase = "machine stopped" if node.name in stopped else phase_text(status)
            line = f"{indent}{node.name:<6} {phase:<20}"
            if node.name in stopped and status.get("phase") == "stopped":
                reason = status["last_stop_reason"]
                line += f" by its spend guard ({reason}); `lrc local start` boots it"
            if status.get("last_error"):
                line += f" last error: {status['last_error']}"
            print(line)
    return 0


def _top(args: argparse.Namespace) -> int:
    spec = ClusterSpec.load(args.cache, args.id)

    def as_json(rows: list[Row]) -> str:
        return json_text({"cluster": spec.id, "interval": args.interval,
                          "nodes": rows_data(rows)})  # fmt: skip

    return top.run(spec, args.interval, once=args.once, draw_rows=as_json if args.json else None)


def _down(args: argparse.Namespace) -> int:
    if cluster.down(args.cache, args.id):
        print(f"local cluster {args.id!r} is down")
    else:
        print(f"no local cluster {args.id!r} was up")
    return 0


def _draft_flags(start: argparse.ArgumentParser) -> None:
    start.add_argument(
        "--draft-model",
        type=Path,
        metavar="GGUF",
        help="a draft model of the model's vocabulary for speculative decoding on the main "
        "node (a stack's draftModel)",
    )
    start.add_argument(
        "--draft-max",
        type=int,
        default=DEFAULT_DRAFT_MAX,
        help=f"tokens the draft proposes a step (default {DEFAULT_DRAFT_MAX})",
    )


def _worker_local_flag(start: argparse.ArgumentParser) -> None:
    start.add_argument(
        "--worker-local",
        action="store_true",
        help="worker-local loading: each node fetches its own slice of the model and a worker "
        "loads its layers from its own disk; the main node sends keys, not weights",
    )
    start.add_argument(
        "--staged",
        action="store_true",
        help="machines: stage the model (lrc stage) in the cluster's own S3 store on the VPC and "
        "have every node read it there, as a stack's nodes read its bucket; the store logs each "
        "request (STATE/store/requests.jsonl)",
    )


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--cache", type=Path, default=cache_dir(), help="build and model cache")
    common.add_argument(
        "--id", default="local", help="cluster name, to run several (default: local)"
    )
    reports = [common, json_option()]
    parser = command_parser("local", __doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    start = sub.add_parser(
        "up", parents=reports, help="build, boot and wait until the main node serves"
    )
    start.add_argument("--workers", type=int, default=2, help="workers per serving group")
    start.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="serving groups (each a main node and its workers) behind HAProxy on the VPC "
        f"bridge (default 1: no balancer; at most {MAX_REPLICAS})",
    )
    start.add_argument(
        "--model",
        type=Path,
        help="a GGUF file (first part of a split GGUF); default: Gemma 3 270M Q4_K_M from PyPI",
    )
    start.add_argument(
        "--context",
        type=int,
        default=DEFAULT_CONTEXT,
        help="tokens per request, prompt and completion (default %(default)s)",
    )
    start.add_argument(
        "--slots",
        type=int,
        default=DEFAULT_SLOTS,
        help="requests served at once, each with --context tokens (default %(default)s)",
    )
    start.add_argument(
        "--node-memory-gib",
        type=float,
        help="memory each node may use for the placement (default: an equal share of this "
        "machine's)",
    )
    start.add_argument("--model-sha256", help="expected sha256 of the model file")
    start.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="WORD",
        help="a llama-server flag or its value for the main node, one word each, as a stack's "
        "serverArgs (repeat it: --server-arg=--temp --server-arg=0.7)",
    )
    _draft_flags(start)
    _worker_local_flag(start)
    start.add_argument(
        "--source",
        type=Path,
        help="llama.cpp source: a git checkout or a tree "
        "at the pinned commit (default: the pinned llama-cpp-python sdist)",
    )
    start.add_argument("--commit", default=LLAMA_CPP_COMMIT)
    start.add_argument("--cidr", default=DEFAULT_CIDR, help="the private network")
    start.add_argument("--threads", type=int, help="threads per node (default: every core)")
    start.add_argument(
        "--worker-wait", type=int, default=900, help="seconds the main node waits for the workers"
    )
    start.add_argument(
        "--api-key",
        action="store_true",
        help="generate an API key that every request but /health must carry (its file: "
        "`lrc local status`)",
    )
    start.add_argument(
        "--stop-after-idle-minutes",
        type=float,
        default=0,
        metavar="MINUTES",
        help="machines: a node powers off after this long idle (a main node: no request; a "
        "worker: no main node connected), as a stack's stopAfterIdleMinutes (default: never)",
    )
    start.add_argument(
        "--stop-after-hours",
        type=float,
        default=0,
        metavar="HOURS",
        help="machines: every node powers off this long after each boot, as a stack's "
        "stopAfterHours (default: never)",
    )
    start.add_argument(
        "--patches-off",
        metavar="NUMBERS",
        help="llama.cpp patches to turn off at run time, as a stack's llamaCppPatchesOff: "
        "0001,0003 or all (docs/loader.md)",
    )
    start.add_argument("--timeout", type=float, default=1800)
    start.add_argument("--loopback", action="store_true", help="no namespaces, even as root")
    start.add_argument(
        "--machines",
        action="store_true",
        help="boot each node as a systemd-nspawn machine: real cloud-init and systemd (root)",
    )
    start.add_argument(
        "--delivery",
        type=_deliveries,
        default=["aws"],
        help="machines: each node's user data as these clouds deliver it, main first, repeated "
        "over the workers (default aws; e.g. aws,gcp,azure)",
    )
    sub.add_parser("status", parents=reports, help="the output contract and each node's phase")
    watch = sub.add_parser(  # --json: one reading's rows, over one interval
        "top", parents=reports, help="each node's phase, CPU, memory, traffic and tokens/s, live"
    )
    watch.add_argument("--interval", type=float, default=2.0, help="seconds between frames")
    watch.add_argument("--once", action="store_true", help="print one frame and stop")
    run_on = sub.add_parser(
        "exec", parents=[common], help="run a command on a node, as root (the local SSM or IAP)"
    )
    run_on.add_argument("node", help="main, w1, w2, ... (other groups: r2main, r2w1, ...)")
    run_on.add_argument("command_line", nargs=argparse.REMAINDER, metavar="-- COMMAND")
    journal = sub.add_parser(
        "journal", parents=[common], help="a machine's journal, read from this machine"
    )
    journal.add_argument("node")
    journal.add_argument("journal_args", nargs=argparse.REMAINDER, metavar="JOURNALCTL ARGS")
    restart = sub.add_parser(
        "reboot", parents=[common], help="stop a machine and start it again (same disk)"
    )
    restart.add_argument("node")
    again = sub.add_parser(
        "start",
        parents=reports,
        help="start the machines that powered off (a spend guard) on their disks, and wait "
        "until every group serves",
    )
    again.add_argument("--timeout", type=float, default=1800)
    sub.add_parser("down", parents=[common], help="stop every node and remove the namespaces")
    sub.add_parser(
        "image",
        parents=[common],
        help=f"build the machines' node image once (Debian {node_image.RELEASE}, root)",
    )
    sub.add_parser(
        "fetch-source", parents=[common], help="download and unpack the pinned llama.cpp source"
    )
    return parser


def _fetch_source(args: argparse.Namespace) -> int:
    print(sdist_tree(args.cache))
    return 0


def _image(args: argparse.Namespace) -> int:
    built = node_image.build(args.cache, lambda text: print(text, file=sys.stderr))
    print(built.root)
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "up": _up,
    "status": _status,
    "top": _top,
    "exec": _run_on_node,
    "journal": _journal,
    "reboot": _reboot,
    "start": _start,
    "down": _down,
    "image": _image,
    "fetch-source": _fetch_source,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        code: int = COMMANDS[args.command](args)
    except OptionError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (
        LocalClusterError,
        BootConfigError,
        SourceError,
        node_image.ImageError,
    ) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return code
