"""Shared fixtures. A tier that cannot run here is skipped, except in CI, where it fails."""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.local.source import SourceError, cache_dir, sdist_tree

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "cloud-init" / "scripts"


def unavailable(reason: str) -> None:
    """Skip on a developer machine; fail in CI, where every tier must run."""
    if os.environ.get("CI"):
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        unavailable(f"{name} is not installed (scripts/install-deps installs it)")
    assert path is not None
    return path


def assert_valid_cloud_config(text: str, directory: Path) -> None:
    """``cloud-init schema`` accepts the text (cloud-init's own validator, not a copy of it)."""
    cloud_init = require_tool("cloud-init")
    path = directory / "user-data"
    path.write_text(text)
    result = subprocess.run([cloud_init, "schema", "-c", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Valid cloud-config" in result.stdout


def require_netns() -> None:
    if os.geteuid() != 0:
        unavailable("network namespaces need root")
    for tool in ("ip", "nft"):
        require_tool(tool)


@pytest.fixture(scope="session")
def llama_source() -> Path:
    try:
        return sdist_tree(cache_dir(), download=False)
    except SourceError as error:
        unavailable(str(error))
        raise


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def run_script(tmp_path: Path) -> Callable[..., tuple[subprocess.CompletedProcess[str], dict]]:
    """Run a boot script on this machine with the given settings; return it and its status."""

    def run(
        name: str, timeout: float = 60, **settings: str
    ) -> tuple[subprocess.CompletedProcess[str], dict]:
        env = {
            "PATH": os.environ["PATH"],
            "LLAMA_RPC_ENV_FILE": str(tmp_path / "absent.env"),
            "LLAMA_DATA_DIR": str(tmp_path / "data"),
            "LLAMA_PREFIX": str(tmp_path / "prefix"),
            **settings,
        }
        result = subprocess.run(
            ["bash", str(SCRIPTS / name)], env=env, capture_output=True, text=True, timeout=timeout
        )
        status_file = tmp_path / "data" / "status.json"
        status = json.loads(status_file.read_text()) if status_file.exists() else {}
        return result, status

    return run


class _RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files with ``Range: bytes=N-`` support, as model hosts do (curl resumes with it)."""

    def log_message(self, format: str, *args: object) -> None:
        pass

    def send_head(self):  # type: ignore[no-untyped-def]
        match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
        path = Path(self.translate_path(self.path))
        if not match or not path.is_file():
            return super().send_head()
        start, size = int(match.group(1)), path.stat().st_size
        if start >= size:
            self.send_error(416)
            return None
        f = path.open("rb")
        f.seek(start)
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        self.send_header("Content-Length", str(size - start))
        self.end_headers()
        return f


@pytest.fixture
def http_files(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A loopback HTTP server (with range requests) over a temporary directory."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(_RangeHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


def post(url: str, path: str, body: dict[str, Any], timeout: float = 60) -> Any:
    """POST JSON to a llama-server (on loopback or in a namespace this test made); the reply."""
    request = urllib.request.Request(
        f"{url}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def tokens_of_length(url: str, count: int) -> str:
    """English text that the server's tokenizer makes exactly ``count`` tokens of (with the
    start token a completion adds), counted by its own /tokenize."""
    words = ("the", "river", "runs", "past", "a", "quiet", "town", "and")

    def text(n: int) -> str:
        return " ".join(words[i % len(words)] for i in range(n))

    def length(n: int) -> int:
        reply = post(url, "/tokenize", {"content": text(n), "add_special": True})
        return len(reply["tokens"])

    low, high = 0, count  # each word is at least one token
    while low < high:
        middle = (low + high + 1) // 2
        if length(middle) <= count:
            low = middle
        else:
            high = middle - 1
    assert length(low) == count, f"no prompt of exactly {count} tokens from these words"
    return text(low)
