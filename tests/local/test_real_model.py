"""A real model on the local cluster: Gemma 3 270M (Q4_K_M, from PyPI) through two workers (the
shared ``gemma_1p2``) and on one node, as a user runs it: completions that read as language,
chat, a prompt that fills the context, and the placement llama-server reports.

Traffic goes only to loopback and to the namespaces these tests create.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.core import outputs, placement
from infra.local import cluster
from infra.local.model import real_model
from infra.local.source import cache_dir
from infra.models.parts import model_id, part_paths
from tests.conftest import post, tokens_of_length
from tests.local.conftest import GEMMA_CONTEXT, gemma_down, gemma_up

pytestmark = [pytest.mark.slow, pytest.mark.netns]

CONTEXT = GEMMA_CONTEXT
# Greedy, with the top log-probability of each token; no prompt cache, so every request
# evaluates its whole prompt and results do not depend on earlier requests.
PROMPT = {
    "prompt": "The capital of France is the city of",
    "n_predict": 24,
    "temperature": 0,
    "n_probs": 1,
    "cache_prompt": False,
}


@pytest.fixture(scope="module")
def gemma() -> Path:
    return real_model(cache_dir())


@pytest.fixture
def two_workers(gemma_1p2: dict[str, Any]) -> dict[str, Any]:
    return gemma_1p2


@pytest.fixture(scope="module")
def one_node(llama_source: Path) -> Iterator[dict[str, Any]]:
    up = gemma_up(llama_source, 0, "s")
    yield up
    gemma_down(up)


def url_of(up: dict[str, Any]) -> str:
    url: str = up["contract"][outputs.LLAMA_SERVER_URL]
    return url


def complete(up: dict[str, Any]) -> tuple[str, list[tuple[int, float]]]:
    body = post(url_of(up), "/completion", PROMPT, timeout=300)
    return body["content"], [(p["id"], p["logprob"]) for p in body["completion_probabilities"]]


def test_the_answer_reads_as_language(two_workers) -> None:
    text, tokens = complete(two_workers)
    assert len(tokens) == PROMPT["n_predict"]
    assert "Paris" in text, text


def test_two_workers_answer_exactly_as_one_node(two_workers, one_node) -> None:
    """The same tokens and the same log-probabilities, whether three nodes share the layers or
    one node holds them all, as users run them: every node lays the weights out for its CPU's
    fast kernels, the main node as llama.cpp does and the workers with patch 0005 (upstream's
    workers kept plain buffers, and the greedy texts parted after about 14 tokens)."""
    through_workers, alone = complete(two_workers), complete(one_node)
    assert through_workers == alone
    assert len(through_workers[1]) == PROMPT["n_predict"] and "Paris" in through_workers[0]


@pytest.mark.parametrize("where", ["two_workers", "one_node"])
def test_the_placement_reported_is_the_one_computed(where: str, request) -> None:
    up = request.getfixturevalue(where)
    planned = up["spec"].placement
    placed = cluster.read_status(up["spec"])["main"]["placement"]
    assert [(p["node"], p["layers"]) for p in placed] == [(p["node"], p["layers"]) for p in planned]
    assert sum(p["layers"] for p in placed) == 18
    for got, want in zip(placed, planned, strict=True):
        # Sliding-window layers, the tied output head and the embeddings all counted: within a
        # MiB of what llama.cpp allocated.
        assert abs(got["bytes"] - want["bytes"]) <= 1024**2, (got, want)
    if where == "two_workers":
        assert [p["layers"] for p in planned] == [6, 6, 6]
        assert placed[0]["node"] == placement.MAIN


def test_chat_gets_an_answer_from_a_model_without_a_chat_template(two_workers) -> None:
    """Gemma 3 270M is a base model with no chat template: llama-server formats the messages
    with its ChatML default, and the model continues them."""
    url = url_of(two_workers)
    props = post(url, "/apply-template", {"messages": [{"role": "user", "content": "Hi"}]})
    assert props["prompt"].startswith("<|im_start|>user\nHi<|im_end|>")
    body = post(
        url,
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "Name the capital of France."}],
            "max_tokens": 24,
            "temperature": 0,
        },
        timeout=300,
    )
    [choice] = body["choices"]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"].strip()
    assert body["usage"]["completion_tokens"] > 0


def test_the_model_answers_to_its_id(two_workers, gemma: Path) -> None:
    """/v1/models names the model by its id (the file's name, as a stack's default modelAlias),
    not the GGUF's path on the node."""
    with urllib.request.urlopen(f"{url_of(two_workers)}/v1/models", timeout=60) as response:
        listed = json.load(response)
    assert [m["id"] for m in listed["data"]] == [model_id(part_paths(gemma)[0].name)]
    assert "/" not in listed["data"][0]["id"]


def test_a_streamed_chat_as_the_readmes_openai_client_sends_it(two_workers) -> None:
    """The README's client: any model name (llama-server serves its one model), `stream: true`;
    the answer arrives as server-sent events, a piece at a time, and ends with [DONE]."""
    body = {
        "model": "served",
        "messages": [{"role": "user", "content": "Name the capital of France."}],
        "max_tokens": 16,
        "temperature": 0,
        "stream": True,
    }
    request = urllib.request.Request(
        f"{url_of(two_workers)}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        events = [line[len(b"data: ") :] for line in response if line.startswith(b"data: ")]
    assert events[-1].strip() == b"[DONE]"
    pieces = [json.loads(event)["choices"][0]["delta"].get("content") for event in events[:-1]]
    assert len([p for p in pieces if p]) > 1 and "".join(p for p in pieces if p).strip()


@pytest.mark.parametrize("where", ["two_workers", "one_node"])
def test_a_prompt_that_fills_the_context_is_answered(where: str, request) -> None:
    up = request.getfixturevalue(where)
    url = url_of(up)
    prompt = tokens_of_length(url, CONTEXT - 64)
    body = post(url, "/completion", {"prompt": prompt, "n_predict": 64, "temperature": 0,
                                     "cache_prompt": False}, timeout=600)  # fmt: skip
    assert body["tokens_evaluated"] == CONTEXT - 64 and body["tokens_predicted"] == 64
    with pytest.raises(urllib.error.HTTPError) as refused:
        post(url, "/completion", {"prompt": tokens_of_length(url, CONTEXT), "n_predict": 8})
    assert refused.value.code == 400
