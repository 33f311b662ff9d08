"""Container image references, as the pods' image setting and ``lrc k8s render --image`` take
them: checked before anything is created, since a kubelet refuses a malformed one only once the
cluster exists."""

from __future__ import annotations

import re

# An image reference as registries and the kubelet parse it (the grammar in
# github.com/distribution/reference reference.go): [domain/]path[:tag][@digest]. A first
# component is a domain when it holds a '.' or a port, or is localhost; the path is lowercase
# components joined by '/'; the name (domain and path) at most 255 characters.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_DOMAIN = rf"(?:{_LABEL}(?:\.{_LABEL})+(?::[0-9]+)?|{_LABEL}:[0-9]+|localhost)"
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_REFERENCE = re.compile(
    rf"(?P<name>(?:{_DOMAIN}/)?{_PATH}(?:/{_PATH})*)(?::{_TAG})?(?:@{_DIGEST})?"
)
MAX_IMAGE_NAME = 255
IMAGE_MEANING = (
    "an image reference: [REGISTRY[:PORT]/]NAME[:TAG][@DIGEST], the name in lowercase letters, "
    "digits and . _ - / (like 123456789012.dkr.ecr.us-east-1.amazonaws.com/llama-rpc:0c1e570)"
)


def is_image_reference(text: str) -> bool:
    found = IMAGE_REFERENCE.fullmatch(text)
    return found is not None and len(found["name"]) <= MAX_IMAGE_NAME


# A reference that names its content: a sha256 digest (the registry's manifest or index digest),
# with or without the tag it was pushed as. A tag alone can be moved to other content by whoever
# can push to the repository; the kubelet pulls what the digest names or refuses.
_PINNED = re.compile(r"@sha256:[0-9a-f]{64}")
PINNED_MEANING = (
    "an image reference by digest, [REGISTRY/]NAME[:TAG]@sha256:<64 hex> (a tag can be moved "
    "to other content): `docker buildx build --push --metadata-file meta.json` writes the "
    "pushed digest as containerimage.digest, and `docker buildx imagetools inspect REF` or "
    "`aws ecr describe-images` print a pushed one's"
)


def is_pinned_image_reference(text: str) -> bool:
    """An image reference that ends in a sha256 digest."""
    found = _PINNED.search(text)
    return is_image_reference(text) and found is not None and found.end() == len(text)
