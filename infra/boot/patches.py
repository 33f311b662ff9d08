"""The patch set the build applies to the pinned llama.cpp (``cloud-init/patches/COMMIT/``).

Each patch is a file of its own, applied in name order by ``build-llama.sh``. Its text before the
diff says what it changes and names two things this module reads: ``Switch:`` (the environment
setting that turns it off at run time, as ``NAME=VALUE``) and ``Upstream:`` (the pull request it
mirrors, or why there is none). The set's digest is part of the build's stamp; this module and
the script compute it the same way (a line of each diff's sha256 and the file's name, in order;
the lines' sha256, 16 hex): the text before a diff may change without a rebuild, and a node gets
the diffs alone. No line of that text may begin with ``--- ``. A diff keeps one line of context
(``git diff -U1``): the pin is exact, so more checks nothing, and an AWS worker's 16 KB of user
data carries its diffs.

A node gets the diffs of the patches that change what its role builds (``Patch.roles``), and of
the others their hash alone (``NAME.sha256``): the set, and so the digest and the build's stamp,
is the same on every node, while a worker's 16 KB of user data carries no loader patch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from infra.boot.installed import patch_diff
from infra.core.paths import OWN_FILES

# What a worker builds (ggml-rpc-server) compiles tools/rpc/ and links ggml alone
# (tools/rpc/CMakeLists.txt at the pin); a patch that touches nothing else under these, nor the
# build files, changes only llama-server and the tools the main node builds.
MAIN_ONLY_SOURCES = ("src/", "include/", "common/", "tools/", "vendor/")
WORKER_SOURCES = ("tools/rpc/",)
# What a node with a patch's diff withheld gets in its place: the diff's sha256.
HASH_SUFFIX = ".sha256"

PATCHES_DIR = OWN_FILES / "cloud-init" / "patches"
NO_PATCHES = "none"


@dataclass(frozen=True)
class Patch:
    path: Path
    switch: tuple[tuple[str, str], ...]  # the (setting, value) pairs that turn it off
    upstream: str
    # ``Roles:`` in its text: the roles whose binaries it changes, where that is fewer than the
    # files it touches say (a change to the client half of a file a worker also compiles).
    declared_roles: frozenset[str] = frozenset()

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def off_by_default(self) -> bool:
        """It acts only when its setting is given: its switch is that setting left empty."""
        return bool(self.switch) and all(value == "" for _, value in self.switch)

    @property
    def diff(self) -> str:
        return patch_diff(self.path.read_text())

    @property
    def diff_sha256(self) -> str:
        return hashlib.sha256(self.diff.encode()).hexdigest()

    @property
    def files(self) -> tuple[str, ...]:
        """The source files the diff changes (its ``+++ b/`` lines; a file it deletes by its
        ``--- a/`` line)."""
        found = []
        for line in self.diff.splitlines():
            for marker in ("+++ b/", "--- a/"):
                if line.startswith(marker) and line[len(marker) :] not in found:
                    found.append(line[len(marker) :])
        return tuple(found)

    @property
    def roles(self) -> frozenset[str]:
        """The roles whose builds it changes: the main node's always; a worker's unless every
        file it touches is one the worker's build does not compile, or its ``Roles:`` says so."""
        if self.declared_roles:
            return self.declared_roles | {"main"}
        main_only = all(
            f.startswith(MAIN_ONLY_SOURCES) and not f.startswith(WORKER_SOURCES) for f in self.files
        )
        return frozenset({"main"} if main_only else {"main", "worker"})


def patch_set(commit: str, directory: Path = PATCHES_DIR) -> tuple[Patch, ...]:
    """The commit's patches in the order they apply; none for a commit without a set."""
    found = sorted((directory / commit).glob("*.patch"), key=lambda p: p.name.encode())
    return tuple(_read(path) for path in found)


def patches_digest(commit: str, directory: Path = PATCHES_DIR, *, acting: bool = False) -> str:
    """The set's digest as build-llama.sh computes it (``none`` without a set); ``acting``: of
    the patches that act without being asked to (not ``off_by_default``), which are all a run
    with no patch settings is changed by."""
    patches = patch_set(commit, directory)
    if acting:
        patches = tuple(patch for patch in patches if not patch.off_by_default)
    if not patches:
        return NO_PATCHES
    lines = "".join(f"{patch.diff_sha256}  {patch.name}\n" for patch in patches)
    return hashlib.sha256(lines.encode()).hexdigest()[:16]


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
        if line.startswith(("Switch:", "Upstream:", "Roles:"))
    )
    if "Switch" not in fields or "Upstream" not in fields:
        raise ValueError(f"{path}: a patch says what turns it off (Switch:) and its Upstream:")
    # NAME=VALUE words up to the explanation in brackets.
    words = fields["Switch"].split("(", 1)[0].split()
    pairs = (word.partition("=") for word in words if "=" in word)
    switch = tuple((name, value) for name, _, value in pairs)
    roles = frozenset(fields.get("Roles", "").split("(", 1)[0].split())
    if not roles <= {"main", "worker"}:
        raise ValueError(f"{path}: Roles: names main or worker, not {sorted(roles)}")
    return Patch(path, switch, fields["Upstream"].strip(), roles)
