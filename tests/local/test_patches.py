"""The llama.cpp patch set on the local cluster (the pinned build with its patches, real network
namespaces): through two workers the cluster answers exactly as one node computing the same way
(every patch on: as one node that repacks its weights, llama.cpp's default; every patch off: as
with only the workers' repack off), and each patch's switch really turns it off (the line the
patched loader or worker logs goes). Q4_0 weights over llama.cpp's 10 MiB hashing threshold, so
every patched path runs.

Each patch off in turn, the others on, is the opt-in ``--patch-matrix`` run (``patch_matrix``:
one boot a patch), for when the pin or the patch set moves."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from infra.boot.patches import patch_set
from infra.core import outputs
from infra.core.pins import LLAMA_CPP_COMMIT
from infra.local import cluster
from infra.local.model import LOAD, cached_model
from infra.local.options import state_dir
from infra.local.source import cache_dir
from tests.conftest import complete, one_plus_two

pytestmark = [pytest.mark.slow, pytest.mark.netns]

# What the patched loader says when each patch acts (0004 says nothing: its effect is a faster
# repack, and its output is compared on one node, where the main node repacks every layer). 0005
# speaks in each worker's log.
WORKER_SAYS = "weights repacked for this CPU (CPU_REPACK)"
SAYS = {
    "0001": "keeps no tensor cache: weights go without a hash probe",
    "0002": "contexts load on threads of their own",
    "0003": "not prefetching",
}
# The main node's memory as the pre-read decision sees it: 1 MiB, so the model "does not fit".
SMALL_MEMORY = (("LLAMA_MMAP_POPULATE", str(1 << 20)),)


class Served(NamedTuple):
    completion: tuple[str, list[tuple[int, float]]]
    log: str
    workers: list[str]
    worker_logs: list[str]


@pytest.fixture(scope="module")
def model(llama_source: Path) -> Path:
    return cached_model(llama_source, cache_dir(), dataclasses.replace(LOAD, n_layer=2))


def serve(llama_source: Path, model: Path, **changes: Any) -> Served:
    options = one_plus_two(llama_source, "pt", 214, model=model, **changes)
    try:
        contract = cluster.up(options, timeout=900)
        completion = complete(contract[outputs.LLAMA_SERVER_URL], timeout=120)
        state = state_dir(options.cache, options.cluster_id)
        log = "".join(
            p.read_text() for p in (state / "nodes" / "main").rglob("llama-server-load.log")
        )
        workers = [(state / "logs" / f"w{i + 1}.log").read_text() for i in range(options.workers)]
        return Served(completion, log, contract[outputs.WORKER_PRIVATE_IPS], workers)
    finally:
        cluster.down(options.cache, options.cluster_id)


def number(patch_name: str) -> str:
    return patch_name.split("-", 1)[0]


def test_the_pinned_commit_has_its_patch_set() -> None:
    numbers = [number(p.name) for p in patch_set(LLAMA_CPP_COMMIT)]
    assert numbers == ["0001", "0002", "0003", "0004", "0005", "0006", "0007"]


def all_on(llama_source: Path, model: Path) -> Served:
    """Every patch on, each saying so in the main node's load log."""
    on = serve(llama_source, model, llama_env=SMALL_MEMORY)
    assert on.completion[0] and len(on.completion[1]) == 12
    # Each worker named (the main node connects to a worker more than once while it loads).
    told = set(re.findall(rf"([\d.]+):\d+ {SAYS['0001']}", on.log))
    assert told == set(on.workers), on.log[-3000:]
    assert SAYS["0002"] in on.log and SAYS["0003"] in on.log
    assert len(on.worker_logs) == 2 and all(WORKER_SAYS in log for log in on.worker_logs)
    return on


def test_two_workers_answer_as_one_node_with_the_patches_on_and_as_before_with_them_off(
    llama_source: Path, model: Path
) -> None:
    """Every patch on, the workers repack their layers (0005) and the cluster's greedy text and
    log-probabilities are one repacking node's, to the bit; every patch off, they are those of the
    cluster with only 0005 off: the loader's patches change no byte, and 0005's switch keeps the
    weights as sent."""
    on = all_on(llama_source, model)
    # One thread a node, as on the workers (one_plus_two).
    assert on.completion == serve(llama_source, model, workers=0).completion
    upstream = serve(llama_source, model, patches_off=("all",))
    assert not any(line in upstream.log for line in SAYS.values())
    assert not any(WORKER_SAYS in log for log in upstream.worker_logs)
    plain_workers = serve(llama_source, model, llama_env=SMALL_MEMORY, patches_off=("0005",))
    assert not any(WORKER_SAYS in log for log in plain_workers.worker_logs)
    assert plain_workers.completion == upstream.completion


@pytest.mark.patch_matrix
def test_greedy_output_through_two_workers_is_the_same_with_each_patch_off(
    llama_source: Path, model: Path
) -> None:
    on = all_on(llama_source, model)
    for patch in patch_set(LLAMA_CPP_COMMIT):
        if number(patch.name) == "0005":  # its workers compute as one node that does not repack
            continue
        if number(patch.name) in ("0006", "0007"):  # worker-local loading's: test_worker_local
            continue
        off = serve(llama_source, model, llama_env=SMALL_MEMORY, patches_off=(number(patch.name),))
        assert off.completion == on.completion, patch.name
        for which, line in SAYS.items():
            assert (line in off.log) == (which != number(patch.name)), (patch.name, which)


def test_greedy_output_of_a_repacking_main_node_is_the_same_with_one_repack_thread(
    llama_source: Path, model: Path
) -> None:
    """No workers: the main node holds and repacks every Q4_0 layer (CPU_REPACK)."""
    threads = serve(llama_source, model, workers=0, threads=2)
    assert "CPU_REPACK" in threads.log
    one = serve(llama_source, model, workers=0, threads=2, patches_off=("0004",))
    assert one.completion == threads.completion
