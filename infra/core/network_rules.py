"""The network rules a setting must pass before anything is created: who may reach the API,
which ranges the cluster may use, and where a model may be downloaded from.

Each function returns what is wrong (a sentence naming the fix) or None; ``infra.stack.config``
names the setting.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from urllib.parse import parse_qsl, urlsplit

from infra.clouds import FACTS
from infra.clouds.stores import STORE_SCHEMES, store_url_problem

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
# Where a node's credentials come from: every cloud's instance metadata service (link-local
# 169.254.169.254, AWS's IPv6 endpoints) and Azure's wire server.
METADATA_SERVICE_ADDRESSES = METADATA_ADDRESSES | {ipaddress.ip_address("169.254.169.254")}


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


def is_internal(text: str) -> bool:
    """A range inside private address space (``INTERNAL_SOURCES``): a VPN's, a peered
    network's; not the internet's."""
    network = ipaddress.ip_network(text, strict=False)
    if not isinstance(network, ipaddress.IPv4Network):
        return False  # the cluster's network is IPv4 only
    return any(network.subnet_of(space) for space in INTERNAL_SOURCES)


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
    if is_internal(text):
        return None
    if network.prefixlen < WIDEST_PUBLIC_API_PREFIX:
        return (
            f"{text} opens the API to {network.num_addresses:,} internet addresses, and "
            "llama-server has no authentication; give your own network's range "
            f"(/{WIDEST_PUBLIC_API_PREFIX} or narrower) or use the tunnel (connectCommand)"
        )
    return None


# What a model URL may hold: printable ASCII from RFC 3986's sets, without curl's glob
# characters ([ ] { }), quotes, backslashes or spaces. A host is a DNS name (letters, digits and
# hyphens in dot-separated labels, a TLD that is not a number) or a dotted-decimal IPv4
# address: no percent-encoding, full-width or other spellings of an address, no IPv6 literal.
_URL_CHARACTERS = re.compile(r"[A-Za-z0-9\-._~:/?#@!$&()*+,;=%]+")
_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_DNS_NAME = re.compile(
    r"(?=.{1,253}$)(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?"
)
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = re.compile(rf"{_OCTET}(?:\.{_OCTET}){{3}}")
DEFAULT_PORTS = {"http": 80, "https": 443}
# Query parameters that carry a credential: pre-signed S3 (X-Amz-Signature, or AWSAccessKeyId
# with Signature), signed Cloud Storage (X-Goog-Signature, GoogleAccessId), Azure SAS (sig), and
# the common token names. A model URL sits in user data, the stack's state and the journal.
_SECRET_PARAMETER = re.compile(
    r"(x-amz-|x-goog-|awsaccesskeyid|googleaccessid|signature|^sig$|^se$|token|secret|"
    r"password|^key$|api[-_]?key|credential)",
    re.IGNORECASE,
)


def _host_problem(url: str, host: str) -> str | None:
    if _IPV4.fullmatch(host):
        address = ipaddress.IPv4Address(host)
        if (
            address.is_loopback
            or address.is_link_local
            or address.is_unspecified
            or address.is_multicast
            or address.is_reserved
            or address in METADATA_ADDRESSES
        ):
            return (
                f"{url!r} points at the node itself or at the cloud's metadata service; "
                "give the model host's address"
            )
        return None
    if host in METADATA_HOSTS or host.endswith((".localhost", ".internal")):
        return (
            f"{url!r} points at the node itself or at the cloud's metadata service; "
            "give the model host's address"
        )
    if not _DNS_NAME.fullmatch(host):
        return (
            f"{url!r}: the host must be a DNS name or a dotted-decimal IPv4 address (no IPv6, "
            "percent-encoded, numeric or other spelling of an address)"
        )
    return None


def _http_problems(url: str) -> Iterator[str | None]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        yield f"{url!r} is not an http(s) URL with a host"
        return
    if parts.username or parts.password:
        yield (
            f"{url!r} carries credentials, which would sit in user data, the stack's state and "
            "the node's journal; stage the model in the cloud's store (read with the node's "
            "identity) or give a public URL"
        )
    if parts.fragment or url.endswith("#"):
        yield f"{url!r} has a fragment (#…), which names nothing to download; remove it"
    yield _host_problem(url, parts.hostname.lower().rstrip("."))
    try:
        port = parts.port
    except ValueError:
        port = -1
    private = _IPV4.fullmatch(parts.hostname) and any(
        ipaddress.IPv4Address(parts.hostname) in space for space in INTERNAL_SOURCES
    )
    if port is not None and port != DEFAULT_PORTS[parts.scheme] and not (private and port > 0):
        yield (
            f"{url!r} names port {parts.netloc.rpartition(':')[2]}: the nodes reach the internet "
            f"on {DEFAULT_PORTS['http']} and {DEFAULT_PORTS['https']} only (another port only "
            "for a mirror at a private IPv4 address); host the model on the scheme's own port"
        )
    for name, _ in parse_qsl(parts.query, keep_blank_values=True):
        if _SECRET_PARAMETER.search(name):
            yield (
                f"{url!r} carries a credential in its query ({name}), which would sit in user "
                "data, the stack's state and the node's journal; stage the model in the "
                "cloud's store (read with the node's identity) or give a public URL"
            )


def model_url_problem(url: str) -> str | None:
    """Why a node must not download its model from this URL, or None."""
    if not _URL_CHARACTERS.fullmatch(url) or _PERCENT.search(url):
        return (
            f"{url!r} holds characters a model URL may not (controls, spaces, quotes, "
            "backslashes, non-ASCII, curl's glob characters [ ] { }, or a bad %-escape); "
            "give it percent-encoded"
        )
    if url.startswith(STORE_SCHEMES):  # which cloud reads it: infra.stack.config
        return store_url_problem(url)
    return next((problem for problem in _http_problems(url) if problem), None)


def unverified_download_problem(urls: tuple[str, ...], sha256: tuple[str, ...]) -> str | None:
    """Plain http without a checksum: anyone on the path could swap the model."""
    plain = [url for url in urls if urlsplit(url).scheme == "http"]
    if plain and not sha256:
        return (
            f"{plain[0]!r} is plain http, which anyone on the path can alter; give each part's "
            "sha256 here, or use https"
        )
    return None
