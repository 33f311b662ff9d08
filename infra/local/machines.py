"""Local machines: each node a ``systemd-nspawn`` container booting the node image, systemd as PID
1 and cloud-init reading the node's own user data from a NoCloud seed, inside the node's network
namespace on the VPC bridge (``infra.local.netns``).

A machine's root is an overlay on the shared image: what the node writes (cloud-init's state, the
model, the journal) lives in its own upper directory and survives a stop and start, as a VM's disk
survives a reboot. The host gives each machine read-only what a cloud would fetch for it: the
llama.cpp source, the model's directory and the llama.cpp build of the pinned commit, which the
node's build step finds complete and skips, as on a reboot.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from infra.boot import VM_PATHS
from infra.local.netns import run

NSPAWN = "systemd-nspawn"
SEED_DIR = "var/lib/cloud/seed/nocloud"
# Where the host's read-only gifts appear inside every machine.
SOURCE_MOUNT = "/srv/llama.cpp"
MODELS_MOUNT = "/srv/models"
DRAFTS_MOUNT = "/srv/drafts"  # a draft model's directory (the main node's only)
# Inside a machine, the command runs with a clean environment, as `ssm start-session` would.
EXEC_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class MachineError(RuntimeError):
    """A machine could not be started, reached or stopped."""


def unavailable_reason() -> str | None:
    """Why machines cannot run here, or None."""
    if os.geteuid() != 0:
        return "machines need root"
    for tool in (NSPAWN, "nsenter", "mount", "journalctl"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian's systemd-container and util-linux)"
    return None


CGROUP_ROOT = Path("/sys/fs/cgroup")


def _cgroup_hierarchies() -> list[Path]:
    """The hierarchies a machine's systemd manages: the unified one (cgroup v2, alone or beside
    v1) and v1's named systemd hierarchy."""
    if (CGROUP_ROOT / "cgroup.procs").exists():  # cgroup v2 only
        return [CGROUP_ROOT]
    return [CGROUP_ROOT / name for name in ("unified", "systemd") if (CGROUP_ROOT / name).is_dir()]


def _host_runs_systemd() -> bool:
    return Path("/run/systemd/system").is_dir()


@dataclass(frozen=True)
class Machine:
    """One node as a machine: its name, its network namespace and its own directory."""

    name: str  # the machine's name and hostname
    namespace: str
    directory: Path  # upper/, work/, root/ (the overlay), seed and console log
    image_root: Path
    binds: tuple[tuple[str, str], ...] = ()  # (host path, machine path), read-only

    @property
    def upper(self) -> Path:
        return self.directory / "upper"

    @property
    def root(self) -> Path:
        return self.directory / "root"

    @property
    def console_log(self) -> Path:
        return self.directory / "console.log"

    @property
    def pid_file(self) -> Path:
        return self.directory / "nspawn.pid"

    def written(self, path: str) -> Path:
        """Where a file the machine wrote at ``path`` is on the host, running or not."""
        return self.upper / path.lstrip("/")

    @property
    def journal(self) -> Path:
        return self.written("/var/log/journal")

    @property
    def status_file(self) -> Path:
        return self.written(f"{VM_PATHS.data_dir}/status.json")

    def seed(self, user_data: bytes, instance_id: str) -> None:
        """The NoCloud seed: the node's user data exactly as its cloud's datasource hands it to
        cloud-init, and the instance id that tells cloud-init a reboot from a new instance."""
        seed = self.upper / SEED_DIR
        seed.mkdir(parents=True, exist_ok=True)
        (seed / "user-data").write_bytes(user_data)
        (seed / "meta-data").write_text(
            f"instance-id: {instance_id}\nlocal-hostname: {self.name}\n"
        )

    def start(self) -> None:
        """Mount the root and boot the machine; returns once systemd runs inside it."""
        for part in ("upper", "work", "root"):
            (self.directory / part).mkdir(parents=True, exist_ok=True)
        if not os.path.ismount(self.root):
            run(
                "mount", "-t", "overlay", "overlay", "-o",
                f"lowerdir={self.image_root},upperdir={self.upper},"
                f"workdir={self.directory / 'work'}",
                str(self.root),
            )  # fmt: skip
        # Each machine's systemd needs a cgroup tree of its own: machines that shared one would
        # remove each other's unit cgroups. A host with systemd gives each a scope (machined);
        # without it, each gets a cgroup made here.
        own_cgroup = [] if _host_runs_systemd() else self._make_cgroups()
        argv = [
            NSPAWN, "--quiet", "-D", str(self.root), "--boot", f"--machine={self.name}",
            *([] if _host_runs_systemd() else ["--register=no", "--keep-unit"]),
            f"--network-namespace-path=/run/netns/{self.namespace}",
            # The node's root manages its own network namespace (the workers' nftables rules),
            # as a VM's root does; nspawn keeps this capability only for private networks.
            "--capability=CAP_NET_ADMIN",
            "--console=read-only",
            *(f"--bind-ro={host}:{inside}" for host, inside in self.binds),
        ]  # fmt: skip
        with self.console_log.open("ab") as log:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=lambda: _join_cgroups(own_cgroup),  # noqa: PLW1509 (no threads here)
            )
        self.pid_file.write_text(str(process.pid))
        deadline = time.monotonic() + 60
        while self.leader() is None:
            if process.poll() is not None:
                raise MachineError(
                    f"machine {self.name} stopped as it started (exit {process.returncode}); "
                    f"see {self.console_log}"
                )
            if time.monotonic() > deadline:
                raise MachineError(f"machine {self.name}: no init after 60 s")
            time.sleep(0.1)

    def _cgroups(self) -> list[Path]:
        return [h / "llama-rpc" / self.name for h in _cgroup_hierarchies()]

    def _make_cgroups(self) -> list[Path]:
        self._remove_cgroups()
        for cgroup in self._cgroups():
            cgroup.mkdir(parents=True, exist_ok=True)
        return self._cgroups()

    def _remove_cgroups(self) -> None:
        """Remove the machine's cgroups, deepest first (a cgroup goes only once empty)."""
        for cgroup in self._cgroups():
            if cgroup.is_dir():
                for directory in sorted(cgroup.rglob("*/"), key=lambda p: -len(p.parts)):
                    with contextlib.suppress(OSError):
                        directory.rmdir()
                with contextlib.suppress(OSError):
                    cgroup.rmdir()

    def nspawn_pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text())
        except (FileNotFoundError, ValueError):
            return None
        return pid if _alive(pid) else None

    def running(self) -> bool:
        return self.nspawn_pid() is not None

    def leader(self) -> int | None:
        """The machine's PID 1 (systemd), as this machine's kernel numbers it."""
        parent = self.nspawn_pid()
        if parent is None:
            return None
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                status = (entry / "status").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            nspid = next(
                (ln.split()[1:] for ln in status.splitlines() if ln.startswith("NSpid:")), []
            )
            if ppid == parent and nspid[-1:] == ["1"]:
                return int(entry.name)
        return None

    def exec_argv(self, command: list[str]) -> list[str]:
        """The host command line that runs ``command`` as root inside the running machine."""
        leader = self.leader()
        if leader is None:
            raise MachineError(f"machine {self.name} is not running")
        return [
            "nsenter", "--target", str(leader),
            "--mount", "--uts", "--ipc", "--net", "--pid", "--cgroup", "--root", "--wd",
            "--", "/usr/bin/env", "-i", f"PATH={EXEC_PATH}", "LANG=C.UTF-8", *command,
        ]  # fmt: skip

    def exec(self, command: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.exec_argv(command), capture_output=True, text=True, timeout=timeout, check=False
        )

    def journal_argv(self, args: list[str]) -> list[str]:
        """journalctl on the host, reading the machine's journal (running or not)."""
        return ["journalctl", "--directory", str(self.journal), "--no-pager", *args]

    def stop(self, timeout: float = 60) -> None:
        """Shut the machine down as a VM is (systemd stops every unit), then unmount its root."""
        pid = self.nspawn_pid()
        if pid is not None:
            # systemd-nspawn passes SIGTERM on to the machine's systemd as a clean poweroff.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                while _alive(pid):
                    time.sleep(0.1)
        self.pid_file.unlink(missing_ok=True)
        if not _host_runs_systemd():
            self._remove_cgroups()
        if os.path.ismount(self.root) and run("umount", str(self.root), check=False).returncode:
            run("umount", "--lazy", str(self.root))


def _join_cgroups(cgroups: list[Path]) -> None:
    """In the child before it runs systemd-nspawn: move it into the machine's own cgroups."""
    for cgroup in cgroups:
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    try:
        # A zombie (our own child, exited) is not alive.
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
