"""The pods' image: the boot files a VM installs (``infra.boot.render.boot_files``: the scripts
and the pinned commit's patch set), the packages it installs (and HAProxy, which the balancer
pods run, as the VMs' balancer node does), and llama.cpp built by the same ``build-llama.sh`` at
the same commit with RPC on, for arm64.

A node builds llama.cpp for its own CPU (``-march=native``); the image is built elsewhere (``docker
buildx --platform linux/arm64``, often under emulation), so it is built for the stack's CPU
family instead (``LLAMA_CPU_ARCH``): the same binary whatever machine builds it. The base image is
named by the digest the builder passes (``UBUNTU_DIGEST``): nothing the image holds comes from a
tag that can move.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from infra.boot.node import VM_PATHS, NodeBoot
from infra.boot.render import BUILD_PACKAGES, NODE_PACKAGES, SERVICE_USER, boot_files
from infra.catalog import InstanceType

# Canonical's Ubuntu 24.04, as the VMs boot, by the digest of its multi-platform index (the
# build argument: `docker buildx imagetools inspect ubuntu:24.04` prints it).
BASE_IMAGE = "ubuntu:24.04"
BASE_DIGEST_ARG = "UBUNTU_DIGEST"
UID = 10001  # the pods' runAsUser (infra.stack.kube.objects)
# The exporter runs on a VM beside the node's services; a pod has no host to report on. HAProxy
# is the balancer pods' (infra.stack.kube.objects), the package the balancer node installs.
IMAGE_PACKAGES = tuple(
    sorted((set(BUILD_PACKAGES) | set(NODE_PACKAGES) | {"haproxy"}) - {"prometheus-node-exporter"})
)
# The -march of each Arm CPU family of the catalog (infra/catalog/cpus.csv), oldest first: the
# flags aws/aws-graviton-getting-started's c-c++.md gives per Neoverse core (N1: Graviton2;
# V1: Graviton3; V2: Graviton4 and Axion; N2: Cobalt 100), as GGML_CPU_ARM_ARCH takes them
# (ggml/src/ggml-cpu/CMakeLists.txt at the pin: -march=${GGML_CPU_ARM_ARCH} when not native).
CPU_ARCH = {
    "graviton2": "armv8.2-a+fp16+rcpc+dotprod+crypto",
    "graviton3": "armv8.4-a+sve+bf16+i8mm+dotprod+crypto",
    "cobalt100": "armv9-a+sve2+bf16+i8mm",
    "graviton4": "armv9-a+sve2+bf16+i8mm",
    "axion": "armv9-a+sve2+bf16+i8mm",
}


def cpu_arch(*instances: InstanceType) -> str:
    """The -march every node of the stack runs: the oldest of their families' (a c7g main node
    and c8g workers share Graviton3's)."""
    families = sorted({i.cpu_family for i in instances}, key=list(CPU_ARCH).index)
    return CPU_ARCH[families[0]]


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


def write_context(out: Path, main: NodeBoot, worker: NodeBoot | None, arch: str) -> Path:
    """The build context, ``out/image``: the boot files and the Dockerfile."""
    context = out / "image"
    for name, (mode, content) in context_files(main, worker).items():
        path = context / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        path.chmod(int(mode, 8))
    (context / "Dockerfile").write_text(dockerfile(main, arch))
    return context


def dockerfile(main: NodeBoot, arch: str) -> str:
    """The recipe: the boot files, the packages, llama.cpp for every role at the pinned commit,
    for the CPU architecture ``arch``."""
    build_env = {
        "LLAMA_ROLE": "all",
        "LLAMA_CPP_COMMIT": main.llama_cpp_commit,
        "LLAMA_CPP_SOURCE": main.llama_cpp_source,
        "LLAMA_CPP_PATCHES": main.patches,
        "LLAMA_PREFIX": VM_PATHS.prefix,
        "LLAMA_DATA_DIR": "/tmp/llama-rpc-build",
        "LLAMA_STATUS_FILE": "/tmp/llama-rpc-build/status.json",
        "LLAMA_CPU_ARCH": arch,
    }
    assignments = " ".join(f"{name}={value}" for name, value in build_env.items())
    return "\n".join(
        [
            "# syntax=docker/dockerfile:1",
            f"# llama-rpc-cluster's node image: llama.cpp {main.llama_cpp_commit[:12]} with RPC.",
            f"# Built for -march={arch} on any machine: docker buildx build --platform linux/arm64",
            f"#   --build-arg {BASE_DIGEST_ARG}=sha256:... (docker buildx imagetools inspect "
            f"{BASE_IMAGE}).",
            f"ARG {BASE_DIGEST_ARG}",
            f"FROM --platform=linux/arm64 {BASE_IMAGE}@${{{BASE_DIGEST_ARG}}}",
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
