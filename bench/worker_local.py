"""Worker-local loading on the local cluster, on and off, in one run, the arms interleaved: what
each worker's network interface received while the group loaded, the time from the cluster's
start to serving, and the time to serve again after ``kill -9`` of a worker's RPC server (and,
on machines, after a reboot of a worker's machine).

    uv run python bench/worker_local.py [--repetitions 2] [--kills 2]
    uv run python bench/worker_local.py --machines [--reboots 2]
    uv run python bench/worker_local.py --machines --staged

Writes bench/results/worker_local.json (worker_local_machines.json with ``--machines``: each node
a systemd-nspawn machine booting its user data, root). Each repetition boots Gemma 3 270M through
a main node and two workers (processes in network namespaces, or machines; one thread each)
twice, in the order AB, BA, ...:
"local" (each node fetches its own slice of the model by the slice manifest and a worker loads
its layers from its own disk; patches 0006 and 0007) and "sent" (the main node holds the whole
model and sends each worker its weights, the default). After each up it reads the workers'
received bytes, then kills the last worker's ggml-rpc-server ``--kills`` times, and on machines
reboots the last worker's machine ``--reboots`` times, timing each until a greedy completion
answers again with the text it gave before. Every run is kept. Timings mean something only on a
quiet machine: the figures record what else was running.

With ``--staged`` (worker_local_staged.json) the model is staged by `lrc stage` in the cluster's
own S3 store and every node reads it there: "sent" downloads the whole model to the main node,
"local" each node's slice. Each run then also records what the main node's interface sent while
the group loaded (the workers' weights, or keys) and, from the store's request log, each node's
reads of the model: how many, how many ranged, and their bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import subprocess
import sys
import time
import urllib.error
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from infra.core import outputs  # noqa: E402
from infra.core.pins import LLAMA_CPP_COMMIT  # noqa: E402
from infra.local import access, cluster  # noqa: E402
from infra.local.model import real_model  # noqa: E402
from infra.local.options import UpOptions  # noqa: E402
from infra.local.source import cache_dir, sdist_tree  # noqa: E402
from infra.local.spec import ClusterSpec  # noqa: E402
from infra.local.usage import received_bytes, sent_bytes  # noqa: E402
from infra.models.parts import part_paths  # noqa: E402
from tests.conftest import complete  # noqa: E402

RESULTS = REPO / "bench" / "results" / "worker_local.json"
MACHINE_RESULTS = REPO / "bench" / "results" / "worker_local_machines.json"
STAGED_RESULTS = REPO / "bench" / "results" / "worker_local_staged.json"
HEAVY = "pytest|llama-server|llama-bench|rpc-server|systemd-nspawn|cc1plus"
WORKERS = ("w1", "w2")


def other_heavy_work() -> list[str]:
    found = subprocess.run(["pgrep", "-af", HEAVY], capture_output=True, text=True, check=False)
    own = str(os.getpid())
    return [line[:100] for line in found.stdout.splitlines() if line.split()[0] != own]


def rpc_server_pids(namespace: str) -> list[int]:
    pids = subprocess.run(
        ["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=30
    ).stdout.split()
    found = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "ggml-rpc-server":
                found.append(int(pid))
        except OSError:
            continue
    return found


def serve_again(url: str, want: Any) -> float:
    """Seconds until the group answers ``want`` again (from now)."""
    started = time.monotonic()
    while time.monotonic() < started + 600:
        try:
            if complete(url, timeout=30) == want:
                return time.monotonic() - started
        except (OSError, urllib.error.URLError, KeyError):
            pass
        time.sleep(0.2)
    raise RuntimeError("the group did not answer again within 600 s")


def main_restart(spec: ClusterSpec, since: float) -> dict[str, float]:
    """From the main machine's journal, in seconds after ``since`` (this machine's monotonic
    clock, which a machine's systemd shares): when its llama-server exited (the abort at its next
    send to the lost worker) and when systemd started it again."""
    shown = subprocess.run(
        access.journal_argv(spec, "main", ["-u", "llama-server.service", "-o", "json",
                                           "--no-pager"]),
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    exited = started = None
    for line in shown.splitlines():
        entry = json.loads(line)
        at = int(entry["__MONOTONIC_TIMESTAMP"]) / 1e6
        message = entry.get("MESSAGE")
        if at < since or not isinstance(message, str):
            continue
        if exited is None and "Main process exited" in message:
            exited = at
        elif exited is not None and started is None and message.startswith("Started "):
            started = at
    if exited is None or started is None:
        raise RuntimeError("the main node's journal shows no exit and start after the kill")
    return {"abort_seconds": round(exited - since, 2), "restart_seconds": round(started - since, 2)}


def store_reads(spec: ClusterSpec, part: str) -> dict[str, dict[str, int]]:
    """Each node's reads of the model's part, from the store's request log."""
    assert spec.store is not None
    log = spec.store.store().requests()
    reads: dict[str, dict[str, int]] = {}
    for node in spec.nodes:
        mine = [r for r in log if r["client"] == node.ip and r["method"] == "GET"
                and r["path"].endswith("/" + part)]  # fmt: skip
        reads[node.name] = {"gets": len(mine), "ranged": sum(r["status"] == 206 for r in mine),
                            "bytes": sum(r["bytes"] for r in mine)}  # fmt: skip
    return reads


def one_run(
    arm: str,
    number: int,
    source: Path,
    *,
    kills: int,
    reboots: int,
    machines: bool,
    staged: bool = False,
) -> dict[str, Any]:
    cache = cache_dir()
    options = UpOptions(
        workers=2, model=real_model(cache), source=source, cache=cache,
        cluster_id=f"bl{arm[0]}{number}", cidr=f"10.219.{random.randint(0, 250)}.0/24",  # noqa: S311 (a range, not a secret)
        threads=1, context_size=2048, node_memory_bytes=8 * 1024**3,
        worker_local=arm == "local", machines=machines, staged=staged,
        deliveries=("aws", "gcp", "azure") if staged else ("aws",),
    )  # fmt: skip
    started = time.monotonic()
    try:
        contract = cluster.up(options, timeout=1800)
        up_seconds = time.monotonic() - started
        spec = ClusterSpec.load(cache, options.cluster_id)
        network = spec.network()
        assert network is not None
        received = {w: received_bytes(network.namespace(w)) for w in WORKERS}
        staged_figures = {}
        if staged:
            staged_figures = {
                "main_sent_bytes": sent_bytes(network.namespace("main")),
                "store_reads": store_reads(spec, part_paths(options.model)[0].name),
            }
        url = contract[outputs.LLAMA_SERVER_URL]
        want = complete(url, timeout=120)
        namespace = network.namespace(WORKERS[-1])
        heals, rebooted = [], []
        for _ in range(kills):
            before = received_bytes(namespace)
            for pid in rpc_server_pids(namespace):
                os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            seconds = serve_again(url, want)
            heals.append({"seconds": round(seconds, 2),
                          "worker_received_bytes": received_bytes(namespace) - before,
                          **(main_restart(spec, killed) if machines else {})})  # fmt: skip
        for _ in range(reboots if machines else 0):
            before = received_bytes(namespace)  # the namespace outlives the machine's boots
            access.reboot(spec, WORKERS[-1])
            seconds = serve_again(url, want)
            received_now = received_bytes(namespace) - before
            rebooted.append({"seconds": round(seconds, 2), "worker_received_bytes": received_now})
        statuses = cluster.read_status(spec)
        return {
            "arm": arm,
            "up_seconds": round(up_seconds, 2),
            "worker_received_bytes": received,
            "slices": {n: statuses[n].get("slice") for n in ("main", *WORKERS)},
            **staged_figures,
            "heals": heals,
            **({"reboots": rebooted} if machines else {}),
        }
    finally:
        cluster.down(cache, options.cluster_id)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument("--kills", type=int, default=2)
    parser.add_argument("--machines", action="store_true", help="machines instead of processes")
    parser.add_argument("--reboots", type=int, default=2, help="with --machines")
    parser.add_argument("--staged", action="store_true", help="with --machines: lrc stage's store")
    args = parser.parse_args()
    source = sdist_tree(cache_dir(), download=False)
    busy_before = other_heavy_work()
    runs = []
    for number in range(args.repetitions):
        order = ("local", "sent") if number % 2 == 0 else ("sent", "local")
        for arm in order:
            runs.append(one_run(arm, number, source, kills=args.kills, reboots=args.reboots,
                                machines=args.machines, staged=args.staged))  # fmt: skip
            print(json.dumps(runs[-1]), file=sys.stderr)
    summary = summarize(runs, machines=args.machines, staged=args.staged)
    document = {
        "what": __doc__.split("\n\n")[0],
        "llama_cpp_commit": LLAMA_CPP_COMMIT,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "summary": summary,
        "runs": runs,
        "other_heavy_work": {"before": busy_before, "after": other_heavy_work()},
    }
    results = STAGED_RESULTS if args.staged else MACHINE_RESULTS if args.machines else RESULTS
    results.write_text(json.dumps(document, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


def from_main(run: dict[str, Any]) -> int:
    """What the workers received while the group loaded, less what the store sent them."""
    reads = run.get("store_reads", {})
    return sum(
        got - reads.get(w, {}).get("bytes", 0) for w, got in run["worker_received_bytes"].items()
    )


def summarize(runs: list[dict[str, Any]], *, machines: bool, staged: bool) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for arm in ("local", "sent"):
        mine = [r for r in runs if r["arm"] == arm]
        summary[arm] = {
            "worker_received_bytes": [from_main(r) for r in mine],
            "up_seconds": [r["up_seconds"] for r in mine],
            "heal_seconds": [h["seconds"] for r in mine for h in r["heals"]],
        }
        if machines:
            summary[arm]["reboot_seconds"] = [h["seconds"] for r in mine for h in r["reboots"]]
        if staged:
            summary[arm]["main_sent_bytes"] = [r["main_sent_bytes"] for r in mine]
    local, sent = summary["local"], summary["sent"]
    summary["received_ratio"] = round(
        sum(local["worker_received_bytes"]) / sum(sent["worker_received_bytes"]), 4
    )
    summary["heal_ratio"] = round(sum(local["heal_seconds"]) / sum(sent["heal_seconds"]), 3)
    if staged:
        summary["main_sent_ratio"] = round(
            sum(local["main_sent_bytes"]) / sum(sent["main_sent_bytes"]), 4
        )
    if machines:
        summary["reboot_ratio"] = round(
            sum(local["reboot_seconds"]) / sum(sent["reboot_seconds"]), 3
        )
    return summary


if __name__ == "__main__":
    sys.exit(main())
