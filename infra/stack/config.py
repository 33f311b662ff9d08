"""The stack's configuration, read once into a typed, frozen, validated ``ClusterConfig``.

Each key's type, default and value check are declared once in ``infra.stack.settings``; what
depends on the cloud (region, instance types, disks, tags, image) is checked here against its
facts (``infra.clouds``). Every error names the key (``llama-rpc-cluster:<key>``) and says how to
fix it, and is raised before any resource is created.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from infra import catalog, models
from infra.boot import (
    VM_API_KEY_FILE,
    BootConfigError,
    Delivery,
    NodeBoot,
    checksums_problem,
    deliver,
    render,
)
from infra.boot.balancer import (
    HAPROXY_MAX_TIMEOUT_SECONDS,
    BalancerBoot,
    balancer_boot,
    balancer_guard,
)
from infra.boot.deliver import files_source as store_path
from infra.boot.group import ServingGroup, group_boots
from infra.boot.node import STAGED_SCHEMES, setting_of
from infra.boot.patches import switches_off
from infra.catalog import InstanceType
from infra.clouds import FACTS, CloudFacts, stores
from infra.clouds import aws as aws_facts
from infra.clouds import azure as azure_facts
from infra.clouds import gcp as gcp_facts
from infra.clouds.base import Right
from infra.core import costs, layout, network_rules, perf, placement, server_args, sizing
from infra.core.layout import PROJECT
from infra.core.limits import (
    DEFAULT_DRAFT_MAX,
    KUBERNETES,
    MAX_WORKERS,
    METRICS_PORT,
    VM,
    Cloud,
    Role,
)
from infra.core.placement import Placement
from infra.models import Model, ModelError
from infra.models.parts import model_id
from infra.preflight import Needs
from infra.stack.settings import BY_KEY, MODEL_KEYS, ConfigError, decode

__all__ = ["PROJECT", "ClusterConfig", "ConfigError", "from_settings", "load"]

REGION_KEYS = {name: facts.region_key for name, facts in FACTS.items()}
# Azure: the Key Vault secret that keeps the stack's API key (the vault is the stack's own).
AZURE_API_KEY_SECRET = "api-key"  # noqa: S105 (a secret's name, not a secret)
# Bounds no real model comes near, so that a typo or NaN stops here and not on a node:
# the largest public GGUFs are a few TB; the KV cache of a token a few MB; layers a few hundred.
MAX_MODEL_GB = 100_000
MAX_KV_BYTES_PER_TOKEN = 1 << 30
MAX_LAYERS = 4096


@dataclass(frozen=True)
class ClusterConfig:
    cloud: Cloud
    region: str
    instance_type: InstanceType
    main_instance_type: InstanceType
    worker_count: int
    model: Model
    # Every part of the GGUF, in order, and optionally each part's sha256.
    model_urls: tuple[str, ...]
    model_sha256: tuple[str, ...]
    llama_cpp_commit: str
    vpc_cidr: ipaddress.IPv4Network
    rpc_port: int
    server_port: int
    context_size: int
    slots: int
    placement: Placement
    main_disk_gb: int
    worker_disk_gb: int
    # Provisioned throughput of the main node's disk; None where the disk type has no such knob.
    disk_throughput_mibps: int | None
    api_allowed_cidrs: tuple[str, ...]
    tags: Mapping[str, str] = field(default_factory=dict)
    ssh_public_key: str | None = None
    # A pinned OS image (see CloudFacts.image_meaning); None: the provider's current Ubuntu
    # image when a node is created, kept for that node's life.
    image: str | None = None
    # The zone every node is created in; None: the first that offers the types, kept (AWS and
    # GCP; Azure places nodes in no zone).
    zone: str | None = None
    flow_logs: bool = True
    # Azure: the region's Network Watcher, which the VNet flow log belongs to.
    network_watcher: azure_facts.NetworkWatcher | None = None
    bastion: bool = False  # Azure: a Bastion host the tunnel goes through
    encryption_at_host: bool = False  # Azure
    # Azure: the resource group of the storage account that az:// model URLs name.
    model_store_resource_group: str | None = None
    # AWS: the KMS key of an SSE-KMS bucket that s3:// model URLs name.
    model_store_kms_key: str | None = None
    # Serving groups behind a private balancer (one: no balancer).
    replicas: int = 1
    # The model's id for clients (llama-server's --alias), and llama-server flags a stack adds.
    model_alias: str = ""
    server_args: tuple[str, ...] = ()
    # The llama.cpp patches turned off at run time (llamaCppPatchesOff: numbers, or "all").
    patches_off: tuple[str, ...] = ()
    # The API key: "generated" (per stack, by the program), "given" (the apiKey setting, a Pulumi
    # secret the program reads itself), or "none". The key itself is never held here.
    api_key: str = "none"
    # Spend guards: minutes idle, hours from each boot (0: off).
    stop_after_idle_minutes: int = 0
    stop_after_hours: int = 0
    stack: str = ""  # the Pulumi stack's name ("" when checked outside a deployment)
    # A draft model for speculative decoding on the main node (draftModel): its parts, checksums
    # and the tokens it drafts a step (at most, at least).
    draft: Model | None = None
    draft_urls: tuple[str, ...] = ()
    draft_sha256: tuple[str, ...] = ()
    draft_max: int = DEFAULT_DRAFT_MAX
    draft_min: int = 0
    # How the nodes run: "vm", or "kubernetes" (AWS: EKS, infra.stack.kube).
    platform: str = VM
    kubernetes_image: str | None = None  # the pods' image (platform kubernetes)
    # The LWS controller's manifest sha256 and image by digest (the program's pins, else these).
    kubernetes_controller_sha256: str | None = None
    kubernetes_controller_image: str | None = None
    kubernetes_api_cidrs: tuple[str, ...] = ()  # who reaches the EKS endpoint from outside

    @property
    def fetched_urls(self) -> tuple[str, ...]:
        """Every file the main node fetches: the model's parts, then the draft's."""
        return self.model_urls + self.draft_urls

    @property
    def api_key_parameter(self) -> str:
        """AWS: the SSM parameter (SecureString) that keeps the stack's API key."""
        return f"/{PROJECT}/{self.stack or 'stack'}/api-key"

    def files_path(self, role: str) -> str:
        """AWS: the SSM path under which each boot file of a role's nodes is a parameter."""
        return f"/{PROJECT}/{self.stack or 'stack'}/boot/{role}"

    def files_source(self, role: Role) -> str:
        """Where a role's nodes read the boot files their user data cannot hold ("": none).
        AWS's 16 KB holds a main node's first steps only: the stack keeps the rest (its later
        scripts, the llama.cpp patch set) in Parameter Store, and the node reads them with its
        own role. A worker, which has no role, gets all of its files in its user data."""
        return store_path(self.cloud, role, self.region, self.files_path(role))

    @property
    def api_key_secret_id(self) -> str:
        """GCP: the Secret Manager secret that keeps the stack's API key (its id: letters,
        digits, - and _; a stack name's dots become -)."""
        return f"{PROJECT}-{re.sub(r'[^A-Za-z0-9_-]', '-', self.stack or 'stack')}-api-key"

    @property
    def api_key_source(self) -> str:
        """Where a main node reads the key at boot, with its own identity ("": no key)."""
        if self.api_key == "none":
            return ""
        if self.cloud == "gcp":
            return f"gcp-sm:{self.api_key_secret_id}"
        if self.cloud == "azure":
            return f"azure-kv:{AZURE_API_KEY_SECRET}"
        return f"aws-ssm:{self.region}:{self.api_key_parameter}"

    @property
    def kubernetes(self) -> bool:
        return self.platform == KUBERNETES

    @property
    def kubernetes_worker_disk(self) -> tuple[int, int | None]:
        """On Kubernetes, a worker node's disk and throughput (``costs.kubernetes_worker_disk``)."""
        return costs.kubernetes_worker_disk(
            self.main_instance_type,
            self.instance_type,
            self.main_disk_gb,
            self.worker_disk_gb,
            self.disk_throughput_mibps,
        )

    @property
    def hourly_cost(self) -> costs.HourlyCost:
        """Instances, NAT and disks, priced from the catalog as the planner prices them; on
        Kubernetes, the control plane and no balancer node (HAProxy runs as pods there)."""
        group = costs.cluster_nodes(
            self.main_instance_type,
            self.instance_type,
            self.worker_count,
            main_disk_gb=self.main_disk_gb,
            worker_disk_gb=self.worker_disk_gb,
            main_disk_throughput_mibps=self.disk_throughput_mibps,
            kubernetes=self.kubernetes,
        )
        return costs.hourly_cost(
            self.cloud,
            group * self.replicas,
            balancer=self.balancer_boot is not None and not self.kubernetes,
            control_plane=self.kubernetes,
        )

    def needs(self, stack: str) -> Needs:
        """What the stack ``stack`` asks of its cloud account, for the preflight."""
        counts: Counter[str] = Counter()
        vcpus: dict[str, int] = {}
        roles = [self.main_instance_type] + [self.instance_type] * self.worker_count
        nodes = roles * self.replicas
        balancer = self.balancer_node_type
        if balancer is not None:
            nodes.append(balancer)
        for instance in nodes:
            counts[instance.name] += 1
            vcpus[instance.name] = instance.vcpus
        return Needs(
            cloud=self.cloud,
            region=self.region,
            stack=stack,
            nodes=dict(counts),
            vcpus=vcpus,
            zone=self.zone,
            network_watcher=self.network_watcher if self.flow_logs else None,
            key_vault=self.cloud == "azure" and self.api_key != "none",
            balancer=balancer.name if balancer is not None else None,
            rights=self.deployer_rights,
            model_disk_throughput=(
                FACTS[self.cloud].disk.provision(self.disk_throughput_mibps).throughput_mibps
                if FACTS[self.cloud].model_disk is not None and not self.kubernetes
                else None
            ),
            refused_zone_ids=(
                frozenset(aws_facts.EKS_UNSUPPORTED_ZONE_IDS) if self.kubernetes else frozenset()
            ),
            tags={"project": PROJECT, "stack": FACTS[self.cloud].tag_value(stack)},
        )

    @property
    def deployer_rights(self) -> tuple[Right, ...]:
        """What the deployer must be allowed beyond making resources (granting roles)."""
        keyed = self.api_key != "none"
        if self.cloud == "azure":
            return azure_facts.deployer_rights(
                api_key=keyed,
                staged=any(stores.blob_object(url) for url in self.fetched_urls),
                guard=(
                    "stopAfterIdleMinutes"
                    if self.stop_after_idle_minutes
                    else "stopAfterHours"
                    if self.stop_after_hours
                    else None
                ),
            )
        if self.cloud == "gcp":
            return gcp_facts.deployer_rights(api_key=keyed)
        return ()

    @property
    def balancer_node_type(self) -> InstanceType | None:
        """The balancer node's type, on a stack that has one (VMs with replicas; on Kubernetes
        HAProxy runs as pods)."""
        if self.balancer_boot is None or self.kubernetes:
            return None
        name = FACTS[self.cloud].balancer_instance_type
        found = catalog.find(self.cloud, self.region, name)
        if found is None:
            raise ConfigError(
                "replicas",
                f"the balancer node's type {name} is not in the instance catalog for "
                f"{self.cloud} {self.region}; choose another region, or one group",
            )
        return found

    @property
    def private_subnet(self) -> ipaddress.IPv4Network:
        return layout.private_subnet(self.vpc_cidr)

    @property
    def public_subnet(self) -> ipaddress.IPv4Network:
        return layout.public_subnet(self.vpc_cidr)

    def group_ips(self, group: int) -> list[str]:
        """A serving group's main node address, then its workers'."""
        return layout.node_ips(self.private_subnet, self.worker_count, group)

    @property
    def main_ip(self) -> str:
        """The first serving group's main node."""
        return self.group_ips(0)[0]

    @property
    def worker_ips(self) -> list[str]:
        """The first serving group's workers."""
        return self.group_ips(0)[1:]

    @property
    def main_ips(self) -> list[str]:
        """Every serving group's main node, in order: the balancer's targets."""
        return [self.group_ips(group)[0] for group in range(self.replicas)]

    @property
    def entry_ip(self) -> str:
        """Where requests go: the balancer node, or without one the first group's main node."""
        return self.balancer_boot.listen_ip if self.balancer_boot else self.main_ip

    @property
    def generation_timeout_seconds(self) -> int:
        """The longest a request can take: a slot's whole context with every slot of its group
        busy, at the predicted decode speed (``infra.core.perf``), or at an assumed floor where
        nothing predicts it. The balancer's timeouts outlast it."""
        nodes = [self.main_instance_type] + [self.instance_type] * self.worker_count
        cells = sizing.slot_context(self.context_size, self.slots)
        step = perf.batch_step(self.model, nodes, self.placement, cells, self.slots)
        tps = step.stream_tps if step is not None else sizing.UNKNOWN_DECODE_TPS
        return sizing.longest_generation_seconds(self.context_size, self.slots, tps)

    @cached_property
    def balancer_boot(self) -> BalancerBoot | None:
        """The balancer node's boot; None with one serving group. Whether there is a balancer
        is asked of this, never of ``replicas``. With a spend guard, the balancer node has the
        groups' (none on Kubernetes, which refuses a spend guard: HAProxy runs as pods there)."""
        # The groups' boots only where there is a balancer to guard (``balancer_boot`` says
        # None for one group): a stack's cost is asked of this before its boots are checked.
        guarded = not self.kubernetes and len(self.main_ips) > 1
        return balancer_boot(
            self.private_subnet,
            self.main_ips,
            server_port=self.server_port,
            slots=self.slots,
            timeout_seconds=self.generation_timeout_seconds,
            guard=balancer_guard(self.boots(0)[0]) if guarded else None,
        )

    def serving_group(self, group: int = 0) -> ServingGroup:
        """A serving group as the stack describes it to ``group_boots``: its addresses, the
        settings, and what the cloud's facts add."""
        facts = FACTS[self.cloud]
        fits = sizing.fits_memory(self.model.size_bytes, self.main_instance_type)
        return ServingGroup(
            ips=tuple(self.group_ips(group)),
            # The metrics port admits the cluster's network (the top view reads it through the
            # main node).
            cluster_cidr=str(self.vpc_cidr),
            placement=self.placement,
            model_urls=self.model_urls,
            model_sha256=self.model_sha256,
            context_size=self.context_size,
            slots=self.slots,
            llama_cpp_commit=self.llama_cpp_commit,
            rpc_port=self.rpc_port,
            server_port=self.server_port,
            draft_urls=self.draft_urls,
            draft_sha256=self.draft_sha256,
            draft_max=self.draft_max,
            draft_min=self.draft_min,
            model_alias=self.model_alias,
            server_args=self.server_args,
            api_key_file=VM_API_KEY_FILE if self.api_key_source else "",
            api_key_source=self.api_key_source,
            stop_after_idle_minutes=self.stop_after_idle_minutes,
            stop_after_hours=self.stop_after_hours,
            fetched_bytes=self.model.size_bytes + (self.draft.size_bytes if self.draft else 0),
            patches_off=self.patches_off,
            files_source=self.files_source("main"),
            stop_by=facts.stop_by,
            platform_addresses=tuple(sorted(a for a in facts.metadata_addresses if ":" not in a)),
            server_listen="0.0.0.0" if facts.server_listens_on_all else None,  # noqa: S104
            # A staged model lives in the stack's region: the private path reaches only that one.
            model_store_region=self.region,
            writeback_bytes=self.model.size_bytes if fits else 0,
            download_jobs=0
            if fits
            else sizing.download_jobs(
                self.model.size_bytes, len(self.model_urls), self.main_instance_type
            ),
            model_read_ahead_kb=0 if fits else sizing.MODEL_READ_AHEAD_KB,
            model_disk_gb=self.main_disk_gb if facts.model_disk else 0,
            model_disk_model=facts.model_disk.device_model if facts.model_disk else "",
        )

    def boots(self, group: int = 0) -> list[NodeBoot]:
        """A serving group's main node's and then each of its workers' boot settings."""
        return group_boots(self.serving_group(group))

    @cached_property
    def user_data(self) -> tuple[tuple[Delivery, ...], ...]:
        """Each serving group's user data, node by node as ``boots`` lists them, rendered and
        delivered once: the config check makes them to validate them (``from_settings``), and
        the program deploys these (a render is most of a large stack's check)."""
        return tuple(
            tuple(deliver(render(boot), self.cloud) for boot in self.boots(group))
            for group in range(self.replicas)
        )


def load() -> ClusterConfig:
    """Read the running stack's configuration (inside a Pulumi program)."""
    from pulumi.runtime.config import CONFIG, get_config_env  # noqa: PLC0415

    values = {**get_config_env(), **CONFIG.get()}
    settings = {
        key.split(":", 1)[1]: value
        for key, value in values.items()
        if key.startswith(f"{PROJECT}:")
    }
    cloud = decode(settings.get("cloud", BY_KEY["cloud"].default))
    region_key = REGION_KEYS.get(str(cloud), "")
    from pulumi import get_stack  # noqa: PLC0415
    from pulumi.runtime.config import is_config_secret  # noqa: PLC0415

    key = f"{PROJECT}:apiKey"
    if settings.get("apiKey") not in (None, "none") and not is_config_secret(key):
        raise ConfigError(
            "apiKey",
            "is kept in plain text in the stack file; set it with "
            "`pulumi config set --secret apiKey KEY`",
        )
    return from_settings(settings, region=values.get(region_key), stack=get_stack())


def _region(facts: CloudFacts, region: str | None) -> str:
    key = facts.region_key
    if not region:
        raise ConfigError(key, f"no region: set it with `pulumi config set {key} <region>`")
    if not facts.region_pattern.fullmatch(region):
        raise ConfigError(
            key, f"{region!r} is not a {facts.name} region name (like {facts.region_example})"
        )
    if not catalog.types_in(facts.name, region):
        known = sorted({e.region for e in catalog.load() if e.provider == facts.name})
        raise ConfigError(
            key,
            f"the instance catalog has no {facts.name} types in {region}; catalogued regions: "
            f"{', '.join(known)} (add the region's types to infra/catalog/instances.csv)",
        )
    return region


def _disk(settings: Mapping[str, Any], key: str, default: int, facts: CloudFacts) -> int:
    size = BY_KEY[key].read(settings)
    size = default if size is None else size
    if size not in facts.boot_disk_gb:
        raise ConfigError(
            key,
            f"{size} GB is outside what {facts.name} takes for a boot disk "
            f"({facts.boot_disk_gb} GB)",
        )
    return int(size)


def _throughput(
    settings: Mapping[str, Any],
    facts: CloudFacts,
    model: Model,
    main: InstanceType,
    *,
    kubernetes: bool,
) -> int | None:
    key = "diskThroughputMibps"
    limits = facts.disk_throughput_mibps
    if limits is None:
        return None
    throughput = BY_KEY[key].read(settings)
    if throughput is None:
        return sizing.main_disk_throughput_mibps(
            facts.name, model.size_bytes, main, boot_disk=kubernetes
        )
    if throughput not in limits:
        raise ConfigError(key, f"{throughput} is outside {facts.name}'s {limits} MiB/s")
    most = facts.boot_disk_max_mibps
    if kubernetes and most is not None and throughput > most:
        raise ConfigError(
            key,
            f"{throughput} MiB/s: on Kubernetes the model is on the node's boot disk, which "
            f"launches with at most {most}; give {most} or less",
        )
    return int(throughput)


def _image(settings: Mapping[str, Any], facts: CloudFacts) -> str | None:
    image: str | None = BY_KEY["image"].read(settings)
    if image is not None and not facts.image_pattern.fullmatch(image):
        raise ConfigError(
            "image",
            f"{image!r} is not {facts.image_meaning} (like {facts.image_example}); "
            "remove the setting to use the current Ubuntu 24.04 image",
        )
    return image


def _instance(cloud: str, region: str, key: str, name: str) -> InstanceType:
    facts = FACTS[cloud]
    grace = facts.gpu_capacity_problem(name)
    if grace is not None:
        raise ConfigError(key, grace)
    entry = catalog.find(cloud, region, name)
    if entry is None and not facts.is_arm(name):
        raise ConfigError(
            key,
            f"{name} is not an Arm instance type; this project runs on Arm CPUs "
            f"({facts.arm_examples}). Choose one of those.",
        )
    if entry is None:
        elsewhere = catalog.regions_of(cloud, name)
        known = ", ".join(t.name for t in catalog.types_in(cloud, region)) or "none"
        where = f" (it is listed for {', '.join(elsewhere)})" if elsewhere else ""
        raise ConfigError(
            key,
            f"{name} is not in the instance catalog for {cloud} {region}{where}; "
            f"known types there: {known}",
        )
    if entry.arch != "arm64":
        raise ConfigError(key, f"{name} is {entry.arch}, not Arm; choose an Arm instance type")
    return entry


def _strings(value: Any, key: str, what: str) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value or []
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise ConfigError(key, f"must be {what}, or a list of them (one per part, in order)")
    return tuple(items)


@dataclass(frozen=True)
class _ModelSetting:
    model: Model
    urls: tuple[str, ...]
    sha256: tuple[str, ...]


def _model(settings: Mapping[str, Any]) -> _ModelSetting:
    raw = BY_KEY["model"].read(settings)
    if not isinstance(raw, dict):
        raise ConfigError(
            "model", "is required: an object with `urls` (every part of the GGUF) and a `preset`"
        )
    return _model_at(raw, "model")


def _draft(settings: Mapping[str, Any], model: Model) -> _ModelSetting | None:
    """The draft model (draftModel), given as the model is; smaller than it, or it saves
    nothing. llama-server checks at start that the two share one vocabulary."""
    raw = BY_KEY["draftModel"].read(settings)
    if raw is None:
        for key in ("draftMax", "draftMin"):
            if key in settings:
                raise ConfigError(key, "goes with draftModel; set draftModel or remove it")
        return None
    if not isinstance(raw, dict):
        raise ConfigError("draftModel", "must be an object with `urls` and a `preset`, as `model`")
    draft = _model_at(raw, "draftModel")
    if draft.model.size_bytes >= model.size_bytes:
        raise ConfigError(
            "draftModel",
            f"{draft.model.size_bytes / 1e9:.1f} GB is not smaller than the model "
            f"({model.size_bytes / 1e9:.1f} GB): a draft must cost less a token than the model "
            "it drafts for (Llama-3.1-8B for the 70B and 405B)",
        )
    if BY_KEY["draftMin"].read(settings) > BY_KEY["draftMax"].read(settings):
        raise ConfigError("draftMin", "is more than draftMax; give at most draftMax")
    return draft


def _model_at(raw: dict[str, Any], key: str) -> _ModelSetting:
    unknown = sorted(set(raw) - set(MODEL_KEYS))
    if unknown:
        raise ConfigError(key, f"unknown keys {unknown}; known: {', '.join(MODEL_KEYS)}")
    # The preset first: a misspelt one is the error, not the URLs it would have come with.
    preset_name = raw.get("preset")
    preset = None
    if preset_name is not None:
        if not isinstance(preset_name, str):
            raise ConfigError(f"{key}.preset", f"must be a preset's name, got {preset_name!r}")
        try:  # The planner's matching: any case, "-", "_" or ".", a lone quantisation implied.
            preset = models.preset(preset_name, f"{key}.preset")
        except ModelError as error:
            raise ConfigError(f"{key}.preset", str(error).removeprefix(f"{key}.preset: ")) from None
    urls = _strings(raw.get("urls"), f"{key}.urls", "the GGUF's https URL")
    if not urls:
        raise ConfigError(
            f"{key}.urls",
            "no model URL: give the GGUF's https URL (every part, in order, for a split GGUF)",
        )
    for url in urls:
        problem = network_rules.model_url_problem(url)
        if problem:
            raise ConfigError(f"{key}.urls", problem)
    sha256 = _strings(raw.get("sha256"), f"{key}.sha256", "a sha256 hex digest")
    problem = checksums_problem(urls, sha256)
    if problem:
        raise ConfigError(f"{key}.sha256", problem)
    unverified = network_rules.unverified_download_problem(urls, sha256)
    if unverified:
        raise ConfigError(f"{key}.sha256", unverified)
    size_gb = raw.get("sizeGb", preset.size_gb if preset else None)
    kv = raw.get("kvBytesPerToken", preset.kv_bytes_per_token if preset else None)
    layers = raw.get("layers", preset.layers if preset else None)
    if (
        isinstance(size_gb, bool)
        or not isinstance(size_gb, int | float)
        or not 0 < size_gb <= MAX_MODEL_GB  # NaN and infinity fail this too
    ):
        raise ConfigError(
            f"{key}.sizeGb",
            f"give the model's size in GB (10^9 bytes), more than 0 and at most {MAX_MODEL_GB:,}, "
            "or a preset",
        )
    if isinstance(kv, bool) or not isinstance(kv, int) or not 0 < kv <= MAX_KV_BYTES_PER_TOKEN:
        raise ConfigError(
            f"{key}.kvBytesPerToken",
            "give the KV-cache bytes per token (layers x 2 x kv_heads x head_dim x 2, at most "
            f"{MAX_KV_BYTES_PER_TOKEN:,}), or a preset",
        )
    if layers is None:
        raise ConfigError(
            f"{key}.layers",
            "give the model's number of layers (its GGUF's block_count), or a preset: the "
            "layers are divided between the nodes",
        )
    if not isinstance(layers, int) or isinstance(layers, bool) or not 0 < layers <= MAX_LAYERS:
        raise ConfigError(
            f"{key}.layers", f"must be a whole number from 1 to {MAX_LAYERS}, got {layers!r}"
        )
    size_bytes = int(size_gb * 1e9)
    if preset is None:
        model = models.custom(size_bytes / 1e9, layers, kv)
    else:
        model = models.resized(preset, size_bytes, layers, kv)
    return _ModelSetting(model, urls, sha256)


def _vpc_cidr(settings: Mapping[str, Any], facts: CloudFacts) -> ipaddress.IPv4Network:
    text = BY_KEY["vpcCidr"].read(settings)
    try:
        cidr = ipaddress.IPv4Network(text)
    except ValueError as error:
        raise ConfigError("vpcCidr", f"{text!r} is not a valid IPv4 CIDR ({error})") from None
    problem = network_rules.vpc_cidr_problem(cidr, facts.vpc_widest_prefix)
    if problem:
        raise ConfigError("vpcCidr", problem)
    if cidr.prefixlen > 23:
        raise ConfigError("vpcCidr", f"{text} is too small; use /23 or larger (two /24 subnets)")
    return cidr


def _model_alias(settings: Mapping[str, Any], urls: tuple[str, ...]) -> str:
    """The setting, else the preset's name, else the first part's file name (``model_id``)."""
    given = BY_KEY["modelAlias"].read(settings)
    if given:
        return str(given)
    preset = BY_KEY["model"].read(settings).get("preset")
    if isinstance(preset, str):
        return models.preset(preset, "model.preset").name
    return model_id(urls[0])


def _api_key(settings: Mapping[str, Any], facts: CloudFacts) -> str:
    """ "generated", "given" or "none": a key where the cloud keeps one, unless told otherwise;
    never no key by accident where apiAllowedCidrs opens the API beyond the tunnel."""
    given = BY_KEY["apiKey"].read(settings)
    if given == "none":
        if _api_cidrs(settings):
            raise ConfigError(
                "apiKey",
                "`none` with apiAllowedCidrs would let those ranges use the API without a key; "
                "leave apiKey unset (a key is generated) or remove apiAllowedCidrs",
            )
        if not server_args.cors_closed(_server_args(settings)):
            # The pinned llama-server answers every Origin by default (common/common.h,
            # cors_origins "*"), so any web page the operator opens could use the tunnel.
            raise ConfigError(
                "apiKey",
                "`none` lets any web page open in your browser use the API through the tunnel "
                '(llama-server allows every origin); add ["--cors-origins", "https://ORIGIN"] '
                "to serverArgs for the one page that may, or leave apiKey unset (a key is "
                "generated)",
            )
        return "none"
    if facts.api_key_store is None:
        if given is not None:
            raise ConfigError(
                "apiKey",
                f"{facts.name} stacks keep no API key yet; remove apiKey (the API is reached "
                "through the tunnel and apiAllowedCidrs alone) or set it to none",
            )
        return "none"
    return "generated" if given is None else "given"


def _server_args(settings: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(str(arg) for arg in BY_KEY["serverArgs"].read(settings))


def _patches_off(settings: Mapping[str, Any], commit: str) -> tuple[str, ...]:
    key = "llamaCppPatchesOff"
    given = tuple(BY_KEY[key].read(settings))
    try:
        switches_off(commit, given)
    except ValueError as error:
        raise ConfigError(key, str(error)) from None
    return given


def _api_cidrs(settings: Mapping[str, Any], key: str = "apiAllowedCidrs") -> tuple[str, ...]:
    raw = BY_KEY[key].read(settings)
    if not isinstance(raw, list):
        raise ConfigError(key, "must be a list of CIDRs")
    if len(raw) > network_rules.MAX_API_CIDRS:
        raise ConfigError(
            key, f"{len(raw)} ranges; at most {network_rules.MAX_API_CIDRS} (one rule each)"
        )
    cidrs = []
    for text in raw:
        problem = network_rules.api_cidr_problem(str(text))
        if problem:
            raise ConfigError(key, problem)
        cidrs.append(str(ipaddress.ip_network(str(text), strict=False)))
    return tuple(cidrs)


def _tags(settings: Mapping[str, Any], facts: CloudFacts) -> dict[str, str]:
    raw = BY_KEY["tags"].read(settings)
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise ConfigError("tags", f"must be a map of {facts.tag_word} names to string values")
    problem = facts.tag_problem(raw)
    if problem:
        raise ConfigError("tags", problem)
    return dict(raw)


def _zone(settings: Mapping[str, Any], facts: CloudFacts, region: str) -> str | None:
    zone: str | None = BY_KEY["zone"].read(settings)
    if zone is None:
        return None
    problem = facts.zone_problem(zone, region)
    if problem:
        raise ConfigError("zone", f"{problem}; or remove the setting to let the program choose")
    return zone


def _network_watcher(
    settings: Mapping[str, Any], facts: CloudFacts, region: str
) -> azure_facts.NetworkWatcher | None:
    if facts.name != azure_facts.FACTS.name:
        return None
    text = BY_KEY["networkWatcher"].read(settings)
    if text is not None and not BY_KEY["flowLogs"].read(settings):
        raise ConfigError(
            "networkWatcher", "only the flow log uses it, and flowLogs is false; remove it"
        )
    if text is None:
        return azure_facts.default_network_watcher(region)
    watcher = azure_facts.parse_network_watcher(text)
    if watcher is None:  # the setting's own check has refused it already
        raise ConfigError("networkWatcher", f"{text!r} is not RESOURCE_GROUP/NAME")
    return watcher


def _placement(
    model: Model,
    context: int,
    slots: int,
    *,
    main_type: InstanceType,
    worker_type: InstanceType,
    worker_count: int,
    draft: Model | None = None,
) -> Placement:
    """Divide the layers between the main node and the workers; an error if they cannot hold
    them, naming the fix. A draft model and its KV cache (the target's context, every slot) take
    their room on the main node first."""
    main_usable = sizing.usable_memory_bytes(main_type)
    if draft is not None:
        main_usable -= sizing.draft_bytes(draft, context, slots)
    worker_usable = sizing.usable_memory_bytes(worker_type)
    result = placement.place(model, context, slots, [main_usable] + [worker_usable] * worker_count)
    if result.fits:
        return result
    worst = result.worst
    node_type = main_type if worst.node == placement.MAIN else worker_type
    fewest = placement.fewest_workers(
        model,
        context,
        slots,
        main_usable=main_usable,
        worker_usable=worker_usable,
        most=MAX_WORKERS,
    )
    if fewest is not None:
        fix = f"raise workerCount to {fewest}"
    elif worker_count == 0:
        fix = "add workers"
    else:
        fix = f"even {MAX_WORKERS} workers are too few"
    raise ConfigError(
        "workerCount",
        f"the model does not fit: with {worker_count} workers the {worst.node} node "
        f"({node_type.name}) would hold {worst.layers} layers and need "
        f"{worst.need_bytes / 1024**3:.1f} GiB (weights, KV cache for contextSize {context} x "
        f"{slots} slots, buffers) but has {worst.usable_bytes / 1024**3:.1f} GiB usable; {fix}, "
        "or choose instance types with more memory",
    )


def _refused(settings: Mapping[str, Any], facts: CloudFacts) -> None:
    """A setting this cloud cannot honour is refused, not dropped (its default is harmless)."""
    for key, instead in facts.refuses.items():
        value = decode(settings.get(key))
        if value is not None and value != BY_KEY[key].default:
            raise ConfigError(key, f"{facts.name} does not take this setting: {instead}; remove it")


def _model_store(
    settings: Mapping[str, Any], urls: tuple[str, ...], facts: CloudFacts
) -> str | None:
    """Object-store URLs only where the cloud's nodes read its store. Returns the resource group
    of the storage account that Azure's az:// URLs name (``modelStoreResourceGroup``): a blob
    URL does not say it, and the scope of the node's role assignment needs it."""
    store = facts.model_store_scheme
    for url in urls:
        scheme = url.split("://", 1)[0] + "://"
        if scheme not in ("https://", "http://", store):
            where = f"from {store} URLs only" if store else "from no object store"
            raise ConfigError(
                "model.urls",
                f"{url!r}: {facts.name} nodes read a staged model {where}, their own cloud's "
                f"store; give an https URL{f' or a {store} one' if store else ''}",
            )
    key = "modelStoreResourceGroup"
    group: str | None = BY_KEY[key].read(settings)
    blobs = [blob for blob in map(stores.blob_object, urls) if blob]
    if group is not None and not blobs:
        raise ConfigError(
            key,
            "only az:// model URLs (Azure) use it, for their storage account's resource group; "
            "remove it",
        )
    if blobs and group is None:
        raise ConfigError(
            key,
            f"is required with az:// model URLs: the resource group of storage account "
            f"{blobs[0][0]!r}, where the main node is given read access to container "
            f"{blobs[0][1]!r}; set it with `pulumi config set {key} <group>`",
        )
    return group


def _kms_key(settings: Mapping[str, Any], urls: tuple[str, ...], region: str) -> str | None:
    key = "modelStoreKmsKey"
    arn: str | None = BY_KEY[key].read(settings)
    if arn is None:
        return None
    if not any(stores.s3_object(url) for url in urls):
        raise ConfigError(key, "only s3:// model URLs are read with it; remove it")
    match = aws_facts.KMS_KEY_ARN.fullmatch(arn)
    if match is not None and match.group(1) != region:
        raise ConfigError(
            key,
            f"the key is in {match.group(1)}, the stack in {region}: an SSE-KMS bucket's key is "
            "in the bucket's region, and the stack reads buckets of its own region only",
        )
    return arn


def from_settings(
    settings: Mapping[str, Any], region: str | None, stack: str = ""
) -> ClusterConfig:
    """Validate raw settings (the project's config keys without their namespace) of ``stack``."""
    unknown = sorted(set(settings) - set(BY_KEY))
    if unknown:
        raise ConfigError(unknown[0], f"unknown key; known keys: {', '.join(BY_KEY)}")
    cloud = BY_KEY["cloud"].read(settings)
    if cloud not in FACTS:
        raise ConfigError("cloud", f"{cloud!r} is not one of {', '.join(FACTS)}")
    facts = FACTS[cloud]
    _refused(settings, facts)
    platform = BY_KEY["platform"].read(settings)
    region = _region(facts, region)
    worker_type = _instance(cloud, region, "instanceType", BY_KEY["instanceType"].read(settings))
    main_name = BY_KEY["mainInstanceType"].read(settings) or worker_type.name
    main_type = _instance(cloud, region, "mainInstanceType", main_name)

    worker_count = BY_KEY["workerCount"].read(settings)
    replicas = BY_KEY["replicas"].read(settings)
    rpc_port = BY_KEY["rpcPort"].read(settings)
    server_port = BY_KEY["serverPort"].read(settings)
    if rpc_port == server_port:
        raise ConfigError("serverPort", f"equals rpcPort ({rpc_port}); choose another port")
    for key, port in (("rpcPort", rpc_port), ("serverPort", server_port)):
        if port == METRICS_PORT:
            raise ConfigError(
                key,
                f"{port} is the node metrics' port (prometheus-node-exporter), which every node "
                "keeps to itself and its own main node; choose another port",
            )
    context = BY_KEY["contextSize"].read(settings)
    model_setting = _model(settings)
    model = model_setting.model
    draft_setting = _draft(settings, model)
    draft_urls = draft_setting.urls if draft_setting else ()
    store_group = _model_store(settings, model_setting.urls + draft_urls, facts)
    if model.context_length and context > model.context_length:
        raise ConfigError(
            "contextSize",
            f"{context} tokens is more than {model.name} supports "
            f"({model.context_length}); use at most {model.context_length}",
        )
    slots = BY_KEY["slots"].read(settings)
    shares = _placement(
        model,
        context,
        slots,
        main_type=main_type,
        worker_type=worker_type,
        worker_count=worker_count,
        draft=draft_setting.model if draft_setting else None,
    )
    fetched_bytes = model.size_bytes + (draft_setting.model.size_bytes if draft_setting else 0)
    main_disk = _disk(settings, "mainDiskGb", sizing.default_main_disk_gb(fetched_bytes), facts)
    worker_disk = _disk(settings, "workerDiskGb", sizing.WORKER_DISK_GB, facts)
    model_gb = fetched_bytes / 1e9
    if main_disk < model_gb + sizing.SYSTEM_DISK_GB:
        what = "model and its draft" if draft_setting else "model"
        raise ConfigError(
            "mainDiskGb", f"{main_disk} GB cannot hold the {model_gb:.0f} GB {what} and the build"
        )
    if worker_disk < sizing.SYSTEM_DISK_GB:
        raise ConfigError(
            "workerDiskGb",
            f"{worker_disk} GB cannot hold the OS, the build tools and the llama.cpp build; "
            f"give {sizing.SYSTEM_DISK_GB} or more",
        )
    config = ClusterConfig(
        cloud=cloud,
        region=region,
        instance_type=worker_type,
        main_instance_type=main_type,
        worker_count=worker_count,
        model=model,
        model_urls=model_setting.urls,
        model_sha256=model_setting.sha256,
        llama_cpp_commit=BY_KEY["llamaCppCommit"].read(settings),
        vpc_cidr=_vpc_cidr(settings, facts),
        rpc_port=rpc_port,
        server_port=server_port,
        context_size=context,
        slots=slots,
        placement=shares,
        main_disk_gb=main_disk,
        worker_disk_gb=worker_disk,
        disk_throughput_mibps=_throughput(
            settings, facts, model, main_type, kubernetes=platform == KUBERNETES
        ),
        api_allowed_cidrs=_api_cidrs(settings),
        tags=_tags(settings, facts),
        ssh_public_key=BY_KEY["sshPublicKey"].read(settings),
        image=_image(settings, facts),
        zone=_zone(settings, facts, region),
        flow_logs=BY_KEY["flowLogs"].read(settings),
        network_watcher=_network_watcher(settings, facts, region),
        bastion=BY_KEY["bastion"].read(settings),
        encryption_at_host=BY_KEY["encryptionAtHost"].read(settings),
        model_store_resource_group=store_group,
        model_store_kms_key=_kms_key(settings, model_setting.urls + draft_urls, region),
        replicas=replicas,
        model_alias=_model_alias(settings, model_setting.urls),
        server_args=_server_args(settings),
        patches_off=_patches_off(settings, BY_KEY["llamaCppCommit"].read(settings)),
        api_key=_api_key(settings, facts),
        stop_after_idle_minutes=BY_KEY["stopAfterIdleMinutes"].read(settings) or 0,
        stop_after_hours=BY_KEY["stopAfterHours"].read(settings) or 0,
        stack=stack,
        draft=draft_setting.model if draft_setting else None,
        draft_urls=draft_urls,
        draft_sha256=draft_setting.sha256 if draft_setting else (),
        draft_max=BY_KEY["draftMax"].read(settings),
        draft_min=BY_KEY["draftMin"].read(settings),
        platform=platform,
        kubernetes_image=BY_KEY["kubernetesImage"].read(settings),
        kubernetes_controller_sha256=BY_KEY["kubernetesControllerSha256"].read(settings),
        kubernetes_controller_image=BY_KEY["kubernetesControllerImage"].read(settings),
        kubernetes_api_cidrs=_api_cidrs(settings, "kubernetesApiCidrs"),
    )
    _platform(config)
    _balancer_timeouts(config)
    try:
        _spending(settings, config)
    except BootConfigError as error:  # the balancer's guard reads the groups' boots
        raise ConfigError(setting_of(error.setting) or "model", str(error)) from None
    _boot_data(config)
    return config


# What a pod's settings travel in on Kubernetes (infra/stack/kube/objects.py): a ConfigMap, whose
# data "cannot exceed 1 MiB" (kubernetes.io/docs/concepts/configuration/configmap). Pods have no
# user data, so no VM's user-data limit applies to them.
CONFIG_MAP_LIMIT_BYTES = 1 << 20


def _boot_data(config: ClusterConfig) -> None:
    """Every node's boot data, rendered and delivered as the program will (and kept for it): a
    boot setting the renderer rejects, or boot data over its delivery's limit (a VM's user data,
    a pod's ConfigMap), stops here."""
    try:
        if config.kubernetes:
            _config_maps(config)
        else:
            _ = config.user_data
    except BootConfigError as error:
        if error.setting == "user_data":
            setting, remedy = _user_data_filler(config)
            raise ConfigError(setting, f"{error}; {remedy}") from None
        raise ConfigError(setting_of(error.setting) or "model", str(error)) from None


def _config_maps(config: ClusterConfig) -> None:
    """A pod's settings, each role's as its ConfigMap holds them, within a ConfigMap's limit."""
    for boot in config.boots(0):
        _ = render(boot)  # the renderer's own checks of the settings
        size = sum(len(k.encode()) + len(v.encode()) for k, v in boot.env().items())
        if size > CONFIG_MAP_LIMIT_BYTES:
            raise BootConfigError(
                "user_data",
                f"the {boot.role} pods' settings are {size:,} bytes, over a ConfigMap's "
                f"{CONFIG_MAP_LIMIT_BYTES:,}-byte limit",
            )


def _user_data_filler(config: ClusterConfig) -> tuple[str, str]:
    """The setting that puts the most into a node's user data, and how to make it smaller: the
    one to blame when the user data is over the cloud's limit."""
    digest = 64 + 1
    filled = {
        "model.urls": (
            sum(len(url) + 1 for url in config.model_urls) + digest * len(config.model_sha256),
            "list fewer parts (or stage the model: one short URL a part)",
        ),
        "draftModel.urls": (
            sum(len(url) + 1 for url in config.draft_urls) + digest * len(config.draft_sha256),
            "list fewer draft parts (or stage the draft model)",
        ),
        "serverArgs": (
            sum(len(arg) + 1 for arg in config.server_args),
            "give fewer flags",
        ),
    }
    setting = max(filled, key=lambda key: filled[key][0])
    return setting, filled[setting][1]


def _balancer_timeouts(config: ClusterConfig) -> None:
    """A balancer's timeouts outlast the longest generation (``generation_timeout_seconds``),
    and HAProxy takes none beyond about 24.8 days: a context that long to generate is refused
    where the balancer would otherwise never start."""
    if config.replicas < 2:
        return
    seconds = config.generation_timeout_seconds
    if seconds <= HAPROXY_MAX_TIMEOUT_SECONDS:
        return
    raise ConfigError(
        "contextSize",
        f"{config.context_size:,} tokens a slot could take {seconds:,} s to generate at the "
        f"predicted speed, longer than the balancer's longest timeout (HAProxy's, "
        f"{HAPROXY_MAX_TIMEOUT_SECONDS:,} s); give a smaller contextSize, or replicas 1",
    )


def _spending(settings: Mapping[str, Any], config: ClusterConfig) -> None:
    """A stack that costs more an hour than ``maxHourlyUsd`` is refused: 10 groups of 16 large
    nodes are hundreds of dollars an hour, and more often a slip than a plan."""
    limit = BY_KEY["maxHourlyUsd"].read(settings)
    total = config.hourly_cost.total
    if total is None or total <= limit:
        return
    nodes = config.replicas * (config.worker_count + 1)
    raise ConfigError(
        "maxHourlyUsd",
        f"the stack would cost ${total:,.2f}/h ({nodes} nodes: {config.replicas} group(s) of a "
        f"{config.main_instance_type.name} main node and {config.worker_count} x "
        f"{config.instance_type.name}), more than maxHourlyUsd (${limit}/h); fewer replicas or "
        f"workers, or raise it to {math.ceil(total)} if you mean it",
    )


def kubernetes_refusals(config: ClusterConfig) -> list[tuple[str, str]]:
    """What of a stack pods cannot do, as (setting, why and the way out): the stack's
    config check refuses these with platform kubernetes, and ``lrc k8s render`` for any stack."""
    found = []
    if config.stop_after_idle_minutes or config.stop_after_hours:
        setting = "stopAfterIdleMinutes" if config.stop_after_idle_minutes else "stopAfterHours"
        found.append(
            (
                setting,
                "a pod cannot power off its node; scale the LeaderWorkerSet to 0 replicas "
                "instead, and remove the setting",
            )
        )
    staged = [url for url in config.fetched_urls if url.startswith(STAGED_SCHEMES)]
    if staged:
        found.append(
            (
                "model.urls",
                f"{staged[0]} is read with a VM's own identity, which a pod does not have; "
                "list the model's https URLs",
            )
        )
    return found


def _platform(config: ClusterConfig) -> None:
    """The kubernetes platform's own settings, given only with it, and what it cannot do."""
    if not config.kubernetes:
        for key, given in (
            ("kubernetesImage", config.kubernetes_image),
            ("kubernetesControllerSha256", config.kubernetes_controller_sha256),
            ("kubernetesControllerImage", config.kubernetes_controller_image),
            ("kubernetesApiCidrs", config.kubernetes_api_cidrs),
        ):
            if given:
                raise ConfigError(key, "is for platform kubernetes only; remove it")
        return
    if config.image:
        raise ConfigError(
            "image",
            "the EKS nodes run Amazon Linux 2023 for Arm, which EKS keeps current; remove it",
        )
    if not config.kubernetes_image:
        raise ConfigError(
            "kubernetesImage",
            "is required with platform kubernetes: build the image from `lrc k8s render "
            "--stack STACK --image IMAGE --out DIR` (DIR/image), push it to a registry the "
            "nodes pull from, and `pulumi config set kubernetesImage IMAGE`",
        )
    if not any(not network_rules.is_internal(c) for c in config.kubernetes_api_cidrs):
        given = ", ".join(config.kubernetes_api_cidrs)
        raise ConfigError(
            "kubernetesApiCidrs",
            (f"{given} are private ranges only" if given else "is empty")
            + "; `pulumi up` applies the Kubernetes objects through the EKS API endpoint from "
            "where it runs, and a private endpoint is reachable only from inside the VPC this "
            "same `up` creates (no VPN or peering reaches it yet): give the public address "
            "`pulumi up` and kubectl run from, e.g. `pulumi config set --json "
            "kubernetesApiCidrs '[\"<your address>/32\"]'` (`curl "
            "https://checkip.amazonaws.com` says it); EKS's public endpoint then admits those "
            "ranges alone",
        )
    for key, why in kubernetes_refusals(config):
        raise ConfigError(key, why)
