"""The prebuilt llama.cpp: the pinned commit with its patch set, built once per CPU target and kept
in the stack's object store, which a node fetches and checks at boot instead of building
(``build-llama.sh`` and ``fetch-llama.sh``; ``lrc prebuild`` makes and uploads it).

A bundle is a tar (zstd) of ``bin/`` with every program a node of any role runs, under
``PREFIX/llama.cpp/COMMIT/PATCHES/TARGET.tar.zst`` beside its ``.sha256`` (``sha256sum``'s line):
the commit and the patch set's digest (``infra.boot.patches``) name what was built, the target
which CPUs run it. A target is the machine and what the compiler was told of the CPU: a family's
-march (``aarch64-armv9-a_sve2_bf16_i8mm``: Graviton4, Axion and Cobalt 100 share it), or
``native`` and the CPU's own key (a build for the machine it was made on, and its twins: the local
cluster's machines).
"""

from __future__ import annotations

import re

from infra.clouds.stores import STORE_SCHEMES

BUNDLE_DIR = "llama.cpp"
BUNDLE_SUFFIX = ".tar.zst"
SHA256_SUFFIX = ".sha256"
# Every program build-llama.sh installs for any role (its LLAMA_ROLE=all): one bundle per target
# serves the main node and the workers.
BUNDLE_PROGRAMS = ("ggml-rpc-server", "llama-server", "llama-cli", "llama-bench")
# Machine, then the CPU: lowercase letters, digits, '_', '.' and '-' (no '+' or '/': a key's
# characters that every store takes as they are). fetch-llama.sh checks the same.
TARGET = re.compile(r"[a-z0-9_]+-[a-z0-9_.-]+")
_STORE_PREFIX = re.compile(r"(s3|gs|az)://[a-z0-9][a-z0-9._-]{1,62}(/[A-Za-z0-9._/-]*)?")


def family_target(machine: str, march: str) -> str:
    """The target of a build for a CPU family's -march (``armv9-a+sve2`` -> ``..._sve2``)."""
    return f"{machine}-{march.replace('+', '_')}"


def native_target(machine: str, cpu_key: str) -> str:
    """The target of a build for the CPU it was made on (-march=native), by that CPU's key."""
    return f"{machine}-native-{cpu_key}"


def bundle_key(commit: str, patches: str, target: str, prefix: str = "") -> str:
    """The bundle's key in its store (``prefix``: the keys' common start, as ``lrc stage``'s)."""
    return f"{prefix}{BUNDLE_DIR}/{commit}/{patches}/{target}{BUNDLE_SUFFIX}"


def bundle_url(store: str, commit: str, patches: str, target: str) -> str:
    """The URL a node reads the bundle at, under the store prefix ``store`` (its LLAMA_PREBUILT)."""
    return f"{store.rstrip('/')}/{bundle_key(commit, patches, target)}"


def prebuilt_problem(store: str, target: str) -> str | None:
    """Why a node could not read a bundle with these settings, or None."""
    if not store.startswith(STORE_SCHEMES) or not _STORE_PREFIX.fullmatch(store):
        return (
            f"{store!r} is not an object store prefix: give s3://BUCKET[/PREFIX], "
            "gs://BUCKET[/PREFIX] or az://ACCOUNT/CONTAINER[/PREFIX]"
        )
    if not TARGET.fullmatch(target):
        return (
            f"the target {target!r} is not a machine and a CPU (like "
            f"{family_target('aarch64', 'armv9-a+sve2+bf16+i8mm')})"
        )
    return None
