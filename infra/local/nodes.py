"""Where each node of a local cluster goes and what it boots with: the stacks' address plan and
the same ``NodeBoot`` a cloud node's user data is rendered from (a machine gets that user data
itself, delivered and decoded as its cloud would)."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from infra.boot import (
    API_KEY_CREDENTIAL,
    SCRIPTS_DIR,
    VM_PATHS,
    BootConfigError,
    NodeBoot,
    NodePaths,
    deliver,
    render,
    render_env_file,
)
from infra.boot.balancer import BalancerBoot
from infra.boot.deliver import for_cloud
from infra.boot.group import ServingGroup, group_boots
from infra.boot.render import BOOT_ROOT, fetched_files, files_digest
from infra.clouds import FACTS
from infra.core import layout, placement
from infra.core.layout import PROJECT
from infra.core.limits import Role
from infra.local import image as node_image
from infra.local.machines import DRAFTS_MOUNT, MODELS_MOUNT, SOURCE_MOUNT, Machine
from infra.local.netns import VpcNetwork
from infra.local.options import (
    LocalClusterError,
    OptionError,
    UpOptions,
    build_prefix,
    state_dir,
)
from infra.local.spec import BALANCER_NODE, BalancerEntry, LocalNode, MachineEntry, StoreEntry
from infra.local.store import (
    IDENTITY_DROP_IN,
    STORE_NODE,
    STORE_PORT,
    LocalStore,
    store_ip,
    store_url,
)
from infra.local.store import REGION as STORE_REGION
from infra.models.parts import model_id, part_paths
from infra.stage import slices


def node_short_name(index: int, group: int) -> str:
    """A node's short name (it names the node's namespace and its link on the bridge, at most 15
    characters): ``main``, ``w1``, ``w2``, … in the first group, ``r2main``, ``r2w1``, … in the
    second, and so on."""
    prefix = "" if group == 0 else f"r{group + 1}"
    return prefix + ("main" if index == 0 else f"w{index}")


@dataclass(frozen=True)
class Slot:
    """Where a node goes: its serving group, short name and address, and its group's addresses
    (main first)."""

    group: int
    name: str
    ip: str
    group_ips: list[str]

    @property
    def role(self) -> Role:
        return "main" if self.ip == self.group_ips[0] else "worker"


def node_layout(cidr: ipaddress.IPv4Network, workers: int, replicas: int = 1) -> list[Slot]:
    """Every node of every serving group, group by group, main first, as the stacks lay them
    out (``infra.core.layout``)."""
    subnet = layout.private_subnet(cidr)
    slots = []
    for group in range(replicas):
        ips = layout.node_ips(subnet, workers, group=group)
        slots += [Slot(group, node_short_name(i, group), ip, ips) for i, ip in enumerate(ips)]
    return slots


def balancer_entry(boot: BalancerBoot, network: VpcNetwork | None, state: Path) -> BalancerEntry:
    """The balancer's place: its namespace (None on loopback), its address, its directory."""
    return BalancerEntry(
        name=BALANCER_NODE,
        ip=boot.listen_ip,
        namespace=network.namespace(BALANCER_NODE) if network else None,
        directory=state / "balancer",
    )


def store_entry(cidr: ipaddress.IPv4Network, network: VpcNetwork, state: Path) -> StoreEntry:
    """The store's place (``--staged``): its namespace on the bridge, address and directory."""
    return StoreEntry(
        name=STORE_NODE,
        ip=store_ip(cidr),
        namespace=network.namespace(STORE_NODE),
        directory=state / "store",
    )


def serving_group(
    options: UpOptions,
    ips: list[str],
    cidr: ipaddress.IPv4Network,
    shares: placement.Placement,
    *,
    on_machine: bool,
    api_key_file: str = "",
) -> ServingGroup:
    """A serving group as the local cluster describes it to ``group_boots``: a machine sees the
    host's source, model and draft at fixed paths, a process reads them where they are."""
    model_parts = part_paths(options.model)
    draft_parts = part_paths(options.draft_model) if options.draft_model is not None else []
    store_region = store_endpoint = ""
    if on_machine and options.staged:  # where `lrc stage` puts each part in the cluster's store
        source = SOURCE_MOUNT
        model_urls = tuple(store_url(part.name) for part in model_parts)
        draft_urls = tuple(f"file://{DRAFTS_MOUNT}/{part.name}" for part in draft_parts)
        store_region, store_endpoint = STORE_REGION, f"http://{store_ip(cidr)}:{STORE_PORT}"
    elif on_machine:
        source = SOURCE_MOUNT
        model_urls = tuple(f"file://{MODELS_MOUNT}/{part.name}" for part in model_parts)
        draft_urls = tuple(f"file://{DRAFTS_MOUNT}/{part.name}" for part in draft_parts)
    else:
        source = str(options.source)
        model_urls = tuple(part.resolve().as_uri() for part in model_parts)
        draft_urls = tuple(part.resolve().as_uri() for part in draft_parts)
    return ServingGroup(
        ips=tuple(ips),
        cluster_cidr=str(cidr),
        placement=shares,
        model_urls=model_urls,
        model_sha256=(options.model_sha256,) if options.model_sha256 else (),
        context_size=options.context_size,
        slots=options.slots,
        llama_cpp_commit=options.commit,
        llama_cpp_source=source,
        draft_urls=draft_urls,
        draft_max=options.draft_max,
        model_alias=model_id(model_parts[0].name),
        server_args=options.server_args,
        api_key_file=api_key_file,
        stop_after_idle_minutes=options.stop_after_idle_minutes,
        stop_after_hours=options.stop_after_hours,
        patches_off=options.patches_off,
        patch_settings=options.llama_env,
        threads=options.threads,
        worker_wait_seconds=options.worker_wait_seconds,
        slice_manifest=_slice_manifest(options, on_machine=on_machine),
        model_store_region=store_region,
        model_store_endpoint=store_endpoint,
    )


def _slice_manifest(options: UpOptions, *, on_machine: bool) -> str:
    """With worker-local loading, the URL of the model's slice manifest, as a node reads it: written
    beside the model's first part once (the local cluster's stand-in for ``lrc stage``)."""
    if not options.worker_local:
        return ""
    if on_machine and options.staged:  # `lrc stage` writes it beside the first part
        return store_url(part_paths(options.model)[0].name + slices.MANIFEST_SUFFIX)
    written = slices.manifest_file(part_paths(options.model))
    return f"file://{MODELS_MOUNT}/{written.name}" if on_machine else written.resolve().as_uri()


def node_boots(
    options: UpOptions,
    slots: list[Slot],
    cidr: ipaddress.IPv4Network,
    shares: placement.Placement,
    *,
    state: Path,
    on_machine: bool,
    keyed: bool,
) -> list[NodeBoot]:
    """Every node's boot settings, in the order of ``slots`` (``node_layout``'s): each group's
    from ``group_boots``. With a key, each group's main node reads it from root's credential
    store: a machine's own, or the node directory's that the supervisor hands over."""
    boots: list[NodeBoot] = []
    for group in range(options.replicas):
        main = next(slot for slot in slots if slot.group == group and slot.role == "main")
        key_file = ""
        if keyed:
            credstore = state / "nodes" / main.name / "credstore" / API_KEY_CREDENTIAL
            key_file = MACHINE_API_KEY_FILE if on_machine else str(credstore)
        described = serving_group(
            options, main.group_ips, cidr, shares, on_machine=on_machine, api_key_file=key_file
        )
        boots += group_boots(described)
    return boots


def node_entry(
    options: UpOptions,
    slot: Slot,
    boot: NodeBoot,
    *,
    state: Path,
    network: VpcNetwork | None,
    image: node_image.Image | None,
    index: int,
    api_key: str | None = None,
    store: LocalStore | None = None,
) -> LocalNode:
    """A node of the cluster, its boot settings written where it reads them (and on a main
    node, ``api_key`` in root's credential store, at ``boot.api_key_file``; on a machine that
    reads the cluster's ``store``, the identity it reads with)."""
    node_dir = state / "nodes" / slot.name
    node_dir.mkdir(parents=True, exist_ok=True)
    namespace = network.namespace(slot.name) if network else None
    if image and network:
        machine = machine_node(
            options, slot.name, image_root=image.root, network=network, boot=boot, index=index
        )
        if boot.api_key_file and api_key is not None:  # root's store, as a VM's boot fills it
            written = machine.machine(network.namespace(slot.name)).written
            place_secret(written(boot.api_key_file), api_key)
        if store is not None:  # as a VM's role: root's boot reads with it, nothing else can
            booted = machine.machine(network.namespace(slot.name))
            place_file(booted.written(IDENTITY_DROP_IN), store.drop_in(), 0o600)
        return LocalNode(
            name=slot.name,
            role=slot.role,
            ip=slot.ip,
            namespace=namespace,
            group=slot.group,
            status_file=machine.machine(network.namespace(slot.name)).status_file,
            machine=machine,
        )
    if boot.api_key_file and api_key is not None:  # the supervisor hands it over as systemd would
        place_secret(Path(boot.api_key_file), api_key)
    env_file = node_dir / "node.env"
    paths = NodePaths(
        bin_dir=str(SCRIPTS_DIR),
        env_file=str(env_file),
        data_dir=str(node_dir),
        prefix=str(build_prefix(options.cache)),
    )
    env_file.write_text(render_env_file(boot.env(paths)))
    return LocalNode(
        name=slot.name,
        role=slot.role,
        ip=slot.ip,
        namespace=namespace,
        group=slot.group,
        status_file=node_dir / "status.json",
        env_file=env_file,
    )


def machine_node(
    options: UpOptions,
    name: str,
    *,
    image_root: Path,
    network: VpcNetwork,
    boot: NodeBoot,
    index: int,
) -> MachineEntry:
    """A machine node: its user data rendered and delivered as its cloud would, decoded as that
    cloud's datasource decodes it, in the machine's NoCloud seed."""
    parts = part_paths(options.model)
    cloud = options.deliveries[index % len(options.deliveries)]
    # The files beyond its first steps, where its cloud keeps them (placed below, as a VM reads
    # them).
    boot = for_cloud(boot, cloud, "local", f"/{PROJECT}/{options.cluster_id}/boot/{boot.role}")
    try:
        delivery = deliver(render(boot), cloud)
    except BootConfigError as error:
        if error.setting != "user_data":
            raise
        others = [c for c in FACTS if c != cloud]
        raise OptionError(
            f"--delivery {cloud}: node {name}'s {error.message.removeprefix('the ')}; give "
            f"its place in --delivery another cloud's ({' or '.join(others)}), e.g. "
            f"--delivery {','.join([cloud, *others])}"
        ) from None
    received = delivery.received()
    host_bin = build_prefix(options.cache) / options.commit / "bin"
    machine = Machine(
        name=network.namespace(name),
        namespace=network.namespace(name),
        directory=state_dir(options.cache, options.cluster_id) / "nodes" / name,
        image_root=image_root,
        binds=(
            (str(options.source.resolve()), SOURCE_MOUNT),
            (str(parts[0].resolve().parent), MODELS_MOUNT),
            *(
                ((str(part_paths(draft)[0].resolve().parent), DRAFTS_MOUNT),)
                if (draft := options.draft_model) is not None and boot.role == "main"
                else ()
            ),
            (str(host_bin), f"{VM_PATHS.prefix}/{options.commit}/bin"),
        ),
    )
    (machine.directory / "user-data").write_bytes(received)
    fetched = fetched_files(boot)
    for file in fetched:
        place_file(machine.written(file["path"]), file["content"], int(file["permissions"], 8))
    if fetched:
        marker = BOOT_ROOT / f".files-{files_digest(fetched)}"
        place_file(machine.written(str(marker)), "", 0o644)
    machine.seed(received, instance_id=f"{machine.name}-{os.urandom(4).hex()}")
    return MachineEntry(
        name=machine.name,
        directory=machine.directory,
        image_root=image_root,
        binds=machine.binds,
        cloud=cloud,
        field=delivery.field,
        gzipped=delivery.gzipped,
    )


def machine_image(options: UpOptions) -> node_image.Image:
    if not options.netns:
        raise LocalClusterError("machines need network namespaces (root, iproute2, nftables)")
    image = node_image.cached(options.cache)
    if image is None:
        raise LocalClusterError(
            "the node image is not built; run `lrc local image` (once: it fetches "
            f"Debian {node_image.RELEASE}'s packages)"
        )
    return image


# Where a machine's root keeps the API key: systemd's persistent credential store (a VM fetches
# it into /run/credstore at each boot instead).
MACHINE_API_KEY_FILE = f"/etc/credstore/{API_KEY_CREDENTIAL}"


def place_file(path: Path, content: str, mode: int) -> None:
    """A root's file in a machine's root, as its boot would write it."""
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(descriptor, "w") as file:
        os.fchmod(file.fileno(), mode)
        file.write(content)


def place_secret(path: Path, secret: str) -> None:
    """``secret`` in ``path``, root's (0600) in a directory only root enters (0700)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(secret + "\n")
