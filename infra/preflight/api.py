"""A small read-only JSON client for the clouds' REST APIs (Compute Engine, Azure Resource
Manager), with the transport apart so tests replay recorded responses."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from typing import Any

# (url, headers) -> (HTTP status, body)
Transport = Callable[[str, Mapping[str, str]], tuple[int, bytes]]
TIMEOUT_SECONDS = 30


class ApiError(RuntimeError):
    def __init__(self, url: str, status: int, code: str, message: str) -> None:
        self.status, self.code = status, code
        where = urllib.parse.urlsplit(url).path
        super().__init__(f"{where}: HTTP {status} {code}: {message}".strip())


def urllib_transport(url: str, headers: Mapping[str, str]) -> tuple[int, bytes]:
    if not url.startswith("https://"):
        raise ValueError(f"not an https URL: {url}")
    request = urllib.request.Request(url, headers=dict(headers))  # noqa: S310 (https only)
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
