"""lrc stage: copy a model's parts once into the cloud's object store, checked, for a stack to read.

    lrc stage --stack aws-c8g --bucket my-models [--prefix llama-405b/]
    lrc stage --stack gcp-c4a --bucket my-models          (Cloud Storage)
    lrc stage --stack azure-cobalt --bucket mymodels/models   (Blob Storage: ACCOUNT/CONTAINER)
    lrc stage --region us-east-1 --bucket my-models --url https://…/model.gguf

Each part streams from its URL into the bucket (in pieces, a few at once), its sha256
computed on the way and kept as the object's metadata; a part already there with the same
sha256 is not copied again, and one a stopped run left half-uploaded is resumed. Reads and
uploads are retried; progress goes to stderr. Prints the `model.urls` and `model.sha256` to put
in the stack.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Sequence

from infra.cli.naming import prog
from infra.cli.options import add_json, print_json
from infra.models.parts import saved_name
from infra.observe.status import Progress, gigabytes
from infra.stage.stores import open_store
from infra.stage.upload import Copied, Report, StageError, Store, copy_part

# Each cloud's store, as its errors name it.
OWN_STORE = {"aws": "S3", "gcp": "Cloud Storage", "azure": "Blob Storage"}


class Shown:
    """Each part's progress on stderr: one line redrawn on a terminal, else a line every
    ``every`` seconds and at the end of each part."""

    def __init__(self, *, every: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self.every, self.clock = every, clock
        self.redraw = sys.stderr.isatty()
        self.started: dict[str, float] = {}
        self.last = float("-inf")

    def __call__(self, copied: Copied) -> None:
        now = self.clock()
        started = self.started.setdefault(copied.name, now)
        finished = copied.total is not None and copied.done >= copied.total
        if not (self.redraw or finished or now - self.last >= self.every):
            return
        self.last = now
        line = f"{copied.name}: {Progress(copied.done, copied.total).describe()}"
        if now - started >= 1:
            line += f", {(copied.done - copied.resumed) / (now - started) / 1e6:,.0f} MB/s"
        if copied.resumed:
            line += f" ({gigabytes(copied.resumed)} already in S3)"
        if self.redraw:
            print(f"\r\x1b[K{line}", end="\n" if finished else "", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)


# What each cloud's SDK calls a credentials or access problem, and what to check.
CREDENTIALS = {
    "aws": "your AWS credentials (AWS_PROFILE)",
    "gcp": "your Application Default Credentials (gcloud auth application-default login)",
    "azure": "your Azure login (az login) and a Storage Blob Data Contributor role on it",
}


def stage(
    store: Store,
    urls: Sequence[str],
    sums: Sequence[str],
    *,
    prefix: str,
    region: str,
    report: Report = lambda _copied: None,
) -> tuple[list[str], list[str]]:
    store.check_region(region)
    staged, digests = [], []
    for index, url in enumerate(urls):
        key = f"{prefix}{saved_name(url)}"
        want = sums[index] if sums else None
        digests.append(copy_part(store, url, key, want, report=report))
        staged.append(store.url(key))
    return staged, digests


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog("infra.stage"), description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--stack", help="stage this stack's model, in its cloud and region")
    which.add_argument("--region", help="the region of the stack that will read it")
    parser.add_argument(
        "--cloud", "--provider", dest="cloud", choices=sorted(OWN_STORE),
        help="with --region: the stack's cloud (default aws)",
    )  # fmt: skip
    parser.add_argument(
        "--bucket", required=True,
        help="an existing bucket in that region (Blob Storage: ACCOUNT/CONTAINER)",
    )  # fmt: skip
    parser.add_argument("--prefix", default="", help="a key prefix, e.g. llama-405b/")
    parser.add_argument("--url", action="append", default=[], help="a part's URL (repeat)")
    parser.add_argument("--sha256", action="append", default=[], help="a part's sha256 (repeat)")
    parser.add_argument(
        "--endpoint", help="another S3 API, a Cloud Storage emulator, or a Blob endpoint URL"
    )
    add_json(parser)
    args = parser.parse_args(argv)
    urls, sums, region, cloud = list(args.url), list(args.sha256), args.region, args.cloud
    from infra.stack.config import ConfigError  # noqa: PLC0415
    from infra.stack.files import StackFileError, stack_config  # noqa: PLC0415

    try:  # what was asked: a mistake here is a usage error (2)
        if args.stack:
            config = stack_config(args.stack)
            if cloud not in (None, config.cloud):
                raise StageError(f"--cloud {cloud}: stack {args.stack} is on {config.cloud}")
            region, cloud = config.region, config.cloud
            urls = urls or list(config.model_urls)
            sums = sums or list(config.model_sha256)
        cloud = cloud or "aws"
        if not urls:
            raise StageError("no model URL: give --url (every part, in order) or --stack")
        if wrong := [url for url in urls if not url.startswith(("https://", "http://"))]:
            raise StageError(f"--url {wrong[0]}: give each part's https:// URL")
        if sums and len(sums) != len(urls):
            raise StageError(f"{len(sums)} --sha256 for {len(urls)} --url: give one per part")
        if cloud == "azure" and not re.fullmatch(r"[^/\s]+/[^/\s]+", args.bucket):
            raise StageError(f"--bucket {args.bucket}: give ACCOUNT/CONTAINER for Blob Storage")
    except (StageError, StackFileError, ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:  # the copy itself: a part that fails its checksum, a bucket elsewhere (1)
        store = open_store(cloud, args.bucket, region=region, endpoint=args.endpoint)
        staged, digests = stage(
            store, urls, sums, prefix=args.prefix, region=region, report=Shown()
        )
    except StageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except Exception as error:  # the SDKs': credentials, access, a missing bucket
        if not type(error).__module__.startswith(("botocore", "boto3", "google", "azure")):
            raise
        print(
            f"error: {OWN_STORE[cloud]} said: {error}; check {CREDENTIALS[cloud]} and that "
            f"--bucket {args.bucket} exists and is yours; the pieces already uploaded are kept, "
            "and the same command resumes",
            file=sys.stderr,
        )
        return 1
    print("# in the stack's llama-rpc-cluster:model:")
    if args.json:
        print_json({"urls": staged, "sha256": digests})
        return 0
    print(f"urls: {json.dumps(staged)}")
    print(f"sha256: {json.dumps(digests)}")
    return 0
