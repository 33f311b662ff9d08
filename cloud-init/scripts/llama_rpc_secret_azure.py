"""llama-rpc-secret's Azure reader: a secret of the Key Vault the VM's tag names, with its
managed identity's token from the instance metadata service."""

import json
import os
import urllib.parse

KEY_VAULT = os.environ.get("KEY_VAULT_ENDPOINT")  # another vault (a test's own, on loopback)
VAULT_TAG = "llama-rpc-key-vault"  # infra.clouds.azure.KEY_VAULT_TAG
VAULT_RESOURCE = "https://vault.azure.net"


def read(secret, *, fetch, imds):
    """``SECRET``: its current version."""
    azure = {"Metadata": "true"}
    query = urllib.parse.urlencode({"api-version": "2018-02-01", "resource": VAULT_RESOURCE})
    token = json.loads(fetch(f"{imds}/metadata/identity/oauth2/token?{query}", azure))
    compute = json.loads(fetch(f"{imds}/metadata/instance/compute?api-version=2021-02-01", azure))
    vault = next((t["value"] for t in compute.get("tagsList", []) if t["name"] == VAULT_TAG), "")
    if not vault:
        raise ValueError(f"the VM has no {VAULT_TAG} tag naming its Key Vault")
    base = KEY_VAULT or f"https://{vault}.vault.azure.net"
    url = f"{base}/secrets/{secret}?api-version=7.4"
    return json.loads(fetch(url, {"Authorization": f"Bearer {token['access_token']}"}))["value"]
