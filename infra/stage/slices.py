"""The slice manifest: each tensor's range and sha256 in a model's parts, written when the model is
staged, so that each node fetches and checks only the slice its layers need
(``cloud-init/scripts/llama-rpc-slice``), without the whole file.

The hashes are taken as the part streams by (``SliceHasher.feed``), in the one pass that stages
it; a local file is read once the same way (``manifest_of_files``). Where a tensor lives
(its layer, the output head or the main node's inputs) is ``gguf_header.tensor_home``'s rule.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from infra.live import StageError
from infra.models import gguf_header

FORMAT = 1
# Beside the model's first part in the store.
MANIFEST_SUFFIX = ".slices.json"
READ_BYTES = 16 * 2**20
# The header a part's layout is read from: a 1T-class model's first part holds about 10 MB of
# metadata (its tokenizer); past this the part is not read as a GGUF.
HEADER_LIMIT_BYTES = 256 * 2**20


class SliceHasher:
    """A part's tensors hashed as its bytes go by, in order: the header is kept until its layout
    can be read, then each byte goes to the tensor (or header) it belongs to."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.offset = 0
        self.prefix = bytearray()
        self.layout: gguf_header.PartLayout | None = None
        self.ranges: list[tuple[str, int, int, Any]] = []  # (name, start, end, digest)
        self.at = 0  # the first range not yet complete
        self.problem = ""  # why the part has no manifest entry (not a GGUF)

    def feed(self, data: bytes) -> None:
        if self.problem:
            return
        if self.layout is None:
            self.prefix += data
            if len(self.prefix) >= 4 and not self.prefix.startswith(b"GGUF"):
                self.problem = f"{self.name} is not a GGUF file"
            elif len(self.prefix) > HEADER_LIMIT_BYTES:
                self.problem = f"{self.name}: no GGUF header in its first 256 MiB"
            if self.problem:
                self.prefix = bytearray()
                return
            self.layout = gguf_header.layout(bytes(self.prefix))
            if self.layout is None:
                return
            self.ranges = [("", 0, self.layout.data_start, hashlib.sha256())]
            self.ranges += [
                (tensor, start, start + size, hashlib.sha256())
                for tensor, start, size in self.layout.tensors
            ]
            data, self.prefix = bytes(self.prefix), bytearray()  # from the part's first byte
        self._hash(data)

    def _hash(self, data: bytes) -> None:
        view, offset = memoryview(data), self.offset
        end = offset + len(data)
        while self.at < len(self.ranges):
            _, start, stop, digest = self.ranges[self.at]
            if start >= end:
                break
            lo, hi = max(start, offset), min(stop, end)
            if lo < hi:
                digest.update(view[lo - offset : hi - offset])
            if stop > end:
                break
            self.at += 1
        self.offset = end

    def part(self, size: int, sha256: str) -> dict[str, Any]:
        """The part's entry, once every byte went by."""
        if self.problem:
            raise StageError(self.problem)
        if self.layout is None or self.at < len(self.ranges) or self.offset != size:
            raise StageError(
                f"{self.name}: the part ended before its last tensor ({self.offset} bytes)"
            )
        layers = _layers(self.layout.fields)
        tensors = []
        for tensor, start, stop, digest in self.ranges[1:]:
            home, layer = gguf_header.tensor_home(tensor, layers) if layers else ("input", None)
            entry = {"name": tensor, "offset": start, "size": stop - start,
                     "sha256": digest.hexdigest(), "home": home}  # fmt: skip
            if layer is not None:
                entry["layer"] = layer
            tensors.append(entry)
        return {"name": self.name, "size": size, "sha256": sha256,
                "header_size": self.layout.data_start,
                "header_sha256": self.ranges[0][3].hexdigest(), "tensors": tensors,
                "fields": {"layers": layers}}  # fmt: skip


def _layers(fields: dict[str, Any]) -> int:
    arch = fields.get("general.architecture", "")
    return int(fields.get(f"{arch}.block_count", 0))


def manifest(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The manifest of a model's parts (``SliceHasher.part``'s, in order)."""
    names = {t["name"] for part in parts for t in part["tensors"]}
    layers = next((p["fields"]["layers"] for p in parts if p["fields"]["layers"]), 0)
    for part in parts:
        part.pop("fields", None)
    return {"format": FORMAT, "layers": layers, "tied_output": "output.weight" not in names,
            "parts": list(parts)}  # fmt: skip


def manifest_of_files(paths: Sequence[Path]) -> dict[str, Any]:
    """The manifest of local parts, each read once."""
    parts = []
    for path in paths:
        hasher, whole = SliceHasher(path.name), hashlib.sha256()
        with path.open("rb") as f:
            while data := f.read(READ_BYTES):
                hasher.feed(data)
                whole.update(data)
        parts.append(hasher.part(path.stat().st_size, whole.hexdigest()))
    return manifest(parts)


def manifest_text(content: dict[str, Any]) -> str:
    return json.dumps(content, separators=(",", ":"), sort_keys=True) + "\n"


def manifest_file(parts: Sequence[Path]) -> Path:
    """The manifest of local parts, written beside the first (``MANIFEST_SUFFIX``) unless one
    newer than every part is there."""
    written = parts[0].with_name(parts[0].name + MANIFEST_SUFFIX)
    newest = max(part.stat().st_mtime for part in parts)
    if not written.is_file() or written.stat().st_mtime < newest:
        partial = written.with_name(written.name + ".partial")
        partial.write_text(manifest_text(manifest_of_files(parts)))
        partial.replace(written)
    return written
