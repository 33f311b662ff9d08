"""Model descriptions: presets, custom sizes, and GGUF headers read with the gguf package."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from infra import models
from infra.core import placement
from infra.models import ModelError, gguf_header, presets


def write_gguf(
    path: Path,
    *,
    layers: int = 3,
    heads: int = 8,
    kv_heads: int = 2,
    embedding: int = 64,
    experts: int = 0,
    used: int = 0,
    split: tuple[int, int] | None = None,
    tensors: dict[str, np.ndarray] | None = None,
    vocab: list[str] | None = None,
    fields: dict[str, int] | None = None,
) -> Path:
    import gguf

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("test-model")
    writer.add_context_length(8192)
    writer.add_block_count(layers)
    writer.add_embedding_length(embedding)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(used)
    if split:
        writer.add_uint16("split.no", split[0] - 1)
        writer.add_uint16("split.count", split[1])
    if vocab:  # a vocabulary is most of a real model's header
        writer.add_token_list(vocab)
    for key, value in (fields or {}).items():
        writer.add_uint32(key, value)
    if tensors is None:
        tensors = {f"blk.{i}.attn_q.weight": np.zeros((embedding, embedding), np.float16)
                   for i in range(layers)}  # fmt: skip
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_presets_carry_the_published_figures() -> None:
    m = models.preset("llama-3.1-405b-q4_0")
    assert (m.size_gb, m.layers, m.kv_bytes_per_token) == (228.8, 126, 504 * 1024)
    # KV bytes per token = layers x 2 x kv_heads x head_dim x 2: 126 x 2 x 8 x 128 x 2.
    assert m.kv_bytes_per_token == 126 * 2 * 8 * 128 * 2
    assert m.embedding == 16384
    deepseek = models.preset("deepseek-r1-q4_k_m")
    assert deepseek.is_moe and deepseek.weight_bytes_per_token == pytest.approx(404.3e9 * 37 / 671)
    assert models.preset("qwen2.5-72b-q4_k_m").context_length == 32768


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("llama-3.1-405b-q4", "llama-3.1-405b-q4_0"),
        ("llama-3.1-70B-Q8", "llama-3.1-70b-q8_0"),
        ("qwen-72b", "qwen2.5-72b-q4_k_m"),
    ],
)
def test_an_unknown_model_suggests_the_closest(name: str, suggestion: str) -> None:
    with pytest.raises(ModelError, match=f"unknown preset '{name}'; did you mean {suggestion}"):
        models.preset(name)


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("Llama-3.1-70B-Q4_0", "llama-3.1-70b-q4_0"),
        ("llama3.1-70b-q4_0", "llama-3.1-70b-q4_0"),
        ("llama_3.1_70b_q4_0", "llama-3.1-70b-q4_0"),
        ("llama 3.1 70b q4_k_m", "llama-3.1-70b-q4_k_m"),
        (" LLAMA-3.1-405B-Q8_0.gguf ", "llama-3.1-405b-q8_0"),
        ("Qwen2.5-72B-Instruct-Q4_K_M", None),  # another model's name: not guessed
        ("DeepSeek_R1_Q4_K_M.gguf", "deepseek-r1-q4_k_m"),
        ("deepseek-r1-Q4_0", "deepseek-r1-q4_0"),
        ("qwen2.5-72b", "qwen2.5-72b-q4_k_m"),  # the one quantisation there is
    ],
)
def test_a_preset_is_found_by_any_obvious_spelling(name: str, meant: str | None) -> None:
    if meant is None:
        with pytest.raises(ModelError, match="unknown preset"):
            models.preset(name)
    else:
        assert models.preset(name) is models.PRESETS[meant]


def test_a_model_in_several_quantisations_needs_one_named() -> None:
    with pytest.raises(
        ModelError,
        match=r"^model\.preset: llama-3\.1-70b comes in q4_0, q4_k_m, q8_0: give one, "
        r"e\.g\. llama-3\.1-70b-q4_0$",
    ):
        models.preset("Llama_3.1_70B", "model.preset")


def test_no_two_presets_or_models_share_a_spelling() -> None:
    """Names are compared without case or separators; that must leave every preset, and every
    model without its quantisation, a name of its own."""
    names = list(models.PRESETS)
    bases = {name.rsplit("-", 1)[0] for name in names}
    spellings = [presets._key(name) for name in [*names, *bases]]
    assert len(set(spellings)) == len(spellings)


@pytest.mark.parametrize(
    ("args", "setting"),
    [((0, 32, 1024), "--size-gb"), ((-4.0, 32, 1024), "--size-gb"), ((4.0, 0, 1024), "--layers"),
     ((4.0, 32, -1), "--kv-bytes-per-token")],
)  # fmt: skip
def test_a_custom_model_needs_positive_sizes(args: tuple, setting: str) -> None:
    with pytest.raises(ModelError, match=f"^{setting}: must be positive"):
        models.custom(*args)


def test_gguf_header_gives_size_layers_and_kv(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", layers=3, heads=8, kv_heads=2, embedding=64)
    m = gguf_header.describe(path)
    assert m.layers == 3 and m.context_length == 8192 and m.name == "test-model"
    assert m.size_bytes == 3 * 64 * 64 * 2  # three f16 64x64 tensors
    assert m.parameters == 3 * 64 * 64
    head_dim = 64 // 8
    assert m.kv_bytes_per_token == 3 * 2 * 2 * head_dim * 2
    assert m.embedding == 64  # the hidden width a tensor-parallel engine exchanges
    assert not m.is_moe


def test_a_ggufs_tensors_are_listed_with_their_bytes(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", layers=2, heads=8, kv_heads=2, embedding=64)
    assert gguf_header.tensor_bytes(path) == {f"blk.{i}.attn_q.weight": 64 * 64 * 2 for i in (0, 1)}
    with pytest.raises(ModelError, match="does not exist"):
        gguf_header.tensor_bytes(tmp_path / "missing.gguf")


def test_gguf_moe_counts_only_the_experts_in_use(tmp_path: Path) -> None:
    tensors = {
        "blk.0.attn_q.weight": np.zeros((16, 16), np.float32),  # 1 KiB, always read
        "blk.0.ffn_up_exps.weight": np.zeros((8, 16, 16), np.float32),  # 8 KiB over 8 experts
    }
    path = write_gguf(tmp_path / "moe.gguf", layers=1, embedding=16, heads=4, kv_heads=4,
                      experts=8, used=2, tensors=tensors)  # fmt: skip
    m = gguf_header.describe(path)
    assert m.size_bytes == 1024 + 8192
    assert m.active_bytes == 1024 + 8192 * 2 // 8
    assert m.active_parameters == 256 + 2048 * 2 // 8
    assert m.weight_bytes_per_token == m.active_bytes
    assert (m.experts, m.experts_used) == (8, 2)
    # A step reads the attention once and the experts some token chose: 2 of 8 each, so two
    # tokens leave (6/8)^2 of the experts unread.
    assert m.read_share(1) == pytest.approx(m.active_bytes / m.size_bytes)
    assert m.read_share(2) == pytest.approx((1024 + 8192 * (1 - 0.75**2)) / (1024 + 8192))
    assert m.read_share(64) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize(
    ("fields", "kv_heads", "per_layer"),
    [
        # As llama.cpp's converter writes DeepSeek V3 since PR #12801: the latent and the rope
        # part as one K row of 576, no V, at the pin.
        ({"kv_lora_rank": 512, "rope.dimension_count": 64, "attention.key_length": 576,
          "attention.value_length": 512, "attention.key_length_mla": 192,
          "attention.value_length_mla": 128}, 1, 576 * 2),
        # Converted before it (Arm's DeepSeek-R1 Q4_0 run: 19,520 MiB for 4,096 tokens): every
        # head's K of 192 and V of 128.
        ({"kv_lora_rank": 512, "rope.dimension_count": 64, "attention.key_length": 192,
          "attention.value_length": 128}, 128, 128 * 320 * 2),
    ],
)  # fmt: skip
def test_latent_attention_caches_as_llama_cpp_does_at_the_pin(
    tmp_path: Path, fields: dict[str, int], kv_heads: int, per_layer: int
) -> None:
    path = write_gguf(tmp_path / "mla.gguf", layers=2, heads=128, kv_heads=kv_heads, embedding=128,
                      fields={f"llama.{k}": v for k, v in fields.items()})  # fmt: skip
    assert gguf_header.describe(path).layer_kv_bytes_per_token == (per_layer, per_layer)


def test_a_split_gguf_is_described_from_its_first_part(tmp_path: Path) -> None:
    for no in (1, 2):
        write_gguf(
            tmp_path / f"big-0000{no}-of-00002.gguf", split=(no, 2),
            tensors={f"blk.{no}.attn_q.weight": np.zeros((32, 32), np.float32)},
        )  # fmt: skip
    m = gguf_header.describe(tmp_path / "big-00001-of-00002.gguf")
    assert m.size_bytes == 2 * 32 * 32 * 4
    with pytest.raises(ModelError, match="give the first part"):
        gguf_header.describe(tmp_path / "big-00002-of-00002.gguf")
    (tmp_path / "big-00002-of-00002.gguf").unlink()
    with pytest.raises(ModelError, match=r"parts big-00002-of-00002\.gguf are not beside"):
        gguf_header.describe(tmp_path / "big-00001-of-00002.gguf")


def test_unreadable_and_non_gguf_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"^--gguf: .*missing\.gguf does not exist"):
        gguf_header.describe(tmp_path / "missing.gguf")
    with pytest.raises(ModelError, match="is not a file"):
        gguf_header.describe(tmp_path)
    text = tmp_path / "notes.gguf"
    text.write_text("this is not a model\n")
    with pytest.raises(ModelError, match="not a GGUF file"):
        gguf_header.describe(text)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ModelError, match="not a GGUF file"):
        gguf_header.describe(empty)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(write_gguf(tmp_path / "whole.gguf").read_bytes()[:40])
    with pytest.raises(ModelError, match="not a readable GGUF file"):
        gguf_header.describe(truncated)


@pytest.mark.parametrize("big_endian", [False, True])
def test_the_header_reads_as_ggufs_own_reader_reads_it(tmp_path: Path, big_endian: bool) -> None:
    """Every value type, arrays of numbers, strings and booleans, tensors of several types."""
    import gguf

    order = gguf.GGUFEndian.BIG if big_endian else gguf.GGUFEndian.LITTLE
    writer = gguf.GGUFWriter(tmp_path / "m.gguf", "gemma3", endianess=order)
    writer.add_block_count(2)
    writer.add_token_list(["<pad>", "ü", "日本", *(f"{i:05d}" for i in range(100))])
    writer.add_token_scores([0.5] * 103)
    writer.add_array("gemma3.attention.sliding_window_pattern", [True, False])
    writer.add_array("test.int32s", [-1, 2**31 - 1])
    for add, value in (
        (writer.add_uint8, 255), (writer.add_int8, -128), (writer.add_uint16, 65535),
        (writer.add_int16, -32768), (writer.add_uint32, 2**32 - 1), (writer.add_int32, -(2**31)),
        (writer.add_float32, 0.25), (writer.add_bool, True), (writer.add_uint64, 2**64 - 1),
        (writer.add_int64, -(2**63)), (writer.add_float64, 1e-300), (writer.add_string, "ß"),
    ):  # fmt: skip
        add(f"test.{add.__name__.removeprefix('add_')}", value)
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((8, 64), np.float32))
    writer.add_tensor("blk.1.attn_q.weight", np.zeros((4, 64), np.float16))
    writer.add_tensor("token_embd.weight", np.zeros((8, 68), np.uint8),
                      raw_dtype=gguf.GGMLQuantizationType.Q8_0)  # fmt: skip
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    read = gguf_header._read_part(tmp_path / "m.gguf")
    reader = gguf.GGUFReader(tmp_path / "m.gguf")
    theirs = {n: f.contents() for n, f in reader.fields.items() if not n.startswith("GGUF.")}
    assert read.fields == theirs
    assert read.tensor_bytes == {t.name: int(t.n_bytes) for t in reader.tensors}
    assert read.tensor_elements == {t.name: int(t.n_elements) for t in reader.tensors}
    # Q8_0: 34 bytes a block of 32 weights.
    assert (read.tensor_elements["token_embd.weight"], read.tensor_bytes["token_embd.weight"]) == (
        8 * 64,
        8 * 68,
    )


def test_a_large_vocabulary_is_read_in_a_fraction_of_a_second(tmp_path: Path) -> None:
    """Gemma 3's 262,144 tokens: gguf's own reader takes tens of seconds over them, and the local
    cluster reads the header at every `up`."""
    path = write_gguf(tmp_path / "wordy.gguf", vocab=[f"{i:06d}" for i in range(262_144)])
    started = time.monotonic()
    model = gguf_header.describe(path)
    assert time.monotonic() - started < 3
    assert model.layers == 3


def test_the_header_says_what_each_layer_weighs_and_where_the_rest_goes(tmp_path: Path) -> None:
    tensors = {
        "token_embd.weight": np.zeros((100, 64), np.float32),
        "output_norm.weight": np.zeros(64, np.float32),
        "output.weight": np.zeros((100, 64), np.float16),
        **{f"blk.{i}.attn_q.weight": np.zeros((64, 64 * (i + 1)), np.float16) for i in range(3)},
    }
    m = gguf_header.describe(write_gguf(tmp_path / "m.gguf", tensors=tensors))
    assert m.input_bytes == 100 * 64 * 4
    assert m.output_bytes == 64 * 4 + 100 * 64 * 2
    assert m.weights_per_layer == (64 * 64 * 2, 64 * 128 * 2, 64 * 192 * 2)
    assert sum(m.weights_per_layer) + m.input_bytes + m.output_bytes == m.size_bytes
    assert m.kv_per_layer == (2 * 8 * 2 * 2,) * 3  # 2 KV heads of 8: K and V, f16


def test_tied_embeddings_give_the_output_head_a_copy_of_them(tmp_path: Path) -> None:
    tensors = {
        "token_embd.weight": np.zeros((100, 64), np.float16),
        **{f"blk.{i}.attn_q.weight": np.zeros((64, 64), np.float16) for i in range(3)},
    }
    m = gguf_header.describe(write_gguf(tmp_path / "m.gguf", tensors=tensors))
    assert m.input_bytes == m.output_bytes == 100 * 64 * 2 and m.tied_embeddings
    # On one node the output head is the embeddings themselves; on several, a copy.
    [alone] = placement.place(m, 256, 1, [2**30]).shares
    assert alone.weight_bytes == m.size_bytes
    main, worker = placement.place(m, 256, 1, [2**30, 2**30]).shares
    assert main.weight_bytes + worker.weight_bytes == m.size_bytes + m.output_bytes


def test_sliding_window_layers_follow_the_architecture_or_the_header(tmp_path: Path) -> None:
    import gguf

    def write(path: Path, pattern: list[bool] | None) -> Path:
        writer = gguf.GGUFWriter(path, "gemma3")
        writer.add_block_count(12)
        writer.add_embedding_length(64)
        writer.add_head_count(4)
        writer.add_head_count_kv(1)
        writer.add_uint32("gemma3.attention.sliding_window", 512)
        if pattern is not None:
            writer.add_array("gemma3.attention.sliding_window_pattern", pattern)
        for i in range(12):
            writer.add_tensor(f"blk.{i}.attn_q.weight", np.zeros((64, 64), np.float16))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path

    default = gguf_header.describe(write(tmp_path / "a.gguf", None))
    assert default.sliding_window == 512
    assert sorted(set(range(12)) - default.sliding_layers) == [5, 11]  # every 6th is global
    explicit = gguf_header.describe(write(tmp_path / "b.gguf", [True, False] * 6))
    assert explicit.sliding_layers == frozenset(range(0, 12, 2))


def test_presets_estimate_the_embeddings_from_the_model_card() -> None:
    """vocab x embedding at the file's bytes per parameter: 128256 x 16384 for Llama-3.1-405B."""
    m = models.preset("llama-3.1-405b-q4_0")
    assert (
        m.input_bytes == m.output_bytes == pytest.approx(128256 * 16384 * 228.8 / 405.9, rel=1e-6)
    )
    assert sum(m.weights_per_layer) + m.input_bytes + m.output_bytes == m.size_bytes
    custom = models.custom(10, 8, 1024)
    assert (
        custom.input_bytes == custom.output_bytes == custom.weights_per_layer[0] == int(1e10) // 10
    )
