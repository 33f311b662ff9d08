"""The local cluster's object store (``lrc local up --machines --staged``): a real S3 API (moto's
server, the ``local`` extra; ``infra.local.store_server``) in a namespace of its own on the VPC
bridge at ``.4``, holding the model as ``lrc stage`` stages it for a stack: its parts and the
slice manifest, staged by ``lrc stage`` itself. The machines read it with rclone, as a cloud's
nodes read their stack's bucket, with an identity the cluster gives root's boot unit (a drop-in
only root reads), as a VM's role is given.

Every request the store answers is one JSON line of ``requests.jsonl`` in its directory (the
client's address, method, path, Range, status, bytes): what each node fetched, range by range.
The store holds what it was given in memory: it lives as long as the cluster, and a cluster
whose store has stopped is brought up again.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.boot import BOOT_UNIT
from infra.core import layout
from infra.local import tracked
from infra.local.netns import exec_prefix
from infra.models.parts import part_paths

STORE_NODE = "s3"  # the store's namespace and link name (``lrc-<id>-s3``)
STORE_HOST = 4  # its address in the private subnet, below the balancer's (.5) and the nodes'
STORE_PORT = 9000
BUCKET = "models"
REGION = "us-east-1"
PREFIX = "local/"
# Where ``lrc stage`` reads the parts from, inside the store's namespace (its loopback).
SOURCE_PORT = 9001
# The unit whose steps read the store (the model, the slices, the prebuilt llama.cpp).
IDENTITY_DROP_IN = f"/etc/systemd/system/{BOOT_UNIT}.d/local-store.conf"
START_SECONDS = 30
STAGE_SECONDS = 600
# `lrc` as this interpreter runs it (inside a namespace, whatever PATH holds).
LRC_MAIN = "import sys; from infra.cli.lrc import main; sys.exit(main(sys.argv[1:]))"


class StoreError(RuntimeError):
    """The store could not be started, filled or read."""


def store_ip(cidr: ipaddress.IPv4Network) -> str:
    return str(layout.private_subnet(cidr).network_address + STORE_HOST)


def store_url(name: str) -> str:
    """Where ``lrc stage`` puts the part (or manifest) named ``name``."""
    return f"s3://{BUCKET}/{PREFIX}{name}"


def unavailable_reason() -> str | None:
    """Why the store cannot run here, or None."""
    if importlib.util.find_spec("moto") is None:
        return "moto is not installed (the local extra: uv sync --extra local)"
    return None


@dataclass(frozen=True)
class LocalStore:
    """One store: its namespace (on the VPC bridge), address and directory on this machine."""

    namespace: str
    ip: str
    directory: Path
    port: int = STORE_PORT

    @property
    def endpoint(self) -> str:
        return f"http://{self.ip}:{self.port}"

    @property
    def log(self) -> Path:
        return self.directory / "requests.jsonl"

    @property
    def server_log(self) -> Path:
        return self.directory / "server.log"

    @property
    def pid_file(self) -> Path:
        return self.directory / "server.pid"

    @property
    def identity_file(self) -> Path:
        return self.directory / "identity"

    def identity(self) -> dict[str, str]:
        """The key the nodes sign with (moto checks none; rclone signs every request), made
        once, root's alone."""
        if not self.identity_file.exists():
            self.directory.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(self.identity_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as out:
                json.dump({"AWS_ACCESS_KEY_ID": f"LOCAL{secrets.token_hex(8).upper()}",
                           "AWS_SECRET_ACCESS_KEY": secrets.token_urlsafe(30)}, out)  # fmt: skip
        identity: dict[str, str] = json.loads(self.identity_file.read_text())
        return identity

    def drop_in(self) -> str:
        """The boot unit's drop-in that gives a machine's root the identity."""
        pairs = " ".join(f"{name}={value}" for name, value in sorted(self.identity().items()))
        return (
            "# The local cluster's store (infra.local.store): root's boot reads with it.\n"
            f"[Service]\nEnvironment={pairs}\n"
        )

    def start(self) -> None:
        """Start the server, detached, and wait until its bucket is made."""
        self.directory.mkdir(parents=True, exist_ok=True)
        ready = self.directory / "ready"
        ready.unlink(missing_ok=True)
        with self.server_log.open("a") as out:
            process = subprocess.Popen(
                [*exec_prefix(self.namespace), sys.executable, "-m", "infra.local.store_server",
                 "--host", self.ip, "--port", str(self.port), "--bucket", BUCKET,
                 "--region", REGION, "--log", str(self.log), "--ready", str(ready)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        self.pid_file.write_text(str(process.pid))
        deadline = time.monotonic() + START_SECONDS
        while not ready.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise StoreError(f"the store did not start: {self._tail()}; see {self.server_log}")
            time.sleep(0.1)

    def stage(self, model: Path) -> list[str]:
        """The model's parts staged as ``lrc stage`` stages them (with the slice manifest),
        read from this machine's disk over the namespace's loopback; the staged URLs."""
        parts = part_paths(model)
        source = subprocess.Popen(
            [*exec_prefix(self.namespace), sys.executable, "-m", "http.server", "-b", "127.0.0.1",
             "-d", str(parts[0].resolve().parent), str(SOURCE_PORT)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            urls = [f"http://127.0.0.1:{SOURCE_PORT}/{part.name}" for part in parts]
            env = {
                **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
                **self.identity(),
            }
            command = [
                *exec_prefix(self.namespace), sys.executable, "-c", LRC_MAIN, "stage",
                "--region", REGION, "--bucket", BUCKET, "--prefix", PREFIX,
                "--endpoint", self.endpoint,
                *(arg for url in urls for arg in ("--url", url)),
            ]  # fmt: skip
            for _ in range(50):  # the source server listens within a moment
                staged = subprocess.run(
                    command, env=env, capture_output=True, text=True, timeout=STAGE_SECONDS,
                    check=False,
                )  # fmt: skip
                if staged.returncode == 0 or "Connection refused" not in staged.stderr:
                    break
                time.sleep(0.1)
        finally:
            source.terminate()
            source.wait(timeout=10)
        if staged.returncode != 0:
            raise StoreError(f"lrc stage into the local store failed: {staged.stderr.strip()}")
        for line in staged.stdout.splitlines():
            if line.startswith("urls: "):
                got: list[str] = json.loads(line.removeprefix("urls: "))
                return got
        raise StoreError(f"lrc stage printed no urls: {staged.stdout.strip()}")

    def requests(self) -> list[dict[str, Any]]:
        """Every request the store answered, in order."""
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]

    def pid(self) -> int | None:
        return tracked.read_pid(self.pid_file)

    def alive(self) -> bool:
        return tracked.alive(self.pid_file)

    def stop(self) -> None:
        tracked.stop(self.pid_file)

    def _tail(self) -> str:
        try:
            return " / ".join(self.server_log.read_text(errors="replace").strip().splitlines()[-3:])
        except FileNotFoundError:
            return "no output"
