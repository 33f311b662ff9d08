"""The patch set the build applies to the pinned llama.cpp (``cloud-init/patches/COMMIT/``).

Each patch is a file of its own, applied in name order by ``build-llama.sh``. Its text before the
diff says what it changes and names two things this module reads: ``Switch:`` (the environment
setting that turns it off at run time, as ``NAME=VALUE``) and ``Upstream:`` (the pull request it
mirrors, or why there is none). The set's digest is part of the build's stamp; this module and
the script compute it the same way (each file's name and diff, in order, sha256, 16 hex): the
text before a diff may change without a rebuild, and a node gets the diffs alone. No line of that
text may begin with ``--- ``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from infra.boot.installed import patch_diff

PATCHES_DIR = Path(__file__).resolve().parents[2] / "cloud-init" / "patches"
NO_PATCHES = "none"


@dataclass(frozen=True)
class Patch:
    path: Path
    switch: tuple[tuple[str, str], ...]  # the (setting, value) pairs that turn it off
    upstream: str

    @property
    def name(self) -> str:
        return self.path.name


def patch_set(commit: str, directory: Path = PATCHES_DIR) -> tuple[Patch, ...]:
    """The commit's patches in the order they apply; none for a commit without a set."""
    found = sorted((directory / commit).glob("*.patch"), key=lambda p: p.name.encode())
    return tuple(_read(path) for path in found)


def patches_digest(commit: str, directory: Path = PATCHES_DIR) -> str:
    """The set's digest as build-llama.sh computes it (``none`` without a set)."""
    patches = patch_set(commit, directory)
    if not patches:
        return NO_PATCHES
    digest = hashlib.sha256()
    for patch in patches:
        digest.update(f"{patch.name}\n{patch_diff(patch.path.read_text())}".encode())
    return digest.hexdigest()[:16]


def switches_off(
    commit: str, off: tuple[str, ...], directory: Path = PATCHES_DIR
) -> dict[str, str]:
    """The settings that turn patches off at run time: ``off`` names them by number ("0002"),
    or says "all" (the build then runs as upstream's). Anything else is refused, naming what
    there is."""
    patches = patch_set(commit, directory)
    numbers = {patch.name.split("-", 1)[0]: patch for patch in patches}
    unknown = sorted(set(off) - set(numbers) - {"all"})
    if unknown:
        known = ", ".join(numbers) or "none: this commit builds unpatched"
        raise ValueError(
            f"no patch {unknown[0]!r} for llama.cpp {commit[:12]}; its patches: {known}, or all"
        )
    chosen = patches if "all" in off else [numbers[number] for number in sorted(set(off))]
    return {name: value for patch in chosen for name, value in patch.switch}


def _read(path: Path) -> Patch:
    header = path.read_text().split("\n--- ", 1)[0]
    fields = dict(
        line.split(":", 1)
        for line in header.splitlines()
        if line.startswith(("Switch:", "Upstream:"))
    )
    if "Switch" not in fields or "Upstream" not in fields:
        raise ValueError(f"{path}: a patch says what turns it off (Switch:) and its Upstream:")
    # NAME=VALUE words up to the explanation in brackets.
    words = fields["Switch"].split("(", 1)[0].split()
    pairs = (word.partition("=") for word in words if "=" in word)
    switch = tuple((name, value) for name, _, value in pairs)
    return Patch(path, switch, fields["Upstream"].strip())
