"""A local cluster as it was brought up: its nodes, where each one is and how it runs, kept in
``cluster.json`` under the cluster's state directory, and the output contract read from it.

Every other part of the local cluster (its life, ``top``, the usage probe, the cost run, the
supervisor) reads this one typed record: ``ClusterSpec.load``.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import asdict, dataclass, fields, is_dataclass
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, cast, get_args, get_origin, get_type_hints

from infra.core import outputs
from infra.core.limits import Cloud, Role
from infra.local.balancer import Balancer
from infra.local.machines import Machine
from infra.local.netns import VpcNetwork
from infra.local.options import LocalClusterError, state_dir
from infra.local.store import LocalStore

BALANCER_NODE = "lb"  # the balancer's namespace and link name (``lrc-<id>-lb``)
SPEC_FILE = "cluster.json"
API_KEY_NAME = "api-key"  # in the state directory, when the cluster has one


@dataclass(frozen=True)
class MachineEntry:
    """A node that boots as a ``systemd-nspawn`` machine, and the user data it was given."""

    name: str
    directory: Path
    image_root: Path
    binds: tuple[tuple[str, str], ...]
    cloud: Cloud  # whose delivery of the user data it received
    field: str
    gzipped: bool

    def machine(self, namespace: str) -> Machine:
        return Machine(
            name=self.name,
            namespace=namespace,
            directory=self.directory,
            image_root=self.image_root,
            binds=self.binds,
        )


@dataclass(frozen=True)
class LocalNode:
    name: str  # main, w1, … in the first group; r2main, r2w1, … after it
    role: Role
    ip: str
    namespace: str | None  # None: the nodes share this machine's loopback
    group: int
    status_file: Path
    env_file: Path | None = None  # a process node's settings, as its boot scripts read them
    machine: MachineEntry | None = None  # a machine node

    @property
    def instance_id(self) -> str:
        """What the output contract calls the node's instance."""
        return self.namespace or self.name

    def booted(self) -> Machine:
        if self.machine is None or self.namespace is None:
            raise LocalClusterError(f"node {self.name} is not a machine")
        return self.machine.machine(self.namespace)


@dataclass(frozen=True)
class BalancerEntry:
    name: str
    ip: str
    namespace: str | None
    directory: Path

    def balancer(self) -> Balancer:
        return Balancer(namespace=self.namespace, directory=self.directory)


@dataclass(frozen=True)
class StoreEntry:
    """The cluster's S3 store (``--staged``): its namespace on the bridge and its directory."""

    name: str
    ip: str
    namespace: str
    directory: Path

    def store(self) -> LocalStore:
        return LocalStore(namespace=self.namespace, ip=self.ip, directory=self.directory)


@dataclass(frozen=True)
class ClusterSpec:
    id: str
    netns: bool
    machines: bool
    cidr: str
    commit: str
    rpc_port: int
    server_port: int
    context_size: int
    slots: int
    placement: tuple[dict[str, Any], ...]  # each node's share (``Placement.to_json``)
    nodes: tuple[LocalNode, ...]
    replicas: int = 1
    balancer: BalancerEntry | None = None
    # The API key's file on this machine (root's, 0600), when requests must carry one.
    api_key_file: Path | None = None
    store: StoreEntry | None = None

    # --- reading it --------------------------------------------------------------------------

    def main_nodes(self) -> list[LocalNode]:
        """Each serving group's main node, in group order."""
        return [node for node in self.nodes if node.role == "main"]

    def groups(self) -> list[list[LocalNode]]:
        """Each serving group's nodes (its main first), in group order."""
        groups: list[list[LocalNode]] = [[] for _ in range(self.replicas)]
        for node in self.nodes:
            groups[node.group].append(node)
        return groups

    def node(self, name: str) -> LocalNode:
        """A node by its name, its machine's name or its namespace."""
        for node in self.nodes:
            if name in (node.name, node.machine and node.machine.name, node.namespace):
                return node
        names = ", ".join(node.name for node in self.nodes)
        raise LocalClusterError(f"no node {name!r} in cluster {self.id!r}; its nodes: {names}")

    def network(self) -> VpcNetwork | None:
        """The namespaces and bridge the cluster runs in (None on loopback)."""
        if not self.netns:
            return None
        on_bridge = [(n.name, n.ip) for n in self.nodes]
        if self.balancer:
            on_bridge.append((self.balancer.name, self.balancer.ip))
        if self.store:
            on_bridge.append((self.store.name, self.store.ip))
        return VpcNetwork(
            self.id,
            ipaddress.IPv4Network(self.cidr),
            tuple(name for name, _ in on_bridge),
            tuple(ip for _, ip in on_bridge),
        )

    def entry_url(self) -> str:
        """Where requests go: the balancer with replicas, else the (first) main node."""
        ip = self.balancer.ip if self.balancer else self.main_nodes()[0].ip
        return f"http://{ip}:{self.server_port}"

    def from_entry(self, command: str) -> str:
        """``command`` as run from where the cluster's entry point is reachable. This machine
        has a route to the first group's main node only; the balancer, like a cloud's internal
        one, is reached from inside the VPC: from the first main node, as a cloud's tunnel
        reaches it."""
        if not self.balancer or not self.netns:
            return command
        on = "" if self.id == "local" else f" --id {self.id}"
        return f"lrc local exec{on} main -- {command}"

    def contract(self) -> dict[str, Any]:
        """The same output contract as a cloud stack: the top-level node keys are the first
        serving group's, ``groups`` holds every group's, in order."""
        groups = [self._group_outputs(nodes) for nodes in self.groups()]
        first = groups[0]
        return {
            outputs.CLOUD: "local",
            outputs.REGION: "netns" if self.netns else "loopback",
            outputs.INSTANCE_TYPE: "machine" if self.machines else "process",
            outputs.WORKER_COUNT: len(first[outputs.WORKER_PRIVATE_IPS]),
            **first,
            outputs.CONNECT_COMMAND: self.from_entry(f"curl {self.entry_url()}/v1/models"),
            outputs.API_KEY: None,
            outputs.HOURLY_COST_USD: 0.0,
            outputs.STOPPED_HOURLY_COST_USD: 0.0,
            outputs.LLAMA_CPP_COMMIT: self.commit,
            outputs.REPLICAS: len(groups),
            outputs.BALANCER_URL: (
                f"http://{self.balancer.ip}:{self.server_port}" if self.balancer else None
            ),
            outputs.GROUPS: groups,
            outputs.BALANCER_INSTANCE_ID: None,  # the balancer is a process of this machine
            outputs.METRICS_DOCUMENT: None,
            outputs.ZONE: None,
            outputs.RESOURCE_GROUP: None,
        }

    def _group_outputs(self, nodes: list[LocalNode]) -> dict[str, Any]:
        main, *workers = nodes
        worker_ips = [w.ip for w in workers]
        return {
            outputs.MAIN_PRIVATE_IP: main.ip,
            outputs.WORKER_PRIVATE_IPS: worker_ips,
            outputs.RPC_SERVERS: outputs.rpc_servers(worker_ips, self.rpc_port),
            outputs.LLAMA_SERVER_URL: f"http://{main.ip}:{self.server_port}",
            outputs.MAIN_INSTANCE_ID: main.instance_id,
            outputs.WORKER_INSTANCE_IDS: [w.instance_id for w in workers],
        }

    # --- storing it --------------------------------------------------------------------------

    def write(self, state: Path) -> None:
        (state / SPEC_FILE).write_text(json.dumps(asdict(self), indent=2, default=str))

    @classmethod
    def read(cls, state: Path) -> ClusterSpec:
        """The record ``up`` wrote in ``state``. It is rewritten by every ``up``: one in another
        layout (another version of lrc wrote it) is refused, never guessed at."""
        path = state / SPEC_FILE
        try:
            return cast(ClusterSpec, _loaded(cls, json.loads(path.read_text()), "cluster"))
        except (_NotInLayout, json.JSONDecodeError) as problem:
            raise LocalClusterError(
                f"{path} is not in the layout this lrc writes ({problem}): another version "
                f"brought that cluster up. Take it down with that version (`"
                f"{down_command(state.name)}`), or, if nothing of it runs any more, remove "
                f"{state}"
            ) from None

    @classmethod
    def load(cls, cache: Path, cluster_id: str) -> ClusterSpec:
        """The cluster ``cluster_id`` that is up; a clear error when none is."""
        try:
            return cls.read(state_dir(cache, cluster_id))
        except FileNotFoundError:
            raise LocalClusterError(
                f"no local cluster {cluster_id!r} is up; start one with `lrc local up`"
            ) from None


def down_command(cluster_id: str) -> str:
    return "lrc local down" + ("" if cluster_id == "local" else f" --id {cluster_id}")


class _NotInLayout(ValueError):
    """Where a stored value differs from the record's declared types, and how."""


def _loaded(kind: Any, value: Any, where: str) -> Any:
    """``value``, as ``json`` read it, made ``kind`` again: a dataclass from an object holding
    exactly its fields, a tuple from a list, a Path from a string, None where the kind is
    optional, anything else as it is, if it is of its kind."""
    origin, args = get_origin(kind), get_args(kind)
    if origin in (Union, UnionType):
        if value is None and type(None) in args:
            return None
        [kind] = [arg for arg in args if arg is not type(None)]
        origin, args = get_origin(kind), get_args(kind)
    if isinstance(kind, type) and is_dataclass(kind) and isinstance(value, dict):
        names = [f.name for f in fields(kind)]
        missing, unknown = sorted(set(names) - set(value)), sorted(set(value) - set(names))
        if missing or unknown:
            wrong = [f"lacks {', '.join(missing)}"] if missing else []
            wrong += [f"holds {', '.join(unknown)}, which it does not know"] if unknown else []
            raise _NotInLayout(f"{where} {' and '.join(wrong)}")
        hints = get_type_hints(kind)
        return kind(
            **{name: _loaded(hints[name], value[name], f"{where}.{name}") for name in names}
        )
    if origin is tuple and isinstance(value, list):
        kinds = [args[0]] * len(value) if ... in args else args
        if len(kinds) != len(value):
            raise _NotInLayout(f"{where} holds {len(value)} items, not {len(kinds)}")
        items = enumerate(zip(kinds, value, strict=True))
        return tuple(_loaded(item_kind, item, f"{where}[{i}]") for i, (item_kind, item) in items)
    if kind is Path and isinstance(value, str):
        return Path(value)
    if origin is Literal:
        fits = value in args
    else:
        expected = origin or kind
        fits = expected is Any or (
            isinstance(value, expected) and (expected is bool or not isinstance(value, bool))
        )
    if not fits:
        raise _NotInLayout(f"{where} is {value!r}, not {getattr(kind, '__name__', kind)}")
    return value


def api_key_header(spec: ClusterSpec) -> dict[str, str]:
    """The header a request to the cluster's API carries (none without a key)."""
    if not spec.api_key_file:
        return {}
    return {"Authorization": f"Bearer {spec.api_key_file.read_text().strip()}"}
