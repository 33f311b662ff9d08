"""The llama.cpp build every node runs, and where it comes from.

The main node and every worker must run the same build: the RPC protocol refuses a peer whose
protocol version differs. The default commit is the llama.cpp tree vendored in the PyPI sdist of
llama-cpp-python 0.3.36, so the local cluster and the tests build exactly what the VMs build.
"""

import re

LLAMA_CPP_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
LLAMA_CPP_REPO = "https://github.com/ggml-org/llama.cpp"
LLAMA_CPP_PYTHON_SDIST = "llama-cpp-python==0.3.36"

_COMMIT = re.compile(r"[0-9a-f]{40}")


def is_full_commit(text: str) -> bool:
    """True for a full 40-character lowercase hex commit hash (never a branch or a tag)."""
    return _COMMIT.fullmatch(text) is not None


# The LeaderWorkerSet controller (kubernetes-sigs/lws) the EKS stack installs: its release's
# manifest (CRDs, controller, webhook; the controller image is built for arm64).
LWS_VERSION = "v0.10.0"
LWS_MANIFEST_URL = (
    f"https://github.com/kubernetes-sigs/lws/releases/download/{LWS_VERSION}/manifests.yaml"
)
# What the release's manifest makes that the stack refers to (kubernetes-sigs/lws v0.10.0
# config/default: the namespace and name prefix, config/manager: the manager's pod label,
# manager_webhook_patch.yaml: the webhook server's port).
LWS_NAMESPACE = "lws-system"
LWS_DEPLOYMENT = "lws-controller-manager"
LWS_PODS = {"control-plane": "controller-manager"}
LWS_WEBHOOK_PORT = 9443
