"""The local cluster: the cloud's boot on this machine, one network namespace per node.

``up`` lays out the nodes as a stack would (main .10, workers .11, .12, … of the VPC CIDR) and
makes each node's settings from the same ``NodeBoot`` the cloud-config is rendered from
(``infra.local.nodes``). Then:

- machines (``machines=True``): each node boots as a ``systemd-nspawn`` machine whose cloud-init
  reads the node's exact user data, and whose systemd runs the units a VM runs
  (``infra.local.machines``);
- processes (the fallback): a detached supervisor runs the boot scripts in each namespace and
  keeps the services running, reading the same unit files (``infra.local.supervisor``).

With ``replicas`` above 1 there are that many serving groups, each a main node and its workers
at the group's addresses (``infra.core.layout.node_ips``), each group's workers taking RPC from
their own main only, behind HAProxy at the balancer's address (``infra.local.balancer``).

Without root the nodes share loopback (127.0.0.10, .11, …) and no firewall is applied; ``up``
says so. What was brought up is kept as a ``ClusterSpec`` (``infra.local.spec``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.boot import BOOT_UNIT, ROLE_UNIT, SCRIPTS_DIR, BootConfigError
from infra.boot.balancer import BalancerBoot, balancer_boot
from infra.core import layout, sizing
from infra.core.limits import RPC_PORT, SERVER_PORT
from infra.local.balancer import Balancer, BalancerError, find_haproxy
from infra.local.netns import VpcNetwork, namespace_pids
from infra.local.nodes import (
    Slot,
    balancer_entry,
    machine_image,
    node_boots,
    node_entry,
    node_layout,
    place_secret,
    store_entry,
)
from infra.local.options import (
    LOOPBACK_CIDR,
    LocalClusterError,
    OptionError,
    UpOptions,
    boot_error,
    build_prefix,
    plan_placement,
    state_dir,
    validate,
)
from infra.local.spec import (
    API_KEY_NAME,
    BALANCER_NODE,
    SPEC_FILE,
    BalancerEntry,
    ClusterSpec,
    down_command,
)
from infra.local.store import STORE_NODE, LocalStore, StoreError, store_ip, store_url
from infra.local.store import unavailable_reason as store_unavailable
from infra.models.parts import part_paths
from infra.observe.status import phase_text


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
    cidr = validate(options)
    if not options.netns:
        cidr = ipaddress.IPv4Network(LOOPBACK_CIDR)
    image = machine_image(options) if options.machines else None
    slots = node_layout(cidr, options.workers, options.replicas)
    front = local_balancer(options, cidr, slots)
    _check_tools(options, front)
    state = state_dir(options.cache, options.cluster_id)
    if (state / SPEC_FILE).exists():
        if _running(state, ClusterSpec.read(state)):
            raise LocalClusterError(
                f"cluster {options.cluster_id!r} is already up; run `"
                f"{down_command(options.cluster_id)}` first"
            )
        down(options.cache, options.cluster_id)
    shares = plan_placement(options)
    try:  # a machine needs namespaces (machine_image): with an image, the nodes are machines
        boots = node_boots(options, slots, cidr, shares, state=state, on_machine=image is not None,
                           keyed=options.api_key)  # fmt: skip
    except BootConfigError as error:
        raise boot_error(error) from None
    network = _network(options, cidr, slots, front) if options.netns else None
    balancer = balancer_entry(front, network, state) if front else None
    store = store_entry(cidr, network, state) if options.staged and network else None
    state.mkdir(parents=True, exist_ok=True)
    api_key = secrets.token_urlsafe(32) if options.api_key else None
    if api_key is not None:  # the caller's copy: `local status` names the file, never the key
        place_secret(state / API_KEY_NAME, api_key)
    try:
        nodes = tuple(
            node_entry(options, slot, boot, state=state, network=network, image=image,
                       index=index, api_key=api_key, store=store.store() if store else None)
            for index, (slot, boot) in enumerate(zip(slots, boots, strict=True))
        )  # fmt: skip
    except BaseException:  # a node refused (its user data): nothing of this cluster is left
        shutil.rmtree(state, ignore_errors=True)
        raise
    spec = ClusterSpec(
        id=options.cluster_id,
        netns=options.netns,
        machines=image is not None,
        cidr=str(cidr),
        commit=options.commit,
        rpc_port=RPC_PORT,
        server_port=SERVER_PORT,
        context_size=options.context_size,
        slots=options.slots,
        placement=tuple(shares.to_json()),
        nodes=nodes,
        replicas=options.replicas,
        balancer=balancer,
        api_key_file=state / API_KEY_NAME if api_key is not None else None,
        store=store,
    )
    spec.write(state)
    try:
        if network:
            network.create()
        if balancer and front:
            _start_balancer(balancer, front)
        if store:
            _fill_store(store.store(), options, progress)
        if image:
            build_on_host(options, state, progress)
            for node in nodes:
                node.booted().start()
        else:
            _start_supervisor(state)
        _wait_until_serving(state, spec, timeout, progress)
    except BaseException:
        # Nothing keeps running, but the logs and status files stay until the next `up` or
        # `down`: they say what went wrong.
        stop(spec, state)
        raise
    return spec.contract()


def start(
    cache: Path,
    cluster_id: str,
    *,
    timeout: float = 1800,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[str], dict[str, Any]]:
    """Start the cluster's stopped machines again (their disks as they were: a spend guard's
    power-off, or a crash) and wait until every group serves; (the machines started, the output
    contract)."""
    state = state_dir(cache, cluster_id)
    spec = ClusterSpec.load(cache, cluster_id)
    if not spec.machines:
        raise LocalClusterError("start is for machines (`up --machines`); run `up` again")
    if spec.store and not spec.store.store().alive():
        raise LocalClusterError(
            f"the cluster's store has stopped, and what it held with it; bring the cluster up "
            f"again (`{down_command(cluster_id)}`, then `lrc local up`)"
        )
    stopped = stopped_machines(spec)
    for name in stopped:
        spec.node(name).booted().start()
    _wait_until_serving(state, spec, timeout, progress)
    return stopped, spec.contract()


def _network(
    options: UpOptions, cidr: ipaddress.IPv4Network, slots: list[Slot], front: BalancerBoot | None
) -> VpcNetwork:
    """The cluster's namespaces on the bridge: its nodes, then the balancer and the store."""
    on_bridge = [(s.name, s.ip) for s in slots]
    if front is not None:
        on_bridge.append((BALANCER_NODE, front.listen_ip))
    if options.staged:
        on_bridge.append((STORE_NODE, store_ip(cidr)))
    return VpcNetwork(
        options.cluster_id,
        cidr,
        tuple(name for name, _ in on_bridge),
        tuple(ip for _, ip in on_bridge),
    )


def _fill_store(
    store: LocalStore, options: UpOptions, progress: Callable[[str], None] | None
) -> None:
    """Start the cluster's store and stage the model in it, as `lrc stage` stages it for a
    stack; the URLs it staged are the ones the nodes were given."""
    if progress:
        progress(f"staging the model in the cluster's S3 store ({store.endpoint})")
    try:
        store.start()
        staged = store.stage(options.model)
    except StoreError as error:
        raise LocalClusterError(str(error)) from None
    expected = [store_url(part.name) for part in part_paths(options.model)]
    if staged != expected:
        raise LocalClusterError(f"the store staged {staged}, not the nodes' {expected}")


def _check_tools(options: UpOptions, front: BalancerBoot | None) -> None:
    """Before anything is made: a missing tool is an install step."""
    if front is not None:
        _find_haproxy()
    if options.staged and (reason := store_unavailable()):
        raise OptionError(f"--staged: {reason}")


def _find_haproxy() -> str:
    try:
        return find_haproxy()
    except BalancerError as error:
        raise LocalClusterError(str(error)) from None


def local_balancer(
    options: UpOptions, cidr: ipaddress.IPv4Network, slots: list[Slot]
) -> BalancerBoot | None:
    """The balancer in front of the cluster's groups (None for one group), as a stack's is made
    (``infra.boot.balancer``): this machine is in no catalog, so nothing predicts its decode
    speed for the timeouts."""
    return balancer_boot(
        layout.private_subnet(cidr),
        [slot.ip for slot in slots if slot.role == "main"],
        server_port=SERVER_PORT,
        slots=options.slots,
        timeout_seconds=sizing.longest_generation_seconds(
            options.context_size, options.slots, sizing.UNKNOWN_DECODE_TPS
        ),
    )


def _start_balancer(entry: BalancerEntry, boot: BalancerBoot) -> None:
    balancer = entry.balancer()
    try:
        balancer.write_config(boot)
        balancer.start()
    except BalancerError as error:
        raise LocalClusterError(str(error)) from None


BUILD_REPORT_SECONDS = 15.0  # how often a long build says how far it is
NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]", re.M)


def build_progress(log_text: str) -> str:
    """How far ninja is, from its build log: ``412 of 590 steps (70%)``; "" before it starts."""
    steps = NINJA_STEP.findall(log_text)
    if not steps:
        return ""
    done, total = (int(n) for n in steps[-1])
    return f"{done} of {total} steps ({100 * done // max(total, 1)}%)"


def build_on_host(options: UpOptions, state: Path, progress: Callable[[str], None] | None) -> None:
    """The pinned build, once on this machine; every machine gets it read-only, where its own
    build step finds it complete and skips it. A build takes minutes: its steps are reported
    every ``BUILD_REPORT_SECONDS``, with the script's own lines as they come."""
    if progress:
        progress("llama.cpp build on this machine (skipped when it is there)")
    prefix = build_prefix(options.cache)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LLAMA_RPC_ENV_FILE": "/dev/null",
        "LLAMA_ROLE": "all",
        "LLAMA_CPP_COMMIT": options.commit,
        "LLAMA_CPP_SOURCE": str(options.source),
        "LLAMA_PREFIX": str(prefix),
        "LLAMA_DATA_DIR": str(state / "host-build"),
    }
    build_log = prefix / options.commit / "build.log"
    said = state / "host-build.log"
    started = time.monotonic()
    with said.open("w") as errors:
        process = subprocess.Popen(
            ["bash", str(SCRIPTS_DIR / "build-llama.sh")],
            env=env, stdout=subprocess.DEVNULL, stderr=errors, text=True,
        )  # fmt: skip
        shown_lines, last_step = 0, ""
        while True:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=BUILD_REPORT_SECONDS if progress else None)
            if progress:
                lines = said.read_text(errors="replace").splitlines()
                for line in lines[shown_lines:]:  # fetching, patches, "building ... with N jobs"
                    progress(f"llama.cpp: {line.split(': ', 1)[-1]}")
                shown_lines = len(lines)
                step = build_progress(_read(build_log)) if process.poll() is None else ""
                if step and step != last_step:
                    minutes = (time.monotonic() - started) / 60
                    progress(f"llama.cpp build: {step}, {minutes:.0f} min so far")
                    last_step = step
            if process.poll() is not None:
                break
    if process.returncode != 0:
        raise LocalClusterError(
            f"llama.cpp build on this machine failed: {said.read_text(errors='replace').strip()}"
        )


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _start_supervisor(state: Path) -> None:
    log = (state / "supervisor.log").open("a")
    process = subprocess.Popen(
        [sys.executable, "-m", "infra.local.supervisor", str(state)],
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


def _running(state: Path, spec: ClusterSpec) -> bool:
    """Whether anything of the cluster still runs: a machine, or the supervisor."""
    if spec.machines:
        return any(node.booted().running() for node in spec.nodes)
    return _supervisor_alive(state)


def stopped_machines(spec: ClusterSpec) -> list[str]:
    if not spec.machines:
        return []
    return [node.name for node in spec.nodes if not node.booted().running()]


def read_status(spec: ClusterSpec) -> dict[str, dict[str, Any]]:
    statuses = {}
    for node in spec.nodes:
        try:
            statuses[node.name] = json.loads(node.status_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            statuses[node.name] = {}
    return statuses


def _wait_until_serving(
    state: Path,
    spec: ClusterSpec,
    timeout: float,
    progress: Callable[[str], None] | None,
) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        statuses = read_status(spec)
        phases = ", ".join(f"{n}: {phase_text(s, short=True)}" for n, s in statuses.items())
        if progress and phases != last:
            progress(phases)
            last = phases
        failed = {n: s for n, s in statuses.items() if s.get("phase") == "failed"}
        if failed:
            name, status = next(iter(failed.items()))
            raise LocalClusterError(
                f"node {name} failed: {status.get('last_error')}{_log_tail(state, spec, name)}"
            )
        waiting = [m.name for m in spec.main_nodes() if statuses[m.name].get("phase") != "serving"]
        if not waiting and _balancer_sees_every_group(spec):
            return
        if spec.machines:
            if stopped := stopped_machines(spec):
                node = spec.node(stopped[0]).booted()
                raise LocalClusterError(
                    f"machine {node.name} stopped; see {node.console_log}"
                    f"{_log_tail(state, spec, stopped[0])}"
                )
        elif not _supervisor_alive(state):
            raise LocalClusterError(
                f"the supervisor stopped; see {state / 'supervisor.log'}"
                f"{_log_tail(state, spec, 'main')}"
            )
        balancer = spec.balancer and spec.balancer.balancer()
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


def _balancer_sees_every_group(spec: ClusterSpec) -> bool:
    """True with one group; else once every group passes the balancer's health check, so that
    requests through it reach every group."""
    if spec.balancer is None:
        return True
    try:
        states = spec.balancer.balancer().group_states()
    except BalancerError:
        return False
    return bool(states) and all(state == "UP" for state in states.values())


def _balancer_states(balancer: Balancer) -> str:
    try:
        return ", ".join(f"{name}: {state}" for name, state in balancer.group_states().items())
    except BalancerError as error:
        return str(error)


def _log_tail(state: Path, spec: ClusterSpec, node: str, lines: int = 15) -> str:
    """The last lines of a node's log, for an error message; the log is kept until `down`."""
    if spec.machines:
        entry = spec.node(node)
        argv = entry.booted().journal_argv(
            ["-n", str(lines), "-u", BOOT_UNIT, "-u", ROLE_UNIT[entry.role]]
        )
        shown = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
        return (
            f"\nits journal (kept until `lrc local down`; "
            f"`lrc local journal {node}` shows it all):\n{shown.rstrip()}"
        )
    log = state / "logs" / f"{node}.log"
    try:
        tail = log.read_text(errors="replace").splitlines()[-lines:]
    except FileNotFoundError:
        return f" (no log at {log})"
    shown = "\n".join(f"  {line}" for line in tail)
    return f"\nlast {len(tail)} lines of {log} (kept until `lrc local down`):\n{shown}"


def down(cache: Path, cluster_id: str) -> bool:
    """Stop every node and remove the namespaces and state; True if there was a cluster."""
    state = state_dir(cache, cluster_id)
    if not (state / SPEC_FILE).exists():
        return False
    spec = ClusterSpec.read(state)
    stop(spec, state)
    if spec.machines:
        # Never delete through a machine's root that is still mounted.
        mounted = [n.name for n in spec.nodes if n.booted().root.is_mount()]
        if mounted:
            raise LocalClusterError(
                f"the roots of {', '.join(mounted)} are still mounted; run down again"
            )
    shutil.rmtree(state, ignore_errors=True)
    return True


def stop(spec: ClusterSpec, state: Path) -> None:
    """Stop every node and remove the namespaces; the logs and status files stay."""
    if spec.machines:
        for node in spec.nodes:
            node.booted().stop()
    if spec.balancer:
        spec.balancer.balancer().stop()
    if spec.store:
        spec.store.store().stop()
    pid = _supervisor_pid(state)
    if pid is not None and _supervisor_alive(state):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _supervisor_alive(state) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _supervisor_alive(state):
            os.killpg(pid, signal.SIGKILL)
    network = spec.network()
    if network:
        # Anything still inside a namespace (a supervisor killed hard) goes with it.
        for ns in network.namespaces():
            for leftover in namespace_pids(ns):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(leftover, signal.SIGKILL)
        network.destroy()
