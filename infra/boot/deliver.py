"""User data as each cloud takes it: the channel and its size limit are the cloud's facts
(``infra.clouds``); the body is the same everywhere. Gzip (which cloud-init unpacks) is used only
when the plain text is over the limit and the channel takes binary data.
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
from dataclasses import dataclass

from infra.boot.node import BootConfigError, NodeBoot
from infra.clouds import FACTS
from infra.core.limits import Cloud, Role


@dataclass(frozen=True)
class Delivery:
    """User data as one cloud takes it."""

    cloud: Cloud
    field: str  # the provider argument that carries it
    value: str
    gzipped: bool
    size: int  # bytes that count against the limit
    limit: int

    def received(self) -> bytes:
        """The user data as the cloud's datasource hands it to cloud-init on the VM: base64 is
        decoded on the way (Azure's customData, AWS's base64 field); gzip is left for cloud-init
        itself to unpack."""
        if self.gzipped or FACTS[self.cloud].user_data.base64:
            return base64.b64decode(self.value)
        return self.value.encode()


def deliver(user_data: str, cloud: Cloud) -> Delivery:
    """Package user data for a cloud; gzip it only when it must."""
    if cloud not in FACTS:
        raise BootConfigError("cloud", f"cloud {cloud!r} is not one of {', '.join(FACTS)}")
    channel = FACTS[cloud].user_data
    raw = user_data.encode()
    for gzipped in (False, True):
        if gzipped and channel.gzip_field is None:
            break
        # mtime=0 keeps the bytes stable, so an unchanged config never replaces a node.
        payload = gzip.compress(raw, mtime=0) if gzipped else raw
        value = base64.b64encode(payload).decode() if gzipped or channel.base64 else user_data
        size = len(value) if channel.base64 else len(payload)
        if size <= channel.limit_bytes:
            name = channel.gzip_field if gzipped and channel.gzip_field else channel.field
            return Delivery(cloud, name, value, gzipped, size, channel.limit_bytes)
    raise BootConfigError(
        "user_data",  # the stack names the setting that fills it (``ClusterConfig``)
        f"the {cloud} user data is {len(raw):,} bytes, over the {channel.limit_bytes:,}-byte "
        "limit even compressed",
    )


def packed(text: str) -> str:
    """A file as a store keeps it where the user data cannot hold it: gzip in base64, the same
    bytes every time (``llama-rpc-secret files`` unpacks it)."""
    return base64.b64encode(gzip.compress(text.encode(), 9, mtime=0)).decode()


def files_source(cloud: Cloud, role: Role, region: str, path: str) -> str:
    """Where a node on ``cloud`` reads the boot files beyond its first steps ("": its user data
    holds them all): ``path`` in the cloud's store (``UserDataChannel.files_store``), for a main
    node. A worker has no cloud identity to read a store with (the RPC port it serves has no
    authentication), so its user data holds every file it has."""
    store = FACTS[cloud].user_data.files_store
    return f"{store}:{region}:{path}" if store and role == "main" else ""


def for_cloud(boot: NodeBoot, cloud: Cloud, region: str, path: str) -> NodeBoot:
    """The node as ``cloud`` boots it (``files_source``)."""
    return dataclasses.replace(boot, files_source=files_source(cloud, boot.role, region, path))
