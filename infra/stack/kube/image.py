"""The pods' image: the boot files a VM installs (``infra.boot.render.boot_files``: the scripts
and the pinned commit's patch set), the packages it installs, and llama.cpp built by the same
``build-llama.sh`` at the same commit with RPC on, for arm64.

llama.cpp is built with ``-march=native`` (``GGML_NATIVE``), as on a node: build the image on an
Arm machine of the node pool's family (a Graviton4 builder for c8g and r8g pools), or its
binaries may use instructions the pool's CPUs lack, or miss ones they have.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from infra.boot.node import VM_PATHS, NodeBoot
from infra.boot.render import BUILD_PACKAGES, NODE_PACKAGES, SERVICE_USER, boot_files

# Canonical's Ubuntu 24.04, as the VMs boot (the arm64 image of the tag).
BASE_IMAGE = "ubuntu:24.04"
UID = 10001  # the pods' runAsUser (infra.stack.kube.objects)
# The exporter runs on a VM beside the node's services; a pod has no host to report on.
IMAGE_PACKAGES = tuple(
    sorted(set(BUILD_PACKAGES) | set(NODE_PACKAGES) - {"prometheus-node-exporter"})
)
CONTEXT_FILES = "files"  # the build context's copy of the boot files


def context_files(main: NodeBoot, worker: NodeBoot | None) -> dict[str, tuple[str, str]]:
    """The build context's files under ``files/``: path -> (permissions, content), the main
    node's and a worker's boot files together (COPY keeps each file's mode)."""
    found: dict[str, tuple[str, str]] = {}
    for boot in (main, *((worker,) if worker else ())):
        for file in boot_files(boot, VM_PATHS):
            found[str(PurePosixPath(CONTEXT_FILES) / file["path"].lstrip("/"))] = (
                file["permissions"],
                file["content"],
            )
    return found


def write_context(out: Path, main: NodeBoot, worker: NodeBoot | None) -> Path:
    """The build context, ``out/image``: the boot files and the Dockerfile."""
    context = out / "image"
    for name, (mode, content) in context_files(main, worker).items():
        path = context / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        path.chmod(int(mode, 8))
    (context / "Dockerfile").write_text(dockerfile(main))
    return context


def dockerfile(main: NodeBoot) -> str:
    """The recipe: the boot files, the packages, llama.cpp for every role at the pinned commit."""
    build_env = {
        "LLAMA_ROLE": "all",
        "LLAMA_CPP_COMMIT": main.llama_cpp_commit,
        "LLAMA_CPP_SOURCE": main.llama_cpp_source,
        "LLAMA_CPP_PATCHES": main.patches,
        "LLAMA_PREFIX": VM_PATHS.prefix,
        "LLAMA_DATA_DIR": "/tmp/llama-rpc-build",
        "LLAMA_STATUS_FILE": "/tmp/llama-rpc-build/status.json",
    }
    assignments = " ".join(f"{name}={value}" for name, value in build_env.items())
    return "\n".join(
        [
            "# syntax=docker/dockerfile:1",
            f"# llama-rpc-cluster's node image: llama.cpp {main.llama_cpp_commit[:12]} with RPC.",
            "# Build it on an Arm machine of the node pool's family (-march=native).",
            f"FROM --platform=linux/arm64 {BASE_IMAGE}",
            f"COPY {CONTEXT_FILES}/ /",
            "RUN apt-get update \\",
            " && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\",
            f"    {' '.join(IMAGE_PACKAGES)} python3 \\",
            " && rm -rf /var/lib/apt/lists/*",
            f"RUN mkdir -p /tmp/llama-rpc-build && {assignments} \\",
            f"    {VM_PATHS.bin_dir}/build-llama.sh && rm -rf /tmp/llama-rpc-build",
            f"RUN useradd --system --uid {UID} --home-dir {VM_PATHS.data_dir} {SERVICE_USER} \\",
            f" && install -d -o {SERVICE_USER} -g {SERVICE_USER} {VM_PATHS.data_dir}",
            f"USER {UID}",
            "",
        ]
    )
