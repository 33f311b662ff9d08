"""Load benchmarks: the per-byte rates the planner's time to serve uses (infra/planner/serve.py).

    uv run python bench/load.py [--repetitions 5] [--output FILE]

Writes bench/results/load.json. Everything runs on loopback with the pinned llama.cpp build (its
patch set applied, each patch turned off at run time by its switch) and generated Q4_0 models of
Llama-2-7B's layer shape at two depths (2 and 8 layers): each rate is the slope between the two,
so the fixed start-up cost drops out. The page cache is warm. "upstream" is the build with every
patch off, which is llama.cpp at the pin.

A load is timed from starting llama-server to the line its log writes once the model is loaded
and /health answers ("model loaded"), read as it is written (no polling). Every run of every arm
(case and depth) is one round's, and each round runs all arms, in the reverse order of the round
before (ABBA), so a machine that slows down weighs on every arm alike. Every repetition is kept
(``seconds``); each rate is the slope of the medians, and ``spread`` gives each rate's value
in every round (its slope from that round's runs alone) with median, min and max. Run it on a
quiet machine: every rate moves with what else runs.

- sha256_gbps_hashlib / sha256_gbps_coreutils: one core hashing a model file, as fetch-model.sh
  checks a part (Python's hashlib, which is OpenSSL) and as it did before (coreutils sha256sum).
- load_gbps: llama-server loading weights it holds itself (mmap, Q4_0 repacked), upstream.
- phases (GB/s of each loader phase, from differences of runs that differ in that phase alone):
  populate_gbps (the kernel's MAP_POPULATE of the cached file, timed alone: as a difference of
  two loads it drowns in their noise), repack_gbps_per_thread (the Q4_0 repack on one
  thread, and repack_threads_speedup on every core with patch 0004), hash_gbps (the FNV hash and
  cache probe that patch 0001 drops), copy_gbps (a weight's copies on their way to a worker: the
  send path without the hash, one tensor at a time).
- rpc_send_gbps (upstream) and rpc_send_gbps_patched: weights llama-server sends to one worker
  (no tensor cache); rpc2_*: to two workers, one after the other upstream, at once patched;
  send_path_speedup is patched over upstream for two workers, the loader's real case. The
  patched send path is the set without 0005 (workers keep the weights as sent, as upstream's
  do); worker_repack_gbps is what 0005 adds, a worker repacking each weight as it arrives (on
  this machine's two cores, beside the sender: a cloud worker repacks on its own cores).
  rpc_send_gbps_worker_cache: the worker's --cache writing each tensor to its disk, as workers
  did before.
- load_mode_none_*: the same two loads with --load-mode none (each tensor read once).
- cluster_load_ratio: a main node and two workers splitting the 8-layer model, upstream, seconds
  predicted from the rates above (the planner's composition: the main's share, then each
  worker's in turn) over seconds measured.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.boot import free_port, stop  # noqa: E402
from bench.rounds import interleaved, spread  # noqa: E402
from infra.boot.patches import patches_digest, switches_off  # noqa: E402
from infra.core.pins import LLAMA_CPP_COMMIT  # noqa: E402
from infra.local.model import LOAD, cached_model  # noqa: E402
from infra.local.options import build_prefix  # noqa: E402
from infra.local.source import cache_dir, sdist_tree  # noqa: E402
from infra.models import gguf_header  # noqa: E402

RESULTS = REPO / "bench" / "results" / "load.json"
DEPTHS = (2, 8)
GB = 1e9


def warm(path: Path) -> None:
    with path.open("rb") as f:
        while f.read(1 << 24):
            pass


def hashlib_seconds(path: Path) -> float:
    started = time.monotonic()
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return time.monotonic() - started


def populate_seconds(path: Path) -> float:
    """Seconds the kernel takes to map a cached file in with MAP_POPULATE, as llama_mmap maps a
    model that fits (one thread, in the kernel)."""
    with path.open("rb") as f:
        started = time.monotonic()
        mapped = mmap.mmap(
            f.fileno(), 0, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ
        )
        seconds = time.monotonic() - started
        mapped.close()
    return seconds


def coreutils_seconds(path: Path) -> float:
    started = time.monotonic()
    subprocess.run(["sha256sum", str(path)], check=True, capture_output=True)
    return time.monotonic() - started


class Worker:
    """One ggml-rpc-server on loopback, with or without a tensor cache."""

    def __init__(self, bin_dir: Path, cache: Path | None, env: dict[str, str]) -> None:
        self.port = free_port()
        args = [str(bin_dir / "ggml-rpc-server"), "--host", "127.0.0.1",
                "--port", str(self.port), "--threads", "1"]  # fmt: skip
        self.process = subprocess.Popen(
            args + (["--cache"] if cache else []),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, **env, **({"LLAMA_CACHE": str(cache)} if cache else {})},
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError("ggml-rpc-server did not listen")

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


# llama-server's log line once the model is loaded and /health answers (tools/server/server.cpp).
LOADED = "model loaded"


def seconds_to_loaded(
    bin_dir: Path, model: Path, args: list[str], env: dict[str, str], timeout: float = 600
) -> float:
    """Seconds from starting llama-server (loopback, 512 tokens of context) with ``args`` until
    its log says the model is loaded, read line by line as it comes."""
    port = free_port()
    server = subprocess.Popen(
        [str(bin_dir / "llama-server"), "-m", str(model), "--host", "127.0.0.1",
         "--port", str(port), "-c", "512", *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, **env},
    )  # fmt: skip
    started = time.monotonic()
    loaded: list[float] = []
    seen = threading.Event()

    def read() -> None:  # drains the log to its end, so that the server never blocks on it
        assert server.stderr is not None
        for line in server.stderr:
            if not seen.is_set() and LOADED.encode() in line:
                loaded.append(time.monotonic())
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        while not seen.wait(0.5):
            if server.poll() is not None:
                raise RuntimeError(f"llama-server exited while loading ({args})")
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"llama-server did not load in {timeout:.0f} s ({args})")
        seconds = loaded[0] - started
        # The line comes just before the server installs its signal handler and starts serving:
        # a SIGTERM in between is lost (the server then never ends). Stopped once it answers.
        answers(port, deadline=time.monotonic() + 30)
        return seconds
    finally:
        stop([server])
        reader.join(timeout=30)


def answers(port: int, deadline: float) -> bool:
    """Whether llama-server on ``port`` answers /health before ``deadline``."""
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
            return True
        except OSError:
            time.sleep(0.01)
    return False


def load_once(
    bin_dir: Path,
    model: Path,
    *,
    workers: int,
    extra: list[str],
    cache: bool,
    env: dict[str, str],
    threads: int = 1,
) -> float:
    """Seconds to serve ``model`` with ``workers`` fresh workers (cold tensor caches)."""
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        started = [Worker(bin_dir, Path(tmp) / f"w{i}" if cache else None, env)
                   for i in range(workers)]  # fmt: skip
        try:
            rpc = ["--rpc", ",".join(w.endpoint for w in started), "-ngl", "99"]
            if workers > 1:
                rpc += ["--tensor-split", ",".join(["1"] * workers)]
            warm(model)
            args = ["-t", str(threads), *(rpc if workers else []), *extra]
            return seconds_to_loaded(bin_dir, model, args, env)
        finally:
            for worker in started:
                worker.stop()


def slope_gbps(bytes_by_depth: dict[int, float], seconds: Callable[[int], float]) -> float:
    """GB/s of the bytes that differ between the two depths."""
    shallow, deep = DEPTHS
    return (bytes_by_depth[deep] - bytes_by_depth[shallow]) / (
        (seconds(deep) - seconds(shallow)) * GB
    )


def per_round(
    seconds: dict[str, dict[int, list[float]]],
    repetitions: int,
    value: Callable[[Callable[[str, int], float]], float],
) -> dict[str, object]:
    """``value`` of each round's runs alone (given how to read a case's seconds at a depth),
    with median, min and max."""

    def in_round(r: int) -> Callable[[str, int], float]:
        return lambda name, d: seconds[name][d][r]

    return spread([value(in_round(r)) for r in range(repetitions)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    cache = cache_dir()
    source = sdist_tree(cache)
    bin_dir = build_prefix(cache) / LLAMA_CPP_COMMIT / "bin"
    if not (bin_dir / "llama-server").is_file():
        sys.exit(f"no llama.cpp build in {bin_dir}: run `lrc local up` once first")
    models = {d: cached_model(source, cache, replace(LOAD, n_layer=d)) for d in DEPTHS}
    described = {d: gguf_header.describe(str(m)) for d, m in models.items()}
    # What moves between the depths: the layers' weights (the embeddings and head are alike).
    layer_bytes = {d: float(sum(described[d].layer_weight_bytes)) for d in DEPTHS}
    deep = models[DEPTHS[-1]]
    warm(deep)
    size = deep.stat().st_size
    hashes = [hashlib_seconds(deep) for _ in range(args.repetitions)]
    sums = [coreutils_seconds(deep) for _ in range(args.repetitions)]
    hashed, summed = statistics.median(hashes), statistics.median(sums)
    cpus = os.cpu_count() or 1
    populates = [populate_seconds(deep) for _ in range(5 * args.repetitions)]
    populated = statistics.median(populates)

    upstream = switches_off(LLAMA_CPP_COMMIT, ("all",))
    patched: dict[str, str] = {}

    def only_off(number: str) -> dict[str, str]:
        return switches_off(LLAMA_CPP_COMMIT, (number,))

    # The send path's patches without the workers' repack (0005), which is a phase of its own.
    send_path = only_off("0005")

    # name: (workers, extra flags, worker tensor cache, environment, threads)
    cases: dict[str, tuple[int, list[str], bool, dict[str, str], int]] = {
        "single": (0, [], False, upstream, 1),
        "single_none": (0, ["--load-mode", "none"], False, upstream, 1),
        "single_no_repack": (0, ["--no-repack"], False, upstream, 1),
        "single_repack_threads": (0, [], False, patched, cpus),
        "single_repack_one_thread": (0, [], False, only_off("0004"), cpus),
        "single_repack_threads_no_populate": (
            0, [], False, {"LLAMA_MMAP_POPULATE": "never"}, cpus
        ),
        "single_no_repack_threads": (0, ["--no-repack"], False, patched, cpus),
        "rpc": (1, [], False, upstream, 1),
        "rpc_patched": (1, [], False, send_path, 1),
        "rpc_worker_repack": (1, [], False, patched, 1),
        "rpc_hash": (1, [], False, {**send_path, **only_off("0002"), **only_off("0001")}, 1),
        "rpc_no_hash": (1, [], False, {**send_path, **only_off("0002")}, 1),
        "rpc2": (2, [], False, upstream, 1),
        "rpc2_patched": (2, [], False, send_path, 1),
        "rpc_none": (1, ["--load-mode", "none"], False, upstream, 1),
        "rpc_worker_cache": (1, [], True, upstream, 1),
    }  # fmt: skip
    # Every arm once a round, each round in the reverse order of the one before (ABBA); the
    # cluster's 8 layers split between two workers, upstream, is one more arm.
    cases["cluster"] = (2, [], False, upstream, 1)
    arms = [(name, d) for name in cases for d in (DEPTHS if name != "cluster" else DEPTHS[-1:])]
    seconds: dict[str, dict[int, list[float]]] = {name: {} for name in cases}
    load_before = os.getloadavg()
    for repetition, (name, d) in interleaved(arms, args.repetitions):
        workers, extra, tensor_cache, env, threads = cases[name]
        took = load_once(bin_dir, models[d], workers=workers, extra=extra,
                         cache=tensor_cache, env=env, threads=threads)  # fmt: skip
        seconds[name].setdefault(d, []).append(took)
        print(f"round {repetition} {name} {d} layers: {took:.3f} s", file=sys.stderr)
    load_after = os.getloadavg()
    runs = {name: {d: statistics.median(v) for d, v in by.items()} for name, by in seconds.items()}

    def rate(name: str) -> float:
        return slope_gbps(layer_bytes, lambda d: runs[name][d])

    def phase(slower: str, faster: str) -> float:
        """GB/s of the work ``slower`` does and ``faster`` does not."""
        return slope_gbps(layer_bytes, lambda d: runs[slower][d] - runs[faster][d])

    def rounds(value: Callable[[Callable[[str, int], float]], float]) -> dict[str, object]:
        return per_round(seconds, args.repetitions, value)

    def round_rate(name: str) -> Callable[[Callable[[str, int], float]], float]:
        return lambda at: slope_gbps(layer_bytes, lambda d: at(name, d))

    load_gbps, rpc_gbps = rate("single"), rate("rpc")
    # The cluster: 8 layers split between two workers, the main keeping the embeddings. The
    # planner's composition: start-up, the main's own weights, then each worker's in turn.
    measured = runs["cluster"][DEPTHS[-1]]
    startup = runs["single"][DEPTHS[0]] - layer_bytes[DEPTHS[0]] / (load_gbps * GB)
    sent = layer_bytes[DEPTHS[-1]]  # every layer goes to a worker with -ngl 99
    predicted = startup + (size - sent) / (load_gbps * GB) + sent / (rpc_gbps * GB)
    results = {
        "machine": {"cpus": os.cpu_count(), "arch": platform.machine()},
        "llama_cpp_commit": LLAMA_CPP_COMMIT,
        "patches": patches_digest(LLAMA_CPP_COMMIT, acting=True),  # what the loads ran with
        "model": {
            "shape": "Llama-2-7B layers, Q4_0",
            "bytes": {d: models[d].stat().st_size for d in DEPTHS},
        },
        "repetitions": args.repetitions,
        "timing": f"start to llama-server's '{LOADED}' log line; arms interleaved (ABBA)",
        "load_average": {"before": list(load_before), "after": list(load_after)},
        "sha256_gbps_hashlib": round(size / hashed / GB, 3),
        "sha256_gbps_coreutils": round(size / summed / GB, 3),
        "sha256_hashlib_speedup": round(summed / hashed, 2),
        "load_gbps": round(load_gbps, 3),
        "load_mode_none_load_gbps": round(rate("single_none"), 3),
        "phases": {
            "populate_gbps": round(size / populated / GB, 3),
            "repack_gbps_per_thread": round(phase("single", "single_no_repack"), 3),
            "repack_threads": cpus,
            # The same patched runs on every core, the repack on one thread (0004 off) or all.
            "repack_threads_speedup": round(
                phase("single_repack_threads", "single_no_repack_threads")
                / phase("single_repack_one_thread", "single_no_repack_threads"),
                2,
            ),
            # With every core repacking, a file already in the page cache loads faster when
            # the repack's threads fault its pages in than after one thread populated them.
            "load_gbps_threads": round(rate("single_repack_threads"), 3),
            "load_gbps_threads_no_populate": round(rate("single_repack_threads_no_populate"), 3),
            "hash_gbps": round(phase("rpc_hash", "rpc_no_hash"), 3),
            "copy_gbps": round(rate("rpc_no_hash"), 3),
            "worker_repack_gbps": round(phase("rpc_worker_repack", "rpc_patched"), 3),
        },
        "rpc_send_gbps": round(rpc_gbps, 3),
        "rpc_send_gbps_patched": round(rate("rpc_patched"), 3),
        "rpc2_send_gbps": round(rate("rpc2"), 3),
        "rpc2_send_gbps_patched": round(rate("rpc2_patched"), 3),
        "send_path_speedup": round(rate("rpc2_patched") / rate("rpc2"), 2),
        "load_mode_none_rpc_send_gbps": round(rate("rpc_none"), 3),
        "rpc_send_gbps_worker_cache": round(rate("rpc_worker_cache"), 3),
        "worker_cache_slowdown": round(rpc_gbps / rate("rpc_worker_cache"), 2),
        "medians": {
            name: {str(d): round(s, 3) for d, s in by.items()} for name, by in runs.items()
        },
        "seconds": {
            name: {str(d): [round(s, 4) for s in v] for d, v in by.items()}
            for name, by in seconds.items()
        },
        "spread": {
            "sha256_gbps_hashlib": spread([size / s / GB for s in hashes]),
            "sha256_gbps_coreutils": spread([size / s / GB for s in sums]),
            "populate_gbps": spread([size / s / GB for s in populates]),
            **{
                key: rounds(round_rate(name))
                for key, name in (
                    ("load_gbps", "single"),
                    ("rpc_send_gbps", "rpc"),
                    ("rpc_send_gbps_patched", "rpc_patched"),
                    ("rpc2_send_gbps", "rpc2"),
                    ("rpc2_send_gbps_patched", "rpc2_patched"),
                )
            },
            "send_path_speedup": rounds(
                lambda at: round_rate("rpc2_patched")(at) / round_rate("rpc2")(at)
            ),
        },
        "cluster_load_seconds": {"measured": round(measured, 3), "predicted": round(predicted, 3)},
        "cluster_load_ratio": round(predicted / measured, 3),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
