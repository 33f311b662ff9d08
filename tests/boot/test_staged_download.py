"""A staged model read from a real S3 API (moto's server, with IAM enforced) by the node's real
tool (rclone), with the policy an AWS stack gives the main node, inside a network namespace this
test makes: nothing leaves it."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from infra.stack.backends.aws import staged_model_policy
from tests.conftest import LRC, REPO, SCRIPTS, require_netns, require_tool

pytestmark = pytest.mark.netns

PORT = 50991
HTTP_PORT = 50994
REGION = "us-east-1"
MODEL = os.urandom(4 * 1024 * 1024 + 123)


@dataclass(frozen=True)
class Store:
    namespace: str
    endpoint: str
    access_key: tuple[str, str]  # the node's: read-only on the "models" bucket
    log: Path
    admin_key: tuple[str, str] = ("", "")  # the person staging: writes "models"
    files: Path = Path()  # served over http inside the namespace, as a model host would


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    require_netns()
    require_tool("rclone")
    namespace = f"lrc-s3-{os.getpid() % 100000}"
    subprocess.run(["ip", "netns", "add", namespace], check=True)
    subprocess.run(["ip", "-n", namespace, "link", "set", "lo", "up"], check=True)
    work = tmp_path_factory.mktemp("moto")
    log = work / "moto.log"
    (work / "model.gguf").write_bytes(MODEL)
    # The node's policy as an AWS stack writes it for this one object.
    policy = staged_model_policy([("models", "llama/model.gguf")])
    admin_policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*",
                    "Resource": ["arn:aws:s3:::models", "arn:aws:s3:::models/*"]}]}  # fmt: skip
    files = work / "files"
    files.mkdir()
    (files / "part.gguf").write_bytes(MODEL[: 2 * 1024 * 1024])
    # The setup's requests; every request after them is checked against IAM.
    setup = [
        ["s3", "create_bucket", {"Bucket": "models"}],
        ["s3", "create_bucket", {"Bucket": "private"}],
        ["s3", "upload_file", {"Filename": str(work / "model.gguf"), "Bucket": "models",
                               "Key": "llama/model.gguf"}],
        ["s3", "put_object", {"Bucket": "private", "Key": "model.gguf", "Body": "x"}],
        ["iam", "create_user", {"UserName": "node"}],
        ["iam", "put_user_policy", {"UserName": "node", "PolicyName": "read-models",
                                    "PolicyDocument": json.dumps(policy)}],
        ["iam", "create_access_key", {"UserName": "node"}],
        ["iam", "create_user", {"UserName": "admin"}],
        ["iam", "put_user_policy", {"UserName": "admin", "PolicyName": "write-models",
                                    "PolicyDocument": json.dumps(admin_policy)}],
        ["iam", "create_access_key", {"UserName": "admin"}],
    ]  # fmt: skip
    server = subprocess.Popen(
        ["ip", "netns", "exec", namespace, str(Path(sys.executable).parent / "moto_server"),
         "-H", "127.0.0.1", "-p", str(PORT)],
        env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(len(setup))},
        stdout=log.open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    processes = [server]
    processes.append(subprocess.Popen(
        ["ip", "netns", "exec", namespace, sys.executable, "-m", "http.server", "-b", "127.0.0.1",
         "-d", str(files), str(HTTP_PORT)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    ))  # fmt: skip
    try:
        result = subprocess.run(
            ["ip", "netns", "exec", namespace, sys.executable, "-c", _SETUP],
            input=json.dumps(setup), capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        node_id, node_secret, admin_id, admin_secret = result.stdout.split()
        yield Store(
            namespace, f"http://127.0.0.1:{PORT}", (node_id, node_secret), log,
            (admin_id, admin_secret), files,
        )  # fmt: skip
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=10)
        subprocess.run(["ip", "netns", "del", namespace], check=False)


# Runs inside the namespace: waits for the server, then makes the setup's calls in order.
_SETUP = f"""
import json, sys, time, urllib.request
import boto3
kw = dict(endpoint_url="http://127.0.0.1:{PORT}", region_name="{REGION}",
          aws_access_key_id="setup", aws_secret_access_key="setup")
for _ in range(100):
    try:
        urllib.request.urlopen("http://127.0.0.1:{PORT}/moto-api/", timeout=1).close()
        break
    except OSError:
        time.sleep(0.1)
for service, call, args in json.load(sys.stdin):
    answer = getattr(boto3.client(service, **kw), call)(**args)
    if call == "create_access_key":
        print(answer["AccessKey"]["AccessKeyId"], answer["AccessKey"]["SecretAccessKey"])
"""


def fetch(store: Store, tmp_path: Path, *urls: str, **settings: str) -> tuple[int, dict]:
    key_id, secret = store.access_key
    env = {
        "PATH": os.environ["PATH"],
        "LLAMA_RPC_ENV_FILE": str(tmp_path / "absent.env"),
        "LLAMA_DATA_DIR": str(tmp_path / "data"),
        "MODEL_URLS": " ".join(urls),
        "MODEL_STORE_REGION": REGION,
        "MODEL_STORE_ENDPOINT": store.endpoint,
        "AWS_ACCESS_KEY_ID": key_id,
        "AWS_SECRET_ACCESS_KEY": secret,
        "STAGED_STREAMS": "4",
        "STAGED_CUTOFF": "1M",
        "DOWNLOAD_ATTEMPTS": "2",
        "DOWNLOAD_RETRY_DELAY": "1",
        **settings,
    }
    result = subprocess.run(
        ["ip", "netns", "exec", store.namespace, "bash", str(SCRIPTS / "fetch-model.sh")],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    status_file = tmp_path / "data" / "status.json"
    return result.returncode, json.loads(status_file.read_text()) if status_file.exists() else {}


def ranged_gets(store: Store, key: str) -> int:
    """GETs of ``key`` that the server answered with part of the object (206)."""
    lines = re.sub(r"\x1b\[[0-9;]*m", "", store.log.read_text()).splitlines()
    return sum(1 for line in lines if f'"GET /{key} ' in line and '" 206 ' in line)


def listed(store: Store, bucket: str) -> list[str]:
    """The prefix of every listing of ``bucket`` the server answered (moto does not evaluate
    ``s3:prefix`` conditions: the test compares them with the policy's)."""
    lines = re.sub(r"\x1b\[[0-9;]*m", "", store.log.read_text()).splitlines()
    found = []
    for line in lines:
        request = re.search(rf'"GET /{bucket}\?(\S*) HTTP', line)
        if request:
            query = urllib.parse.parse_qs(request.group(1), keep_blank_values=True)
            found.append(query.get("prefix", [""])[0])
    return found


def test_every_listing_the_node_makes_is_one_its_policy_admits(store, tmp_path) -> None:
    """rclone lists the object's directory before it reads it, and the key as a directory when
    it is missing: the stack's policy must admit exactly those prefixes, or S3 denies them."""
    before = len(listed(store, "models"))
    assert fetch(store, tmp_path, "s3://models/llama/model.gguf")[0] == 0
    assert fetch(store, tmp_path / "missing", "s3://models/llama/model.gguf.missing")[0] == 78
    prefixes = listed(store, "models")[before:]
    assert "llama/" in prefixes and "llama/model.gguf.missing/" in prefixes
    [_, listing] = staged_model_policy(
        [("models", "llama/model.gguf"), ("models", "llama/model.gguf.missing")]
    )["Statement"]
    assert set(prefixes) <= set(listing["Condition"]["StringEquals"]["s3:prefix"])


def test_a_staged_model_is_read_in_parallel_ranges_and_verified(store, tmp_path) -> None:
    before = ranged_gets(store, "models/llama/model.gguf")
    want = hashlib.sha256(MODEL).hexdigest()
    code, status = fetch(store, tmp_path, "s3://models/llama/model.gguf", MODEL_SHA256=want)
    assert code == 0, status
    saved = tmp_path / "data" / "models" / "model.gguf"
    assert saved.read_bytes() == MODEL and (saved.parent / "model.gguf.verified").exists()
    assert status["download_skipped"] is False and status["model_bytes"] == len(MODEL)
    assert status["download_done_bytes"] == status["download_total_bytes"] == len(MODEL)
    # Four streams, each a ranged GET answered 206.
    assert ranged_gets(store, "models/llama/model.gguf") - before == 4
    code, status = fetch(store, tmp_path, "s3://models/llama/model.gguf", MODEL_SHA256=want)
    assert code == 0 and status["download_skipped"] is True  # kept, not read again


def test_a_staged_model_with_a_bad_checksum_fails_and_keeps_nothing(store, tmp_path) -> None:
    code, status = fetch(store, tmp_path, "s3://models/llama/model.gguf", MODEL_SHA256="0" * 64)
    assert code == 78
    assert status["phase"] == "failed" and "checksum mismatch" in status["last_error"]
    assert not list((tmp_path / "data" / "models").iterdir())


def test_a_missing_object_is_final_and_says_so(store, tmp_path) -> None:
    code, status = fetch(store, tmp_path, "s3://models/llama/absent.gguf")
    assert code == 78
    assert (
        "s3://models/llama/absent.gguf failed: no such object in the store"
        in (status["last_error"])
    )


def test_a_denied_read_is_final_and_names_the_permission(store, tmp_path) -> None:
    code, status = fetch(store, tmp_path, "s3://private/model.gguf")
    assert code == 78
    assert "access denied; the node's identity needs read access" in status["last_error"]


def test_without_the_stores_region_the_boot_stops_at_once(store, tmp_path) -> None:
    code, status = fetch(store, tmp_path, "s3://models/llama/model.gguf", MODEL_STORE_REGION="")
    assert code == 78 and "MODEL_STORE_REGION is empty" in status["last_error"]


def stage(store: Store, *args: str) -> subprocess.CompletedProcess[str]:
    """`lrc stage` inside the namespace, as the person staging."""
    key_id, secret = store.admin_key
    env = {**os.environ, "AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret}
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CA_BUNDLE"):
        env.pop(name, None)
    return subprocess.run(
        ["ip", "netns", "exec", store.namespace, LRC, "stage",
         "--endpoint", store.endpoint, *args],
        env=env, capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
    )  # fmt: skip


def test_a_model_is_staged_once_checked_and_then_read_by_the_node(store, tmp_path) -> None:
    part = (store.files / "part.gguf").read_bytes()
    url = f"http://127.0.0.1:{HTTP_PORT}/part.gguf"
    want = hashlib.sha256(part).hexdigest()
    staged = stage(store, "--region", REGION, "--bucket", "models", "--prefix", "staged/",
                   "--url", url, "--sha256", want)  # fmt: skip
    assert staged.returncode == 0, staged.stderr
    assert 'urls: ["s3://models/staged/part.gguf"]' in staged.stdout
    assert f'sha256: ["{want}"]' in staged.stdout
    again = stage(store, "--region", REGION, "--bucket", "models", "--prefix", "staged/",
                  "--url", url)  # fmt: skip
    assert again.returncode == 0 and "have s3://models/staged/part.gguf" in again.stderr
    # A node whose identity may read it reads it whole, with the sha256 staging printed.
    admin_id, admin_secret = store.admin_key
    code, status = fetch(
        store, tmp_path, "s3://models/staged/part.gguf", MODEL_SHA256=want,
        AWS_ACCESS_KEY_ID=admin_id, AWS_SECRET_ACCESS_KEY=admin_secret,
    )  # fmt: skip
    assert code == 0, status
    assert (tmp_path / "data" / "models" / "part.gguf").read_bytes() == part
    # The node of this store may read only llama/model.gguf: this part fails, and nothing is
    # kept (moto answers as if it were missing; S3 answers 403 without the list permission).
    code, status = fetch(store, tmp_path / "node", "s3://models/staged/part.gguf")
    assert code == 78 and not (tmp_path / "node" / "data" / "models" / "part.gguf").exists()


def test_staging_refuses_a_bad_checksum_and_a_bucket_in_another_region(store) -> None:
    url = f"http://127.0.0.1:{HTTP_PORT}/part.gguf"
    bad = stage(store, "--region", REGION, "--bucket", "models", "--prefix", "bad/",
                "--url", url, "--sha256", "0" * 64)  # fmt: skip
    assert bad.returncode == 1 and "checksum mismatch for" in bad.stderr
    elsewhere = stage(store, "--region", "eu-west-1", "--bucket", "models", "--url", url)
    assert elsewhere.returncode == 1
    assert "bucket models is in us-east-1, the stack in eu-west-1" in elsewhere.stderr


def test_staging_writes_the_slice_manifest_and_a_worker_reads_only_its_ranges(
    store, tmp_path
) -> None:
    """Worker-local loading through the store: `lrc stage` writes the slice manifest beside the
    part, and a worker's llama-rpc-slice reads the manifest and then its layers' tensors, which
    lie together, in one ranged GET (206), never the whole part."""
    from tests.models.test_models import write_gguf

    rng = np.random.default_rng(3)
    tensors = {f"blk.{i}.ffn_up.weight": rng.standard_normal((128, 64)).astype(np.float32)
               for i in range(4)}  # fmt: skip
    write_gguf(store.files / "sliced.gguf", layers=4, tensors=tensors)
    url = f"http://127.0.0.1:{HTTP_PORT}/sliced.gguf"
    staged = stage(store, "--region", REGION, "--bucket", "models", "--prefix", "sliced/",
                   "--url", url)  # fmt: skip
    assert staged.returncode == 0, staged.stderr
    manifest = "s3://models/sliced/sliced.gguf.slices.json"
    assert f"slice manifest: {manifest}" in staged.stderr
    before = ranged_gets(store, "models/sliced/sliced.gguf")
    admin_id, admin_secret = store.admin_key
    env = {"PATH": os.environ["PATH"], "MODEL_STORE_REGION": REGION,
           "MODEL_STORE_ENDPOINT": store.endpoint, "AWS_ACCESS_KEY_ID": admin_id,
           "AWS_SECRET_ACCESS_KEY": admin_secret}  # fmt: skip
    cache = tmp_path / "rpc"
    done = subprocess.run(
        ["ip", "netns", "exec", store.namespace, sys.executable, str(SCRIPTS / "llama-rpc-slice"),
         "worker", "--manifest", manifest, "--source", "s3://models/sliced/sliced.gguf",
         "--first-layer", "2", "--layers", "2", "--cache-dir", str(cache)],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = (store.files / "sliced.gguf").read_bytes()
    held = sorted(p.name for p in cache.iterdir())
    assert len(held) == 2
    mine = [tensors[f"blk.{i}.ffn_up.weight"].tobytes() for i in (2, 3)]
    assert sorted(hashlib.sha256(t).hexdigest()[:16] for t in mine) == held
    assert all(t in data for t in mine)
    # One ranged read for both tensors, which lie together; no read of the whole part.
    assert ranged_gets(store, "models/sliced/sliced.gguf") - before == 1
    log = re.sub(r"\x1b\[[0-9;]*m", "", store.log.read_text())
    assert '"GET /models/sliced/sliced.gguf HTTP/1.1" 200' not in log
