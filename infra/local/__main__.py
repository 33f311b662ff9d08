"""python -m infra.local up|status|down|fetch-source: a llama.cpp RPC cluster on this machine.

python -m infra.local up [--workers N] [--model PATH] [--context N] [--slots N] [--json]
python -m infra.local status [--json]
python -m infra.local down
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from infra import outputs
from infra.boot import BootConfigError
from infra.local import cluster
from infra.local.model import GEMMA_NOTICE, real_model, real_model_terms
from infra.local.source import SourceError, cache_dir, sdist_tree
from infra.local.supervisor import supervise
from infra.pins import LLAMA_CPP_COMMIT
from infra.sizing import DEFAULT_CONTEXT, DEFAULT_SLOTS


def _print_contract(contract: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(contract, indent=2))
        return
    width = max(len(k) for k in contract)
    for key, value in contract.items():
        shown = ", ".join(value) if isinstance(value, list) else value
        print(f"{key:<{width}}  {shown}")


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
    netns = cluster.can_use_netns() and not args.loopback
    if not netns:
        print(
            "note: no network namespaces (needs root, iproute2 and nftables): the nodes share "
            "loopback addresses and the RPC firewall is not applied",
            file=sys.stderr,
        )
    options = cluster.UpOptions(
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
    )
    contract = cluster.up(
        options,
        timeout=args.timeout,
        progress=None if args.json else lambda text: print(f"  {text}", file=sys.stderr),
    )
    _print_contract(contract, args.json)
    if not args.json:
        print(
            f"\ntry:  curl -s {contract[outputs.LLAMA_SERVER_URL]}/completion "
            """-d '{"prompt": "Hello", "n_predict": 16}'"""
        )
    return 0


def _status(args: argparse.Namespace) -> int:
    spec = cluster.load_spec(args.cache, args.id)
    statuses = cluster.read_status(spec)
    if args.json:
        document = {
            "outputs": cluster.contract(spec),
            "placement": spec.get("placement", []),
            "nodes": statuses,
        }
        print(json.dumps(document, indent=2))
        return 0
    _print_contract(cluster.contract(spec), False)
    if "placement" in spec:  # clusters brought up before placements were planned have none
        print(f"\ncontext {spec['context_size']} tokens per request, {spec['slots']} slot(s):")
    recorded = statuses["main"].get("placement") or []
    for planned in spec.get("placement", []):
        placed = next((p for p in recorded if p["node"] == planned["node"]), None)
        seen = f"placed {placed['layers']}" if placed else "not loaded yet"
        print(f"  {planned['node']:<9} planned {planned['layers']:>3}, {seen}")
    print()
    for name, status in statuses.items():
        line = f"{name:<6} {status.get('phase', 'starting'):<20}"
        if status.get("last_error"):
            line += f" last error: {status['last_error']}"
        print(line)
    return 0


def _down(args: argparse.Namespace) -> int:
    if cluster.down(args.cache, args.id):
        print(f"local cluster {args.id!r} is down")
    else:
        print(f"no local cluster {args.id!r} was up")
    return 0


def main(argv: list[str] | None = None) -> int:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--cache", type=Path, default=cache_dir(), help="build and model cache")
    common.add_argument(
        "--id", default="local", help="cluster name, to run several (default: local)"
    )
    parser = argparse.ArgumentParser(
        prog="python -m infra.local", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)

    start = sub.add_parser(
        "up", parents=[common], help="build, boot and wait until the main node serves"
    )
    start.add_argument("--workers", type=int, default=2)
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
        "--source",
        type=Path,
        help="llama.cpp source: a git checkout or a tree "
        "at the pinned commit (default: the pinned llama-cpp-python sdist)",
    )
    start.add_argument("--commit", default=LLAMA_CPP_COMMIT)
    start.add_argument("--cidr", default=cluster.DEFAULT_CIDR, help="the private network")
    start.add_argument("--threads", type=int, help="threads per node (default: every core)")
    start.add_argument(
        "--worker-wait", type=int, default=900, help="seconds the main node waits for the workers"
    )
    start.add_argument("--timeout", type=float, default=1800)
    start.add_argument("--loopback", action="store_true", help="no namespaces, even as root")
    start.add_argument("--json", action="store_true")
    show = sub.add_parser(
        "status", parents=[common], help="the output contract and each node's phase"
    )
    show.add_argument("--json", action="store_true")
    sub.add_parser("down", parents=[common], help="stop every node and remove the namespaces")
    sub.add_parser(
        "fetch-source", parents=[common], help="download and unpack the pinned llama.cpp source"
    )
    run = sub.add_parser("supervise")  # internal: the detached supervisor
    run.add_argument("state", type=Path)
    args = parser.parse_args(argv)

    try:
        if args.command == "up":
            return _up(args)
        if args.command == "status":
            return _status(args)
        if args.command == "down":
            return _down(args)
        if args.command == "fetch-source":
            print(sdist_tree(args.cache))
            return 0
        return supervise(args.state)
    except (cluster.LocalClusterError, BootConfigError, SourceError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
