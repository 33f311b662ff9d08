"""Describe a model from its GGUF header: size, layers, KV bytes per token, MoE active share.

Only headers are parsed (the file is memory-mapped and tensor data is never touched), so a
200 GB model costs nothing to describe. For a split GGUF, point at the first part: the other
parts (``name-0000K-of-0000N.gguf``) are found beside it and their headers read too.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.models.model import Model, ModelError
from infra.models.parts import part_paths, split_position

SETTING = "--gguf"
LAYER_TENSOR = re.compile(r"^blk\.(?P<layer>\d+)\.")
# f16 K and V cache entries.
KV_ELEMENT_BYTES = 2
# Which layers use sliding-window attention, for architectures whose header does not say
# (llama.cpp's defaults at the pinned commit): every layer but each n-th one.
SLIDING_WINDOW_PERIODS = {"gemma2": 2, "gemma3": 6, "cohere2": 4, "gpt-oss": 2}


@dataclass(frozen=True)
class _Part:
    fields: dict[str, Any]
    tensor_bytes: dict[str, int]
    tensor_elements: dict[str, int]


@contextmanager
def _errors(path: Path) -> Iterator[None]:
    try:
        yield
    except ModelError:
        raise
    except OSError as error:
        raise ModelError(SETTING, f"cannot read {path}: {error.strerror or error}") from None
    except (ValueError, IndexError, KeyError, TypeError) as error:
        raise ModelError(SETTING, f"{path} is not a readable GGUF file ({error})") from None


def _read_part(path: Path) -> _Part:
    import gguf  # noqa: PLC0415 (only --gguf needs it: `uv sync --extra plan`)

    with _errors(path):
        with path.open("rb") as f:
            if f.read(4) != b"GGUF":
                raise ModelError(SETTING, f"{path} is not a GGUF file (no GGUF magic number)")
        reader = gguf.GGUFReader(path)
        fields = {name: field.contents() for name, field in reader.fields.items()}
        return _Part(
            fields=fields,
            tensor_bytes={t.name: int(t.n_bytes) for t in reader.tensors},
            tensor_elements={t.name: int(t.n_elements) for t in reader.tensors},
        )


def _parts(first: Path, fields: dict[str, Any]) -> list[Path]:
    count = int(fields.get("split.count", 1))
    if count <= 1:
        return [first]
    position = split_position(first.name)
    if position is None or position[0] != 1:
        raise ModelError(
            SETTING, f"{first} is part of a {count}-part split GGUF; give the first part"
        )
    paths = part_paths(first, count)
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise ModelError(
            SETTING,
            f"parts {', '.join(missing)} are not beside {first.name}; put every part in one "
            "directory, or describe the model with --size-gb, --layers and --kv-bytes-per-token",
        )
    return paths


def _per_layer(value: Any, layers: int) -> list[int]:
    """A per-layer setting stored either once for all layers or as one value per layer."""
    if isinstance(value, list):
        return [int(v) for v in value]
    return [int(value)] * layers


def _kv_per_layer(fields: dict[str, Any], arch: str, layers: int) -> tuple[int, ...]:
    """f16 KV-cache bytes per token of each layer."""

    def get(key: str) -> Any:
        return fields.get(f"{arch}.{key}")

    rank = get("attention.kv_lora_rank")
    if rank:  # Multi-head latent attention caches the compressed latent and the rope part.
        rope = int(get("rope.dimension_count") or 0)
        return (2 * (int(rank) + rope) * KV_ELEMENT_BYTES,) * layers
    heads = get("attention.head_count")
    kv_heads = get("attention.head_count_kv") or heads
    embedding = get("embedding_length")
    if not heads or not embedding:
        raise ModelError(
            SETTING, f"the header has no {arch}.attention.head_count or embedding_length"
        )
    head_dim = int(embedding) // int(heads if not isinstance(heads, list) else max(heads))
    key_len = int(get("attention.key_length") or head_dim)
    value_len = int(get("attention.value_length") or head_dim)
    per_head = (key_len + value_len) * KV_ELEMENT_BYTES
    return tuple(h * per_head for h in _per_layer(kv_heads, layers))


def _sliding_layers(fields: dict[str, Any], arch: str, layers: int) -> frozenset[int]:
    """The layers that cache only a sliding window of tokens; none when unknown (which
    overestimates the KV cache rather than underestimating it)."""
    pattern = fields.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):
        return frozenset(i for i, sliding in enumerate(pattern) if sliding)
    period = int(pattern) if pattern else SLIDING_WINDOW_PERIODS.get(arch)
    if not period:
        return frozenset()
    return frozenset(i for i in range(layers) if i % period < period - 1)


def _layer_weights(tensor_bytes: dict[str, int], layers: int) -> tuple[int, int, tuple[int, ...]]:
    """(input bytes, output bytes, bytes of each layer) as llama.cpp places them: the output
    head (``output*``) with the last layer, a copy of the embeddings when the output is tied to
    them, and everything else outside the layers on the main node's CPU."""
    per_layer = [0] * layers
    input_bytes = output_bytes = 0
    for name, size in tensor_bytes.items():
        match = LAYER_TENSOR.match(name)
        if match and int(match["layer"]) < layers:
            per_layer[int(match["layer"])] += size
        elif name.startswith("output"):
            output_bytes += size
        else:
            input_bytes += size
    if "output.weight" not in tensor_bytes:
        output_bytes += tensor_bytes.get("token_embd.weight", 0)
    return input_bytes, output_bytes, tuple(per_layer)


def describe(path: str | Path) -> Model:
    """A ``Model`` from a GGUF file (the first part, for a split model)."""
    first = Path(path)
    if not first.is_file():
        raise ModelError(SETTING, f"{first} does not exist or is not a file")
    head = _read_part(first)
    parts = [head] + [_read_part(p) for p in _parts(first, head.fields)[1:]]
    fields = head.fields
    arch = fields.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelError(SETTING, f"{first} has no general.architecture; is it a model file?")
    layers = fields.get(f"{arch}.block_count")
    if not layers:
        raise ModelError(SETTING, f"{first} has no {arch}.block_count")
    layers = int(layers)
    tensor_bytes = {k: v for part in parts for k, v in part.tensor_bytes.items()}
    tensor_elements = {k: v for part in parts for k, v in part.tensor_elements.items()}
    size = sum(tensor_bytes.values())
    parameters = sum(tensor_elements.values())

    experts = int(fields.get(f"{arch}.expert_count") or 0)
    used = int(fields.get(f"{arch}.expert_used_count") or 0)
    active_bytes = active_parameters = None
    if experts > 1 and used:
        # Expert tensors (ffn_*_exps) are read only for the experts chosen for the token.
        idle = 1 - used / experts
        expert_bytes = sum(v for k, v in tensor_bytes.items() if "_exps" in k)
        expert_elements = sum(v for k, v in tensor_elements.items() if "_exps" in k)
        active_bytes = int(size - expert_bytes * idle)
        active_parameters = int(parameters - expert_elements * idle)
    context = fields.get(f"{arch}.context_length")
    window = fields.get(f"{arch}.attention.sliding_window")
    name = fields.get("general.name") or first.name
    kv_per_layer = _kv_per_layer(fields, arch, layers)
    input_bytes, output_bytes, layer_bytes = _layer_weights(tensor_bytes, layers)
    return Model(
        name=str(name),
        size_bytes=size,
        layers=layers,
        kv_bytes_per_token=sum(kv_per_layer),
        context_length=int(context) if context else None,
        active_bytes=active_bytes,
        parameters=parameters,
        active_parameters=active_parameters,
        source=f"gguf:{first}",
        input_bytes=input_bytes,
        output_bytes=output_bytes,
        tied_embeddings="output.weight" not in tensor_bytes,
        layer_weight_bytes=layer_bytes,
        layer_kv_bytes_per_token=kv_per_layer,
        sliding_window=int(window) if window else None,
        sliding_layers=_sliding_layers(fields, arch, layers) if window else frozenset(),
    )
