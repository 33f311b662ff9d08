"""Every setting of the stack, declared once: its type, default, description and value check.

This table drives the config check (``infra.stack.config``), the ``config:`` block of
``Pulumi.yaml`` and the settings table (``docs/settings.md``);
``tests/stack/test_stack_settings.py`` checks that the two files say what this table says. A
setting that a cloud cannot honour is refused there by that cloud's facts
(``CloudFacts.refuses``), and the table names it.

``lrc settings --pulumi-yaml`` prints the ``config:`` block, ``--readme`` the table.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from infra.clouds import FACTS
from infra.clouds import aws as aws_facts
from infra.clouds import azure as azure_facts
from infra.core import server_args, sizing
from infra.core.errors import SettingError
from infra.core.image_refs import PINNED_MEANING, is_pinned_image_reference
from infra.core.layout import PROJECT
from infra.core.limits import (
    DEFAULT_DRAFT_MAX,
    LOWEST_UNPRIVILEGED_PORT,
    MAX_DRAFT_TOKENS,
    MAX_REPLICAS,
    MAX_WORKERS,
    PLATFORMS,
    RPC_PORT,
    SERVER_PORT,
    VM,
)
from infra.core.pins import (
    LLAMA_CPP_COMMIT,
    LWS_IMAGE,
    LWS_IMAGE_BY_TAG,
    LWS_MANIFEST_URL,
    is_full_commit,
    is_sha256,
)
from infra.core.server_args import API_KEY, MODEL_ALIAS
from infra.stack.pulumi_cli import Secret

# The longest context any model takes (Llama 4 Scout: 10M tokens), in round numbers; with the
# most slots, llama-server's --ctx-size (contextSize x slots, a 32-bit signed number) still fits.
MAX_CONTEXT = 1 << 24
DEFAULT_MAX_HOURLY_USD = 100
MIN_IDLE_MINUTES, MAX_IDLE_MINUTES = 5, 7 * 24 * 60
MAX_DEADLINE_HOURS = 30 * 24
Kind = Literal["string", "integer", "boolean", "array", "object"]


class ConfigError(SettingError):
    """A configuration value that cannot work; raised before anything is created.

    ``setting`` is one of the project's keys, or a provider's own (``aws:region``) as given."""

    @property
    def label(self) -> str:
        return self.setting if ":" in self.setting else f"{PROJECT}:{self.setting}"


@dataclass(frozen=True)
class Setting:
    key: str
    kind: Kind
    description: str
    # The value when the setting is not given; None: required, or computed (``default_text``).
    default: Any = None
    default_text: str = ""  # how a computed default is chosen, for the table
    required: bool = False
    # For whole numbers: the range they must fall in.
    low: int | None = None
    high: int | None = None
    range_reason: str = ""  # why the range is what it is, for the error
    # For strings: the rule they must meet, and what it means.
    valid: Callable[[str], bool] | None = None
    meaning: str = ""
    # A secret: an error names the setting, never repeats its value.
    secret: bool = False
    # For lists: what is wrong with a value, or None.
    problem: Callable[[Any], str | None] | None = None

    def read(self, settings: Mapping[str, Any]) -> Any:  # noqa: PLR0911 (a return per kind)
        """The setting's value from raw settings, of its declared type and within its limits;
        the default when it is not given."""
        raw = settings.get(self.key)
        if isinstance(raw, Secret):  # set, kept encrypted by Pulumi: checked where decrypted
            if self.secret:
                return raw
            raise ConfigError(self.key, "is a Pulumi secret; read the stack with its values")
        # A string setting is taken as given: "1e5" or a commit of digits is text, not a number.
        value = raw if self.kind == "string" and isinstance(raw, str) else decode(raw)
        if value is None:
            if self.required:
                raise ConfigError(
                    self.key, f"is required; set it with `pulumi config set {self.key} <value>`"
                )
            return self.default
        if self.kind == "string":
            shown = "the value given" if self.secret else repr(value)
            if not isinstance(value, str) or not value:
                raise ConfigError(self.key, f"must be a non-empty string, got {shown}")
            if self.valid and not self.valid(value.strip()):
                raise ConfigError(self.key, f"{shown} is not {self.meaning}")
            return value.strip() if self.valid else value
        if self.kind == "integer":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(self.key, f"must be a whole number, got {value!r}")
            low = -(2**63) if self.low is None else self.low
            high = 2**63 if self.high is None else self.high
            if not low <= value <= high:
                reason = f"; {self.range_reason}" if self.range_reason else ""
                raise ConfigError(self.key, f"{value} is outside {self.range_text}{reason}")
            return value
        if self.kind == "boolean":
            if not isinstance(value, bool):
                raise ConfigError(self.key, f"must be true or false, got {value!r}")
            return value
        if self.kind == "array":
            items = [value] if isinstance(value, str) else value
            if self.problem and (found := self.problem(items)):
                raise ConfigError(self.key, found)
            return items
        return value

    @property
    def range_text(self) -> str:
        if self.low is not None and self.high is not None:
            return f"{self.low}-{self.high}"
        return f"at least {self.low}" if self.low is not None else f"at most {self.high}"


def decode(value: Any) -> Any:
    """Pulumi hands structured values (and, from `pulumi config set`, numbers and booleans)
    over as JSON text."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _is_resource_group(text: str) -> bool:
    return azure_facts.RESOURCE_GROUP_NAME.fullmatch(text) is not None


def _is_network_watcher(text: str) -> bool:
    return azure_facts.parse_network_watcher(text) is not None


def _is_ssh_public_key(text: str) -> bool:
    return azure_facts.ssh_public_key_problem(text) is None


def _server_args_problem(given: Any) -> str | None:
    if not isinstance(given, list) or not all(
        isinstance(arg, str | int | float) and not isinstance(arg, bool) for arg in given
    ):
        return 'give a list of words: flags and their values, e.g. ["--temp", "0.7"]'
    return server_args.check(tuple(str(arg) for arg in given))


def _patches_problem(given: Any) -> str | None:
    """The list's shape; which patches the commit has is checked with the commit."""
    if not isinstance(given, list) or not all(isinstance(item, str) for item in given):
        return 'give a list of patch numbers, e.g. ["0002"], or ["all"]'
    return None


def _port(key: str, default: int, what: str) -> Setting:
    return Setting(
        key,
        "integer",
        f"TCP port of {what}; the service runs unprivileged, so {LOWEST_UNPRIVILEGED_PORT} or more",
        default=default,
        low=LOWEST_UNPRIVILEGED_PORT,
        high=65535,
        range_reason="the services run unprivileged, and lower ports are privileged",
    )


SETTINGS: tuple[Setting, ...] = (
    Setting("cloud", "string", f"where the cluster runs: {', '.join(FACTS)}", default="aws"),
    Setting(
        "platform",
        "string",
        "how the nodes run: `vm` (one VM a node, booted by cloud-init) or `kubernetes` (AWS: "
        "an EKS cluster of Arm nodes running the groups as a LeaderWorkerSet; docs/kubernetes.md)",
        default=VM,
        valid=lambda text: text in PLATFORMS,
        meaning=f"one of {', '.join(PLATFORMS)}",
    ),
    Setting(
        "instanceType",
        "string",
        "the workers' Arm instance type, from the instance catalog for the region",
        required=True,
    ),
    Setting(
        "mainInstanceType",
        "string",
        "the main node's instance type; it holds layers too, and may be smaller",
        default_text="instanceType",
    ),
    Setting(
        "workerCount",
        "integer",
        "RPC workers beside the main node (0: the main node serves the model alone; "
        f"llama.cpp takes at most {MAX_WORKERS})",
        default=2,
        low=0,
        high=MAX_WORKERS,
        range_reason=f"llama.cpp takes at most {MAX_WORKERS} RPC servers (0: the main node "
        "serves the model alone)",
    ),
    Setting(
        "replicas",
        "integer",
        "serving groups (each a main node and workerCount workers, with its own placement) "
        "behind one private balancer node (HAProxy) that sends each request to a group with a "
        "free slot, of those whose /health answers, and queues it when none has; 1: one "
        "group, no balancer",
        default=1,
        low=1,
        high=MAX_REPLICAS,
        range_reason=f"at most {MAX_REPLICAS} groups fit the private subnet's address plan",
    ),
    Setting(
        "model",
        "object",
        "the GGUF: `urls` (every part, in order: https, or staged in the cloud's own store and "
        "read with the main node's identity: `s3://bucket/key` on AWS, `gs://bucket/key` on "
        "GCP, `az://account/container/key` on Azure), optional `sha256` (one per part), and a "
        "`preset` or `sizeGb`, `layers` and `kvBytesPerToken`",
        required=True,
    ),
    Setting(
        "draftModel",
        "object",
        "a draft model of the model's vocabulary for speculative decoding on the main node, as "
        "`model` is given (a preset, `urls`, `sha256`): fetched and checked with the model, and "
        "counted in the main node's memory",
    ),
    Setting(
        "draftMax",
        "integer",
        "with draftModel: the tokens the draft proposes a step",
        default=DEFAULT_DRAFT_MAX,
        low=1,
        high=MAX_DRAFT_TOKENS,
        range_reason="a step's draft",
    ),
    Setting(
        "draftMin",
        "integer",
        "with draftModel: the fewest drafted tokens worth checking (a shorter draft is dropped)",
        default=0,
        low=0,
        high=MAX_DRAFT_TOKENS,
        range_reason="a step's draft",
    ),
    Setting(
        "llamaCppCommit",
        "string",
        "the llama.cpp commit every node builds (a full 40-character hash)",
        default=LLAMA_CPP_COMMIT,
        valid=is_full_commit,
        meaning="a full 40-character commit hash; pin an exact commit",
    ),
    Setting(
        "vpcCidr",
        "string",
        "the cluster's private network (RFC 1918, /23 or larger): nodes in its first /24",
        default="10.42.0.0/16",
    ),
    _port("rpcPort", RPC_PORT, "the workers' RPC servers (open only to the main node)"),
    _port("serverPort", SERVER_PORT, "llama-server's OpenAI-compatible API on the main node"),
    Setting(
        "contextSize",
        "integer",
        "tokens of context each request slot gets",
        default=sizing.DEFAULT_CONTEXT,
        low=1,
        high=MAX_CONTEXT,
        range_reason="no model takes more context",
    ),
    Setting(
        "slots",
        "integer",
        "requests served at once, each with contextSize tokens of KV cache on every node",
        default=sizing.DEFAULT_SLOTS,
        low=1,
        high=sizing.MAX_SLOTS,
        range_reason="the number of requests served at once, each with contextSize tokens",
    ),
    Setting(
        "apiKey",
        "string",
        "the key every API request but /health must carry (`Authorization: Bearer KEY`); set "
        "it with `pulumi config set --secret apiKey KEY`, or `none` for no key",
        default_text="generated per stack, kept in the cloud's secret store (SSM Parameter "
        "Store, Secret Manager, Key Vault)",
        valid=lambda text: API_KEY.fullmatch(text) is not None,
        meaning="`none`, or 16-256 letters, digits and . _ ~ + / = -",
        secret=True,
    ),
    Setting(
        "modelAlias",
        "string",
        "the model's id: what clients send as `model` and `/v1/models` shows",
        default_text="the preset's name, or the first part's file name without `.gguf`",
        valid=lambda text: MODEL_ALIAS.fullmatch(text) is not None,
        meaning="1-128 letters, digits and . _ - : / +",
    ),
    Setting(
        "serverArgs",
        "array",
        "llama-server flags to add (sampling defaults, KV cache types, batch sizes, chat "
        "template, ...), each from an allow-list; flags that would change the placement, the "
        "address, the port, metrics or the key are refused",
        default=[],
        problem=_server_args_problem,
    ),
    Setting(
        "llamaCppPatchesOff",
        "array",
        'llama.cpp patches to turn off at run time, by number ("0002"), or ["all"]: the '
        "build runs as upstream's (docs/loader.md lists them)",
        default=[],
        problem=_patches_problem,
    ),
    Setting(
        "mainDiskGb",
        "integer",
        "the main node's disk, which holds the model file (on AWS a volume of its own, kept "
        "when the main node is replaced)",
        default_text="the model's size x 1.1 + 40",
    ),
    Setting(
        "workerDiskGb",
        "integer",
        "each worker's boot disk",
        default_text=f"{sizing.WORKER_DISK_GB} (the OS and the build)",
    ),
    Setting(
        "diskThroughputMibps",
        "integer",
        "provisioned throughput of the main node's model disk, which the model loads from; "
        "on AWS a change modifies the volume in place, and EC2 takes the next change only once "
        "that one has completed (hours for a large volume) and four a day: the preflight says "
        "when a change is still under way",
        default_text=(
            f"{sizing.DEFAULT_DISK_THROUGHPUT_MIBPS}; for a model the main node's memory cannot "
            "hold, what the node can use of its disks (up to 2000 on AWS), within the cloud's range"
        ),
    ),
    Setting(
        "apiAllowedCidrs",
        "array",
        "IPv4 ranges, besides the cloud's tunnel, that may reach the API port (public ones "
        "no wider than /24)",
        default=[],
    ),
    Setting("tags", "object", "tags (labels on GCP) for every resource", default={}),
    Setting(
        "stopAfterIdleMinutes",
        "integer",
        "power the nodes off after this many minutes idle: a main node that processed no "
        "request and had none in hand, then its workers once it is gone; disks stay, and "
        "`lrc start` boots them again",
        default_text="never",
        low=MIN_IDLE_MINUTES,
        high=MAX_IDLE_MINUTES,
        range_reason="fewer minutes stop a cluster between one person's requests; past a week "
        "it guards nothing",
    ),
    Setting(
        "stopAfterHours",
        "integer",
        "power every node off this many hours after each boot, busy or not; `lrc start` boots "
        "them again (with a new deadline)",
        default_text="never",
        low=1,
        high=MAX_DEADLINE_HOURS,
        range_reason="whole hours, up to 30 days",
    ),
    Setting(
        "maxHourlyUsd",
        "integer",
        "the most the stack may cost an hour (hourlyCostUsd, every group counted); a stack "
        "that costs more is refused",
        default=DEFAULT_MAX_HOURLY_USD,
        low=1,
    ),
    Setting(
        "sshPublicKey",
        "string",
        "an OpenSSH public key for the nodes' admin user",
        valid=_is_ssh_public_key,
        meaning="an OpenSSH public key Azure takes (ssh-ed25519, or ssh-rsa of 2048 bits or more)",
    ),
    Setting(
        "image",
        "string",
        "a pinned OS image; unset, each node keeps the Ubuntu 24.04 image current when it "
        "was created",
    ),
    Setting(
        "zone",
        "string",
        "the zone every node is created in (AWS us-east-1a, GCP us-central1-a); changing it "
        "rebuilds the cluster",
        default_text="the first zone (by name) that offers the instance types, chosen at the "
        "first `up` and kept",
    ),
    Setting("flowLogs", "boolean", "record the network's flow logs (kept 30 days)", default=True),
    Setting(
        "networkWatcher",
        "string",
        "Azure: the region's Network Watcher that the VNet flow log belongs to, as "
        "RESOURCE_GROUP/NAME",
        default_text=f"`{azure_facts.NETWORK_WATCHER_GROUP}/NetworkWatcher_<region>`",
        valid=_is_network_watcher,
        meaning="RESOURCE_GROUP/NAME of a Network Watcher (like "
        f"{azure_facts.default_network_watcher('eastus')})",
    ),
    Setting(
        "bastion",
        "boolean",
        "an Azure Bastion that connectCommand tunnels through to the API",
        default=False,
    ),
    Setting(
        "encryptionAtHost",
        "boolean",
        "Azure encryption at host for the nodes' disks and caches",
        default=False,
    ),
    Setting(
        "kubernetesImage",
        "string",
        "with platform kubernetes: the image the pods run, built from the build context "
        "`lrc k8s render --out DIR` writes (DIR/image) and pushed where the nodes pull from "
        "(an ECR repository of the account)",
        valid=is_pinned_image_reference,
        meaning=PINNED_MEANING,
    ),
    Setting(
        "kubernetesControllerSha256",
        "string",
        "with platform kubernetes: the sha256 of the LeaderWorkerSet controller's manifest "
        f"({LWS_MANIFEST_URL}), which the stack checks before applying it (`curl -sL URL | "
        "sha256sum`, once you have read it); needed until the program records it",
        valid=is_sha256,
        meaning="a sha256, 64 lowercase hex digits",
    ),
    Setting(
        "kubernetesControllerImage",
        "string",
        "with platform kubernetes: the LeaderWorkerSet controller's image by digest, which "
        f"replaces the manifest's {LWS_IMAGE_BY_TAG} (`docker buildx imagetools inspect "
        f"{LWS_IMAGE_BY_TAG}` prints the digest: {LWS_IMAGE}@sha256:DIGEST, or your mirror's); "
        "needed until the program records it",
        valid=is_pinned_image_reference,
        meaning=PINNED_MEANING,
    ),
    Setting(
        "kubernetesApiCidrs",
        "array",
        "with platform kubernetes: IPv4 ranges outside the VPC that may reach the EKS API "
        "endpoint (where `pulumi up` and kubectl run; public ones no wider than /24); at least "
        "one public range, since `pulumi up` applies the Kubernetes objects through the "
        "endpoint of the cluster it has just made (private ranges reach it through a VPN or "
        "peering into the VPC)",
        default=[],
    ),
    Setting(
        "modelStoreKmsKey",
        "string",
        "AWS, with `s3://` model URLs in a bucket encrypted with a customer-managed KMS key "
        "(SSE-KMS): the key's ARN, which the main node may decrypt with through S3 only",
        valid=lambda text: aws_facts.KMS_KEY_ARN.fullmatch(text) is not None,
        meaning="a KMS key ARN (arn:aws:kms:REGION:ACCOUNT:key/KEY_ID)",
    ),
    Setting(
        "modelStoreResourceGroup",
        "string",
        "Azure, with `az://` model URLs: the resource group of their storage account, where the "
        "main node's identity is given Storage Blob Data Reader on each URL's container",
        valid=_is_resource_group,
        meaning="an Azure resource group name (1-90 letters, digits, _ ( ) - and ., not "
        "ending in .)",
    ),
)
BY_KEY: dict[str, Setting] = {setting.key: setting for setting in SETTINGS}
MODEL_KEYS = ("preset", "urls", "sha256", "sizeGb", "layers", "kvBytesPerToken")


def refused_on(key: str) -> list[str]:
    """The clouds that refuse a setting (their facts say why)."""
    return [name for name, facts in FACTS.items() if key in facts.refuses]


def in_project_file(setting: Setting) -> bool:
    """Whether ``Pulumi.yaml`` declares the setting. Pulumi asks every stack for a declared key
    that has no default, so only the required settings and those with a fixed default are
    declared; a computed or unset default stays out (docs/settings.md lists every setting)."""
    return setting.required or setting.default is not None


def project_config() -> dict[str, dict[str, Any]]:
    """``Pulumi.yaml``'s ``config:`` block: type, description and fixed default of each setting
    it declares (``in_project_file``). Object settings carry no type: Pulumi's project config
    types are string, integer, boolean and array."""
    block: dict[str, dict[str, Any]] = {}
    for setting in SETTINGS:
        if not in_project_file(setting):
            continue
        entry: dict[str, Any] = {}
        if setting.kind == "array":
            entry |= {"type": "array", "items": {"type": "string"}}
        elif setting.kind != "object":
            entry["type"] = setting.kind
        entry["description"] = setting.description
        if setting.default is not None:
            entry["default"] = setting.default
        block[setting.key] = entry
    return block


def project_file_block() -> str:
    """The ``config:`` block as it stands in ``Pulumi.yaml``, with a comment on what is left out."""
    left_out = ", ".join(s.key for s in SETTINGS if not in_project_file(s))
    comment = (
        "Written by `lrc settings --pulumi-yaml` from infra/stack/settings.py. "
        "Settings whose default is computed or unset are not declared here (Pulumi asks every "
        f"stack for a declared key that has no default): {left_out}. docs/settings.md "
        "lists every setting."
    )
    body = yaml.safe_dump({"config": project_config()}, sort_keys=False, width=96)
    return "".join(f"# {line}\n" for line in textwrap.wrap(comment, 98)) + body


def readme_table() -> str:
    """The settings table, in Markdown."""
    rows = ["| Setting | Type | Default | What it is |", "| --- | --- | --- | --- |"]
    for setting in SETTINGS:
        if setting.required:
            default = "required"
        elif setting.default_text:
            default = setting.default_text
        elif setting.default is None:
            default = "unset"
        else:
            default = f"`{json.dumps(setting.default)}`"
        what = setting.description
        refused = refused_on(setting.key)
        if refused:
            what += f" (refused on {', '.join(refused)})"
        rows.append(f"| `{setting.key}` | {setting.kind} | {default} | {what} |")
    return "\n".join(rows) + "\n"
