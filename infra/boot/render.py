"""A node's cloud-config, built as data: the boot scripts and systemd units under ``cloud-init/``
become ``write_files`` entries and the node's settings one environment file. ``runcmd`` only
enables and starts two units: ``llama-rpc-boot.service`` (the build and, on the main node, the
model download; retried with a growing delay until it succeeds, and run again on every boot) and
the role's service, which starts after it; and (re)starts the package's node-exporter with the
drop-in that binds it to the node's private address.
"""

from __future__ import annotations

import hashlib
from pathlib import PurePosixPath
from typing import Any

from infra.boot.cloud_yaml import dump
from infra.boot.installed import installed_text
from infra.boot.node import VM_PATHS, NodeBoot, NodePaths, render_env_file
from infra.boot.patches import HASH_SUFFIX, patch_set
from infra.core import network_rules
from infra.core.limits import METRICS_PORT, Role
from infra.core.paths import OWN_FILES

CLOUD_INIT_DIR = OWN_FILES / "cloud-init"
SCRIPTS_DIR = CLOUD_INIT_DIR / "scripts"
UNITS_DIR = CLOUD_INIT_DIR / "systemd"

ROLE_UNIT: dict[Role, str] = {"worker": "llama-rpc-worker.service", "main": "llama-server.service"}
# Every node's boot (node-boot.sh) as a unit that retries; each role unit Requires= it.
BOOT_UNIT = "llama-rpc-boot.service"
# The exporter's own unit (the package's), and the drop-in that binds it to the node's private
# address behind the host firewall.
EXPORTER_UNIT = "prometheus-node-exporter.service"
EXPORTER_DROP_IN = "node-exporter.conf"
EXPORTER_DROP_IN_PATH = f"/etc/systemd/system/{EXPORTER_UNIT}.d/llama-rpc.conf"
# The metrics port's host firewall, applied by the exporter's unit before it listens (its own
# table: a packet must pass every table's input chain, so it adds to the workers' RPC rules).
METRICS_RULESET_PATH = "/etc/llama-rpc/metrics.nft"
METADATA_RULESET_PATH = "/etc/llama-rpc/metadata.nft"
METADATA_TABLE = "llama_rpc_metadata"
METRICS_TABLE = "llama_rpc_metrics"
SERVICE_USER = "llama"

# What a fresh Ubuntu 24.04 image needs to fetch and build llama.cpp. python3 is always there:
# cloud-init itself runs on it.
BUILD_PACKAGES = ("ca-certificates", "cmake", "curl", "g++", "git", "ninja-build")
# Every node: nftables for its host firewall, and the node metrics exporter (CPU per core,
# memory, network bytes per interface, disks) with the package's default collectors.
NODE_PACKAGES = ("nftables", "prometheus-node-exporter")
ROLE_PACKAGES: dict[Role, tuple[str, ...]] = {"worker": NODE_PACKAGES, "main": NODE_PACKAGES}
# A staged model is read from the object store with rclone (many ranged reads at once).
STAGED_PACKAGES = ("rclone",)
# The prebuilt llama.cpp is read the same way, and unpacked with tar's zstd.
PREBUILT_PACKAGES = ("rclone", "zstd")

# apt retries each download itself (cloud-init's `packages`, and install-packages.sh).
APT_CONF = 'Acquire::Retries "5";\n'


# The scripts each role runs: a node gets only its own, which keeps the user data well inside
# AWS's 16 KB (compressed) and Azure's 64 KB (uncompressed).
COMMON_SCRIPTS = ("lib.sh", "llama-rpc-status", "node-boot.sh", "install-packages.sh")
# Sourced by the others, never run: installed without the executable bit.
SOURCED_SCRIPTS = ("lib.sh", "supervise.sh", "fetch-staged.sh", "fetch-llama.sh", "store-remote.sh")
ROLE_SCRIPTS: dict[Role, tuple[str, ...]] = {
    "worker": (
        *COMMON_SCRIPTS,
        "build-llama.sh",
        "rpc-firewall.sh",
        "supervise.sh",
        "rpc-worker.sh",
    ),
    "main": (
        *COMMON_SCRIPTS,
        "llama_rpc_progress.py",
        "build-llama.sh",
        "fetch-model.sh",
        "model-disk.sh",
        "wait-workers.sh",
        "supervise.sh",
        "llama-server.sh",
        "llama-server-log",
    ),
}
# Scripts a node gets only with the feature that runs them: a staged model's download, the API
# key reader with a key kept
# in the cloud's secret store, the spend guard with a guard, and on Azure its deallocation.
STAGED_SCRIPT = "fetch-staged.sh"
# Worker-local loading: each node's own slice of the model.
SLICE_SCRIPTS = ("fetch-slice.sh", "llama-rpc-slice")
# Its main node's half, which a worker's user data (AWS's 16 KB) does not carry.
SLICE_MAIN_MODULE = "llama_rpc_slice_main.py"
# What both of them read the store with (store_remote).
STORE_SCRIPT = "store-remote.sh"
# The prebuilt llama.cpp's fetch (build-llama.sh sources it).
PREBUILT_SCRIPT = "fetch-llama.sh"
API_KEY_READER = "llama-rpc-secret"
# The reader's module for each kind of API_KEY_SOURCE (its cloud's secret store).
API_KEY_READER_MODULES = {
    "aws-ssm": "llama_rpc_secret_aws.py",
    "gcp-sm": "llama_rpc_secret_gcp.py",
    "azure-kv": "llama_rpc_secret_azure.py",
}
GUARD_SCRIPT = "llama-rpc-guard"
DEALLOCATE_SCRIPT = "llama-rpc-deallocate"
# The scripts' parent on a VM: the boot files' paths in a store are relative to it.
BOOT_ROOT = PurePosixPath(VM_PATHS.bin_dir).parent
# What a node with FILES_SOURCE still gets in its user data: the boot's steps up to the read of
# the rest (node-boot.sh), that reader, and the guard, which runs from each boot on its own.
FIRST_SCRIPTS = frozenset(
    {
        "lib.sh",
        "llama-rpc-status",
        "node-boot.sh",
        API_KEY_READER,
        *API_KEY_READER_MODULES.values(),
        GUARD_SCRIPT,
        DEALLOCATE_SCRIPT,
    }
)
GUARD_UNIT = "llama-rpc-guard.service"


def not_run(script: str) -> bool:
    """Sourced (shell) or imported (a Python module), never run: no executable bit."""
    return script in SOURCED_SCRIPTS or script.endswith(".py")


def node_scripts(boot: NodeBoot) -> tuple[str, ...]:
    """The scripts a node installs: its role's, and those of the features it uses."""
    scripts = ROLE_SCRIPTS[boot.role]
    if boot.slice_manifest:
        scripts += SLICE_SCRIPTS
        if boot.role == "main":
            scripts += (SLICE_MAIN_MODULE,)
    if boot.staged:
        scripts += (STAGED_SCRIPT,)
    if boot.prebuilt_store:
        scripts += (PREBUILT_SCRIPT,)
    if boot.staged or boot.prebuilt_store or boot.slices_from_store:
        scripts += (STORE_SCRIPT,)
    # The reader of the cloud's stores: for the API key, and for files beyond the user data.
    kinds = sorted({source.split(":", 1)[0] for source in (boot.api_key_source, boot.files_source)})
    if kinds != [""]:
        scripts += (API_KEY_READER, *(API_KEY_READER_MODULES[kind] for kind in kinds if kind))
    if boot.guarded:
        scripts += (GUARD_SCRIPT,)
        if boot.stop_by == "azure-deallocate":
            scripts += (DEALLOCATE_SCRIPT,)
    return scripts


def boot_files(boot: NodeBoot, paths: NodePaths = VM_PATHS) -> list[dict[str, str]]:
    """The scripts and the llama.cpp patch set a node installs, as ``write_files`` entries. The
    patches go to ``../patches/COMMIT/`` beside the scripts, where build-llama.sh reads them: the
    diff of each that changes the node's build, the hash of each other (``patches`` module)."""
    files = [
        {
            "path": f"{paths.bin_dir}/{script}",
            "permissions": "0644" if not_run(script) else "0755",
            "content": installed_text(SCRIPTS_DIR / script),
        }
        for script in node_scripts(boot)
    ]
    patches = PurePosixPath(paths.bin_dir).parent / "patches" / boot.llama_cpp_commit
    files += [
        # The diff alone, as the set's digest reads it: the text before it is for readers.
        {"path": str(patches / patch.name), "permissions": "0644", "content": patch.diff}
        if boot.role in patch.roles
        else {
            "path": str(patches / f"{patch.name}{HASH_SUFFIX}"),
            "permissions": "0644",
            "content": f"{patch.diff_sha256}\n",
        }
        for patch in patch_set(boot.llama_cpp_commit)
    ]
    return files


def fetched_files(boot: NodeBoot, paths: NodePaths = VM_PATHS) -> list[dict[str, str]]:
    """The boot files a node with ``files_source`` reads from there (``llama-rpc-secret files``,
    early in node-boot.sh): all but those the steps before it and the guard need."""
    if not boot.files_source:
        return []
    first = {f"{paths.bin_dir}/{name}" for name in FIRST_SCRIPTS}
    return [file for file in boot_files(boot, paths) if file["path"] not in first]


def files_digest(files: list[dict[str, str]], paths: NodePaths = VM_PATHS) -> str:
    """The fetched files' digest, as llama-rpc-secret checks what it wrote: each file's path
    under the scripts' parent, mode and content, in path order (sha256, 16 hex)."""
    root = PurePosixPath(paths.bin_dir).parent
    digest = hashlib.sha256()
    for file in sorted(files, key=lambda f: f["path"]):
        name = PurePosixPath(file["path"]).relative_to(root)
        digest.update(f"{name}\n{file['permissions']}\n".encode() + file["content"].encode())
    return digest.hexdigest()[:16]


def node_units(boot: NodeBoot) -> tuple[str, ...]:
    """The units a node enables: the boot, the role's service and the guard when it has one."""
    return (BOOT_UNIT, ROLE_UNIT[boot.role], *((GUARD_UNIT,) if boot.guarded else ()))


def cloud_config(boot: NodeBoot) -> dict[str, Any]:
    """The node's cloud-config as data (validated by ``cloud-init schema`` in the tests)."""
    paths = VM_PATHS
    units = node_units(boot)
    packages = sorted(
        set(BUILD_PACKAGES)
        | set(ROLE_PACKAGES[boot.role])
        | set(STAGED_PACKAGES if boot.staged or boot.slices_from_store else ())
        | set(PREBUILT_PACKAGES if boot.prebuilt_store else ())
    )
    fetched = fetched_files(boot, paths)
    files = [file for file in boot_files(boot, paths) if file not in fetched]
    files += [
        {
            "path": f"/etc/systemd/system/{name}",
            "permissions": "0644",
            "content": installed_text(UNITS_DIR / name),
        }
        for name in units
    ]
    files += [
        {
            "path": EXPORTER_DROP_IN_PATH,
            "permissions": "0644",
            "content": installed_text(UNITS_DIR / EXPORTER_DROP_IN),
        },
        {"path": METRICS_RULESET_PATH, "permissions": "0644", "content": metrics_ruleset(boot)},
        {"path": METADATA_RULESET_PATH, "permissions": "0644", "content": metadata_ruleset()},
    ]
    # Root's alone: systemd reads it (EnvironmentFile=) as root, and the services, which run as
    # the service user, get their settings from systemd and do not read it (lib.sh sources it
    # only when readable).
    env = boot.env(paths, service_user=SERVICE_USER) | {"LLAMA_PACKAGES": " ".join(packages)}
    if fetched:
        env["LLAMA_RPC_FILES"] = files_digest(fetched, paths)
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
        # ordered after cloud-final) would hold cloud-init, or deadlock it. The exporter is
        # restarted: on an image that had the package, it started before its drop-in was written.
        "runcmd": [
            ["systemctl", "daemon-reload"],
            ["systemctl", "enable", "--now", "--no-block", *units],
            ["systemctl", "enable", EXPORTER_UNIT],
            ["systemctl", "restart", "--no-block", EXPORTER_UNIT],
        ],
    }
    return config


def metrics_ruleset(boot: NodeBoot) -> str:
    """The nftables table that keeps the metrics port as narrow as RPC: a worker admits its own
    group's main node (who may reach its RPC port), which reads it; a main node reads its own
    and admits no one. The node itself always. Replaced whole each time."""
    rules = ['iif "lo" accept']
    if boot.role == "worker" and boot.rpc_allowed_sources:
        sources = ", ".join(boot.rpc_allowed_sources)
        rules.append(f"tcp dport {METRICS_PORT} ip saddr {{ {sources} }} accept")
    rules.append(f"tcp dport {METRICS_PORT} drop")
    chain = "".join(f"    {rule}\n" for rule in rules)
    return (
        f"table inet {METRICS_TABLE}\n"
        f"delete table inet {METRICS_TABLE}\n"
        f"table inet {METRICS_TABLE} {{\n"
        "  chain input {\n"
        "    type filter hook input priority filter; policy accept;\n"
        f"{chain}"
        "  }\n"
        "}\n"
    )


def metadata_ruleset() -> str:
    """The nftables table that lets only root reach the clouds' metadata services, where a
    node's credentials come from (node-boot.sh applies it before any service starts): code
    running as the service user cannot take the node's token. DNS and NTP, which GCP and Azure
    serve at those addresses to their unprivileged daemons, still pass."""
    v4 = ", ".join(
        sorted(str(a) for a in network_rules.METADATA_SERVICE_ADDRESSES if a.version == 4)
    )
    v6 = ", ".join(
        sorted(str(a) for a in network_rules.METADATA_SERVICE_ADDRESSES if a.version == 6)
    )
    return (
        f"table inet {METADATA_TABLE}\n"
        f"delete table inet {METADATA_TABLE}\n"
        f"table inet {METADATA_TABLE} {{\n"
        "  chain output {\n"
        "    type filter hook output priority filter; policy accept;\n"
        "    meta skuid 0 accept\n"
        "    meta l4proto { tcp, udp } th dport 53 accept\n"
        "    udp dport 123 accept\n"
        f"    ip daddr {{ {v4} }} reject\n"
        f"    ip6 daddr {{ {v6} }} reject\n"
        "  }\n"
        "}\n"
    )


def render(boot: NodeBoot) -> str:
    """The node's user data: ``#cloud-config`` and the body as YAML."""
    return "#cloud-config\n" + dump(cloud_config(boot))
