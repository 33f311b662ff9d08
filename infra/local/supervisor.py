"""A small stand-in for systemd, for where machines cannot run (no root, no systemd-nspawn):
runs each node's boot unit until it succeeds, then its role's unit, restarting each as systemd
would. ``up --machines`` runs the same units under real systemd instead.

It reads the very unit files that the VMs install (``cloud-init/systemd/``): ``ExecStartPre``
(``+`` marks a step that needs root), ``ExecStart``, ``Restart``, ``RestartSec``, ``RestartSteps``,
``RestartMaxDelaySec``, ``RestartPreventExitStatus`` and ``ImportCredential`` (from the node's
``credstore/``, handed over in ``$CREDENTIALS_DIRECTORY`` as systemd does). Commands under the
VM's script directory run from ``cloud-init/scripts/``; ``User=`` and the sandboxing options are
not applied.

The local cluster starts it detached, as a process of its own (``-m infra.local.supervisor
STATE_DIR``, no command of a user's).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from infra.boot import BOOT_UNIT, ROLE_UNIT, SCRIPTS_DIR, UNITS_DIR, VM_PATHS
from infra.core.limits import Role
from infra.local.netns import exec_prefix
from infra.local.spec import ClusterSpec


@dataclass(frozen=True)
class Unit:
    name: str
    pre: tuple[tuple[str, bool], ...]  # (script, needs root)
    start: str
    restart: str
    restart_sec: float
    type: str = "simple"
    restart_steps: int = 0
    restart_max_delay_sec: float | None = None
    restart_prevent_exit_status: tuple[int, ...] = ()
    requires: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    credentials: tuple[str, ...] = ()  # ImportCredential=

    def restart_delay(self, restart: int) -> float:
        """Seconds before restart number ``restart`` (1, 2, ...), as systemd computes it: from
        RestartSec to RestartMaxDelaySec in RestartSteps geometric steps."""
        top = self.restart_max_delay_sec
        if restart <= 1 or not self.restart_steps or top is None or self.restart_sec >= top:
            return self.restart_sec
        if restart > self.restart_steps:
            return top
        return float(
            self.restart_sec * (top / self.restart_sec) ** ((restart - 1) / self.restart_steps)
        )

    def restarts_after(self, code: int) -> bool:
        """Whether the unit is started again after its command exited with ``code``."""
        if code in self.restart_prevent_exit_status:
            return False
        return self.restart == "always" or (self.restart == "on-failure" and code != 0)


_TIMESPAN_UNITS = {"ms": 0.001, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600, "hr": 3600}


def parse_timespan(text: str) -> float:
    """A systemd time span: ``5``, ``10s``, ``10min``, ``1min 30s`` (seconds when bare)."""
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", text.strip())
    if not parts or "".join(n + u for n, u in parts) != re.sub(r"\s", "", text):
        raise ValueError(f"not a time span: {text!r}")
    return sum(float(number) * _TIMESPAN_UNITS[unit or "s"] for number, unit in parts)


def parse_unit(path: Path) -> Unit:
    values: dict[str, list[str]] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            key, value = line.split("=", 1)
            values.setdefault(key.strip(), []).append(value.strip())

    def last(key: str, default: str) -> str:
        return values.get(key, [default])[-1]

    pre = tuple((v.lstrip("+"), v.startswith("+")) for v in values.get("ExecStartPre", []))
    top = values.get("RestartMaxDelaySec")
    return Unit(
        name=path.name,
        pre=pre,
        start=values["ExecStart"][0],
        restart=last("Restart", "no"),
        restart_sec=parse_timespan(last("RestartSec", "100ms")),
        type=last("Type", "simple"),
        restart_steps=int(last("RestartSteps", "0")),
        restart_max_delay_sec=parse_timespan(top[-1]) if top else None,
        restart_prevent_exit_status=tuple(
            int(code) for v in values.get("RestartPreventExitStatus", []) for code in v.split()
        ),
        requires=tuple(u for v in values.get("Requires", []) for u in v.split()),
        after=tuple(u for v in values.get("After", []) for u in v.split()),
        credentials=tuple(values.get("ImportCredential", [])),
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
        self.boot = parse_unit(UNITS_DIR / BOOT_UNIT)
        self.unit = parse_unit(UNITS_DIR / ROLE_UNIT[self.role])
        self.stopping = threading.Event()
        self.current: subprocess.Popen[str] | None = None
        self.lock = threading.Lock()

    def _run(self, argv: list[str], credentials: tuple[str, ...] = ()) -> int:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LLAMA_RPC_ENV_FILE": str(self.env_file),
        }
        store = self.env_file.parent / "credstore"
        if any((store / name).is_file() for name in credentials):
            env["CREDENTIALS_DIRECTORY"] = str(store)
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
        # The role's unit Requires= and is After= the boot unit: it starts once the boot succeeded.
        if self._keep_running(self.boot) == 0 and not self.stopping.is_set():
            self._keep_running(self.unit)

    def _keep_running(self, unit: Unit) -> int:
        """Run ``unit`` as systemd would, restarting it by its Restart= rules, until it stops
        for good (a oneshot: until it succeeds); its last exit status."""
        restarts = 0
        while True:
            code = self._start(unit)
            if self.stopping.is_set():
                return code
            if unit.type == "oneshot" and code == 0:
                return 0
            if not unit.restarts_after(code):
                self.say(f"{unit.name} exited with status {code}; not restarting")
                return code
            restarts += 1
            delay = unit.restart_delay(restarts)
            self.say(f"{unit.name} exited with status {code}; restarting in {delay:.0f} s")
            if self.stopping.wait(delay):
                return code

    def _start(self, unit: Unit) -> int:
        code = 0
        for command, needs_root in unit.pre:
            if needs_root and not self.privileged:
                self.say(f"skipping {command}: it needs root (no firewall without namespaces)")
                continue
            code = self._run(local_command(command))
            if code != 0:
                return code
        return self._run(local_command(unit.start), unit.credentials)

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
    """Run every node of the cluster kept in ``state_dir`` (``ClusterSpec``) until SIGTERM."""
    spec = ClusterSpec.read(state_dir)
    logs = state_dir / "logs"
    logs.mkdir(exist_ok=True)
    nodes = [
        NodeProcess(
            name=node.name,
            role=node.role,
            namespace=node.namespace,
            env_file=node.env_file or Path(),
            log=(logs / f"{node.name}.log").open("a"),
            privileged=spec.netns,
        )
        for node in spec.nodes
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="infra.local.supervisor", description="Run a local cluster's nodes until SIGTERM."
    )
    parser.add_argument("state", type=Path, help="the cluster's state directory")
    return supervise(parser.parse_args(argv).state)


if __name__ == "__main__":
    sys.exit(main())
