"""The object stores a cloud's nodes read a staged model from, by URL: ``s3://BUCKET/KEY``,
``gs://BUCKET/KEY`` and ``az://ACCOUNT/CONTAINER/KEY``, each with its store's naming rules, and
the keys and prefixes a node's read-only grant names."""

from __future__ import annotations

import re

from infra.clouds import FACTS

# The object stores a cloud's nodes read a staged model from (s3://, gs://, az://).
STORE_SCHEMES = tuple(f.model_store_scheme for f in FACTS.values() if f.model_store_scheme)

# s3://bucket/key: a bucket name as S3 allows it, and a key that ends in a file name.
_S3_URL = re.compile(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(\S*[^/\s])")
# gs://bucket/key: a bucket name as Cloud Storage allows it without a verified domain (3-63
# lowercase letters, digits, '-', '_' and '.', a letter or digit at each end):
# https://cloud.google.com/storage/docs/buckets#naming
_GCS_URL = re.compile(r"gs://([a-z0-9][a-z0-9._-]{1,61}[a-z0-9])/(\S*[^/\s])")
# az://account/container/key: a blob by the three names rclone (the account) and a role
# assignment (account and container) need. Not the blob's https URL: that is also how a public
# or SAS-signed blob is downloaded, with curl and on any cloud, so only a scheme of its own says
# "read it with the node's identity". Names as Azure allows them: an account of 3-24 lowercase
# letters and digits; a container of 3-63 lowercase letters, digits and single hyphens, a letter
# or digit at each end (https://learn.microsoft.com/rest/api/storageservices/naming-and-referencing-containers--blobs--and-metadata).
_BLOB_URL = re.compile(r"az://([^/\s]*)/([^/\s]*)/(\S*[^/\s])")
_BLOB_ACCOUNT = re.compile(r"[a-z0-9]{3,24}")
_BLOB_CONTAINER = re.compile(r"(?=.{3,63}$)[a-z0-9]+(-[a-z0-9]+)*")


def s3_object(url: str) -> tuple[str, str] | None:
    """(bucket, key) of an ``s3://`` model URL, or None for any other URL."""
    match = _S3_URL.fullmatch(url)
    return (match.group(1), match.group(2)) if match else None


def gcs_object(url: str) -> tuple[str, str] | None:
    """(bucket, key) of a ``gs://`` model URL, or None for any other URL."""
    match = _GCS_URL.fullmatch(url)
    return (match.group(1), match.group(2)) if match else None


def blob_object(url: str) -> tuple[str, str, str] | None:
    """(account, container, key) of an ``az://`` model URL, or None for any other URL."""
    match = _BLOB_URL.fullmatch(url)
    if not match or not _BLOB_ACCOUNT.fullmatch(match.group(1)):
        return None
    if not _BLOB_CONTAINER.fullmatch(match.group(2)):
        return None
    return match.group(1), match.group(2), match.group(3)


def listed_prefixes(keys: list[str] | tuple[str, ...]) -> list[str]:
    """The prefixes the nodes' rclone lists in a bucket to read these objects: each object's
    "directory" (its key up to the last '/', with it; "" at the top), which it lists before it
    reads a file, and the key itself as a directory (KEY/), which it lists when the object is
    missing. Measured on rclone 1.60 (the nodes' Ubuntu package) against an S3 API
    (tests/boot/test_staged_download.py); a store's read-only grant allows listing these only."""
    found = {key.rpartition("/")[0] + "/" if "/" in key else "" for key in keys}
    return sorted(found | {f"{key}/" for key in keys})


def store_url_problem(url: str) -> str | None:
    """Why an object-store URL names no object its store could hold, or one whose key would
    widen the node's read grant; None when it is fine."""
    found = s3_object(url) or gcs_object(url)
    blob = blob_object(url)
    if found or blob:
        return store_key_problem(url, found[1] if found else blob[2] if blob else "")
    if url.startswith("s3://"):
        return (
            f"{url!r} is not s3://BUCKET/KEY with a bucket name S3 allows and a key that "
            "ends in the file name"
        )
    if url.startswith("gs://"):
        return (
            f"{url!r} is not gs://BUCKET/KEY with a bucket name Cloud Storage allows (3-63 "
            "lowercase letters, digits, '-', '_' or '.', a letter or digit at each end) and a "
            "key that ends in the file name"
        )
    return _blob_url_problem(url)


def _blob_url_problem(url: str) -> str:
    match = _BLOB_URL.fullmatch(url)
    if match and not _BLOB_ACCOUNT.fullmatch(match.group(1)):
        return (
            f"{url!r}: storage account {match.group(1)!r} is not 3-24 lowercase letters "
            "and digits; give az://ACCOUNT/CONTAINER/KEY with the account's name, not its "
            "host"
        )
    if match:
        return (
            f"{url!r}: container {match.group(2)!r} is not 3-63 lowercase letters, digits "
            "and single hyphens with a letter or digit at each end"
        )
    return f"{url!r} is not az://ACCOUNT/CONTAINER/KEY with a key that ends in the file name"


# Object keys as IAM, IAM conditions and rclone take them literally: AWS's "safe characters"
# without '*' and the quote (no IAM wildcard or variable can widen a grant), no '.' or '..'
# segment and no empty one.
_STORE_KEY = re.compile(r"[A-Za-z0-9!\-_.()]+(?:/[A-Za-z0-9!\-_.()]+)*")


def store_key_problem(url: str, key: str) -> str | None:
    """Why an object key would widen or bend the node's read grant, or None."""
    segments = key.split("/")
    if not _STORE_KEY.fullmatch(key) or any(s in (".", "..") for s in segments):
        return (
            f"{url!r}: the object key may hold only letters, digits and ! - _ . ( ) between "
            "single slashes, with no '.' or '..' segment: a '*', '?' or '$' would widen the "
            "node's read grant beyond the model"
        )
    return None
