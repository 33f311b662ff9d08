"""llama-rpc-secret's Google Cloud reader: a Secret Manager secret of the node's project, with
its service account's token from the metadata server."""

import base64
import json
import os

# Another Secret Manager API (a test's own, on loopback).
SECRET_MANAGER = os.environ.get("SECRET_MANAGER_ENDPOINT", "https://secretmanager.googleapis.com")


def read(secret, *, fetch, imds):
    """``SECRET``: its latest version."""
    google = {"Metadata-Flavor": "Google"}
    base = f"{imds}/computeMetadata/v1"
    project = fetch(f"{base}/project/project-id", google).decode()
    token = json.loads(fetch(f"{base}/instance/service-accounts/default/token", google))
    url = f"{SECRET_MANAGER}/v1/projects/{project}/secrets/{secret}/versions/latest:access"
    reply = json.loads(fetch(url, {"Authorization": f"Bearer {token['access_token']}"}))
    return base64.b64decode(reply["payload"]["data"]).decode()
