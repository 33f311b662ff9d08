"""The stack's configuration, read once into a typed, frozen, validated ``ClusterConfig``.

Every error names the key (``llama-rpc-cluster:<key>``) and says how to fix it, and is raised
before any resource is created.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from infra import catalog, models, network_rules, nodes, placement, sizing
from infra.boot import BootConfigError, Cloud
from infra.catalog import InstanceType
from infra.clouds.facts import FACTS, CloudFacts
from infra.models import PRESETS, Model
from infra.pins import LLAMA_CPP_COMMIT, MAX_WORKERS, RPC_PORT, SERVER_PORT, is_full_commit
from infra.placement import Placement

PROJECT = "llama-rpc-cluster"
REGION_KEYS = {name: facts.region_key for name, facts in FACTS.items()}
# The services run as an unprivileged user, which cannot bind ports below this.
LOWEST_UNPRIVILEGED_PORT = 1024
DEFAULT_DISK_THROUGHPUT_MIBPS = 1000
# Which setting a boot-data error comes from (``BootConfigError.setting`` -> config key).
BOOT_SETTING_KEYS = {
    "model_urls": "model.urls",
    "model_sha256": "model.sha256",
    "user_data": "model.urls",
    "context_size": "contextSize",
    "slots": "slots",
    "rpc_port": "rpcPort",
    "server_port": "serverPort",
    "llama_cpp_commit": "llamaCppCommit",
    "node_ip": "vpcCidr",
    "rpc_workers": "vpcCidr",
    "rpc_allowed_sources": "vpcCidr",
    "cluster_cidr": "vpcCidr",
}
KNOWN_KEYS = (
    "cloud",
    "instanceType",
    "mainInstanceType",
    "workerCount",
    "model",
    "llamaCppCommit",
    "vpcCidr",
    "rpcPort",
    "serverPort",
    "contextSize",
    "slots",
    "mainDiskGb",
    "workerDiskGb",
    "diskThroughputMibps",
    "apiAllowedCidrs",
    "tags",
    "sshPublicKey",
    "image",
    "flowLogs",
    "bastion",
    "encryptionAtHost",
)
MODEL_KEYS = ("preset", "urls", "sha256", "sizeGb", "layers", "kvBytesPerToken")


class ConfigError(ValueError):
    """A configuration value that cannot work; raised before anything is created.

    ``key`` is one of the project's keys, or a provider's own (``aws:region``) as given."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"{key if ':' in key else f'{PROJECT}:{key}'}: {message}")


@dataclass(frozen=True)
class ModelSpec:
    urls: tuple[str, ...]
    sha256: tuple[str, ...]
    size_bytes: int
    layers: int
    kv_bytes_per_token: int
    preset: str | None = None

    def described(self) -> Model:
        """The model as sizing sees it: the preset's shape (embeddings, context length) with the
        sizes given here, or a custom model."""
        base = PRESETS.get(self.preset or "")
        if base is None:
            return models.custom(self.size_bytes / 1e9, self.layers, self.kv_bytes_per_token)
        if (base.size_bytes, base.layers, base.kv_bytes_per_token) == (
            self.size_bytes,
            self.layers,
            self.kv_bytes_per_token,
        ):
            return base
        scale = self.size_bytes / base.size_bytes  # the same shape, quantised differently

        def scaled(value: int) -> int:
            return int(value * scale)

        return dataclasses.replace(
            base,
            size_bytes=self.size_bytes,
            layers=self.layers,
            kv_bytes_per_token=self.kv_bytes_per_token,
            active_bytes=None if base.active_bytes is None else scaled(base.active_bytes),
            input_bytes=scaled(base.input_bytes),
            output_bytes=scaled(base.output_bytes),
            source="config",
        )


@dataclass(frozen=True)
class ClusterConfig:
    cloud: Cloud
    region: str
    instance_type: InstanceType
    main_instance_type: InstanceType
    worker_count: int
    model: ModelSpec
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
    flow_logs: bool = True
    bastion: bool = False  # Azure: a Bastion host the tunnel goes through
    encryption_at_host: bool = False  # Azure
    # Every node with its rendered user data, main first (set by from_settings).
    nodes: tuple[nodes.NodePlan, ...] = ()

    @property
    def private_subnet(self) -> ipaddress.IPv4Network:
        return next(self.vpc_cidr.subnets(new_prefix=24))

    @property
    def public_subnet(self) -> ipaddress.IPv4Network:
        subnets = self.vpc_cidr.subnets(new_prefix=24)
        next(subnets)
        return next(subnets)

    @property
    def main_ip(self) -> str:
        return str(self.private_subnet.network_address + 10)

    @property
    def worker_ips(self) -> list[str]:
        base = self.private_subnet.network_address
        return [str(base + 11 + i) for i in range(self.worker_count)]

    @property
    def hourly_usd(self) -> float | None:
        """Instances only, from the catalog; None when a price is unknown."""
        main, worker = self.main_instance_type.hourly_usd, self.instance_type.hourly_usd
        if main is None or worker is None:
            return None
        return round(main + worker * self.worker_count, 5)


def load() -> ClusterConfig:
    """Read the running stack's configuration (inside a Pulumi program)."""
    from pulumi.runtime.config import CONFIG, get_config_env  # noqa: PLC0415

    values = {**get_config_env(), **CONFIG.get()}
    settings = {
        key.split(":", 1)[1]: value
        for key, value in values.items()
        if key.startswith(f"{PROJECT}:")
    }
    cloud = _decode(settings.get("cloud", "aws"))
    region_key = REGION_KEYS.get(str(cloud), "")
    return from_settings(settings, region=values.get(region_key))


def _decode(value: Any) -> Any:
    """Pulumi hands structured values over as JSON text."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _string(settings: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = settings.get(key, default)
    if value is None:
        raise ConfigError(key, f"is required; set it with `pulumi config set {key} <value>`")
    if not isinstance(value, str) or not value:
        raise ConfigError(key, f"must be a non-empty string, got {value!r}")
    return value


def _int(settings: Mapping[str, Any], key: str, default: int) -> int:
    value = _decode(settings.get(key, default))
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(key, f"must be a whole number, got {value!r}")
    return value


def _bool(settings: Mapping[str, Any], key: str, default: bool) -> bool:
    value = _decode(settings.get(key, default))
    if not isinstance(value, bool):
        raise ConfigError(key, f"must be true or false, got {value!r}")
    return value


def _port(settings: Mapping[str, Any], key: str, default: int) -> int:
    port = _int(settings, key, default)
    if not 1 <= port <= 65535:
        raise ConfigError(key, f"{port} is outside 1-65535; choose a valid TCP port")
    if port < LOWEST_UNPRIVILEGED_PORT:
        raise ConfigError(
            key,
            f"{port} is a privileged port, and the service runs unprivileged; choose one of "
            f"{LOWEST_UNPRIVILEGED_PORT}-65535",
        )
    return port


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
    size = _int(settings, key, default)
    if size not in facts.boot_disk_gb:
        raise ConfigError(
            key,
            f"{size} GB is outside what {facts.name} takes for a boot disk "
            f"({facts.boot_disk_gb} GB)",
        )
    return size


def _throughput(settings: Mapping[str, Any], facts: CloudFacts) -> int | None:
    key = "diskThroughputMibps"
    limits = facts.disk_throughput_mibps
    if limits is None:
        return None
    throughput = _int(settings, key, min(DEFAULT_DISK_THROUGHPUT_MIBPS, limits.high))
    if throughput not in limits:
        raise ConfigError(key, f"{throughput} is outside {facts.name}'s {limits} MiB/s")
    return throughput


def _image(settings: Mapping[str, Any], facts: CloudFacts) -> str | None:
    image = settings.get("image")
    if image is None:
        return None
    if not isinstance(image, str) or not facts.image_pattern.fullmatch(image):
        raise ConfigError(
            "image",
            f"{image!r} is not {facts.image_meaning} (like {facts.image_example}); "
            "remove the setting to use the current Ubuntu 24.04 image",
        )
    return image


def _instance(cloud: str, region: str, key: str, name: str) -> InstanceType:
    facts = FACTS[cloud]
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


def _model_urls(urls: Any) -> list[str]:
    if isinstance(urls, str):
        urls = [urls]
    if not urls or not isinstance(urls, list):
        raise ConfigError(
            "model.urls",
            "no model URL: give the GGUF's https URL (every part, in order, for a split GGUF)",
        )
    for url in urls:
        if not isinstance(url, str) or not re.fullmatch(r"https?://\S+", url):
            raise ConfigError("model.urls", f"{url!r} is not an http(s) URL")
        problem = network_rules.model_url_problem(url)
        if problem:
            raise ConfigError("model.urls", problem)
    return urls


def _model(settings: Mapping[str, Any]) -> ModelSpec:
    raw = _decode(settings.get("model"))
    if not isinstance(raw, dict):
        raise ConfigError(
            "model", "is required: an object with `urls` (every part of the GGUF) and a `preset`"
        )
    unknown = sorted(set(raw) - set(MODEL_KEYS))
    if unknown:
        raise ConfigError("model", f"unknown keys {unknown}; known: {', '.join(MODEL_KEYS)}")
    urls = _model_urls(raw.get("urls"))
    sha256 = raw.get("sha256") or []
    if isinstance(sha256, str):
        sha256 = [sha256]
    if sha256 and len(sha256) != len(urls):
        raise ConfigError(
            "model.sha256", f"{len(sha256)} checksums for {len(urls)} URLs; one per part, in order"
        )
    for digest in sha256:
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise ConfigError("model.sha256", f"{digest!r} is not a lowercase sha256 hex digest")
    unverified = network_rules.unverified_download_problem(tuple(urls), tuple(sha256))
    if unverified:
        raise ConfigError("model.sha256", unverified)
    preset_name = raw.get("preset")
    preset = PRESETS.get(preset_name) if preset_name else None
    if preset_name and preset is None:
        raise ConfigError(
            "model.preset", f"unknown preset {preset_name!r}; known: {', '.join(PRESETS)}"
        )
    size_gb = raw.get("sizeGb", preset.size_gb if preset else None)
    kv = raw.get("kvBytesPerToken", preset.kv_bytes_per_token if preset else None)
    layers = raw.get("layers", preset.layers if preset else None)
    if not isinstance(size_gb, int | float) or size_gb <= 0:
        raise ConfigError("model.sizeGb", "give the model's size in GB (10^9 bytes), or a preset")
    if not isinstance(kv, int) or kv <= 0:
        raise ConfigError(
            "model.kvBytesPerToken",
            "give the KV-cache bytes per token (layers x 2 x kv_heads x head_dim x 2), or a preset",
        )
    if layers is None:
        raise ConfigError(
            "model.layers",
            "give the model's number of layers (its GGUF's block_count), or a preset: the "
            "layers are divided between the nodes",
        )
    if not isinstance(layers, int) or isinstance(layers, bool) or layers <= 0:
        raise ConfigError("model.layers", f"must be a positive whole number, got {layers!r}")
    return ModelSpec(
        urls=tuple(urls),
        sha256=tuple(sha256),
        size_bytes=int(size_gb * 1e9),
        layers=layers,
        kv_bytes_per_token=kv,
        preset=preset_name,
    )


def _vpc_cidr(settings: Mapping[str, Any], facts: CloudFacts) -> ipaddress.IPv4Network:
    text = _string(settings, "vpcCidr", "10.42.0.0/16")
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


def _api_cidrs(settings: Mapping[str, Any]) -> tuple[str, ...]:
    key = "apiAllowedCidrs"
    raw = _decode(settings.get(key, []))
    if isinstance(raw, str):
        raw = [raw]
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
    raw = _decode(settings.get("tags", {}))
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise ConfigError("tags", f"must be a map of {facts.tag_word} names to string values")
    problem = facts.tag_problem(raw)
    if problem:
        raise ConfigError("tags", problem)
    return dict(raw)


def _placement(
    model: Model,
    context: int,
    slots: int,
    *,
    main_type: InstanceType,
    worker_type: InstanceType,
    worker_count: int,
) -> Placement:
    """Divide the layers between the main node and the workers; an error if they cannot hold
    them, naming the fix."""
    main_usable = sizing.usable_memory_bytes(main_type)
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


def _ssh_key(settings: Mapping[str, Any], facts: CloudFacts) -> str | None:
    key = settings.get("sshPublicKey")
    if key is None:
        return None
    if not isinstance(key, str) or not re.fullmatch(
        r"(ssh-rsa|ssh-ed25519|ecdsa-sha2-nistp\d+) [A-Za-z0-9+/=]+( .*)?", key.strip()
    ):
        raise ConfigError("sshPublicKey", "is not an OpenSSH public key (ssh-ed25519 AAAA...)")
    return key.strip()


def from_settings(settings: Mapping[str, Any], region: str | None) -> ClusterConfig:
    """Validate raw settings (the project's config keys without their namespace)."""
    unknown = sorted(set(settings) - set(KNOWN_KEYS))
    if unknown:
        raise ConfigError(unknown[0], f"unknown key; known keys: {', '.join(KNOWN_KEYS)}")
    cloud = _string(settings, "cloud", "aws")
    if cloud not in FACTS:
        raise ConfigError("cloud", f"{cloud!r} is not one of {', '.join(sorted(FACTS))}")
    facts = FACTS[cloud]
    for key, instead in facts.refuses.items():
        if settings.get(key) is not None:
            raise ConfigError(key, f"{cloud} does not take this setting: {instead}; remove it")
    region = _region(facts, region)
    worker_type = _instance(cloud, region, "instanceType", _string(settings, "instanceType"))
    main_name = settings.get("mainInstanceType") or worker_type.name
    main_type = _instance(cloud, region, "mainInstanceType", str(main_name))

    worker_count = _int(settings, "workerCount", 2)
    if not 0 <= worker_count <= MAX_WORKERS:
        raise ConfigError(
            "workerCount",
            f"{worker_count} is outside 0-{MAX_WORKERS}; llama.cpp takes at most "
            f"{MAX_WORKERS} RPC servers (0: the main node serves the model alone)",
        )
    commit = _string(settings, "llamaCppCommit", LLAMA_CPP_COMMIT)
    if not is_full_commit(commit):
        raise ConfigError(
            "llamaCppCommit",
            f"{commit!r} is not a full 40-character commit hash; pin an exact commit",
        )
    rpc_port = _port(settings, "rpcPort", RPC_PORT)
    server_port = _port(settings, "serverPort", SERVER_PORT)
    if rpc_port == server_port:
        raise ConfigError("serverPort", f"equals rpcPort ({rpc_port}); choose another port")
    context = _int(settings, "contextSize", sizing.DEFAULT_CONTEXT)
    model = _model(settings)
    described = model.described()
    if context < 1:
        raise ConfigError("contextSize", f"must be positive, got {context}")
    if described.context_length and context > described.context_length:
        raise ConfigError(
            "contextSize",
            f"{context} tokens is more than {model.preset} supports "
            f"({described.context_length}); use at most {described.context_length}",
        )
    slots = _int(settings, "slots", sizing.DEFAULT_SLOTS)
    if not 1 <= slots <= sizing.MAX_SLOTS:
        raise ConfigError(
            "slots",
            f"{slots} is outside 1-{sizing.MAX_SLOTS}: the number of requests served at once, "
            "each with contextSize tokens of its own",
        )

    layout = _placement(
        described,
        context,
        slots,
        main_type=main_type,
        worker_type=worker_type,
        worker_count=worker_count,
    )

    model_gb = model.size_bytes / 1e9
    main_disk = _disk(settings, "mainDiskGb", sizing.default_main_disk_gb(model.size_bytes), facts)
    worker_disk = _disk(
        settings,
        "workerDiskGb",
        sizing.default_worker_disk_gb(layout.largest_worker_weight_bytes),
        facts,
    )
    if main_disk < model_gb + 20:
        raise ConfigError(
            "mainDiskGb", f"{main_disk} GB cannot hold the {model_gb:.0f} GB model and the build"
        )
    config = ClusterConfig(
        cloud=cast(Cloud, cloud),
        region=region,
        instance_type=worker_type,
        main_instance_type=main_type,
        worker_count=worker_count,
        model=model,
        llama_cpp_commit=commit,
        vpc_cidr=_vpc_cidr(settings, facts),
        rpc_port=rpc_port,
        server_port=server_port,
        context_size=context,
        slots=slots,
        placement=layout,
        main_disk_gb=main_disk,
        worker_disk_gb=worker_disk,
        disk_throughput_mibps=_throughput(settings, facts),
        api_allowed_cidrs=_api_cidrs(settings),
        tags=_tags(settings, facts),
        ssh_public_key=_ssh_key(settings, facts),
        image=_image(settings, facts),
        flow_logs=_bool(settings, "flowLogs", True),
        bastion=_bool(settings, "bastion", False),
        encryption_at_host=_bool(settings, "encryptionAtHost", False),
    )
    try:
        planned = nodes.plan_nodes(config)
    except BootConfigError as error:
        setting = getattr(error, "setting", None) or ""
        raise ConfigError(BOOT_SETTING_KEYS.get(setting, "model"), str(error)) from None
    return dataclasses.replace(config, nodes=planned)
