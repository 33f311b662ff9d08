"""The network rules a setting must pass before anything is created: who may reach the API,
which ranges the cluster may use, and where a model may be downloaded from.

Each function returns what is wrong (a sentence naming the fix) or None; ``infra.stack.config``
names the setting.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from urllib.parse import urlsplit

from infra.clouds import FACTS

# Ranges a cluster network may use: RFC 1918 private space. (0.0.0.0/8, 240.0.0.0/4 and the
# like count as "private" to Python's ipaddress, but no cloud routes them in a VPC.)
PRIVATE_RANGES = tuple(
    ipaddress.IPv4Network(text) for text in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")
)
# Sources that are not the internet: private space and carrier-grade NAT (VPNs, peered networks).
INTERNAL_SOURCES = (*PRIVATE_RANGES, ipaddress.IPv4Network("100.64.0.0/10"))
# The widest public range the API may be opened to: a site's own block. Anything wider (for
# example 0.0.0.0/1 + 128.0.0.0/1) opens an unauthenticated API to much of the internet.
WIDEST_PUBLIC_API_PREFIX = 24
MAX_API_CIDRS = 50  # AWS security groups hold 60 inbound rules; the program uses a few
# Hosts a node must never download from: its own loopback, and every cloud's metadata and agent
# endpoints (a model URL must not point at another cloud's either: a stack may move clouds).
METADATA_HOSTS = frozenset({"localhost"}).union(*(f.metadata_hosts for f in FACTS.values()))
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(text) for f in FACTS.values() for text in f.metadata_addresses
)
# The object stores a cloud's nodes read a staged model from (s3://, gs://, az://).
STORE_SCHEMES = tuple(f.model_store_scheme for f in FACTS.values() if f.model_store_scheme)


def is_rfc1918(network: ipaddress.IPv4Network) -> bool:
    return any(network.subnet_of(space) for space in PRIVATE_RANGES)


def vpc_cidr_problem(network: ipaddress.IPv4Network, widest_prefix: int) -> str | None:
    if not is_rfc1918(network):
        return (
            f"{network} is not private address space a cloud network takes; use a range inside "
            "10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16"
        )
    if network.prefixlen < widest_prefix:
        return (
            f"{network} is wider than this cloud takes (/{widest_prefix} at most); "
            f"use a /{widest_prefix} or smaller"
        )
    return None


def api_cidr_problem(text: str) -> str | None:
    """Why this source range may not reach the API, or None."""
    try:
        network = ipaddress.ip_network(text, strict=False)
    except ValueError:
        return f"{text!r} is not a valid CIDR"
    if network.version == 6:
        return (
            f"{text} is IPv6, and the cluster's network is IPv4 only: the rule would never "
            "match; give the IPv4 range your requests come from"
        )
    if any(network.subnet_of(space) for space in INTERNAL_SOURCES):
        return None
    if network.prefixlen < WIDEST_PUBLIC_API_PREFIX:
        return (
            f"{text} opens the API to {network.num_addresses:,} internet addresses, and "
            "llama-server has no authentication; give your own network's range "
            f"(/{WIDEST_PUBLIC_API_PREFIX} or narrower) or use the tunnel (connectCommand)"
        )
    return None


def _host_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a URL host names literally, in any of the forms a resolver accepts
    (dotted, decimal 2852039166, hex 0xa9fea9fe, IPv6), or None for a name."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


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
    (tests/test_staged_download.py); a store's read-only grant allows listing these only."""
    found = {key.rpartition("/")[0] + "/" if "/" in key else "" for key in keys}
    return sorted(found | {f"{key}/" for key in keys})


def _store_url_problem(url: str) -> str | None:
    """Why an object-store URL names no object its store could hold, or None."""
    if url.startswith("s3://") and s3_object(url) is None:
        return (
            f"{url!r} is not s3://BUCKET/KEY with a bucket name S3 allows and a key that "
            "ends in the file name"
        )
    if url.startswith("gs://") and gcs_object(url) is None:
        return (
            f"{url!r} is not gs://BUCKET/KEY with a bucket name Cloud Storage allows (3-63 "
            "lowercase letters, digits, '-', '_' or '.', a letter or digit at each end) and a "
            "key that ends in the file name"
        )
    if url.startswith("az://") and blob_object(url) is None:
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
    return None


def model_url_problem(url: str) -> str | None:
    """Why a node must not download its model from this URL, or None."""
    if url.startswith(STORE_SCHEMES):  # which cloud reads it: infra.stack.config
        return _store_url_problem(url)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url!r} is not an http(s) URL with a host"
    if parts.username or parts.password:
        return (
            f"{url!r} carries credentials: user data is readable through the cloud's API; "
            "use a pre-signed or public URL"
        )
    host = parts.hostname.lower().rstrip(".")
    address = _host_address(host)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    if (
        host in METADATA_HOSTS
        or host.endswith(".localhost")
        or (
            address is not None
            and (
                address.is_loopback
                or address.is_link_local
                or address.is_unspecified
                or address.is_multicast
                or address in METADATA_ADDRESSES
            )
        )
    ):
        return (
            f"{url!r} points at the node itself or at the cloud's metadata service; "
            "give the model host's address"
        )
    return None


def unverified_download_problem(urls: tuple[str, ...], sha256: tuple[str, ...]) -> str | None:
    """Plain http without a checksum: anyone on the path could swap the model."""
    plain = [url for url in urls if urlsplit(url).scheme == "http"]
    if plain and not sha256:
        return (
            f"{plain[0]!r} is plain http, which anyone on the path can alter; give each part's "
            "sha256 here, or use https"
        )
    return None
