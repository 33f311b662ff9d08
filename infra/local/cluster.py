"""The local cluster: the cloud's boot scripts on this machine, one network namespace per node.

``up`` lays out the nodes as a stack would (main .10, workers .11, .12, … of the VPC CIDR), writes
each node's environment file from the same ``NodeBoot`` the cloud-config is rendered from, and
starts a detached supervisor that boots every node and keeps its service running. Without root
the nodes share loopback (127.0.0.10, .11, …) and no firewall is applied; ``up`` says so.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra import layout, outputs, placement, sizing
from infra.boot import SCRIPTS_DIR, NodeBoot, NodePaths, render_env_file
from infra.local.netns import VpcNetwork, namespace_pids
from infra.models import ModelError
from infra.models.parts import part_paths
from infra.pins import LLAMA_CPP_COMMIT
from infra.types import MAX_WORKERS, RPC_PORT, SERVER_PORT, Role

DEFAULT_CIDR = "10.213.77.0/24"
LOOPBACK_CIDR = "127.0.0.0/24"


class LocalClusterError(RuntimeError):
    """The local cluster could not be brought up, read or taken down."""


@dataclass(frozen=True)
class UpOptions:
    workers: int
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


def state_dir(cache: Path, cluster_id: str) -> Path:
    return cache / "clusters" / cluster_id


def can_use_netns() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("nft") is not None


def _validate(options: UpOptions) -> ipaddress.IPv4Network:
    if not 0 <= options.workers <= MAX_WORKERS:
        raise LocalClusterError(
            f"--workers {options.workers}: give 0 to {MAX_WORKERS} workers (llama.cpp's RPC "
            "limit; 0 serves the model from the main node alone)"
        )
    if not re.fullmatch(r"[a-z0-9]{1,10}", options.cluster_id):
        raise LocalClusterError(
            f"--id {options.cluster_id!r}: use 1-10 lowercase letters or digits"
        )
    try:
        cidr = ipaddress.IPv4Network(options.cidr)
    except ValueError as error:
        raise LocalClusterError(f"--cidr {options.cidr!r}: {error}") from None
    if not cidr.is_private or cidr.prefixlen > 27:
        raise LocalClusterError(
            f"--cidr {options.cidr!r}: give a private IPv4 CIDR of /27 or larger"
        )
    for part in part_paths(options.model):
        if not part.is_file():
            raise LocalClusterError(f"--model: {part} does not exist")
    if options.context_size < 1 or not 1 <= options.slots <= sizing.MAX_SLOTS:
        raise LocalClusterError(
            f"--context {options.context_size} --slots {options.slots}: give a positive context "
            f"and 1 to {sizing.MAX_SLOTS} slots"
        )
    return cidr


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
        reason = str(error).removeprefix(f"{error.setting}: ")
        raise LocalClusterError(f"--model: {reason}") from None
    nodes = options.workers + 1
    memory = options.node_memory_bytes or machine_memory_bytes() // nodes
    shares = placement.place(
        model, options.context_size, options.slots, [sizing.usable_of(memory)] * nodes
    )
    if not shares.fits:
        worst = shares.worst
        raise LocalClusterError(
            f"{model.name} does not fit {nodes} nodes of {memory / 1024**3:.1f} GiB: the "
            f"{worst.node} node would need {worst.need_bytes / 1024**3:.1f} GiB of "
            f"{worst.usable_bytes / 1024**3:.1f} usable; add --workers, raise --node-memory-gib, "
            "or lower --context or --slots"
        )
    return shares


def _node_layout(cidr: ipaddress.IPv4Network, workers: int) -> tuple[list[str], list[str]]:
    """Node names (short: they name network namespaces) and addresses, as the stacks lay
    them out (``infra.layout``)."""
    names = ["main", *(f"w{i}" for i in range(1, workers + 1))]
    return names, layout.node_ips(layout.private_subnet(cidr), workers)


def up(
    options: UpOptions,
    *,
    timeout: float = 1800,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Bring the cluster up and wait until the main node serves; return the output contract.

    On any failure everything started is taken down again and the node's error is raised.
    """
    cidr = _validate(options)
    if not options.netns:
        cidr = ipaddress.IPv4Network(LOOPBACK_CIDR)
    state = state_dir(options.cache, options.cluster_id)
    if (state / "cluster.json").exists():
        if _supervisor_alive(state):
            raise LocalClusterError(
                f"cluster {options.cluster_id!r} is already up; run `python -m infra.local down"
                f"{'' if options.cluster_id == 'local' else ' --id ' + options.cluster_id}` first"
            )
        down(options.cache, options.cluster_id)
    shares = plan_placement(options)
    names, ips = _node_layout(cidr, options.workers)
    network = (
        VpcNetwork(options.cluster_id, cidr, tuple(names), tuple(ips)) if options.netns else None
    )
    state.mkdir(parents=True, exist_ok=True)
    nodes = []
    for name, ip in zip(names, ips, strict=True):
        role: Role = "main" if name == "main" else "worker"
        boot = NodeBoot(
            role=role,
            node_ip=ip,
            llama_cpp_commit=options.commit,
            llama_cpp_source=str(options.source),
            rpc_allowed_sources=(f"{ips[0]}/32",),
            cluster_cidr=str(cidr),
            rpc_workers=tuple(ips[1:]),
            model_urls=tuple(p.resolve().as_uri() for p in part_paths(options.model)),
            model_sha256=(options.model_sha256,) if options.model_sha256 else (),
            context_size=options.context_size,
            slots=options.slots,
            gpu_layers=shares.gpu_layers,
            tensor_split=shares.tensor_split,
            worker_wait_seconds=options.worker_wait_seconds,
            threads=options.threads,
            extra_env={"LLAMA_SERVER_ARGS": " ".join(options.server_args)}
            if role == "main" and options.server_args
            else {},
        )
        node_dir = state / "nodes" / name
        node_dir.mkdir(parents=True, exist_ok=True)
        env_file = node_dir / "node.env"
        paths = NodePaths(
            bin_dir=str(SCRIPTS_DIR),
            env_file=str(env_file),
            data_dir=str(node_dir),
            prefix=str(build_prefix(options.cache)),
        )
        env_file.write_text(render_env_file(boot.env(paths)))
        nodes.append(
            {
                "name": name,
                "role": role,
                "ip": ip,
                "namespace": network.namespace(name) if network else None,
                "env_file": str(env_file),
                "status_file": str(node_dir / "status.json"),
            }
        )
    spec = {
        "id": options.cluster_id,
        "netns": options.netns,
        "cidr": str(cidr),
        "commit": options.commit,
        "rpc_port": RPC_PORT,
        "server_port": SERVER_PORT,
        "context_size": options.context_size,
        "slots": options.slots,
        "placement": shares.to_json(),
        "nodes": nodes,
    }
    (state / "cluster.json").write_text(json.dumps(spec, indent=2))
    try:
        if network:
            network.create()
        _start_supervisor(state)
        _wait_until_serving(state, spec, timeout, progress)
    except BaseException:
        # Nothing keeps running, but the logs and status files stay until the next `up` or
        # `down`: they say what went wrong.
        stop(spec, state)
        raise
    return contract(spec)


def build_prefix(cache: Path) -> Path:
    """Builds are native to this CPU (-DGGML_NATIVE=ON), so they are cached per CPU model."""
    flags = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith(("flags", "Features", "model name")):
                flags += line
    return cache / "llama.cpp" / hashlib.sha256(flags.encode()).hexdigest()[:10]


def _start_supervisor(state: Path) -> None:
    log = (state / "supervisor.log").open("a")
    process = subprocess.Popen(
        [sys.executable, "-m", "infra.local", "supervise", str(state)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    (state / "supervisor.pid").write_text(str(process.pid))


def _supervisor_pid(state: Path) -> int | None:
    try:
        return int((state / "supervisor.pid").read_text())
    except (FileNotFoundError, ValueError):
        return None


def _supervisor_alive(state: Path) -> bool:
    pid = _supervisor_pid(state)
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (our own child, exited) is not alive.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def read_status(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    statuses = {}
    for node in spec["nodes"]:
        try:
            statuses[node["name"]] = json.loads(Path(node["status_file"]).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            statuses[node["name"]] = {}
    return statuses


def _wait_until_serving(
    state: Path,
    spec: dict[str, Any],
    timeout: float,
    progress: Callable[[str], None] | None,
) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        statuses = read_status(spec)
        phases = ", ".join(f"{n}: {s.get('phase', 'starting')}" for n, s in statuses.items())
        if progress and phases != last:
            progress(phases)
            last = phases
        failed = {n: s for n, s in statuses.items() if s.get("phase") == "failed"}
        if failed:
            name, status = next(iter(failed.items()))
            raise LocalClusterError(
                f"node {name} failed: {status.get('last_error')}{_log_tail(state, name)}"
            )
        if statuses["main"].get("phase") == "serving":
            return
        if not _supervisor_alive(state):
            raise LocalClusterError(
                f"the supervisor stopped; see {state / 'supervisor.log'}{_log_tail(state, 'main')}"
            )
        if time.monotonic() > deadline:
            raise LocalClusterError(
                f"not serving after {timeout:.0f}s ({phases}){_log_tail(state, 'main')}"
            )
        time.sleep(0.5)


def _log_tail(state: Path, node: str, lines: int = 15) -> str:
    """The last lines of a node's log, for an error message; the log is kept until `down`."""
    log = state / "logs" / f"{node}.log"
    try:
        tail = log.read_text(errors="replace").splitlines()[-lines:]
    except FileNotFoundError:
        return f" (no log at {log})"
    shown = "\n".join(f"  {line}" for line in tail)
    return f"\nlast {len(tail)} lines of {log} (kept until `python -m infra.local down`):\n{shown}"


def load_spec(cache: Path, cluster_id: str) -> dict[str, Any]:
    path = state_dir(cache, cluster_id) / "cluster.json"
    try:
        spec: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise LocalClusterError(
            f"no local cluster {cluster_id!r} is up; start one with `python -m infra.local up`"
        ) from None
    return spec


def contract(spec: dict[str, Any]) -> dict[str, Any]:
    """The same output contract as a cloud stack."""
    main, *workers = spec["nodes"]
    worker_ips = [w["ip"] for w in workers]
    url = f"http://{main['ip']}:{spec['server_port']}"
    return {
        outputs.CLOUD: "local",
        outputs.REGION: "netns" if spec["netns"] else "loopback",
        outputs.INSTANCE_TYPE: "process",
        outputs.WORKER_COUNT: len(workers),
        outputs.MAIN_PRIVATE_IP: main["ip"],
        outputs.WORKER_PRIVATE_IPS: worker_ips,
        outputs.RPC_SERVERS: outputs.rpc_servers(worker_ips, spec["rpc_port"]),
        outputs.LLAMA_SERVER_URL: url,
        outputs.MAIN_INSTANCE_ID: main["namespace"] or "main",
        outputs.WORKER_INSTANCE_IDS: [w["namespace"] or w["name"] for w in workers],
        outputs.CONNECT_COMMAND: f"curl {url}/v1/models",
        outputs.HOURLY_COST_USD: 0.0,
        outputs.LLAMA_CPP_COMMIT: spec["commit"],
    }


def network_of(spec: dict[str, Any]) -> VpcNetwork | None:
    if not spec["netns"]:
        return None
    nodes = spec["nodes"]
    return VpcNetwork(
        spec["id"],
        ipaddress.IPv4Network(spec["cidr"]),
        tuple(n["name"] for n in nodes),
        tuple(n["ip"] for n in nodes),
    )


def down(cache: Path, cluster_id: str) -> bool:
    """Stop every node and remove the namespaces and state; True if there was a cluster."""
    state = state_dir(cache, cluster_id)
    if not (state / "cluster.json").exists():
        return False
    stop(load_spec(cache, cluster_id), state)
    shutil.rmtree(state, ignore_errors=True)
    return True


def stop(spec: dict[str, Any], state: Path) -> None:
    """Stop every node and remove the namespaces; the logs and status files stay."""
    pid = _supervisor_pid(state)
    if pid is not None and _supervisor_alive(state):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _supervisor_alive(state) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _supervisor_alive(state):
            os.killpg(pid, signal.SIGKILL)
    network = network_of(spec)
    if network:
        # Anything still inside a namespace (a supervisor killed hard) goes with it.
        for ns in network.namespaces():
            for leftover in namespace_pids(ns):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(leftover, signal.SIGKILL)
        network.destroy()
