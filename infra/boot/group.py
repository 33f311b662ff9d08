"""One serving group's boot settings, from a description of the group that names no cloud.

The stack (``ClusterConfig.boots``) and the local cluster (``infra.local.nodes``) each describe
their groups as a ``ServingGroup``, and ``group_boots`` makes every node's ``NodeBoot`` from it:
a new boot setting travels this one way to both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from infra.boot.node import GUARD_INTERVAL_SECONDS, LOAD_TIMEOUT_SECONDS, NodeBoot
from infra.boot.patches import switches_off
from infra.core import sizing
from infra.core.limits import DEFAULT_DRAFT_MAX, RPC_PORT, SERVER_PORT, Role
from infra.core.pins import LLAMA_CPP_COMMIT, LLAMA_CPP_REPO
from infra.core.placement import Placement


@dataclass(frozen=True)
class ServingGroup:
    """A main node and its workers: where they are, what they serve and how, and what their
    cloud (or this machine) adds."""

    ips: tuple[str, ...]  # the main node's address, then each worker's, in order
    cluster_cidr: str  # the network every node is in, and the only one a worker reaches
    placement: Placement
    model_urls: tuple[str, ...]
    context_size: int
    slots: int
    model_sha256: tuple[str, ...] = ()
    llama_cpp_commit: str = LLAMA_CPP_COMMIT
    llama_cpp_source: str = LLAMA_CPP_REPO
    rpc_port: int = RPC_PORT
    server_port: int = SERVER_PORT
    draft_urls: tuple[str, ...] = ()
    draft_sha256: tuple[str, ...] = ()
    draft_max: int = DEFAULT_DRAFT_MAX
    draft_min: int = 0
    model_alias: str = ""
    server_args: tuple[str, ...] = ()
    api_key_file: str = ""
    api_key_source: str = ""
    # Spend guards, as a user gives them (0: off); fractions of a minute are for trying them out.
    stop_after_idle_minutes: float = 0
    stop_after_hours: float = 0
    # llama.cpp patches turned off at run time ("all", or numbers), and the patches' own
    # variables by name.
    patches_off: tuple[str, ...] = ()
    patch_settings: tuple[tuple[str, str], ...] = ()
    threads: int | None = None
    worker_wait_seconds: int = 900
    # Worker-local loading: the slice manifest of the staged model (``lrc stage``); "": off.
    slice_manifest: str = ""
    # The bytes the main node downloads (the model and its draft): how long a boot may take to
    # serve before a spend guard counts the group's nodes idle (``sizing.serve_deadline_seconds``).
    fetched_bytes: int = 0
    # The main node's boot files beyond its user data (a worker, which has no cloud identity,
    # gets every file in its user data).
    files_source: str = ""
    # What the cloud adds: how a guard stops a node, the addresses a worker still reaches, where
    # llama-server listens, the region of the cloud's store.
    stop_by: str = "poweroff"
    platform_addresses: tuple[str, ...] = ()
    server_listen: str | None = None
    model_store_region: str = ""
    # Another S3 API than the cloud's own ("": the cloud's): the local cluster's store.
    model_store_endpoint: str = ""
    # The prebuilt llama.cpp's store prefix ("": every node builds) and the nodes' target
    # (``infra.boot.prebuilt``).
    prebuilt_store: str = ""
    prebuilt_target: str = ""
    # How the main node downloads and keeps the model (0: the scripts' own way).
    writeback_bytes: int = 0
    download_jobs: int = 0
    model_read_ahead_kb: int = 0
    model_disk_gb: int = 0
    model_disk_model: str = ""


def group_boots(group: ServingGroup) -> list[NodeBoot]:
    """The group's main node's and then each of its workers' boot settings: its workers take
    RPC from its own main node only."""
    main_ip, *worker_ips = group.ips
    shares = group.placement.shares
    sliced = group.slice_manifest
    workers = [
        _node(
            group,
            "worker",
            ip,
            rpc_allowed_sources=(f"{main_ip}/32",),
            platform_addresses=group.platform_addresses,
            slice_manifest=sliced,
            slice_sources=group.model_urls if sliced else (),
            slice_first_layer=shares[n].first_layer if sliced else 0,
            slice_layers=shares[n].layers if sliced else 0,
            slice_output=int(bool(sliced) and n == len(worker_ips)),
        )
        for n, ip in enumerate(worker_ips, start=1)
    ]
    main = _node(
        group,
        "main",
        main_ip,
        files_source=group.files_source,
        rpc_workers=tuple(worker_ips),
        model_urls=group.model_urls,
        model_sha256=group.model_sha256,
        server_port=group.server_port,
        context_size=group.context_size,
        slots=group.slots,
        gpu_layers=group.placement.gpu_layers,
        tensor_split=group.placement.tensor_split,
        worker_weight_bytes=group.placement.worker_weight_bytes,
        model_alias=group.model_alias,
        worker_wait_seconds=group.worker_wait_seconds,
        server_args=group.server_args,
        api_key_file=group.api_key_file,
        api_key_source=group.api_key_source,
        server_listen=group.server_listen,
        writeback_bytes=group.writeback_bytes,
        download_jobs=group.download_jobs,
        model_read_ahead_kb=group.model_read_ahead_kb,
        model_disk_gb=group.model_disk_gb,
        model_disk_model=group.model_disk_model,
        draft_urls=group.draft_urls,
        draft_sha256=group.draft_sha256,
        draft_max=group.draft_max,
        draft_min=group.draft_min,
        slice_manifest=sliced,
        slice_layers=shares[0].layers if sliced else 0,
    )
    return [main, *workers]


def _node(group: ServingGroup, role: Role, ip: str, **of_role: Any) -> NodeBoot:
    """A node of the group: what every node of it has, and what its role's nodes have."""
    idle = math.ceil(group.stop_after_idle_minutes * 60)
    deadline = math.ceil(group.stop_after_hours * 3600)
    return NodeBoot(
        role=role,
        node_ip=ip,
        llama_cpp_commit=group.llama_cpp_commit,
        llama_cpp_source=group.llama_cpp_source,
        rpc_port=group.rpc_port,
        threads=group.threads,
        cluster_cidr=group.cluster_cidr,
        stop_after_idle_seconds=idle,
        stop_after_seconds=deadline,
        stop_by=group.stop_by,
        guard_interval_seconds=guard_interval(idle, deadline),
        serve_deadline_seconds=sizing.serve_deadline_seconds(
            group.fetched_bytes, group.worker_wait_seconds, LOAD_TIMEOUT_SECONDS
        ),
        model_store_region=group.model_store_region,
        model_store_endpoint=group.model_store_endpoint,
        prebuilt_store=group.prebuilt_store,
        prebuilt_target=group.prebuilt_target,
        extra_env=dict(group.patch_settings)
        | switches_off(group.llama_cpp_commit, group.patches_off),
        **of_role,
    )


def guard_interval(idle_seconds: int, deadline_seconds: int) -> int:
    """How often a node's spend guard looks: a tenth of its shortest limit, from a second up to
    ``GUARD_INTERVAL_SECONDS`` (which a stack's limits, of minutes and hours, always reach), so
    that limits tried out in seconds stop the node within about a second of their end."""
    limits = [seconds for seconds in (idle_seconds, deadline_seconds) if seconds > 0]
    if not limits:
        return GUARD_INTERVAL_SECONDS
    return max(1, min(GUARD_INTERVAL_SECONDS, min(limits) // 10))
