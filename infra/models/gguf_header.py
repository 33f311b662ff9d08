"""Describe a model from its GGUF header: size, layers, KV bytes per token, MoE active share.

Only headers are parsed (the file is memory-mapped and tensor data is never touched), so a
200 GB model costs nothing to describe. The header is read value by value with ``struct``, as
gguf's own reader reads it but without a numpy view of every value: a fraction of a second for
Gemma 3's 262k-token vocabulary, where gguf's reader takes tens of seconds. For a split GGUF,
point at the first part: the other parts (``name-0000K-of-0000N.gguf``) are found beside it and
their headers read too.

The file may also be an http(s) URL: its header is fetched with range requests, growing until
all of it is in hand, and read the same way; no tensor data is downloaded.
"""

from __future__ import annotations

import http.client
import math
import mmap
import re
import struct
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
# What reading a file that is not a well-formed GGUF raises (struct.error: a read past its end).
PARSE_ERRORS = (ValueError, IndexError, KeyError, TypeError, OverflowError, struct.error)
DEFAULT_ALIGNMENT = 32
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
    tensor_offsets: dict[str, int]  # from the file's start
    data_start: int  # where the tensor data starts: the header's length, aligned


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


# GGUF's metadata value types (gguf.GGUFValueType) as struct formats; 8 is a string, 9 an array.
_FORMATS = {
    0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d",
}  # fmt: skip
_STRING, _ARRAY = 8, 9
_VERSIONS = (2, 3)


class _Scanner:
    """A GGUF header (``data`` from its start), read in order: the metadata as gguf's
    ``ReaderField.contents()`` gives it, and each tensor's element and byte counts."""

    def __init__(self, data: bytes | mmap.mmap) -> None:
        self.data, self.offset, self.order = data, 4, "<"
        version = self.number("I")
        if not version & 0xFFFF:  # written in the other byte order (as gguf reads it)
            self.order = ">"
            version = int.from_bytes(version.to_bytes(4, "little"), "big")
        if version not in _VERSIONS:
            raise ValueError(f"GGUF version {version} is not supported")

    def number(self, kind: str) -> Any:
        value = struct.unpack_from(self.order + kind, self.data, self.offset)[0]
        self.offset += struct.calcsize(kind)
        return value

    def string(self) -> str:
        length = self.number("Q")
        end = self.offset + length
        if end > len(self.data):
            raise struct.error("a string runs past the end of the data")
        text = bytes(self.data[self.offset : end]).decode("utf-8")
        self.offset = end
        return text

    def strings(self, count: int) -> list[str]:
        """``count`` strings in a row (a vocabulary: 262,144 of them for Gemma 3), in one loop."""
        data, offset, size = self.data, self.offset, len(self.data)
        length_at = struct.Struct(self.order + "Q").unpack_from
        out = []
        for _ in range(count):
            (length,) = length_at(data, offset)
            end = offset + 8 + length
            if end > size:
                raise struct.error("a string runs past the end of the data")
            out.append(bytes(data[offset + 8 : end]).decode("utf-8"))
            offset = end
        self.offset = offset
        return out

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.number("I"), self.number("Q")
            if item == _STRING:
                return self.strings(count)
            if item not in _FORMATS:
                return [self.value(item) for _ in range(count)]
            items = f"{self.order}{count}{_FORMATS[item]}"
            values = struct.unpack_from(items, self.data, self.offset)
            self.offset += struct.calcsize(items)
            return list(values)
        if kind not in _FORMATS:
            raise ValueError(f"unknown metadata value type {kind}")
        return self.number(_FORMATS[kind])

    def part(self) -> _Part:
        import gguf  # noqa: PLC0415 (the quantisations' block sizes)

        tensors, count = self.number("Q"), self.number("Q")
        fields: dict[str, Any] = {}
        for _ in range(count):
            key = self.string()
            fields[key] = self.value(self.number("I"))
        tensor_bytes: dict[str, int] = {}
        tensor_elements: dict[str, int] = {}
        relative: dict[str, int] = {}
        for _ in range(tensors):
            name = self.string()
            elements = math.prod(self.number("Q") for _ in range(self.number("I")))
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(self.number("I"))]
            relative[name] = self.number("Q")  # where its data starts, in the data section
            tensor_bytes[name], tensor_elements[name] = elements * size // block, elements
        # The data section starts at the next multiple of general.alignment (gguf.cpp: 32).
        alignment = int(fields.get("general.alignment", DEFAULT_ALIGNMENT))
        start = -(-self.offset // alignment) * alignment
        offsets = {name: start + at for name, at in relative.items()}
        return _Part(fields, tensor_bytes, tensor_elements, offsets, start)


def _read_part(path: Path) -> _Part:
    with _errors(path), path.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise _not_gguf(path)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _Scanner(data).part()


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
    end past it."""
    try:
        scanner = _Scanner(prefix)
        scanner.part()
    except struct.error:  # a read past the prefix
        return None
    return scanner.offset


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
        return _Scanner(prefix).part()


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

    if get("attention.key_length_mla") and get("attention.value_length_mla"):
        # Multi-head latent attention, as converters write it since llama.cpp PR #12801: one K
        # row of the compressed latent and the rope part (key_length, 512 + 64 for DeepSeek V3),
        # no V (llama_hparams::is_mla; llama-kv-cache.cpp: has_v = !is_mla, PR #19067). A file
        # converted before it has no *_mla keys and caches every head's K and V (below).
        rank, rope = get("attention.kv_lora_rank"), get("rope.dimension_count")
        row = get("attention.key_length") or int(rank or 0) + int(rope or 0)
        return (int(row) * KV_ELEMENT_BYTES,) * layers
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


def tensor_home(name: str, layers: int) -> tuple[str, int | None]:
    """Where llama.cpp places a tensor, by its name: ("layer", its layer), ("output", None) for
    the output head (``output*``, with the last layer), or ("input", None) for everything else
    outside the layers, which stays on the main node's CPU."""
    match = LAYER_TENSOR.match(name)
    if match and int(match["layer"]) < layers:
        return "layer", int(match["layer"])
    return ("output", None) if name.startswith("output") else ("input", None)


def _layer_weights(tensor_bytes: dict[str, int], layers: int) -> tuple[int, int, tuple[int, ...]]:
    """(input bytes, output bytes, bytes of each layer) as llama.cpp places them (``tensor_home``),
    with a copy of the embeddings on the output's node when the output is tied to them."""
    per_layer = [0] * layers
    input_bytes = output_bytes = 0
    for name, size in tensor_bytes.items():
        home, layer = tensor_home(name, layers)
        if layer is not None:
            per_layer[layer] += size
        elif home == "output":
            output_bytes += size
        else:
            input_bytes += size
    if "output.weight" not in tensor_bytes:
        output_bytes += tensor_bytes.get("token_embd.weight", 0)
    return input_bytes, output_bytes, tuple(per_layer)


@dataclass(frozen=True)
class PartLayout:
    """Where a part's bytes are: its header's length (the data section's start) and each
    tensor's range, in file order; and the model's layers (the first part's block count)."""

    fields: dict[str, Any]
    data_start: int
    tensors: tuple[tuple[str, int, int], ...]  # (name, offset from the file's start, bytes)


def layout(prefix: bytes) -> PartLayout | None:
    """A part's layout from its first bytes; None when they do not hold the whole header."""
    if not prefix.startswith(b"GGUF") or _header_length(prefix) is None:
        return None
    with _errors("the part's header"):
        part = _Scanner(prefix).part()
    ranges = sorted(
        ((name, part.tensor_offsets[name], size) for name, size in part.tensor_bytes.items()),
        key=lambda t: t[1],
    )
    return PartLayout(part.fields, part.data_start, tuple(ranges))


def header_fields(path: Path) -> dict[str, Any]:
    """The metadata of a local GGUF file (a split model's first part's), by key."""
    return _read_part(path).fields


def tensor_bytes(path: Path) -> dict[str, int]:
    """The bytes of each tensor of a local GGUF file (of every part of a split model), by name."""
    with _errors(path):
        parts = _local_parts(path)
    return {name: size for part in parts for name, size in part.tensor_bytes.items()}


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
        experts=experts if active_bytes is not None else 0,
        experts_used=used if active_bytes is not None else 0,
        layer_weight_bytes=layer_bytes,
        layer_kv_bytes_per_token=kv_per_layer,
        sliding_window=int(window) if window else None,
        sliding_layers=_sliding_layers(fields, arch, layers) if window else frozenset(),
        embedding=int(fields[f"{arch}.embedding_length"])
        if fields.get(f"{arch}.embedding_length")
        else None,
    )
