"""Models the planner and the stack size for: the reference presets, a custom size, or a GGUF.

GB here is 10^9 bytes, as model hosts count. KV bytes per token (f16 cache) = layers x 2 (K and
V) x kv_heads x head_dim x 2 bytes. Every figure in ``PRESETS`` is from published model cards
and llama.cpp's tables.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

KIB = 1024


class ModelError(ValueError):
    """A model description that cannot be used; names the setting to fix."""

    def __init__(self, setting: str, message: str) -> None:
        self.setting = setting
        super().__init__(f"{setting}: {message}")


@dataclass(frozen=True)
class Model:
    name: str
    size_bytes: int
    layers: int
    kv_bytes_per_token: int
    # The longest context the model was trained for; None when not known (a custom model).
    context_length: int | None = None
    # Mixture of experts: the weight bytes read per token (the shared weights plus the experts
    # in use). None for a dense model, which reads every weight.
    active_bytes: int | None = None
    parameters: int | None = None
    active_parameters: int | None = None
    source: str = "preset"

    def __post_init__(self) -> None:
        for setting, value in (
            ("size", self.size_bytes),
            ("layers", self.layers),
            ("kv bytes per token", self.kv_bytes_per_token),
        ):
            if value <= 0:
                raise ModelError(setting, f"must be positive, got {value}")
        if self.context_length is not None and self.context_length <= 0:
            raise ModelError("context length", f"must be positive, got {self.context_length}")

    @property
    def size_gb(self) -> float:
        return self.size_bytes / 1e9

    @property
    def weight_bytes_per_token(self) -> int:
        """Weight bytes one decoded token reads: all of them, or a MoE's active share."""
        return self.active_bytes or self.size_bytes

    @property
    def is_moe(self) -> bool:
        return self.active_bytes is not None


def _preset(
    name: str,
    size_gb: float,
    layers: int,
    kv_kib: int,
    *,
    context_length: int = 131072,
    active_fraction: float | None = None,
) -> Model:
    size = int(size_gb * 1e9)
    return Model(
        name=name,
        size_bytes=size,
        layers=layers,
        kv_bytes_per_token=kv_kib * KIB,
        context_length=context_length,
        active_bytes=int(size * active_fraction) if active_fraction else None,
    )


PRESETS: dict[str, Model] = {
    m.name: m
    for m in (
        _preset("llama-3.1-8b-q4_0", 4.66, 32, 128),
        _preset("llama-3.1-8b-q4_k_m", 4.92, 32, 128),
        _preset("llama-3.1-8b-q8_0", 8.54, 32, 128),
        _preset("llama-3.1-70b-q4_0", 40.12, 80, 320),
        _preset("llama-3.1-70b-q4_k_m", 42.52, 80, 320),
        _preset("llama-3.1-70b-q8_0", 74.98, 80, 320),
        _preset("llama-3.1-405b-q4_0", 228.8, 126, 504),
        _preset("llama-3.1-405b-q4_k_m", 244.0, 126, 504),
        _preset("llama-3.1-405b-q8_0", 431.0, 126, 504),
        _preset("qwen2.5-72b-q4_k_m", 47.4, 80, 320, context_length=32768),
        # 37B of 671B parameters are active per token; the weights read scale the same way.
        _preset(
            "deepseek-r1-q4_k_m", 404.3, 61, 130, context_length=163840, active_fraction=37 / 671
        ),
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


def custom(
    size_gb: float, layers: int, kv_bytes_per_token: int, context_length: int | None = None
) -> Model:
    """A model described by hand, for one that is neither a preset nor on this machine."""
    for setting, value in (
        ("--size-gb", size_gb),
        ("--layers", layers),
        ("--kv-bytes-per-token", kv_bytes_per_token),
    ):
        if not value > 0:
            raise ModelError(setting, f"must be positive, got {value}")
    return Model(
        name=f"custom-{size_gb:g}gb",
        size_bytes=int(size_gb * 1e9),
        layers=layers,
        kv_bytes_per_token=kv_bytes_per_token,
        context_length=context_length,
        source="custom",
    )
