"""One model part from its URL into an object store: in pieces that resume, retry and report.

The part streams through this machine once, in order: its sha256 is taken on the way, each
``part_bytes`` piece goes up (a few at once) as the store keeps pieces (each cloud's own, in
``infra.live``), and only a whole, checked part takes its name, with its sha256 as metadata. A run
that stops leaves its pieces in the store; the next run reads the part again from the start (the
hash needs every byte) and uploads only the pieces the store does not already hold with the same
size and MD5, so an interrupted copy of a 50 GB part costs its download again, not its upload.
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
from pathlib import Path
from typing import IO

from infra.live import Piece, StageError, Store

# S3 takes 5 MiB to 5 GiB per piece and at most 10,000 of them; Blob Storage 50,000 blocks of up
# to 4,000 MiB; Cloud Storage composes any number, 32 at a time.
PART_BYTES = 64 * 2**20
MAX_PARTS = 10_000
IN_FLIGHT = 4  # pieces uploading at once: IN_FLIGHT x part_bytes of memory
ATTEMPTS = 6  # per GET from an offset, and per piece's upload
READ_TIMEOUT_SECONDS = 120


@dataclass(frozen=True)
class Copied:
    """What a report hears: a part's bytes read and checked so far, and in all when known."""

    name: str
    done: int
    total: int | None
    resumed: int = 0  # bytes the store already held from an earlier run, not uploaded again


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


class _Pieces:
    """The pieces of one part: those the store already holds (same size and MD5) are kept, the
    others uploaded IN_FLIGHT at a time, each retried."""

    def __init__(self, store: Store, key: str, sleep: Callable[[float], None]) -> None:
        self.store, self.key, self.sleep = store, key, sleep
        self.earlier = store.earlier(key)
        self.numbers: list[int] = []
        self.kept = 0
        self.pool = concurrent.futures.ThreadPoolExecutor(IN_FLIGHT)
        self.pending: set[concurrent.futures.Future[None]] = set()

    def put(self, number: int, data: bytes) -> None:
        self.numbers.append(number)
        if self.earlier.get(number) == Piece(len(data), _md5(data)):
            self.kept += len(data)
            return
        if len(self.pending) >= IN_FLIGHT:
            done, self.pending = concurrent.futures.wait(
                self.pending, return_when=concurrent.futures.FIRST_COMPLETED
            )
            for future in done:
                future.result()
        self.pending.add(self.pool.submit(self._upload, number, data))

    def _upload(self, number: int, data: bytes) -> None:
        for attempt in range(1, ATTEMPTS + 1):
            try:
                self.store.put(self.key, number, data)
                return
            except Exception:  # the SDKs': connection, throttling, a 5xx
                if attempt == ATTEMPTS:
                    raise
                self.sleep(min(60, 2**attempt))

    def wait(self) -> None:
        try:
            for future in self.pending:
                future.result()
        finally:
            self.pool.shutdown()


def copy_part(
    store: Store,
    url: str,
    key: str,
    want: str | None,
    *,
    report: Report = lambda _copied: None,
    sleep: Callable[[float], None] = time.sleep,
    feed: Callable[[bytes], None] | None = None,
) -> str:
    """Copy one part unless the store has it already; its sha256. ``feed`` sees every byte of
    the part in order (the slice manifest's hashes), read again from ``url`` if the store has it."""
    if (have := store.have(key)) and want in (None, have):
        print(f"have {store.url(key)} (sha256 {have})", file=sys.stderr)
        if feed is not None:
            _read_through(url, feed, sleep)
        return have
    pieces = _Pieces(store, key, sleep)
    if pieces.earlier:
        print(f"resuming {store.url(key)}: {len(pieces.earlier)} pieces there", file=sys.stderr)
    else:
        print(f"copying {url} to {store.url(key)}", file=sys.stderr)
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
            if feed is not None:
                feed(data)
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
        store.discard(key)
        raise StageError(f"checksum mismatch for {url}: expected sha256 {want}, got {got}")
    store.finish(key, pieces.numbers, got)
    return got


def _read_through(url: str, feed: Callable[[bytes], None], sleep: Callable[[float], None]) -> None:
    print(f"reading {url} for its slice manifest", file=sys.stderr)
    source = _Source(url, sleep)
    try:
        while data := source.piece(PART_BYTES):
            feed(data)
    finally:
        source.close()


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def copy_file(
    store: Store, path: Path, key: str, *, sleep: Callable[[float], None] = time.sleep
) -> str:
    """Copy a file of this machine into the store, in pieces as ``copy_part`` does, unless the
    store has it already with the same sha256; its sha256."""
    digest = hashlib.sha256()
    with path.open("rb") as source:
        for chunk in iter(lambda: source.read(2**20), b""):
            digest.update(chunk)
    got = digest.hexdigest()
    if store.have(key) == got:
        print(f"have {store.url(key)} (sha256 {got})", file=sys.stderr)
        return got
    print(f"copying {path} to {store.url(key)}", file=sys.stderr)
    size = part_bytes(path.stat().st_size)
    pieces = _Pieces(store, key, sleep)
    try:
        with path.open("rb") as source:
            number = 1
            while True:
                data = _read_exactly(source, size)
                if not data and number > 1:  # the file ended with the last piece
                    break
                pieces.put(number, data)
                if len(data) < size:
                    break
                number += 1
    finally:
        pieces.wait()
    store.finish(key, pieces.numbers, got)
    return got
