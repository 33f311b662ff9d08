"""The llama.cpp source for the local cluster, and where builds and downloads are cached.

On a machine without GitHub the source is the PyPI sdist of llama-cpp-python at the pinned
version: it vendors the full llama.cpp tree at the pinned commit (vocab files included). The
sdist is checked against its pinned sha256 before it is unpacked.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import urllib.request
from pathlib import Path

from infra.core.cache import cache_dir
from infra.core.pins import LLAMA_CPP_PYTHON_SDIST

__all__ = ["SourceError", "cache_dir", "sdist_tree"]

SDIST_NAME = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SIMPLE_INDEX = os.environ.get("LLAMA_RPC_PYPI_SIMPLE", "https://pypi.org/simple")


class SourceError(RuntimeError):
    """The llama.cpp source could not be found or fetched."""


def sdist_tree(cache: Path | None = None, *, download: bool = True) -> Path:
    """The llama.cpp tree vendored in the pinned sdist, fetched and unpacked on first use."""
    cache = cache or cache_dir()
    tree = cache / "sdist" / SDIST_NAME.removesuffix(".tar.gz") / "vendor" / "llama.cpp"
    if (tree / "CMakeLists.txt").is_file():
        return tree
    archive = cache / "sdist" / SDIST_NAME
    if not archive.is_file():
        if not download:
            raise SourceError(
                f"{archive} is missing; run `lrc local fetch-source` "
                "or pass --source DIR (a llama.cpp checkout)"
            )
        _download_sdist(archive)
    _check_sha256(archive)
    staging = archive.parent / ".unpacking"
    shutil.rmtree(staging, ignore_errors=True)
    with tarfile.open(archive) as tar:
        tar.extractall(staging, filter="data")
    shutil.rmtree(tree.parents[1], ignore_errors=True)
    (staging / tree.parents[1].name).rename(tree.parents[1])
    shutil.rmtree(staging, ignore_errors=True)
    return tree


def _check_sha256(archive: Path) -> None:
    digest = hashlib.sha256()
    with archive.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != SDIST_SHA256:
        archive.unlink()
        raise SourceError(
            f"{archive.name} has sha256 {digest.hexdigest()}, expected {SDIST_SHA256}; "
            "the download was removed, run the command again"
        )


def _download_sdist(archive: Path) -> None:
    """Find the sdist's URL through the package index's JSON simple API (PEP 691)."""
    project = LLAMA_CPP_PYTHON_SDIST.split("==")[0]
    request = urllib.request.Request(  # noqa: S310 (an https index URL)
        f"{SIMPLE_INDEX}/{project}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310
            files = json.load(response)["files"]
        url = next(f["url"] for f in files if f["filename"] == SDIST_NAME)
        archive.parent.mkdir(parents=True, exist_ok=True)
        partial = archive.with_suffix(".partial")
        with urllib.request.urlopen(url, timeout=600) as response, partial.open("wb") as out:  # noqa: S310
            shutil.copyfileobj(response, out, 1 << 20)
        partial.rename(archive)
    except (OSError, KeyError, StopIteration, ValueError) as error:
        raise SourceError(
            f"could not download {SDIST_NAME} from {SIMPLE_INDEX}: {error}; "
            "pass --source DIR (a llama.cpp checkout) instead"
        ) from error
