"""A small stand-in for systemd: runs each node's first boot, then its unit, restarting it.

It reads the very unit files that the VMs install (``cloud-init/systemd/``): ``ExecStartPre``
(``+`` marks a step that needs root), ``ExecStart``, ``Restart`` and ``RestartSec``. Commands under
the VM's script directory run from ``cloud-init/scripts/``; ``User=`` is not applied.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from infra.boot import ROLE_UNIT, SCRIPTS_DIR, UNITS_DIR, VM_PATHS, Role
from infra.local.netns import exec_prefix


@dataclass(frozen=True)
class Unit:
    name: str
    pre: tuple[tuple[str, bool], ...]  # (script, needs root)
    start: str
    restart: str
    restart_sec: float


def parse_unit(path: Path) -> Unit:
    values: dict[str, list[str]] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            key, value = line.split("=", 1)
            values.setdefault(key.strip(), []).append(value.strip())
    pre = tuple((v.lstrip("+"), v.startswith("+")) for v in values.get("ExecStartPre", []))
    return Unit(
        name=path.name,
        pre=pre,
        start=values["ExecStart"][0],
        restart=values.get("Restart", ["no"])[0],
        restart_sec=float(values.get("RestartSec", ["0.1"])[0]),
    )


def local_command(vm_command: str) -> list[str]:
    """The VM command line with the VM's script directory mapped to ``cloud-init/scripts``."""
    words = vm_command.split()
    prefix = VM_PATHS.bin_dir + "/"
    if words[0].startswith(prefix):
        words[0] = str(SCRIPTS_DIR / words[0].removeprefix(prefix))
    return ["bash", *words]


@dataclass
class NodeProcess:
    """One node: its boot, then its service, each a process group inside the node's namespace."""

    name: str
    role: Role
    namespace: str | None
    env_file: Path
    log: IO[str]
    privileged: bool  # False without root: steps marked '+' are skipped, and said so

    def __post_init__(self) -> None:
        self.unit = parse_unit(UNITS_DIR / ROLE_UNIT[self.role])
        self.stopping = threading.Event()
        self.current: subprocess.Popen[str] | None = None
        self.lock = threading.Lock()

    def _run(self, argv: list[str]) -> int:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LLAMA_RPC_ENV_FILE": str(self.env_file),
        }
        with self.lock:
            if self.stopping.is_set():
                return 143
            self.current = subprocess.Popen(
                [*exec_prefix(self.namespace), *argv],
                env=env,
                stdout=self.log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                text=True,
            )
        code = self.current.wait()
        self.log.flush()
        return code

    def say(self, text: str) -> None:
        self.log.write(f"supervisor: {text}\n")
        self.log.flush()

    def run(self) -> None:
        code = self._run(local_command(f"{VM_PATHS.bin_dir}/node-boot.sh"))
        if code != 0:
            self.say(f"first boot failed with status {code}; the service is not started")
            return
        while not self.stopping.is_set():
            code = 0
            for command, needs_root in self.unit.pre:
                if needs_root and not self.privileged:
                    self.say(f"skipping {command}: it needs root (no firewall without namespaces)")
                    continue
                code = self._run(local_command(command))
                if code != 0:
                    break
            if code == 0:
                code = self._run(local_command(self.unit.start))
            if self.stopping.is_set():
                break
            if self.unit.restart == "no" or (self.unit.restart == "on-failure" and code == 0):
                self.say(f"{self.unit.name} exited with status {code}; not restarting")
                return
            self.say(f"{self.unit.name} exited with status {code}; restarting")
            self.stopping.wait(self.unit.restart_sec)

    def stop(self) -> None:
        with self.lock:
            self.stopping.set()
            process = self.current
        if process is None or process.poll() is not None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                process.wait(timeout=10)
                return
            except subprocess.TimeoutExpired:
                continue


def supervise(state_dir: Path) -> int:
    """Run every node of the cluster described in ``state_dir/cluster.json`` until SIGTERM."""
    spec = json.loads((state_dir / "cluster.json").read_text())
    logs = state_dir / "logs"
    logs.mkdir(exist_ok=True)
    nodes = [
        NodeProcess(
            name=node["name"],
            role=node["role"],
            namespace=node["namespace"],
            env_file=Path(node["env_file"]),
            log=(logs / f"{node['name']}.log").open("a"),
            privileged=spec["netns"],
        )
        for node in spec["nodes"]
    ]
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    threads = [threading.Thread(target=n.run, name=n.name, daemon=True) for n in nodes]
    for thread in threads:
        thread.start()
    while not done.wait(0.5):
        pass
    for node in nodes:
        node.stop()
    deadline = time.monotonic() + 15
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return 0
