"""python -m infra.stage: copy a model's parts into S3 once, checked, for a stack to read.

    python -m infra.stage --stack aws-c8g --bucket my-models [--prefix llama-405b/]
    python -m infra.stage --region us-east-1 --bucket my-models --url https://…/model.gguf

Each part streams from its URL into the bucket (multipart, a few pieces at once), its sha256
computed on the way and kept as the object's metadata; a part already there with the same
sha256 is not copied again, and one a stopped run left half-uploaded is resumed. Reads and
uploads are retried; progress goes to stderr. Prints the `model.urls` and `model.sha256` to put
in the stack.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from infra.cli.naming import prog
from infra.cli.options import add_json, print_json
from infra.models.parts import saved_name
from infra.observe.status import Progress, gigabytes
from infra.stage.upload import Copied, Report, StageError, copy_part

# How the other clouds' own tools copy into their stores.
OWN_COPY = {"gcp": "`gcloud storage cp`", "azure": "`az storage blob upload-batch`"}


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


def stage(
    s3: Any,
    urls: Sequence[str],
    sums: Sequence[str],
    *,
    bucket: str,
    prefix: str,
    region: str,
    report: Report = lambda _copied: None,
) -> tuple[list[str], list[str]]:
    location = s3.get_bucket_location(Bucket=bucket).get("LocationConstraint") or "us-east-1"
    if location != region:
        raise StageError(
            f"bucket {bucket} is in {location}, the stack in {region}: the nodes reach only "
            "their own region's buckets over the gateway endpoint; use a bucket in "
            f"{region}"
        )
    staged, digests = [], []
    for index, url in enumerate(urls):
        key = f"{prefix}{saved_name(url)}"
        want = sums[index] if sums else None
        digests.append(copy_part(s3, url, bucket, key, want, report=report))
        staged.append(f"s3://{bucket}/{key}")
    return staged, digests


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog("infra.stage"), description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--stack", help="stage this stack's model, in its region")
    which.add_argument("--region", help="the region of the stack that will read it")
    parser.add_argument("--bucket", required=True, help="an existing bucket in that region")
    parser.add_argument("--prefix", default="", help="a key prefix, e.g. llama-405b/")
    parser.add_argument("--url", action="append", default=[], help="a part's URL (repeat)")
    parser.add_argument("--sha256", action="append", default=[], help="a part's sha256 (repeat)")
    parser.add_argument("--endpoint", help="another S3 API (default: AWS's)")
    add_json(parser)
    args = parser.parse_args(argv)
    urls, sums, region = list(args.url), list(args.sha256), args.region
    from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415

    from infra.stack.config import ConfigError  # noqa: PLC0415
    from infra.stack.files import StackFileError, stack_config  # noqa: PLC0415

    try:  # what was asked: a mistake here is a usage error (2)
        if args.stack:
            config = stack_config(args.stack)
            if config.cloud != "aws":
                raise StageError(
                    f"stack {args.stack} is on {config.cloud}: lrc stage copies into S3; copy "
                    f"the parts with {OWN_COPY[config.cloud]} (it resumes and retries), as "
                    f"docs/{config.cloud}.md shows"
                )
            region = config.region
            urls = urls or list(config.model_urls)
            sums = sums or list(config.model_sha256)
        if not urls:
            raise StageError("no model URL: give --url (every part, in order) or --stack")
        if wrong := [url for url in urls if not url.startswith(("https://", "http://"))]:
            raise StageError(f"--url {wrong[0]}: give each part's https:// URL")
        if sums and len(sums) != len(urls):
            raise StageError(f"{len(sums)} --sha256 for {len(urls)} --url: give one per part")
    except (StageError, StackFileError, ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:  # the copy itself: a part that fails its checksum, a bucket elsewhere (1)
        import boto3  # noqa: PLC0415

        s3 = boto3.client("s3", region_name=region, endpoint_url=args.endpoint)
        staged, digests = stage(
            s3, urls, sums, bucket=args.bucket, prefix=args.prefix, region=region, report=Shown()
        )
    except StageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except (BotoCoreError, ClientError) as error:
        print(
            f"error: S3 said: {error}; check your AWS credentials (AWS_PROFILE) and that "
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
