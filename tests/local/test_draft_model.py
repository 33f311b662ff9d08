"""A draft model on the local cluster: speculative decoding on the main node while two RPC workers
hold their layers. Greedy text is the same with and without it (the shared ``gemma_1p2``, the
same layers on the same nodes), and the server says how many drafted tokens it accepted.

The draft is the model itself under another name (no smaller real model of Gemma 3's vocabulary
is on PyPI): every drafted token the model would have chosen, so nearly all are accepted.

Traffic goes only to the namespaces these tests create.
"""

from __future__ import annotations

import dataclasses
import math
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.core import outputs, sizing
from infra.local import top
from infra.local.model import real_model
from infra.local.options import OptionError, UpOptions, plan_placement
from infra.local.source import cache_dir
from infra.local.spec import ClusterSpec
from tests.conftest import post
from tests.local.conftest import gemma_down, gemma_up

pytestmark = [pytest.mark.slow, pytest.mark.netns]

PROMPT = {
    "prompt": "The three largest cities of Italy are",
    "n_predict": 32,
    "temperature": 0,
    "cache_prompt": False,
}


@pytest.fixture(scope="module")
def draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model under a name of its own: the node saves each part by its file name."""
    path = tmp_path_factory.mktemp("draft") / "gemma-3-270m-draft.gguf"
    path.hardlink_to(real_model(cache_dir()))
    return path


@pytest.fixture(scope="module")
def drafted(llama_source: Path, draft: Path) -> Iterator[dict[str, Any]]:
    """The shared cluster's twin with the draft on its main node."""
    up = gemma_up(llama_source, 2, "d", draft_model=draft, draft_max=4)
    yield up
    gemma_down(up)


@pytest.fixture
def clusters(gemma_1p2: dict[str, Any], drafted: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Without the draft (the shared ``gemma_1p2``) and with it: the same layers on the same
    nodes, so the same kernels compute each (test_real_model.py says why that matters)."""
    plain, with_draft = ([(p["node"], p["layers"]) for p in up["spec"].placement]
                         for up in (gemma_1p2, drafted))  # fmt: skip
    assert plain == with_draft, (plain, with_draft)
    return {"plain": gemma_1p2, "draft": drafted}


def url_of(up: dict[str, Any]) -> str:
    url: str = up["contract"][outputs.LLAMA_SERVER_URL]
    return url


def test_greedy_text_is_the_same_with_a_draft_and_its_acceptance_is_reported(clusters) -> None:
    plain = post(url_of(clusters["plain"]), "/completion", PROMPT, timeout=300)
    drafted = post(url_of(clusters["draft"]), "/completion", PROMPT, timeout=300)
    assert drafted["content"] == plain["content"] and drafted["content"].strip()
    timings = drafted["timings"]
    assert "draft_n" not in plain["timings"]  # no draft: nothing drafted
    assert timings["draft_n"] > 0
    # The model drafting for itself: what it proposes is what it picks.
    assert timings["draft_n_accepted"] >= 0.9 * timings["draft_n"], timings


def test_the_metrics_count_the_drafted_and_accepted_tokens(clusters) -> None:
    url = url_of(clusters["draft"])
    post(url, "/completion", PROMPT, timeout=300)
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        text = response.read().decode()
    counters = {
        name: float(value)
        for name, value in re.findall(r"^llamacpp:(spec_decode_num_\w+_total) (\S+)$", text, re.M)
    }
    assert counters["spec_decode_num_draft_tokens_total"] > 0
    assert counters["spec_decode_num_accepted_tokens_total"] > 0
    assert (
        counters["spec_decode_num_accepted_tokens_total"]
        <= counters["spec_decode_num_draft_tokens_total"]
    )


def test_top_shows_the_share_of_drafted_tokens_accepted(clusters) -> None:
    up = clusters["draft"]
    post(url_of(up), "/completion", PROMPT, timeout=300)
    spec = ClusterSpec.load(up["options"].cache, up["options"].cluster_id)
    before = top.read_cluster(spec)
    after = top.read_cluster(spec)
    rows = {r.name: r for r in top.rows(before, after)}
    main = rows["main"]
    assert main.draft_accepted_percent is not None and main.draft_accepted_percent >= 90, main
    assert all(r.draft_accepted_percent is None for r in rows.values() if r.role == "worker")
    frame = top.frame(spec, before, after, 1)
    assert "ACC %" in frame and "drafted tokens accepted" in frame


def test_the_draft_is_counted_in_the_main_nodes_memory(llama_source: Path, draft: Path) -> None:
    """Its weights and KV cache come off the main node's share: a node just large enough for the
    model alone no longer fits both."""
    roomy = UpOptions(
        workers=0, model=real_model(cache_dir()), source=llama_source, cache=cache_dir(),
        context_size=2048, node_memory_bytes=64 * 1024**3,
    )  # fmt: skip
    need = plan_placement(roomy).worst.need_bytes
    # A node whose usable memory is the model's need and 16 MiB.
    usable = need + 16 * 1024**2
    memory = math.ceil((usable + sizing.OS_HEADROOM_BYTES) / (1 - sizing.OS_HEADROOM_FRACTION))
    tight = dataclasses.replace(roomy, node_memory_bytes=memory)
    assert plan_placement(tight).fits
    with pytest.raises(OptionError, match="does not fit"):
        plan_placement(dataclasses.replace(tight, draft_model=draft))
