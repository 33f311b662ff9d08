"""The slice manifest and each node's slice of it (worker-local loading): the manifest's ranges and
hashes are the file's, however the bytes arrive; a worker fetches only its layers' ranges and a
main node the header and its own, each checked, into files that appear only once whole.

The node side runs the real ``llama-rpc-slice`` against a loopback HTTP server that logs every
range it is asked for."""

from __future__ import annotations

import functools
import hashlib
import http.server
import itertools
import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from infra.boot import SCRIPTS_DIR
from infra.stage import slices
from tests.models.test_models import write_gguf

SLICE = SCRIPTS_DIR / "llama-rpc-slice"
LAYERS = 6

# Tensors this close are read as one range by llama-rpc-slice (its GAP).
SLICE_GAP = 4096


def model(path: Path, *, tied: bool = False) -> Path:
    rng = np.random.default_rng(7)
    tensors = {"token_embd.weight": rng.standard_normal((96, 64)).astype(np.float32)}
    for i in range(LAYERS):
        tensors[f"blk.{i}.attn_q.weight"] = rng.standard_normal((64, 64)).astype(np.float16)
        tensors[f"blk.{i}.attn_norm.weight"] = rng.standard_normal(64).astype(np.float32)
    tensors["output_norm.weight"] = rng.standard_normal(64).astype(np.float32)
    if not tied:
        tensors["output.weight"] = rng.standard_normal((96, 64)).astype(np.float16)
    return write_gguf(path, layers=LAYERS, tensors=tensors)


@pytest.fixture
def gguf_file(tmp_path: Path) -> Path:
    return model(tmp_path / "m.gguf")


def test_the_manifest_names_each_tensors_range_and_hash(gguf_file: Path) -> None:
    made = slices.manifest_of_files([gguf_file])
    data = gguf_file.read_bytes()
    [part] = made["parts"]
    assert made["layers"] == LAYERS and made["tied_output"] is False
    assert part["size"] == len(data) and part["sha256"] == hashlib.sha256(data).hexdigest()
    assert part["header_sha256"] == hashlib.sha256(data[: part["header_size"]]).hexdigest()
    homes = {t["name"]: (t["home"], t.get("layer")) for t in part["tensors"]}
    assert homes["blk.4.attn_q.weight"] == ("layer", 4)
    assert homes["output.weight"] == ("output", None) and homes["output_norm.weight"][0] == "output"
    assert homes["token_embd.weight"] == ("input", None)
    for t in part["tensors"]:
        assert (
            hashlib.sha256(data[t["offset"] : t["offset"] + t["size"]]).hexdigest() == t["sha256"]
        )
    # The tensors tile the data section: nothing outside a range but alignment padding.
    ends = sorted((t["offset"], t["offset"] + t["size"]) for t in part["tensors"])
    assert all(b[0] - a[1] < 32 for a, b in itertools.pairwise(ends))


@pytest.mark.parametrize("chunk", [1, 7, 4096, 10**6])
def test_the_hashes_do_not_depend_on_how_the_bytes_arrive(gguf_file: Path, chunk: int) -> None:
    data = gguf_file.read_bytes()
    hasher = slices.SliceHasher(gguf_file.name)
    for at in range(0, len(data), chunk):
        hasher.feed(data[at : at + chunk])
    whole = hashlib.sha256(data).hexdigest()
    got = slices.manifest([hasher.part(len(data), whole)])
    assert got == slices.manifest_of_files([gguf_file])


def test_a_part_that_is_not_a_gguf_has_no_manifest(tmp_path: Path) -> None:
    hasher = slices.SliceHasher("x.gguf")
    hasher.feed(b"<html>not a model</html>")
    with pytest.raises(slices.StageError, match="not a GGUF"):
        hasher.part(24, "0" * 64)


class _Ranges(http.server.SimpleHTTPRequestHandler):
    """A loopback origin that answers Range requests and logs each one."""

    log: list[tuple[int, int]]

    def do_GET(self) -> None:
        found = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        path = Path(self.translate_path(self.path))
        if not found or not path.is_file():
            self.send_error(416 if path.is_file() else 404)
            return
        start, end = int(found[1]), int(found[2])
        self.log.append((start, end))
        data = path.read_bytes()[start : end + 1]
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{end}/{path.stat().st_size}")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def origin(gguf_file: Path) -> Iterator[dict[str, Any]]:
    log: list[tuple[int, int]] = []
    handler = type("Handler", (_Ranges,), {"log": log})
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(handler, directory=str(gguf_file.parent))
    )
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    manifest = gguf_file.with_name("m.gguf.slices.json")
    manifest.write_text(slices.manifest_text(slices.manifest_of_files([gguf_file])))
    yield {"url": f"http://127.0.0.1:{server.server_address[1]}/m.gguf", "log": log,
           "manifest": manifest, "parts": json.loads(manifest.read_text())["parts"]}  # fmt: skip
    server.shutdown()


def run_slice(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SLICE), *args], capture_output=True, text=True, timeout=60
    )


def run_worker(
    origin: dict[str, Any], cache: Path, *layers: str
) -> subprocess.CompletedProcess[str]:
    return run_slice("worker", "--manifest", str(origin["manifest"]), "--source", origin["url"],
                     "--cache-dir", str(cache), *layers)  # fmt: skip


def test_a_worker_fetches_only_its_layers_each_checked_under_its_key(origin, tmp_path) -> None:
    cache = tmp_path / "rpc"
    done = run_worker(origin, cache, "--first-layer", "4", "--layers", "2", "--output")
    assert done.returncode == 0, done.stderr
    tensors = origin["parts"][0]["tensors"]
    mine = [t for t in tensors if t.get("layer") in (4, 5) or t["home"] == "output"]
    assert sorted(p.name for p in cache.iterdir()) == sorted(t["sha256"][:16] for t in mine)
    for t in mine:
        assert hashlib.sha256((cache / t["sha256"][:16]).read_bytes()).hexdigest() == t["sha256"]
    # Its tensors lie together in runs (GGUF pads each to its alignment): one read a run, and
    # every range the origin was asked for lies inside one of this worker's runs.
    runs: list[list[int]] = []
    for lo, hi in sorted((t["offset"], t["offset"] + t["size"]) for t in mine):
        if runs and lo - runs[-1][1] <= SLICE_GAP:
            runs[-1][1] = hi
        else:
            runs.append([lo, hi])
    assert len(runs) < len(mine) and len(origin["log"]) == len(runs), (runs, origin["log"])
    assert all(any(lo <= start and end < hi for lo, hi in runs) for start, end in origin["log"])
    assert json.loads(done.stdout)["fetched_bytes"] == sum(t["size"] for t in mine)
    # Again (a restart): what is in place is kept, nothing is read.
    origin["log"].clear()
    again = run_worker(origin, cache, "--first-layer", "4", "--layers", "2", "--output")
    assert again.returncode == 0 and not origin["log"]
    assert json.loads(again.stdout)["kept_bytes"] == sum(t["size"] for t in mine)


def test_bytes_that_do_not_match_the_manifest_leave_nothing(origin, gguf_file, tmp_path) -> None:
    tensors = origin["parts"][0]["tensors"]
    target = next(t for t in tensors if t["name"] == "blk.1.attn_q.weight")
    data = bytearray(gguf_file.read_bytes())
    data[target["offset"] + 5] ^= 0xFF
    gguf_file.write_bytes(bytes(data))
    cache = tmp_path / "rpc"
    done = run_worker(origin, cache, "--first-layer", "0", "--layers", "2")
    assert done.returncode == 1
    assert "blk.1.attn_q.weight" in done.stderr and "sha256" in done.stderr
    assert target["sha256"][:16] not in {p.name for p in cache.iterdir()}
    assert not list(cache.glob(".*partial"))


@pytest.mark.parametrize("tied", [False, True])
def test_a_main_node_holds_the_header_and_its_own_layers_and_keys_the_rest(
    tmp_path: Path, tied: bool
) -> None:
    source = model(tmp_path / "m.gguf", tied=tied)
    manifest = tmp_path / "m.json"
    manifest.write_text(slices.manifest_text(slices.manifest_of_files([source])))
    out, keys, elsewhere = tmp_path / "copy.gguf", tmp_path / "keys", tmp_path / "elsewhere"
    done = run_slice("main", "--manifest", str(manifest), "--source", source.as_uri(),
                     "--out", str(out), "--layers", "2", "--keys", str(keys),
                     "--elsewhere", str(elsewhere))  # fmt: skip
    assert done.returncode == 0, done.stderr
    original, copy = source.read_bytes(), out.read_bytes()
    assert len(copy) == len(original)
    [part] = json.loads(manifest.read_text())["parts"]
    assert copy[: part["header_size"]] == original[: part["header_size"]]
    keyed = dict(line.split(" ", 1) for line in keys.read_text().splitlines())
    for t in part["tensors"]:
        span = slice(t["offset"], t["offset"] + t["size"])
        mine = t["home"] == "input" or t.get("layer", 99) < 2
        # Its own ranges are the file's; the workers' are holes (zeros), each keyed.
        assert copy[span] == (original[span] if mine else bytes(t["size"])), t["name"]
        if not mine or (tied and t["name"] == "token_embd.weight"):
            assert keyed.pop(t["name"]) == f"{t['size']} {t['sha256'][:16]}"
    assert keyed == {}
    lacking = set(elsewhere.read_text().split())
    assert "token_embd.weight" not in lacking and "blk.2.attn_q.weight" in lacking
    assert "blk.1.attn_q.weight" not in lacking
