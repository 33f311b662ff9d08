"""The boot scripts themselves, run on this machine against loopback: downloads, waits, errors.

Each bad input must end in a non-zero exit, a clear message, the failed phase and the error in
the status file, and nothing left running.
"""

from __future__ import annotations

import hashlib
import socket
import subprocess
import time
from pathlib import Path

import pytest

from infra.pins import LLAMA_CPP_COMMIT
from tests.conftest import free_port


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
