"""The prompt rate through two RPC workers with and without patch 0005 (a worker repacks its
weights for its CPU, CPU_REPACK, as a local CPU node does), in one run, the arms interleaved.

    uv run python bench/worker_repack.py [--repetitions 6] [--prompt 512] [--model PATH]
                                         [--bin DIR]

Writes bench/results/worker_repack.json. Four ggml-rpc-server processes listen on loopback, one
thread each: a pair as built (0005 on) and a pair with GGML_RPC_REPACK=0 (as upstream). Each
repetition runs llama-bench once through each pair (every layer on the workers, -ngl 99, one
thread on the main side), in the order ABBA, BAAB, ... so that neither arm always goes first;
every run's prompt rate is kept, with each arm's mean and spread and the ratio of each pair of
runs. The model is Gemma 3 270M Q4_K_M (the demo's; its Q4_K matrices have a repacked layout on
both x86 and Arm). Timings mean something only on a quiet machine: the figures record what else
was running.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from infra.core.pins import LLAMA_CPP_COMMIT  # noqa: E402
from infra.local.model import real_model  # noqa: E402
from infra.local.options import build_prefix  # noqa: E402
from infra.local.source import cache_dir  # noqa: E402

RESULTS = REPO / "bench" / "results" / "worker_repack.json"
HEAVY = "pytest|llama-server|llama-bench|rpc-server|systemd-nspawn|cc1plus"
ARMS = {"repacked": {}, "as_sent": {"GGML_RPC_REPACK": "0"}}


def other_heavy_work() -> list[str]:
    found = subprocess.run(["pgrep", "-af", HEAVY], capture_output=True, text=True, check=False)
    own = str(os.getpid())
    return [line[:100] for line in found.stdout.splitlines() if line.split()[0] != own]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"ggml-rpc-server on port {port} exited ({process.returncode})")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"ggml-rpc-server on port {port} is not listening after 30 s")


def start_pair(bin_dir: Path, arm: str, logs: Path) -> tuple[list[Any], str]:
    env = ARMS[arm]
    processes, endpoints = [], []
    for i in range(2):
        port = free_port()
        log = (logs / f"{arm}-{i}.log").open("wb")
        process = subprocess.Popen(
            [str(bin_dir / "ggml-rpc-server"), "-H", "127.0.0.1", "-p", str(port), "-t", "1"],
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_listening(port, process)
        processes.append(process)
        endpoints.append(f"127.0.0.1:{port}")
    return processes, ",".join(endpoints)


def prompt_rate(bin_dir: Path, model: Path, endpoints: str, prompt: int) -> float:
    argv = [
        str(bin_dir / "llama-bench"), "-m", str(model), "--rpc", endpoints, "-ngl", "99",
        "-p", str(prompt), "-n", "0", "-r", "1", "-t", "1", "-o", "json",
    ]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=900)
    if result.returncode != 0:
        raise SystemExit(f"llama-bench failed: {result.stderr[-2000:]}")
    (row,) = json.loads(result.stdout)
    return float(row["avg_ts"])


def summary(values: list[float]) -> dict[str, float]:
    return {
        "mean": round(statistics.fmean(values), 3),
        "stdev": round(statistics.stdev(values), 3) if len(values) > 1 else 0.0,
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--repetitions", type=int, default=6)
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens (llama-bench -p)")
    parser.add_argument("--model", type=Path, help="a GGUF (default: Gemma 3 270M Q4_K_M)")
    parser.add_argument("--bin", type=Path, help="the patched build's bin directory")
    args = parser.parse_args(argv)
    cache = cache_dir()
    model = args.model or real_model(cache)
    bin_dir = args.bin or build_prefix(cache) / LLAMA_CPP_COMMIT / "bin"
    logs = RESULTS.parent / "worker_repack-logs"
    logs.mkdir(parents=True, exist_ok=True)
    busy_before = other_heavy_work()
    pairs = {arm: start_pair(bin_dir, arm, logs) for arm in ARMS}
    runs: dict[str, list[float]] = {arm: [] for arm in ARMS}
    order: list[str] = []
    try:
        for repetition in range(args.repetitions):
            arms = list(ARMS) if repetition % 2 == 0 else list(reversed(ARMS))
            for arm in arms:
                runs[arm].append(prompt_rate(bin_dir, model, pairs[arm][1], args.prompt))
                order.append(arm)
    finally:
        for processes, _ in pairs.values():
            for process in processes:
                process.terminate()
                process.wait()
    # Each worker's own word (0005 logs once per connection when it repacks).
    said = {
        arm: [
            ("weights repacked" in p.read_text(errors="replace"))
            for p in sorted(logs.glob(f"{arm}-*.log"))
        ]
        for arm in ARMS
    }
    ratios = [on / off for on, off in zip(runs["repacked"], runs["as_sent"], strict=True)]
    figures: dict[str, Any] = {
        "what": f"prompt rate (tok/s) of a {args.prompt}-token prompt through two RPC workers on "
        "loopback, one thread each, every layer on the workers (llama-bench -ngl 99 -n 0 -r 1)",
        "model": model.name,
        "llama_cpp_commit": LLAMA_CPP_COMMIT,
        "host": {"cpus": os.cpu_count(), "arch": platform.machine()},
        "order": order,
        "runs": runs,
        "repacked": summary(runs["repacked"]),
        "as_sent": summary(runs["as_sent"]),
        "ratio_per_repetition": [round(r, 3) for r in ratios],
        "ratio": summary(ratios),
        "workers_said_they_repacked": said,
        "other_heavy_work": {"before": busy_before, "after": other_heavy_work()},
    }
    RESULTS.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps({k: figures[k] for k in ("repacked", "as_sent", "ratio")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
