"""The reference models: sizes, layers and KV cache from published model cards and llama.cpp's
tables, with the embeddings estimated from each family's vocabulary and width."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from infra.models.model import KIB, Model, ModelError


@dataclass(frozen=True)
class _Family:
    """What a model card publishes: parameters, layers, vocabulary and embedding width."""

    parameters: float
    layers: int
    kv_kib: float
    vocab: int
    embedding: int
    context_length: int = 131072
    active_parameters: float | None = None
    experts: int = 0  # a MoE's routed experts per layer
    experts_used: int = 0  # and how many answer each token


LLAMA_3_1_8B = _Family(8.03e9, 32, 128, 128256, 4096)
LLAMA_3_1_70B = _Family(70.6e9, 80, 320, 128256, 8192)
LLAMA_3_1_405B = _Family(405.9e9, 126, 504, 128256, 16384)
QWEN_2_5_72B = _Family(72.7e9, 80, 320, 152064, 8192, context_length=32768)
# 37B of 671B parameters are active per token (8 of 256 routed experts and a shared one); the
# weights read scale the same way. The published R1 GGUFs (January 2025) predate llama.cpp's
# latent-attention layout (PR #12801): they cache every head's K (192) and V (128), 128 heads a
# layer, 4,880 KiB a token (Arm's DeepSeek-R1 run: 19,520 MiB for 4,096 tokens).
DEEPSEEK_R1 = _Family(671e9, 61, 4880, 129280, 7168, context_length=163840,
                      active_parameters=37e9, experts=256, experts_used=8)  # fmt: skip
# The largest open MoE models of 2026, as llama.cpp's converter writes them since PR #12801: their
# latent attention caches one K row of 576 a layer and no V (llama-kv-cache.cpp at the pin), 61 x
# 576 x 2 = 70,272 B a token. Moonshot Kimi K2: 1.03 T parameters, 32 B active (8 of 384 routed
# experts and a shared one), 61 layers of 7,168, a 163,840-token vocabulary, 128k context (the
# model card, MoonshotAI/Kimi-K2; llama.cpp prints "model params = 1.026 T").
KIMI_K2 = _Family(1026.4e9, 61, 68.625, 163840, 7168, context_length=131072,
                  active_parameters=32e9, experts=384, experts_used=8)  # fmt: skip
# DeepSeek-V3.1 (August 2025): V3's 671B with 37B active (8 of 256 routed experts and a shared
# one), 61 layers of 7,168, 128k context; its GGUFs (unsloth's) postdate PR #12801 and cache the
# latent K row only, as Kimi K2's do.
DEEPSEEK_V3_1 = _Family(671e9, 61, 68.625, 129280, 7168, context_length=131072,
                        active_parameters=37e9, experts=256, experts_used=8)  # fmt: skip
# Qwen3-235B-A22B-Instruct-2507: 94 layers of 4,096, 4 KV heads of 128 (188 KiB a token), 128
# experts of which 8 answer, 256k context (its model card; unsloth's GGUF header).
QWEN3_235B = _Family(235.1e9, 94, 188, 151936, 4096, context_length=262144,
                     active_parameters=22e9, experts=128, experts_used=8)  # fmt: skip
# Arcee AFM-4.5B, a decode anchor on Graviton4 and Axion: 4.62 B parameters as llama-bench prints
# them (Arm's Axion learning path). Its layers, KV heads and vocabulary were not found published:
# 36 layers of width 2560 with 8 KV heads of 80 and a 128k vocabulary add up to 4.62 B.
AFM_4_5B = _Family(4.62e9, 36, 90, 128000, 2560, context_length=65536)
LLAMA_2_7B = _Family(6.74e9, 32, 512, 32000, 4096, context_length=4096)


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
        kv_bytes_per_token=round(family.kv_kib * KIB),
        context_length=family.context_length,
        active_bytes=int(size * active / family.parameters) if active else None,
        parameters=int(family.parameters),
        active_parameters=int(active) if active else None,
        input_bytes=matrix,
        output_bytes=matrix,
        embedding=family.embedding,
        experts=family.experts,
        experts_used=family.experts_used,
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
        # bartowski's, which Arm's Graviton4 run used: 353.00 GiB in 10 parts.
        _preset("deepseek-r1-q4_0", DEEPSEEK_R1, 379.03),
        # unsloth's Kimi-K2-Instruct GGUFs (docs.unsloth.ai, "Kimi K2: how to run locally"): the
        # dynamic 2-bit UD-Q2_K_XL, 381 GB in 8 parts, and the full Q8, 1.09 TB: more than one
        # VM holds on Google Cloud (576 GB) or Azure (672 GiB).
        _preset("kimi-k2-q2_k_xl", KIMI_K2, 381.0),
        _preset("kimi-k2-q8_0", KIMI_K2, 1090.0),
        # unsloth's DeepSeek-V3.1-GGUF: the dynamic UD-Q2_K_XL, 256 GB in 6 parts, and UD-Q5_K_XL,
        # 485 GB in 10 (huggingface.co/unsloth/DeepSeek-V3.1-GGUF/tree/main/UD-Q2_K_XL and
        # .../UD-Q5_K_XL); the 8-bit "full 671B", 715 GB (docs.unsloth.ai, "DeepSeek-V3.1: how
        # to run locally"; bartowski's V3-0324 Q8_0 is 713.29 GB): more than one VM holds on
        # Google Cloud (576 GB) or Azure (672 GiB).
        _preset("deepseek-v3.1-q2_k_xl", DEEPSEEK_V3_1, 256.0),
        _preset("deepseek-v3.1-q5_k_xl", DEEPSEEK_V3_1, 485.0),
        _preset("deepseek-v3.1-q8_0", DEEPSEEK_V3_1, 715.0),
        # unsloth's Qwen3-235B-A22B-Instruct-2507 Q4_K_M, 142.15 GB in 3 parts.
        _preset("qwen3-235b-a22b-q4_k_m", QWEN3_235B, 142.15),
        # llama-bench: 2.50 GiB; Q8_0 stores 34 bytes per 32 weights.
        _preset("afm-4.5b-q4_0", AFM_4_5B, 2.684),
        _preset("afm-4.5b-q8_0", AFM_4_5B, 4.909),
        _preset("llama-2-7b-q4_0", LLAMA_2_7B, 3.825),  # llama-bench: 3.56 GiB
    )
}


def _key(name: str) -> str:
    """The form names are compared in: any case, without a ``.gguf`` suffix or separators, so
    ``Llama_3.1_70B_Q4_0.gguf``, ``llama3.1-70b-q4_0`` and ``llama-3.1-70b-q4_0`` are one name."""
    name = name.strip().lower().removesuffix(".gguf")
    return re.sub(r"[\s._-]+", "", name)


def _base(name: str) -> str:
    """A preset's name without its quantisation: ``llama-3.1-70b`` of ``llama-3.1-70b-q4_0``."""
    return name.rsplit("-", 1)[0]


_BY_KEY = {_key(name): name for name in PRESETS}
# Every quantisation of each model, by the model's name without one.
_BY_BASE_KEY = {_key(_base(n)): [m for m in PRESETS if _base(m) == _base(n)] for n in PRESETS}


def preset(name: str, setting: str = "model") -> Model:
    """The preset called ``name`` (in any case and spelling of its separators, with or without
    ``.gguf``, or without the quantisation when the model comes in one); an unknown name
    suggests the closest ones."""
    key = _key(name)
    if key in _BY_KEY:
        return PRESETS[_BY_KEY[key]]
    choices = _BY_BASE_KEY.get(key, [])
    if len(choices) == 1:
        return PRESETS[choices[0]]
    if choices:
        quantisations = ", ".join(c.rsplit("-", 1)[1] for c in choices)
        raise ModelError(
            setting,
            f"{_base(choices[0])} comes in {quantisations}: give one, e.g. {choices[0]}",
        )
    close = difflib.get_close_matches(key, list(_BY_KEY), n=3, cutoff=0.4)
    hint = f"did you mean {' or '.join(_BY_KEY[c] for c in close)}? " if close else ""
    raise ModelError(setting, f"unknown preset {name!r}; {hint}known: {', '.join(PRESETS)}")
