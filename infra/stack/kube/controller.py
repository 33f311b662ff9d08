"""The LeaderWorkerSet controller's manifest, applied only as pinned content.

The release's manifest is a URL whose asset can be replaced (kubernetes-sigs/lws#823), and it
names the controller's image by tag. Before anything is created the stack fetches the manifest
(once: it is kept by its sha256 in the cache), refuses bytes whose sha256 is not the recorded
one, puts the controller's image by digest in place of the tag, refuses any other image the
manifest runs by tag, and hands that file to the Kubernetes provider.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from infra.core import pins
from infra.core.cache import cache_dir
from infra.core.errors import SettingError
from infra.core.image_refs import is_pinned_image_reference

MAX_MANIFEST_BYTES = 16 * 1024 * 1024  # the release's is about 1.4 MB (its CRD alone: 1.3 MB)
FETCH_SECONDS = 60
SHA_SETTING = "kubernetesControllerSha256"
IMAGE_SETTING = "kubernetesControllerImage"
# The pod templates a manifest's workloads carry, by kind.
POD_TEMPLATES = {
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "Pod": ("spec",),
}


class ControllerError(SettingError):
    """The controller's manifest or image cannot be applied as pinned content."""


@dataclass(frozen=True)
class ControllerRelease:
    """What the stack applies: the manifest's URL and sha256, and the controller's image by
    tag (as the manifest names it) and by digest (what the pods run)."""

    url: str
    sha256: str
    image_by_tag: str
    image: str


def release(sha256: str | None, image: str | None) -> ControllerRelease:
    """The pinned release: the program's pins, else the stack's settings; refused, naming the
    setting and how to get its value, when neither gives one."""
    recorded = pins.LWS_MANIFEST_SHA256
    if recorded and sha256 and sha256 != recorded:
        raise ControllerError(
            SHA_SETTING,
            f"{sha256} is not the sha256 the program records for {pins.LWS_MANIFEST_URL} "
            f"({recorded}); remove the setting",
        )
    manifest = recorded or sha256
    if not manifest:
        raise ControllerError(
            SHA_SETTING,
            "is required with platform kubernetes until the program records the sha256 of "
            f"{pins.LWS_MANIFEST_URL}: read the manifest, then `pulumi config set {SHA_SETTING} "
            f'"$(curl -sL {pins.LWS_MANIFEST_URL} | sha256sum | cut -d" " -f1)"`; nothing was '
            "created",
        )
    by_digest = image or pins.LWS_IMAGE_BY_DIGEST
    if not by_digest:
        raise ControllerError(
            IMAGE_SETTING,
            f"is required with platform kubernetes until the program records the digest of "
            f"{pins.LWS_IMAGE_BY_TAG}, which the manifest names by tag: `docker buildx "
            f"imagetools inspect {pins.LWS_IMAGE_BY_TAG}` prints it (Digest:), then `pulumi "
            f"config set {IMAGE_SETTING} {pins.LWS_IMAGE}@sha256:DIGEST`; nothing was created",
        )
    if not is_pinned_image_reference(by_digest):
        raise ControllerError(IMAGE_SETTING, f"{by_digest!r} is not an image by digest")
    return ControllerRelease(pins.LWS_MANIFEST_URL, manifest, pins.LWS_IMAGE_BY_TAG, by_digest)


def download(url: str) -> bytes:
    """The manifest's bytes (whatever they are: the caller checks their sha256)."""
    if not url.startswith("https://"):
        raise ControllerError(SHA_SETTING, f"{url} is not an https URL")
    with urllib.request.urlopen(url, timeout=FETCH_SECONDS) as response:  # noqa: S310 (https)
        body: bytes = response.read(MAX_MANIFEST_BYTES + 1)
    if len(body) > MAX_MANIFEST_BYTES:
        raise ControllerError(SHA_SETTING, f"{url} is larger than {MAX_MANIFEST_BYTES} bytes")
    return body


def manifests_dir() -> Path:
    return cache_dir() / "lws"


def _write(path: Path, data: bytes) -> None:
    """Write a file whole or not at all (a later run never reads half of one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "wb") as out:
        out.write(data)
    os.replace(temporary, path)


def _images(obj: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The containers (init containers included) of an object's pod template."""
    path = POD_TEMPLATES.get(str(obj.get("kind")))
    spec: Any = obj
    for key in path or ("-",):
        spec = spec.get(key) if isinstance(spec, dict) else None
    if not isinstance(spec, dict):
        return
    for field in ("initContainers", "containers"):
        for container in spec.get(field) or []:
            if isinstance(container, dict):
                yield container


def pinned_objects(text: bytes, pinned: ControllerRelease) -> list[dict[str, Any]]:
    """The manifest's objects, its bytes checked against the recorded sha256, the controller's
    image by digest in place of its tag; refused when the bytes differ, when the controller's
    Deployment is not where the release puts it, or when another image is named by tag."""
    found = hashlib.sha256(text).hexdigest()
    if found != pinned.sha256:
        raise ControllerError(
            SHA_SETTING,
            f"{pinned.url} has sha256 {found}, not {pinned.sha256}: the asset changed, or the "
            "setting is wrong; read the manifest again before you trust it. Nothing was created",
        )
    objects = [doc for doc in yaml.safe_load_all(text) if doc]
    replaced = 0
    for obj in objects:
        for container in _images(obj):
            image = str(container.get("image", ""))
            if image == pinned.image_by_tag:
                container["image"] = pinned.image
                replaced += 1
            elif not is_pinned_image_reference(image):
                name = obj.get("metadata", {}).get("name")
                raise ControllerError(
                    SHA_SETTING,
                    f"the manifest's {obj.get('kind')} {name} runs {image!r} by tag, which no "
                    "setting pins; nothing was created",
                )
    controller = [
        obj
        for obj in objects
        if obj.get("kind") == "Deployment"
        and obj.get("metadata", {}).get("name") == pins.LWS_DEPLOYMENT
        and obj.get("metadata", {}).get("namespace") == pins.LWS_NAMESPACE
    ]
    if not controller or not replaced:
        raise ControllerError(
            SHA_SETTING,
            f"the manifest has no Deployment {pins.LWS_NAMESPACE}/{pins.LWS_DEPLOYMENT} running "
            f"{pins.LWS_IMAGE_BY_TAG}: it is not the release the program knows; nothing was "
            "created",
        )
    return objects


def verified_manifest(
    pinned: ControllerRelease, *, fetch: Callable[[str], bytes] | None = None
) -> Path:
    """The file the provider applies: the release's manifest, fetched once and kept by its
    sha256, with the controller's image by digest. The same pins give the same file."""
    directory = manifests_dir()
    original = directory / f"{pinned.sha256}.yaml"
    text = original.read_bytes() if original.is_file() else b""
    if hashlib.sha256(text).hexdigest() != pinned.sha256:
        text = (fetch or download)(pinned.url)
        objects = pinned_objects(text, pinned)  # refused before it is kept
        _write(original, text)
    else:
        objects = pinned_objects(text, pinned)
    digest = pinned.image.rsplit("@sha256:", 1)[-1]
    applied = directory / f"{pins.LWS_VERSION}-{pinned.sha256[:16]}-{digest[:16]}.yaml"
    _write(applied, yaml.safe_dump_all(objects, sort_keys=False).encode())
    return applied
