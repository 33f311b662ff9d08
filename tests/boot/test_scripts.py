"""The boot scripts themselves, run on this machine against loopback: downloads, waits, errors.

Each bad input must end in a non-zero exit, a clear message, the failed phase and the error in
the status file, and nothing left running.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from infra.boot import render_env_file
from infra.boot.patches import patches_digest
from infra.core.pins import LLAMA_CPP_COMMIT
from tests.conftest import (
    REPO,
    SCRIPTS,
    fake_llama_server,
    fake_main_node,
    free_port,
    loopback_address,
    main_node_env,
    pinned_llama_binary,
    unavailable,
)


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


def test_a_draft_model_comes_with_the_model_and_is_checked_the_same_way(
    run_script, http_files, tmp_path
) -> None:
    """Its parts are fetched with the model's (the model's unchecked here, the draft's checked),
    and the model stays the model the status names; a wrong draft checksum fails the download."""
    base, root = http_files
    model, draft = b"gguf-model" * 1000, b"gguf-draft" * 500
    (root / "model.gguf").write_bytes(model)
    (root / "draft.gguf").write_bytes(draft)
    settings = {"MODEL_URLS": f"{base}/model.gguf", "DRAFT_MODEL_URLS": f"{base}/draft.gguf"}
    result, status = run_script("fetch-model.sh", **settings, DRAFT_MODEL_SHA256=sha256(draft))
    assert result.returncode == 0, result.stderr
    models = tmp_path / "data" / "models"
    assert (models / "draft.gguf").read_bytes() == draft
    assert (models / "draft.gguf.verified").read_text() == sha256(draft)
    assert status["model_path"] == str(models / "model.gguf")
    assert status["model_bytes"] == len(model) + len(draft)
    (models / "draft.gguf").unlink()
    (models / "draft.gguf.verified").unlink()
    result, status = run_script("fetch-model.sh", **settings, DRAFT_MODEL_SHA256="0" * 64)
    assert result.returncode == 78
    assert f"checksum mismatch for {base}/draft.gguf" in status["last_error"]
    result, status = run_script(
        "fetch-model.sh", **settings, DRAFT_MODEL_SHA256=f"{'0' * 64} {'1' * 64}"
    )
    assert result.returncode == 78
    assert "DRAFT_MODEL_SHA256 has 2 checksums for 1 draft model URLs" in status["last_error"]


@pytest.mark.parametrize("writeback", ["", "228800000000"])
def test_a_model_that_fits_in_memory_may_stay_dirty_while_it_downloads(
    run_script, http_files, fake_bin, tmp_path, writeback: str
) -> None:
    """With WRITEBACK_BYTES (the stack sets it when the main node's memory holds the model) the
    kernel may keep that much of the download unwritten, so the network sets the pace; without,
    its own limits stay. A sysctl that fails (a container's read-only /proc/sys) is said, not
    fatal."""
    base, root = http_files
    (root / "model.gguf").write_bytes(b"gguf" * 1000)
    directory, write = fake_bin
    write("sysctl", 'echo "$*" >>"$SYSCTL_LOG"\nexit 1\n')
    result, _ = run_script(
        "fetch-model.sh", MODEL_URLS=f"{base}/model.gguf", WRITEBACK_BYTES=writeback,
        PATH=f"{directory}:{os.environ['PATH']}", SYSCTL_LOG=str(tmp_path / "sysctl.log"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    if writeback:
        called = (tmp_path / "sysctl.log").read_text()
        assert called == f"-q -w vm.dirty_bytes={writeback} vm.dirty_background_bytes=1073741824\n"
        assert "could not raise the dirty-page limit" in result.stderr
    else:
        assert not (tmp_path / "sysctl.log").exists()


def test_a_parts_check_runs_beside_the_next_parts_download(
    run_script, http_files, fake_bin, tmp_path
) -> None:
    """One download at a time (a node whose memory holds one part): the first part's sha256
    check is still running when the second part's download begins, so the disk never waits for
    a check. The stand-in python3 holds the first check until the second download shows, for
    at most 5 s, and says which came first."""
    base, root = http_files
    parts = {"first.gguf": b"a" * 200_000, "second.gguf": b"b" * 200_000}
    for name, data in parts.items():
        (root / name).write_bytes(data)
    models = tmp_path / "data" / "models"
    directory, write = fake_bin
    write(
        "python3",
        f"""
for arg; do
  [[ "$arg" == */first.gguf.partial ]] || continue
  seen=serial
  for _ in $(seq 100); do
    if [[ -e "{models}/second.gguf.partial" || -e "{models}/second.gguf" ]]; then
      seen=overlapped; break
    fi
    sleep 0.05
  done
  echo "$seen" >>"{tmp_path}/order.log"
done
exec {shutil.which("python3")} "$@"
""",
    )
    result, status = run_script(
        "fetch-model.sh",
        MODEL_URLS=" ".join(f"{base}/{name}" for name in parts),
        MODEL_SHA256=" ".join(sha256(data) for data in parts.values()),
        DOWNLOAD_JOBS="1",
        PATH=f"{directory}:{os.environ['PATH']}",
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "order.log").read_text() == "overlapped\n"
    for name, data in parts.items():
        assert (models / name).read_bytes() == data
        assert (models / f"{name}.verified").read_text() == sha256(data)
    assert status["model_bytes"] == 400_000


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


def test_a_verified_model_is_not_downloaded_again(run_script, http_files, tmp_path) -> None:
    base, root = http_files
    data = b"gguf" * 1000
    (root / "model.gguf").write_bytes(data)
    settings = {"MODEL_URLS": f"{base}/model.gguf", "MODEL_SHA256": sha256(data)}
    assert run_script("fetch-model.sh", **settings)[0].returncode == 0
    first = json.loads((tmp_path / "data" / "status.json").read_text())["download_seconds"]
    (root / "model.gguf").unlink()  # a second download would now fail with 404
    result, status = run_script("fetch-model.sh", **settings)
    assert result.returncode == 0, result.stderr
    assert "have model.gguf" in result.stderr
    # A re-run (every reboot runs the boot) keeps the first download's time.
    assert status["download_skipped"] is True and status["download_seconds"] == first


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
    assert result.returncode == 78  # the same bytes would come again: not worth retrying
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
        # 3 s: a round (a probe of each and two status writes) takes well under a second, but on
        # a loaded machine the first may take one, and a 1 s wait would end before a second try.
        result, status = run_script(
            "wait-workers.sh", RPC_WORKERS=f"{answering},{silent}", WORKER_WAIT_SECONDS="3"
        )
    finally:
        listener.close()
    elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert 3 <= elapsed < 12  # never before the deadline, and not long after it
    assert "next try in 1s" in result.stderr  # it tried again before it gave up
    assert status["phase"] == "failed"
    assert status["workers_answered"] == [answering]
    assert status["workers_missing"] == [silent]
    assert f"workers did not answer within 3s: {silent}" in status["last_error"]


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
    assert result.returncode == 78  # final: no fetch will find it
    assert status["phase"] == "failed"
    assert f"llama.cpp commit {unknown} could not be fetched" in status["last_error"]
    assert "not our ref" in status["last_error"]
    assert "attempt 2" not in result.stderr


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


# Updates the status file WRITES times through the tool's own update(), each with a field of its
# own: many overlapping writes for the price of one process start.
STATUS_WRITER = """
import runpy, sys
from pathlib import Path
tool, status, name, writes = sys.argv[1:]
update = runpy.run_path(tool)["update"]
for n in range(int(writes)):
    update(Path(status), {f"{name}-{n}": n})
"""


def test_status_tool_merges_fields_from_concurrent_writers(tmp_path: Path) -> None:
    """Without the lock, these writers lose about half of each other's fields."""
    status = tmp_path / "status.json"
    tool = str(SCRIPTS / "llama-rpc-status")
    writers = [
        subprocess.Popen(["python3", "-c", STATUS_WRITER, tool, str(status), f"w{w}", "20"])
        for w in range(8)
    ]
    assert all(w.wait(timeout=30) == 0 for w in writers)
    data = json.loads(status.read_text())
    assert {f"w{w}-{n}": n for w in range(8) for n in range(20)}.items() <= data.items()


def test_status_tool_computes_the_values_bash_cannot() -> None:
    def tool(*args: str) -> str:
        return subprocess.run(
            ["python3", str(SCRIPTS / "llama-rpc-status"), *args],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip

    assert json.loads(tool("json-list", "10.0.1.11:50052", 'a "quoted" word')) == [
        "10.0.1.11:50052",
        'a "quoted" word',
    ]
    # $EPOCHREALTIME as a locale with a decimal comma writes it.
    since = time.time() - 2.5
    assert 2.5 <= float(tool("elapsed", f"{since:.6f}".replace(".", ","))) < 30


# --- the main node's service: flags, log and placement ---

FIXTURES = REPO / "tests" / "fixtures" / "llama-server"
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
    result = placement_of(GEMMA_LOAD_LOG, "")  # the log's layers are on RPC servers
    assert result.returncode != 0 and "a layer is on RPC0, beyond the servers" in result.stderr


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


# Stands in for llama-server: records its arguments, prints a real load log, answers /health.
FAKE_SERVER = fake_llama_server('cat "$FAKE_LOG"')


def serve(
    tmp_path: Path, load_log: str, server: str = FAKE_SERVER, **settings: str
) -> tuple[dict, list[str], str]:
    """Run llama-server.sh with a fake llama-server that prints ``load_log``, until the node says
    it is serving; return its status, the server's arguments and what reached the journal."""
    prefix, data = fake_main_node(tmp_path, server)
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    # The recorded log's buffers name 10.0.1.11 and .12: these two workers, in that order.
    workers = ",".join(f"127.0.0.1:{s.getsockname()[1]}" for s in listeners)
    renamed = dict(zip(GEMMA_WORKERS.split(","), workers.split(","), strict=True))
    log = tmp_path / "fixture.log"
    log.write_text(re.sub(r"10\.0\.1\.1[12]:50052", lambda m: renamed[m[0]], load_log))
    env = {
        **main_node_env(tmp_path, prefix, data),
        "RPC_WORKERS": workers, "LLAMA_GPU_LAYERS": "13", "LLAMA_TENSOR_SPLIT": "6,7",
        "CONTEXT_SIZE": "4096", "SLOTS": "3", "LLAMA_THREADS": "1",
        "FAKE_ARGS": str(tmp_path / "args"), "FAKE_LOG": str(log),
        "MODEL_ALIAS": "gemma-3-270m", "LLAMA_SERVER_ARGS": "--temp 0.5 --jinja",
        **settings,
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
            time.sleep(0.05)
            status_file = data / "status.json"
            try:  # written in place: a read may meet it half written, and looks again
                status = json.loads(status_file.read_text()) if status_file.exists() else {}
            except json.JSONDecodeError:
                status = {}
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
    ip = loopback_address()
    status, args, journal = serve(
        tmp_path, GEMMA_LOAD_LOG.read_text(), LLAMA_NODE_IP=ip, SERVER_PORT=str(free_port(ip))
    )
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
    # The stack's model id and its allowed flags, after the planned ones.
    assert (flag("--alias"), flag("--temp")) == ("gemma-3-270m", "0.5") and "--jinja" in args
    assert (flag("--log-verbosity"), flag("--host")) == ("5", ip) and "--log-prefix" in args
    assert "assigned to device" not in journal and "model buffer size" in journal


def test_llama_server_reads_no_config_file_its_user_can_write(tmp_path: Path) -> None:
    """The pinned llama-server applies ~/.config/llama.cpp/config.ini before its arguments: a
    file planted in a home the service user writes (a pod's data volume) would add options (a
    second API key, a chat template file). llama-server.sh points the lookup away from it."""
    home = tmp_path / "home"
    planted = home / ".config" / "llama.cpp" / "config.ini"
    planted.parent.mkdir(parents=True)
    planted.write_text("[default]\napi-key = planted-key-0123456789\n")
    recorder = fake_llama_server('echo "$XDG_CONFIG_HOME" >"$FAKE_ARGS.xdg"; cat "$FAKE_LOG"')
    serve(tmp_path, GEMMA_LOAD_LOG.read_text(), recorder, HOME=str(home))
    xdg = (tmp_path / "args.xdg").read_text().strip()
    assert xdg and not Path(xdg).exists()
    assert not Path(xdg).parent.exists() or Path(xdg).parent.stat().st_uid == 0
    binary = pinned_llama_binary("llama-server")

    def config_files_read(**env: str) -> list[str]:
        result = subprocess.run(
            [str(binary), "--help"], env={"PATH": "/usr/bin:/bin", "HOME": str(home), **env},
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        return re.findall(r"using config file: (\S+)", result.stdout + result.stderr)

    assert str(planted) in config_files_read()  # the attack, as the service ran before
    assert str(planted) not in config_files_read(XDG_CONFIG_HOME=xdg)


def test_a_placement_that_cannot_be_read_does_not_stop_the_node(tmp_path: Path) -> None:
    """A log without llama.cpp's layer lines (another commit, another format) leaves the
    placement unknown, says so, and the node serves."""
    lines = GEMMA_LOAD_LOG.read_text().splitlines(keepends=True)
    status, _, journal = serve(tmp_path, "".join(line for line in lines if " D " not in line))
    assert status["phase"] == "serving" and status["placement"] is None
    assert "0 placed layers of 18" in journal and "warning: llama-server is ready" in journal


# --- downloads that fail: retried, resumed, refused, and always recorded ---

FAST_RETRIES = {"DOWNLOAD_RETRY_DELAY": "0"}


def model_bytes(size: int) -> bytes:
    return bytes(i * 7 % 251 for i in range(size))


@pytest.mark.parametrize(("fault", "curl_error"), [("drop", 18), ("reset", 56)])
def test_a_dropped_connection_resumes_until_the_part_is_whole(
    run_script, flaky_http, tmp_path, fault: str, curl_error: int
) -> None:
    """curl --retry does not retry a body cut short (curl 18, 56): the outer loop does, resuming
    from what arrived rather than starting again."""
    data = model_bytes(600_000)
    (flaky_http.root / "model.gguf").write_bytes(data)
    flaky_http.faults["/model.gguf"] = [fault, fault]
    result, status = run_script(
        "fetch-model.sh", MODEL_URLS=f"{flaky_http.url}/model.gguf", MODEL_SHA256=sha256(data),
        **FAST_RETRIES,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    models = tmp_path / "data" / "models"
    assert sha256((models / "model.gguf").read_bytes()) == sha256(data)
    assert status["model_bytes"] == len(data)
    assert flaky_http.paths() == ["/model.gguf"] * 3
    if fault == "drop":  # each try asks for the rest only
        assert [r for _, _, r in flaky_http.requests] == [
            None,
            f"bytes={len(data) // 2}-",
            f"bytes={len(data) // 2 + (len(data) - len(data) // 2) // 2}-",
        ]
    assert f"curl: ({curl_error})" in result.stderr and "attempt 3 of 8" in result.stderr
    assert not list(models.glob("*.partial"))


def test_the_status_file_counts_the_download_as_it_comes(run_script, flaky_http, tmp_path) -> None:
    """Bytes done and in all while a part arrives (a resumed one: 206, its size from
    Content-Range), and done equal to all at the end."""
    data = model_bytes(400_000)
    (flaky_http.root / "model.gguf").write_bytes(data)
    models = tmp_path / "data" / "models"
    models.mkdir(parents=True)
    (models / "model.gguf.partial").write_bytes(data[:100_000])
    flaky_http.faults["/model.gguf"] = ["hold"]
    status_file = tmp_path / "data" / "status.json"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(
            run_script, "fetch-model.sh", MODEL_URLS=f"{flaky_http.url}/model.gguf",
            DOWNLOAD_PROGRESS_SECONDS="1", **FAST_RETRIES,
        )  # fmt: skip
        seen: dict = {}
        deadline = time.monotonic() + 20
        # curl's own buffer (stdio's) may hold back the last few KB of what has arrived.
        while seen.get("download_done_bytes", 0) < 200_000 and time.monotonic() < deadline:
            time.sleep(0.2)
            with contextlib.suppress(OSError, ValueError):
                seen = json.loads(status_file.read_text())
        flaky_http.release.set()
        result, status = running.result(timeout=60)
    assert result.returncode == 0, result.stderr
    assert seen["phase"] == "downloading"
    assert 200_000 <= seen["download_done_bytes"] <= 250_000
    assert seen["download_total_bytes"] == len(data)
    assert (status["download_done_bytes"], status["download_total_bytes"]) == (len(data),) * 2


def test_a_download_ends_without_waiting_out_the_progress_interval(run_script, http_files) -> None:
    """The progress reporter's pause does not outlive the script with its output: a caller that
    reads the output to its end (a pipe, the journal's stream) has it as soon as the part is in,
    not a progress interval later."""
    base, root = http_files
    (root / "model.gguf").write_bytes(model_bytes(1000))
    started = time.monotonic()
    result, status = run_script(
        "fetch-model.sh", MODEL_URLS=f"{base}/model.gguf", DOWNLOAD_PROGRESS_SECONDS="60"
    )
    assert result.returncode == 0, result.stderr
    assert status["model_bytes"] == 1000
    assert time.monotonic() - started < 15


def test_download_progress_reads_rclone_and_redirects(tmp_path: Path) -> None:
    """A staged part counts rclone's own stats; a part whose last response so far is a redirect,
    or whose size no response gave, makes the total unknown until it is known."""
    scratch, models = tmp_path / "scratch", tmp_path / "models"
    scratch.mkdir()
    models.mkdir()
    (models / "whole.gguf").write_bytes(b"x" * 1000)
    (scratch / "1.rclone").write_text(
        "2026/11/26 14:20:42 NOTICE:    74.996 MiB / 286.102 MiB, 26%, 0 B/s, ETA -\n"
        "2026/11/26 14:20:43 NOTICE:   224.996 MiB / 286.102 MiB, 79%, 149.834 MiB/s, ETA 0s\n"
    )
    (models / "redirected.gguf.partial").write_bytes(b"x" * 10)
    (scratch / "2.headers").write_text(
        "HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\nHTTP/1.1 302 Found\r\n"
        "Location: https://cdn/x\r\nContent-Length: 0\r\n\r\n"
    )
    parts = [models / "whole.gguf", models / "staged.gguf", models / "redirected.gguf"]

    def progress() -> dict:
        status = tmp_path / "status.json"
        subprocess.run(
            [sys.executable, SCRIPTS / "llama-rpc-status", "--file", status, "download-progress",
             scratch, *parts], check=True,
        )  # fmt: skip
        return json.loads(status.read_text())

    first = progress()
    assert first["download_done_bytes"] == 1000 + round(224.996 * 2**20) + 10
    assert first["download_total_bytes"] is None
    (scratch / "2.headers").write_text(
        (scratch / "2.headers").read_text() + "HTTP/2 200\r\ncontent-length: 7000\r\n\r\n"
    )
    assert progress()["download_total_bytes"] == 1000 + round(286.102 * 2**20) + 7000


def test_load_progress_counts_what_reached_the_workers() -> None:
    ss = (
        "0 0 10.0.0.1:40000 10.0.0.2:50052\n\t cubic bytes_sent:900 bytes_acked:800 segs_out:7\n"
        "0 0 10.0.0.1:40002 10.0.0.3:50052\n\t cubic bytes_acked:1200 bytes_received:5\n"
        "0 0 10.0.0.1:40004 10.0.0.9:22\n\t cubic bytes_acked:99999\n"
    )
    with tempfile.TemporaryDirectory() as work:
        status = Path(work) / "status.json"
        subprocess.run(
            [sys.executable, SCRIPTS / "llama-rpc-status", "--file", status, "load-progress",
             "10.0.0.2:50052,10.0.0.3:50052", "5000"], input=ss, text=True, check=True,
        )  # fmt: skip
        found = json.loads(status.read_text())
    assert (found["load_sent_bytes"], found["load_total_bytes"]) == (1998, 5000)  # less each SYN


def test_load_progress_reads_what_ss_says_of_a_real_connection(tmp_path: Path) -> None:
    """ss's own output for a loopback connection that carried 300,000 bytes to a "worker"."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        worker = f"127.0.0.1:{server.getsockname()[1]}"
        with socket.create_connection(server.getsockname()) as client:
            accepted, _ = server.accept()
            with accepted:
                client.sendall(b"w" * 300_000)
                got = 0
                while got < 300_000:
                    got += len(accepted.recv(65536))
                time.sleep(0.2)  # the last acknowledgement
                ss = subprocess.run(
                    ["ss", "-tinH", "state", "established"], capture_output=True, text=True,
                    check=True,
                ).stdout  # fmt: skip
    status = tmp_path / "status.json"
    subprocess.run(
        [sys.executable, SCRIPTS / "llama-rpc-status", "--file", status, "load-progress",
         f"{worker},10.0.0.3:50052", "600000"], input=ss, text=True, check=True,
    )  # fmt: skip
    assert json.loads(status.read_text())["load_sent_bytes"] == 300_000


def test_a_429_waits_as_long_as_retry_after_says(run_script, flaky_http, tmp_path) -> None:
    data = model_bytes(10_000)
    (flaky_http.root / "model.gguf").write_bytes(data)
    flaky_http.faults["/model.gguf"] = ["429"]
    started = time.monotonic()
    result, _ = run_script(
        "fetch-model.sh", MODEL_URLS=f"{flaky_http.url}/model.gguf", **FAST_RETRIES
    )
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started >= 1  # Retry-After: 1
    assert flaky_http.paths() == ["/model.gguf"] * 2
    assert (tmp_path / "data" / "models" / "model.gguf").read_bytes() == data


def test_retries_are_bounded_and_keep_what_can_resume(run_script, flaky_http, tmp_path) -> None:
    """A connection that always drops fails after DOWNLOAD_ATTEMPTS tries, exit 1 (the boot
    unit tries again later), keeping the partial file that the next try resumes."""
    data = model_bytes(100_000)
    (flaky_http.root / "model.gguf").write_bytes(data)
    flaky_http.faults["/model.gguf"] = ["drop"] * 10
    url = f"{flaky_http.url}/model.gguf"
    result, status = run_script(
        "fetch-model.sh", MODEL_URLS=url, DOWNLOAD_ATTEMPTS="3", **FAST_RETRIES
    )
    assert result.returncode == 1
    assert len(flaky_http.requests) == 3
    assert status["phase"] == "failed"
    assert f"download of {url} failed after 3 attempts" in status["last_error"]
    partial = tmp_path / "data" / "models" / "model.gguf.partial"
    assert 0 < partial.stat().st_size < len(data)
    assert partial.read_bytes() == data[: partial.stat().st_size]


def test_two_parts_with_one_file_name_are_refused(run_script, flaky_http) -> None:
    """They would be saved over each other and the model would look complete."""
    first, second = f"{flaky_http.url}/a/model.gguf", f"{flaky_http.url}/b/model.gguf"
    result, status = run_script("fetch-model.sh", MODEL_URLS=f"{first} {second}")
    assert result.returncode == 78  # final: the boot unit does not retry it
    assert status["phase"] == "failed"
    assert f"model URLs '{first}' and '{second}' both save as 'model.gguf'" in status["last_error"]
    assert flaky_http.requests == []


@pytest.mark.parametrize("path", ["/models/", "/models/?download=true", "/models/.."])
def test_a_url_without_a_file_name_is_refused(run_script, flaky_http, path: str) -> None:
    url = flaky_http.url + path
    result, status = run_script("fetch-model.sh", MODEL_URLS=url)
    assert result.returncode == 78
    assert status["phase"] == "failed"
    assert f"model URL '{url}' does not end in a file name" in status["last_error"]
    assert flaky_http.requests == []


def test_a_name_with_brackets_is_one_file_not_a_glob(run_script, flaky_http, tmp_path) -> None:
    """Without --globoff, curl would fetch m-1.gguf, m-2.gguf and m-3.gguf instead."""
    (flaky_http.root / "m-[1-3].gguf").write_bytes(b"GGUF one file")
    result, _ = run_script("fetch-model.sh", MODEL_URLS=f"{flaky_http.url}/m-[1-3].gguf")
    assert result.returncode == 0, result.stderr
    assert flaky_http.paths() == ["/m-[1-3].gguf"]
    assert (tmp_path / "data" / "models" / "m-[1-3].gguf").read_bytes() == b"GGUF one file"


def test_one_failed_part_fails_the_download_and_names_it(run_script, flaky_http, tmp_path) -> None:
    (flaky_http.root / "m-00001-of-00002.gguf").write_bytes(b"first part")
    good, bad = (f"{flaky_http.url}/m-0000{i}-of-00002.gguf" for i in (1, 2))
    result, status = run_script("fetch-model.sh", MODEL_URLS=f"{good} {bad}")
    assert result.returncode == 78  # a 404 does not go away by itself
    assert status["phase"] == "failed"
    assert f"download of {bad} failed: HTTP 404" in status["last_error"]
    assert good not in status["last_error"]
    assert "model ready" not in result.stderr
    assert (tmp_path / "data" / "models" / "m-00001-of-00002.gguf").read_bytes() == b"first part"


def test_a_part_that_fails_without_saying_why_still_fails(
    run_script, flaky_http, fake_bin, tmp_path
) -> None:
    """The job's exit status decides, not whether it wrote a reason: a checksum tool that fails
    silently (an I/O error) must not end in "model ready"."""
    directory, write = fake_bin
    real = shutil.which("python3")
    write("python3", f'[[ "${{2:-}}" != *hashlib* ]] || exit 1\nexec {real} "$@"\n')
    data = b"GGUF"
    (flaky_http.root / "model.gguf").write_bytes(data)
    url = f"{flaky_http.url}/model.gguf"
    result, status = run_script(
        "fetch-model.sh", MODEL_URLS=url, MODEL_SHA256=sha256(data),
        PATH=f"{directory}:{os.environ['PATH']}",
    )  # fmt: skip
    assert result.returncode == 1
    assert "model ready" not in result.stderr
    assert status["phase"] == "failed"
    assert url in status["last_error"] and "sha256" in status["last_error"]
    assert not (tmp_path / "data" / "models" / "model.gguf").exists()


def test_a_full_disk_fails_the_download_and_says_so(run_script, flaky_http, small_tmpfs) -> None:
    """On a disk too small for the model: the status says failed, which part, that the disk is
    full and by how much, and the partial file is gone (it cannot resume on this disk)."""
    disk = small_tmpfs(1024 * 1024)
    data = model_bytes(2 * 1024 * 1024)
    (flaky_http.root / "model.gguf").write_bytes(data)
    url = f"{flaky_http.url}/model.gguf"
    result, _ = run_script(
        "fetch-model.sh", MODEL_URLS=url, LLAMA_DATA_DIR=str(disk), **FAST_RETRIES
    )
    status = json.loads((disk / "status.json").read_text())
    assert result.returncode == 78
    assert status["phase"] == "failed"
    assert f"download of {url} failed: the disk is full" in status["last_error"]
    assert "model.gguf needs 2.0MiB" in status["last_error"]
    assert re.search(r"models has 10[0-9]{2}KiB free", status["last_error"])  # of 1 MiB
    assert sorted(p.name for p in disk.rglob("*")) == ["models", "status.json"]
    assert len(flaky_http.requests) == 1  # not retried


def test_a_model_url_that_answers_404_is_final_and_keeps_nothing(
    run_script, flaky_http, tmp_path
) -> None:
    models = tmp_path / "data" / "models"
    models.mkdir(parents=True)
    (models / "gone.gguf.partial").write_bytes(b"half of an old download")
    result, status = run_script("fetch-model.sh", MODEL_URLS=f"{flaky_http.url}/gone.gguf")
    assert result.returncode == 78
    assert "HTTP 404" in status["last_error"]
    assert not list(models.iterdir())


def test_a_redirect_is_followed_to_https_only(run_script, flaky_http, tmp_path) -> None:
    """A model host that sends the node on to plain http (or anywhere not https) is refused at
    once, and nothing is kept; a redirect to https would be followed."""
    data = model_bytes(4096)
    (flaky_http.root / "model.gguf").write_bytes(data)
    flaky_http.faults["/moved.gguf"] = [f"redirect:{flaky_http.url}/model.gguf"]
    result, status = run_script(
        "fetch-model.sh", MODEL_URLS=f"{flaky_http.url}/moved.gguf", **FAST_RETRIES
    )
    assert result.returncode == 78, result.stderr
    assert "redirects to a URL that is not https" in status["last_error"]
    assert flaky_http.paths() == ["/moved.gguf"]  # not followed
    assert not list((tmp_path / "data" / "models").iterdir())


# --- a load that hangs has a deadline ---


def test_a_load_that_never_finishes_is_stopped_at_its_deadline(tmp_path: Path) -> None:
    """llama-server that never answers /health: after LOAD_TIMEOUT_SECONDS the node is failed,
    says why, and the server is gone (systemd then starts it again, later)."""
    hung = '#!/usr/bin/env bash\necho $$ >"$FAKE_PID"\nexec sleep 600\n'
    prefix, data = fake_main_node(tmp_path, hung)
    pid_file = tmp_path / "server.pid"
    env = {
        **main_node_env(tmp_path, prefix, data),
        "LOAD_TIMEOUT_SECONDS": "2", "FAKE_PID": str(pid_file),
    }  # fmt: skip
    started = time.monotonic()
    result = subprocess.run(
        ["bash", str(SCRIPTS / "llama-server.sh")], env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert 2 <= time.monotonic() - started < 20
    status = json.loads((data / "status.json").read_text())
    assert status["phase"] == "failed"
    assert (
        "llama-server did not finish loading within 2s (LOAD_TIMEOUT_SECONDS)"
        in (status["last_error"])
    )
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


FAKE_LOADING_SERVER = """#!/usr/bin/env python3
import os, pathlib, socket, time
pathlib.Path(os.environ["FAKE_PID"]).write_text(str(os.getpid()))
host, port = os.environ["FAKE_WORKER"].rsplit(":", 1)
with socket.create_connection((host, int(port))) as worker:
    worker.sendall(b"w" * 1_000_000)  # weights on their way; /health never answers
    time.sleep(600)
"""


def test_the_main_node_counts_the_weights_it_has_sent_while_it_loads(tmp_path: Path) -> None:
    """llama-server.sh, with a stand-in server that sends 1 MB to its "worker" and never gets
    ready: the status file has the bytes sent and the planned total well before the deadline
    (then the script is stopped, as systemd stops it, and stops its server)."""
    prefix, data = fake_main_node(tmp_path, FAKE_LOADING_SERVER)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        worker = f"127.0.0.1:{listener.getsockname()[1]}"
        received = bytearray()

        def drain() -> None:
            with contextlib.suppress(OSError):
                while True:
                    peer, _ = listener.accept()
                    with peer:
                        while chunk := peer.recv(65536):
                            received.extend(chunk)

        threading.Thread(target=drain, daemon=True).start()
        env = {
            **main_node_env(tmp_path, prefix, data),
            "RPC_WORKERS": worker, "LLAMA_GPU_LAYERS": "1", "LLAMA_TENSOR_SPLIT": "1",
            "RPC_LOAD_BYTES": "4000000", "LOAD_TIMEOUT_SECONDS": "9", "FAKE_WORKER": worker,
            "FAKE_PID": str(tmp_path / "fake.pid"),
        }  # fmt: skip
        service = subprocess.Popen(
            ["bash", str(SCRIPTS / "llama-server.sh")], env=env, text=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        status: dict = {}
        try:
            while status.get("load_sent_bytes") != 1_000_000:
                assert service.poll() is None, (status, service.communicate()[1])
                time.sleep(0.2)
                with contextlib.suppress(OSError, ValueError):
                    status = json.loads((data / "status.json").read_text())
        finally:
            service.terminate()
            service.wait(timeout=30)
    assert len(received) == 1_000_000
    assert (status["load_sent_bytes"], status["load_total_bytes"]) == (1_000_000, 4_000_000)
    assert service.returncode == 143  # stopped, its deadline not reached
    with pytest.raises(ProcessLookupError):
        os.kill(int((tmp_path / "fake.pid").read_text()), 0)


def serving_stand_in(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """llama-server.sh serving a stand-in llama-server that waits out every SIGTERM (a stop grace
    of 1 s), in a session of its own, once the node says it serves; (the script, its journal)."""
    prefix, data = fake_main_node(tmp_path, fake_llama_server("trap '' TERM; cat \"$FAKE_LOG\""))
    env = {
        **main_node_env(tmp_path, prefix, data),
        "RPC_WORKERS": "", "FAKE_ARGS": str(tmp_path / "args"), "STOP_GRACE_SECONDS": "1",
        "FAKE_LOG": str(GEMMA_LOAD_LOG),  # a load log, which the node reads once it is ready
    }  # fmt: skip
    journal = tmp_path / "journal"
    with journal.open("w") as out:
        service = subprocess.Popen(
            ["bash", str(SCRIPTS / "llama-server.sh")], env=env,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    status: dict = {}
    while status.get("phase") != "serving":
        if service.poll() is not None:
            raise AssertionError((status, journal.read_text()))
        time.sleep(0.1)
        with contextlib.suppress(OSError, ValueError):
            status = json.loads((data / "status.json").read_text())
    return service, journal


def test_a_stopped_service_stops_a_server_that_waits_out_its_first_sigterm(tmp_path: Path) -> None:
    """systemd stops a service by signalling all of it: llama-server, answering a request, waits
    for it at the first SIGTERM (as long as systemd lets it: 90 s) and exits at the second. The
    script sends the second at once, then SIGKILL after STOP_GRACE_SECONDS: here a stand-in that
    ignores SIGTERM is gone within the grace, and the script exits as stopped."""
    service, journal = serving_stand_in(tmp_path)
    try:
        os.killpg(service.pid, signal.SIGTERM)  # as systemd: the script and its server
        started = time.monotonic()
        assert service.wait(timeout=20) == 143, journal.read_text()
        assert time.monotonic() - started < 5
        assert not subprocess.run(["pgrep", "-s", str(service.pid)], capture_output=True).stdout
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(service.pid, signal.SIGKILL)


def test_a_stop_signal_while_a_service_logs_still_stops_it(tmp_path: Path) -> None:
    """bash runs a pending trap while it reads a command substitution, and then fails to parse
    the command's next one: a service stopped while it logs exited 2 ("trap: unexpected EOF"),
    not as stopped. Here `date` and `basename` take half a second, so a log line that used them
    would be mid-substitution when the signal comes."""
    slow = tmp_path / "bin"
    slow.mkdir()
    for name in ("date", "basename"):
        real = shutil.which(name)
        (slow / name).write_text(f'#!/bin/sh\nsleep 0.5\nexec {real} "$@"\n')
        (slow / name).chmod(0o755)
    script = f"set -euo pipefail; source {SCRIPTS / 'lib.sh'}; trap 'exit 143' TERM\n"
    script += "while :; do log stopping soon; sleep 0.05; done\n"
    env = {**os.environ, "PATH": f"{slow}:{os.environ['PATH']}"}
    for _ in range(3):
        service = subprocess.Popen(
            ["bash", "-c", script], env=env, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
        time.sleep(0.3)
        os.killpg(service.pid, signal.SIGTERM)
        _, errors = service.communicate(timeout=10)
        assert service.returncode == 143, errors
        assert "stopping soon" in errors


def test_a_stop_that_also_signals_the_scripts_own_children_still_ends_the_server(
    tmp_path: Path,
) -> None:
    """systemd signals every process of the unit and goes on signalling those that appear while it
    does: the script's own waits (a sleep) are signalled too. Here every process of the session is
    signalled once, as soon as it is seen, until the script ends, and a stand-in server waits out
    every SIGTERM: the script still
    kills it within the grace, instead of ending at the first signalled sleep and leaving it for
    systemd's SIGKILL 90 s later."""
    service, journal = serving_stand_in(tmp_path)
    try:
        started, signalled = time.monotonic(), set()
        while service.poll() is None and time.monotonic() - started < 5:
            listed = subprocess.run(
                ["pgrep", "-s", str(service.pid)], capture_output=True, text=True
            )
            for pid in {int(p) for p in listed.stdout.split()} - signalled:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
                signalled.add(pid)
        assert service.wait(timeout=20) == 143, journal.read_text()
        assert time.monotonic() - started < 5
        assert not subprocess.run(["pgrep", "-s", str(service.pid)], capture_output=True).stdout
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(service.pid, signal.SIGKILL)


# --- packages and the llama.cpp source: transient failures are retried, boundedly ---

FAKE_DPKG_QUERY = 'grep -qx "${!#}" "$FAKE_INSTALLED" && printf installed\n'
# Records each call; `install` fails until FAKE_APT_FAILURES calls have failed.
FAKE_APT_GET = r"""
echo "$*" >>"$FAKE_APT_LOG"
[[ " $* " == *" install "* ]] || exit 0
failed=$(grep -c ' install ' "$FAKE_APT_LOG")
if [[ $failed -le $FAKE_APT_FAILURES ]]; then
  echo "E: Failed to fetch http://archive.ubuntu.com/ubuntu/pool/cmake.deb  Connection timed out"
  exit 100
fi
while [[ $# -gt 0 ]]; do
  case "$1" in
    -o) shift ;;
    -* | install) ;;
    *) echo "$1" >>"$FAKE_INSTALLED" ;;
  esac
  shift
done
"""


@pytest.fixture
def fake_apt(fake_bin, tmp_path: Path) -> dict[str, str]:
    """dpkg-query and apt-get stand-ins: nftables installed, the rest missing."""
    directory, write = fake_bin
    write("dpkg-query", FAKE_DPKG_QUERY)
    write("apt-get", FAKE_APT_GET)
    (tmp_path / "installed").write_text("nftables\n")
    return {
        "PATH": f"{directory}:{os.environ['PATH']}",
        "FAKE_INSTALLED": str(tmp_path / "installed"),
        "FAKE_APT_LOG": str(tmp_path / "apt.log"),
        "RETRY_DELAY": "0",
    }


def apt_calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "apt.log"
    return log.read_text().splitlines() if log.exists() else []


def test_missing_packages_are_installed_with_retries(run_script, fake_apt, tmp_path) -> None:
    result, _ = run_script(
        "install-packages.sh", LLAMA_PACKAGES="cmake g++ nftables", FAKE_APT_FAILURES="2",
        **fake_apt,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    installs = [c for c in apt_calls(tmp_path) if " install " in c]
    assert len(installs) == 3
    assert all(
        "-o Acquire::Retries=5" in c and c.endswith("install -y cmake g++") for c in installs
    )
    assert "trying again" in result.stderr
    # Everything there now: nothing to do, apt not called again.
    calls = len(apt_calls(tmp_path))
    result, _ = run_script(
        "install-packages.sh", LLAMA_PACKAGES="cmake g++ nftables", FAKE_APT_FAILURES="0",
        **fake_apt,
    )  # fmt: skip
    assert result.returncode == 0 and len(apt_calls(tmp_path)) == calls


def test_package_retries_are_bounded(run_script, fake_apt, tmp_path) -> None:
    result, status = run_script(
        "install-packages.sh", LLAMA_PACKAGES="cmake", FAKE_APT_FAILURES="99",
        PACKAGE_ATTEMPTS="3", **fake_apt,
    )  # fmt: skip
    assert result.returncode == 1  # worth retrying later: the boot unit will
    assert len([c for c in apt_calls(tmp_path) if " install " in c]) == 3
    assert status["phase"] == "failed"
    assert "could not install cmake after 3 attempts: E: Failed to fetch" in status["last_error"]


def test_the_boot_installs_missing_packages_before_it_builds(
    run_script, fake_apt, tmp_path
) -> None:
    """node-boot.sh: packages first, then the build (which fails here, at once and for good, on
    a short commit); the failure's exit status is the boot unit's."""
    result, status = run_script(
        "node-boot.sh", LLAMA_ROLE="worker", LLAMA_PACKAGES="cmake", FAKE_APT_FAILURES="1",
        LLAMA_CPP_COMMIT="0c1e570", LLAMA_CPP_SOURCE="https://github.com/ggml-org/llama.cpp",
        **fake_apt,
    )  # fmt: skip
    assert result.returncode == 78
    assert (tmp_path / "installed").read_text().split() == ["nftables", "cmake"]
    assert "not a full 40-character commit hash" in status["last_error"]
    assert (tmp_path / "data").stat().st_mode & 0o777 == 0o750


@pytest.mark.parametrize("marked", [False, True])
def test_the_boot_reads_the_files_beyond_its_user_data_first_and_once(
    fake_apt, tmp_path, marked: bool
) -> None:
    """node-boot.sh on an AWS main node: the boot files its user data could not hold come before
    anything else (here the store cannot be reached: a failure the boot unit retries, and no
    package is installed); once they are there (their mark), never again."""
    root = tmp_path / "opt" / "llama-rpc"
    shutil.copytree(SCRIPTS, root / "bin")
    if marked:
        (root / ".files-0123456789abcdef").touch()
    env_file = tmp_path / "node.env"
    env_file.write_text(render_env_file({
        "LLAMA_ROLE": "worker", "LLAMA_DATA_DIR": str(tmp_path / "data"),
        "LLAMA_PREFIX": str(tmp_path / "prefix"), "LLAMA_PACKAGES": "cmake",
        "LLAMA_CPP_COMMIT": "0c1e570", "LLAMA_CPP_SOURCE": "https://github.com/ggml-org/llama.cpp",
        "LLAMA_RPC_FILES_SOURCE": "aws-ssm:us-east-1:/llama-rpc-cluster/t/boot/main",
        "LLAMA_RPC_FILES": "0123456789abcdef",
    }))  # fmt: skip
    result = subprocess.run(
        ["bash", str(root / "bin" / "node-boot.sh")],
        env={**os.environ, **fake_apt, "LLAMA_RPC_ENV_FILE": str(env_file),
             "IMDS_ENDPOINT": f"http://127.0.0.1:{free_port()}", "API_KEY_ATTEMPTS": "1"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    status = json.loads((tmp_path / "data" / "status.json").read_text())
    installed = tmp_path / "installed"
    if marked:  # on to the packages, then the build (which refuses the short commit)
        assert result.returncode == 78, result.stderr
        assert "cmake" in installed.read_text().split()
        assert "not a full 40-character commit hash" in status["last_error"]
    else:
        assert result.returncode == 1, result.stderr
        assert "could not read the boot files (aws-ssm:us-east-1:" in status["last_error"]
        assert installed.read_text().split() == ["nftables"]  # nothing installed yet


def git_repo(tmp_path: Path) -> tuple[Path, str]:
    """A one-commit repository standing in for llama.cpp (no CMakeLists.txt: its build fails)."""
    repo = tmp_path / "upstream"
    repo.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}  # fmt: skip
    for args in (["init", "-q"], ["config", "uploadpack.allowAnySHA1InWant", "true"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, env=env)
    (repo / "README").write_text("not llama.cpp\n")
    subprocess.run(["git", "-C", str(repo), "add", "README"], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", "one"], check=True, env=env)
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    return repo, head


# git, except that its first FAKE_GIT_FAILURES fetches fail as an unreachable network does.
FAKE_GIT = r"""
if [[ " $* " == *" fetch "* ]]; then
  echo fetch >>"$FAKE_GIT_LOG"
  if [[ $(wc -l <"$FAKE_GIT_LOG") -le $FAKE_GIT_FAILURES ]]; then
    echo "fatal: unable to access 'https://github.com/': Could not resolve host: github.com" >&2
    exit 128
  fi
fi
exec "$REAL_GIT" "$@"
"""


@pytest.mark.parametrize(("failures", "fetches"), [(2, 3), (9, 3)])
def test_a_git_fetch_that_fails_is_retried_a_bounded_number_of_times(
    run_script, fake_bin, tmp_path, failures: int, fetches: int
) -> None:
    directory, write = fake_bin
    write("git", FAKE_GIT)
    repo, head = git_repo(tmp_path)
    result, status = run_script(
        "build-llama.sh", LLAMA_ROLE="worker", LLAMA_CPP_COMMIT=head, LLAMA_CPP_SOURCE=str(repo),
        GIT_FETCH_ATTEMPTS="3", RETRY_DELAY="0", PATH=f"{directory}:{os.environ['PATH']}",
        REAL_GIT=shutil.which("git"), FAKE_GIT_LOG=str(tmp_path / "git.log"),
        FAKE_GIT_FAILURES=str(failures),
    )  # fmt: skip
    assert (tmp_path / "git.log").read_text().split() == ["fetch"] * fetches
    assert status["phase"] == "failed"
    if failures < fetches:  # fetched on the third try; then the build fails (no CMakeLists.txt)
        assert "llama.cpp build failed" in status["last_error"]
        src = tmp_path / "prefix" / head / "src"
        assert (src / "README").read_text() == "not llama.cpp\n"
    else:
        assert result.returncode == 1
        assert (
            f"llama.cpp commit {head} could not be fetched from {repo} after 3 attempts: "
            "fatal: unable to access"
        ) in status["last_error"]


# --- the llama.cpp patch set ---

GOOD_PATCH = """Says so in the README.

Switch: NONE=0 (there is nothing to switch)
Upstream: none (a test's)

--- a/README
+++ b/README
@@ -1 +1,2 @@
 not llama.cpp
+patched
"""


def build_with_patches(
    run_script, tmp_path: Path, patches: dict[str, str], **settings: str
) -> tuple[subprocess.CompletedProcess[str], dict, Path]:
    """build-llama.sh on the stand-in repository with ``patches`` as its commit's set."""
    repo, head = git_repo(tmp_path)
    directory = tmp_path / "patches"
    (directory / head).mkdir(parents=True)
    for name, text in patches.items():
        (directory / head / name).write_text(text)
    result, status = run_script(
        "build-llama.sh", LLAMA_ROLE="worker", LLAMA_CPP_COMMIT=head, LLAMA_CPP_SOURCE=str(repo),
        LLAMA_CPP_PATCH_DIR=str(directory), **settings,
    )  # fmt: skip
    return result, status, tmp_path / "prefix" / head / "src"


def test_a_commit_without_a_patch_set_builds_unpatched_and_says_so(run_script, tmp_path) -> None:
    result, status, src = build_with_patches(run_script, tmp_path, {})
    assert status["build_patches"] == "none"
    assert "no llama.cpp patches for" in result.stderr and "building it unpatched" in result.stderr
    assert (src / "README").read_text() == "not llama.cpp\n"


def test_the_patch_set_is_applied_once_however_often_the_build_runs(run_script, tmp_path) -> None:
    """A build that failed after patching (here: the stand-in has nothing to build) starts again
    from the commit: the second run patches the checkout once, not twice."""
    for _ in range(2):
        result, status, src = build_with_patches(run_script, tmp_path, {"0001-x.patch": GOOD_PATCH})
        assert status["build_patches"] == "0001-x.patch", result.stderr
        assert "llama.cpp build failed" in status["last_error"]  # after the patch: no CMake
        assert (src / "README").read_text() == "not llama.cpp\npatched\n"
        shutil.rmtree(tmp_path / "upstream")
        shutil.rmtree(tmp_path / "patches")


def test_a_patch_that_does_not_apply_is_final_and_named(run_script, tmp_path) -> None:
    stale = GOOD_PATCH.replace(" not llama.cpp", " another tree")
    result, status, _ = build_with_patches(run_script, tmp_path, {"0002-stale.patch": stale})
    assert result.returncode == 78  # no retry mends it
    assert "llama.cpp patch 0002-stale.patch does not apply to" in status["last_error"]


def test_a_patch_set_other_than_the_one_the_node_expects_is_final(run_script, tmp_path) -> None:
    result, status, src = build_with_patches(
        run_script, tmp_path, {"0001-x.patch": GOOD_PATCH}, LLAMA_CPP_PATCHES="0123456789abcdef"
    )
    assert result.returncode == 78
    assert "are not the set this node expects (0123456789abcdef)" in status["last_error"]
    assert (src / "README").read_text() == "not llama.cpp\n"


def test_the_scripts_and_the_program_agree_on_the_sets_digest(run_script, tmp_path) -> None:
    """The node's stamp (build-llama.sh's digest) and its setting (patches_digest) must match,
    or a node that finds the host's build (a local machine) would try to build again."""
    adds = "A file.\n\nSwitch: NONE=0\nUpstream: none\n\n"
    adds += "--- /dev/null\n+++ b/NEW\n@@ -0,0 +1 @@\n+new\n"
    result, status, src = build_with_patches(
        run_script, tmp_path, {"0001-x.patch": GOOD_PATCH, "0002-y.patch": adds}
    )
    assert status["build_patches"] == "0001-x.patch 0002-y.patch", result.stderr
    assert (src / "NEW").read_text() == "new\n"
    expected = patches_digest(src.parent.name, tmp_path / "patches")
    assert expected != "none" and f"(set {expected})" in result.stderr


def test_a_patch_withheld_from_a_node_keeps_the_set_and_is_not_applied(
    run_script, tmp_path
) -> None:
    """A node whose role's build a patch does not change gets the diff's hash in its place:
    the same set, so the same digest and stamp as a node that applies it."""
    diff = "--- /dev/null\n+++ b/NEW\n@@ -0,0 +1 @@\n+new\n"
    adds = f"A file.\n\nSwitch: NONE=0\nUpstream: none\n\n{diff}"
    whole = tmp_path / "whole"
    (whole / "c").mkdir(parents=True)
    (whole / "c" / "0001-x.patch").write_text(GOOD_PATCH)
    (whole / "c" / "0002-y.patch").write_text(adds)
    expected = patches_digest("c", whole)
    withheld = {"0002-y.patch.sha256": hashlib.sha256(diff.encode()).hexdigest() + "\n"}
    result, status, src = build_with_patches(
        run_script, tmp_path, {"0001-x.patch": GOOD_PATCH, **withheld}, LLAMA_CPP_PATCHES=expected
    )
    assert status["build_patches"] == "0001-x.patch", result.stderr
    assert f"(set {expected})" in result.stderr
    assert (src / "README").read_text() == "not llama.cpp\npatched\n"
    assert not (src / "NEW").exists()


def test_a_withheld_patch_whose_hash_is_not_one_is_final(run_script, tmp_path) -> None:
    result, status, _ = build_with_patches(
        run_script, tmp_path, {"0001-x.patch": GOOD_PATCH, "0002-y.patch.sha256": "a few words\n"}
    )
    assert result.returncode == 78
    assert "0002-y.patch.sha256 does not hold a sha256" in status["last_error"]


# --- the status file: not for everyone's eyes ---


def test_the_status_file_is_not_world_readable(tmp_path: Path) -> None:
    data = tmp_path / "data"
    status = data / "status.json"
    subprocess.run(
        ["python3", str(SCRIPTS / "llama-rpc-status"), "--file", str(status), "set", "phase=x"],
        check=True, env={**os.environ, "PATH": os.environ["PATH"]},
    )  # fmt: skip
    assert data.stat().st_mode & 0o777 == 0o750
    assert status.stat().st_mode & 0o777 == 0o660  # its group (the service's) writes it too
    assert sorted(p.name for p in data.iterdir()) == ["status.json"]  # no lock or temporary file


def roots_data_directory(request: pytest.FixtureRequest, group: int) -> Path:
    """A data directory as node-boot.sh makes it: root's, the service's group's to read,
    set-group-ID."""
    if os.geteuid() != 0:
        unavailable("needs root to write as root beside another user")
    reachable = Path(tempfile.mkdtemp())  # pytest's own is root's alone
    request.addfinalizer(lambda: shutil.rmtree(reachable))
    reachable.chmod(0o755)
    data = reachable / "data"
    data.mkdir()
    os.chown(data, 0, group)
    data.chmod(0o2750)
    return data


def test_root_and_the_service_user_both_update_the_status_and_neither_can_swap_it(
    request: pytest.FixtureRequest,
) -> None:
    """Root makes the file (its group's to write: the set-group-ID directory gives it the
    service's group), the service user updates it in place, and the service user can put
    nothing in root's directory: no link for root to follow."""
    data = roots_data_directory(request, 4321)
    tool = ["python3", str(SCRIPTS / "llama-rpc-status"), "--file", str(data / "status.json")]
    subprocess.run([*tool, "set", "phase=building"], check=True)
    st = (data / "status.json").stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, 4321, 0o660)
    result = subprocess.run(
        [*tool, "set", "phase=serving"], user=4321, group=4321, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert json.loads((data / "status.json").read_text())["phase"] == "serving"
    assert (data / "status.json").stat().st_ino == st.st_ino  # rewritten in place
    plant = subprocess.run(
        ["ln", "-sf", "/etc/passwd", str(data / "planted")],
        user=4321, group=4321, capture_output=True, text=True,
    )  # fmt: skip
    assert plant.returncode != 0 and "Permission denied" in plant.stderr
    assert not (data / "planted").exists()


def test_the_status_tool_never_follows_a_link(request: pytest.FixtureRequest) -> None:
    """Were a link there (the service user cannot make one: the test above), root would not
    write or read through it, and the file it points at keeps its owner and text."""
    data = roots_data_directory(request, 4321)
    target = data.parent / "root-only"
    target.write_text("root's\n")
    target.chmod(0o600)
    (data / "status.json").symlink_to(target)
    tool = ["python3", str(SCRIPTS / "llama-rpc-status"), "--file", str(data / "status.json")]
    for args in (["set", "phase=x"], ["show"], ["get", "phase"]):
        result = subprocess.run([*tool, *args], capture_output=True, text=True)
        assert result.returncode != 0 and "is a symbolic link" in result.stderr, args
    assert target.read_text() == "root's\n"
    assert (target.stat().st_uid, target.stat().st_mode & 0o777) == (0, 0o600)


def test_a_part_in_place_but_not_marked_is_checked_not_fetched(
    run_script, flaky_http, tmp_path
) -> None:
    """A boot stopped between moving a part into place and marking it verified: the re-run
    checks the file it has instead of downloading it again."""
    data = b"GGUF" * 100
    models = tmp_path / "data" / "models"
    models.mkdir(parents=True)
    (models / "model.gguf").write_bytes(data)
    result, _ = run_script(
        "fetch-model.sh", MODEL_URLS=f"{flaky_http.url}/model.gguf", MODEL_SHA256=sha256(data)
    )
    assert result.returncode == 0, result.stderr
    assert flaky_http.requests == []
    assert (models / "model.gguf.verified").read_text() == sha256(data)


# --- strict mode comes first ---

SOURCE_LIB = 'source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"\n'
RUNNABLE_SCRIPTS = sorted(p.name for p in SCRIPTS.glob("*.sh") if p.read_text().startswith("#!"))


@pytest.mark.parametrize("name", RUNNABLE_SCRIPTS)
def test_a_script_without_lib_sh_stops_at_the_source_line(tmp_path: Path, name: str) -> None:
    """Each script sets its strict mode before it sources lib.sh, so without lib.sh beside it,
    it stops there: the line after (here one that leaves a mark, then exits) never runs."""
    text = (SCRIPTS / name).read_text()
    assert text.count(SOURCE_LIB) == 1
    copy, marker = tmp_path / name, tmp_path / "ran-past-the-source"
    copy.write_text(text.replace(SOURCE_LIB, SOURCE_LIB + ': >"$MARKER"; exit 99\n'))
    result = subprocess.run(
        ["bash", str(copy)], env={"PATH": os.environ["PATH"], "MARKER": str(marker)},
        capture_output=True, text=True, timeout=10,
    )  # fmt: skip
    assert result.returncode == 1
    assert "lib.sh: No such file or directory" in result.stderr
    assert not marker.exists()


# --- the worker's host firewall ---

FAKE_NFT = 'cat >"$FAKE_RULESET"\n'


@pytest.mark.parametrize(
    ("platform", "destinations"),
    [
        ("", "10.42.0.0/16, 169.254.0.0/16, 255.255.255.255"),
        ("168.63.129.16", "10.42.0.0/16, 169.254.0.0/16, 168.63.129.16, 255.255.255.255"),
    ],
)
def test_a_serving_worker_reaches_the_cluster_and_the_platform_only(
    run_script, fake_bin, tmp_path: Path, platform: str, destinations: str
) -> None:
    directory, write = fake_bin
    write("nft", FAKE_NFT)
    ruleset = tmp_path / "ruleset.nft"
    result, _ = run_script(
        "rpc-firewall.sh", PATH=f"{directory}:{os.environ['PATH']}", FAKE_RULESET=str(ruleset),
        RPC_ALLOWED_SOURCES="10.42.0.10/32", CLUSTER_CIDR="10.42.0.0/16",
        PLATFORM_ADDRESSES=platform,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    text = ruleset.read_text()
    assert "tcp dport 50052 ip saddr { 10.42.0.10/32 } accept" in text
    assert f"ip daddr {{ {destinations} }} accept" in text


@pytest.fixture
def boot_with(
    tmp_path: Path, run_script
) -> Callable[..., tuple[subprocess.CompletedProcess, dict]]:
    """node-boot.sh on the main node with stand-ins for the build and the download, each given a
    bash body; both record when they ran."""

    def boot(build: str, fetch: str) -> tuple[subprocess.CompletedProcess, dict]:
        bin_dir = tmp_path / "bin"
        shutil.copytree(SCRIPTS, bin_dir)
        for name, body in (("build-llama.sh", build), ("fetch-model.sh", fetch)):
            (bin_dir / name).write_text(
                '#!/usr/bin/env bash\nsource "$(dirname "$0")/lib.sh"\n'
                f'echo "{name} start $EPOCHREALTIME" >>"$LOG"\n{body}\n'
                f'echo "{name} end $EPOCHREALTIME" >>"$LOG"\n'
            )
            (bin_dir / name).chmod(0o755)
        return run_script(
            "node-boot.sh", LLAMA_ROLE="main", LLAMA_RPC_BIN_DIR=str(bin_dir),
            LOG=str(tmp_path / "log"),
        )  # fmt: skip

    return boot


def times(tmp_path: Path) -> dict[str, float]:
    lines = (tmp_path / "log").read_text().split("\n")
    return {f"{n} {e}": float(t) for n, e, t in (line.split() for line in lines if line)}


def test_the_main_node_downloads_while_it_builds(boot_with, tmp_path) -> None:
    result, status = boot_with(build="sleep 1", fetch="sleep 1")
    assert result.returncode == 0, result.stderr
    ran = times(tmp_path)
    assert ran["fetch-model.sh start"] < ran["build-llama.sh end"]
    assert ran["build-llama.sh start"] < ran["fetch-model.sh end"]
    assert status["phase"] == "booted"


@pytest.mark.parametrize(
    "case",
    [
        ("exit 0", 'fail_final "checksum mismatch"', 78, "checksum mismatch"),
        # The download goes on, and says "downloading", after the build has failed.
        ('fail "build broke"', "sleep 0.5; status phase=downloading; sleep 0.5", 1, "build broke"),
        ('fail "build broke"', 'fail_final "no such object"', 78, None),
        ("exit 0", 'fail "network down"', 1, "network down"),
    ],
)
def test_a_failed_build_or_download_fails_the_boot_after_both_end(
    boot_with, tmp_path, case: tuple[str, str, int, str | None]
) -> None:
    """The boot waits for both; what no retry can mend (78) wins; a download goes on to the end
    when the build fails, so the retry finds its parts."""
    build, fetch, code, error = case
    result, status = boot_with(build=build, fetch=fetch)
    assert result.returncode == code
    assert status["phase"] == "failed"
    assert error is None or error in status["last_error"]
    ran = times(tmp_path)
    assert "fetch-model.sh start" in ran and "booted" not in json.dumps(status)
    if "downloading" in fetch:
        assert "fetch-model.sh end" in ran
