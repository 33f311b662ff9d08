"""What ``lrc stage`` copies where: the parts of a stack's model (or the URLs given) into a bucket
of the cloud and region that will read them, each checked by its sha256."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from infra.live import LiveCloud, StageError, Store, live_cloud
from infra.models.parts import saved_name
from infra.stage.upload import Report, copy_part


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


def stage(
    store: Store,
    urls: Sequence[str],
    sums: Sequence[str],
    *,
    prefix: str,
    region: str,
    report: Report = lambda _copied: None,
) -> tuple[list[str], list[str]]:
    """Each part copied under ``prefix``: the staged URLs and their sha256s."""
    store.check_region(region)
    staged, digests = [], []
    for index, url in enumerate(urls):
        key = f"{prefix}{saved_name(url)}"
        want = sums[index] if sums else None
        digests.append(copy_part(store, url, key, want, report=report))
        staged.append(store.url(key))
    return staged, digests


def sdk_problem(cloud: LiveCloud, bucket: str, error: Exception) -> str | None:
    """The store's SDK's error (credentials, access, a missing bucket), with what to check;
    None for an error that is not its SDK's."""
    if not type(error).__module__.startswith(cloud.sdk_packages):
        return None
    return (
        f"{cloud.store_name} said: {error}; check {cloud.store_credentials} and that --bucket "
        f"{bucket} exists and is yours; the pieces already uploaded are kept, and the same "
        "command resumes"
    )
