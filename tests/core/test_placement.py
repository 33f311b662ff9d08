"""Layer placement: every node holds layers, the flags put them exactly there, and each fits."""

from __future__ import annotations

import bisect

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra import catalog
from infra.core import placement, sizing
from infra.models import PRESETS, Model

GIB = 1024**3


def llama_cpp_devices(n_layer: int, gpu_layers: int, tensor_split: tuple[int, ...]) -> list[int]:
    """The device of each layer 0..n_layer (n_layer is the output head) as llama.cpp at the
    pinned commit assigns it: -1 for the main node's CPU, k for the k-th RPC server.

    A transcription of llama_model_base::load_tensors (src/llama-model.cpp): split points are
    float32 prefix sums normalised by their total, and a layer goes to the first device whose
    split point is above (il - i_gpu_start) / act_gpu_layers.
    """
    splits = np.cumsum(np.array(tensor_split, dtype=np.float32), dtype=np.float32)
    splits = (splits / splits[-1]).astype(np.float32)
    i_gpu_start = max(n_layer + 1 - gpu_layers, 0)
    act_gpu_layers = min(gpu_layers, n_layer + 1) if tensor_split else 0
    devices = []
    for il in range(n_layer + 1):
        if il < i_gpu_start or il - i_gpu_start >= act_gpu_layers:
            devices.append(-1)
        else:
            x = np.float32(il - i_gpu_start) / np.float32(act_gpu_layers)
            devices.append(bisect.bisect_right(list(splits), x))
    return devices


def uniform(layers: int, size_gb: float = 10.0, kv: int = 64 * 1024) -> Model:
    return Model("m", int(size_gb * 1e9), layers, kv, source="custom")


@settings(max_examples=200, deadline=None)
@given(
    layers=st.integers(min_value=1, max_value=160),
    memory_gib=st.lists(st.integers(min_value=4, max_value=768), min_size=2, max_size=16),
    size_gb=st.floats(min_value=0.5, max_value=600),
)
def test_the_flags_put_every_layer_where_the_placement_says(
    layers: int, memory_gib: list[int], size_gb: float
) -> None:
    model = uniform(layers, size_gb)
    usable = [sizing.usable_of(m * GIB) for m in memory_gib]
    layout = placement.place(model, 4096, 1, usable)
    assert sum(layout.layers) == layers
    devices = llama_cpp_devices(layers, layout.gpu_layers, layout.tensor_split)
    held = [devices[:layers].count(k) for k in range(-1, len(memory_gib) - 1)]
    assert held == list(layout.layers)
    # The output head goes with the last worker, whose share counts it.
    assert devices[layers] == len(memory_gib) - 2


def test_shares_are_contiguous_and_each_fits() -> None:
    model = PRESETS["llama-3.1-405b-q4_0"]
    usable = [sizing.usable_of(128 * GIB)] * 3
    layout = placement.place(model, 4096, 1, usable)
    assert layout.fits and layout.layers == (42, 42, 42)
    assert [s.first_layer for s in layout.shares] == [0, 42, 84]
    assert [s.node for s in layout.shares] == ["main", "worker-1", "worker-2"]
    for share in layout.shares:
        assert share.need_bytes <= share.usable_bytes
        # Weights, KV cache and each node's compute buffers: 1.2 GB for a 405B model (the most
        # llama.cpp's buffers at ubatch 512 take).
        assert share.need_bytes == share.weight_bytes + share.kv_bytes + 1_200_000_000
    # The embeddings stay on the main node, the output head goes to the last worker.
    weights = model.weights_per_layer
    main, first, last = layout.shares
    assert main.weight_bytes == model.input_bytes + sum(weights[:42])
    assert first.weight_bytes == sum(weights[42:84])
    assert last.weight_bytes == sum(weights[84:]) + model.output_bytes
    assert sum(s.weight_bytes for s in layout.shares) == model.size_bytes
    assert (layout.gpu_layers, layout.tensor_split) == (85, (42, 43))


def test_the_main_node_holds_layers_of_a_model_of_98_layers_or_fewer() -> None:
    """With -ngl 99 an 80-layer model left the main node's memory idle; here it holds its part."""
    layout = placement.place(
        PRESETS["llama-3.1-70b-q4_k_m"], 4096, 1, [sizing.usable_of(64 * GIB)] * 3
    )
    assert layout.fits and layout.layers[0] >= 26
    assert layout.gpu_layers < 80


def test_a_smaller_main_node_holds_fewer_layers() -> None:
    """aws-r8g's shape: an r8g.4xlarge main node and two r8g.8xlarge workers."""
    main = sizing.usable_memory_bytes(catalog.find("aws", "us-east-1", "r8g.4xlarge"))
    worker = sizing.usable_memory_bytes(catalog.find("aws", "us-east-1", "r8g.8xlarge"))
    layout = placement.place(PRESETS["llama-3.1-405b-q4_k_m"], 8192, 1, [main, worker, worker])
    assert layout.fits
    assert layout.layers[0] < layout.layers[1] and layout.layers[0] < layout.layers[2]
    fill = [s.need_bytes / s.usable_bytes for s in layout.shares]
    assert max(fill) - min(fill) < 0.05  # shared by free memory: every node about as full


def test_layers_move_off_a_node_that_would_overflow() -> None:
    """Proportional shares rounded up can overflow a nearly full node; a layer moves away."""
    model = uniform(7, size_gb=7.0, kv=1024)
    per_layer = model.weights_per_layer[0] + sizing.compute_buffer_bytes(model.size_bytes) // 7
    tight = model.input_bytes + sizing.compute_buffer_bytes(model.size_bytes) + 2 * per_layer
    roomy = tight * 3
    layout = placement.place(model, 256, 1, [tight, roomy, tight])
    assert layout.fits, layout
    assert sum(layout.layers) == 7


def test_a_model_too_big_for_the_nodes_does_not_fit_and_names_the_busiest() -> None:
    model = PRESETS["llama-3.1-405b-q4_0"]
    layout = placement.place(model, 4096, 1, [sizing.usable_of(64 * GIB)] * 3)
    assert not layout.fits
    assert layout.worst.need_bytes > layout.worst.usable_bytes
    fewest = placement.fewest_workers(
        model, 4096, 1, main_usable=sizing.usable_of(64 * GIB),
        worker_usable=sizing.usable_of(64 * GIB), most=15,
    )  # fmt: skip
    assert fewest is not None
    assert placement.place(model, 4096, 1, [sizing.usable_of(64 * GIB)] * (fewest + 1)).fits
    assert not placement.place(model, 4096, 1, [sizing.usable_of(64 * GIB)] * fewest).fits


def test_every_slot_gets_the_whole_context_in_every_node_kv_cache() -> None:
    model = PRESETS["llama-3.1-70b-q4_0"]
    usable = [sizing.usable_of(256 * GIB)] * 2
    one = placement.place(model, 4096, 1, usable)
    four = placement.place(model, 4096, 4, usable)
    assert one.layers == four.layers
    for a, b in zip(one.shares, four.shares, strict=True):
        assert b.kv_bytes == 4 * a.kv_bytes
        assert a.kv_bytes == a.layers * model.kv_bytes_per_token // model.layers * 4096


@pytest.mark.parametrize(
    ("context", "slots", "per_slot"),
    [(4096, 1, 4096), (1000, 1, 1024), (4096, 3, 4096), (1000, 3, 1024), (300, 2, 512)],
)
def test_slot_context_follows_llama_cpps_padding(context: int, slots: int, per_slot: int) -> None:
    assert sizing.slot_context(context, slots) == per_slot >= context
    assert sizing.kv_cells(context, slots) == per_slot * slots


def test_a_sliding_window_layer_caches_the_window_and_a_micro_batch() -> None:
    assert sizing.kv_cells(4096, 1, window=512) == 1024
    assert sizing.kv_cells(4096, 2, window=512) == 2048
    assert sizing.kv_cells(256, 1, window=512) == 256  # never more than the context
    model = Model(
        "swa", int(1e9), 6, 6 * 1024, source="custom",
        sliding_window=512, sliding_layers=frozenset({0, 1, 2, 3, 4}),
    )  # fmt: skip
    [share] = placement.place(model, 8192, 1, [sizing.usable_of(16 * GIB)]).shares
    assert share.kv_bytes == 5 * 1024 * 1024 + 1 * 1024 * 8192


def test_a_cluster_without_workers_has_no_rpc_flags() -> None:
    layout = placement.place(uniform(32), 4096, 1, [sizing.usable_of(64 * GIB)])
    assert layout.layers == (32,) and layout.tensor_split == () and layout.gpu_layers == 0
    assert layout.to_json() == [{"node": "main", "layers": 32, "bytes": layout.shares[0].bytes}]


def test_the_longest_generation_is_a_slots_whole_context_at_the_decode_speed() -> None:
    """What a balancer's timeouts must outlast: 4,096 tokens at 1.63 tok/s (the 405B on three
    c8g.16xlarge) is 2,513 s; a slot's padded context counts, not the setting."""
    assert sizing.longest_generation_seconds(4096, 1, 1.63) == 2513
    assert sizing.longest_generation_seconds(4000, 1, 1.0) == 4096
    with pytest.raises(ValueError, match="a decode speed is positive"):
        sizing.longest_generation_seconds(4096, 1, 0)
