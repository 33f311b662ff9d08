"""python -m infra.stage: copy a model's parts into S3 once, checked, for a stack to read.

    python -m infra.stage --stack aws-c8g --bucket my-models [--prefix llama-405b/]
    python -m infra.stage --region us-east-1 --bucket my-models --url https://…/model.gguf

Each part streams from its URL into the bucket (multipart, several parts at once), its sha256
computed on the way and kept as the object's metadata; a part already there with the same
sha256 is not copied again. Prints the `model.urls` and `model.sha256` to put in the stack.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import urllib.request
from collections.abc import Sequence
from typing import IO, Any

from infra.cli.naming import prog
from infra.cli.options import add_json, print_json
from infra.models.parts import saved_name

SHA256_METADATA = "sha256"


class StageError(RuntimeError):
    """The model could not be staged; the message says why and what to do."""


class _Hashing:
    """A readable stream that hashes what passes through it."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream, self.digest, self.size = stream, hashlib.sha256(), 0

    def read(self, size: int = -1) -> bytes:
        chunk = self.stream.read(size)
        self.digest.update(chunk)
        self.size += len(chunk)
        return chunk


def stage_part(s3: Any, url: str, bucket: str, key: str, want: str | None) -> str:
    """Copy one part unless it is there already; its sha256."""
    try:
        head = s3.head_object(Bucket=bucket, Key=key)
        have = head.get("Metadata", {}).get(SHA256_METADATA)
        if have and (want is None or have == want):
            print(f"have s3://{bucket}/{key} (sha256 {have})", file=sys.stderr)
            return str(have)
    except s3.exceptions.ClientError as error:
        if error.response["Error"]["Code"] not in {"404", "NoSuchKey", "NotFound"}:
            raise StageError(f"s3://{bucket}/{key}: {error}") from None
    print(f"copying {url} to s3://{bucket}/{key}", file=sys.stderr)
    try:
        with urllib.request.urlopen(url, timeout=600) as response:  # noqa: S310 (https URLs)
            stream = _Hashing(response)
            s3.upload_fileobj(stream, bucket, f"{key}.staging")
    except OSError as error:
        raise StageError(f"could not read {url}: {error}") from None
    got = stream.digest.hexdigest()
    if want is not None and got != want:
        s3.delete_object(Bucket=bucket, Key=f"{key}.staging")
        raise StageError(f"checksum mismatch for {url}: expected sha256 {want}, got {got}")
    # The part takes its name only once whole and checked, with its sha256 beside it.
    s3.copy(
        {"Bucket": bucket, "Key": f"{key}.staging"}, bucket, key,
        ExtraArgs={"Metadata": {SHA256_METADATA: got}, "MetadataDirective": "REPLACE"},
    )  # fmt: skip
    s3.delete_object(Bucket=bucket, Key=f"{key}.staging")
    return got


def stage(
    s3: Any, urls: Sequence[str], sums: Sequence[str], *, bucket: str, prefix: str, region: str
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
        digests.append(stage_part(s3, url, bucket, key, sums[index] if sums else None))
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
                raise StageError(f"stack {args.stack} is on {config.cloud}: staging is for aws")
            region = config.region
            urls = urls or list(config.model_urls)
            sums = sums or list(config.model_sha256)
        if not urls:
            raise StageError("no model URL: give --url (every part, in order) or --stack")
        if sums and len(sums) != len(urls):
            raise StageError(f"{len(sums)} --sha256 for {len(urls)} --url: give one per part")
    except (StageError, StackFileError, ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:  # the copy itself: a part that fails its checksum, a bucket elsewhere (1)
        import boto3  # noqa: PLC0415

        s3 = boto3.client("s3", region_name=region, endpoint_url=args.endpoint)
        staged, digests = stage(
            s3, urls, sums, bucket=args.bucket, prefix=args.prefix, region=region
        )
    except StageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except (BotoCoreError, ClientError) as error:
        print(
            f"error: S3 said: {error}; check your AWS credentials (AWS_PROFILE) and that "
            f"--bucket {args.bucket} exists and is yours",
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
