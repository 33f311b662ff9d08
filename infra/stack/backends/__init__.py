"""Cloud backends, registered by name and imported only when used (each pulls in its SDK)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the base module imports pulumi; facts users must not pay for it
    from infra.stack.backends.base import CloudBackend

_REGISTRY = {
    "aws": "infra.stack.backends.aws:AwsBackend",
    "gcp": "infra.stack.backends.gcp:GcpBackend",
    "azure": "infra.stack.backends.azure:AzureBackend",
}
BACKENDS = tuple(_REGISTRY)


def get_backend(name: str) -> CloudBackend[Any, Any]:
    if name not in _REGISTRY:
        raise KeyError(f"unknown cloud {name!r}; known: {', '.join(BACKENDS)}")
    module, cls = _REGISTRY[name].split(":")
    backend: type[CloudBackend[Any, Any]] = getattr(importlib.import_module(module), cls)
    return backend()
