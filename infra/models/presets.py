"""The reference models: sizes, layers and KV cache from published model cards and llama.cpp's
tables, with the embeddings estimated from each family's vocabulary and width."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from infra.models.model import KIB, Model, ModelError


@dataclass(frozen=True)
class _Family:
    """What a model card publishes: parameters, layers, vocabulary and embedding width."""

    parameters: float
    layers: int
    kv_kib: int
    vocab: int
    embedding: int
    context_length: int = 131072
    active_parameters: float | None = None


LLAMA_3_1_8B = _Family(8.03e9, 32, 128, 128256, 4096)
LLAMA_3_1_70B = _Family(70.6e9, 80, 320, 128256, 8192)
LLAMA_3_1_405B = _Family(405.9e9, 126, 504, 128256, 16384)
QWEN_2_5_72B = _Family(72.7e9, 80, 320, 152064, 8192, context_length=32768)
# 37B of 671B parameters are active per token; the weights read scale the same way.
DEEPSEEK_R1 = _Family(671e9, 61, 130, 129280, 7168, context_length=163840, active_parameters=37e9)


def _preset(name: str, family: _Family, size_gb: float) -> Model:
    size = int(size_gb * 1e9)
    # The embedding and output matrices are vocab x embedding each, at the file's average bytes
    # per parameter (the quantisation mixes types, so this is an estimate; a GGUF is exact).
    matrix = int(family.vocab * family.embedding * size / family.parameters)
    active = family.active_parameters
    return Model(
        name=name,
        size_bytes=size,
        layers=family.layers,
        kv_bytes_per_token=family.kv_kib * KIB,
        context_length=family.context_length,
        active_bytes=int(size * active / family.parameters) if active else None,
        parameters=int(family.parameters),
        active_parameters=int(active) if active else None,
        input_bytes=matrix,
        output_bytes=matrix,
    )


PRESETS: dict[str, Model] = {
    m.name: m
    for m in (
        _preset("llama-3.1-8b-q4_0", LLAMA_3_1_8B, 4.66),
        _preset("llama-3.1-8b-q4_k_m", LLAMA_3_1_8B, 4.92),
        _preset("llama-3.1-8b-q8_0", LLAMA_3_1_8B, 8.54),
        _preset("llama-3.1-70b-q4_0", LLAMA_3_1_70B, 40.12),
        _preset("llama-3.1-70b-q4_k_m", LLAMA_3_1_70B, 42.52),
        _preset("llama-3.1-70b-q8_0", LLAMA_3_1_70B, 74.98),
        _preset("llama-3.1-405b-q4_0", LLAMA_3_1_405B, 228.8),
        _preset("llama-3.1-405b-q4_k_m", LLAMA_3_1_405B, 244.0),
        _preset("llama-3.1-405b-q8_0", LLAMA_3_1_405B, 431.0),
        _preset("qwen2.5-72b-q4_k_m", QWEN_2_5_72B, 47.4),
        _preset("deepseek-r1-q4_k_m", DEEPSEEK_R1, 404.3),
    )
}


def preset(name: str, setting: str = "model") -> Model:
    """The preset called ``name``; an unknown name suggests the closest ones."""
    found = PRESETS.get(name.strip().lower())
    if found:
        return found
    close = difflib.get_close_matches(name.lower(), list(PRESETS), n=3, cutoff=0.4)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise ModelError(setting, f"unknown model {name!r}; {hint}known: {', '.join(PRESETS)}")
