"""The local cluster's store server (``infra.local.store_server``): a real S3 API on loopback
whose request log says, for each request, who asked for which range and what it got. The store
in a cluster's namespace, read by machines, is ``tests/local/test_worker_local.py``'s."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from infra.local.store import BUCKET, REGION
from tests.conftest import free_port


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    work = tmp_path_factory.mktemp("store")
    port, log, ready = free_port(), work / "requests.jsonl", work / "ready"
    process = subprocess.Popen(
        [sys.executable, "-m", "infra.local.store_server", "--host", "127.0.0.1",
         "--port", str(port), "--bucket", BUCKET, "--region", REGION, "--log", str(log),
         "--ready", str(ready)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert process.poll() is None, process.communicate()[1]
            assert time.monotonic() < deadline
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}", log
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_each_answered_request_is_logged_with_its_range_and_bytes(server) -> None:
    endpoint, log = server
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name=REGION,
                      aws_access_key_id="k", aws_secret_access_key="s")  # fmt: skip
    data = bytes(range(256)) * 64
    s3.put_object(Bucket=BUCKET, Key="m/part.gguf", Body=data)  # the bucket was made at start
    got = s3.get_object(Bucket=BUCKET, Key="m/part.gguf", Range="bytes=100-1123")["Body"].read()
    assert got == data[100:1124]
    whole = s3.get_object(Bucket=BUCKET, Key="m/part.gguf")["Body"].read()
    assert whole == data
    time.sleep(0.2)  # a request is logged once its body is sent
    records = [json.loads(line) for line in log.read_text().splitlines()]
    gets = [r for r in records if r["method"] == "GET" and r["path"] == f"/{BUCKET}/m/part.gguf"]
    assert [(r["range"], r["status"], r["bytes"]) for r in gets] == [
        ("bytes=100-1123", 206, 1024),
        (None, 200, len(data)),
    ]
    assert {r["client"] for r in records} == {"127.0.0.1"}
    [put] = [r for r in records if r["method"] == "PUT" and r["path"].endswith("part.gguf")]
    assert put["status"] == 200 and put["bytes"] >= 0
