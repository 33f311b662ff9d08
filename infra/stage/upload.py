"""One model part from its URL into S3: a multipart upload that resumes, retries and reports.

The part streams through this machine once, in order: its sha256 is taken on the way, each
``part_bytes`` piece is uploaded (a few at once) to ``KEY.staging``, and only a whole, checked
part is copied to ``KEY`` with its sha256 as metadata. A run that stops leaves its multipart
upload in S3; the next run finds it, reads the part again from the start (the hash needs every
byte) and uploads only the pieces S3 does not already hold with the same MD5 (a piece's ETag),
so an interrupted copy of a 50 GB part costs its download again, not its upload.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import math
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

SHA256_METADATA = "sha256"
PART_BYTES = 64 * 2**20  # S3 takes 5 MiB to 5 GiB per piece, and at most 10,000 pieces
MAX_PARTS = 10_000
IN_FLIGHT = 4  # pieces uploading at once: IN_FLIGHT x part_bytes of memory
ATTEMPTS = 6  # per GET from an offset, and per piece's upload
READ_TIMEOUT_SECONDS = 120


class StageError(RuntimeError):
    """The model could not be staged; the message says why and what to do."""


@dataclass(frozen=True)
class Copied:
    """What a report hears: a part's bytes read and checked so far, and in all when known."""

    name: str
    done: int
    total: int | None
    resumed: int = 0  # bytes S3 already held from an earlier run, not uploaded again


Report = Callable[[Copied], None]


def part_bytes(total: int | None) -> int:
    """The piece size: 64 MiB, or more for a part that would need over 10,000 of them."""
    if total is None or total <= PART_BYTES * MAX_PARTS:
        return PART_BYTES
    return math.ceil(total / MAX_PARTS / 2**20) * 2**20


def _open(url: str, offset: int) -> tuple[IO[bytes], int | None]:
    """The URL's body from ``offset``, and the whole part's size when the server says it."""
    if not url.startswith(("https://", "http://")):
        raise StageError(f"{url}: give the part's https:// URL")
    asked = {"Range": f"bytes={offset}-"} if offset else {}
    request = urllib.request.Request(url, headers=asked)  # noqa: S310 (http and https only)
    response = urllib.request.urlopen(request, timeout=READ_TIMEOUT_SECONDS)  # noqa: S310
    if offset and response.status != 206:
        response.close()
        raise StageError(f"{url} does not answer range requests; it cannot be read from the middle")
    found = re.search(r"/(\d+)$", response.headers.get("Content-Range", ""))
    length = response.headers.get("Content-Length")
    if found:
        return response, int(found.group(1))
    return response, int(length) + offset if length and length.isdigit() else None


def _read_exactly(stream: IO[bytes], size: int) -> bytes:
    chunks, have = [], 0
    while have < size:
        chunk = stream.read(min(size - have, 2**20))
        if not chunk:
            break
        chunks.append(chunk)
        have += len(chunk)
    return b"".join(chunks)


class _Source:
    """The part's bytes in order, one piece at a time; a failed read opens the URL again at the
    start of the piece it was reading, up to ATTEMPTS times in a row."""

    def __init__(self, url: str, sleep: Callable[[float], None]) -> None:
        self.url, self.sleep = url, sleep
        self.offset = 0
        self.stream: IO[bytes] | None = None
        self.total: int | None = None

    def piece(self, size: int) -> bytes:
        for attempt in range(1, ATTEMPTS + 1):
            try:
                if self.stream is None:
                    self.stream, self.total = _open(self.url, self.offset)
                data = _read_exactly(self.stream, size)
                if self.total is not None and len(data) < min(size, self.total - self.offset):
                    raise OSError(f"the body ended at byte {self.offset + len(data):,}")
                self.offset += len(data)
                return data
            except urllib.error.HTTPError as error:
                self.close()
                if error.code in (408, 429) or error.code >= 500:
                    reason: object = error
                else:
                    raise StageError(f"could not read {self.url}: {error}") from None
            except OSError as error:  # reset, timeout, cut short
                self.close()
                reason = error
            if attempt == ATTEMPTS:
                raise StageError(
                    f"could not read {self.url} after {ATTEMPTS} attempts ({reason}); run the "
                    "same command again: it resumes"
                )
            print(f"reading {self.url} again from byte {self.offset:,} ({reason})", file=sys.stderr)
            self.sleep(min(60, 2**attempt))
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None


def _earlier_upload(s3: Any, bucket: str, key: str) -> tuple[str | None, dict[int, Any]]:
    """An unfinished upload of ``key`` from an earlier run, and its pieces by number."""
    uploads = s3.list_multipart_uploads(Bucket=bucket, Prefix=key).get("Uploads", [])
    mine = sorted((u for u in uploads if u["Key"] == key), key=lambda u: u["Initiated"])
    if not mine:
        return None, {}
    upload_id = mine[-1]["UploadId"]
    pieces: dict[int, Any] = {}
    for page in s3.get_paginator("list_parts").paginate(Bucket=bucket, Key=key, UploadId=upload_id):
        pieces |= {p["PartNumber"]: p for p in page.get("Parts", [])}
    return upload_id, pieces


class _Pieces:
    """The multipart upload of ``KEY.staging``: pieces S3 already holds (same size and MD5) are
    kept, the others uploaded IN_FLIGHT at a time, each retried."""

    def __init__(self, s3: Any, bucket: str, key: str, sleep: Callable[[float], None]) -> None:
        self.s3, self.bucket, self.key, self.sleep = s3, bucket, key, sleep
        upload_id, self.earlier = _earlier_upload(s3, bucket, key)
        self.resuming = upload_id is not None
        self.upload_id = upload_id or s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        self.etags: dict[int, str] = {}
        self.kept = 0
        self.pool = concurrent.futures.ThreadPoolExecutor(IN_FLIGHT)
        self.pending: dict[concurrent.futures.Future[str], int] = {}

    def put(self, number: int, data: bytes) -> None:
        have = self.earlier.get(number)
        if have and have["Size"] == len(data) and have["ETag"].strip('"') == _md5(data):
            self.etags[number] = have["ETag"]
            self.kept += len(data)
            return
        if len(self.pending) >= IN_FLIGHT:
            done, _ = concurrent.futures.wait(
                self.pending, return_when=concurrent.futures.FIRST_COMPLETED
            )
            for future in done:
                self.etags[self.pending.pop(future)] = future.result()
        self.pending[self.pool.submit(self._upload, number, data)] = number

    def _upload(self, number: int, data: bytes) -> str:
        for attempt in range(1, ATTEMPTS + 1):
            try:
                answer = self.s3.upload_part(
                    Bucket=self.bucket, Key=self.key, UploadId=self.upload_id,
                    PartNumber=number, Body=data,
                )  # fmt: skip
                return str(answer["ETag"])
            except Exception as error:  # botocore's: connection, throttling, a 5xx
                if attempt == ATTEMPTS or "NoSuchUpload" in str(error):
                    raise
                self.sleep(min(60, 2**attempt))
        raise AssertionError("unreachable")

    def wait(self) -> None:
        try:
            for future, number in self.pending.items():
                self.etags[number] = future.result()
        finally:
            self.pool.shutdown()

    def complete(self) -> None:
        self.s3.complete_multipart_upload(
            Bucket=self.bucket, Key=self.key, UploadId=self.upload_id,
            MultipartUpload={
                "Parts": [{"PartNumber": n, "ETag": self.etags[n]} for n in sorted(self.etags)]
            },
        )  # fmt: skip

    def abort(self) -> None:
        self.s3.abort_multipart_upload(Bucket=self.bucket, Key=self.key, UploadId=self.upload_id)


def _have(s3: Any, bucket: str, key: str, want: str | None) -> str | None:
    """The sha256 of ``key`` when S3 holds it whole (and it is the one wanted)."""
    try:
        head = s3.head_object(Bucket=bucket, Key=key)
    except s3.exceptions.ClientError as error:
        if error.response["Error"]["Code"] not in {"404", "NoSuchKey", "NotFound"}:
            raise StageError(f"s3://{bucket}/{key}: {error}") from None
        return None
    have = head.get("Metadata", {}).get(SHA256_METADATA)
    return str(have) if have and (want is None or have == want) else None


def copy_part(
    s3: Any,
    url: str,
    bucket: str,
    key: str,
    want: str | None,
    *,
    report: Report = lambda _copied: None,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Copy one part unless S3 has it already; its sha256."""
    if have := _have(s3, bucket, key, want):
        print(f"have s3://{bucket}/{key} (sha256 {have})", file=sys.stderr)
        return have
    staging = f"{key}.staging"
    pieces = _Pieces(s3, bucket, staging, sleep)
    if pieces.resuming:
        print(f"resuming s3://{bucket}/{key}: {len(pieces.earlier)} pieces there", file=sys.stderr)
    else:
        print(f"copying {url} to s3://{bucket}/{key}", file=sys.stderr)
    source = _Source(url, sleep)
    digest = hashlib.sha256()
    name = key.rsplit("/", 1)[-1]
    try:
        first = source.piece(PART_BYTES)  # it says the size, and so the piece size
        size = part_bytes(source.total)
        data = first + (source.piece(size - len(first)) if len(first) == PART_BYTES else b"")
        number = 1
        while True:
            digest.update(data)
            pieces.put(number, data)
            report(Copied(name, source.offset, source.total, pieces.kept))
            if len(data) < size:
                break
            data = source.piece(size)
            if not data:
                break
            number += 1
    finally:
        source.close()
        pieces.wait()
    got = digest.hexdigest()
    if want is not None and got != want:
        pieces.abort()
        raise StageError(f"checksum mismatch for {url}: expected sha256 {want}, got {got}")
    pieces.complete()
    # The part takes its name only once whole and checked, with its sha256 beside it.
    s3.copy(
        {"Bucket": bucket, "Key": staging}, bucket, key,
        ExtraArgs={"Metadata": {SHA256_METADATA: got}, "MetadataDirective": "REPLACE"},
    )  # fmt: skip
    s3.delete_object(Bucket=bucket, Key=staging)
    return got


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()
