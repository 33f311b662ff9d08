"""The main node's read of the API key on Google Cloud and Azure (`llama-rpc-secret` with its
`llama_rpc_secret_gcp` and `_azure` modules), against loopback stand-ins that answer as the
services document: the metadata server's project id and token, Secret Manager's
`versions/latest:access`, the Azure instance metadata service's token and tags, Key Vault's
`GET secrets/NAME`. Each stand-in checks what the real service checks (the metadata header, the
token the metadata service handed out) and answers a wrong one as the service does."""

from __future__ import annotations

import base64
import http.server
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.boot import API_KEY_CREDENTIAL, render_env_file
from infra.boot.render import API_KEY_READER_MODULES
from infra.clouds.azure import KEY_VAULT_TAG
from infra.stack.config import AZURE_API_KEY_SECRET
from tests.conftest import SCRIPTS

API_KEY = "Key0123456789abcdefghijKLMNOP"
PROJECT = "my-project"
SECRET_ID = "llama-rpc-cluster-dev-api-key"
GCP_TOKEN = "ya29.c.node-token"
AZURE_TOKEN = "eyJ0eXAiOiJKV1Qi.vault-token.sig"
VAULT = "lrc0123456789abcdef"


class _Cloud(http.server.BaseHTTPRequestHandler):
    """Both clouds' metadata services and secret stores, routed by path."""

    state: dict[str, Any]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: PLR0911 (one answer per route, as the services give them)
        state = self.server.state  # type: ignore[attr-defined]
        state["asked"].append(self.path)
        path, _, query = self.path.partition("?")
        if path.startswith("/computeMetadata/v1/"):
            if self.headers.get("Metadata-Flavor") != "Google":
                return self._send(403, b"Missing required header: Metadata-Flavor")
            if path.endswith("/project/project-id"):
                return self._send(200, PROJECT.encode())
            token = {"access_token": GCP_TOKEN, "expires_in": 3599, "token_type": "Bearer"}
            return self._send(200, json.dumps(token).encode())
        if path.startswith("/metadata/"):
            if self.headers.get("Metadata") != "true":
                return self._send(400, b'{"error":"invalid_request"}')
            if path == "/metadata/identity/oauth2/token":
                resource = urllib.parse.parse_qs(query)["resource"][0]
                token = {"access_token": AZURE_TOKEN, "resource": resource, "token_type": "Bearer"}
                return self._send(200, json.dumps(token).encode())
            compute = {"name": "dev-main", "tagsList": state["tags"]}
            return self._send(200, json.dumps(compute).encode())
        if path == f"/v1/projects/{PROJECT}/secrets/{SECRET_ID}/versions/latest:access":
            if self.headers.get("Authorization") != f"Bearer {GCP_TOKEN}" or state["deny"]:
                error = {"code": 403, "status": "PERMISSION_DENIED", "message": "Permission "
                         "'secretmanager.versions.access' denied for resource"}  # fmt: skip
                return self._send(403, json.dumps({"error": error}).encode())
            payload = {"data": base64.b64encode(API_KEY.encode()).decode()}
            reply = {"name": f"projects/123/secrets/{SECRET_ID}/versions/1", "payload": payload}
            return self._send(200, json.dumps(reply).encode())
        if path == f"/{VAULT}/secrets/{AZURE_API_KEY_SECRET}" and "api-version=7.4" in query:
            if self.headers.get("Authorization") != f"Bearer {AZURE_TOKEN}" or state["deny"]:
                error = {"code": "Forbidden", "message": "Caller is not authorized to perform "
                         "action on resource."}  # fmt: skip
                return self._send(403, json.dumps({"error": error}).encode())
            reply = {"value": API_KEY, "id": f"https://{VAULT}.vault.azure.net/secrets/api-key/1"}
            return self._send(200, json.dumps(reply).encode())
        return self._send(404, b'{"error": {"code": 404, "status": "NOT_FOUND"}}')

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def cloud() -> Iterator[tuple[str, dict[str, Any]]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Cloud)
    server.state = {  # type: ignore[attr-defined]
        "asked": [], "deny": False, "tags": [{"name": KEY_VAULT_TAG, "value": VAULT}],
    }  # fmt: skip
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", server.state  # type: ignore[attr-defined]
    server.shutdown()


def read_key(
    url: str, tmp_path: Path, source: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The reader as a node runs it: its script and its cloud's module alone, in one directory."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shutil.copy(SCRIPTS / "llama-rpc-secret", bin_dir)
    shutil.copy(SCRIPTS / API_KEY_READER_MODULES[source.split(":", 1)[0]], bin_dir)
    key_file = tmp_path / "run" / "credstore" / API_KEY_CREDENTIAL
    env_file = tmp_path / "node.env"
    env_file.write_text(render_env_file({"API_KEY_SOURCE": source, "API_KEY_FILE": str(key_file)}))
    result = subprocess.run(
        [sys.executable, str(bin_dir / "llama-rpc-secret")],
        env={**os.environ, "LLAMA_RPC_ENV_FILE": str(env_file), "IMDS_ENDPOINT": url,
             "SECRET_MANAGER_ENDPOINT": url, "KEY_VAULT_ENDPOINT": f"{url}/{VAULT}",
             "API_KEY_ATTEMPTS": "1"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return result, key_file


SOURCES = {"gcp": f"gcp-sm:{SECRET_ID}", "azure": f"azure-kv:{AZURE_API_KEY_SECRET}"}


@pytest.mark.parametrize("cloud_name", sorted(SOURCES))
def test_the_main_node_reads_its_key_with_its_own_token(cloud, tmp_path, cloud_name) -> None:
    url, state = cloud
    result, key_file = read_key(url, tmp_path, SOURCES[cloud_name])
    assert result.returncode == 0, result.stderr
    assert key_file.read_text() == API_KEY + "\n"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700
    assert API_KEY not in result.stdout + result.stderr
    if cloud_name == "azure":  # a token for Key Vault, not for Resource Manager
        assert any("resource=https%3A%2F%2Fvault.azure.net" in p for p in state["asked"])


@pytest.mark.parametrize("cloud_name", sorted(SOURCES))
def test_an_identity_the_store_refuses_reads_nothing(cloud, tmp_path, cloud_name) -> None:
    url, state = cloud
    state["deny"] = True  # the grant has not reached the service, or is not there
    result, key_file = read_key(url, tmp_path, SOURCES[cloud_name])
    assert result.returncode != 0 and not key_file.exists()
    assert "answered 403" in result.stderr
    assert ("PERMISSION_DENIED" if cloud_name == "gcp" else "not authorized") in result.stderr


def test_an_azure_vm_without_its_vault_tag_says_so(cloud, tmp_path) -> None:
    url, state = cloud
    state["tags"] = [{"name": "project", "value": "llama-rpc-cluster"}]
    result, key_file = read_key(url, tmp_path, SOURCES["azure"])
    assert result.returncode != 0 and not key_file.exists()
    assert f"no {KEY_VAULT_TAG} tag" in result.stderr


@pytest.mark.parametrize("tag", ["evil.example/x?", "lrc0123@evil.example", "a", "lrc--x"])
def test_an_azure_vault_tag_that_is_no_vault_name_gets_no_token(cloud, tmp_path, tag) -> None:
    """A principal that may write the VM's tags must not receive the vault token: the reader
    asks nothing of a vault its tag does not name as Azure names vaults."""
    url, state = cloud
    state["tags"] = [{"name": KEY_VAULT_TAG, "value": tag}]
    result, key_file = read_key(url, tmp_path, SOURCES["azure"])
    assert result.returncode != 0 and not key_file.exists()
    assert "tag is not a Key Vault name" in result.stderr
    assert not [path for path in state["asked"] if not path.startswith("/metadata/")]


def test_a_missing_secret_is_final(cloud, tmp_path) -> None:
    url, _ = cloud
    result, key_file = read_key(url, tmp_path, "gcp-sm:no-such-secret")
    assert result.returncode != 0 and not key_file.exists()
    assert "no such secret" in result.stderr and "answered 404" in result.stderr


def test_the_azure_module_names_the_stacks_vault_tag() -> None:
    module = (SCRIPTS / "llama_rpc_secret_azure.py").read_text()
    assert f'VAULT_TAG = "{KEY_VAULT_TAG}"' in module
