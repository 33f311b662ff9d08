"""Boot benchmarks: what a worker's build costs, and what RPC costs in decode and load time.

    uv run python bench/boot.py [--skip-build] [--repetitions N]

Writes bench/results/boot.json. Every figure is a ratio of two runs made here, one after the
other, on this machine:

- worker_build_cpu_ratio: CPU seconds of build-llama.sh for a worker over the same script
  building all four targets, each from an empty prefix (target <= 0.15).
- rpc_decode_ratio: llama-bench decode tokens/s through two ggml-rpc-server workers on loopback
  over one process alone, same threads in every active stage (half the cores each, so the two
  workers never share a core), generated 640 MB f16 model (target >= 0.85).
- rpc_load_warm_ratio: seconds until llama-server answers /health with the workers' tensor cache
  (--cache) warm over cold.
- machines_serve_ratio (``--serve-time``, root): seconds from `up` to the main node serving for a
  1+2 cluster of machines (real cloud-init and systemd) over the same cluster of processes in
  namespaces, warm build cache, median of the repetitions; beside it the node image's build
  seconds, as recorded when it was built.

    uv run python bench/boot.py --serve-time-only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from infra.core.pins import LLAMA_CPP_COMMIT  # noqa: E402
from infra.local import cluster  # noqa: E402
from infra.local import image as node_image  # noqa: E402
from infra.local.model import BENCH, cached_model  # noqa: E402
from infra.local.options import UpOptions, build_prefix  # noqa: E402
from infra.local.source import cache_dir, sdist_tree  # noqa: E402

SCRIPTS = REPO / "cloud-init" / "scripts"
RESULTS = REPO / "bench" / "results" / "boot.json"


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def build(role: str, prefix: Path, source: Path) -> tuple[float, float]:
    """CPU and wall seconds of build-llama.sh for ``role`` into an empty prefix."""
    env = {
        "PATH": os.environ["PATH"],
        "LLAMA_RPC_ENV_FILE": "/nonexistent",
        "LLAMA_ROLE": role,
        "LLAMA_CPP_COMMIT": LLAMA_CPP_COMMIT,
        "LLAMA_CPP_SOURCE": str(source),
        "LLAMA_PREFIX": str(prefix),
        "LLAMA_DATA_DIR": str(prefix / "data"),
    }
    cpu, wall = children_cpu(), time.monotonic()
    subprocess.run(["bash", str(SCRIPTS / "build-llama.sh")], env=env, check=True)
    return children_cpu() - cpu, time.monotonic() - wall


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_workers(
    bin_dir: Path, threads: int, cache: Path | None
) -> tuple[list[subprocess.Popen[bytes]], str]:
    workers, endpoints = [], []
    for i in range(2):
        port = free_port()
        env = dict(os.environ)
        args = [
            str(bin_dir / "ggml-rpc-server"),
            "-H",
            "127.0.0.1",
            "-p",
            str(port),
            "-t",
            str(threads),
        ]
        if cache is not None:
            env["LLAMA_CACHE"] = str(cache / f"w{i}")
            args.append("-c")
        workers.append(
            subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        )
        endpoints.append(f"127.0.0.1:{port}")
    for endpoint in endpoints:
        host, _, port_text = endpoint.partition(":")
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection((host, int(port_text)), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    return workers, ",".join(endpoints)


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        process.wait(timeout=30)


def decode_tps(
    bin_dir: Path, model: Path, threads: int, repetitions: int, rpc: str | None
) -> float:
    args = [
        str(bin_dir / "llama-bench"), "-m", str(model), "-p", "0", "-n", "32",
        "-t", str(threads), "-r", str(repetitions), "-o", "json",
    ]  # fmt: skip
    if rpc:
        args += ["--rpc", rpc, "-ngl", "99"]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return float(json.loads(out)[0]["avg_ts"])


def load_seconds(bin_dir: Path, model: Path, threads: int, rpc: str) -> float:
    return seconds_to_health(bin_dir, model, ["--rpc", rpc, "-ngl", "99", "-t", str(threads)])


def seconds_to_health(
    bin_dir: Path, model: Path, args: list[str], env: dict[str, str] | None = None
) -> float:
    """Seconds from starting llama-server (loopback, 512 tokens of context) with ``args`` (and
    ``env`` added to this process's environment) until /health answers."""
    port = free_port()
    started = time.monotonic()
    server = subprocess.Popen(
        [str(bin_dir / "llama-server"), "-m", str(model), "--host", "127.0.0.1",
         "--port", str(port), "-c", "512", *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})},
    )  # fmt: skip
    try:
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
                return time.monotonic() - started
            except OSError:
                if server.poll() is not None:
                    raise RuntimeError(f"llama-server exited while loading ({args})") from None
                time.sleep(0.05)
    finally:
        stop([server])


def serve_seconds(cache: Path, source: Path, machines: bool) -> float:
    """Seconds from `up` to serving for a main node and two workers, then down."""
    options = UpOptions(
        workers=2,
        model=cached_model(source, cache),
        source=source,
        cache=cache,
        cluster_id="bench",
        cidr="10.215.1.0/24",
        threads=1,
        worker_wait_seconds=300,
        machines=machines,
    )
    started = time.monotonic()
    try:
        cluster.up(options, timeout=900)
        return time.monotonic() - started
    finally:
        cluster.down(cache, "bench")


def serve_time(cache: Path, source: Path, repetitions: int) -> dict[str, object]:
    image = node_image.cached(cache)
    if image is None:
        raise SystemExit("no node image: run `lrc local image` first (as root)")
    build("all", build_prefix(cache), source)  # warm: both modes reuse the cached build
    runs: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(repetitions):  # interleaved, so a slow spell hits both modes alike
        for machines in (False, True):
            runs[machines].append(serve_seconds(cache, source, machines))
    median = {mode: sorted(times)[len(times) // 2] for mode, times in runs.items()}
    print(
        f"time to serve: machines {median[True]:.1f} s, namespaces {median[False]:.1f} s",
        file=sys.stderr,
    )
    return {
        "serve_seconds_machines": [round(t, 2) for t in runs[True]],
        "serve_seconds_namespaces": [round(t, 2) for t in runs[False]],
        "machines_serve_ratio": round(median[True] / median[False], 3),
        "node_image": {
            "release": image.manifest["release"],
            "versions": image.manifest["versions"],
            "build_seconds": image.manifest["build_seconds"],
            "built_at": image.manifest["built_at"],
        },
    }


def write(results: dict[str, object]) -> None:
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(previous | results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-build", action="store_true", help="skip the two clean builds")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument(
        "--serve-time", action="store_true", help="also time machines against namespaces (root)"
    )
    parser.add_argument("--serve-time-only", action="store_true", help="only that")
    args = parser.parse_args()

    cache = cache_dir()
    source = sdist_tree(cache)
    machine = {"cpus": os.cpu_count(), "arch": platform.machine()}
    if args.serve_time_only:
        write({"machine": machine} | serve_time(cache, source, args.repetitions))
        return 0
    # Each stage gets cores of its own, as each worker has its own machine in a cluster: two
    # workers with every core each would fight over the cores (ggml's idle threads spin).
    threads = max(1, (os.cpu_count() or 1) // 2)
    results: dict[str, object] = {
        "machine": machine,
        "llama_cpp_commit": LLAMA_CPP_COMMIT,
    }
    if not args.skip_build:
        with tempfile.TemporaryDirectory(prefix="bench-build-") as tmp:
            worker_cpu, worker_wall = build("worker", Path(tmp) / "worker", source)
            full_cpu, full_wall = build("all", Path(tmp) / "all", source)
        results |= {
            "worker_build_cpu_seconds": round(worker_cpu, 1),
            "worker_build_wall_seconds": round(worker_wall, 1),
            "full_build_cpu_seconds": round(full_cpu, 1),
            "full_build_wall_seconds": round(full_wall, 1),
            "worker_build_cpu_ratio": round(worker_cpu / full_cpu, 3),
        }
        print(f"build: worker {worker_cpu:.0f} s CPU, full {full_cpu:.0f} s CPU", file=sys.stderr)

    prefix = build_prefix(cache)
    build("all", prefix, source)  # the cached build, as the local cluster uses it
    bin_dir = prefix / LLAMA_CPP_COMMIT / "bin"
    model = cached_model(source, cache, BENCH)

    single = decode_tps(bin_dir, model, threads, args.repetitions, None)
    workers, rpc = start_workers(bin_dir, threads, None)
    try:
        through_rpc = decode_tps(bin_dir, model, threads, args.repetitions, rpc)
    finally:
        stop(workers)
    print(
        f"decode: one process {single:.2f} tok/s, two RPC workers {through_rpc:.2f} tok/s",
        file=sys.stderr,
    )

    tensor_cache = Path(tempfile.mkdtemp(prefix="bench-rpc-cache-"))
    try:
        loads = []
        for _ in range(2):  # cold, then warm: the workers restart, the cache stays
            workers, rpc = start_workers(bin_dir, threads, tensor_cache)
            try:
                loads.append(load_seconds(bin_dir, model, threads, rpc))
            finally:
                stop(workers)
    finally:
        shutil.rmtree(tensor_cache, ignore_errors=True)
    print(f"load: cold {loads[0]:.2f} s, warm {loads[1]:.2f} s", file=sys.stderr)

    results |= {
        "model_bytes": model.stat().st_size,
        "threads_per_stage": threads,
        "decode_tps_one_process": round(single, 3),
        "decode_tps_two_rpc_workers": round(through_rpc, 3),
        "rpc_decode_ratio": round(through_rpc / single, 3),
        "load_seconds_cold_cache": round(loads[0], 3),
        "load_seconds_warm_cache": round(loads[1], 3),
        "rpc_load_warm_ratio": round(loads[1] / loads[0], 3),
    }
    if args.serve_time:
        results |= serve_time(cache, source, args.repetitions)
    write(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
