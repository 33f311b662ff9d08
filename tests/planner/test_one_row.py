"""The repacked kernels' one-row passes (ggml-cpu/repack.cpp at the pin): a step's rows past its
last four are multiplied one at a time, each a pass over the thread's chunk of the matrix, which
reads the weights again where the chunk outgrows the core's cache (one thread: the whole matrix)."""

from __future__ import annotations

import dataclasses

import pytest

from infra.core import perf, placement
from infra.models import PRESETS

MODEL = PRESETS["llama-3.1-8b-q4_0"]


@pytest.mark.parametrize(
    ("rows", "passes"),
    [(1, 0), (2, 1), (3, 2), (4, 0), (5, 1), (6, 2), (7, 3), (8, 0), (9, 1), (512, 0), (513, 1)],
)
def test_rows_past_the_last_four_are_passes_of_their_own(rows: int, passes: int) -> None:
    assert perf.one_row_passes(rows) == passes


def test_a_step_has_rows() -> None:
    with pytest.raises(ValueError, match="at least one row"):
        perf.one_row_passes(0)


@pytest.mark.parametrize(
    ("threads", "matrix", "cache", "rereads"),
    [
        (1, 25 * 2**20, 2**19, True),  # one thread: the whole matrix is its chunk
        (1, 2**18, 2**19, False),  # a matrix that fits the core's cache
        (64, 490 * 2**20, 2 * 2**20, False),  # a 405B FFN on 64 threads: 256 chunks of 1.9 MiB
        (16, 490 * 2**20, 2 * 2**20, True),  # the same on 16: 64 chunks of 7.7 MiB
    ],
)
def test_a_pass_rereads_where_a_threads_chunk_outgrows_its_cache(
    threads: int, matrix: int, cache: int, rereads: bool
) -> None:
    assert perf.one_row_rereads(threads, matrix, cache) is rereads


def rates(rereads: bool) -> perf.NodeRates:
    return perf.NodeRates(10.0, 1e11, 5e10, "node", one_row_rereads=rereads)


def test_each_one_row_pass_reads_the_layers_again_and_the_head_for_its_outputs() -> None:
    layout = perf.one_node(MODEL, 4096)
    (share,) = layout.shares
    cal = perf.calibration()
    read = cal.eta * 10.0 * 1e9
    head = perf.head_bytes(MODEL, share)
    layers = perf.computed_weight_bytes(MODEL, share) - head
    assert 0 < head < layers

    def gap(tokens: int, outputs: int = 1) -> float:
        steps = [perf.step(MODEL, [rates(r)], layout, 64, tokens, outputs=outputs)
                 for r in (True, False)]  # fmt: skip
        assert steps[0] is not None and steps[1] is not None
        return steps[0].seconds - steps[1].seconds

    assert gap(1) == 0 and gap(4) == 0 and gap(8) == pytest.approx(0, abs=1e-12)
    assert gap(5) == pytest.approx(layers / read)
    assert gap(3) == pytest.approx(2 * layers / read)
    # A draft's check of five computes every token's logits: the head's fifth row is a pass too.
    assert gap(5, outputs=5) == pytest.approx((layers + head) / read)


def test_plain_kernels_have_no_one_row_passes() -> None:
    """Upstream workers run the plain kernels, which take a step's rows in blocks of the same
    weights: only the repacking main node pays."""
    half = MODEL.layers // 2
    room = [10 * MODEL.size_bytes] * 3
    layout = placement.split(MODEL, 4096, 1, [0, half, MODEL.layers - half], room)

    def seconds(rereads: bool, workers_repack: bool) -> float:
        found = perf.step(MODEL, [rates(rereads)] * 3, layout, 64, 5,
                          workers_repack=workers_repack, outputs=1)  # fmt: skip
        assert found is not None
        return found.seconds

    assert seconds(True, workers_repack=False) == seconds(False, workers_repack=False)
    assert seconds(True, workers_repack=True) > seconds(False, workers_repack=True)


def test_a_measured_node_that_rereads_still_reproduces_its_own_runs() -> None:
    for prompt_tokens in (128, 126):  # 126: two rows on their own
        node = perf.measured_node(MODEL, decode_tps=20.0, prompt_tokens=prompt_tokens,
                                  prompt_tps=150.0, kv_tokens=64, label="here",
                                  one_row_rereads=True)  # fmt: skip
        assert node.one_row_rereads
        layout = perf.one_node(MODEL, 256)
        prompt = perf.step(MODEL, [node], layout, prompt_tokens, prompt_tokens, outputs=1)
        assert prompt is not None
        assert prompt.seconds == pytest.approx(prompt_tokens / 150.0)
    plain = perf.measured_node(MODEL, decode_tps=20.0, prompt_tokens=126, prompt_tps=150.0,
                               kv_tokens=64, label="here", plain=True,
                               one_row_rereads=True)  # fmt: skip
    assert dataclasses.replace(plain, one_row_rereads=False) == perf.measured_node(
        MODEL, decode_tps=20.0, prompt_tokens=126, prompt_tps=150.0, kv_tokens=64,
        label="here", plain=True,
    )  # fmt: skip
