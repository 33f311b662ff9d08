"""The object stores a part is staged into, each keeping pieces its own way until the part is
whole, and each knowing which pieces an earlier run left (by size and MD5):

- S3: a multipart upload of ``KEY.staging``, then a copy to ``KEY`` with the sha256 as
  metadata (a multipart upload takes no metadata at the end); a piece's ETag is its MD5.
- Cloud Storage: each piece an object ``KEY.staging/NNNNNN`` (its MD5 checked by the server),
  composed 32 at a time into ``KEY``, which gets the sha256.
- Blob Storage: uncommitted blocks of ``KEY`` whose ids say the piece number and MD5 (checked
  by the server), committed in order with the sha256: the blob appears only when whole.

The SDKs are imported by the command that makes a store, not here.
"""

from __future__ import annotations

import base64
import hashlib
import threading
from typing import Any

from infra.stage.upload import SHA256_METADATA, Piece, StageError

STAGING = ".staging"
COMPOSE_LIMIT = 32  # Cloud Storage composes at most 32 objects in one request


class S3Store:
    def __init__(self, s3: Any, bucket: str) -> None:
        self.s3, self.bucket = s3, bucket
        self.uploads: dict[str, str] = {}
        self.etags: dict[tuple[str, int], str] = {}
        self.lock = threading.Lock()

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def check_region(self, region: str) -> None:
        answer = self.s3.get_bucket_location(Bucket=self.bucket)
        location = answer.get("LocationConstraint") or "us-east-1"
        if location != region:
            raise StageError(
                f"bucket {self.bucket} is in {location}, the stack in {region}: the nodes reach "
                f"only their own region's buckets over the gateway endpoint; use a bucket in "
                f"{region}"
            )

    def have(self, key: str) -> str | None:
        try:
            head = self.s3.head_object(Bucket=self.bucket, Key=key)
        except self.s3.exceptions.ClientError as error:
            if error.response["Error"]["Code"] not in {"404", "NoSuchKey", "NotFound"}:
                raise StageError(f"{self.url(key)}: {error}") from None
            return None
        found = head.get("Metadata", {}).get(SHA256_METADATA)
        return str(found) if found else None

    def earlier(self, key: str) -> dict[int, Piece]:
        """The pieces of the newest unfinished upload of KEY.staging; a new upload if none."""
        staging = key + STAGING
        listed = self.s3.list_multipart_uploads(Bucket=self.bucket, Prefix=staging)
        mine = sorted(
            (u for u in listed.get("Uploads", []) if u["Key"] == staging),
            key=lambda u: u["Initiated"],
        )
        if not mine:
            self.uploads[key] = self.s3.create_multipart_upload(Bucket=self.bucket, Key=staging)[
                "UploadId"
            ]
            return {}
        self.uploads[key] = upload_id = mine[-1]["UploadId"]
        found: dict[int, Piece] = {}
        pages = self.s3.get_paginator("list_parts").paginate(
            Bucket=self.bucket, Key=staging, UploadId=upload_id
        )
        for page in pages:
            for part in page.get("Parts", []):
                self.etags[key, part["PartNumber"]] = part["ETag"]
                found[part["PartNumber"]] = Piece(part["Size"], part["ETag"].strip('"'))
        return found

    def put(self, key: str, number: int, data: bytes) -> None:
        answer = self.s3.upload_part(
            Bucket=self.bucket, Key=key + STAGING, UploadId=self.uploads[key],
            PartNumber=number, Body=data,
        )  # fmt: skip
        with self.lock:
            self.etags[key, number] = answer["ETag"]

    def finish(self, key: str, numbers: list[int], sha256: str) -> None:
        staging = key + STAGING
        parts = [{"PartNumber": n, "ETag": self.etags[key, n]} for n in numbers]
        self.s3.complete_multipart_upload(
            Bucket=self.bucket, Key=staging, UploadId=self.uploads[key],
            MultipartUpload={"Parts": parts},
        )  # fmt: skip
        self.s3.copy(
            {"Bucket": self.bucket, "Key": staging}, self.bucket, key,
            ExtraArgs={"Metadata": {SHA256_METADATA: sha256}, "MetadataDirective": "REPLACE"},
        )  # fmt: skip
        self.s3.delete_object(Bucket=self.bucket, Key=staging)

    def discard(self, key: str) -> None:
        self.s3.abort_multipart_upload(
            Bucket=self.bucket, Key=key + STAGING, UploadId=self.uploads[key]
        )


class GcsStore:
    def __init__(self, bucket: Any) -> None:
        self.bucket = bucket  # a google.cloud.storage Bucket

    def url(self, key: str) -> str:
        return f"gs://{self.bucket.name}/{key}"

    def check_region(self, region: str) -> None:
        self.bucket.reload()
        if str(self.bucket.location).lower() != region.lower():
            raise StageError(
                f"bucket {self.bucket.name} is in {self.bucket.location}, the stack in "
                f"{region}: use a bucket in {region}, as docs/gcp.md says"
            )

    def have(self, key: str) -> str | None:
        blob = self.bucket.get_blob(key)
        found = (blob.metadata or {}).get(SHA256_METADATA) if blob is not None else None
        return str(found) if found else None

    def _piece_name(self, key: str, number: int) -> str:
        return f"{key}{STAGING}/{number:06d}"

    def earlier(self, key: str) -> dict[int, Piece]:
        found: dict[int, Piece] = {}
        for blob in self.bucket.list_blobs(prefix=f"{key}{STAGING}/"):
            number = blob.name.rsplit("/", 1)[-1]
            if number.isdigit() and blob.md5_hash:
                found[int(number)] = Piece(blob.size, base64.b64decode(blob.md5_hash).hex())
        return found

    def put(self, key: str, number: int, data: bytes) -> None:
        blob = self.bucket.blob(self._piece_name(key, number))
        blob.md5_hash = base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()
        blob.upload_from_string(data, content_type="application/octet-stream")

    def finish(self, key: str, numbers: list[int], sha256: str) -> None:
        sources = [self.bucket.blob(self._piece_name(key, n)) for n in numbers]
        made, round_ = [], 0
        while len(sources) > COMPOSE_LIMIT:  # compose in rounds, 32 into one
            round_ += 1
            joined = []
            for index in range(0, len(sources), COMPOSE_LIMIT):
                into = self.bucket.blob(f"{key}{STAGING}/round{round_}-{index:06d}")
                into.compose(sources[index : index + COMPOSE_LIMIT])
                joined.append(into)
            made += joined
            sources = joined
        final = self.bucket.blob(key)
        final.metadata = {SHA256_METADATA: sha256}
        final.compose(sources)
        self.discard(key)

    def discard(self, key: str) -> None:
        for blob in self.bucket.list_blobs(prefix=f"{key}{STAGING}/"):
            blob.delete()


class BlobStore:
    def __init__(self, container: Any, account: str) -> None:
        self.container, self.account = container, account  # an azure ContainerClient
        self.ids: dict[tuple[str, int], str] = {}
        self.lock = threading.Lock()

    def url(self, key: str) -> str:
        return f"az://{self.account}/{self.container.container_name}/{key}"

    def check_region(self, region: str) -> None:
        """The account's region is the management plane's to say, which staging does not
        reach; the stack's service endpoint admits the account's own region."""

    def have(self, key: str) -> str | None:
        properties = self._properties(key)
        found = (properties.metadata or {}).get(SHA256_METADATA) if properties else None
        return str(found) if found else None

    def _properties(self, key: str) -> Any:
        from azure.core.exceptions import ResourceNotFoundError  # noqa: PLC0415

        try:
            return self.container.get_blob_client(key).get_blob_properties()
        except ResourceNotFoundError:
            return None

    def earlier(self, key: str) -> dict[int, Piece]:
        from azure.core.exceptions import ResourceNotFoundError  # noqa: PLC0415

        try:
            _committed, uncommitted = self.container.get_blob_client(key).get_block_list(
                "uncommitted"
            )
        except ResourceNotFoundError:
            return {}
        found: dict[int, Piece] = {}
        for block in uncommitted:
            number, _, md5 = base64.b64decode(block.id).decode(errors="replace").partition("-")
            if number.isdigit() and len(md5) == 32:
                found[int(number)] = Piece(block.size, md5)
                self.ids[key, int(number)] = block.id
        return found

    def put(self, key: str, number: int, data: bytes) -> None:
        md5 = hashlib.md5(data, usedforsecurity=False).hexdigest()
        # One length for every id of a blob, as Blob Storage requires: 6 digits, '-', 32 hex.
        block_id = base64.b64encode(f"{number:06d}-{md5}".encode()).decode()
        self.container.get_blob_client(key).stage_block(block_id, data, validate_content=True)
        with self.lock:
            self.ids[key, number] = block_id

    def finish(self, key: str, numbers: list[int], sha256: str) -> None:
        blob = self.container.get_blob_client(key)
        blob.commit_block_list(
            [self.ids[key, n] for n in numbers], metadata={SHA256_METADATA: sha256}
        )

    def discard(self, key: str) -> None:
        """Uncommitted blocks go when their blob's block list is committed: a blob already
        there keeps its own blocks and metadata; one that was not goes again."""
        blob = self.container.get_blob_client(key)
        properties = self._properties(key)
        if properties is None:
            blob.commit_block_list([])
            blob.delete_blob()
            return
        committed, _uncommitted = blob.get_block_list("committed")
        blob.commit_block_list([b.id for b in committed], metadata=properties.metadata)


def open_store(cloud: str, bucket: str, *, region: str, endpoint: str | None) -> Any:
    """The store a stack on ``cloud`` reads from, with the caller's own credentials: AWS's
    (``AWS_PROFILE``, ...), Application Default Credentials (``gcloud auth application-default
    login``), or Azure's (``az login``; ``AZURE_STORAGE_CONNECTION_STRING`` when set).
    ``endpoint``: another S3 API, a Cloud Storage emulator, or a Blob endpoint URL."""
    if cloud == "aws":
        import boto3  # noqa: PLC0415

        return S3Store(boto3.client("s3", region_name=region, endpoint_url=endpoint), bucket)
    if cloud == "gcp":
        from google.cloud import storage  # noqa: PLC0415

        if endpoint:  # an emulator takes no credentials
            from google.auth.credentials import AnonymousCredentials  # noqa: PLC0415

            client = storage.Client(
                project="local", credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
                client_options={"api_endpoint": endpoint},
            )  # fmt: skip
        else:
            client = storage.Client()
        return GcsStore(client.bucket(bucket))
    account, _, container = bucket.partition("/")
    if not account or not container or "/" in container:
        raise StageError(f"--bucket {bucket}: give ACCOUNT/CONTAINER for Blob Storage")
    return BlobStore(_blob_service(account, endpoint).get_container_client(container), account)


def _blob_service(account: str, endpoint: str | None) -> Any:
    import os  # noqa: PLC0415

    from azure.storage.blob import BlobServiceClient  # noqa: PLC0415

    if connection := os.environ.get("AZURE_STORAGE_CONNECTION_STRING"):
        return BlobServiceClient.from_connection_string(connection)
    from azure.identity import DefaultAzureCredential  # noqa: PLC0415

    url = endpoint or f"https://{account}.blob.core.windows.net"
    return BlobServiceClient(account_url=url, credential=DefaultAzureCredential())
