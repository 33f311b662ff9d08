"""One node's boot settings (``NodeBoot``), checked as they are made, and its environment file.

Every error is a ``BootConfigError`` that names the setting at fault, so that the stack's config
check and the local cluster can name their own key for it.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import Field, dataclass, field, fields
from functools import cache
from typing import Any

from infra.boot.patches import patches_digest
from infra.boot.prebuilt import prebuilt_problem
from infra.clouds.stores import STORE_SCHEMES
from infra.core import server_args
from infra.core.errors import SettingError
from infra.core.limits import (
    DEFAULT_DRAFT_MAX,
    DEFAULT_DRAFT_P_MIN,
    MAX_DRAFT_TOKENS,
    METRICS_PORT,
    ROLES,
    RPC_PORT,
    SERVER_PORT,
    Role,
)
from infra.core.outputs import rpc_servers
from infra.core.pins import LLAMA_CPP_COMMIT, LLAMA_CPP_REPO, is_full_commit
from infra.core.server_args import MODEL_ALIAS
from infra.models.parts import saved_name, split_parts_problem

_SHA256 = re.compile(r"[0-9a-f]{64}")
# Object-store URLs the boot reads with rclone (fetch-model.sh), the others with curl: S3,
# Cloud Storage, and Azure Blob Storage as az://ACCOUNT/CONTAINER/KEY.
STAGED_SCHEMES = STORE_SCHEMES
_SAFE_ENV_VALUE = re.compile(r"[^'\n\r\\]*")
# An S3 region, as rclone signs for it.
_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d")


class BootConfigError(SettingError):
    """A node setting that cannot work; the message names the setting and the fix.

    ``setting`` is the ``NodeBoot`` field at fault (``"model_urls"``, ``"node_ip"``, ...; user
    data over its cloud's limit is ``"user_data"``, and an unknown cloud ``"cloud"``), so that
    callers can name the setting or the flag a user writes for it (``setting_of``).
    """

    @property
    def label(self) -> str:
        return ""  # the message names the field in its own words


@dataclass(frozen=True)
class NodePaths:
    """Where a node keeps its scripts, settings, data and llama.cpp builds."""

    bin_dir: str
    env_file: str
    data_dir: str
    prefix: str


# The API key (apiKey) reaches llama-server as a systemd credential of this name
# (ImportCredential= in its unit): root puts it in a credential store (/run/credstore on a VM,
# fetched from the cloud's secret store at each boot; /etc/credstore on a local machine), and
# only the service sees it, in $CREDENTIALS_DIRECTORY.
API_KEY_CREDENTIAL = "llama-rpc-api-key"
VM_API_KEY_FILE = f"/run/credstore/{API_KEY_CREDENTIAL}"
# Where a main node reads the key (llama-rpc-secret): an SSM SecureString (AWS), a Secret Manager
# secret of the node's project (GCP), a secret of the Key Vault its VM's tag names (Azure).
API_KEY_SOURCE = re.compile(
    r"aws-ssm:[a-z0-9-]+:/[A-Za-z0-9_./-]{1,1000}|gcp-sm:[A-Za-z0-9_-]{1,255}"
    r"|azure-kv:[0-9A-Za-z-]{1,127}"
)
# Where a node reads the boot files its user data cannot hold (llama-rpc-secret files): an SSM
# Parameter Store path, one parameter per file (AWS, whose user data is 16 KB).
FILES_SOURCE = re.compile(r"aws-ssm:[a-z0-9-]+:/[A-Za-z0-9_./-]{1,900}")
# How a spend guard stops a node so that its compute charge ends: a guest power-off stops an EC2
# instance (its shutdown behaviour is "stop") and a Compute Engine VM; an Azure VM that powers
# off stays allocated, and billed, until it is deallocated through Azure Resource Manager, which
# each node does for itself with its own identity.
STOP_BY = ("poweroff", "azure-deallocate")
# How often a spend guard looks (GUARD_INTERVAL_SECONDS): a node stops at most this long after
# its limit, which for limits of an hour or more is nothing.
GUARD_INTERVAL_SECONDS = 30
# A node's boot to serving, at most, where nothing better is known (``group_boots`` sets it
# from the model's size): the build, the download, the workers' wait and the model's load.
SERVE_DEADLINE_SECONDS = 4 * 3600
# How long llama-server may take to load the model, each start (LOAD_TIMEOUT_SECONDS).
LOAD_TIMEOUT_SECONDS = 3600

VM_PATHS = NodePaths(
    bin_dir="/opt/llama-rpc/bin",
    env_file="/etc/llama-rpc/node.env",
    data_dir="/var/lib/llama-rpc",
    prefix="/opt/llama.cpp",
)


def _env(
    name: str,
    setting: str = "",
    *,
    role: Role | None = None,
    when: tuple[str, ...] = (),
    value: str = "",
    sep: str = " ",
) -> dict[str, Any]:
    """A ``NodeBoot`` field's metadata: the environment variable the boot scripts read it as
    (``name``), and the stack setting a user writes for it (``setting``; "": none, it is derived).
    The variable is written for ``role``'s nodes only (None: every node), and only when each
    attribute in ``when`` is true (a field itself: when it is given); ``value`` names the
    attribute written instead of the field, and ``sep`` joins a tuple's items."""
    return {"env": name, "setting": setting, "role": role, "when": when, "value": value,
            "sep": sep}  # fmt: skip


def _given(name: str, setting: str = "", *, role: Role | None = None) -> dict[str, Any]:
    """A field written only when it is given (not empty, not zero)."""
    return _env(name, setting, role=role, when=("",))


def _main(name: str, setting: str = "", **more: Any) -> dict[str, Any]:
    return _env(name, setting, role="main", **more)


_DRAFTED = ("draft_urls",)
_GUARDED = ("guarded",)
_SLICED = ("slice_manifest",)


@dataclass(frozen=True)
class NodeBoot:
    """Everything one node needs to boot into its role.

    Workers need ``rpc_allowed_sources`` (who may reach the RPC port and the metrics port: the
    main node); a worker should give ``cluster_cidr``, the only network it reaches once serving.
    The main
    node needs ``rpc_workers`` (worker IPs, in order), ``model_urls``, and with workers the
    placement flags ``gpu_layers`` and ``tensor_split``.

    Each field's metadata (``_env``) names its variable in the node's environment file and the
    setting a user writes for it: ``env()`` writes the fields in this order, the order the user
    data has always had (a change of it would replace every deployed node).
    """

    role: Role = field(metadata=_env("LLAMA_ROLE"))
    node_ip: str = field(metadata=_env("LLAMA_NODE_IP", "vpcCidr"))
    llama_cpp_commit: str = field(
        default=LLAMA_CPP_COMMIT, metadata=_env("LLAMA_CPP_COMMIT", "llamaCppCommit")
    )
    llama_cpp_source: str = field(default=LLAMA_CPP_REPO, metadata=_env("LLAMA_CPP_SOURCE"))
    rpc_port: int = field(default=RPC_PORT, metadata=_env("RPC_PORT", "rpcPort"))
    # Where the node reads the boot files its user data cannot hold (FILES_SOURCE: AWS's 16 KB
    # holds the first steps of the boot only); "": every file comes in the user data.
    files_source: str = field(default="", metadata=_given("LLAMA_RPC_FILES_SOURCE"))
    threads: int | None = field(default=None, metadata=_given("LLAMA_THREADS"))
    rpc_allowed_sources: tuple[str, ...] = field(
        default=(), metadata=_env("RPC_ALLOWED_SOURCES", "vpcCidr", role="worker")
    )
    # A worker's egress once serving: this network (and the cloud's link-local services) only.
    # Empty: egress is left alone. A main node's is checked, not written.
    cluster_cidr: str = field(default="", metadata=_env("CLUSTER_CIDR", "vpcCidr", role="worker"))
    # The cloud's own IPv4 endpoints a worker still reaches then (DNS, agent), outside both the
    # cluster and link-local 169.254.0.0/16.
    platform_addresses: tuple[str, ...] = field(
        default=(), metadata=_env("PLATFORM_ADDRESSES", role="worker")
    )
    rpc_workers: tuple[str, ...] = field(
        default=(), metadata=_main("RPC_WORKERS", "vpcCidr", value="rpc_servers")
    )
    model_urls: tuple[str, ...] = field(default=(), metadata=_main("MODEL_URLS", "model.urls"))
    model_sha256: tuple[str, ...] = field(
        default=(), metadata=_main("MODEL_SHA256", "model.sha256")
    )
    server_port: int = field(default=SERVER_PORT, metadata=_main("SERVER_PORT", "serverPort"))
    context_size: int = field(default=4096, metadata=_main("CONTEXT_SIZE", "contextSize"))
    slots: int = field(default=1, metadata=_main("SLOTS", "slots"))
    # The layer placement as llama-server's flags (``infra.core.placement``): --n-gpu-layers and
    # --tensor-split, one value per worker. Needed with workers, meaningless without.
    gpu_layers: int = field(default=0, metadata=_main("LLAMA_GPU_LAYERS", value="offloaded"))
    tensor_split: tuple[int, ...] = field(default=(), metadata=_main("LLAMA_TENSOR_SPLIT", sep=","))
    # The weights the workers get from the main node (the placement's): the load's progress.
    worker_weight_bytes: int = field(default=0, metadata=_main("RPC_LOAD_BYTES"))
    # The id clients send as "model" and /v1/models shows (llama-server's --alias); "": the file's.
    model_alias: str = field(default="", metadata=_main("MODEL_ALIAS", "modelAlias"))
    worker_wait_seconds: int = field(default=900, metadata=_main("WORKER_WAIT_SECONDS"))
    # How long llama-server may take to load the model before the node gives up on that start
    # (and systemd tries again): a hung load fails the node instead of "loading" for ever.
    load_timeout_seconds: int = field(
        default=LOAD_TIMEOUT_SECONDS, metadata=_main("LOAD_TIMEOUT_SECONDS")
    )
    # llama-server flags a stack adds, each allowed by infra.core.server_args.
    server_args: tuple[str, ...] = field(
        default=(), metadata=_given("LLAMA_SERVER_ARGS", "serverArgs", role="main")
    )
    # Where root keeps the API key on the node (its file name is API_KEY_CREDENTIAL); "": the
    # API takes requests without one. Set, llama-server refuses to start without the key.
    api_key_file: str = field(default="", metadata=_given("API_KEY_FILE", "apiKey", role="main"))
    # Where root reads the key at each boot, with the node's own identity, into api_key_file
    # (API_KEY_SOURCE); "": it is put there otherwise.
    api_key_source: str = field(
        default="", metadata=_given("API_KEY_SOURCE", "apiKey", role="main")
    )
    # The address llama-server listens on; None: the node's own. "0.0.0.0" on GCP, as it has
    # been since its passthrough balancer (``CloudFacts.server_listens_on_all``).
    server_listen: str | None = field(default=None, metadata=_given("SERVER_LISTEN", role="main"))
    # A main node whose memory holds the model: the dirty bytes the page cache may hold while it
    # downloads (the model's size), so the download runs at the network's speed. 0: the kernel's.
    writeback_bytes: int = field(default=0, metadata=_given("WRITEBACK_BYTES", role="main"))
    # A main node whose memory cannot hold the model: the parts it fetches at once (as many as its
    # memory holds, so each is checked from the page cache). 0: fetch-model.sh's own.
    download_jobs: int = field(default=0, metadata=_given("DOWNLOAD_JOBS", role="main"))
    # The same node: the read-ahead in KiB of the disk the model is on (the load reads the file by
    # page faults). 0: the kernel's.
    model_read_ahead_kb: int = field(default=0, metadata=_given("MODEL_READ_AHEAD_KB", role="main"))
    # A main node whose model lives on a disk of its own (model-disk.sh): its size in GiB, and
    # the model name its cloud's disks report, by which the boot knows it. 0: the boot disk.
    model_disk_gb: int = field(
        default=0, metadata=_given("MODEL_DISK_GB", "mainDiskGb", role="main")
    )
    model_disk_model: str = field(
        default="", metadata=_main("MODEL_DISK_MODEL", when=("model_disk_gb",))
    )
    # A draft model of the same vocabulary (speculative decoding, main node): its parts and
    # checksums, fetched with the model's; the tokens it drafts a step (at most, and at least to
    # be used), and the probability below which it stops drafting.
    draft_urls: tuple[str, ...] = field(
        default=(), metadata=_main("DRAFT_MODEL_URLS", "draftModel.urls", when=_DRAFTED)
    )
    draft_sha256: tuple[str, ...] = field(
        default=(), metadata=_main("DRAFT_MODEL_SHA256", "draftModel.sha256", when=_DRAFTED)
    )
    draft_max: int = field(
        default=DEFAULT_DRAFT_MAX, metadata=_main("DRAFT_MAX", "draftMax", when=_DRAFTED)
    )
    draft_min: int = field(default=0, metadata=_main("DRAFT_MIN", "draftMin", when=_DRAFTED))
    draft_p_min: float = field(
        default=DEFAULT_DRAFT_P_MIN, metadata=_main("DRAFT_P_MIN", when=_DRAFTED)
    )
    # A staged model (STAGED_SCHEMES): the store's region (S3 needs it), and its endpoint where
    # it is not the provider's own (a local S3 API); the node reads it with its own identity.
    # With the prebuilt llama.cpp, every node reads the same store.
    model_store_region: str = field(
        default="", metadata=_env("MODEL_STORE_REGION", when=("reads_store",))
    )
    model_store_endpoint: str = field(
        default="", metadata=_env("MODEL_STORE_ENDPOINT", when=("reads_store", ""))
    )
    # The prebuilt llama.cpp (``infra.boot.prebuilt``): the store prefix its bundles are kept
    # under (an s3://, gs:// or az:// URL; "": every node builds), and the bundle this node's CPU
    # runs. The node reads it with its own identity, checks it, and builds when it cannot.
    prebuilt_store: str = field(default="", metadata=_given("LLAMA_PREBUILT"))
    prebuilt_target: str = field(
        default="", metadata=_env("LLAMA_PREBUILT_TARGET", when=("prebuilt_store",))
    )
    # Spend guards (0: off): power the node off after this many seconds idle (a main node: no
    # request processed and no slot busy; a worker: no RPC client, after it had one), or this
    # many seconds after it booted, looking every ``guard_interval_seconds``; ``stop_by`` says
    # how (STOP_BY).
    stop_after_idle_seconds: int = field(
        default=0,
        metadata=_env("STOP_AFTER_IDLE_SECONDS", "stopAfterIdleMinutes", when=_GUARDED),
    )
    stop_after_seconds: int = field(
        default=0, metadata=_env("STOP_AFTER_SECONDS", "stopAfterHours", when=_GUARDED)
    )
    # How long after its boot (or after its server last answered) a node that does not serve
    # still counts as getting ready: past it, a main node whose server does not answer and a
    # worker its main node never reached count as idle, so a node that can never serve stops.
    serve_deadline_seconds: int = field(
        default=SERVE_DEADLINE_SECONDS, metadata=_env("SERVE_DEADLINE_SECONDS", when=_GUARDED)
    )
    stop_by: str = field(default="poweroff", metadata=_env("STOP_BY", when=_GUARDED))
    guard_interval_seconds: int = field(
        default=GUARD_INTERVAL_SECONDS, metadata=_env("GUARD_INTERVAL_SECONDS", when=_GUARDED)
    )
    # Worker-local loading: the slice manifest ``lrc stage`` wrote (""=off) and the layers this
    # node holds: each node fetches its own slice of the model (llama-rpc-slice), a worker keeps
    # it on its disk for its RPC server, and the main node sends it keys instead of weights.
    slice_manifest: str = field(default="", metadata=_given("SLICE_MANIFEST"))
    slice_sources: tuple[str, ...] = field(
        default=(), metadata=_env("SLICE_SOURCES", role="worker", when=_SLICED)
    )
    slice_first_layer: int = field(
        default=0, metadata=_env("SLICE_FIRST_LAYER", role="worker", when=_SLICED)
    )
    slice_layers: int = field(default=0, metadata=_env("SLICE_LAYERS", when=_SLICED))
    slice_output: int = field(default=0, metadata=_env("SLICE_OUTPUT", role="worker", when=_SLICED))
    # The llama.cpp patches' own variables (their switches among them), by name, written last.
    extra_env: dict[str, str] = field(
        default_factory=dict, metadata={"setting": "llamaCppPatchesOff"}
    )

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def staged(self) -> bool:
        """The model is read from the provider's object store (``STAGED_SCHEMES``)."""
        return any(url.startswith(STAGED_SCHEMES) for url in self.model_urls)

    @property
    def slices_from_store(self) -> bool:
        """Worker-local loading from the stack's object store (``llama-rpc-slice``)."""
        return any(url.startswith(STAGED_SCHEMES) for url in self.slice_sources) or (
            bool(self.slice_manifest) and self.staged
        )

    @property
    def reads_store(self) -> bool:
        """The node reads the stack's object store: a staged model (or its slice of one), or the
        prebuilt llama.cpp."""
        return (
            bool(self.prebuilt_store)
            or (self.role == "main" and self.staged)
            or self.slices_from_store
        )

    @property
    def guarded(self) -> bool:
        """A spend guard watches the node (``llama-rpc-guard``)."""
        return self.stop_after_idle_seconds > 0 or self.stop_after_seconds > 0

    @property
    def patches(self) -> str:
        """The digest of the patch set the build applies (``none``: built unpatched)."""
        return patches_digest(self.llama_cpp_commit)

    @property
    def rpc_servers(self) -> str:
        """The main node's ``--rpc`` list: ``ip:port,ip:port`` in worker order."""
        return rpc_servers(list(self.rpc_workers), self.rpc_port)

    @property
    def offloaded(self) -> str:
        """``--n-gpu-layers``: the layers the workers hold, "" without workers."""
        return str(self.gpu_layers) if self.rpc_workers else ""

    def env(
        self, paths: NodePaths = VM_PATHS, *, service_user: str | None = None
    ) -> dict[str, str]:
        """The node's environment file, as read by the boot scripts and the systemd units: each
        field by its metadata, and after three of them what no field holds."""
        node = {
            "llama_cpp_source": {
                "LLAMA_CPP_PATCHES": self.patches,
                "LLAMA_PREFIX": paths.prefix,
                "LLAMA_DATA_DIR": paths.data_dir,
                "LLAMA_STATUS_FILE": f"{paths.data_dir}/status.json",
            },
            "rpc_port": {"METRICS_PORT": str(METRICS_PORT)},
            "files_source": {"LLAMA_SERVICE_USER": service_user} if service_user else {},
        }
        env: dict[str, str] = {}
        for spec in fields(self):
            text = self._env_text(spec)
            if text is not None:
                env[spec.metadata["env"]] = text
            env |= node.get(spec.name, {})
        env |= self.extra_env
        variables = env_fields()
        for name, value in env.items():
            if not _SAFE_ENV_VALUE.fullmatch(value):
                raise BootConfigError(
                    "extra_env" if name in self.extra_env else variables.get(name, "paths"),
                    f"{name}={value!r}: quotes, backslashes and line breaks are not allowed in "
                    "node settings; remove them (URL-encode them in a model URL)",
                )
        return env

    def _env_text(self, spec: Field[Any]) -> str | None:
        """A field as its variable's value; None where this node does not get the variable."""
        meta = spec.metadata
        if "env" not in meta or meta["role"] not in (None, self.role):
            return None
        if not all(getattr(self, name or spec.name) for name in meta["when"]):
            return None
        value = getattr(self, meta["value"] or spec.name)
        if isinstance(value, tuple):
            return str(meta["sep"]).join(map(str, value))
        if isinstance(value, float):
            return f"{value:g}"
        return str(value)


@cache
def env_fields() -> dict[str, str]:
    """Each environment variable a ``NodeBoot`` field is written as, and its field."""
    return {spec.metadata["env"]: spec.name for spec in fields(NodeBoot) if "env" in spec.metadata}


def setting_of(field_name: str) -> str:
    """The stack setting a user writes for a ``NodeBoot`` field ("": none; it is derived)."""
    specs = {spec.name: spec for spec in fields(NodeBoot)}
    return str(specs[field_name].metadata.get("setting", "")) if field_name in specs else ""


def _validate(boot: NodeBoot) -> None:
    if boot.role not in ROLES:
        raise BootConfigError("role", f"role {boot.role!r} is not one of {', '.join(ROLES)}")
    _private_host("node_ip", boot.node_ip)
    if not is_full_commit(boot.llama_cpp_commit):
        raise BootConfigError(
            "llama_cpp_commit",
            f"llama_cpp_commit {boot.llama_cpp_commit!r} is not a full 40-character commit hash; "
            "pin an exact llama.cpp commit (branches and tags move)",
        )
    for name in ("rpc_port", "server_port"):
        port = getattr(boot, name)
        if not 1 <= port <= 65535:
            raise BootConfigError(
                name,
                f"{name} {port} is outside 1-65535; choose a valid TCP port",
            )
    for name in ("context_size", "slots", "worker_wait_seconds", "load_timeout_seconds"):
        value = getattr(boot, name)
        if value < 1:
            raise BootConfigError(name, f"{name} {value} must be at least 1")
    if boot.files_source and not FILES_SOURCE.fullmatch(boot.files_source):
        raise BootConfigError(
            "files_source",
            f"files_source {boot.files_source!r}: give aws-ssm:REGION:/PATH, or leave it empty "
            "for every boot file to come in the user data",
        )
    if boot.draft_urls and boot.role != "main":
        raise BootConfigError("draft_urls", "a draft model runs on the main node only")
    if boot.model_disk_gb and (boot.role != "main" or not boot.model_disk_model):
        raise BootConfigError(
            "model_disk_gb",
            "model_disk_gb: a model disk is a main node's, and needs model_disk_model (the name "
            "its disks report)",
        )
    if boot.cluster_cidr:
        _validate_cluster_cidr(boot)
    if boot.prebuilt_store:
        _validate_prebuilt(boot)
    _validate_guard(boot)
    if boot.role == "worker":
        _validate_worker(boot)
    else:
        _validate_main(boot)


def _validate_prebuilt(boot: NodeBoot) -> None:
    if problem := prebuilt_problem(boot.prebuilt_store, boot.prebuilt_target):
        raise BootConfigError("prebuilt_store", f"prebuilt_store: {problem}")
    if boot.prebuilt_store.startswith("s3://") and not _REGION.fullmatch(boot.model_store_region):
        raise BootConfigError(
            "model_store_region",
            f"prebuilt_store {boot.prebuilt_store!r} is in S3: give model_store_region, the "
            f"store's region (for example us-east-1), not {boot.model_store_region!r}",
        )


def _validate_guard(boot: NodeBoot) -> None:
    for name in ("stop_after_idle_seconds", "stop_after_seconds"):
        if getattr(boot, name) < 0:
            raise BootConfigError(name, f"{name} {getattr(boot, name)}: give 0 (off) or more")
    if boot.serve_deadline_seconds < 1:
        raise BootConfigError(
            "serve_deadline_seconds",
            f"serve_deadline_seconds {boot.serve_deadline_seconds}: give 1 or more",
        )
    if boot.guard_interval_seconds < 1:
        raise BootConfigError(
            "guard_interval_seconds",
            f"guard_interval_seconds {boot.guard_interval_seconds}: give 1 or more",
        )
    if boot.stop_by not in STOP_BY:
        raise BootConfigError(
            "stop_by", f"stop_by {boot.stop_by!r} is not one of {', '.join(STOP_BY)}"
        )


def _validate_cluster_cidr(boot: NodeBoot) -> None:
    try:
        cluster = ipaddress.IPv4Network(boot.cluster_cidr)
    except ValueError:
        raise BootConfigError(
            "cluster_cidr",
            f"cluster_cidr {boot.cluster_cidr!r} is not an IPv4 network",
        ) from None
    if not cluster.is_private or ipaddress.ip_address(boot.node_ip) not in cluster:
        raise BootConfigError(
            "cluster_cidr",
            f"cluster_cidr {boot.cluster_cidr} must be the private network that holds "
            f"the node ({boot.node_ip})",
        )


def _validate_worker(boot: NodeBoot) -> None:
    if boot.slice_manifest and (not boot.slice_sources or boot.slice_layers < 0):
        raise BootConfigError(
            "slice_sources",
            "a worker that loads its own slice needs the model's part URLs (slice_sources) and "
            "its layers (slice_first_layer, slice_layers)",
        )
    if not boot.rpc_allowed_sources:
        raise BootConfigError(
            "rpc_allowed_sources",
            "rpc_allowed_sources is empty: a worker must know who may reach its RPC port; "
            "give the main node's address (for example 10.0.1.10/32)",
        )
    for source in boot.rpc_allowed_sources:
        try:
            network = ipaddress.ip_network(source, strict=False)
        except ValueError:
            raise BootConfigError(
                "rpc_allowed_sources",
                f"rpc_allowed_sources entry {source!r} is not an address or CIDR",
            ) from None
        if not network.is_private or network.prefixlen == 0:
            raise BootConfigError(
                "rpc_allowed_sources",
                f"rpc_allowed_sources entry {source!r} is not a private network; the RPC port "
                "has no authentication, so only the cluster's own addresses may reach it",
            )
    for address in boot.platform_addresses:
        try:
            ipaddress.IPv4Address(address)
        except ValueError:
            raise BootConfigError(
                "platform_addresses",
                f"platform_addresses entry {address!r} is not an IPv4 address",
            ) from None
    if boot.server_listen is not None:
        raise BootConfigError(
            "server_listen",
            f"server_listen {boot.server_listen!r} is for the main node: a worker runs no "
            "llama-server, and its RPC port listens on its own address only",
        )


def _validate_server(boot: NodeBoot) -> None:
    """What llama-server is given beyond the placement: its model id, flags and key."""
    if boot.model_alias and not MODEL_ALIAS.fullmatch(boot.model_alias):
        raise BootConfigError(
            "model_alias",
            f"model_alias {boot.model_alias!r}: give 1-128 letters, digits and . _ - : / +",
        )
    if any(not arg or any(c.isspace() for c in arg) for arg in boot.server_args):
        raise BootConfigError("server_args", "server_args: give each flag and value as one word")
    if problem := server_args.check(boot.server_args):
        raise BootConfigError("server_args", f"server_args: {problem}")
    if boot.api_key_file and not (
        boot.api_key_file.startswith("/") and boot.api_key_file.endswith(f"/{API_KEY_CREDENTIAL}")
    ):
        raise BootConfigError(
            "api_key_file", f"api_key_file {boot.api_key_file!r}: an absolute path to a file "
            f"named {API_KEY_CREDENTIAL}, the credential llama-server's unit imports",
        )  # fmt: skip
    if boot.api_key_source and not (
        boot.api_key_file and API_KEY_SOURCE.fullmatch(boot.api_key_source)
    ):
        raise BootConfigError(
            "api_key_source", f"api_key_source {boot.api_key_source!r}: give "
            "aws-ssm:REGION:/NAME, gcp-sm:SECRET or azure-kv:SECRET, with api_key_file where it "
            "goes",
        )  # fmt: skip


def _validate_main(boot: NodeBoot) -> None:
    if boot.slice_manifest and not boot.rpc_workers:
        raise BootConfigError(
            "slice_manifest",
            "worker-local loading (slice_manifest) needs workers: a node that holds every layer "
            "fetches the whole model",
        )
    _validate_server(boot)
    if boot.server_listen is not None:
        _listen_address(boot.server_listen)
    # No workers: the model fits on the main node, which serves it alone without RPC.
    for ip in boot.rpc_workers:
        _private_host("rpc_workers", ip)
    if len(set(boot.rpc_workers)) != len(boot.rpc_workers):
        raise BootConfigError(
            "rpc_workers",
            f"rpc_workers lists an address twice: {', '.join(boot.rpc_workers)}",
        )
    if boot.rpc_workers and (
        len(boot.tensor_split) != len(boot.rpc_workers)
        or min(boot.tensor_split) < 0
        or boot.gpu_layers != sum(boot.tensor_split)
        or boot.gpu_layers < 1
    ):
        raise BootConfigError(
            "tensor_split",
            f"tensor_split {boot.tensor_split} and gpu_layers {boot.gpu_layers} do not place "
            f"layers on {len(boot.rpc_workers)} workers: give one count per worker (the last "
            "with the output head) and their sum; infra.core.placement computes them",
        )
    if not boot.model_urls:
        raise BootConfigError(
            "model_urls",
            "model_urls is empty: give the model's GGUF URL "
            "(every part, in order, for a split GGUF)",
        )
    # Each part is saved under its URL's file name: a URL without one, or two parts with the
    # same one, would leave a model that looks complete and is not.
    saved_as: dict[str, str] = {}
    parts = [(url, "model_urls") for url in boot.model_urls]
    parts += [(url, "draft_urls") for url in boot.draft_urls]
    for url, field_name in parts:
        if not re.match(r"(https?|file|s3|gs|az)://[^\s]+$", url):
            raise BootConfigError(
                field_name,
                f"model URL {url!r} is not an http(s)://, s3://, gs://, az:// or file:// URL "
                "without spaces",
            )
        # S3 needs the region (rclone signs for it); Cloud Storage and Blob Storage do not.
        if url.startswith("s3://") and not _REGION.fullmatch(boot.model_store_region):
            raise BootConfigError(
                "model_store_region",
                f"model URL {url!r} is in an object store: give model_store_region, the "
                f"store's region (for example us-east-1), not {boot.model_store_region!r}",
            )
        name = saved_name(url)
        if name in ("", ".", ".."):
            raise BootConfigError(
                field_name,
                f"model URL {url!r} does not end in a file name; give the URL of the GGUF file "
                "itself (of every part, for a split GGUF)",
            )
        if name in saved_as:
            raise BootConfigError(
                field_name,
                f"model URLs {saved_as[name]!r} and {url!r} both save as {name!r}; every part "
                "needs a file name of its own",
            )
        saved_as[name] = url
    if problem := split_parts_problem([saved_name(url) for url in boot.model_urls]):
        raise BootConfigError("model_urls", problem)
    problem = checksums_problem(boot.model_urls, boot.model_sha256)
    if problem:
        raise BootConfigError("model_sha256", problem)
    _validate_draft(boot)


def _validate_draft(boot: NodeBoot) -> None:
    if not boot.draft_urls:
        return
    if problem := split_parts_problem([saved_name(url) for url in boot.draft_urls]):
        raise BootConfigError("draft_urls", problem)
    if problem := checksums_problem(boot.draft_urls, boot.draft_sha256):
        raise BootConfigError("draft_sha256", problem)
    if not 1 <= boot.draft_max <= MAX_DRAFT_TOKENS or not 0 <= boot.draft_min <= boot.draft_max:
        raise BootConfigError(
            "draft_max",
            f"draft_max {boot.draft_max} and draft_min {boot.draft_min}: draft 1 to "
            f"{MAX_DRAFT_TOKENS} tokens a step, and at least draft_min (0 or more) of them",
        )
    if not 0 <= boot.draft_p_min <= 1:
        raise BootConfigError(
            "draft_p_min", f"draft_p_min {boot.draft_p_min} is a probability: give 0 to 1"
        )


def checksums_problem(urls: tuple[str, ...], sha256: tuple[str, ...]) -> str | None:
    """Why these checksums cannot verify these model parts, or None (none given is fine)."""
    if not sha256:
        return None
    if len(sha256) != len(urls):
        return (
            f"{len(sha256)} checksums for {len(urls)} model URLs; give one per part, in order, "
            "or none"
        )
    for digest in sha256:
        if not _SHA256.fullmatch(digest):
            return f"{digest!r} is not a 64-character lowercase hex sha256 digest"
    return None


def _private_host(name: str, text: str) -> None:
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        raise BootConfigError(name, f"{name} {text!r} is not an IP address") from None
    if ip.is_unspecified or not ip.is_private:
        raise BootConfigError(
            name,
            f"{name} {text!r} must be a private address of the cluster network: the RPC port "
            "has no authentication and must never listen publicly or on every interface",
        )


def _listen_address(text: str) -> None:
    """llama-server's --host: a private address, or 0.0.0.0 (every interface of a node that has
    only private ones: behind a balancer that delivers packets addressed to its own IP)."""
    try:
        ip = ipaddress.IPv4Address(text)
    except ValueError:
        raise BootConfigError(
            "server_listen",
            f"server_listen {text!r} is not an IPv4 address; give 0.0.0.0 or a private "
            "address of the node, or leave it unset for the node's own",
        ) from None
    if not (ip.is_unspecified or ip.is_private):
        raise BootConfigError(
            "server_listen",
            f"server_listen {text!r} is a public address; the API port is private: give "
            "0.0.0.0 or a private address of the node",
        )


def render_env_file(env: dict[str, str]) -> str:
    """An environment file that both bash ``source`` and systemd's EnvironmentFile= read."""
    return "".join(f"{name}='{value}'\n" for name, value in env.items())


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
