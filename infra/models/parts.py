"""Model file names: a split GGUF's parts (``name-0000K-of-0000N.gguf``, as llama.cpp's
gguf-split writes them), the name a downloaded part is saved under, and the model's id."""

from __future__ import annotations

import re
from pathlib import Path

_SPLIT_NAME = re.compile(r"(?P<stem>.*)-(?P<number>\d{5})-of-(?P<count>\d{5})\.gguf")


def split_position(name: str) -> tuple[int, int] | None:
    """(part number, part count) of a split GGUF's part name; None for any other name."""
    match = _SPLIT_NAME.fullmatch(name)
    return None if match is None else (int(match["number"]), int(match["count"]))


def split_parts_problem(names: list[str]) -> str | None:
    """What is wrong with a model's file names as a split GGUF, or None: the first must be part 1
    (llama-server opens it and finds the others beside it), and every part of it must be there,
    and no part of another split."""
    positions = [split_position(name) for name in names]
    if not any(positions):
        return None
    first = positions[0]
    if first is None or first[0] != 1:
        return (
            f"model file {names[0]!r} is not part 1 of a split GGUF (…-00001-of-000NN.gguf), "
            "and the first URL is the file llama-server opens: list part 1 first"
        )
    count = first[1]
    stem = names[0].rsplit("-00001-of-", 1)[0]
    wanted = [f"{stem}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]
    missing = [name for name in wanted if name not in names]
    # Other files (not named as parts) are fetched beside the model; parts of another split are
    # a mistake.
    others = [name for name in names if name not in wanted and split_position(name)]
    if missing or others:
        wrong = []
        if missing:
            wrong.append(f"missing {', '.join(missing)}")
        if others:
            wrong.append(f"not its parts: {', '.join(others)}")
        return (
            f"model URLs list {count - len(missing)} of the {count} parts of the split GGUF "
            f"{stem}: {'; '.join(wrong)}; list every part's URL, part 1 first"
        )
    return None


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


def model_id(url: str) -> str:
    """A model's id from its (first) file's URL, as clients send it: the file name without
    ``.gguf`` or a split's part suffix; characters an id does not take become '-'."""
    name = saved_name(url)
    match = _SPLIT_NAME.fullmatch(name)
    stem = match["stem"] if match else name.removesuffix(".gguf")
    return re.sub(r"[^A-Za-z0-9._:/+-]", "-", stem)[:128] or "model"
