"""Reference models: GGUF size, layers and KV-cache bytes per token (f16), from published figures.

GB here is 10^9 bytes, as model hosts count. KV bytes per token = layers x 2 x kv_heads x
head_dim x 2 bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024


@dataclass(frozen=True)
class ModelPreset:
    name: str
    size_gb: float
    layers: int
    kv_bytes_per_token: int
    context_length: int = 131072

    @property
    def size_bytes(self) -> int:
        return int(self.size_gb * 1e9)


PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset("llama-3.1-8b-q4_0", 4.66, 32, 128 * KIB),
        ModelPreset("llama-3.1-8b-q4_k_m", 4.92, 32, 128 * KIB),
        ModelPreset("llama-3.1-8b-q8_0", 8.54, 32, 128 * KIB),
        ModelPreset("llama-3.1-70b-q4_0", 40.12, 80, 320 * KIB),
        ModelPreset("llama-3.1-70b-q4_k_m", 42.52, 80, 320 * KIB),
        ModelPreset("llama-3.1-70b-q8_0", 74.98, 80, 320 * KIB),
        ModelPreset("llama-3.1-405b-q4_0", 228.8, 126, 504 * KIB),
        ModelPreset("llama-3.1-405b-q4_k_m", 244.0, 126, 504 * KIB),
        ModelPreset("llama-3.1-405b-q8_0", 431.0, 126, 504 * KIB),
        ModelPreset("qwen2.5-72b-q4_k_m", 47.4, 80, 320 * KIB, context_length=32768),
        ModelPreset("deepseek-r1-q4_k_m", 404.3, 61, 130 * KIB, context_length=163840),
    )
}
