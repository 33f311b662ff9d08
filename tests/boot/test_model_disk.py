"""model-disk.sh on a real block device: a loop device stands for the main node's EBS volume,
a stand-in of /sys/block names it as EC2 does, and the script formats and mounts it as root, as
on a node."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.clouds.aws import MODEL_DISK
from tests.conftest import require_tool, unavailable

GIB = 1024**3
SECTOR = 512


@dataclass
class Disks:
    """A stand-in of the kernel's disk lists, and the loop devices behind them."""

    sys_block: Path
    dev: Path
    loops: list[str]

    def add(self, name: str, size: int, *, model: str = MODEL_DISK.device_model) -> str:
        """A disk of ``size`` bytes that reports ``model``, backed by a sparse file."""
        backing = self.sys_block.parent / f"{name}.img"
        with backing.open("wb") as f:
            f.truncate(size)
        loop = subprocess.run(
            ["losetup", "--find", "--show", str(backing)], capture_output=True, text=True
        )
        if loop.returncode != 0:
            unavailable(f"no loop device: {loop.stderr.strip()}")
        device = loop.stdout.strip()
        self.loops.append(device)
        entry = self.sys_block / name
        (entry / "device").mkdir(parents=True)
        # The kernel pads the NVMe model to 40 characters.
        (entry / "device" / "model").write_text(f"{model:<40}\n")
        (entry / "size").write_text(f"{size // SECTOR}\n")
        (self.dev / name).symlink_to(device)
        return device


@pytest.fixture
def disks(tmp_path: Path) -> Iterator[Disks]:
    if os.geteuid() != 0:
        unavailable("formatting and mounting a disk needs root")
    for tool in ("losetup", "mkfs.ext4", "blkid", "mountpoint"):
        require_tool(tool)
    root = tmp_path / "kernel"
    found = Disks(root / "sys-block", root / "dev", [])
    found.sys_block.mkdir(parents=True)
    found.dev.mkdir()
    try:
        yield found
    finally:
        models = tmp_path / "data" / "models"
        while subprocess.run(["mountpoint", "-q", str(models)]).returncode == 0:
            subprocess.run(["umount", str(models)], check=True)
        for device in found.loops:
            subprocess.run(["losetup", "--detach", device], check=False)


@pytest.fixture
def model_disk(run_script, disks: Disks):
    """Runs model-disk.sh against the stand-in disks."""

    def run(size_gib: int = 1, **settings: str):
        return run_script(
            "model-disk.sh",
            MODEL_DISK_GB=str(size_gib),
            MODEL_DISK_MODEL=MODEL_DISK.device_model,
            LLAMA_SYS_BLOCK=str(disks.sys_block),
            LLAMA_DEV_DIR=str(disks.dev),
            **{"MODEL_DISK_WAIT_SECONDS": "0", **settings},
        )

    return run


def blkid(device: str, tag: str) -> str:
    return subprocess.run(
        ["blkid", "-p", "-s", tag, "-o", "value", device], capture_output=True, text=True
    ).stdout.strip()


def mounted_on(path: Path) -> str:
    found = subprocess.run(
        ["findmnt", "-n", "-o", "SOURCE", "--mountpoint", str(path)],
        capture_output=True,
        text=True,
    )
    return found.stdout.strip()


def read_ahead_kb(device: str) -> int:
    found = subprocess.run(["blockdev", "--getra", device], capture_output=True, text=True)
    return int(found.stdout) // 2


def unmount(path: Path) -> None:
    """What a reboot, or a new main node, starts from: the volume attached, nothing mounted."""
    subprocess.run(["umount", str(path)], check=True)


def test_a_blank_volume_is_formatted_and_mounted_once_and_kept(
    model_disk, disks: Disks, tmp_path: Path
) -> None:
    """The root disk (partitioned) and a disk of another size are passed over; the blank volume
    gets ext4 once; mounted again (a reboot, a replaced main node) it keeps what it holds."""
    disks.add("nvme0n1", GIB)
    (disks.sys_block / "nvme0n1" / "nvme0n1p1").mkdir()
    (disks.sys_block / "nvme0n1" / "nvme0n1p1" / "partition").write_text("1\n")
    disks.add("nvme2n1", 2 * GIB)
    volume = disks.add("nvme1n1", GIB)
    models = tmp_path / "data" / "models"

    result, status = model_disk(LLAMA_SERVICE_USER="daemon")
    assert result.returncode == 0, result.stderr
    assert "formatting the model disk" in result.stderr
    assert blkid(volume, "TYPE") == "ext4" and blkid(volume, "LABEL") == "llama-models"
    assert mounted_on(models) == volume
    assert status["model_disk"] == str(disks.dev / "nvme1n1")
    # The service user's group reads the models; only root writes there.
    info = models.stat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o7777) == (0, 1, 0o2750)
    uuid = blkid(volume, "UUID")
    (models / "model.gguf").write_bytes(b"gguf")

    unmount(models)
    result, _ = model_disk()
    assert result.returncode == 0, result.stderr
    assert "formatting" not in result.stderr
    assert blkid(volume, "UUID") == uuid
    assert (models / "model.gguf").read_bytes() == b"gguf"
    # Already mounted (the boot run again): nothing changes.
    result, _ = model_disk()
    assert result.returncode == 0, result.stderr
    assert mounted_on(models) == volume


def test_a_kept_volume_holds_only_this_models_parts(
    model_disk, disks: Disks, run_script, http_files, tmp_path: Path
) -> None:
    """A new main node on a kept volume: its model's verified part is not fetched again, and
    another model's parts go, so that this one fits. The model's disk reads ahead as the stack
    says (the load's page faults read that much at once), at every boot; another disk keeps its
    own read-ahead."""
    other = disks.add("nvme2n1", 2 * GIB)
    volume = disks.add("nvme1n1", GIB)
    assert model_disk()[0].returncode == 0
    models = tmp_path / "data" / "models"
    base, root = http_files
    data = b"gguf" * 1000
    (root / "model.gguf").write_bytes(data)
    settings = {"MODEL_URLS": f"{base}/model.gguf", "MODEL_DISK_GB": "1"}
    result, status = run_script("fetch-model.sh", **settings, MODEL_READ_AHEAD_KB="16384")
    assert result.returncode == 0, result.stderr
    assert read_ahead_kb(volume) == status["model_read_ahead_kb"] == 16384
    assert read_ahead_kb(other) != 16384
    subprocess.run(["blockdev", "--setra", "256", volume], check=True)  # a reboot
    (models / "old-model.gguf").write_bytes(b"old")
    (models / "old-model.gguf.verified").write_text("0" * 64)
    (root / "model.gguf").unlink()  # fetched again, it would fail

    result, _ = run_script("fetch-model.sh", **settings, MODEL_READ_AHEAD_KB="8192")
    assert result.returncode == 0, result.stderr
    assert "have model.gguf" in result.stderr
    assert read_ahead_kb(volume) == 8192
    assert sorted(p.name for p in models.iterdir()) == ["lost+found", "model.gguf"]


def test_no_volume_is_a_retried_failure_that_says_what_to_check(model_disk, disks) -> None:
    disks.add("nvme1n1", 2 * GIB)  # not the size the node was told
    result, status = model_disk()
    assert result.returncode == 1
    assert status["phase"] == "failed"
    assert "no 1 GiB disk of 'Amazon Elastic Block Store' attached" in status["last_error"]
    assert "pulumi up" in status["last_error"]


def test_the_boot_waits_for_a_volume_attached_after_it_starts(
    model_disk, disks: Disks, tmp_path: Path
) -> None:
    """EC2 attaches the volume once the node runs: the boot may be first."""
    attach = threading.Timer(2, disks.add, args=("nvme1n1", GIB))
    attach.start()
    started = time.monotonic()
    try:
        result, status = model_disk(MODEL_DISK_WAIT_SECONDS="60")
    finally:
        attach.join()
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started >= 2
    assert status["model_disk"] == str(disks.dev / "nvme1n1")
    assert mounted_on(tmp_path / "data" / "models") == disks.loops[0]


def test_two_candidates_or_a_foreign_file_system_are_final(model_disk, disks: Disks) -> None:
    disks.add("nvme1n1", GIB)
    disks.add("nvme3n1", GIB)
    result, status = model_disk()
    assert result.returncode == 78
    assert "2 disks could be the model disk (nvme1n1 nvme3n1)" in status["last_error"]

    for device in disks.loops[1:]:
        subprocess.run(["losetup", "--detach", device], check=True)
    (disks.dev / "nvme3n1").unlink()
    for entry in (disks.sys_block / "nvme3n1").rglob("*"):
        if entry.is_file():
            entry.unlink()
    subprocess.run(["mkfs.ext2", "-q", "-F", disks.loops[0]], check=True)
    result, status = model_disk()
    assert result.returncode == 78
    assert "holds a ext2 file system" in status["last_error"]
    assert json.dumps(status)  # the status file stays readable


def test_the_model_directory_is_never_mounted_through_a_link(
    model_disk, disks: Disks, tmp_path: Path
) -> None:
    disks.add("nvme1n1", GIB)
    (tmp_path / "data").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "data" / "models").symlink_to(tmp_path / "elsewhere")
    result, status = model_disk()
    assert result.returncode == 78
    assert "is a symbolic link" in status["last_error"]
    assert mounted_on(tmp_path / "elsewhere") == ""
