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
# A release asset can be replaced after the release (kubernetes-sigs/lws#823: v0.8.0's manifest
# was re-uploaded with another image), and the manifest names its controller image by tag. The
# stack applies the manifest only when its bytes have the recorded sha256, with the controller's
# image by digest. Neither is recorded here yet: the manifest's sha256 is `sha256sum` of the
# asset, and the image's digest is the one registry.k8s.io promoted for the tag (kubernetes/k8s.io
# registry.k8s.io/images/k8s-staging-lws/images.yaml, kubernetes/k8s.io#9827). Until they are,
# a stack takes them from its settings (kubernetesControllerSha256, kubernetesControllerImage).
LWS_MANIFEST_SHA256: str | None = None
LWS_IMAGE = "registry.k8s.io/lws/lws"
LWS_IMAGE_BY_TAG = f"{LWS_IMAGE}:{LWS_VERSION}"  # as the release's manifest names it
LWS_IMAGE_BY_DIGEST: str | None = None
_SHA256 = re.compile(r"[0-9a-f]{64}")


def is_sha256(text: str) -> bool:
    """64 lowercase hex digits."""
    return _SHA256.fullmatch(text) is not None


# What the release's manifest makes that the stack refers to (kubernetes-sigs/lws v0.10.0
# config/default: the namespace and name prefix, config/manager: the manager's pod label,
# manager_webhook_patch.yaml: the webhook server's port).
LWS_NAMESPACE = "lws-system"
LWS_DEPLOYMENT = "lws-controller-manager"
LWS_PODS = {"control-plane": "controller-manager"}
LWS_WEBHOOK_PORT = 9443
