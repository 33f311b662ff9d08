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

from infra.models import Model, ModelError

SETTING = "--gguf"
SPLIT_NAME = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
# f16 K and V cache entries.
KV_ELEMENT_BYTES = 2


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
    match = SPLIT_NAME.match(first.name)
    if not match or int(match["no"]) != 1:
        raise ModelError(
            SETTING, f"{first} is part of a {count}-part split GGUF; give the first part"
        )
    paths = [
        first.with_name(f"{match['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)
    ]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise ModelError(
            SETTING,
            f"parts {', '.join(missing)} are not beside {first.name}; put every part in one "
            "directory, or describe the model with --size-gb, --layers and --kv-bytes-per-token",
        )
    return paths


def _per_layer_sum(value: Any, layers: int) -> int:
    """Sum a per-layer setting stored either once for all layers or as one value per layer."""
    if isinstance(value, list):
        return int(sum(value))
    return int(value) * layers


def _kv_bytes_per_token(fields: dict[str, Any], arch: str, layers: int) -> int:
    def get(key: str) -> Any:
        return fields.get(f"{arch}.{key}")

    rank = get("attention.kv_lora_rank")
    if rank:  # Multi-head latent attention caches the compressed latent and the rope part.
        rope = int(get("rope.dimension_count") or 0)
        return layers * 2 * (int(rank) + rope) * KV_ELEMENT_BYTES
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
    return _per_layer_sum(kv_heads, layers) * (key_len + value_len) * KV_ELEMENT_BYTES


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
    name = fields.get("general.name") or first.name
    return Model(
        name=str(name),
        size_bytes=size,
        layers=layers,
        kv_bytes_per_token=_kv_bytes_per_token(fields, arch, layers),
        context_length=int(context) if context else None,
        active_bytes=active_bytes,
        parameters=parameters,
        active_parameters=active_parameters,
        source=f"gguf:{first}",
    )
