"""llama-rpc-secret's Azure reader: a secret of the Key Vault the VM's tag names, with its
managed identity's token from the instance metadata service."""

import json
import os
import re
import urllib.parse

KEY_VAULT = os.environ.get("KEY_VAULT_ENDPOINT")  # another vault (a test's own, on loopback)
VAULT_TAG = "llama-rpc-key-vault"  # infra.clouds.azure.KEY_VAULT_TAG
VAULT_RESOURCE = "https://vault.azure.net"
# A Key Vault's name as Azure allows it: 3-24 letters, digits and single hyphens, a letter first,
# no hyphen last (learn.microsoft.com/azure/azure-resource-manager/management/resource-name-rules,
# Microsoft.KeyVault/vaults). Anything else in the tag could send the vault token to another host.
VAULT_NAME = re.compile(r"[A-Za-z](?:[A-Za-z0-9]|-(?!-)){1,22}[A-Za-z0-9]")


def read(secret, *, fetch, imds):
    """``SECRET``: its current version."""
    azure = {"Metadata": "true"}
    query = urllib.parse.urlencode({"api-version": "2018-02-01", "resource": VAULT_RESOURCE})
    token = json.loads(fetch(f"{imds}/metadata/identity/oauth2/token?{query}", azure))
    compute = json.loads(fetch(f"{imds}/metadata/instance/compute?api-version=2021-02-01", azure))
    vault = next((t["value"] for t in compute.get("tagsList", []) if t["name"] == VAULT_TAG), "")
    if not vault:
        raise ValueError(f"the VM has no {VAULT_TAG} tag naming its Key Vault")
    if not VAULT_NAME.fullmatch(vault):
        raise ValueError(f"the VM's {VAULT_TAG} tag is not a Key Vault name: {vault[:40]!r}")
    base = KEY_VAULT or f"https://{vault}.vault.azure.net"
    url = f"{base}/secrets/{secret}?api-version=7.4"
    return json.loads(fetch(url, {"Authorization": f"Bearer {token['access_token']}"}))["value"]
