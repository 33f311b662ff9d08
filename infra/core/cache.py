"""Where the program and the local cluster keep what they fetch or build, across runs."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Builds, the sdist, generated models and pinned manifests; reused across runs (and by CI
    when it can): $LLAMA_RPC_CACHE, else $XDG_CACHE_HOME (or ~/.cache)/llama-rpc-cluster."""
    base = os.environ.get("LLAMA_RPC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llama-rpc-cluster"
    )
    return Path(base)
