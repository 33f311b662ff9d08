"""Model descriptions: presets, custom sizes, and GGUF headers read with the gguf package."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from infra import gguf_model, models
from infra.models import ModelError


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
    with pytest.raises(ModelError, match=f"unknown model '{name}'; did you mean {suggestion}"):
        models.preset(name)


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
    m = gguf_model.describe(path)
    assert m.layers == 3 and m.context_length == 8192 and m.name == "test-model"
    assert m.size_bytes == 3 * 64 * 64 * 2  # three f16 64x64 tensors
    assert m.parameters == 3 * 64 * 64
    head_dim = 64 // 8
    assert m.kv_bytes_per_token == 3 * 2 * 2 * head_dim * 2
    assert not m.is_moe


def test_gguf_moe_counts_only_the_experts_in_use(tmp_path: Path) -> None:
    tensors = {
        "blk.0.attn_q.weight": np.zeros((16, 16), np.float32),  # 1 KiB, always read
        "blk.0.ffn_up_exps.weight": np.zeros((8, 16, 16), np.float32),  # 8 KiB over 8 experts
    }
    path = write_gguf(tmp_path / "moe.gguf", layers=1, embedding=16, heads=4, kv_heads=4,
                      experts=8, used=2, tensors=tensors)  # fmt: skip
    m = gguf_model.describe(path)
    assert m.size_bytes == 1024 + 8192
    assert m.active_bytes == 1024 + 8192 * 2 // 8
    assert m.active_parameters == 256 + 2048 * 2 // 8
    assert m.weight_bytes_per_token == m.active_bytes


def test_a_split_gguf_is_described_from_its_first_part(tmp_path: Path) -> None:
    for no in (1, 2):
        write_gguf(
            tmp_path / f"big-0000{no}-of-00002.gguf", split=(no, 2),
            tensors={f"blk.{no}.attn_q.weight": np.zeros((32, 32), np.float32)},
        )  # fmt: skip
    m = gguf_model.describe(tmp_path / "big-00001-of-00002.gguf")
    assert m.size_bytes == 2 * 32 * 32 * 4
    with pytest.raises(ModelError, match="give the first part"):
        gguf_model.describe(tmp_path / "big-00002-of-00002.gguf")
    (tmp_path / "big-00002-of-00002.gguf").unlink()
    with pytest.raises(ModelError, match=r"parts big-00002-of-00002\.gguf are not beside"):
        gguf_model.describe(tmp_path / "big-00001-of-00002.gguf")


def test_unreadable_and_non_gguf_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"^--gguf: .*missing\.gguf does not exist"):
        gguf_model.describe(tmp_path / "missing.gguf")
    with pytest.raises(ModelError, match="is not a file"):
        gguf_model.describe(tmp_path)
    text = tmp_path / "notes.gguf"
    text.write_text("this is not a model\n")
    with pytest.raises(ModelError, match="not a GGUF file"):
        gguf_model.describe(text)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ModelError, match="not a GGUF file"):
        gguf_model.describe(empty)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(write_gguf(tmp_path / "whole.gguf").read_bytes()[:40])
    with pytest.raises(ModelError, match="not a readable GGUF file"):
        gguf_model.describe(truncated)
