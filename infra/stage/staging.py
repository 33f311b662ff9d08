"""What ``lrc stage`` copies where: the parts of a stack's model (or the URLs given) into a bucket
of the cloud and region that will read them, each checked by its sha256."""

from __future__ import annotations

import hashlib
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from infra.live import LiveCloud, Piece, StageError, Store, live_cloud
from infra.models.parts import saved_name
from infra.stage import slices
from infra.stage.upload import Report, copy_part

# The SDKs' errors for credentials that are missing, expired or refused (by class name, so that
# none of the SDKs is imported to tell): a setting of the user's, not a failed copy.
CREDENTIAL_ERRORS = frozenset({
    "NoCredentialsError", "PartialCredentialsError", "TokenRetrievalError", "SSOError",
    "CredentialRetrievalError", "DefaultCredentialsError", "RefreshError",
    "ClientAuthenticationError", "CredentialUnavailableError",
})  # fmt: skip


@dataclass(frozen=True)
class Staging:
    cloud: str
    region: str
    urls: tuple[str, ...]
    sums: tuple[str, ...]  # one per part, or none


def staging(
    *,
    stack: str | None,
    region: str | None,
    cloud: str | None,
    bucket: str,
    urls: Sequence[str],
    sums: Sequence[str],
) -> Staging:
    """The parts to stage, checked before anything is copied: a stack's model in its cloud and
    region (``urls`` and ``sums``, when given, in place of its own), or ``urls`` for ``region``."""
    if stack:
        from infra.stack.files import stack_config  # noqa: PLC0415 (loads the stack's rules)

        config = stack_config(stack)
        if cloud not in (None, config.cloud):
            raise StageError(f"--cloud {cloud}: stack {stack} is on {config.cloud}")
        region, cloud = config.region, config.cloud
        urls = urls or list(config.model_urls)
        sums = sums or list(config.model_sha256)
    cloud = cloud or "aws"
    if region is None:
        raise StageError("give --stack, or --region with the parts' --url")
    if not urls:
        raise StageError("no model URL: give --url (every part, in order) or --stack")
    if wrong := [url for url in urls if not url.startswith(("https://", "http://"))]:
        raise StageError(f"--url {wrong[0]}: give each part's https:// URL")
    if sums and len(sums) != len(urls):
        raise StageError(f"{len(sums)} --sha256 for {len(urls)} --url: give one per part")
    live_cloud(cloud).check_bucket(bucket)
    return Staging(cloud, region, tuple(urls), tuple(sums))


@dataclass
class Held:
    """What the store holds of the parts being staged, so that a failure says whether anything
    is kept for the next run to resume: pieces this run uploaded, and pieces an earlier run
    left."""

    uploaded: int = 0
    earlier: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def pieces(self) -> int:
        return self.uploaded + self.earlier


class _Counted:
    """A store that counts, in ``held``, the pieces it holds of what is staged."""

    def __init__(self, store: Store, held: Held) -> None:
        self.store, self.held = store, held

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def earlier(self, key: str) -> dict[int, Piece]:
        found = self.store.earlier(key)
        self.held.earlier += len(found)
        return found

    def put(self, key: str, number: int, data: bytes) -> None:
        self.store.put(key, number, data)
        with self.held.lock:
            self.held.uploaded += 1


def stage(
    store: Store,
    urls: Sequence[str],
    sums: Sequence[str],
    *,
    prefix: str,
    region: str,
    report: Report = lambda _copied: None,
    held: Held | None = None,
) -> tuple[list[str], list[str]]:
    """Each part copied under ``prefix``: the staged URLs and their sha256s. ``held`` counts
    the pieces the store holds as it goes (a failure's message says whether any are kept)."""
    if held is not None:
        store = _Counted(store, held)
    store.check_region(region)
    staged, digests = [], []
    # The slice manifest beside the first part (worker-local loading), made in the same pass.
    manifest_key = f"{prefix}{saved_name(urls[0])}{slices.MANIFEST_SUFFIX}"
    hashers = [] if store.have(manifest_key) else [slices.SliceHasher(saved_name(u)) for u in urls]
    for index, url in enumerate(urls):
        key = f"{prefix}{saved_name(url)}"
        want = sums[index] if sums else None
        feed = hashers[index].feed if hashers else None
        digests.append(copy_part(store, url, key, want, report=report, feed=feed))
        staged.append(store.url(key))
    if problem := next((h.problem for h in hashers if h.problem), ""):
        print(f"no slice manifest (worker-local loading): {problem}", file=sys.stderr)
    elif hashers:
        parts = [h.part(h.offset, digest) for h, digest in zip(hashers, digests, strict=True)]
        text = slices.manifest_text(slices.manifest(parts)).encode()
        store.earlier(manifest_key)  # opens the upload (one piece: a manifest is a few MB)
        store.put(manifest_key, 1, text)
        store.finish(manifest_key, [1], hashlib.sha256(text).hexdigest())
        print(f"slice manifest: {store.url(manifest_key)}", file=sys.stderr)
    return staged, digests


def credentials_problem(error: Exception) -> bool:
    """Whether the store's SDK refused for want of credentials (missing, expired, refused)."""
    return any(kind.__name__ in CREDENTIAL_ERRORS for kind in type(error).__mro__)


def sdk_problem(
    cloud: LiveCloud, bucket: str, error: Exception, held: Held | None = None
) -> str | None:
    """The store's SDK's error (credentials, access, a missing bucket) on one line, with what to
    check, and whether the pieces it holds are kept (only when there are some); None for an
    error that is not its SDK's."""
    if not type(error).__module__.startswith(cloud.sdk_packages):
        return None
    said = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    said = said if len(said) <= 300 else said[:299].rsplit(" ", 1)[0] + " …"
    if held is not None and held.pieces:
        after = (
            f"the {held.pieces} pieces it holds are kept, and the same command resumes from them"
        )
    else:
        after = "nothing was uploaded"
    return (
        f"{cloud.store_name} said: {said or type(error).__name__}; check "
        f"{cloud.store_credentials} and that --bucket {bucket} exists and is yours; {after}"
    )
