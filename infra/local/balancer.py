"""The local cluster's private balancer: HAProxy (Debian's package) in front of the serving
groups, with the configuration the clouds' balancer nodes boot with (``infra.boot.balancer``).

It runs in its own network namespace on the VPC bridge at the balancer's address (``.5``) and
listens on the server port. It sends a request only to a group whose main node answers
llama-server's ``GET /health`` with 200: a group that is loading (503) or dead gets none. The
configuration is the one every balancer runs (``infra.boot.balancer``), checked with
``haproxy -c`` before it starts, and HAProxy runs
in the foreground as a tracked process (its pid in the cluster's state directory) that ``down``
stops.
"""

from __future__ import annotations

import csv
import io
import os
import pwd
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.boot.balancer import BACKEND, BalancerBoot, haproxy_config
from infra.local import tracked
from infra.local.netns import exec_prefix

HAPROXY = "haproxy"
# A unix socket's path has room for 107 bytes (sun_path).
MAX_SOCKET_PATH = 107


class BalancerError(RuntimeError):
    """The balancer could not be configured, started or read."""


def find_haproxy() -> str:
    path = shutil.which(HAPROXY)
    if path is None:
        raise BalancerError(
            "--replicas: more than one serving group needs HAProxy as the balancer, and it is not "
            "installed; run scripts/install-deps (it installs Debian's haproxy package), or give "
            "--replicas 1"
        )
    return path


def unprivileged_user() -> str | None:
    """The user HAProxy drops to after binding, when it starts as root: Debian's package's own."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(HAPROXY).pw_name
    except KeyError:
        return None


def check_config(haproxy: str, config: Path) -> None:
    """``haproxy -c``: HAProxy's own verdict on the configuration, before anything runs."""
    result = subprocess.run(
        [haproxy, "-c", "-f", str(config)], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise BalancerError(
            f"the balancer's configuration {config} is invalid:\n"
            f"{(result.stdout + result.stderr).strip()}"
        )


@dataclass(frozen=True)
class Balancer:
    """One HAProxy process, in ``namespace`` (None: on this machine's loopback)."""

    namespace: str | None
    directory: Path  # config, pid file, stats socket, log

    @property
    def config(self) -> Path:
        return self.directory / "haproxy.cfg"

    @property
    def pid_file(self) -> Path:
        return self.directory / "haproxy.pid"

    @property
    def stats_socket(self) -> Path:
        return self.directory / "haproxy.sock"

    @property
    def log(self) -> Path:
        return self.directory / "haproxy.log"

    def write_config(self, boot: BalancerBoot) -> None:
        """HAProxy's configuration for ``boot``, as every balancer runs it, with its stats socket
        in this balancer's directory."""
        if len(str(self.stats_socket)) > MAX_SOCKET_PATH:
            raise BalancerError(
                f"--cache: the balancer's socket {self.stats_socket} is longer than a unix "
                f"socket's {MAX_SOCKET_PATH} bytes; give a shorter --cache"
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        self.config.write_text(
            haproxy_config(boot, stats_socket=str(self.stats_socket), run_as=unprivileged_user())
        )

    def start(self) -> None:
        """Check the configuration, then start HAProxy in the foreground, detached."""
        haproxy = find_haproxy()
        check_config(haproxy, self.config)
        self.stats_socket.unlink(missing_ok=True)  # one left by a HAProxy killed hard
        with self.log.open("a") as log:
            process = subprocess.Popen(
                [*exec_prefix(self.namespace), haproxy, "-db", "-f", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.pid_file.write_text(str(process.pid))
        # Running once its stats socket is there (HAProxy makes it after binding its address).
        deadline = time.monotonic() + 10
        while not self.stats_socket.is_socket():
            if process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log.read_text(errors="replace").strip().splitlines()[-5:]
                raise BalancerError(f"HAProxy did not start: {' / '.join(tail)}; see {self.log}")
            time.sleep(0.05)

    def pid(self) -> int | None:
        return tracked.read_pid(self.pid_file)

    def alive(self) -> bool:
        return tracked.alive(self.pid_file)

    def stop(self) -> None:
        """SIGTERM (HAProxy stops at once), then SIGKILL after 10 s."""
        tracked.stop(self.pid_file)

    def stats(self, timeout: float = 2) -> list[dict[str, str]]:
        """HAProxy's ``show stat`` for the groups: one row per group's server (``svname``,
        ``status`` UP / DOWN / …, ``scur`` open requests, ``stot`` requests so far,
        ``check_status``)."""
        rows = [row for row in self._show_stat(timeout) if row.get("svname") != "BACKEND"]
        for row in rows:
            # "* L7OK": the last check's result while the next one runs.
            row["check_status"] = row["check_status"].removeprefix("* ")
        return rows

    def queued(self, timeout: float = 2) -> int:
        """Requests waiting in HAProxy's queue for a group to free a slot."""
        rows = self._show_stat(timeout)
        return sum(int(row["qcur"] or 0) for row in rows if row.get("svname") == "BACKEND")

    def _show_stat(self, timeout: float) -> list[dict[str, str]]:
        """The groups' backend rows of ``show stat``: each server's, and the backend's own."""
        if not self.alive():
            raise BalancerError(f"the balancer is not running; see {self.log}")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.settimeout(timeout)
                client.connect(str(self.stats_socket))
                client.sendall(b"show stat\n")
                chunks = []
                while chunk := client.recv(65536):
                    chunks.append(chunk)
        except OSError as error:
            raise BalancerError(f"cannot read the balancer's state: {error}") from None
        text = b"".join(chunks).decode().removeprefix("# ")
        return [
            row
            for row in csv.DictReader(io.StringIO(text))
            if row.get("pxname") == BACKEND and row.get("svname") != "FRONTEND"
        ]

    def checks(self) -> dict[str, dict[str, Any]]:
        """Each group's state as the health checks see it, by its server's name (``group1``);
        when the balancer cannot be read, ``error`` says why."""
        try:
            rows = self.stats()
        except BalancerError as error:
            return {"error": {"status": str(error)}}
        return {
            row["svname"]: {
                "status": row["status"],
                "check": row["check_status"],
                "requests": int(row["stot"] or 0),
                "open": int(row["scur"] or 0),
            }
            for row in rows
        }

    def group_states(self) -> dict[str, str]:
        """Each group's check state, e.g. ``{"group1": "UP", "group2": "DOWN"}``."""
        return {row["svname"]: row["status"] for row in self.stats()}
