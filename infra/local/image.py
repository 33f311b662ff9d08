"""The node image for local machines: a Debian root file system that boots like a cloud VM.

Built once with debootstrap from Debian's packages and cached beside the llama.cpp build. It holds
systemd, cloud-init and every package the cloud-config lists, and answers apt offline: the .debs
debootstrap fetched become a local repository, so the cloud-config's ``package_update`` and
``packages`` succeed inside a machine that has no way out.

Debian 13 (trixie) because its systemd (257) and cloud-init (25.1) are the closest to Ubuntu
24.04's (255, and 24.x to 25.x through its updates): bookworm's systemd 252 ignores the units'
``RestartSteps=``, ``RestartMaxDelaySec=`` and ``RestartMode=`` (systemd >= 254).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.boot.render import BUILD_PACKAGES, ROLE_PACKAGES, STAGED_PACKAGES

RELEASE = "trixie"
MIRROR = os.environ.get("LLAMA_RPC_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# What a cloud image has before any user data: an init system, cloud-init and the tools the
# boot scripts use. The cloud-config's own packages come on top (``packages``).
# python3-cffi-backend: python3-cryptography (for cloud-init) asks for it through a virtual
# package, which debootstrap does not resolve.
BASE_PACKAGES = (
    "ca-certificates",
    "cloud-init",
    "curl",
    "dbus",
    "iproute2",
    "python3",
    "python3-cffi-backend",
    "systemd",
)
OFFLINE_REPOSITORY = "/srv/offline-apt"

# Files the image carries on top of Debian's packages (path in the image: content).
IMAGE_FILES = {
    # The seed is the image's only datasource, as a cloud's own is on its images. The nodes'
    # network is set up from outside (the VPC namespace), as a cloud's DHCP would.
    "etc/cloud/cloud.cfg.d/90-llama-rpc-machine.cfg": (
        "datasource_list: [ NoCloud, None ]\n"
        "network: {config: disabled}\n"
        # Nodes are reached through `lrc local exec`, the local SSM or IAP; the image
        # has no SSH server whose host keys cloud-init could make.
        "ssh_genkeytypes: []\n"
    ),
    "etc/apt/sources.list": f"deb [trusted=yes] file:{OFFLINE_REPOSITORY} ./\n",
    "etc/apt/apt.conf.d/90-llama-rpc-offline": 'Acquire::Languages "none";\n',
    # An empty machine id: each machine makes its own on first boot, as a VM from an image does.
    "etc/machine-id": "",
}


class ImageError(RuntimeError):
    """The node image could not be built or found."""


def packages() -> tuple[str, ...]:
    """Every package in the image: the base and all that any role's cloud-config lists."""
    listed = set(BUILD_PACKAGES).union(*ROLE_PACKAGES.values(), STAGED_PACKAGES)
    return tuple(sorted(set(BASE_PACKAGES) | listed))


def image_key() -> str:
    """Names the image by what goes into it, so a changed list builds a new one."""
    recipe = json.dumps([RELEASE, packages(), IMAGE_FILES], sort_keys=True)
    return hashlib.sha256(recipe.encode()).hexdigest()[:10]


@dataclass(frozen=True)
class Image:
    directory: Path

    @property
    def root(self) -> Path:
        return self.directory / "root"

    @property
    def manifest(self) -> dict[str, Any]:
        manifest: dict[str, Any] = json.loads((self.directory / "image.json").read_text())
        return manifest


def image_dir(cache: Path) -> Path:
    return cache / "machines" / f"debian-{RELEASE}-{image_key()}"


def cached(cache: Path) -> Image | None:
    """The built image, or None; an interrupted build is never returned."""
    directory = image_dir(cache)
    return Image(directory) if (directory / "image.json").is_file() else None


def missing_tools() -> list[str]:
    return [tool for tool in ("debootstrap", "dpkg-scanpackages") if shutil.which(tool) is None]


def build(cache: Path, progress: Callable[[str], None] | None = None) -> Image:
    """Build the image (or return the one built before). Needs root and Debian's package registry:
    this is an install step, like fetching the llama.cpp source; machines themselves never leave
    this machine."""
    image = cached(cache)
    if image:
        return image
    if os.geteuid() != 0:
        raise ImageError("building the node image needs root (debootstrap)")
    if missing := missing_tools():
        raise ImageError(
            f"{', '.join(missing)} not found; install Debian's debootstrap and dpkg-dev "
            "(scripts/install-deps does)"
        )
    directory = image_dir(cache)
    staging = directory.with_name(directory.name + ".building")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    root = staging / "root"
    if progress:
        progress(f"building the node image: Debian {RELEASE} from {MIRROR} (once)")
    started = time.monotonic()
    log = staging / "debootstrap.log"
    with log.open("w") as out:
        result = subprocess.run(
            [
                "debootstrap", "--variant=minbase", f"--include={','.join(packages())}",
                RELEASE, str(root), MIRROR,
            ],
            stdout=out, stderr=subprocess.STDOUT, check=False,
        )  # fmt: skip
    if result.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-10:])
        raise ImageError(f"debootstrap failed (exit {result.returncode}); see {log}:\n{tail}")
    _make_offline_repository(root)
    for relative, content in IMAGE_FILES.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    # A persistent journal, so a node's log survives its reboots and is read from the host.
    (root / "var/log/journal").mkdir(parents=True, exist_ok=True)
    manifest = {
        "release": RELEASE,
        "mirror": MIRROR,
        "packages": list(packages()),
        "versions": _versions(root, ("systemd", "cloud-init", "cmake", "g++")),
        "build_seconds": round(time.monotonic() - started, 1),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (staging / "image.json").write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(directory, ignore_errors=True)
    staging.rename(directory)
    return Image(directory)


def _make_offline_repository(root: Path) -> None:
    """The packages debootstrap fetched, as a flat apt repository inside the image."""
    repository = root / OFFLINE_REPOSITORY.lstrip("/")
    repository.mkdir(parents=True, exist_ok=True)
    archives = root / "var/cache/apt/archives"
    for deb in archives.glob("*.deb"):
        deb.rename(repository / deb.name)
    index = subprocess.run(
        ["dpkg-scanpackages", "--multiversion", ".", "/dev/null"],
        cwd=repository, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if index.returncode != 0 or not index.stdout:
        raise ImageError(f"dpkg-scanpackages failed: {index.stderr.strip()}")
    (repository / "Packages").write_text(index.stdout)


def _versions(root: Path, names: tuple[str, ...]) -> dict[str, str]:
    result = subprocess.run(
        ["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W", "-f", "${Package} ${Version}\n",
         *names],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
