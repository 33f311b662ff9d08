"""`lrc stage`'s copy into a real S3 API (moto's server, on loopback) from a loopback model
host that drops connections as a test tells it: pieces, resume, retries, progress."""

from __future__ import annotations

import hashlib
import urllib.request
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from infra.stage import cli, upload
from infra.stage.upload import Copied, StageError, copy_part
from tests.conftest import free_port

PIECE = 64 * 1024  # the test's piece size (S3's own minimum is 5 MiB: see the last test)
BUCKET = "models"


def data_of(size: int) -> bytes:
    return bytes(i * 13 % 251 for i in range(size))


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setattr("moto.s3.models.S3_UPLOAD_PART_MIN_SIZE", 1024)
    monkeypatch.setattr(upload, "PART_BYTES", PIECE)
    for name, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}.items():
        monkeypatch.setenv(name, value)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    # The server keeps one store per process: each test starts from an empty one.
    urllib.request.urlopen(
        urllib.request.Request(f"http://127.0.0.1:{port}/moto-api/reset", method="POST")
    ).close()
    try:
        client = boto3.client(
            "s3", region_name="us-east-1", endpoint_url=f"http://127.0.0.1:{port}"
        )
        client.create_bucket(Bucket=BUCKET)
        yield client
    finally:
        server.stop()


class Counting:
    """The S3 client, counting the pieces it uploads."""

    def __init__(self, client: Any) -> None:
        self.client, self.uploaded = client, []

    def upload_part(self, **asked: Any) -> Any:
        self.uploaded.append(asked["PartNumber"])
        return self.client.upload_part(**asked)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def no_sleep(_seconds: float) -> None:
    pass


def test_a_part_goes_up_in_pieces_checked_and_named_only_when_whole(s3, flaky_http) -> None:
    data = data_of(5 * PIECE + 1234)
    (flaky_http.root / "model.gguf").write_bytes(data)
    heard: list[Copied] = []
    counted = Counting(s3)
    got = copy_part(
        counted, f"{flaky_http.url}/model.gguf", BUCKET, "llama/model.gguf",
        hashlib.sha256(data).hexdigest(), report=heard.append, sleep=no_sleep,
    )  # fmt: skip
    assert got == hashlib.sha256(data).hexdigest()
    stored = s3.get_object(Bucket=BUCKET, Key="llama/model.gguf")
    assert stored["Body"].read() == data and stored["Metadata"] == {"sha256": got}
    assert sorted(counted.uploaded) == [1, 2, 3, 4, 5, 6]
    assert [c.done for c in heard] == [PIECE * n for n in range(1, 6)] + [len(data)]
    assert {c.total for c in heard} == {len(data)}
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert keys == ["llama/model.gguf"]  # the staging object is gone
    assert not s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads")


def test_a_dropped_read_opens_the_url_again_at_the_piece_it_was_reading(s3, flaky_http) -> None:
    data = data_of(4 * PIECE)
    (flaky_http.root / "model.gguf").write_bytes(data)
    flaky_http.faults["/model.gguf"] = ["drop"]  # half the body, then the connection closes
    got = copy_part(s3, f"{flaky_http.url}/model.gguf", BUCKET, "m.gguf", None, sleep=no_sleep)
    assert got == hashlib.sha256(data).hexdigest()
    assert s3.get_object(Bucket=BUCKET, Key="m.gguf")["Body"].read() == data
    assert [r for _, _, r in flaky_http.requests] == [None, f"bytes={2 * PIECE}-"]


def test_a_stopped_copy_resumes_without_uploading_again_what_s3_holds(
    s3, flaky_http, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = data_of(6 * PIECE + 99)
    (flaky_http.root / "model.gguf").write_bytes(data)
    url, want = f"{flaky_http.url}/model.gguf", hashlib.sha256(data).hexdigest()
    flaky_http.faults["/model.gguf"] = ["drop", "503"]  # half the part, then the host is down
    monkeypatch.setattr(upload, "ATTEMPTS", 2)  # two failed reads of one piece end the run
    first = Counting(s3)
    with pytest.raises(StageError, match="run the same command again: it resumes"):
        copy_part(first, url, BUCKET, "m.gguf", want, sleep=no_sleep)
    assert sorted(first.uploaded) == [1, 2, 3]  # what arrived before the drops
    assert len(s3.list_multipart_uploads(Bucket=BUCKET)["Uploads"]) == 1  # kept for the next run
    again = Counting(s3)
    heard: list[Copied] = []
    assert copy_part(again, url, BUCKET, "m.gguf", want, report=heard.append) == want
    assert sorted(again.uploaded) == [4, 5, 6, 7]  # only what S3 did not hold
    assert heard[-1].resumed == 3 * PIECE
    assert "resuming s3://models/m.gguf: 3 pieces there" in capsys.readouterr().err
    assert s3.get_object(Bucket=BUCKET, Key="m.gguf")["Body"].read() == data
    assert not s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads")


def test_pieces_that_differ_from_the_source_are_uploaded_again(s3, flaky_http) -> None:
    """A model host that now serves other bytes: what S3 held of the old ones is not kept."""
    old, new = data_of(3 * PIECE), data_of(3 * PIECE)[::-1]
    (flaky_http.root / "model.gguf").write_bytes(old)
    upload_id = s3.create_multipart_upload(Bucket=BUCKET, Key="m.gguf.staging")["UploadId"]
    s3.upload_part(Bucket=BUCKET, Key="m.gguf.staging", UploadId=upload_id, PartNumber=1,
                   Body=old[:PIECE])  # fmt: skip
    (flaky_http.root / "model.gguf").write_bytes(new)
    counted = Counting(s3)
    copy_part(counted, f"{flaky_http.url}/model.gguf", BUCKET, "m.gguf", None, sleep=no_sleep)
    assert sorted(counted.uploaded) == [1, 2, 3]
    assert s3.get_object(Bucket=BUCKET, Key="m.gguf")["Body"].read() == new


def test_a_checksum_mismatch_keeps_nothing(s3, flaky_http) -> None:
    (flaky_http.root / "model.gguf").write_bytes(data_of(2 * PIECE))
    with pytest.raises(StageError, match="checksum mismatch"):
        copy_part(s3, f"{flaky_http.url}/model.gguf", BUCKET, "m.gguf", "0" * 64, sleep=no_sleep)
    assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET)
    assert not s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads")


def test_a_missing_part_is_final_at_once(s3, flaky_http) -> None:
    with pytest.raises(StageError, match="HTTP Error 404"):
        copy_part(s3, f"{flaky_http.url}/nope.gguf", BUCKET, "m.gguf", None, sleep=no_sleep)
    assert flaky_http.paths() == ["/nope.gguf"]  # not retried


def test_progress_is_a_line_per_interval_when_nobody_watches(
    capsys: pytest.CaptureFixture[str],
) -> None:
    clock = iter([0.0, 10.0, 31.0, 32.0, 33.0])
    shown = cli.Shown(every=30, clock=lambda: next(clock))
    gb = 10**9
    for done in (10 * gb, 20 * gb, 30 * gb, 40 * gb, 48 * gb):
        shown(Copied("part-1.gguf", done, 48 * gb))
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "part-1.gguf: 20% (10.0 of 48.0 GB)",
        "part-1.gguf: 62% (30.0 of 48.0 GB), 968 MB/s",
        "part-1.gguf: 100% (48.0 of 48.0 GB), 1,455 MB/s",
    ]


@pytest.mark.parametrize("total", [None, 1, 50 * 10**9, 2 * 10**12])
def test_a_piece_is_at_least_s3s_minimum_and_a_part_at_most_its_piece_count(total) -> None:
    size = upload.part_bytes(total)
    assert 5 * 2**20 <= size <= 5 * 2**30
    assert total is None or -(-total // size) <= upload.MAX_PARTS == 10_000


def test_only_web_urls_are_read() -> None:
    with pytest.raises(StageError, match="give the part's https:// URL"):
        upload._open("file:///etc/passwd", 0)
