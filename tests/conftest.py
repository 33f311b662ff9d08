"""Shared fixtures. A tier that cannot run here is skipped, except in CI, where it fails."""

from __future__ import annotations

import contextlib
import functools
import http.server
import inspect
import json
import os
import random
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from infra import catalog
from infra.core.pins import LLAMA_CPP_COMMIT
from infra.local import image as node_image
from infra.local.machines import unavailable_reason
from infra.local.source import SourceError, cache_dir, sdist_tree
from tests import shared

REPO = Path(__file__).resolve().parent.parent
LRC = Path(sys.executable).parent / "lrc"  # the console script the project installs
SCRIPTS = REPO / "cloud-init" / "scripts"
# The tests' own catalog: the product's types, with test prices, sources and dates.
CATALOG_FIXTURE = REPO / "tests" / "fixtures" / "catalog"


@pytest.fixture(scope="session", autouse=True)
def fixture_catalog() -> Iterator[Path]:
    """Every test, and every process a test starts, reads the fixture catalog: a price refresh
    of the product's CSVs must not change what a test expects. Tests of the product's own data
    read ``catalog.CATALOG_FILE`` and its siblings by path."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(catalog.DIRECTORY_VARIABLE, str(CATALOG_FIXTURE))
        yield CATALOG_FIXTURE


@pytest.fixture(scope="session", autouse=True)
def controller_manifest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """No test fetches the LeaderWorkerSet release: the program's download answers the
    release's URL with the tests' manifest (tests/pulumi_mocks.CONTROLLER_MANIFEST), and keeps
    what it verifies in a directory of the session's."""
    from infra.core import pins
    from infra.stack.kube import controller
    from tests.pulumi_mocks import CONTROLLER_MANIFEST

    def download(url: str) -> bytes:
        assert url == pins.LWS_MANIFEST_URL, f"a test fetched {url}"
        return CONTROLLER_MANIFEST.read_bytes()

    kept = tmp_path_factory.mktemp("lws")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(controller, "download", download)
        patch.setattr(controller, "manifests_dir", lambda: kept)
        yield kept


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


def pinned_llama_binary(name: str) -> Path:
    """A program of the pinned llama.cpp as built on this machine (``lrc local up`` builds it)."""
    from infra.local.options import build_prefix

    binary = build_prefix(cache_dir()) / LLAMA_CPP_COMMIT / "bin" / name
    if not binary.is_file():
        unavailable(f"no pinned {name} at {binary}: `lrc local up` builds it")
    return binary


def require_azurite() -> str:
    """Azurite's blob server, which scripts/install-deps installs from the npm registry."""
    found = cache_dir() / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    if not found.is_file():
        unavailable(f"no Azurite at {found}: run scripts/install-deps")
    return str(found)


def require_netns() -> None:
    if os.geteuid() != 0:
        unavailable("network namespaces need root")
    for tool in ("ip", "nft"):
        require_tool(tool)


def require_machines() -> None:
    """``systemd-nspawn`` machines can run here, and the node image they boot is built."""
    if reason := unavailable_reason():
        unavailable(reason)
    if node_image.cached(cache_dir()) is None:
        unavailable("the node image is not built (scripts/install-deps builds it, as root)")


# Sends completions of BODY (JSON) to URL one after another, from wherever it runs (a namespace of
# the test's), until STOP exists or COUNT requests are done (-1: no limit), each given TIMEOUT
# seconds, with the API key in KEY_FILE if one is given. One JSON line per request: when it
# started and ended (CLOCK_MONOTONIC, the test's clock too), the HTTP status, the group that
# answered (the balancer's header), the text and token count, or the error.
COMPLETION_CLIENT = r"""
import json, os, sys, time, urllib.error, urllib.request
url, stop, count, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
body = sys.argv[5].encode()
key = open(sys.argv[6]).read().strip() if len(sys.argv) > 6 else ""
done = 0
while done != count and not os.path.exists(stop):
    row = {"start": time.monotonic(), "status": None, "group": None}
    try:
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = "Bearer " + key
        request = urllib.request.Request(url + "/completion", data=body, headers=headers)
        with urllib.request.urlopen(request, timeout=timeout) as response:
            reply = json.load(response)
            row |= {"status": response.status, "group": response.headers.get("X-Served-By"),
                    "content": reply["content"], "tokens": reply["tokens_predicted"]}
    except urllib.error.HTTPError as error:
        row |= {"status": error.code, "error": error.read().decode(errors="replace")[:300]}
    except Exception as error:
        row["error"] = repr(error)
    row["end"] = time.monotonic()
    print(json.dumps(row), flush=True)
    done += 1
"""


def completion_client(
    url: str,
    body: dict[str, Any],
    *,
    count: int = 1,
    stop: Path | str = "/nonexistent",
    timeout: float = 120,
    key_file: Path | str | None = None,
) -> list[str]:
    """The command that runs ``COMPLETION_CLIENT`` (to run inside a namespace, after its
    ``exec_prefix``): ``count`` completions of ``body`` to ``url`` (-1: until ``stop`` exists),
    with the API key read from ``key_file`` if given."""
    key_argument = [str(key_file)] if key_file is not None else []
    return [
        sys.executable, "-c", COMPLETION_CLIENT, url, str(stop), str(count), str(timeout),
        json.dumps(body), *key_argument,
    ]  # fmt: skip


@pytest.fixture(scope="session")
def llama_source() -> Path:
    try:
        return sdist_tree(cache_dir(), download=False)
    except SourceError as error:
        unavailable(str(error))
        raise


@pytest.fixture(scope="session")
def host_build(llama_source: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The pinned llama.cpp built on this machine, as ``lrc local up --machines`` builds it
    before its machines boot (skipped when it is there): a test that times a cluster from its
    boot asks for it, so that a run without the build cached builds it first, outside what the
    test measures."""
    from infra.local import cluster

    require_machines()  # the host builds for its machines: without them, nothing to build for
    options = one_plus_two(llama_source, "b", 217)
    cluster.build_on_host(options, tmp_path_factory.mktemp("host-build"), None)


# A connection over a cluster's bridge or link is accepted in well under a millisecond; one that
# a firewall drops hangs, so a probe gives up after a second (each "closed" costs that second).
PROBE_SECONDS = 1


def port_answers(argv_prefix: list[str], host: str, port: int) -> bool:
    """Whether a TCP connection to host:port, made where ``argv_prefix`` runs a command (a
    namespace's ``exec_prefix``, a machine's ``exec_argv``), is accepted within PROBE_SECONDS."""
    probe = ["timeout", str(PROBE_SECONDS), "bash", "-c", f"exec 3<>/dev/tcp/{host}/{port}"]
    return subprocess.run([*argv_prefix, *probe], capture_output=True, check=False).returncode == 0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def loopback_address() -> str:
    """An address of loopback's 127.0.0.0/8 for one test alone: a port is free only until the
    test's server binds it, and on 127.0.0.1 another test's server (on the other worker) may
    take it first and answer this test's probes; on an address of its own, nothing else does."""
    return f"127.{random.randint(1, 254)}.{random.randint(0, 255)}.{random.randint(2, 254)}"


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
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class FlakyServer:
    """A loopback HTTP server over ``root`` that misbehaves as told, and logs every request.

    ``faults[path]`` lists what the next requests for ``path`` get, one entry each, before the
    file is served properly (with ``Range: bytes=N-`` support): ``"drop"`` (the full
    Content-Length, half the body, then the connection closed), ``"reset"`` (the same, ended by
    a TCP reset), ``"429"`` (Too Many Requests, Retry-After: 1), ``"503"``, ``"redirect:URL"``
    (302 to URL), or ``"hold"`` (half the body, the rest once ``release`` is set).
    """

    url: str
    root: Path
    faults: dict[str, list[str]] = field(default_factory=dict)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # method, path, range
    release: threading.Event = field(default_factory=threading.Event)

    def paths(self) -> list[str]:
        return [path for _, path, _ in self.requests]


def _flaky_handler(server: FlakyServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            path = urllib.parse.unquote(self.path.split("?", 1)[0])
            asked = self.headers.get("Range")
            server.requests.append(("GET", path, asked))
            faults = server.faults.get(path, [])
            fault = faults.pop(0) if faults else None
            if fault and fault.startswith("redirect:"):
                self.send_response(302)
                self.send_header("Location", fault.removeprefix("redirect:"))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if fault in ("429", "503"):
                self.send_response(int(fault))
                self.send_header("Retry-After", "1")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            file = server.root / path.lstrip("/")
            if not file.is_file():
                self.send_error(404)
                return
            data = file.read_bytes()
            match = re.fullmatch(r"bytes=(\d+)-", asked or "")
            start = int(match.group(1)) if match else 0
            if start >= len(data) and match:
                self.send_error(416)
                return
            self.send_response(206 if match else 200)
            if match:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data) - start))
            self.end_headers()
            body = data[start:]
            if fault == "hold":
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                server.release.wait(30)
                self.wfile.write(body[len(body) // 2 :])
                return
            if fault in ("drop", "reset"):
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                time.sleep(0.1)  # the half arrives before the connection ends
                if fault == "reset":
                    self.connection.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                self.connection.close()
                self.close_connection = True
                return
            self.wfile.write(body)

    return Handler


@contextlib.contextmanager
def loopback_http(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """A threaded HTTP server on 127.0.0.1 (a free port) for the block; yields its URL. Errors
    from clients that hang up are the tests' business, not the log's."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.handle_error = lambda request, address: None  # type: ignore[method-assign]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def flaky_http(tmp_path: Path) -> Iterator[FlakyServer]:
    """A loopback HTTP server that drops, resets or rate-limits requests as a test tells it."""
    root = tmp_path / "www"
    root.mkdir()
    state = FlakyServer(url="", root=root)
    with loopback_http(_flaky_handler(state)) as state.url:
        yield state


@pytest.fixture
def small_tmpfs() -> Iterator[Callable[[int], Path]]:
    """Mounts a tmpfs of the given size in bytes (a small disk to fill); unmounted afterwards."""
    if os.geteuid() != 0:
        unavailable("mounting a tmpfs needs root")
    mounted: list[Path] = []

    def mount(size: int) -> Path:
        point = Path(tempfile.mkdtemp(prefix="llama-rpc-tmpfs-"))
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(point)],
            capture_output=True, text=True,
        )  # fmt: skip
        if result.returncode != 0:
            point.rmdir()
            unavailable(f"cannot mount a tmpfs here: {result.stderr.strip()}")
        mounted.append(point)
        return point

    try:
        yield mount
    finally:
        for point in mounted:
            subprocess.run(["umount", str(point)], check=True)
            point.rmdir()


@pytest.fixture
def no_aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """No AWS credentials anywhere boto3 looks: no keys or profile in the environment, no
    files, no metadata service asked."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def fake_bin(tmp_path: Path) -> tuple[Path, Callable[[str, str], Path]]:
    """A directory of stand-in commands, and a function that writes one (name, bash body); put
    the directory first in PATH."""
    directory = tmp_path / "fake-bin"
    directory.mkdir()

    def write(name: str, body: str) -> Path:
        path = directory / name
        path.write_text("#!/usr/bin/env bash\n" + body)
        path.chmod(0o755)
        return path

    return directory, write


def fake_main_node(tmp_path: Path, server: str) -> tuple[Path, Path]:
    """A main node's prefix and data directory on this machine, with ``server`` standing in for
    llama-server and a model file in place; (prefix, data)."""
    prefix, data = tmp_path / "prefix", tmp_path / "data"
    fake = prefix / LLAMA_CPP_COMMIT / "bin" / "llama-server"
    fake.parent.mkdir(parents=True)
    fake.write_text(server)
    fake.chmod(0o755)
    (data / "models").mkdir(parents=True)
    (data / "models" / "model.gguf").write_bytes(b"GGUF")
    return prefix, data


def main_node_env(tmp_path: Path, prefix: Path, data: Path) -> dict[str, str]:
    """The settings llama-server.sh needs of a main node made by ``fake_main_node``, on an
    address of loopback of its own: a test adds its own."""
    ip = loopback_address()
    return {
        "PATH": os.environ["PATH"], "LLAMA_RPC_ENV_FILE": str(tmp_path / "absent.env"),
        "LLAMA_DATA_DIR": str(data), "LLAMA_PREFIX": str(prefix),
        "LLAMA_CPP_COMMIT": LLAMA_CPP_COMMIT, "LLAMA_NODE_IP": ip,
        "SERVER_PORT": str(free_port(ip)), "MODEL_URLS": "https://example.org/model.gguf",
    }  # fmt: skip


def fake_llama_server(announce: str) -> str:
    """A stand-in for llama-server: records its arguments in $FAKE_ARGS, runs ``announce`` (a
    line of bash: what it prints while loading), then answers /health on --host:--port."""
    return (
        "#!/usr/bin/env bash\n"
        'printf \'%s\\n\' "$@" >"$FAKE_ARGS"\n'
        f"{announce}\n"
        + r"""while [[ $# -gt 0 ]]; do
  case "$1" in --host) host="$2" ;; --port) port="$2" ;; esac
  shift
done
exec python3 -c '
import http.server, sys
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
http.server.HTTPServer((sys.argv[1], int(sys.argv[2])), Health).serve_forever()
' "$host" "$port"
"""
    )


def post(
    url: str,
    path: str,
    body: dict[str, Any],
    timeout: float = 60,
    headers: dict[str, str] | None = None,
) -> Any:
    """POST JSON to a llama-server (on loopback or in a namespace this test made); the reply.
    ``headers``: the API key's, for a keyed cluster."""
    request = urllib.request.Request(
        f"{url}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
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


# cache_prompt off: every request evaluates the whole prompt, so results do not depend on what
# the server was asked before.
GREEDY_PROMPT = {
    "prompt": "Hello world, this is",
    "n_predict": 12,
    "temperature": 0,
    "n_probs": 1,
    "cache_prompt": False,
}


def complete(
    url: str,
    timeout: float = 60,
    prompt: dict[str, Any] = GREEDY_PROMPT,
    headers: dict[str, str] | None = None,
) -> tuple[str, list[tuple[int, float]]]:
    """A completion's text and each token's id and log-probability."""
    body = post(url, "/completion", prompt, timeout, headers)
    tokens = [(p["id"], p["logprob"]) for p in body["completion_probabilities"]]
    return body["content"], tokens


def one_node_completion(
    bin_dir: Path,
    model: Path,
    prompt: dict[str, Any] = GREEDY_PROMPT,
    *,
    context: int = 1024,
    server_args: tuple[str, ...] = (),
) -> tuple[str, list[tuple[int, float]]]:
    """The greedy completion of ``prompt`` from the model in one llama-server on loopback (with
    ``server_args``, as a cluster's serverArgs)."""
    port = free_port()
    single = subprocess.Popen(
        [
            str(bin_dir / "llama-server"), "--model", str(model),
            "--host", "127.0.0.1", "--port", str(port), "--ctx-size", str(context),
            "--threads", "1", *server_args,
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the single-node server did not start"
                time.sleep(0.5)
        return complete(url, prompt=prompt)
    finally:
        single.terminate()
        single.wait(timeout=30)


def one_plus_two(llama_source: Path, prefix: str, second_octet: int, **changes: Any) -> Any:
    """Options for a test cluster of a main node and two workers serving the generated model,
    on a /24 of 10.<second_octet>.x of its own (a random third octet), named for this process."""
    from infra.local.model import cached_model
    from infra.local.options import UpOptions

    cache = cache_dir()
    defaults: dict[str, Any] = {
        "workers": 2,
        "model": cached_model(llama_source, cache),
        "source": llama_source,
        "cache": cache,
        "cluster_id": f"{prefix}{os.getpid() % 100000}",
        "cidr": f"10.{second_octet}.{random.randint(100, 199)}.0/24",
        "threads": 1,
        "worker_wait_seconds": 300,
    }
    return UpOptions(**{**defaults, **changes})


# The slow tier: clusters, namespaces and machines. With pytest-xdist it runs on one worker, in
# order, while the other tiers share both workers; a slow test marked parallel_safe (its own
# directories, no cluster) runs with the other tiers.
SLOW_MARKERS = ("slow", "netns", "machines")
SLOW_GROUP = "clusters"
# The tests that deploy stacks under mocks run on one worker too, in order: each worker makes a
# deployment once (tests/pulumi_mocks.py), and the slow tier's worker, joining the other tiers
# at the end, would make them all again for the last few.
DEPLOYMENTS_GROUP = "deployments"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--patch-matrix",
        action="store_true",
        help="also run each llama.cpp patch off in turn (tests marked patch_matrix: a cluster "
        "boot a patch), for when the pin or the patch set moves",
    )


def pytest_itemcollected(item: pytest.Item) -> None:
    # Here, not in pytest_collection_modifyitems: xdist reads the groups in its own.
    if (
        item.config.pluginmanager.hasplugin("xdist")
        and any(item.get_closest_marker(name) for name in SLOW_MARKERS)
        and not item.get_closest_marker("parallel_safe")
    ):
        item.add_marker(pytest.mark.xdist_group(SLOW_GROUP))
    elif item.config.pluginmanager.hasplugin("xdist") and deploys_stacks(item):
        item.add_marker(pytest.mark.xdist_group(DEPLOYMENTS_GROUP))


def deploys_stacks(item: pytest.Item) -> bool:
    """Whether the item's module uses the mocked deployments: it binds tests.pulumi_mocks or
    something of it, or of a test module of the program (tests/stack)."""
    module = getattr(item, "module", None)
    if module is None:
        return False
    for value in vars(module).values():
        name = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", None)
        if isinstance(name, str) and (
            name == "tests.pulumi_mocks" or name.startswith("tests.stack.")
        ):
            return True
    return False


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--patch-matrix"):
        matrix = [item for item in items if item.get_closest_marker("patch_matrix")]
        if matrix:
            config.hook.pytest_deselected(items=matrix)
            items[:] = [item for item in items if item not in matrix]
    shared.keep_users_together(items)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    shared.release_unused(nextitem)


def pytest_sessionfinish(session: pytest.Session) -> None:
    shared.release_unused(None)


@pytest.fixture
def cluster_1p2(llama_source: Path) -> dict[str, Any]:
    """One local cluster of a main node and two workers (processes in namespaces, the generated
    model), shared by the tests that read it (``tests.shared``); a test that changes it puts it
    back (a killed worker is restarted, and the cluster serves again before the test ends)."""
    return shared.shared("cluster_1p2", lambda: _cluster_1p2(llama_source))


def _cluster_1p2(llama_source: Path) -> Iterator[dict[str, Any]]:
    from infra.local import cluster
    from infra.local.spec import ClusterSpec

    require_netns()
    options = one_plus_two(llama_source, "t", 213)
    contract = cluster.up(options, timeout=2400)
    spec = ClusterSpec.load(options.cache, options.cluster_id)
    network = spec.network()
    assert network is not None and network.main_is_routed_here()
    yield {"contract": contract, "spec": spec, "network": network, "options": options}
    cluster.down(options.cache, options.cluster_id)
    assert not [ns for ns in network.namespaces() if Path(f"/run/netns/{ns}").exists()]


@contextlib.contextmanager
def generating(
    url: str, headers: dict[str, str] | None = None, *, may_stop: bool = False
) -> Iterator[None]:
    """The main node keeps generating, from a thread, for the block; ``may_stop``: it may power
    off meanwhile (a spend guard), and its refusals are expected."""
    stop = threading.Event()

    def generate() -> None:
        while not stop.is_set():
            try:
                complete(url, headers=headers)
            except OSError:
                if not may_stop:
                    raise
                time.sleep(0.2)

    thread = threading.Thread(target=generate, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(120)
