"""Cloud-init for the cluster's nodes: one cloud-config body per role, delivered per cloud.

The body is built as data: the boot scripts and systemd units under ``cloud-init/`` become
``write_files`` entries and the node's settings one environment file. ``runcmd`` only enables and
starts two units: ``llama-rpc-boot.service`` (the build and, on the main node, the model download;
retried with a growing delay until it succeeds, and run again on every boot) and the role's
service, which starts after it. Only the delivery differs between clouds (AWS user data, GCP
metadata ``user-data``, Azure base64 ``customData``), each within its size limit.

    python -m infra.boot --role worker|main [--cloud aws|gcp|azure]
"""

from __future__ import annotations

import argparse
import base64
import gzip
import ipaddress
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import yaml

from infra.outputs import rpc_servers
from infra.pins import LLAMA_CPP_COMMIT, LLAMA_CPP_REPO, RPC_PORT, SERVER_PORT, is_full_commit

Role = Literal["main", "worker"]
Cloud = Literal["aws", "gcp", "azure"]
ROLES: tuple[Role, ...] = get_args(Role)
CLOUDS: tuple[Cloud, ...] = get_args(Cloud)

CLOUD_INIT_DIR = Path(__file__).resolve().parent.parent / "cloud-init"
SCRIPTS_DIR = CLOUD_INIT_DIR / "scripts"
UNITS_DIR = CLOUD_INIT_DIR / "systemd"

ROLE_UNIT: dict[Role, str] = {"worker": "llama-rpc-worker.service", "main": "llama-server.service"}
# Every node's boot (node-boot.sh) as a unit that retries; each role unit Requires= it.
BOOT_UNIT = "llama-rpc-boot.service"
SERVICE_USER = "llama"
DATA_LABEL = "llama-data"

# What a fresh Ubuntu 24.04 image needs to fetch and build llama.cpp; nftables for the workers'
# host firewall. python3 is always there: cloud-init itself runs on it.
BUILD_PACKAGES = ("ca-certificates", "cmake", "curl", "g++", "git", "ninja-build")
ROLE_PACKAGES: dict[Role, tuple[str, ...]] = {"worker": ("nftables",), "main": ()}

# apt retries each download itself (cloud-init's `packages`, and install-packages.sh).
APT_CONF = 'Acquire::Retries "5";\n'

# Size limits of each cloud's user-data channel, in bytes of the delivered value.
USER_DATA_LIMITS: dict[Cloud, int] = {
    "aws": 16 * 1024,  # raw user data, before the API's base64
    "gcp": 256 * 1024,  # one metadata value
    "azure": 65_535,  # the base64 customData string
}

_SHA256 = re.compile(r"[0-9a-f]{64}")
_SAFE_ENV_VALUE = re.compile(r"[^'\n\r\\]*")


class BootConfigError(ValueError):
    """A node setting that cannot work; the message names the setting and the fix.

    ``setting`` is the ``NodeBoot`` field at fault (``"model_urls"``, ``"node_ip"``, ...), or
    ``"user_data"`` / ``"cloud"`` for what ``deliver`` refuses, so that callers can name their
    own configuration key.
    """

    def __init__(self, message: str, *, setting: str) -> None:
        super().__init__(message)
        self.setting = setting


@dataclass(frozen=True)
class NodePaths:
    """Where a node keeps its scripts, settings, data and llama.cpp builds."""

    bin_dir: str
    env_file: str
    data_dir: str
    prefix: str


VM_PATHS = NodePaths(
    bin_dir="/opt/llama-rpc/bin",
    env_file="/etc/llama-rpc/node.env",
    data_dir="/var/lib/llama-rpc",
    prefix="/opt/llama.cpp",
)


@dataclass(frozen=True)
class NodeBoot:
    """Everything one node needs to boot into its role.

    Workers need ``rpc_allowed_sources`` (who may reach the RPC port: the main node) and may
    give ``cluster_cidr`` (the only network they reach once serving); the main
    node needs ``rpc_workers`` (worker IPs, in order), ``model_urls``, and with workers the
    placement flags ``gpu_layers`` and ``tensor_split``.
    """

    role: Role
    node_ip: str
    llama_cpp_commit: str = LLAMA_CPP_COMMIT
    llama_cpp_source: str = LLAMA_CPP_REPO
    rpc_port: int = RPC_PORT
    rpc_allowed_sources: tuple[str, ...] = ()
    # A worker's egress once serving: this network (and the cloud's link-local services) only.
    # Empty: egress is left alone.
    cluster_cidr: str = ""
    rpc_workers: tuple[str, ...] = ()
    model_urls: tuple[str, ...] = ()
    model_sha256: tuple[str, ...] = ()
    server_port: int = SERVER_PORT
    context_size: int = 4096
    slots: int = 1
    # The layer placement as llama-server's flags (``infra.placement``): --n-gpu-layers and
    # --tensor-split, one value per worker. Needed with workers, meaningless without.
    gpu_layers: int = 0
    tensor_split: tuple[int, ...] = ()
    worker_wait_seconds: int = 900
    # How long llama-server may take to load the model before the node gives up on that start
    # (and systemd tries again): a hung load fails the node instead of "loading" for ever.
    load_timeout_seconds: int = 3600
    threads: int | None = None
    data_device: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def rpc_servers(self) -> str:
        """The main node's ``--rpc`` list: ``ip:port,ip:port`` in worker order."""
        return rpc_servers(list(self.rpc_workers), self.rpc_port)

    def env(
        self, paths: NodePaths = VM_PATHS, *, service_user: str | None = None
    ) -> dict[str, str]:
        """The node's environment file, as read by the boot scripts and the systemd units."""
        env = {
            "LLAMA_ROLE": self.role,
            "LLAMA_NODE_IP": self.node_ip,
            "LLAMA_CPP_COMMIT": self.llama_cpp_commit,
            "LLAMA_CPP_SOURCE": self.llama_cpp_source,
            "LLAMA_PREFIX": paths.prefix,
            "LLAMA_DATA_DIR": paths.data_dir,
            "LLAMA_STATUS_FILE": f"{paths.data_dir}/status.json",
            "RPC_PORT": str(self.rpc_port),
        }
        if service_user:
            env["LLAMA_SERVICE_USER"] = service_user
        if self.threads:
            env["LLAMA_THREADS"] = str(self.threads)
        if self.role == "worker":
            env["RPC_ALLOWED_SOURCES"] = " ".join(self.rpc_allowed_sources)
            env["CLUSTER_CIDR"] = self.cluster_cidr
        else:
            env |= {
                "RPC_WORKERS": self.rpc_servers,
                "MODEL_URLS": " ".join(self.model_urls),
                "MODEL_SHA256": " ".join(self.model_sha256),
                "SERVER_PORT": str(self.server_port),
                "CONTEXT_SIZE": str(self.context_size),
                "SLOTS": str(self.slots),
                "LLAMA_GPU_LAYERS": str(self.gpu_layers) if self.rpc_workers else "",
                "LLAMA_TENSOR_SPLIT": ",".join(map(str, self.tensor_split)),
                "WORKER_WAIT_SECONDS": str(self.worker_wait_seconds),
                "LOAD_TIMEOUT_SECONDS": str(self.load_timeout_seconds),
            }
        env |= self.extra_env
        for name, value in env.items():
            if not _SAFE_ENV_VALUE.fullmatch(value):
                raise BootConfigError(
                    f"{name}={value!r}: quotes, backslashes and line breaks are not allowed in "
                    "node settings; remove them (URL-encode them in a model URL)",
                    setting="extra_env"
                    if name in self.extra_env
                    else _ENV_FIELDS.get(name, "paths"),
                )
        return env


# The NodeBoot field behind each environment variable, for errors; the rest come from NodePaths.
_ENV_FIELDS = {
    "LLAMA_ROLE": "role",
    "LLAMA_NODE_IP": "node_ip",
    "LLAMA_CPP_COMMIT": "llama_cpp_commit",
    "LLAMA_CPP_SOURCE": "llama_cpp_source",
    "RPC_PORT": "rpc_port",
    "LLAMA_SERVICE_USER": "service_user",
    "LLAMA_THREADS": "threads",
    "RPC_ALLOWED_SOURCES": "rpc_allowed_sources",
    "CLUSTER_CIDR": "cluster_cidr",
    "RPC_WORKERS": "rpc_workers",
    "MODEL_URLS": "model_urls",
    "MODEL_SHA256": "model_sha256",
    "SERVER_PORT": "server_port",
    "CONTEXT_SIZE": "context_size",
    "SLOTS": "slots",
    "LLAMA_GPU_LAYERS": "gpu_layers",
    "LLAMA_TENSOR_SPLIT": "tensor_split",
    "WORKER_WAIT_SECONDS": "worker_wait_seconds",
    "LOAD_TIMEOUT_SECONDS": "load_timeout_seconds",
}


def model_file_name(url: str) -> str:
    """The file name a model part is saved as: the URL's last path segment without its query or
    fragment (lib.sh's model_name is the same rule)."""
    return re.split(r"[?#]", url, maxsplit=1)[0].rsplit("/", 1)[-1]


def _validate(boot: NodeBoot) -> None:
    if boot.role not in ROLES:
        raise BootConfigError(
            f"role {boot.role!r} is not one of {', '.join(ROLES)}", setting="role"
        )
    _private_host("node_ip", boot.node_ip)
    if not is_full_commit(boot.llama_cpp_commit):
        raise BootConfigError(
            f"llama_cpp_commit {boot.llama_cpp_commit!r} is not a full 40-character commit hash; "
            "pin an exact llama.cpp commit (branches and tags move)",
            setting="llama_cpp_commit",
        )
    for name in ("rpc_port", "server_port"):
        port = getattr(boot, name)
        if not 1 <= port <= 65535:
            raise BootConfigError(
                f"{name} {port} is outside 1-65535; choose a valid TCP port", setting=name
            )
    for name in ("context_size", "slots", "worker_wait_seconds", "load_timeout_seconds"):
        value = getattr(boot, name)
        if value < 1:
            raise BootConfigError(f"{name} {value} must be at least 1", setting=name)
    if boot.role == "worker":
        _validate_worker(boot)
    else:
        _validate_main(boot)


def _validate_worker(boot: NodeBoot) -> None:
    if not boot.rpc_allowed_sources:
        raise BootConfigError(
            "rpc_allowed_sources is empty: a worker must know who may reach its RPC port; "
            "give the main node's address (for example 10.0.1.10/32)",
            setting="rpc_allowed_sources",
        )
    for source in boot.rpc_allowed_sources:
        try:
            network = ipaddress.ip_network(source, strict=False)
        except ValueError:
            raise BootConfigError(
                f"rpc_allowed_sources entry {source!r} is not an address or CIDR",
                setting="rpc_allowed_sources",
            ) from None
        if not network.is_private or network.prefixlen == 0:
            raise BootConfigError(
                f"rpc_allowed_sources entry {source!r} is not a private network; the RPC port "
                "has no authentication, so only the cluster's own addresses may reach it",
                setting="rpc_allowed_sources",
            )
    if boot.cluster_cidr:
        try:
            cluster = ipaddress.IPv4Network(boot.cluster_cidr)
        except ValueError:
            raise BootConfigError(
                f"cluster_cidr {boot.cluster_cidr!r} is not an IPv4 network",
                setting="cluster_cidr",
            ) from None
        if not cluster.is_private or ipaddress.ip_address(boot.node_ip) not in cluster:
            raise BootConfigError(
                f"cluster_cidr {boot.cluster_cidr} must be the private network that holds "
                f"the node ({boot.node_ip})",
                setting="cluster_cidr",
            )


def _validate_main(boot: NodeBoot) -> None:
    # No workers: the model fits on the main node, which serves it alone without RPC.
    for ip in boot.rpc_workers:
        _private_host("rpc_workers", ip)
    if len(set(boot.rpc_workers)) != len(boot.rpc_workers):
        raise BootConfigError(
            f"rpc_workers lists an address twice: {', '.join(boot.rpc_workers)}",
            setting="rpc_workers",
        )
    if boot.rpc_workers and (
        len(boot.tensor_split) != len(boot.rpc_workers)
        or min(boot.tensor_split) < 0
        or boot.gpu_layers != sum(boot.tensor_split)
        or boot.gpu_layers < 1
    ):
        raise BootConfigError(
            f"tensor_split {boot.tensor_split} and gpu_layers {boot.gpu_layers} do not place "
            f"layers on {len(boot.rpc_workers)} workers: give one count per worker (the last "
            "with the output head) and their sum; infra.placement computes them",
            setting="tensor_split",
        )
    if not boot.model_urls:
        raise BootConfigError(
            "model_urls is empty: give the model's GGUF URL "
            "(every part, in order, for a split GGUF)",
            setting="model_urls",
        )
    # Each part is saved under its URL's file name: a URL without one, or two parts with the
    # same one, would leave a model that looks complete and is not.
    saved_as: dict[str, str] = {}
    for url in boot.model_urls:
        if not re.match(r"(https?|file)://[^\s]+$", url):
            raise BootConfigError(
                f"model URL {url!r} is not an http(s):// or file:// URL without spaces",
                setting="model_urls",
            )
        name = model_file_name(url)
        if name in ("", ".", ".."):
            raise BootConfigError(
                f"model URL {url!r} does not end in a file name; give the URL of the GGUF file "
                "itself (of every part, for a split GGUF)",
                setting="model_urls",
            )
        if name in saved_as:
            raise BootConfigError(
                f"model URLs {saved_as[name]!r} and {url!r} both save as {name!r}; every part "
                "needs a file name of its own",
                setting="model_urls",
            )
        saved_as[name] = url
    if boot.model_sha256:
        if len(boot.model_sha256) != len(boot.model_urls):
            raise BootConfigError(
                f"model_sha256 has {len(boot.model_sha256)} checksums for "
                f"{len(boot.model_urls)} model URLs; give one per part, in order, or none",
                setting="model_sha256",
            )
        for digest in boot.model_sha256:
            if not _SHA256.fullmatch(digest):
                raise BootConfigError(
                    f"model_sha256 entry {digest!r} is not a 64-character lowercase hex digest",
                    setting="model_sha256",
                )


def _private_host(name: str, text: str) -> None:
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        raise BootConfigError(f"{name} {text!r} is not an IP address", setting=name) from None
    if ip.is_unspecified or not ip.is_private:
        raise BootConfigError(
            f"{name} {text!r} must be a private address of the cluster network: the RPC port "
            "has no authentication and must never listen publicly or on every interface",
            setting=name,
        )


def render_env_file(env: dict[str, str]) -> str:
    """An environment file that both bash ``source`` and systemd's EnvironmentFile= read."""
    return "".join(f"{name}='{value}'\n" for name, value in env.items())


# The scripts each role runs: a node gets only its own, which keeps the user data well inside
# AWS's 16 KB (compressed) and Azure's 64 KB (uncompressed).
COMMON_SCRIPTS = ("lib.sh", "llama-rpc-status", "node-boot.sh", "install-packages.sh")
ROLE_SCRIPTS: dict[Role, tuple[str, ...]] = {
    "worker": (*COMMON_SCRIPTS, "build-llama.sh", "rpc-firewall.sh", "rpc-worker.sh"),
    "main": (
        *COMMON_SCRIPTS,
        "build-llama.sh",
        "fetch-model.sh",
        "wait-workers.sh",
        "llama-server.sh",
        "llama-server-log",
    ),
}


def _script_files(role: Role) -> list[Path]:
    return [SCRIPTS_DIR / name for name in ROLE_SCRIPTS[role]]


def cloud_config(boot: NodeBoot) -> dict[str, Any]:
    """The node's cloud-config as data (validated by ``cloud-init schema`` in the tests)."""
    paths = VM_PATHS
    unit = ROLE_UNIT[boot.role]
    packages = sorted(BUILD_PACKAGES + ROLE_PACKAGES[boot.role])
    files: list[dict[str, str]] = [
        {
            "path": f"{paths.bin_dir}/{script.name}",
            "permissions": "0644" if script.suffix == ".sh" and script.stem == "lib" else "0755",
            "content": script.read_text(),
        }
        for script in _script_files(boot.role)
    ]
    files += [
        {
            "path": f"/etc/systemd/system/{name}",
            "permissions": "0644",
            "content": (UNITS_DIR / name).read_text(),
        }
        for name in (BOOT_UNIT, unit)
    ]
    # Root's alone: systemd reads it (EnvironmentFile=) as root, and the services, which run as
    # the service user, get their settings from systemd and do not read it (lib.sh sources it
    # only when readable).
    env = boot.env(paths, service_user=SERVICE_USER) | {"LLAMA_PACKAGES": " ".join(packages)}
    files.append(
        {
            "path": paths.env_file,
            "owner": "root:root",
            "permissions": "0600",
            "content": render_env_file(env),
        }
    )
    config: dict[str, Any] = {
        "package_update": True,
        "packages": packages,
        "apt": {"conf": APT_CONF},
        "users": [
            "default",
            {
                "name": SERVICE_USER,
                "system": True,
                "shell": "/usr/sbin/nologin",
                "homedir": paths.data_dir,
                "no_create_home": True,
                "lock_passwd": True,
            },
        ],
        "write_files": files,
        # The boot and the service run under systemd, which retries the boot until it succeeds
        # and starts the service after it, now and on every boot. --no-block: runcmd runs inside
        # cloud-final.service, and waiting here for a boot that takes hours (or for units
        # ordered after cloud-final) would hold cloud-init, or deadlock it.
        "runcmd": [
            ["systemctl", "daemon-reload"],
            ["systemctl", "enable", "--now", "--no-block", BOOT_UNIT, unit],
        ],
    }
    if boot.data_device:
        config["fs_setup"] = [
            {
                "label": DATA_LABEL,
                "filesystem": "ext4",
                "device": boot.data_device,
                "partition": "none",
            }
        ]
        config["mounts"] = [
            [f"LABEL={DATA_LABEL}", paths.data_dir, "ext4", "defaults,nofail,noatime", "0", "2"]
        ]
    return config


class _LiteralDumper(yaml.SafeDumper):
    """Dumps multi-line strings as literal blocks, so the scripts stay readable in user data."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_LiteralDumper.add_representer(str, _represent_str)


def render(boot: NodeBoot) -> str:
    """The node's user data: ``#cloud-config`` and the body as YAML."""
    body = yaml.dump(cloud_config(boot), Dumper=_LiteralDumper, sort_keys=False, width=100)
    return "#cloud-config\n" + body


@dataclass(frozen=True)
class Delivery:
    """User data as one cloud takes it."""

    cloud: Cloud
    field: str  # the provider argument that carries it
    value: str
    gzipped: bool
    size: int  # bytes that count against the limit
    limit: int


def deliver(user_data: str, cloud: Cloud) -> Delivery:
    """Package user data for a cloud; gzip it (cloud-init unpacks it) only when it must."""
    if cloud not in CLOUDS:
        raise BootConfigError(f"cloud {cloud!r} is not one of {', '.join(CLOUDS)}", setting="cloud")
    limit = USER_DATA_LIMITS[cloud]
    raw = user_data.encode()
    for gzipped in (False, True):
        # mtime=0 keeps the bytes stable, so an unchanged config never replaces a node.
        payload = gzip.compress(raw, mtime=0) if gzipped else raw
        if cloud == "aws":
            if gzipped:
                value, size, name = (
                    base64.b64encode(payload).decode(),
                    len(payload),
                    "user_data_base64",
                )
            else:
                value, size, name = user_data, len(payload), "user_data"
        elif cloud == "gcp":
            if gzipped:  # GCP metadata values are text: gzip does not help there
                break
            value, size, name = user_data, len(payload), "metadata.user-data"
        else:
            value = base64.b64encode(payload).decode()
            size, name = len(value), "custom_data"
        if size <= limit:
            return Delivery(cloud, name, value, gzipped, size, limit)
    raise BootConfigError(
        f"the {cloud} user data is {len(raw):,} bytes, over the {limit:,}-byte limit even "
        "compressed; shorten the model URL list or the extra settings",
        setting="user_data",
    )


def example(role: Role) -> NodeBoot:
    """A node of the reference layout: main .10 and workers .11, .12 of 10.0.1.0/24, serving an
    80-layer model whose layers the three nodes share (27 + 27 + 26, and the output head)."""
    if role == "worker":
        return NodeBoot(role="worker", node_ip="10.0.1.11", rpc_allowed_sources=("10.0.1.10/32",))
    return NodeBoot(
        role="main",
        node_ip="10.0.1.10",
        rpc_workers=("10.0.1.11", "10.0.1.12"),
        model_urls=("https://huggingface.co/example/model-GGUF/resolve/main/model-Q4_0.gguf",),
        gpu_layers=54,
        tensor_split=(27, 27),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m infra.boot", description="Print the cloud-config a node boots with."
    )
    parser.add_argument("--role", choices=ROLES, required=True)
    parser.add_argument(
        "--cloud", choices=CLOUDS, help="also report how this cloud receives it, and its size"
    )
    parser.add_argument(
        "--encoded", action="store_true", help="print the delivered value itself (with --cloud)"
    )
    args = parser.parse_args(argv)
    user_data = render(example(args.role))
    if args.cloud:
        delivery = deliver(user_data, args.cloud)
        print(
            f"# {args.cloud}: {delivery.field}, {'gzip, ' if delivery.gzipped else ''}"
            f"{delivery.size:,} of {delivery.limit:,} bytes",
            file=sys.stderr,
        )
        if args.encoded:
            print(delivery.value)
            return 0
    sys.stdout.write(user_data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
