"""What every cloud's facts module provides: the limits and rules the config check enforces.

Facts modules import no provider SDK, so settings are checked (and refused) before a program
touches a cloud, and the planner and the tests can read them cheaply.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

# Tag keys the program sets on every resource; a user tag of the same name would be overwritten.
PROGRAM_TAGS = ("project", "stack", "role")
# Settings that only some clouds honour (see CloudFacts.refuses).
OPTIONAL_SETTINGS = (
    "sshPublicKey",
    "bastion",
    "encryptionAtHost",
    "diskThroughputMibps",
    "zone",
    "networkWatcher",
    "modelStoreKmsKey",
    "platform",
    "kubernetesImage",
    "kubernetesControllerSha256",
    "kubernetesControllerImage",
    "kubernetesApiCidrs",
)


@dataclass(frozen=True)
class Range:
    low: int
    high: int

    def __contains__(self, value: object) -> bool:
        return isinstance(value, int) and self.low <= value <= self.high

    def __str__(self) -> str:
        return f"{self.low:,}-{self.high:,}"

    def clamp(self, value: int) -> int:
        return max(self.low, min(self.high, value))


@dataclass(frozen=True)
class Provisioned:
    """A boot disk as the program creates it."""

    throughput_mibps: int | None  # None: the disk type has no throughput knob
    iops: int | None


@dataclass(frozen=True)
class DiskModel:
    """A cloud's boot-disk type: what the program provisions, how fast it reads, and the
    quantities its price list charges for (priced by the catalog's services.csv)."""

    name: str
    # The throughput and IOPS the size price includes; None: not provisioned separately.
    included_mibps: int | None = None
    included_iops: int | None = None
    # IOPS provisioned per MiB/s of throughput (gp3 allows 0.25 MiB/s per IOPS).
    iops_per_mibps: int = 0
    # Throughput that follows the size instead: (largest size in GiB, MB/s), smallest first.
    size_tiers_mbps: tuple[tuple[int, int], ...] = ()

    def provision(self, requested_mibps: int | None) -> Provisioned:
        """What a disk gets for a requested throughput (None: the type's baseline)."""
        if self.included_mibps is None:
            return Provisioned(None, None)
        throughput = max(self.included_mibps, requested_mibps or 0)
        if self.included_iops is None:
            return Provisioned(throughput, None)
        return Provisioned(throughput, max(self.included_iops, throughput * self.iops_per_mibps))

    def read_mibps(self, size_gb: int, requested_mibps: int | None) -> float:
        """The disk's sequential read throughput in MiB/s."""
        if self.size_tiers_mbps:
            size_gib = size_gb * 1e9 / 1024**3
            mbps = next(
                (mbps for tier, mbps in self.size_tiers_mbps if size_gib <= tier),
                self.size_tiers_mbps[-1][1],
            )
            return mbps * 1e6 / 1024**2
        return float(self.provision(requested_mibps).throughput_mibps or 0)

    def monthly_usage(self, size_gb: int, requested_mibps: int | None) -> dict[str, float]:
        """Quantities of the catalog's priced items one disk uses per month."""
        usage = {"disk_gb_month": float(size_gb)}
        provisioned = self.provision(requested_mibps)
        if self.included_mibps is not None and provisioned.throughput_mibps is not None:
            usage["disk_mibps_month"] = float(provisioned.throughput_mibps - self.included_mibps)
        if self.included_iops is not None and provisioned.iops is not None:
            usage["disk_iops_month"] = float(provisioned.iops - self.included_iops)
        return usage


@dataclass(frozen=True)
class NatModel:
    """How a cloud's NAT for the nodes' egress is charged."""

    name: str
    # Charged per VM behind it, up to this many (GCP Cloud NAT), instead of per gateway.
    per_vm_cap: int | None = None

    def hourly_usage(self, nodes: int) -> dict[str, float]:
        """Quantities of the catalog's priced items per hour, for this many nodes."""
        if self.per_vm_cap is not None:
            return {"nat_vm_hour": float(min(nodes, self.per_vm_cap)), "public_ip_hour": 1.0}
        return {"nat_gateway_hour": 1.0, "public_ip_hour": 1.0}


@dataclass(frozen=True)
class UserDataChannel:
    """How a cloud takes a node's user data, and how much."""

    field: str  # the provider argument that carries it as text
    limit_bytes: int
    # The value is base64 text (Azure's customData), and the limit counts that text.
    base64: bool = False
    # The argument that takes it gzipped (base64 of the gzip bytes); None: text only.
    gzip_field: str | None = None
    # Where the boot files beyond the boot's first steps are kept when the user data is too
    # small for them (a store the node reads with its own identity); "": the user data holds all.
    files_store: str = ""


@dataclass(frozen=True)
class ModelDisk:
    """A main node's model kept on a volume of its own, made apart from the node and attached
    once it runs (where that volume takes more throughput than one made with the node)."""

    # The model name the volume reports to the guest (/sys/block/*/device/model), by which the
    # boot knows it (model-disk.sh).
    device_model: str
    # The name the attachment gives it; the guest sees an NVMe disk whatever it is.
    device_name: str


@dataclass(frozen=True)
class VcpuQuota:
    """The quota an instance type's vCPUs count against, per region: its id in the cloud's API
    and its name as the cloud's console shows it."""

    id: str
    name: str


@dataclass(frozen=True)
class Right:
    """A permission the deployer needs for what a setting makes, as the cloud's permission check
    names it, with the roles that hold it and the way out without it."""

    action: str
    setting: str  # the setting that asks for it
    what: str  # what the program makes with it
    roles: str  # roles that hold it (and the common one that does not)
    way_out: str  # the setting change that needs it no more
    source: str


@dataclass(frozen=True)
class CloudFacts:
    name: str
    region_key: str  # the provider's own config key for the region
    region_pattern: re.Pattern[str]
    region_example: str
    arm_pattern: re.Pattern[str]
    arm_examples: str  # for the error a user sees when they give an x86 type
    boot_disk_gb: Range
    # Provisioned throughput of the disk the model is kept on (the boot disk, or ``model_disk``),
    # or None when the disk type has no such knob.
    disk_throughput_mibps: Range | None
    vpc_widest_prefix: int  # the widest network the provider takes for the cluster's range
    tag_problem: Callable[[Mapping[str, str]], str | None]
    tag_word: str  # "tag" or "label"
    image_pattern: re.Pattern[str]
    image_example: str
    image_meaning: str
    user_data: UserDataChannel
    disk: DiskModel
    nat: NatModel
    # The cloud's instance metadata and platform-agent endpoints, which a node must never be
    # sent to download from (link-local 169.254.0.0/16 is refused on every cloud).
    metadata_hosts: frozenset[str]
    metadata_addresses: frozenset[str]
    chart_colour: str  # the planner's charts draw this cloud's options in it
    # The instance type of the balancer node in front of the serving groups (with several): it
    # runs HAProxy (``infra.boot.balancer``) and is priced from the catalog as the nodes are.
    balancer_instance_type: str
    # Where the cloud keeps the stack's API key for its main nodes to read at boot; None: it
    # keeps none yet (the API is then reached through the tunnel and apiAllowedCidrs alone).
    api_key_store: str | None = None
    # How a spend guard ends a node's compute charge (infra.boot.node.STOP_BY): a guest power-off
    # where that stops the VM's billing, else the cloud's own deallocation.
    stop_by: str = "poweroff"
    # Settings of OPTIONAL_SETTINGS this cloud cannot honour, each with what it does instead;
    # the config check refuses them rather than dropping them.
    refuses: Mapping[str, str] = field(default_factory=dict)
    # The most a node's boot disk takes as it launches, where the model is on it (Kubernetes
    # nodes); None: as ``disk_throughput_mibps``.
    boot_disk_max_mibps: int | None = None
    # What this cloud cannot do, in words (capability -> what happens instead).
    limitations: Mapping[str, str] = field(default_factory=dict)
    # Nodes of this many vCPUs or more get the cloud's faster network tier, billed on top of
    # the instance (GCP's Tier_1); None: no such tier.
    fast_network_min_vcpus: int | None = None
    fast_network_name: str = ""
    # The vCPU quota an instance type counts against (None: a family the facts do not know).
    vcpu_quota: Callable[[str], VcpuQuota | None] = lambda _instance_type: None
    # The value a tag of the program's (the stack's name) takes, valid on this cloud.
    tag_value: Callable[[str], str] = str
    # A zone is the region's name and this (AWS us-east-1a, GCP us-central1-a); None: the
    # program places nodes in no zone (Azure), and the ``zone`` setting is refused.
    zone_suffix: re.Pattern[str] | None = None
    zone_example: str = ""
    # The URL scheme of the object store its nodes read a staged model from, with their own
    # identity over the private path; None: https model URLs only.
    model_store_scheme: str | None = None
    # NVIDIA Grace (GB200) types: Arm CPUs, but sold only with their GPUs (refused).
    grace_pattern: re.Pattern[str] | None = None
    # The main node keeps the model on a volume of its own, not its boot disk; None: boot disk.
    model_disk: ModelDisk | None = None
    # llama-server listens on every address of the main node, not its own alone. GCP's nodes
    # did so behind the passthrough balancer that came before the balancer node (packets
    # arrived addressed to the balancer); kept, since new boot data replaces every node. The
    # node has one, private, interface: its firewall decides either way.
    server_listens_on_all: bool = False
    # The most of a command's output its command channel brings back (``infra.live``);
    # None: all of it.
    command_output_chars: int | None = None

    @property
    def home_region(self) -> str:
        """The region the shipped stacks use, and the one the planner plans in unless told."""
        return self.region_example

    def zone_problem(self, zone: str, region: str) -> str | None:
        """Why ``zone`` is not one of the region's zones, or None."""
        if self.zone_suffix is None:
            return f"{self.name} places nodes in no zone"
        if zone.startswith(region) and self.zone_suffix.fullmatch(zone[len(region) :]):
            return None
        return f"{zone!r} is not a zone of {region} (like {region}{self.zone_example})"

    def gpu_capacity_problem(self, instance_type: str) -> str | None:
        """Why an NVIDIA Grace (GB200) type is refused, or None: the Grace CPUs are Arm, but
        the clouds sell these VMs only as GPU capacity."""
        if self.grace_pattern is None or not self.grace_pattern.fullmatch(instance_type):
            return None
        return (
            f"{instance_type} is an NVIDIA Grace (GB200) type, sold as GPU capacity: a CPU-only "
            "llama.cpp on it pays for idle Blackwell GPUs for a Grace's memory bandwidth, no "
            f"more than one Graviton4 socket's ({GRACE_SOURCE}); choose an Arm CPU type "
            f"({self.arm_examples})"
        )

    def is_arm(self, instance_type: str) -> bool:
        """Whether a type name is an Arm type, from the provider's naming rules."""
        return self.arm_pattern.fullmatch(instance_type) is not None


def reserved_tag_problem(tags: Mapping[str, str], extra: tuple[str, ...] = ()) -> str | None:
    """A user tag that the program sets itself."""
    for key in tags:
        if key in PROGRAM_TAGS + extra:
            names = ", ".join(PROGRAM_TAGS + extra)
            return f"{key!r} is set by the program on every resource ({names}); choose another name"
    return None


# Where the Grace verdict comes from.
GRACE_SOURCE = (
    "AWS sells P6e-GB200 as UltraServer capacity blocks, Google A4X as accelerator-optimized "
    "VMs, Azure ND GB200 v6 with 4 GPUs a VM; a Grace die streams about 0.5 TB/s, a Graviton4 "
    "socket 537.6 GB/s"
)

# How long flow logs are kept, on every cloud.
FLOW_LOG_RETENTION_DAYS = 30
