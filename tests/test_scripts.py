"""The boot scripts themselves, run on this machine against loopback: downloads, waits, errors.

Each bad input must end in a non-zero exit, a clear message, the failed phase and the error in
the status file, and nothing left running.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from infra.pins import LLAMA_CPP_COMMIT
from tests.conftest import SCRIPTS, free_port


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_model_parts_download_in_parallel_and_verify(run_script, http_files, tmp_path) -> None:
    base, root = http_files
    parts = [bytes([i]) * (300_000 + i) for i in range(1, 4)]
    names = [f"m-{i:05d}-of-00003.gguf" for i in range(1, 4)]
    for name, data in zip(names, parts, strict=True):
        (root / name).write_bytes(data)
    result, status = run_script(
        "fetch-model.sh",
        MODEL_URLS=" ".join(f"{base}/{n}" for n in names),
        MODEL_SHA256=" ".join(sha256(d) for d in parts),
    )
    assert result.returncode == 0, result.stderr
    models = tmp_path / "data" / "models"
    for name, data in zip(names, parts, strict=True):
        assert (models / name).read_bytes() == data
    assert status["model_path"] == str(models / names[0])
    assert status["model_bytes"] == sum(len(d) for d in parts)
    assert status["download_seconds"] >= 0
    assert not list(models.glob("*.partial"))


def test_download_resumes_a_partial_part(run_script, http_files, tmp_path) -> None:
    base, root = http_files
    data = bytes(range(256)) * 4000
    (root / "model.gguf").write_bytes(data)
    models = tmp_path / "data" / "models"
    models.mkdir(parents=True)
    (models / "model.gguf.partial").write_bytes(data[:400_000])
    # A server that does not honour the range would append the whole file: the checksum fails.
    result, _ = run_script(
        "fetch-model.sh", MODEL_URLS=f"{base}/model.gguf", MODEL_SHA256=sha256(data)
    )
    assert result.returncode == 0, result.stderr
    assert (models / "model.gguf").read_bytes() == data


def test_a_verified_model_is_not_downloaded_again(run_script, http_files) -> None:
    base, root = http_files
    data = b"gguf" * 1000
    (root / "model.gguf").write_bytes(data)
    settings = {"MODEL_URLS": f"{base}/model.gguf", "MODEL_SHA256": sha256(data)}
    assert run_script("fetch-model.sh", **settings)[0].returncode == 0
    (root / "model.gguf").unlink()  # a second download would now fail with 404
    result, _ = run_script("fetch-model.sh", **settings)
    assert result.returncode == 0, result.stderr
    assert "have model.gguf" in result.stderr


def test_a_model_url_that_answers_404_fails(run_script, http_files, tmp_path) -> None:
    base, _ = http_files
    started = time.monotonic()
    result, status = run_script("fetch-model.sh", MODEL_URLS=f"{base}/missing.gguf")
    assert result.returncode != 0
    assert time.monotonic() - started < 30  # an error, not a hang
    assert status["phase"] == "failed"
    assert f"download of {base}/missing.gguf failed" in status["last_error"]
    assert "404" in status["last_error"]
    assert not (tmp_path / "data" / "models" / "missing.gguf").exists()


def test_a_checksum_mismatch_fails_and_keeps_nothing(run_script, http_files, tmp_path) -> None:
    base, root = http_files
    (root / "model.gguf").write_bytes(b"not the expected bytes")
    result, status = run_script(
        "fetch-model.sh", MODEL_URLS=f"{base}/model.gguf", MODEL_SHA256="0" * 64
    )
    assert result.returncode != 0
    assert status["phase"] == "failed"
    assert "checksum mismatch" in status["last_error"]
    assert "0" * 64 in status["last_error"]
    models = tmp_path / "data" / "models"
    assert not (models / "model.gguf").exists()
    assert not (models / "model.gguf.partial").exists()


def test_no_model_url_is_an_error(run_script) -> None:
    result, status = run_script("fetch-model.sh", MODEL_URLS="")
    assert result.returncode != 0
    assert "setting MODEL_URLS is empty" in status["last_error"]


def test_one_checksum_per_part(run_script) -> None:
    result, status = run_script(
        "fetch-model.sh", MODEL_URLS="http://127.0.0.1:1/a.gguf http://127.0.0.1:1/b.gguf",
        MODEL_SHA256="0" * 64,
    )  # fmt: skip
    assert result.returncode != 0
    assert "1 checksums for 2 model URLs" in status["last_error"]


def test_waiting_for_workers_ends_when_all_answer(run_script) -> None:
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    try:
        workers = ",".join(f"127.0.0.1:{s.getsockname()[1]}" for s in listeners)
        result, status = run_script("wait-workers.sh", RPC_WORKERS=workers, WORKER_WAIT_SECONDS="5")
    finally:
        for s in listeners:
            s.close()
    assert result.returncode == 0, result.stderr
    assert status["workers_answered"] == workers.split(",")
    assert status["workers_missing"] == []


def test_a_worker_that_never_answers_is_a_bounded_wait(run_script) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    silent = f"127.0.0.1:{free_port()}"
    answering = f"127.0.0.1:{listener.getsockname()[1]}"
    started = time.monotonic()
    try:
        result, status = run_script(
            "wait-workers.sh", RPC_WORKERS=f"{answering},{silent}", WORKER_WAIT_SECONDS="4"
        )
    finally:
        listener.close()
    elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert 3 <= elapsed < 20  # whole seconds: bash counts the deadline in them
    assert status["phase"] == "failed"
    assert status["workers_answered"] == [answering]
    assert status["workers_missing"] == [silent]
    assert f"workers did not answer within 4s: {silent}" in status["last_error"]


def test_an_empty_worker_list_is_an_error(run_script) -> None:
    result, status = run_script("wait-workers.sh", RPC_WORKERS="")
    assert result.returncode != 0
    assert "setting RPC_WORKERS is empty" in status["last_error"]


def test_an_unknown_commit_fails_fast_with_the_commit_named(run_script, llama_source) -> None:
    unknown = "1" * 40
    result, status = run_script(
        "build-llama.sh",
        LLAMA_ROLE="worker",
        LLAMA_CPP_COMMIT=unknown,
        LLAMA_CPP_SOURCE=str(llama_source),
    )
    assert result.returncode != 0
    assert status["phase"] == "failed"
    assert f"llama.cpp commit {unknown} could not be fetched" in status["last_error"]
    assert "not our ref" in status["last_error"]


def test_a_short_commit_is_refused_before_any_fetch(run_script, tmp_path) -> None:
    result, status = run_script(
        "build-llama.sh", LLAMA_ROLE="worker", LLAMA_CPP_COMMIT=LLAMA_CPP_COMMIT[:7],
        LLAMA_CPP_SOURCE="https://github.com/ggml-org/llama.cpp",
    )  # fmt: skip
    assert result.returncode != 0
    assert "not a full 40-character commit hash" in status["last_error"]
    assert not (tmp_path / "prefix").exists()


def test_a_plain_tree_that_is_not_llama_cpp_is_refused(run_script, tmp_path) -> None:
    tree = tmp_path / "not-llama"
    tree.mkdir()
    result, status = run_script(
        "build-llama.sh", LLAMA_ROLE="main", LLAMA_CPP_COMMIT=LLAMA_CPP_COMMIT,
        LLAMA_CPP_SOURCE=str(tree),
    )  # fmt: skip
    assert result.returncode != 0
    assert "is not a llama.cpp source tree" in status["last_error"]


@pytest.mark.parametrize("address", ["0.0.0.0", "::"])
def test_a_worker_refuses_to_listen_on_every_interface(run_script, address: str) -> None:
    result, status = run_script("rpc-worker.sh", LLAMA_NODE_IP=address, LLAMA_CPP_COMMIT="0" * 40)
    assert result.returncode != 0
    assert "must never listen on every interface" in status["last_error"]


def test_status_tool_merges_fields_from_concurrent_writers(tmp_path: Path) -> None:
    from tests.conftest import SCRIPTS

    status = tmp_path / "status.json"
    writers = [
        subprocess.Popen(
            [
                "python3",
                str(SCRIPTS / "llama-rpc-status"),
                "--file",
                str(status),
                "set",
                f"k{i}:={i}",
            ]
        )
        for i in range(20)
    ]
    assert all(w.wait(timeout=30) == 0 for w in writers)
    import json

    data = json.loads(status.read_text())
    assert {f"k{i}": i for i in range(20)}.items() <= data.items()


# --- the main node's service: flags, log and placement ---

FIXTURES = Path(__file__).parent / "fixtures" / "llama-server"
# llama-server's load log (debug lines in) from a Gemma 3 270M main node with workers .11, .12.
GEMMA_LOAD_LOG = FIXTURES / "gemma-270m-main-and-2-workers.log"
GEMMA_WORKERS = "10.0.1.11:50052,10.0.1.12:50052"


SERVER_LOG = SCRIPTS / "llama-server-log"


def placement_of(log: Path, workers: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["python3", str(SERVER_LOG), "placement", str(log), workers],
        capture_output=True, text=True,
    )  # fmt: skip


def test_the_placement_is_read_from_llama_servers_own_log() -> None:
    result = placement_of(GEMMA_LOAD_LOG, GEMMA_WORKERS)
    assert result.returncode == 0, result.stderr
    mib = 1024**2
    # main: the mapped embeddings and 6 layers, and the KV cache (its repacked copies are not
    # counted twice); worker-2: 6 layers and the copy of the tied embeddings for the output.
    assert json.loads(result.stdout) == [
        {"node": "main", "layers": 6, "bytes": round((191.72 + 4.00 + 5.00) * mib)},
        {"node": "worker-1", "layers": 6, "bytes": round((21.34 + 4.00 + 5.00) * mib)},
        {"node": "worker-2", "layers": 6, "bytes": round((192.10 + 4.00 + 5.00) * mib)},
    ]


def test_a_log_without_the_layer_lines_is_an_error_that_says_why(tmp_path: Path) -> None:
    quiet = tmp_path / "load.log"
    lines = GEMMA_LOAD_LOG.read_text().splitlines(keepends=True)
    quiet.write_text("".join(line for line in lines if " D " not in line))
    result = placement_of(quiet, GEMMA_WORKERS)
    assert result.returncode != 0
    assert "0 placed layers of 18; was llama-server run with --log-verbosity 5" in result.stderr
    result = placement_of(GEMMA_LOAD_LOG, "10.0.1.11:50052,10.0.9.9:50052")
    assert result.returncode != 0 and "RPC0[10.0.1.12:50052] is on no server" in result.stderr


def test_the_filter_passes_each_line_on_as_it_comes(tmp_path: Path) -> None:
    """A line reaches the journal while llama-server is still running, not when a buffer fills."""
    filtering = subprocess.Popen(
        ["python3", str(SERVER_LOG), "filter", str(tmp_path / "load.log")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert filtering.stdin and filtering.stdout
    try:
        filtering.stdin.write("0.00.000.001 I srv  load_model: loading\n")
        filtering.stdin.flush()
        assert filtering.stdout.readline() == "0.00.000.001 I srv  load_model: loading\n"
    finally:
        filtering.kill()
        filtering.wait()


def test_debug_lines_stay_out_of_the_journal(tmp_path: Path) -> None:
    """Everything until the server listens goes to the load log; debug lines never pass on, even
    those after a colour code."""
    lines = GEMMA_LOAD_LOG.read_text() + (
        "0.02.000.000 D a debug line after loading\n"
        "\x1b[0m0.02.000.001 D \x1b[1mcoloured debug\n"
        "0.02.000.002 I srv  update_slots: all slots are idle\n"
        "\tcontinued\n"
    )
    load_log = tmp_path / "load.log"
    passed = subprocess.run(
        ["python3", str(SERVER_LOG), "filter", str(load_log)],
        input=lines, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert " D " not in passed and "coloured" not in passed
    assert "all slots are idle\n\tcontinued\n" in passed
    assert "model buffer size" in passed and "listening on" in passed
    kept = load_log.read_text()
    assert kept == GEMMA_LOAD_LOG.read_text()  # up to and with "listening on", debug included


FAKE_SERVER = r"""#!/usr/bin/env bash
# Stands in for llama-server: records its arguments, prints a real load log, answers /health.
printf '%s\n' "$@" >"$FAKE_ARGS"
cat "$FAKE_LOG"
while [[ $# -gt 0 ]]; do
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


def serve(tmp_path: Path, load_log: str) -> tuple[dict, list[str], str]:
    """Run llama-server.sh with a fake llama-server that prints ``load_log``, until the node says
    it is serving; return its status, the server's arguments and what reached the journal."""
    prefix, data = tmp_path / "prefix", tmp_path / "data"
    fake = prefix / LLAMA_CPP_COMMIT / "bin" / "llama-server"
    fake.parent.mkdir(parents=True)
    fake.write_text(FAKE_SERVER)
    fake.chmod(0o755)
    (data / "models").mkdir(parents=True)
    (data / "models" / "model.gguf").write_bytes(b"GGUF")
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    # The recorded log's buffers name 10.0.1.11 and .12: these two workers, in that order.
    workers = ",".join(f"127.0.0.1:{s.getsockname()[1]}" for s in listeners)
    renamed = dict(zip(GEMMA_WORKERS.split(","), workers.split(","), strict=True))
    log = tmp_path / "fixture.log"
    log.write_text(re.sub(r"10\.0\.1\.1[12]:50052", lambda m: renamed[m[0]], load_log))
    env = {
        "PATH": os.environ["PATH"], "LLAMA_RPC_ENV_FILE": str(tmp_path / "absent.env"),
        "LLAMA_DATA_DIR": str(data), "LLAMA_PREFIX": str(prefix),
        "LLAMA_CPP_COMMIT": LLAMA_CPP_COMMIT, "LLAMA_NODE_IP": "127.0.0.1",
        "SERVER_PORT": str(free_port()), "MODEL_URLS": "https://example.org/model.gguf",
        "RPC_WORKERS": workers, "LLAMA_GPU_LAYERS": "13", "LLAMA_TENSOR_SPLIT": "6,7",
        "CONTEXT_SIZE": "4096", "SLOTS": "3", "LLAMA_THREADS": "1",
        "FAKE_ARGS": str(tmp_path / "args"), "FAKE_LOG": str(log),
    }  # fmt: skip
    service = subprocess.Popen(
        ["bash", str(SCRIPTS / "llama-server.sh")], env=env, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        status: dict = {}
        while status.get("phase") != "serving":
            assert service.poll() is None and time.monotonic() < deadline, status
            time.sleep(0.2)
            status_file = data / "status.json"
            status = json.loads(status_file.read_text()) if status_file.exists() else {}
    finally:
        os.killpg(service.pid, signal.SIGTERM)
        journal = service.communicate(timeout=30)[0]
        for s in listeners:
            s.close()
    args = (tmp_path / "args").read_text().split("\n")
    args.append(workers)
    return status, args, journal


def test_the_main_node_serves_with_its_placement_slots_and_context(tmp_path: Path) -> None:
    """llama-server.sh renders the planned flags, and records the placement llama-server reports
    in the status file by the time the node says it is serving."""
    status, args, journal = serve(tmp_path, GEMMA_LOAD_LOG.read_text())
    assert [(p["node"], p["layers"]) for p in status["placement"]] == [
        ("main", 6),
        ("worker-1", 6),
        ("worker-2", 6),
    ]

    def flag(name: str) -> str:
        return args[args.index(name) + 1]

    assert (flag("--rpc"), flag("--n-gpu-layers"), flag("--tensor-split")) == (
        args[-1],
        "13",
        "6,7",
    )
    assert (flag("--ctx-size"), flag("--parallel"), flag("--fit")) == ("12288", "3", "off")
    assert (flag("--log-verbosity"), flag("--host")) == (
        "5",
        "127.0.0.1",
    ) and "--log-prefix" in args
    assert "assigned to device" not in journal and "model buffer size" in journal


def test_a_placement_that_cannot_be_read_does_not_stop_the_node(tmp_path: Path) -> None:
    """A log without llama.cpp's layer lines (another commit, another format) leaves the
    placement unknown, says so, and the node serves."""
    lines = GEMMA_LOAD_LOG.read_text().splitlines(keepends=True)
    status, _, journal = serve(tmp_path, "".join(line for line in lines if " D " not in line))
    assert status["phase"] == "serving" and status["placement"] is None
    assert "0 placed layers of 18" in journal and "warning: llama-server is ready" in journal
