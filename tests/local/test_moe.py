"""A mixture of experts on the local cluster: a generated Q4_0 MoE (Mixtral's expert tensors in
llama's architecture, eight experts of which two answer each token) through a main node and two
workers answers exactly as the model in one process, with each worker holding whole expert
layers and repacking their expert tensors for its CPU (patch 0005)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infra.core import outputs
from infra.local import cluster
from infra.local.model import MOE, cached_model
from infra.local.options import build_prefix, state_dir
from infra.local.source import cache_dir
from infra.local.spec import ClusterSpec
from infra.models import gguf_header
from tests.conftest import GREEDY_PROMPT, complete, one_node_completion, one_plus_two

pytestmark = [pytest.mark.slow, pytest.mark.netns]


@pytest.fixture(scope="module")
def moe(llama_source: Path) -> Any:
    model = cached_model(llama_source, cache_dir(), MOE)
    options = one_plus_two(llama_source, "moe", 218, model=model)
    try:
        contract = cluster.up(options, timeout=900)
        state = state_dir(options.cache, options.cluster_id)
        completion = complete(contract[outputs.LLAMA_SERVER_URL], timeout=120)
        workers = [(state / "logs" / f"w{i + 1}.log").read_text() for i in range(2)]
        spec = ClusterSpec.load(options.cache, options.cluster_id)
        placed = cluster.read_status(spec)["main"]["placement"]
        yield {"options": options, "spec": spec, "completion": completion, "workers": workers,
               "placed": placed}  # fmt: skip
    finally:
        cluster.down(options.cache, options.cluster_id)


def test_the_generated_model_is_a_mixture_of_experts(moe) -> None:
    model = gguf_header.describe(moe["options"].model)
    # Two of eight experts a token: the weights a token reads are well under the file.
    assert model.is_moe and model.active_bytes is not None
    assert model.active_bytes < 0.85 * model.size_bytes


def test_two_workers_answer_a_moe_exactly_as_one_node(moe) -> None:
    bin_dir = Path(build_prefix(moe["options"].cache)) / moe["spec"].commit / "bin"
    through_workers = moe["completion"]
    assert through_workers[0] and len(through_workers[1]) == GREEDY_PROMPT["n_predict"]
    assert through_workers == one_node_completion(bin_dir, moe["options"].model)


def test_each_worker_holds_expert_layers_and_repacks_them(moe) -> None:
    """llama-server's own account of where it put each layer: every node some, as planned."""
    placed = [(p["node"], p["layers"]) for p in moe["placed"]]
    assert placed == [(p["node"], p["layers"]) for p in moe["spec"].placement]
    assert all(layers > 0 for _, layers in placed[1:]) and sum(n for _, n in placed) == MOE.n_layer
    for log in moe["workers"]:
        assert "repack tensor blk." in log and "ffn_gate_exps.weight" in log
