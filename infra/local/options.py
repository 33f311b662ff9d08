"""What a local cluster is asked to be (``UpOptions``), checked before anything starts, and the
placement its nodes get: the same rule the cloud stacks use."""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.boot.node import BootConfigError, setting_of
from infra.boot.patches import patch_set, switches_off
from infra.core import layout, placement, sizing
from infra.core.limits import DEFAULT_DRAFT_MAX, Cloud
from infra.core.pins import LLAMA_CPP_COMMIT
from infra.models import ModelError
from infra.models.parts import part_paths
from infra.stack.settings import BY_KEY, ConfigError

DEFAULT_CIDR = "10.213.77.0/24"


LOOPBACK_CIDR = "127.0.0.0/24"


class LocalClusterError(RuntimeError):
    """The local cluster could not be brought up, read or taken down."""


class OptionError(LocalClusterError):
    """An option of ``up`` that cannot work, refused before anything starts (exit 2)."""


@dataclass(frozen=True)
class UpOptions:
    workers: int  # per serving group
    model: Path
    source: Path
    cache: Path
    cluster_id: str = "local"
    cidr: str = DEFAULT_CIDR
    commit: str = LLAMA_CPP_COMMIT
    model_sha256: str | None = None
    threads: int | None = None
    context_size: int = sizing.DEFAULT_CONTEXT
    slots: int = sizing.DEFAULT_SLOTS
    # Memory each node may use, as a VM's would be: by default an equal share of this machine's.
    node_memory_bytes: int | None = None
    # Extra llama-server flags for the main node (LLAMA_SERVER_ARGS), e.g. ("--no-repack",).
    server_args: tuple[str, ...] = ()
    worker_wait_seconds: int = 900
    netns: bool = True
    # Boot each node as a systemd-nspawn machine (needs netns, root and the node image).
    machines: bool = False
    # Machines: whose delivery of the user data each node gets (main first, repeated over the
    # workers), decoded as that cloud's datasource decodes it.
    deliveries: tuple[Cloud, ...] = ("aws",)
    # Serving groups (each a main node and ``workers`` workers) behind one balancer.
    replicas: int = 1
    # A generated API key that every request but /health must carry (llama-server's own check).
    api_key: bool = False
    # Spend guards, as a stack's (machines only: a node powers itself off): minutes idle, and
    # hours from each boot; 0: off. Fractions are allowed here, for trying them out.
    stop_after_idle_minutes: float = 0
    stop_after_hours: float = 0
    # llama.cpp patches turned off at run time, as a stack's llamaCppPatchesOff: numbers, or "all".
    patches_off: tuple[str, ...] = ()
    # The patches' own settings for every node, by name (e.g. GGML_RPC_INFLIGHT_MB=256); a patch
    # turned off keeps its switch.
    llama_env: tuple[tuple[str, str], ...] = ()
    # A draft model of the model's vocabulary (speculative decoding on the main node), and the
    # tokens it drafts a step; a stack's draftModel and draftMax.
    draft_model: Path | None = None
    draft_max: int = DEFAULT_DRAFT_MAX
    # Worker-local loading: each node fetches its own slice of the model (by the slice manifest,
    # written beside the model once) and a worker loads its layers from its own disk.
    worker_local: bool = False
    # The model staged (``lrc stage``) in the cluster's own S3 store on the VPC, and read from it
    # by each node as a stack's nodes read its bucket (machines only: ``infra.local.store``).
    staged: bool = False


def state_dir(cache: Path, cluster_id: str) -> Path:
    return cache / "clusters" / cluster_id


def can_use_netns() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("nft") is not None


# The stack setting each flag of `up` stands for: the flag's value is checked by the setting's
# own declaration (infra.stack.settings), and a node's boot setting refused names the flag
# (``boot_error``). The other flags are the local cluster's own, checked here.
SETTING_FLAGS = {
    "workerCount": "--workers",
    "replicas": "--replicas",
    "contextSize": "--context",
    "slots": "--slots",
    "draftMax": "--draft-max",
    "serverArgs": "--server-arg",
    "llamaCppPatchesOff": "--patches-off",
    "llamaCppCommit": "--commit",
    "stopAfterIdleMinutes": "--stop-after-idle-minutes",
    "stopAfterHours": "--stop-after-hours",
    "vpcCidr": "--cidr",
    "model.urls": "--model",
    "model.sha256": "--model-sha256",
    "draftModel.urls": "--draft-model",
}


def _declared(key: str, value: Any) -> None:
    """``value``, given by the flag for setting ``key``, as the setting's declaration checks it."""
    try:
        BY_KEY[key].read({key: value})
    except ConfigError as error:
        raise OptionError(f"{SETTING_FLAGS[key]}: {error.message}") from None


def boot_error(error: BootConfigError) -> OptionError:
    """A node's boot setting refused, naming the flag a user gives for it."""
    flag = SETTING_FLAGS.get(setting_of(error.setting))
    return OptionError(f"{flag}: {error}" if flag else str(error))


def _validate_settings(options: UpOptions) -> None:
    """The flags that stand for a stack's settings, checked by the settings' declarations."""
    for key, value in (
        ("workerCount", options.workers),
        ("replicas", options.replicas),
        ("contextSize", options.context_size),
        ("slots", options.slots),
        ("draftMax", options.draft_max),
        ("llamaCppCommit", options.commit),
        ("serverArgs", list(options.server_args)),
        ("llamaCppPatchesOff", list(options.patches_off)),
    ):
        _declared(key, value)
    try:
        switches_off(options.commit, options.patches_off)
    except ValueError as error:
        raise OptionError(f"--patches-off: {error}") from None
    guards = {"stopAfterIdleMinutes": options.stop_after_idle_minutes,
              "stopAfterHours": options.stop_after_hours}  # fmt: skip
    for guard, amount in guards.items():
        setting, flag = BY_KEY[guard], SETTING_FLAGS[guard]
        # Fractions, and limits below a stack's least, are for trying a guard out in seconds:
        # only the declared most holds here.
        if not 0 <= amount <= (setting.high or 0):
            raise OptionError(
                f"{flag} {amount:g}: give 0 (off) to {setting.high}, as a stack's {guard} "
                "(fractions too)"
            )
        if amount and not options.machines:
            raise OptionError(
                f"{flag}: a spend guard powers its node off, which only a machine has; add "
                "--machines (root and the node image)"
            )


def validate(options: UpOptions) -> ipaddress.IPv4Network:
    _validate_settings(options)
    if options.staged and not options.machines:
        raise OptionError(
            "--staged: the nodes read the staged model from the cluster's store as a stack's "
            "machines do; add --machines (root and the node image)"
        )
    if not re.fullmatch(r"[a-z0-9]{1,10}", options.cluster_id):
        raise OptionError(f"--id {options.cluster_id!r}: use 1-10 lowercase letters or digits")
    try:
        cidr = ipaddress.IPv4Network(options.cidr)
    except ValueError as error:
        raise OptionError(f"--cidr {options.cidr!r}: {error}") from None
    if not cidr.is_private or cidr.prefixlen > 27:
        raise OptionError(f"--cidr {options.cidr!r}: give a private IPv4 CIDR of /27 or larger")
    if options.netns:
        _check_groups_fit(options, cidr)
    for flag, count in (
        ("--threads", options.threads),
        ("--worker-wait", options.worker_wait_seconds),
    ):
        if count is not None and count < 1:
            raise OptionError(f"{flag} {count}: give 1 or more")
    known = {name for patch in patch_set(options.commit) for name, _ in patch.switch}
    for name, _ in options.llama_env:
        if name not in known:
            raise OptionError(
                f"{name}: not a setting of this commit's patches ({', '.join(sorted(known))})"
            )
    for part in part_paths(options.model):
        if not part.is_file():
            raise OptionError(f"--model: {part} does not exist")
    return cidr


def _check_groups_fit(options: UpOptions, cidr: ipaddress.IPv4Network) -> None:
    """Every group's nodes get an address of the private subnet (the broadcast address aside)."""
    subnet = layout.private_subnet(cidr)
    last = layout.node_ips(subnet, options.workers, group=options.replicas - 1)[-1]
    needed = int(ipaddress.IPv4Address(last)) - int(subnet.network_address) + 2
    if needed > subnet.num_addresses:
        prefix = 32 - (needed - 1).bit_length()
        raise OptionError(
            f"--cidr {options.cidr} --replicas {options.replicas}: the last group's nodes reach "
            f"{last}, beyond the private subnet {subnet}; give a /{prefix} or larger --cidr, or "
            "fewer --replicas or --workers"
        )


def machine_memory_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise LocalClusterError("cannot read this machine's memory from /proc/meminfo")


def plan_placement(options: UpOptions) -> placement.Placement:
    """The layers per node, from the model's GGUF header and each node's memory: the same rule
    the cloud stacks use."""
    from infra.models import gguf_header  # noqa: PLC0415 (the gguf package: the local extra)

    try:
        model = gguf_header.describe(options.model)
    except ModelError as error:
        raise OptionError(f"--model: {error.message}") from None
    nodes = options.workers + 1
    # By default every node of every group gets an equal share of this machine.
    memory = options.node_memory_bytes or machine_memory_bytes() // (nodes * options.replicas)
    usable = [sizing.usable_of(memory)] * nodes
    if options.draft_model is not None:
        # The draft lives on the main node (sizing.draft_bytes).
        try:
            draft = gguf_header.describe(options.draft_model)
        except ModelError as error:
            raise OptionError(f"--draft-model: {error.message}") from None
        usable[0] -= sizing.draft_bytes(draft, options.context_size, options.slots)
    shares = placement.place(model, options.context_size, options.slots, usable)
    if not shares.fits:
        worst = shares.worst
        raise OptionError(
            f"{model.name} does not fit {nodes} nodes of {memory / 1024**3:.1f} GiB: the "
            f"{worst.node} node would need {worst.need_bytes / 1024**3:.1f} GiB of "
            f"{worst.usable_bytes / 1024**3:.1f} usable; add --workers, raise --node-memory-gib, "
            f"or lower --context or --slots{_fewer_replicas(options)}"
        )
    return shares


def _fewer_replicas(options: UpOptions) -> str:
    if options.replicas > 1 and options.node_memory_bytes is None:
        return " (or fewer --replicas: every group's nodes share this machine's memory)"
    return ""


def build_prefix(cache: Path) -> Path:
    """Builds are native to this CPU (-DGGML_NATIVE=ON), so they are cached per CPU model."""
    flags = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith(("flags", "Features", "model name")):
                flags += line
    return cache / "llama.cpp" / hashlib.sha256(flags.encode()).hexdigest()[:10]
