"""The local cluster: the cloud's boot on this machine, one network namespace per node.

``up`` lays out the nodes as a stack would (main .10, workers .11, .12, … of the VPC CIDR) and
makes each node's settings from the same ``NodeBoot`` the cloud-config is rendered from. Then:

- machines (``machines=True``): each node boots as a ``systemd-nspawn`` machine whose cloud-init
  reads the node's exact user data, and whose systemd runs the units a VM runs
  (``infra.local.machines``);
- processes (the fallback): a detached supervisor runs the boot scripts in each namespace and
  keeps the services running, reading the same unit files (``infra.local.supervisor``).

With ``replicas`` above 1 there are that many serving groups, each a main node and its workers
at the group's addresses (``infra.core.layout.node_ips``), each group's workers taking RPC from
their own main only, behind HAProxy at the balancer's address (``infra.local.balancer``).

Without root the nodes share loopback (127.0.0.10, .11, …) and no firewall is applied; ``up``
says so.
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

from infra.boot import (
    BOOT_UNIT,
    ROLE_UNIT,
    SCRIPTS_DIR,
    VM_PATHS,
    NodeBoot,
    NodePaths,
    deliver,
    render,
    render_env_file,
)
from infra.core import layout, outputs, placement, sizing
from infra.core.limits import MAX_REPLICAS, MAX_WORKERS, RPC_PORT, SERVER_PORT, Cloud, Role
from infra.core.pins import LLAMA_CPP_COMMIT
from infra.local import image as node_image
from infra.local.balancer import Balancer, BalancerError, find_haproxy
from infra.local.machines import MODELS_MOUNT, SOURCE_MOUNT, Machine, MachineError
from infra.local.netns import VpcNetwork, exec_prefix, namespace_pids
from infra.models import ModelError
from infra.models.parts import part_paths

DEFAULT_CIDR = "10.213.77.0/24"
LOOPBACK_CIDR = "127.0.0.0/24"
BALANCER_NODE = "lb"  # the balancer's namespace and link name (``lrc-<id>-lb``)


class LocalClusterError(RuntimeError):
    """The local cluster could not be brought up, read or taken down."""


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
    if not 1 <= options.replicas <= MAX_REPLICAS:
        raise LocalClusterError(
            f"--replicas {options.replicas}: give 1 to {MAX_REPLICAS} serving groups"
        )
    if options.netns:
        _check_groups_fit(options, cidr)
    for part in part_paths(options.model):
        if not part.is_file():
            raise LocalClusterError(f"--model: {part} does not exist")
    if options.context_size < 1 or not 1 <= options.slots <= sizing.MAX_SLOTS:
        raise LocalClusterError(
            f"--context {options.context_size} --slots {options.slots}: give a positive context "
            f"and 1 to {sizing.MAX_SLOTS} slots"
        )
    return cidr


def _check_groups_fit(options: UpOptions, cidr: ipaddress.IPv4Network) -> None:
    """Every group's nodes get an address of the private subnet (the broadcast address aside)."""
    subnet = layout.private_subnet(cidr)
    last = layout.node_ips(subnet, options.workers, group=options.replicas - 1)[-1]
    needed = int(ipaddress.IPv4Address(last)) - int(subnet.network_address) + 2
    if needed > subnet.num_addresses:
        prefix = 32 - (needed - 1).bit_length()
        raise LocalClusterError(
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
        raise LocalClusterError(f"--model: {error.message}") from None
    nodes = options.workers + 1
    # By default every node of every group gets an equal share of this machine.
    memory = options.node_memory_bytes or machine_memory_bytes() // (nodes * options.replicas)
    shares = placement.place(
        model, options.context_size, options.slots, [sizing.usable_of(memory)] * nodes
    )
    if not shares.fits:
        worst = shares.worst
        raise LocalClusterError(
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


def node_short_name(index: int, group: int) -> str:
    """A node's short name (it names the node's namespace and its link on the bridge, at most 15
    characters): ``main``, ``w1``, ``w2``, … in the first group, ``r2main``, ``r2w1``, … in the
    second, and so on."""
    prefix = "" if group == 0 else f"r{group + 1}"
    return prefix + ("main" if index == 0 else f"w{index}")


@dataclass(frozen=True)
class _Slot:
    """Where a node goes: its serving group, short name and address, and its group's addresses
    (main first)."""

    group: int
    name: str
    ip: str
    group_ips: list[str]

    @property
    def role(self) -> Role:
        return "main" if self.ip == self.group_ips[0] else "worker"


def _node_layout(cidr: ipaddress.IPv4Network, workers: int, replicas: int = 1) -> list[_Slot]:
    """Every node of every serving group, group by group, main first, as the stacks lay them
    out (``infra.core.layout``)."""
    subnet = layout.private_subnet(cidr)
    slots = []
    for group in range(replicas):
        ips = layout.node_ips(subnet, workers, group=group)
        slots += [_Slot(group, node_short_name(i, group), ip, ips) for i, ip in enumerate(ips)]
    return slots


def _balancer_entry(
    cidr: ipaddress.IPv4Network, network: VpcNetwork | None, state: Path
) -> dict[str, Any]:
    """The balancer's place: its namespace (None on loopback), its address, its directory."""
    return {
        "name": BALANCER_NODE,
        "ip": layout.balancer_ip(layout.private_subnet(cidr)),
        "namespace": network.namespace(BALANCER_NODE) if network else None,
        "directory": str(state / "balancer"),
    }


def up(
    options: UpOptions,
    *,
    timeout: float = 1800,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Bring the cluster up and wait until every group's main node serves (and, with replicas,
    the balancer sees them all); return the output contract.

    On any failure everything started is taken down again and the node's error is raised.
    """
    cidr = _validate(options)
    if not options.netns:
        cidr = ipaddress.IPv4Network(LOOPBACK_CIDR)
    image = _machine_image(options) if options.machines else None
    if options.replicas > 1:
        _find_haproxy()  # before anything is made: its absence is an install step
    state = state_dir(options.cache, options.cluster_id)
    if (state / "cluster.json").exists():
        if _running(state, load_spec(options.cache, options.cluster_id)):
            raise LocalClusterError(
                f"cluster {options.cluster_id!r} is already up; run `python -m infra.local down"
                f"{'' if options.cluster_id == 'local' else ' --id ' + options.cluster_id}` first"
            )
        down(options.cache, options.cluster_id)
    shares = plan_placement(options)
    slots = _node_layout(cidr, options.workers, options.replicas)
    on_bridge = [(s.name, s.ip) for s in slots]
    if options.replicas > 1:
        on_bridge.append((BALANCER_NODE, layout.balancer_ip(layout.private_subnet(cidr))))
    network = (
        VpcNetwork(
            options.cluster_id,
            cidr,
            tuple(name for name, _ in on_bridge),
            tuple(ip for _, ip in on_bridge),
        )
        if options.netns
        else None
    )
    balancer = _balancer_entry(cidr, network, state) if options.replicas > 1 else None
    state.mkdir(parents=True, exist_ok=True)
    nodes = [
        _node_entry(options, slot, _Where(slot.ip, cidr, slot.group_ips, shares), state=state,
                    network=network, image=image, index=index)
        for index, slot in enumerate(slots)
    ]  # fmt: skip
    spec = {
        "id": options.cluster_id,
        "netns": options.netns,
        "machines": image is not None,
        "cidr": str(cidr),
        "commit": options.commit,
        "rpc_port": RPC_PORT,
        "server_port": SERVER_PORT,
        "context_size": options.context_size,
        "slots": options.slots,
        "placement": shares.to_json(),
        "nodes": nodes,
        "replicas": options.replicas,
        "balancer": balancer,
    }
    (state / "cluster.json").write_text(json.dumps(spec, indent=2))
    try:
        if network:
            network.create()
        if balancer:
            _start_balancer(spec)
        if image:
            _build_on_host(options, state, progress)
            for node in nodes:
                machine_of(node).start()
        else:
            _start_supervisor(state)
        _wait_until_serving(state, spec, timeout, progress)
    except BaseException:
        # Nothing keeps running, but the logs and status files stay until the next `up` or
        # `down`: they say what went wrong.
        stop(spec, state)
        raise
    return contract(spec)


def _find_haproxy() -> str:
    try:
        return find_haproxy()
    except BalancerError as error:
        raise LocalClusterError(str(error)) from None


def balancer_of(spec: dict[str, Any]) -> Balancer | None:
    """The cluster's balancer (None with one serving group)."""
    entry = spec.get("balancer")
    if not entry:
        return None
    return Balancer(namespace=entry["namespace"], directory=Path(entry["directory"]))


def _start_balancer(spec: dict[str, Any]) -> None:
    balancer = balancer_of(spec)
    if balancer is None:
        return
    try:
        balancer.write_config(
            listen_ip=spec["balancer"]["ip"],
            port=spec["server_port"],
            mains=[main["ip"] for main in main_nodes(spec)],
            server_port=spec["server_port"],
        )
        balancer.start()
    except BalancerError as error:
        raise LocalClusterError(str(error)) from None


def main_nodes(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Each serving group's main node, in group order."""
    return [n for n in spec["nodes"] if n["role"] == "main"]


def group_nodes(spec: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """Each serving group's nodes (its main first), in group order."""
    groups: list[list[dict[str, Any]]] = [[] for _ in range(spec.get("replicas", 1))]
    for node in spec["nodes"]:
        groups[node.get("group", 0)].append(node)
    return groups


def _node_entry(
    options: UpOptions,
    slot: _Slot,
    where: _Where,
    *,
    state: Path,
    network: VpcNetwork | None,
    image: node_image.Image | None,
    index: int,
) -> dict[str, Any]:
    """A node's entry in the cluster's spec, its boot settings written where it reads them."""
    node_dir = state / "nodes" / slot.name
    node_dir.mkdir(parents=True, exist_ok=True)
    node: dict[str, Any] = {
        "name": slot.name,
        "role": slot.role,
        "ip": slot.ip,
        "namespace": network.namespace(slot.name) if network else None,
        "group": slot.group,
    }
    if image and network:
        # The machine's own view: the host's source and model appear at fixed paths.
        boot = _node_boot(
            options,
            slot.role,
            where,
            source=SOURCE_MOUNT,
            model_urls=tuple(f"file://{MODELS_MOUNT}/{p.name}" for p in part_paths(options.model)),
        )
        return node | _machine_node(
            options, node, image_root=image.root, network=network, boot=boot, index=index
        )
    boot = _node_boot(options, slot.role, where)
    env_file = node_dir / "node.env"
    paths = NodePaths(
        bin_dir=str(SCRIPTS_DIR),
        env_file=str(env_file),
        data_dir=str(node_dir),
        prefix=str(build_prefix(options.cache)),
    )
    env_file.write_text(render_env_file(boot.env(paths)))
    return node | {"env_file": str(env_file), "status_file": str(node_dir / "status.json")}


@dataclass(frozen=True)
class _Where:
    """A node's place in the cluster: its address, the network, its serving group's addresses
    (main first), the layers."""

    ip: str
    cidr: ipaddress.IPv4Network
    ips: list[str]
    shares: placement.Placement


def _node_boot(
    options: UpOptions,
    role: Role,
    where: _Where,
    *,
    source: str | None = None,
    model_urls: tuple[str, ...] | None = None,
) -> NodeBoot:
    ips, shares = where.ips, where.shares
    return NodeBoot(
        role=role,
        node_ip=where.ip,
        llama_cpp_commit=options.commit,
        llama_cpp_source=source or str(options.source),
        rpc_allowed_sources=(f"{ips[0]}/32",),
        cluster_cidr=str(where.cidr),
        rpc_workers=tuple(ips[1:]),
        model_urls=model_urls or tuple(p.resolve().as_uri() for p in part_paths(options.model)),
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


def _machine_image(options: UpOptions) -> node_image.Image:
    if not options.netns:
        raise LocalClusterError("machines need network namespaces (root, iproute2, nftables)")
    image = node_image.cached(options.cache)
    if image is None:
        raise LocalClusterError(
            "the node image is not built; run `python -m infra.local image` (once: it fetches "
            f"Debian {node_image.RELEASE}'s packages)"
        )
    return image


def _machine_node(
    options: UpOptions,
    node: dict[str, Any],
    *,
    image_root: Path,
    network: VpcNetwork,
    boot: NodeBoot,
    index: int,
) -> dict[str, Any]:
    """A machine node: its user data rendered and delivered as its cloud would, decoded as that
    cloud's datasource decodes it, in the machine's NoCloud seed."""
    parts = part_paths(options.model)
    cloud = options.deliveries[index % len(options.deliveries)]
    delivery = deliver(render(boot), cloud)
    received = delivery.received()
    host_bin = build_prefix(options.cache) / options.commit / "bin"
    machine = Machine(
        name=network.namespace(node["name"]),
        namespace=network.namespace(node["name"]),
        directory=state_dir(options.cache, options.cluster_id) / "nodes" / node["name"],
        image_root=image_root,
        binds=(
            (str(options.source.resolve()), SOURCE_MOUNT),
            (str(parts[0].resolve().parent), MODELS_MOUNT),
            (str(host_bin), f"{VM_PATHS.prefix}/{options.commit}/bin"),
        ),
    )
    (machine.directory / "user-data").write_bytes(received)
    machine.seed(received, instance_id=f"{machine.name}-{os.urandom(4).hex()}")
    return {
        "machine": machine.name,
        "directory": str(machine.directory),
        "image_root": str(image_root),
        "binds": [list(b) for b in machine.binds],
        "delivery": {"cloud": cloud, "field": delivery.field, "gzipped": delivery.gzipped},
        "status_file": str(machine.status_file),
    }


def machine_of(node: dict[str, Any]) -> Machine:
    return Machine(
        name=node["machine"],
        namespace=node["namespace"],
        directory=Path(node["directory"]),
        image_root=Path(node["image_root"]),
        binds=tuple((host, inside) for host, inside in node["binds"]),
    )


def _build_on_host(options: UpOptions, state: Path, progress: Callable[[str], None] | None) -> None:
    """The pinned build, once on this machine; every machine gets it read-only, where its own
    build step finds it complete and skips it."""
    if progress:
        progress("llama.cpp build on this machine (skipped when it is there)")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LLAMA_RPC_ENV_FILE": "/dev/null",
        "LLAMA_ROLE": "all",
        "LLAMA_CPP_COMMIT": options.commit,
        "LLAMA_CPP_SOURCE": str(options.source),
        "LLAMA_PREFIX": str(build_prefix(options.cache)),
        "LLAMA_DATA_DIR": str(state / "host-build"),
    }
    result = subprocess.run(
        ["bash", str(SCRIPTS_DIR / "build-llama.sh")],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise LocalClusterError(f"llama.cpp build on this machine failed: {result.stderr.strip()}")


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


def _running(state: Path, spec: dict[str, Any]) -> bool:
    """Whether anything of the cluster still runs: a machine, or the supervisor."""
    if spec.get("machines"):
        return any(machine_of(node).running() for node in spec["nodes"])
    return _supervisor_alive(state)


def stopped_machines(spec: dict[str, Any]) -> list[str]:
    if not spec.get("machines"):
        return []
    return [n["name"] for n in spec["nodes"] if not machine_of(n).running()]


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
                f"node {name} failed: {status.get('last_error')}{_log_tail(state, spec, name)}"
            )
        waiting = [
            m["name"] for m in main_nodes(spec) if statuses[m["name"]].get("phase") != "serving"
        ]
        if not waiting and _balancer_sees_every_group(spec):
            return
        if spec.get("machines"):
            if stopped := stopped_machines(spec):
                node = machine_of(node_of(spec, stopped[0]))
                raise LocalClusterError(
                    f"machine {node.name} stopped; see {node.console_log}"
                    f"{_log_tail(state, spec, stopped[0])}"
                )
        elif not _supervisor_alive(state):
            raise LocalClusterError(
                f"the supervisor stopped; see {state / 'supervisor.log'}"
                f"{_log_tail(state, spec, 'main')}"
            )
        balancer = balancer_of(spec)
        if balancer and not balancer.alive():
            tail = balancer.log.read_text(errors="replace").strip().splitlines()[-5:]
            raise LocalClusterError(f"the balancer stopped: {' / '.join(tail)}; see {balancer.log}")
        if time.monotonic() > deadline:
            if not waiting and balancer:
                raise LocalClusterError(
                    f"every group serves, but the balancer's health checks do not pass after "
                    f"{timeout:.0f}s ({_balancer_states(balancer)}); see {balancer.log}"
                )
            raise LocalClusterError(
                f"not serving after {timeout:.0f}s ({phases})"
                f"{_log_tail(state, spec, (waiting or ['main'])[0])}"
            )
        time.sleep(0.5)


def _balancer_sees_every_group(spec: dict[str, Any]) -> bool:
    """True with one group; else once every group passes the balancer's health check, so that
    requests through it reach every group."""
    balancer = balancer_of(spec)
    if balancer is None:
        return True
    try:
        states = balancer.group_states()
    except BalancerError:
        return False
    return bool(states) and all(state == "UP" for state in states.values())


def _balancer_states(balancer: Balancer) -> str:
    try:
        return ", ".join(f"{name}: {state}" for name, state in balancer.group_states().items())
    except BalancerError as error:
        return str(error)


def _log_tail(state: Path, spec: dict[str, Any], node: str, lines: int = 15) -> str:
    """The last lines of a node's log, for an error message; the log is kept until `down`."""
    if spec.get("machines"):
        entry = node_of(spec, node)
        argv = machine_of(entry).journal_argv(
            ["-n", str(lines), "-u", BOOT_UNIT, "-u", ROLE_UNIT[entry["role"]]]
        )
        shown = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
        return (
            f"\nits journal (kept until `python -m infra.local down`; "
            f"`python -m infra.local journal {node}` shows it all):\n{shown.rstrip()}"
        )
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
    """The same output contract as a cloud stack: the top-level node keys are the first serving
    group's, ``groups`` holds every group's, in order."""
    groups = [_group_outputs(spec, nodes) for nodes in group_nodes(spec)]
    first = groups[0]
    machines = spec.get("machines", False)
    balancer = spec.get("balancer")
    balancer_url = f"http://{balancer['ip']}:{spec['server_port']}" if balancer else None
    return {
        outputs.CLOUD: "local",
        outputs.REGION: "netns" if spec["netns"] else "loopback",
        outputs.INSTANCE_TYPE: "machine" if machines else "process",
        outputs.WORKER_COUNT: len(first[outputs.WORKER_PRIVATE_IPS]),
        **first,
        outputs.CONNECT_COMMAND: from_entry(spec, f"curl {entry_url(spec)}/v1/models"),
        outputs.HOURLY_COST_USD: 0.0,
        outputs.LLAMA_CPP_COMMIT: spec["commit"],
        outputs.REPLICAS: len(groups),
        outputs.BALANCER_URL: balancer_url,
        outputs.GROUPS: groups,
        outputs.METRICS_DOCUMENT: None,
        outputs.ZONE: None,
        outputs.RESOURCE_GROUP: None,
    }


def _group_outputs(spec: dict[str, Any], nodes: list[dict[str, Any]]) -> dict[str, Any]:
    main, *workers = nodes
    worker_ips = [w["ip"] for w in workers]
    return {
        outputs.MAIN_PRIVATE_IP: main["ip"],
        outputs.WORKER_PRIVATE_IPS: worker_ips,
        outputs.RPC_SERVERS: outputs.rpc_servers(worker_ips, spec["rpc_port"]),
        outputs.LLAMA_SERVER_URL: f"http://{main['ip']}:{spec['server_port']}",
        outputs.MAIN_INSTANCE_ID: main["namespace"] or main["name"],
        outputs.WORKER_INSTANCE_IDS: [w["namespace"] or w["name"] for w in workers],
    }


def entry_url(spec: dict[str, Any]) -> str:
    """Where requests go: the balancer with replicas, else the (first) main node."""
    entry = spec.get("balancer") or main_nodes(spec)[0]
    return f"http://{entry['ip']}:{spec['server_port']}"


def from_entry(spec: dict[str, Any], command: str) -> str:
    """``command`` as run from where the cluster's entry point is reachable. This machine has a
    route to the first group's main node only; the balancer, like a cloud's internal one, is
    reached from inside the VPC: from the first main node, as a cloud's tunnel reaches it."""
    if not spec.get("balancer") or not spec["netns"]:
        return command
    on = "" if spec["id"] == "local" else f" --id {spec['id']}"
    return f"python -m infra.local exec{on} main -- {command}"


def network_of(spec: dict[str, Any]) -> VpcNetwork | None:
    if not spec["netns"]:
        return None
    nodes = [*spec["nodes"], *([spec["balancer"]] if spec.get("balancer") else [])]
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
    spec = load_spec(cache, cluster_id)
    stop(spec, state)
    if spec.get("machines"):
        # Never delete through a machine's root that is still mounted.
        mounted = [n["name"] for n in spec["nodes"] if machine_of(n).root.is_mount()]
        if mounted:
            raise LocalClusterError(
                f"the roots of {', '.join(mounted)} are still mounted; run down again"
            )
    shutil.rmtree(state, ignore_errors=True)
    return True


def stop(spec: dict[str, Any], state: Path) -> None:
    """Stop every node and remove the namespaces; the logs and status files stay."""
    if spec.get("machines"):
        for node in spec["nodes"]:
            machine_of(node).stop()
    balancer = balancer_of(spec)
    if balancer:
        balancer.stop()
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


def node_of(spec: dict[str, Any], name: str) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = spec["nodes"]
    for node in nodes:
        if name in (node["name"], node.get("machine"), node["namespace"]):
            return node
    names = ", ".join(n["name"] for n in spec["nodes"])
    raise LocalClusterError(f"no node {name!r} in cluster {spec['id']!r}; its nodes: {names}")


def exec_argv(spec: dict[str, Any], name: str, command: list[str]) -> list[str]:
    """The host command line that runs ``command`` on a node, as root: inside its machine, or in
    its network namespace (the local equivalent of SSM Session Manager or IAP)."""
    node = node_of(spec, name)
    if spec.get("machines"):
        try:
            return machine_of(node).exec_argv(command)
        except MachineError as error:
            raise LocalClusterError(str(error)) from None
    if not node["namespace"]:
        raise LocalClusterError(
            "the nodes share this machine's loopback: run the command here, or bring the cluster "
            "up with namespaces (as root) or --machines"
        )
    return [*exec_prefix(node["namespace"]), *command]


def journal_argv(spec: dict[str, Any], name: str, args: list[str]) -> list[str]:
    """journalctl reading a machine's journal from the host, running or stopped."""
    if not spec.get("machines"):
        raise LocalClusterError(
            f"only machines keep a journal; this cluster's logs are in "
            f"{Path(spec['nodes'][0]['status_file']).parents[2] / 'logs'}"
        )
    return machine_of(node_of(spec, name)).journal_argv(args)


def reboot(spec: dict[str, Any], name: str) -> None:
    """Stop a machine and start it again: the same disk, a fresh boot, as a VM's reboot."""
    if not spec.get("machines"):
        raise LocalClusterError("reboot is for machines (`up --machines`)")
    machine = machine_of(node_of(spec, name))
    try:
        machine.stop()
        machine.start()
    except MachineError as error:
        raise LocalClusterError(str(error)) from None
