"""A small read-only JSON client for the clouds' REST APIs (Compute Engine, Resource Manager's
permission checks, Azure Resource Manager), with the transport apart so tests replay recorded
responses."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

TIMEOUT_SECONDS = 30


class Transport(Protocol):
    """(url, headers, a POST's JSON body or None for a GET) -> (HTTP status, body)."""

    def __call__(
        self, url: str, headers: Mapping[str, str], body: bytes | None = None
    ) -> tuple[int, bytes]: ...


class ApiError(RuntimeError):
    def __init__(self, url: str, status: int, code: str, message: str) -> None:
        self.status, self.code = status, code
        where = urllib.parse.urlsplit(url).path
        super().__init__(f"{where}: HTTP {status} {code}: {message}".strip())


def urllib_transport(
    url: str, headers: Mapping[str, str], body: bytes | None = None
) -> tuple[int, bytes]:
    if not url.startswith("https://"):
        raise ValueError(f"not an https URL: {url}")
    sent = dict(headers) | ({"Content-Type": "application/json"} if body is not None else {})
    request = urllib.request.Request(url, data=body, headers=sent)  # noqa: S310 (https only)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:  # noqa: S310
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _error(url: str, status: int, body: bytes) -> ApiError:
    """Google's and Azure's error bodies: ``{"error": {"code", "message", "errors"?}}``."""
    try:
        error = json.loads(body).get("error", {})
    except ValueError:
        error = {}
    code = str(error.get("code", ""))
    reasons = [e.get("reason", "") for e in error.get("errors", []) if isinstance(e, dict)]
    if reasons and reasons[0]:
        code = reasons[0]
    message = error.get("message") or body[:200].decode(errors="replace")
    return ApiError(url, status, code, str(message))


class JsonApi:
    def __init__(self, base: str, token: str, transport: Transport = urllib_transport) -> None:
        self.base, self.token, self.transport = base.rstrip("/") + "/", token, transport

    def url(self, path: str, query: Mapping[str, str] | None = None) -> str:
        url = path if path.startswith("https://") else self.base + path.lstrip("/")
        if query:
            encoded = urllib.parse.urlencode(query, quote_via=urllib.parse.quote)
            url += ("&" if "?" in url else "?") + encoded
        return url

    def get(self, path: str, query: Mapping[str, str] | None = None) -> dict[str, Any]:
        url = self.url(path, query)
        status, body = self.transport(url, {"Authorization": f"Bearer {self.token}"})
        if status != 200:
            raise _error(url, status, body)
        found: dict[str, Any] = json.loads(body)
        return found

    def post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """A read-only question asked with a body (Google's testIamPermissions)."""
        url = self.url(path)
        headers = {"Authorization": f"Bearer {self.token}"}
        status, answer = self.transport(url, headers, json.dumps(body).encode())
        if status != 200:
            raise _error(url, status, answer)
        found: dict[str, Any] = json.loads(answer)
        return found

    def pages(self, path: str, query: Mapping[str, str] | None = None) -> Iterator[dict[str, Any]]:
        """Each page of a list: Google's ``nextPageToken``, Azure's ``nextLink``."""
        page = self.get(path, query)
        while True:
            yield page
            if page.get("nextPageToken"):
                page = self.get(path, {**(query or {}), "pageToken": page["nextPageToken"]})
            elif page.get("nextLink"):
                page = self.get(page["nextLink"])
            else:
                return
