"""Describe a model from its GGUF header: size, layers, KV bytes per token, MoE active share.

Only headers are parsed (the file is memory-mapped and tensor data is never touched), so a
200 GB model costs nothing to describe. For a split GGUF, point at the first part: the other
parts (``name-0000K-of-0000N.gguf``) are found beside it and their headers read too.

The file may also be an http(s) URL: its header is fetched with range requests, growing until
all of it is in hand, into a sparse file of the model's full length, so the same parser reads
it and no tensor data is downloaded.
"""

from __future__ import annotations

import http.client
import re
import struct
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from infra.models.model import Model, ModelError
from infra.models.parts import part_paths, saved_name, split_position

SETTING = "--gguf"
MIB = 1 << 20
# A header is mostly the vocabulary: ~9 MB for Llama 3's 128k tokens. Fetch this much first and
# double until the whole header is in, up to the limit (beyond it, this is no model header).
FIRST_CHUNK_BYTES = 4 * MIB
HEADER_LIMIT_BYTES = 256 * MIB
HTTP_TIMEOUT_SECONDS = 60
USER_AGENT = "llama-rpc-cluster (GGUF header reader)"
CONTENT_RANGE = re.compile(r"bytes (?P<start>\d+)-(?P<end>\d+)/(?P<total>\d+)")
# What the gguf parser raises on a file that is not a well-formed GGUF.
PARSE_ERRORS = (ValueError, IndexError, KeyError, TypeError, OverflowError)
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
def _errors(where: str | Path) -> Iterator[None]:
    try:
        yield
    except ModelError:
        raise
    except OSError as error:
        raise ModelError(SETTING, f"cannot read {where}: {error.strerror or error}") from None
    except PARSE_ERRORS as error:
        raise ModelError(SETTING, f"{where} is not a readable GGUF file ({error})") from None


def _not_gguf(where: str | Path) -> ModelError:
    return ModelError(SETTING, f"{where} is not a GGUF file (no GGUF magic number)")


def _reader(path: Path) -> Any:
    import gguf  # noqa: PLC0415 (only --gguf needs it: `uv sync --extra plan`)

    return gguf.GGUFReader(path)


def _part_of(reader: Any) -> _Part:
    return _Part(
        fields={name: field.contents() for name, field in reader.fields.items()},
        tensor_bytes={t.name: int(t.n_bytes) for t in reader.tensors},
        tensor_elements={t.name: int(t.n_elements) for t in reader.tensors},
    )


def _read_part(path: Path) -> _Part:
    with _errors(path):
        with path.open("rb") as f:
            if f.read(4) != b"GGUF":
                raise _not_gguf(path)
        return _part_of(_reader(path))


def _part_names(first: str, where: str, fields: dict[str, Any]) -> list[str]:
    """The file names of every part of the model whose first part is named ``first``."""
    count = int(fields.get("split.count", 1))
    if count <= 1:
        return [first]
    position = split_position(first)
    if position is None or position[0] != 1:
        raise ModelError(
            SETTING, f"{where} is part of a {count}-part split GGUF; give the first part"
        )
    return [p.name for p in part_paths(Path(first), count)]


def _parts(first: Path, fields: dict[str, Any]) -> list[Path]:
    paths = [first.with_name(name) for name in _part_names(first.name, str(first), fields)]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise ModelError(
            SETTING,
            f"parts {', '.join(missing)} are not beside {first.name}; put every part in one "
            "directory, or describe the model with --size-gb, --layers and --kv-bytes-per-token",
        )
    return paths


def is_url(text: str | Path) -> bool:
    """Whether ``--gguf`` names a file on an http(s) server rather than a local path."""
    return isinstance(text, str) and urlsplit(text).scheme.lower() in ("http", "https")


def _fetch(url: str, start: int, end: int) -> tuple[bytes, int]:
    """Bytes ``start`` to ``end`` (inclusive, or fewer if the server sends less) of the file at
    ``url``, and the file's length."""
    request = urllib.request.Request(  # noqa: S310 (is_url allows http and https only)
        url, headers={"Range": f"bytes={start}-{end}", "User-Agent": USER_AGENT}
    )
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_SECONDS) as response:  # noqa: S310
            last, total = _ranged(url, response, start)
            wanted = min(last, end) - start + 1
            data = response.read(wanted)
    except urllib.error.HTTPError as error:
        raise ModelError(SETTING, f"{url} answered HTTP {error.code} {error.reason}") from None
    except urllib.error.URLError as error:
        raise ModelError(SETTING, f"cannot reach {url}: {error.reason}") from None
    except (OSError, http.client.HTTPException) as error:
        raise ModelError(SETTING, f"reading {url} failed: {error}") from None
    if len(data) != wanted:
        raise ModelError(SETTING, f"{url} closed the connection part way through the header")
    return data, total


def _ranged(url: str, response: http.client.HTTPResponse, start: int) -> tuple[int, int]:
    """(last byte, file length) of the answer to a range request from ``start``. Any other
    answer is refused before its body is read: it could be the whole model."""
    if response.status != 206:
        raise ModelError(
            SETTING,
            f"{url} ignored the range request (HTTP {response.status}, the whole file): "
            "reading only the header needs a server that supports HTTP range requests; "
            "download the file and give its path instead",
        )
    content_range = response.headers.get("Content-Range", "")
    match = CONTENT_RANGE.fullmatch(content_range.strip())
    if match is None or int(match["start"]) != start or int(match["end"]) < start:
        raise ModelError(
            SETTING,
            f"{url} answered the request for bytes {start}- with Content-Range "
            f"{content_range!r}; it must send that range and the file's length",
        )
    return int(match["end"]), int(match["total"])


def _header_length(prefix: bytes) -> int | None:
    """Where the tensor infos end in a GGUF file that starts with ``prefix``; None when they
    end past it. Only lengths are read, which is quick: gguf's parser, seconds on a large
    vocabulary, then runs once, on the whole header."""
    import gguf  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415 (installed with gguf)

    sizes = {int(t): np.dtype(n).itemsize for t, n in gguf.GGUFReader.gguf_scalar_to_np.items()}
    order, offset = "<", 4

    def number(kind: str) -> int:
        nonlocal offset
        value: int = struct.unpack_from(order + kind, prefix, offset)[0]
        offset += struct.calcsize(kind)
        return value

    def skip(length: int) -> None:
        nonlocal offset
        offset += length

    def skip_value(kind: int) -> None:
        if kind == gguf.GGUFValueType.STRING:
            skip(number("Q"))
        elif kind == gguf.GGUFValueType.ARRAY:
            item, count = number("I"), number("Q")
            if item in sizes:
                skip(count * sizes[item])
            else:
                for _ in range(count):
                    skip_value(item)
        elif kind in sizes:
            skip(sizes[kind])
        else:
            raise ValueError(f"unknown metadata value type {kind}")

    try:
        # A version whose low half is zero was written in the other byte order (as gguf reads it).
        order = "<" if number("I") & 0xFFFF else ">"
        tensors, fields = number("Q"), number("Q")
        for _ in range(fields):
            skip(number("Q"))  # the key
            skip_value(number("I"))
        for _ in range(tensors):
            skip(number("Q"))  # the name
            skip(8 * number("I") + 4 + 8)  # the dimensions, the type and the data offset
    except struct.error:  # a read past the prefix
        return None
    return offset if offset <= len(prefix) else None


def _parse_sparse(prefix: bytes, total: int) -> _Part:
    """The header in ``prefix``, parsed by gguf from a sparse file of the part's full length:
    the tensor data the parser maps is never written, fetched or read."""
    with tempfile.TemporaryDirectory(prefix="gguf-header-") as directory:
        copy = Path(directory) / "header.gguf"
        with copy.open("wb") as f:
            f.write(prefix)
            f.truncate(total)
        return _part_of(_reader(copy))


def _read_remote_part(url: str) -> _Part:
    """A part's header, fetched with range requests that double in length until all of it is
    there (or the whole file, which gguf then reads or refuses)."""
    prefix, total = _fetch(url, 0, FIRST_CHUNK_BYTES - 1)
    if not prefix.startswith(b"GGUF"):
        raise _not_gguf(url)
    with _errors(url):
        while len(prefix) < total and _header_length(prefix) is None:
            if len(prefix) >= HEADER_LIMIT_BYTES:
                raise ModelError(
                    SETTING,
                    f"{url} has no GGUF header within its first {HEADER_LIMIT_BYTES // MIB} MiB; "
                    "is it a model file? If so, download it and give its path",
                )
            end = min(2 * len(prefix), HEADER_LIMIT_BYTES, total) - 1
            more, _ = _fetch(url, len(prefix), end)
            prefix += more
        return _parse_sparse(prefix, total)


def _with_name(url: str, name: str) -> str:
    """``url`` with its last path segment replaced by ``name`` (the query kept)."""
    parts = urlsplit(url)
    directory = parts.path.rpartition("/")[0]
    return urlunsplit(parts._replace(path=f"{directory}/{name}"))


def _remote_parts(url: str) -> list[_Part]:
    """Every part's header: the other parts' URLs are the first's with the part's name."""
    head = _read_remote_part(url)
    names = _part_names(saved_name(url), url, head.fields)
    return [head] + [_read_remote_part(_with_name(url, name)) for name in names[1:]]


def _local_parts(first: Path) -> list[_Part]:
    if not first.is_file():
        raise ModelError(SETTING, f"{first} does not exist or is not a file")
    head = _read_part(first)
    return [head] + [_read_part(p) for p in _parts(first, head.fields)[1:]]


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
    """A ``Model`` from a GGUF file (the first part, for a split model): a local path, or an
    http(s) URL whose headers are read with range requests."""
    if is_url(path):
        where = str(path)
        return _model(where, saved_name(where), _remote_parts(where))
    first = Path(path)
    return _model(str(first), first.name, _local_parts(first))


def _model(where: str, file_name: str, parts: list[_Part]) -> Model:
    """The model the parts' headers describe; ``where`` names the first part in messages."""
    fields = parts[0].fields
    arch = fields.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelError(SETTING, f"{where} has no general.architecture; is it a model file?")
    layers = fields.get(f"{arch}.block_count")
    if not layers:
        raise ModelError(SETTING, f"{where} has no {arch}.block_count")
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
    name = fields.get("general.name") or file_name
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
        source=f"gguf:{where}",
        input_bytes=input_bytes,
        output_bytes=output_bytes,
        tied_embeddings="output.weight" not in tensor_bytes,
        layer_weight_bytes=layer_bytes,
        layer_kv_bytes_per_token=kv_per_layer,
        sliding_window=int(window) if window else None,
        sliding_layers=_sliding_layers(fields, arch, layers) if window else frozenset(),
        embedding=int(fields[f"{arch}.embedding_length"])
        if fields.get(f"{arch}.embedding_length")
        else None,
    )
