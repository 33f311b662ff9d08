"""The main node's read of the stack's API key (`llama-rpc-secret`), and every AWS node's read of
its boot files (`llama-rpc-secret files`): signed GetParameter and GetParametersByPath calls to a
real SSM API (moto's server on loopback, IAM enforced: it checks the signature and the action,
ssm:GetParameter; it cannot match an SSM resource ARN, so the grant here names any parameter,
and the stack's own grant, one parameter, is pinned in tests/stack/test_aws.py), with credentials
from a stand-in for the instance metadata service (IMDSv2)."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

import boto3
import pytest

from infra.boot import API_KEY_CREDENTIAL, example, render_env_file
from infra.boot.deliver import for_cloud, packed
from infra.boot.render import BOOT_ROOT, fetched_files, files_digest
from infra.stack.backends.aws import api_key_policy, files_policy
from tests.conftest import SCRIPTS, free_port

REGION = "us-east-1"
KEY_PARAMETER = "/llama-rpc-cluster/t/api-key"
API_KEY = "k" * 20 + "-the-api-key"
FILES_PATH = "/llama-rpc-cluster/t/boot/main"
# The main node's files beyond its AWS user data, as the stack keeps them.
FETCHED = fetched_files(for_cloud(example("main"), "aws", REGION, FILES_PATH))


@dataclass(frozen=True)
class Store:
    ssm: str  # the SSM API's URL
    imds: str  # the metadata stand-in's URL
    log: Path
    ungranted: dict[str, str]  # credentials of an identity without the grant


def credentials(access_key: dict[str, Any]) -> dict[str, str]:
    return {
        "AccessKeyId": access_key["AccessKeyId"],
        "SecretAccessKey": access_key["SecretAccessKey"],
    }


class _Imds(http.server.BaseHTTPRequestHandler):
    """IMDSv2: a token for a PUT, then the role's name and its credentials for that token."""

    credentials: ClassVar[dict[str, str]] = {}
    token = "imds-token"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_PUT(self) -> None:
        assert self.path == "/latest/api/token"
        self._send(self.token.encode())

    def do_GET(self) -> None:
        if self.headers.get("X-aws-ec2-metadata-token") != self.token:
            self.send_error(401)
            return
        base = "/latest/meta-data/iam/security-credentials/"
        if self.path == base:
            self._send(b"llama-rpc-cluster-main-role")
        elif self.path == base + "llama-rpc-cluster-main-role":
            self._send(json.dumps(self.credentials).encode())
        else:
            self.send_error(404)

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    url = f"http://127.0.0.1:{port}"
    setup = 6 + len(FETCHED)  # the requests below; every later one is checked against IAM
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(setup)},
        stdout=log.open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    imds = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Imds)
    threading.Thread(target=imds.serve_forever, args=(0.05,), daemon=True).start()
    try:
        deadline = time.monotonic() + 30
        while True:  # a connection, not a request: every request counts against `setup`
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        admin = {"region_name": REGION, "endpoint_url": url, "aws_access_key_id": "setup",
                 "aws_secret_access_key": "setup"}  # fmt: skip
        ssm, iam = boto3.client("ssm", **admin), boto3.client("iam", **admin)
        ssm.put_parameter(Name=KEY_PARAMETER, Value=API_KEY, Type="SecureString")
        for file in FETCHED:
            name = f"{FILES_PATH}/{PurePosixPath(file['path']).relative_to(BOOT_ROOT)}"
            value = f"{file['permissions']} {packed(file['content'])}"
            tier = "Standard" if len(value) <= 4096 else "Advanced"
            ssm.put_parameter(Name=name, Value=value, Type="String", Tier=tier)
        iam.create_user(UserName="main")
        grants = api_key_policy("*")["Statement"] + files_policy("*")["Statement"]
        iam.put_user_policy(UserName="main", PolicyName="reads", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": grants}))  # fmt: skip
        key = iam.create_access_key(UserName="main")["AccessKey"]
        iam.create_user(UserName="worker")  # no grant at all
        other = iam.create_access_key(UserName="worker")["AccessKey"]
        _Imds.credentials = credentials(key)
        yield Store(url, f"http://127.0.0.1:{imds.server_address[1]}", log, credentials(other))
    finally:
        imds.shutdown()
        server.terminate()
        server.wait(10)


def read_key(
    store: Store, tmp_path: Path, source: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    key_file = tmp_path / "run" / "credstore" / API_KEY_CREDENTIAL
    env_file = tmp_path / "node.env"
    env_file.write_text(render_env_file({"API_KEY_SOURCE": source, "API_KEY_FILE": str(key_file)}))
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "llama-rpc-secret")],
        env={**os.environ, "LLAMA_RPC_ENV_FILE": str(env_file), "IMDS_ENDPOINT": store.imds,
             "SSM_ENDPOINT": store.ssm, "API_KEY_ATTEMPTS": "2"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return result, key_file


def test_the_main_node_reads_its_key_with_its_own_grant(store: Store, tmp_path: Path) -> None:
    result, key_file = read_key(store, tmp_path, f"aws-ssm:{REGION}:{KEY_PARAMETER}")
    assert result.returncode == 0, result.stderr
    assert key_file.read_text() == API_KEY + "\n"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700
    assert API_KEY not in result.stdout + result.stderr  # said where it went, not what it is


def test_an_identity_without_the_grant_is_refused(store: Store, tmp_path: Path) -> None:
    """A node whose identity has no grant (a worker's, were it to have one) reads nothing."""
    kept = dict(_Imds.credentials)
    _Imds.credentials = store.ungranted
    try:
        result, key_file = read_key(store, tmp_path, f"aws-ssm:{REGION}:{KEY_PARAMETER}")
    finally:
        _Imds.credentials = kept
    assert result.returncode != 0 and not key_file.exists()
    assert "could not read the key (aws-ssm:us-east-1:/llama-rpc-cluster/t/api-key)" in (
        result.stderr
    )
    assert "not authorized to perform: ssm:GetParameter" in result.stderr


def test_a_bad_signature_is_refused(store: Store, tmp_path: Path) -> None:
    """The control: the SSM API checks what the script signs (a wrong secret fails)."""
    kept = dict(_Imds.credentials)
    _Imds.credentials = {**kept, "SecretAccessKey": "not-the-secret"}
    try:
        result, key_file = read_key(store, tmp_path, f"aws-ssm:{REGION}:{KEY_PARAMETER}")
    finally:
        _Imds.credentials = kept
    assert result.returncode != 0 and not key_file.exists()
    assert "Signature" in result.stderr or "AccessDenied" in result.stderr


# --- the boot files beyond AWS's user data ---


def read_files(
    store: Store, tmp_path: Path, digest: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``llama-rpc-secret files`` from a node's scripts directory (ROOT/bin): the files go under
    ROOT."""
    root = tmp_path / "opt" / "llama-rpc"
    (root / "bin").mkdir(parents=True)
    for name in ("llama-rpc-secret", "llama_rpc_secret_aws.py"):
        shutil.copy(SCRIPTS / name, root / "bin" / name)
    env_file = tmp_path / "node.env"
    env_file.write_text(render_env_file(
        {"LLAMA_RPC_FILES_SOURCE": f"aws-ssm:{REGION}:{FILES_PATH}", "LLAMA_RPC_FILES": digest}
    ))  # fmt: skip
    result = subprocess.run(
        [sys.executable, str(root / "bin" / "llama-rpc-secret"), "files"],
        env={**os.environ, "LLAMA_RPC_ENV_FILE": str(env_file), "IMDS_ENDPOINT": store.imds,
             "SSM_ENDPOINT": store.ssm, "API_KEY_ATTEMPTS": "2"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return result, root


def test_a_node_reads_its_boot_files_with_their_modes_and_marks_them_read(
    store: Store, tmp_path: Path
) -> None:
    digest = files_digest(FETCHED)
    result, root = read_files(store, tmp_path, digest)
    assert result.returncode == 0, result.stderr
    assert any("/patches/" in f["path"] for f in FETCHED)  # the llama.cpp patch set among them
    for file in FETCHED:
        written = root / PurePosixPath(file["path"]).relative_to(BOOT_ROOT)
        assert written.read_text() == file["content"], file["path"]
        assert stat.S_IMODE(written.stat().st_mode) == int(file["permissions"], 8), file["path"]
    assert (root / f".files-{digest}").is_file()  # node-boot.sh reads them once


def test_files_that_are_not_the_set_the_node_expects_are_not_written(
    store: Store, tmp_path: Path
) -> None:
    """A node whose user data names another set (a stack changed between the two) fails at
    once, for good, and writes nothing."""
    result, root = read_files(store, tmp_path, "0" * 16)
    assert result.returncode == 78  # EXIT_FINAL: node-boot.sh does not retry it
    assert "are not the set this node expects (0000000000000000)" in result.stderr
    assert sorted(p.name for p in root.iterdir()) == ["bin"]


def test_an_identity_without_the_grant_reads_no_files(store: Store, tmp_path: Path) -> None:
    kept = dict(_Imds.credentials)
    _Imds.credentials = store.ungranted
    try:
        result, root = read_files(store, tmp_path, files_digest(FETCHED))
    finally:
        _Imds.credentials = kept
    assert result.returncode != 0 and sorted(p.name for p in root.iterdir()) == ["bin"]
    assert "not authorized to perform: ssm:GetParametersByPath" in result.stderr
