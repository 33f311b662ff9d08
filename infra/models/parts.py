"""Model file names: a split GGUF's parts (``name-0000K-of-0000N.gguf``, as llama.cpp's
gguf-split writes them), and the name a downloaded part is saved under."""

from __future__ import annotations

import re
from pathlib import Path

_SPLIT_NAME = re.compile(r"(?P<stem>.*)-(?P<number>\d{5})-of-(?P<count>\d{5})\.gguf")


def split_position(name: str) -> tuple[int, int] | None:
    """(part number, part count) of a split GGUF's part name; None for any other name."""
    match = _SPLIT_NAME.fullmatch(name)
    return None if match is None else (int(match["number"]), int(match["count"]))


def part_paths(first: Path, count: int | None = None) -> list[Path]:
    """Every part of the split GGUF whose first part is ``first`` (``count`` of them, by default
    as many as its name says); ``[first]`` for a file that is not the first part of a split."""
    match = _SPLIT_NAME.fullmatch(first.name)
    if match is None or int(match["number"]) != 1:
        return [first]
    total = int(match["count"]) if count is None else count
    stem = match["stem"]
    return [first.with_name(f"{stem}-{i:05d}-of-{total:05d}.gguf") for i in range(1, total + 1)]


def saved_name(url: str) -> str:
    """The file name a model part is saved as: the URL's last path segment without its query or
    fragment (fetch-model.sh's ``model_name`` applies the same rule on the node)."""
    return re.split(r"[?#]", url, maxsplit=1)[0].rsplit("/", 1)[-1]
