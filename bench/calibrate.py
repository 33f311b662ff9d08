"""The planner's performance model against this machine: its rates measured here, fed to the same
model as a local instance type, its predictions beside what the local cluster measures.

    uv run python bench/calibrate.py [--repetitions 5] [--prompt 256] [--generate 64]
                                     [--draft-max 4] [--threads 1] [--model PATH] [--bin DIR]
    uv run python bench/calibrate.py --again bench/results/calibration.json [--model PATH]

Writes bench/results/calibration.json. Run it on a quiet machine: every figure is a timing.
``--again`` predicts a file's recorded runs once more with the model as it is now (no timing).

1. This machine (``perf.measured_node``): llama-bench on one node, ``--threads`` threads, of the
   model: a decode (its bandwidth as llama.cpp reaches it) and a 128-token prompt with the
   repacked kernels and with the plain ones (``--repack 0``: their compute rates), the way
   llama.cpp #13886's table gives the Neoverse-N2's. A numpy copy's GB/s is kept beside them.
   Whether the repacked kernels' one-row passes read the weights again comes from the threads,
   the model's largest layer matrix and this machine's level 2 cache (``perf.one_row_rereads``).
2. The model's predictions with those rates, on one node and through two RPC workers on loopback
   (every layer on the workers, as ``-ngl 99`` splits them: half each), which the calibration
   never saw: the decode, a ``--prompt``-token prompt's rate, a verify step of 4, 5 and 8 tokens
   (a prompt of that many: 5 has a row on its own), and a draft's speedup at ``--draft-max``.
3. The same figures measured: llama-bench for the first four, each test once a round beside the
   machine's own three, the rounds in alternating order (ABBA), so that each round's prediction
   is set beside the same round's measurement (this machine's speed drifts between runs by up to
   a quarter); and llama-server with and without the draft, the arms interleaved, for the
   speedup. Every run is kept. The draft is
   the model itself under another name (no smaller real model of Gemma 3's vocabulary is on
   PyPI, tests/local/test_draft_model.py): the acceptance llama-server reports (nearly every
   token) is an input of the prediction, so what is tested is the cost of drafting and checking.

Each row says the predicted and measured medians over the rounds, the median of each round's
own ratio (``ratio_rounds``), and whether it is within 25 %. The one-node decode is the machine's
own: its ratio says only that the model reproduces the run it was measured by.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from infra.core import perf, placement  # noqa: E402
from infra.core.pins import LLAMA_CPP_COMMIT  # noqa: E402
from infra.local.model import real_model  # noqa: E402
from infra.local.options import build_prefix  # noqa: E402
from infra.local.source import cache_dir  # noqa: E402
from infra.models import Model, gguf_header  # noqa: E402
from infra.observe import metrics  # noqa: E402
from infra.planner import engines  # noqa: E402

RESULTS = REPO / "bench" / "results" / "calibration.json"
TOLERANCE = 0.25
CALIBRATION_PROMPT = 128  # tokens of the prompt that measures compute (as #13886's S_PP)
# Verify steps: in fours (the repacked kernels' rows) and one past (a row on its own: a draft of
# four is checked in five).
VERIFY_TOKENS = (4, 5, 8)
HEAVY = "pytest|llama-server|llama-bench|rpc-server|systemd-nspawn|cc1plus"
PROMPT_TEXT = "The history of the printing press begins"


@dataclass(frozen=True)
class Machine:
    """This machine as llama.cpp measured it on one node (the inputs of ``node``)."""

    decode_tps: float
    kv_tokens: int
    repacked_prompt_tps: float
    plain_prompt_tps: float
    prompt_tokens: int = CALIBRATION_PROMPT
    # The repacked kernels' one-row passes read the weights again (``perf.one_row_rereads``).
    one_row_rereads: bool = False

    def node(self, model: Model) -> perf.NodeRates:
        """The local instance type: bandwidth and both kernels' compute rates."""
        found = {
            plain: perf.measured_node(
                model,
                decode_tps=self.decode_tps,
                prompt_tokens=self.prompt_tokens,
                prompt_tps=self.plain_prompt_tps if plain else self.repacked_prompt_tps,
                kv_tokens=self.kv_tokens,
                label="this machine",
                plain=plain,
                one_row_rereads=self.one_row_rereads,
            )
            for plain in (False, True)
        }
        return perf.NodeRates(
            found[False].bandwidth_gbps,
            found[False].repacked_flops,
            found[True].plain_flops,
            "this machine",
            self.one_row_rereads,
        )


def layouts(model: Model, context: int) -> dict[str, placement.Placement]:
    """One node; and two workers holding every layer, half each (``-ngl 99`` on loopback, where
    both report the same free memory), the main node the embeddings."""
    half = model.layers // 2
    room = [10 * model.size_bytes + 2**40] * 3
    return {
        "one node": perf.one_node(model, context),
        "two workers": placement.split(model, context, 1, [0, half, model.layers - half], room),
    }


def predict(
    model: Model,
    node: perf.NodeRates,
    *,
    prompt: int,
    generate: int,
    draft_max: int,
    acceptance: dict[str, float],
    workers_repack: bool,
) -> dict[str, dict[str, float]]:
    """Each figure the model predicts, per place (``layouts``): decode tok/s, a prompt's tok/s,
    a verify step's seconds at 4 and 8 tokens, and a draft's speedup at its measured per-token
    ``acceptance`` (the model drafting for itself on the main node)."""
    kv = generate // 2
    found: dict[str, dict[str, float]] = {}
    alone = perf.one_node(model, 2 * (prompt + generate))
    for where, layout in layouts(model, 2 * (prompt + generate)).items():
        nodes = [node] * len(layout.shares)

        def seconds(
            tokens: int,
            kv_tokens: int,
            nodes: list[perf.NodeRates] = nodes,
            layout: placement.Placement = layout,
        ) -> float:
            # llama-bench's pp: the last token's logits alone (the draft row has a check's).
            step = perf.step(model, nodes, layout, kv_tokens, tokens, outputs=1,
                             workers_repack=workers_repack)  # fmt: skip
            if step is None:
                raise ValueError("no compute rate")
            return step.seconds

        decode = seconds(1, kv)
        rate = perf.prompt_on(model, nodes, layout, prompt, workers_repack=workers_repack)
        drafted = engines.speculative_on(
            model, nodes, layout, kv, draft=model, draft_layout=alone,
            acceptance=acceptance[where], draft_max=draft_max, workers_repack=workers_repack,
        )  # fmt: skip
        if rate is None or drafted is None:
            raise ValueError("no compute rate")
        found[where] = {
            "decode_tps": 1 / decode,
            "prompt_tps": rate.tps,
            **{f"verify_{n}_seconds": seconds(n, n) for n in VERIFY_TOKENS},
            "draft_speedup": drafted.tps * decode,
        }
    return found


# Measuring


def other_heavy_work() -> list[str]:
    found = subprocess.run(["pgrep", "-af", HEAVY], capture_output=True, text=True, check=False)
    own = str(os.getpid())
    return [line[:100] for line in found.stdout.splitlines() if line.split()[0] != own]


def stream_gbps(size: int = 2**29, repetitions: int = 5) -> float:
    """A numpy copy of ``size`` bytes: bytes read and written over the fastest repetition."""
    import numpy as np  # noqa: PLC0415

    source, target = np.ones(size, dtype=np.uint8), np.empty(size, dtype=np.uint8)
    best = float("inf")
    for _ in range(repetitions):
        start = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - start)
    return 2 * size / best / 1e9


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(port: int, process: subprocess.Popen[bytes], what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{what} on port {port} exited ({process.returncode})")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"{what} on port {port} is not listening after {seconds:.0f} s")


@contextlib.contextmanager
def workers(bin_dir: Path, threads: int, logs: Path, tag: str) -> Iterator[str]:
    """Two ggml-rpc-server processes on loopback: their endpoints. A worker serves one main
    node at a time, so each llama-server gets a pair of its own."""
    processes, endpoints = [], []
    try:
        for i in range(2):
            port = free_port()
            log = (logs / f"worker-{tag}-{i}.log").open("wb")
            process = subprocess.Popen(
                [
                    str(bin_dir / "ggml-rpc-server"),
                    "-H",
                    "127.0.0.1",
                    "-p",
                    str(port),
                    "-t",
                    str(threads),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            processes.append(process)
            wait_for(port, process, "ggml-rpc-server")
            endpoints.append(f"127.0.0.1:{port}")
        yield ",".join(endpoints)
    finally:
        for process in processes:
            process.terminate()
            process.wait()


def bench(bin_dir: Path, model: Path, args: Sequence[str], repetitions: int) -> list[float]:
    """llama-bench's tokens/s of every repetition of one test."""
    argv = [
        str(bin_dir / "llama-bench"),
        "-m",
        str(model),
        "-r",
        str(repetitions),
        "-o",
        "json",
        *args,
    ]
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=1800)
    if result.returncode != 0:
        raise SystemExit(f"llama-bench {' '.join(args)} failed: {result.stderr[-2000:]}")
    (row,) = json.loads(result.stdout)
    return [float(x) for x in row["samples_ts"]]


def bench_tests(args: argparse.Namespace, rpc: str) -> dict[str, list[str]]:
    """Each llama-bench test a round runs once: this machine's three (a decode and a
    ``CALIBRATION_PROMPT``-token prompt with each kernel, one node) and the figures predicted
    from them, on one node and through the workers at ``rpc``."""
    one = ["-t", str(args.threads), "-ngl", "0"]
    two = ["-t", str(args.threads), "--rpc", rpc, "-ngl", "99"]
    decode = ["-p", "0", "-n", str(args.generate)]
    prompt = ["-p", str(CALIBRATION_PROMPT), "-n", "0"]
    tests = {
        "machine decode": [*one, *decode],
        "machine prompt repacked": [*one, *prompt, "--repack", "1"],
        "machine prompt plain": [*one, *prompt, "--repack", "0"],
    }
    for where, flags in (("one node", one), ("two workers", two)):
        if where == "two workers":
            tests[f"{where} decode_tps"] = [*flags, *decode]
        tests[f"{where} prompt_tps"] = [*flags, "-p", str(args.prompt), "-n", "0"]
        for tokens in VERIFY_TOKENS:
            tests[f"{where} verify_{tokens}"] = [*flags, "-p", str(tokens), "-n", "0"]
    return tests


def measure_rounds(
    bin_dir: Path, model: Path, args: argparse.Namespace, rpc: str
) -> dict[str, list[float]]:
    """Every test once a round, each round in the reverse order of the one before (ABBA), so
    that this machine's rates and the figures they predict are measured side by side: a round's
    prediction is set beside the same round's measurement (the machine drifts between runs)."""
    tests = bench_tests(args, rpc)
    runs: dict[str, list[float]] = {name: [] for name in tests}
    names = list(tests)
    for repetition in range(args.repetitions):
        for name in names if repetition % 2 == 0 else reversed(names):
            (value,) = bench(bin_dir, model, tests[name], 1)
            runs[name].append(value)
    return runs


def machine_of(
    runs: dict[str, list[float]], repetition: int, kv_tokens: int, *, one_row_rereads: bool
) -> Machine:
    return Machine(
        decode_tps=runs["machine decode"][repetition],
        kv_tokens=kv_tokens,
        repacked_prompt_tps=runs["machine prompt repacked"][repetition],
        plain_prompt_tps=runs["machine prompt plain"][repetition],
        one_row_rereads=one_row_rereads,
    )


def core_cache_bytes(cpu: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """This machine's per-core (level 2) cache, as the kernel lists it (e.g. ``1024K``)."""
    for index in sorted(cpu.glob("index*")):
        if (index / "level").read_text().strip() == "2":
            size = (index / "size").read_text().strip()
            units = {"K": 2**10, "M": 2**20}
            return int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
    raise SystemExit(f"no level 2 cache listed under {cpu}")


def largest_matrix_bytes(model: Path) -> int:
    """The largest weight matrix of the model's repeating layers (``blk.N.*.weight``)."""
    sizes = gguf_header.tensor_bytes(model)
    return max(size for name, size in sizes.items()
               if name.startswith("blk.") and name.endswith(".weight"))  # fmt: skip


def measured_of(runs: dict[str, list[float]], repetition: int) -> dict[str, dict[str, float]]:
    """A round's measured figures per place (the one-node decode is the machine's own)."""
    found: dict[str, dict[str, float]] = {}
    for where in ("one node", "two workers"):
        decode = "machine decode" if where == "one node" else f"{where} decode_tps"
        found[where] = {
            "decode_tps": runs[decode][repetition],
            "prompt_tps": runs[f"{where} prompt_tps"][repetition],
        }
        for tokens in VERIFY_TOKENS:  # a run recorded before a size was measured has none
            if f"{where} verify_{tokens}" in runs:
                rate = runs[f"{where} verify_{tokens}"][repetition]
                found[where][f"verify_{tokens}_seconds"] = tokens / rate
    return found


def compare_rounds(
    predicted: list[dict[str, dict[str, float]]], measured: list[dict[str, dict[str, float]]]
) -> list[dict[str, Any]]:
    """Each figure's predicted and measured medians over the rounds, and the median, least and
    most of each round's own ratio."""
    rows = []
    for where, figures in predicted[0].items():
        for what in figures:
            pairs = [
                (p[where][what], m[where][what])
                for p, m in zip(predicted, measured, strict=True)
                if what in m.get(where, {})
            ]
            if not pairs:
                continue
            ratios = [p / m for p, m in pairs]
            ratio = statistics.median(ratios)
            rows.append(
                {
                    "where": where,
                    "what": what,
                    "predicted": round(statistics.median(p for p, _ in pairs), 4),
                    "measured": round(statistics.median(m for _, m in pairs), 4),
                    "ratio": round(ratio, 3),
                    "ratio_rounds": [round(r, 3) for r in ratios],
                    "within_25_percent": abs(ratio - 1) <= TOLERANCE,
                }
            )
    return rows


@contextlib.contextmanager
def server(
    bin_dir: Path,
    model: Path,
    args: argparse.Namespace,
    rpc: str | None,
    *,
    draft: Path | None,
    log: Path,
) -> Iterator[int]:
    """llama-server on loopback (through ``rpc``'s workers, with ``draft``): its port."""
    port = free_port()
    argv = [str(bin_dir / "llama-server"), "-m", str(model), "--host", "127.0.0.1",
            "--port", str(port), "-t", str(args.threads), "-c", "2048", "-np", "1",
            "--metrics"]  # fmt: skip
    argv += ["--rpc", rpc, "-ngl", "99"] if rpc else ["-ngl", "0"]
    if draft is not None:  # as llama-server.sh runs one, but every draft k tokens long
        argv += ["--spec-draft-model", str(draft), "--spec-type", "draft-simple",
                 "--spec-draft-device", "none", "--spec-draft-n-max", str(args.draft_max),
                 "--spec-draft-n-min", str(args.draft_max), "--spec-draft-p-min", "0"]  # fmt: skip
    process = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        wait_for(port, process, "llama-server", 300)
        deadline = time.monotonic() + 300
        while not healthy(port):
            if time.monotonic() > deadline:
                raise SystemExit(f"llama-server on port {port} is not healthy after 300 s")
            time.sleep(0.5)
        yield port
    finally:
        process.terminate()
        process.wait()


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
            return True
    except OSError:
        return False


def generate(port: int, tokens: int) -> float:
    """One greedy completion: its generation tokens/s as llama-server timed it."""
    body = json.dumps(
        {
            "prompt": PROMPT_TEXT,
            "n_predict": tokens,
            "temperature": 0,
            "ignore_eos": True,
            "cache_prompt": False,
        }
    ).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/completion",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=1800) as reply:
        return float(json.loads(reply.read())["timings"]["predicted_per_second"])


def acceptance_of(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        found = metrics.draft_acceptance(metrics.Snapshot.parse(reply.read().decode(), 0))
    if found is None:
        raise SystemExit("the server with a draft reported no drafted tokens")
    return found.accepted / found.drafted


def measure_draft(
    bin_dir: Path,
    model: Path,
    args: argparse.Namespace,
    rpc: tuple[str, str] | None,
    work: Path,
) -> tuple[float, float, dict[str, list[float]]]:
    """The draft's speedup (with / without, each pair of runs interleaved) and its acceptance
    (accepted / drafted, as llama-server counts them). ``rpc``: each server's pair of workers."""
    draft = work / "draft.gguf"
    if not draft.exists():
        draft.symlink_to(model)
    runs: dict[str, list[float]] = {"without": [], "with": []}
    tag = "rpc" if rpc else "one"
    without_rpc, with_rpc = rpc or (None, None)
    with contextlib.ExitStack() as stack:
        plain = stack.enter_context(
            server(bin_dir, model, args, without_rpc, draft=None, log=work / f"server-{tag}.log")
        )
        drafted = stack.enter_context(
            server(
                bin_dir, model, args, with_rpc, draft=draft, log=work / f"server-{tag}-draft.log"
            )
        )
        for repetition in range(args.repetitions):
            arms = [("without", plain), ("with", drafted)]
            for arm, port in arms if repetition % 2 == 0 else reversed(arms):
                runs[arm].append(generate(port, args.generate))
        acceptance = acceptance_of(drafted)
    speedups = [w / o for w, o in zip(runs["with"], runs["without"], strict=True)]
    return statistics.median(speedups), acceptance, runs


def workers_repacked(logs: Path) -> bool:
    """Whether the workers said they repacked (the worker-repack patch logs it)."""
    return any("weights repacked" in p.read_text(errors="replace") for p in logs.glob("worker-*"))


def measure(model_path: Path, bin_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Every run: the rounds of llama-bench tests, and each place's draft speedup."""
    busy_before = other_heavy_work()
    with tempfile.TemporaryDirectory(prefix="calibrate-") as tmp:
        work = Path(tmp)
        bandwidth = stream_gbps()
        with contextlib.ExitStack() as stack:
            rpc = stack.enter_context(workers(bin_dir, args.threads, work, "a"))
            runs: dict[str, Any] = {"rounds": measure_rounds(bin_dir, model_path, args, rpc)}
            repacked = workers_repacked(work)
        draft: dict[str, float] = {}
        acceptance: dict[str, float] = {}
        for where in ("one node", "two workers"):
            with contextlib.ExitStack() as stack:
                pairs = None
                if where == "two workers":
                    pairs = (
                        stack.enter_context(workers(bin_dir, args.threads, work, "b")),
                        stack.enter_context(workers(bin_dir, args.threads, work, "c")),
                    )
                speedup, rate, runs[f"{where} draft"] = measure_draft(
                    bin_dir, model_path, args, pairs, work
                )
            draft[where] = speedup
            acceptance[where] = engines.per_token_acceptance(rate, args.draft_max)
    recorded = {
        "runs": runs,
        "workers_repacked": repacked,
        "draft_acceptance_per_token": acceptance,
        "draft_speedup": draft,
        "numpy_copy_gbps": bandwidth,
        "other_heavy_work": {"before": busy_before, "after": other_heavy_work()},
    }
    return recorded


def report(model_path: Path, args: argparse.Namespace, recorded: dict[str, Any]) -> dict[str, Any]:
    """The model's predictions from the ``recorded`` rounds' own machine, set beside what the
    same rounds measured."""
    model = gguf_header.describe(str(model_path))
    runs, rounds = recorded["runs"], recorded["runs"]["rounds"]
    acceptance, draft = recorded["draft_acceptance_per_token"], recorded["draft_speedup"]
    repacked = recorded["workers_repacked"]
    kv = args.generate // 2
    cache, matrix = core_cache_bytes(), largest_matrix_bytes(model_path)
    rereads = perf.one_row_rereads(args.threads, matrix, cache)
    predicted, measured = [], []
    for repetition in range(args.repetitions):
        node = machine_of(rounds, repetition, kv, one_row_rereads=rereads).node(model)
        predicted.append(
            predict(model, node, prompt=args.prompt, generate=args.generate,
                    draft_max=args.draft_max, acceptance=acceptance, workers_repack=repacked)
        )  # fmt: skip
        found = measured_of(rounds, repetition)
        for where, speedup in draft.items():
            found[where]["draft_speedup"] = speedup
        measured.append(found)
    rows = compare_rounds(predicted, measured)
    machine = Machine(
        decode_tps=statistics.median(rounds["machine decode"]),
        kv_tokens=kv,
        repacked_prompt_tps=statistics.median(rounds["machine prompt repacked"]),
        plain_prompt_tps=statistics.median(rounds["machine prompt plain"]),
        one_row_rereads=rereads,
    )
    node = machine.node(model)
    return {
        "what": "the planner's model (infra/core/perf.py, infra/planner/engines.py) fed this "
        "machine's rates as a local instance type, against llama.cpp here",
        "model": model_path.name,
        "llama_cpp_commit": LLAMA_CPP_COMMIT,
        "host": {"cpus": os.cpu_count(), "arch": platform.machine(), "core_cache_bytes": cache},
        "settings": {
            k: getattr(args, k)
            for k in ("repetitions", "prompt", "generate", "draft_max", "threads")
        },
        "machine": {
            "numpy_copy_gbps": round(recorded["numpy_copy_gbps"], 2),
            "llama_bandwidth_gbps": round(node.bandwidth_gbps, 2),
            "repacked_gflops": round((node.repacked_flops or 0) / 1e9, 2),
            "plain_gflops": round((node.plain_flops or 0) / 1e9, 2),
            "largest_matrix_bytes": matrix,
            "from": machine.__dict__,
        },
        "workers_repacked": repacked,
        "draft_acceptance_per_token": {k: round(v, 3) for k, v in acceptance.items()},
        "draft_speedup": draft,
        "rows": rows,
        "within_25_percent": all(r["within_25_percent"] for r in rows),
        "runs": runs,
        "other_heavy_work": recorded["other_heavy_work"],
        **{k: recorded[k] for k in ("predicted_again",) if k in recorded},
    }


def recorded_from(path: Path) -> dict[str, Any]:
    """A calibration file's own measurements, to predict them again with the model as it is now
    (its speedups from its runs; files written before they were kept whole)."""
    document = json.loads(path.read_text())
    runs = document["runs"]
    draft = document.get("draft_speedup") or {
        where: statistics.median(
            w / o for w, o in zip(runs[f"{where} draft"]["with"], runs[f"{where} draft"]["without"],
                                  strict=True)
        )
        for where in ("one node", "two workers")
    }  # fmt: skip
    return {
        "runs": runs,
        "workers_repacked": document["workers_repacked"],
        "draft_acceptance_per_token": document["draft_acceptance_per_token"],
        "draft_speedup": draft,
        "numpy_copy_gbps": document["machine"]["numpy_copy_gbps"],
        "other_heavy_work": document["other_heavy_work"],
        "predicted_again": "measured earlier, predicted again by the model as it is now",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--prompt", type=int, default=256, help="prompt tokens for the rate")
    parser.add_argument("--generate", type=int, default=64, help="tokens decoded per run")
    parser.add_argument("--draft-max", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="threads on each node")
    parser.add_argument("--model", type=Path, help="a GGUF (default: Gemma 3 270M Q4_K_M)")
    parser.add_argument("--bin", type=Path, help="the build's bin directory")
    parser.add_argument("--output", type=Path, default=RESULTS, help="where the JSON goes")
    parser.add_argument("--again", type=Path, help="predict a calibration file's runs again")
    args = parser.parse_args(argv)
    cache = cache_dir()
    model_path = args.model or real_model(cache)
    if args.again:
        recorded = recorded_from(args.again)
        settings = json.loads(args.again.read_text())["settings"]
        for key, value in settings.items():
            setattr(args, key, value)
    else:
        bin_dir = args.bin or build_prefix(cache) / LLAMA_CPP_COMMIT / "bin"
        recorded = measure(model_path, bin_dir, args)
    document = report(model_path, args, recorded)
    rows = document["rows"]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(document, indent=2) + "\n")
    for row in rows:
        print(
            f"{row['where']:<12} {row['what']:<18} predicted {row['predicted']:>10} "
            f"measured {row['measured']:>10} ratio {row['ratio']}"
        )
    return 0 if document["within_25_percent"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
