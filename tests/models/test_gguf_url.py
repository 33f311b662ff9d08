"""--gguf with an http(s) URL: the header is read with range requests from a loopback server,
never the tensor data."""

from __future__ import annotations

import dataclasses
import http.server
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from infra.models import Model, ModelError, gguf_header
from tests.conftest import loopback_http
from tests.models.test_models import write_gguf

MIB = 1 << 20


@dataclass
class ModelServer:
    """A loopback HTTP server over ``root`` that honours ``Range: bytes=a-b`` (unless told not
    to), redirects ``/moved/...`` to ``/...``, and counts the body bytes it sends."""

    url: str
    root: Path
    honour_range: bool = True
    sent: int = 0
    # (path with query, Range header, User-Agent header) of every request.
    requests: list[tuple[str, str | None, str | None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ranges(self) -> list[str | None]:
        return [asked for _, asked, _ in self.requests]


def _handler(state: ModelServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            asked = self.headers.get("Range")
            state.requests.append((self.path, asked, self.headers.get("User-Agent")))
            path = self.path.split("?", 1)[0]
            if path.startswith("/moved/"):
                self.send_response(302)
                self.send_header("Location", path.removeprefix("/moved"))
                self.end_headers()
                return
            file = state.root / path.lstrip("/")
            if not file.is_file():
                self.send_error(404)
                return
            size = file.stat().st_size
            match = re.fullmatch(r"bytes=(\d+)-(\d*)", asked or "")
            if match and state.honour_range:
                start = int(match[1])
                end = min(int(match[2] or size - 1), size - 1)
                if start >= size:
                    self.send_error(416)
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            else:
                start, end = 0, size - 1
                self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(end - start + 1))
            self.end_headers()
            self.send_bytes(file, start, end - start + 1)

        def send_bytes(self, file: Path, start: int, length: int) -> None:
            with file.open("rb") as f:
                f.seek(start)
                while length > 0:
                    chunk = f.read(min(length, 64 * 1024))
                    self.wfile.write(chunk)  # fails once the client has hung up
                    with state.lock:
                        state.sent += len(chunk)
                    length -= len(chunk)

    return Handler


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ModelServer]:
    root = tmp_path / "www"
    root.mkdir()
    state = ModelServer(url="", root=root)
    with loopback_http(_handler(state)) as state.url:
        yield state


@pytest.fixture(scope="module")
def big_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model with a 5.2 MB header (more than the first fetch) and 64 MiB of tensor data. Its
    tokens are long: gguf parses a header at ~20 us a token, whatever their length."""
    path = tmp_path_factory.mktemp("big") / "big.gguf"
    tensors = {f"blk.{i}.attn_q.weight": np.zeros((4096, 4096), np.float16) for i in range(2)}
    write_gguf(path, layers=2, embedding=4096, heads=32, kv_heads=8, tensors=tensors,
               vocab=tokens(25_000, 200))  # fmt: skip
    return path


def tokens(count: int, length: int) -> list[str]:
    return [f"{i:0{length}d}" for i in range(count)]


def same_model(remote: Model, local: Model, url: str) -> None:
    """The URL's description is the local file's, field by field, but for where it came from."""
    assert remote.source == f"gguf:{url}"
    for name in (f.name for f in dataclasses.fields(Model) if f.name != "source"):
        assert getattr(remote, name) == getattr(local, name), name


def test_a_url_describes_the_model_as_its_local_file(server: ModelServer) -> None:
    path = write_gguf(server.root / "m.gguf", layers=3, heads=8, kv_heads=2, embedding=64)
    url = f"{server.url}/m.gguf"
    same_model(gguf_header.describe(url), gguf_header.describe(path), url)
    [(_, asked, agent)] = server.requests
    assert asked == f"bytes=0-{gguf_header.FIRST_CHUNK_BYTES - 1}"
    assert agent == gguf_header.USER_AGENT


def test_only_the_header_of_a_large_model_is_downloaded(
    server: ModelServer, big_model: Path
) -> None:
    served = server.root / big_model.name
    served.hardlink_to(big_model)
    size = served.stat().st_size
    assert size > 64 * MIB
    url = f"{server.url}/{served.name}"
    same_model(gguf_header.describe(url), gguf_header.describe(big_model), url)
    # 4 MiB did not hold the 5.2 MB header; the next 4 MiB did.
    assert server.ranges() == [f"bytes=0-{4 * MIB - 1}", f"bytes={4 * MIB}-{8 * MIB - 1}"]
    assert server.sent == 8 * MIB < size / 8


def test_a_server_that_ignores_ranges_is_refused_before_the_download(
    server: ModelServer, big_model: Path
) -> None:
    served = server.root / big_model.name
    served.hardlink_to(big_model)
    server.honour_range = False
    with pytest.raises(
        ModelError, match=r"^--gguf: .*big\.gguf ignored the range request \(HTTP 200.*"
        "needs a server that supports HTTP range requests",
    ):  # fmt: skip
        gguf_header.describe(f"{server.url}/big.gguf")
    assert server.sent < served.stat().st_size / 4  # what filled the socket buffers, at most


def test_http_errors_name_the_url(server: ModelServer) -> None:
    url = f"{server.url}/missing.gguf"
    with pytest.raises(ModelError, match=f"^--gguf: {re.escape(url)} answered HTTP 404"):
        gguf_header.describe(url)
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/m.gguf"
    with pytest.raises(ModelError, match=f"^--gguf: cannot reach {re.escape(closed)}"):
        gguf_header.describe(closed)


def test_non_gguf_and_truncated_files_say_what_is_wrong(server: ModelServer) -> None:
    (server.root / "notes.gguf").write_text("this is not a model\n")
    with pytest.raises(ModelError, match=r"notes\.gguf is not a GGUF file"):
        gguf_header.describe(f"{server.url}/notes.gguf")
    whole = write_gguf(server.root / "whole.gguf").read_bytes()
    (server.root / "truncated.gguf").write_bytes(whole[:40])
    with pytest.raises(ModelError, match=r"truncated\.gguf is not a readable GGUF file"):
        gguf_header.describe(f"{server.url}/truncated.gguf")


def test_redirects_are_followed(server: ModelServer) -> None:
    path = write_gguf(server.root / "m.gguf")
    url = f"{server.url}/moved/m.gguf"
    same_model(gguf_header.describe(url), gguf_header.describe(path), url)
    assert [p for p, _, _ in server.requests] == ["/moved/m.gguf", "/m.gguf"]
    assert server.ranges()[1] == server.ranges()[0]  # the range survives the redirect


def test_a_split_model_is_read_part_by_part(server: ModelServer) -> None:
    for no in (1, 2):
        write_gguf(
            server.root / f"big-0000{no}-of-00002.gguf", split=(no, 2),
            tensors={f"blk.{no}.attn_q.weight": np.zeros((32, 32), np.float32)},
        )  # fmt: skip
    first = f"{server.url}/big-00001-of-00002.gguf?download=true"
    local = gguf_header.describe(server.root / "big-00001-of-00002.gguf")
    same_model(gguf_header.describe(first), local, first)
    assert [p for p, _, _ in server.requests] == [
        "/big-00001-of-00002.gguf?download=true",
        "/big-00002-of-00002.gguf?download=true",
    ]
    with pytest.raises(ModelError, match="give the first part"):
        gguf_header.describe(f"{server.url}/big-00002-of-00002.gguf")
    (server.root / "big-00002-of-00002.gguf").unlink()
    second = re.escape(f"{server.url}/big-00002-of-00002.gguf?download=true")
    with pytest.raises(ModelError, match=f"{second} answered HTTP 404"):
        gguf_header.describe(first)


def test_the_fetch_doubles_until_the_header_parses_up_to_a_limit(
    server: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gguf_header, "FIRST_CHUNK_BYTES", 256)
    path = write_gguf(server.root / "m.gguf", vocab=tokens(100, 4))
    url = f"{server.url}/m.gguf"
    same_model(gguf_header.describe(url), gguf_header.describe(path), url)
    asked = server.ranges()
    assert asked[:3] == ["bytes=0-255", "bytes=256-511", "bytes=512-1023"]
    assert server.sent < path.stat().st_size  # the header only
    monkeypatch.setattr(gguf_header, "FIRST_CHUNK_BYTES", 64 * 1024)
    monkeypatch.setattr(gguf_header, "HEADER_LIMIT_BYTES", MIB)
    write_gguf(server.root / "wordy.gguf", vocab=tokens(10_000, 120))  # a 1.3 MB header
    with pytest.raises(ModelError, match=r"wordy\.gguf has no GGUF header within its first 1 MiB"):
        gguf_header.describe(f"{server.url}/wordy.gguf")


@pytest.mark.parametrize("big_endian", [False, True])
def test_the_header_length_is_where_the_tensor_infos_end(tmp_path: Path, big_endian: bool) -> None:
    import gguf

    order = gguf.GGUFEndian.BIG if big_endian else gguf.GGUFEndian.LITTLE
    writer = gguf.GGUFWriter(tmp_path / "m.gguf", "llama", endianess=order)
    writer.add_block_count(1)
    writer.add_token_list(tokens(50, 3))
    writer.add_array("llama.attention.sliding_window_pattern", [True, False])
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((8, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    data = (tmp_path / "m.gguf").read_bytes()
    length = gguf_header._header_length(data)
    assert length is not None
    padding = gguf.GGUFReader(tmp_path / "m.gguf").data_offset - length
    assert 0 <= padding < gguf.GGUF_DEFAULT_ALIGNMENT
    assert gguf_header._header_length(data[: length - 1]) is None
