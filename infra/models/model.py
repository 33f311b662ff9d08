"""One ``Model``: what sizing, placement and speed need to know of a model.

GB here is 10^9 bytes, as model hosts count. KV bytes per token (f16 cache) = layers x 2 (K and
V) x kv_heads x head_dim x 2 bytes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

from infra.core.errors import SettingError

KIB = 1024


class ModelError(SettingError):
    """A model description that cannot be used; names the setting to fix."""


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
    # Weights outside the repeating layers: the token embeddings, which llama.cpp always keeps on
    # the main node's CPU, and the output head, which goes with the last layer (a copy of the
    # embeddings when they are tied). Zero when unknown: the layers then carry all the weight.
    input_bytes: int = 0
    output_bytes: int = 0
    # The output head is the embeddings (tied): llama.cpp copies them only to another node.
    tied_embeddings: bool = False
    # Per-layer detail from a GGUF header. Empty: the layers are alike (presets, custom sizes).
    layer_weight_bytes: tuple[int, ...] = ()
    layer_kv_bytes_per_token: tuple[int, ...] = ()
    # Sliding-window attention: these layers cache only the last ``sliding_window`` tokens.
    sliding_window: int | None = None
    sliding_layers: frozenset[int] = frozenset()
    # The hidden width (n_embd): what a tensor-parallel engine exchanges per layer. None: unknown.
    embedding: int | None = None
    # A MoE's routed experts per layer and how many answer each token (0: not known).
    experts: int = 0
    experts_used: int = 0

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
        if not self.layer_weight_bytes and self.input_bytes + self.output_bytes >= self.size_bytes:
            raise ModelError("size", "the embeddings and output head leave nothing for the layers")
        if self.experts_used > self.experts or (self.experts_used > 0) != (self.experts > 0):
            raise ModelError("experts", f"{self.experts_used} of {self.experts} used a token")
        for name, values in (
            ("layer weights", self.layer_weight_bytes),
            ("layer KV bytes", self.layer_kv_bytes_per_token),
        ):
            if values and len(values) != self.layers:
                raise ModelError(name, f"{len(values)} values for {self.layers} layers")

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

    def read_share(self, tokens: int) -> float:
        """The share of the weights a step of ``tokens`` tokens reads: all of a dense model's; of
        a MoE's, the weights every token uses (attention, shared experts, routers) and the routed
        experts some token of the step chose, each expert chosen independently and uniformly
        (of E experts, k a token, n tokens leave (1 - k/E)^n of them unread). Without the
        expert counts, every token's experts are taken to be its own."""
        if tokens < 1:
            raise ValueError(f"a step has at least one token, not {tokens}")
        active = self.weight_bytes_per_token / self.size_bytes
        if not self.is_moe:
            return 1.0
        if not 0 < self.experts_used < self.experts:
            return min(1.0, tokens * active)
        always, chosen = self._always_and_chosen()
        return always + (1 - always) * (1 - (1 - chosen) ** tokens)

    def reuse_share(self, tokens: int) -> float:
        """The arithmetic of a step of ``tokens`` tokens beyond one pass over what it reads, in
        shares of the weights: ``tokens - 1`` of a dense model's; a MoE's every-token weights
        ``tokens - 1`` times, its routed experts as often as tokens chose them beyond the first
        (``tokens`` x k/E choices over ``read_share``'s distinct ones)."""
        if not self.is_moe:
            return float(tokens - 1)
        active = self.weight_bytes_per_token / self.size_bytes
        if not 0 < self.experts_used < self.experts:
            return (tokens - 1) * active
        always, chosen = self._always_and_chosen()
        distinct = 1 - (1 - chosen) ** tokens
        return always * (tokens - 1) + (1 - always) * (tokens * chosen - distinct)

    def _always_and_chosen(self) -> tuple[float, float]:
        """A MoE's share of weights every token uses, and the share of routed experts a token
        chooses (k/E): together they make its active share."""
        active = self.weight_bytes_per_token / self.size_bytes
        chosen = self.experts_used / self.experts
        return max(0.0, (active - chosen) / (1 - chosen)), chosen

    @cached_property
    def weights_per_layer(self) -> tuple[int, ...]:
        """Weight bytes of each repeating layer (evenly spread when the header is not known)."""
        if self.layer_weight_bytes:
            return self.layer_weight_bytes
        return _spread(self.size_bytes - self.input_bytes - self.output_bytes, self.layers)

    @cached_property
    def kv_per_layer(self) -> tuple[int, ...]:
        """f16 KV-cache bytes per token of each layer."""
        return self.layer_kv_bytes_per_token or _spread(self.kv_bytes_per_token, self.layers)


def _spread(total: int, parts: int) -> tuple[int, ...]:
    """``total`` in ``parts`` whole shares that differ by at most one and add up to it."""
    share, extra = divmod(total, parts)
    return tuple(share + (1 if i < extra else 0) for i in range(parts))


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
    size = int(size_gb * 1e9)
    # Without a header the embeddings and the output head are unknown: each is taken to weigh as
    # much as one layer, so the main node and the last worker are not sized too small.
    matrix = size // (layers + 2)
    return Model(
        name=f"custom-{size_gb:g}gb",
        size_bytes=size,
        layers=layers,
        kv_bytes_per_token=kv_bytes_per_token,
        context_length=context_length,
        source="custom",
        input_bytes=matrix,
        output_bytes=matrix,
    )


def resized(base: Model, size_bytes: int, layers: int, kv_bytes_per_token: int) -> Model:
    """``base``'s shape (embeddings, context length, experts) at another size: the same model
    quantised differently, as a stack's ``model`` setting may describe it."""
    if (base.size_bytes, base.layers, base.kv_bytes_per_token) == (
        size_bytes,
        layers,
        kv_bytes_per_token,
    ):
        return base
    scale = size_bytes / base.size_bytes

    def scaled(value: int) -> int:
        return int(value * scale)

    return dataclasses.replace(
        base,
        size_bytes=size_bytes,
        layers=layers,
        kv_bytes_per_token=kv_bytes_per_token,
        active_bytes=None if base.active_bytes is None else scaled(base.active_bytes),
        input_bytes=scaled(base.input_bytes),
        output_bytes=scaled(base.output_bytes),
        layer_weight_bytes=(),
        layer_kv_bytes_per_token=(),
        source="config",
    )
