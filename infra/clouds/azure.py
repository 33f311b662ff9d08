"""Azure facts: Cobalt 100 naming, managed-disk limits, tag rules, regions."""

from __future__ import annotations

import base64
import binascii
import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from infra.clouds.base import (
    PROGRAM_TAGS,
    CloudFacts,
    DiskModel,
    NatModel,
    Range,
    Right,
    UserDataChannel,
    VcpuQuota,
    reserved_tag_problem,
)

# https://learn.microsoft.com/azure/azure-resource-manager/management/tag-resources#limitations
# 50 tags per resource; names at most 512 characters (128 on storage accounts, which the flow
# logs use), values at most 256; names hold none of < > % & \ ? /; the prefixes microsoft,
# azure and windows are reserved.
MAX_TAGS = 50
# An OS disk also carries its VM's id, so a replaced VM's new disk is tagged again.
DISK_VM_TAG = "vm"
# A keyed stack's main node: the tag that names the Key Vault it reads the API key from
# (llama_rpc_secret_azure reads its VM's tags from the instance metadata service).
KEY_VAULT_TAG = "llama-rpc-key-vault"
MAX_TAG_NAME = 128
_FORBIDDEN = set("<>%&\\?/")
_RESERVED_PREFIXES = ("microsoft", "azure", "windows")


# Azure enables a Network Watcher per region, in this group and by this name, when a VNet is
# created or updated there, unless the subscription opted out; one watcher per region and
# subscription: https://learn.microsoft.com/azure/network-watcher/network-watcher-create
NETWORK_WATCHER_GROUP = "NetworkWatcherRG"


@dataclass(frozen=True)
class NetworkWatcher:
    """The region's Network Watcher, which a VNet flow log is a child of."""

    resource_group: str
    name: str

    def __str__(self) -> str:
        return f"{self.resource_group}/{self.name}"


def default_network_watcher(region: str) -> NetworkWatcher:
    return NetworkWatcher(NETWORK_WATCHER_GROUP, f"NetworkWatcher_{region}")


# https://learn.microsoft.com/azure/azure-resource-manager/management/resource-name-rules
# Microsoft.Resources/resourceGroups: 1-90 letters, digits, _ ( ) - and ., not ending in '.';
# Microsoft.Network/networkWatchers: 1-80 letters, digits, _ . -, starting with a letter or
# digit and ending with a letter, digit or '_'.
RESOURCE_GROUP_NAME = re.compile(r"[-\w().]{0,89}[-\w()]")
NETWORK_WATCHER_NAME = re.compile(r"[A-Za-z0-9]([\w.-]{0,78}\w)?")


def parse_network_watcher(text: str) -> NetworkWatcher | None:
    """``RESOURCE_GROUP/NAME``, or None when it is not one."""
    group, _, name = text.partition("/")
    if RESOURCE_GROUP_NAME.fullmatch(group) and NETWORK_WATCHER_NAME.fullmatch(name):
        return NetworkWatcher(group, name)
    return None


_SIZE = re.compile(r"Standard_([A-Z]+)\d+([a-z]*)_v(\d+)")


def vcpu_quota(size: str) -> VcpuQuota | None:
    """The family quota a size counts against, as the usages API names it
    (``standardDpsv6Family`` for Standard_D64ps_v6; Azure's casing varies, so compare without
    case), besides the region's total (``cores``): https://learn.microsoft.com/azure/virtual-machines/quotas"""
    match = _SIZE.fullmatch(size)
    if match is None:
        return None
    series, features, version = match.groups()
    family = f"Standard {series}{features.upper()}v{version} Family vCPUs"
    return VcpuQuota(f"standard{series}{features}v{version}Family", family)


# The admin user's SSH key (``sshPublicKey``): Azure takes RSA keys of at least 2048 bits and
# Ed25519 keys for Linux VMs
# (https://learn.microsoft.com/azure/virtual-machines/linux/mac-create-ssh-keys#supported-ssh-key-formats).
SSH_KEY_TYPES = ("ssh-rsa", "ssh-ed25519")
MIN_RSA_BITS = 2048


def _ssh_fields(blob: bytes) -> list[bytes]:
    """The length-prefixed fields of an OpenSSH public key blob (RFC 4253, 6.6)."""
    fields, at = [], 0
    while at < len(blob):
        size = int.from_bytes(blob[at : at + 4], "big")
        if at + 4 + size > len(blob):
            raise ValueError("a field runs past the key")
        fields.append(blob[at + 4 : at + 4 + size])
        at += 4 + size
    return fields


def ssh_public_key_problem(text: str) -> str | None:
    """Why an OpenSSH public key line is not one Azure takes, or None."""
    kind, _, rest = text.strip().partition(" ")
    encoded = rest.split(" ", 1)[0]
    if kind not in SSH_KEY_TYPES:
        return f"a {kind or 'key'} key; Azure takes {' and '.join(SSH_KEY_TYPES)} keys"
    try:
        fields = _ssh_fields(base64.b64decode(encoded, validate=True))
    except (ValueError, binascii.Error):
        return "the key's base64 is not an OpenSSH public key"
    if not fields or fields[0].decode(errors="replace") != kind:
        return f"the key's data says it is not {kind}"
    if kind == "ssh-ed25519" and (len(fields) != 2 or len(fields[1]) != 32):
        return "an ssh-ed25519 key holds 32 bytes"
    if kind == "ssh-rsa":
        modulus = int.from_bytes(fields[2], "big") if len(fields) == 3 else 0
        if modulus.bit_length() < MIN_RSA_BITS:
            return f"an RSA key of {modulus.bit_length()} bits; Azure takes {MIN_RSA_BITS} or more"
    return None


# What the deployer needs beyond making resources: role assignments (the main node's read of
# the API key, a staged model's blobs, each node's spend guard) and the guard's custom role.
# Contributor holds neither (its NotActions exclude Microsoft.Authorization/*/Write).
ROLES_SOURCE = (
    "https://learn.microsoft.com/azure/role-based-access-control/built-in-roles/privileged"
    " (Contributor, Role Based Access Control Administrator)"
)
ASSIGN_ROLES = (
    "Role Based Access Control Administrator, User Access Administrator or Owner on the "
    "subscription (Contributor cannot assign roles)"
)
ROLE_ASSIGNMENT_WRITE = "Microsoft.Authorization/roleAssignments/write"
ROLE_DEFINITION_WRITE = "Microsoft.Authorization/roleDefinitions/write"


def deployer_rights(*, api_key: bool, staged: bool, guard: str | None) -> tuple[Right, ...]:
    """The permissions a stack with these features needs of its deployer, beyond Contributor's
    (``guard``: the spend guard's setting, if one is set)."""
    found = []
    if api_key:
        found.append(
            Right(
                ROLE_ASSIGNMENT_WRITE, "apiKey", "the main node's read of the API key's secret",
                ASSIGN_ROLES, "set apiKey to none with --cors-origins in serverArgs", ROLES_SOURCE,
            )
        )  # fmt: skip
    if staged:
        found.append(
            Right(
                ROLE_ASSIGNMENT_WRITE, "model.urls", "the main node's read of the az:// blobs",
                ASSIGN_ROLES, "list https URLs", ROLES_SOURCE,
            )
        )  # fmt: skip
    if guard:
        found += [
            Right(
                ROLE_ASSIGNMENT_WRITE, guard, "each node's right to deallocate itself",
                ASSIGN_ROLES, "remove the spend guard", ROLES_SOURCE,
            ),
            Right(
                ROLE_DEFINITION_WRITE, guard, "the spend guard's custom role",
                "User Access Administrator or Owner on the subscription", "remove the spend guard",
                ROLES_SOURCE,
            ),
        ]  # fmt: skip
    return tuple(found)


def permits(granted: Sequence[tuple[Sequence[str], Sequence[str]]], action: str) -> bool:
    """Whether any of the caller's permission sets (actions, notActions; ``*`` a wildcard,
    case-insensitive, as Azure RBAC matches them) allows ``action``."""

    def matches(pattern: str) -> bool:
        return fnmatch.fnmatchcase(action.lower(), pattern.lower())

    return any(
        any(matches(a) for a in actions) and not any(matches(n) for n in not_actions)
        for actions, not_actions in granted
    )


# The region's total of every family, which a stack must fit as well.
REGIONAL_CORES = VcpuQuota("cores", "Total Regional vCPUs")


def tag_set_problem(tags: Mapping[str, str], max_name: int = MAX_TAG_NAME) -> str | None:
    """Why a resource's whole tag set breaks Azure's rules, or None. Names are at most 512
    characters on most resources and 128 on storage accounts (the default here, for both)."""
    if len(tags) > MAX_TAGS:
        return f"{len(tags)} tags; Azure allows {MAX_TAGS} per resource"
    if len({key.lower() for key in tags}) != len(tags):
        return "two tag names differ only in case; Azure treats them as one"
    for key, value in tags.items():
        if key.lower().startswith(_RESERVED_PREFIXES):
            return f"tag {key!r}: names starting with {', '.join(_RESERVED_PREFIXES)} are reserved"
        if not 1 <= len(key) <= max_name or len(value) > 256 or set(key) & _FORBIDDEN:
            return (
                f"tag {key!r}: Azure tag names hold 1-{max_name} characters and none of "
                "< > % & \\ ? /, and values at most 256 characters"
            )
    return None


def tag_problem(tags: Mapping[str, str]) -> str | None:
    """Why the user's tags break Azure's rules, beside the program's, or None."""
    reserved = reserved_tag_problem(tags, (DISK_VM_TAG,))
    if reserved:
        return reserved
    lowered = {key.lower() for key in (*PROGRAM_TAGS, DISK_VM_TAG, KEY_VAULT_TAG)}
    for key in tags:
        if key.lower() in lowered:
            return f"tag {key!r} collides with the program's {key.lower()!r} (Azure ignores case)"
    if len(tags) > MAX_TAGS - 4:
        return (
            f"{len(tags)} tags; Azure allows {MAX_TAGS} per resource and the program sets 3 "
            f"(4 on OS disks, which also carry {DISK_VM_TAG!r}, and on a keyed main node, "
            f"{KEY_VAULT_TAG!r})"
        )
    return tag_set_problem(tags)


FACTS = CloudFacts(
    # A VM powered off from inside stays allocated and billed: each node deallocates itself.
    # https://learn.microsoft.com/azure/virtual-machines/states-billing
    stop_by="azure-deallocate",
    name="azure",
    region_key="azure-native:location",
    # eastus, westeurope, eastus2, southcentralus (the names, not "East US")
    region_pattern=re.compile(r"[a-z]+[a-z0-9]*"),
    region_example="eastus",
    # Cobalt 100 sizes carry a "p" among the feature letters: Standard_D64ps_v6.
    arm_pattern=re.compile(r"Standard_[A-Z]+\d+[a-z]*p[a-z]*_v\d+"),
    arm_examples="Cobalt 100: Standard_D64ps_v6, Standard_E64ps_v6, Standard_D64pls_v6",
    # ND GB200 v6: 2 Grace CPUs and 4 Blackwell GPUs a VM.
    grace_pattern=re.compile(r"Standard_ND\w*GB200\w*", re.IGNORECASE),
    # OS disks hold at most 4,095 GiB:
    # https://learn.microsoft.com/azure/virtual-machines/managed-disks-overview#os-disk
    boot_disk_gb=Range(30, 4_095),
    disk_throughput_mibps=None,  # Premium SSD throughput follows the disk size
    vpc_widest_prefix=8,
    tag_problem=tag_problem,
    tag_word="tag",
    vcpu_quota=vcpu_quota,
    image_pattern=re.compile(r"\d+\.\d+\.\d{6,12}"),
    image_example="24.04.202510010",
    # https://learn.microsoft.com/azure/virtual-machines/custom-data: at most 64 KB of base64;
    # cloud-init unpacks gzip inside it.
    # Run Command (az vm run-command invoke) returns the last 4,096 bytes of the output.
    command_output_chars=4_096,
    user_data=UserDataChannel("custom_data", 65_535, base64=True, gzip_field="custom_data"),
    # Premium SSD throughput by size tier (GiB, MB/s): Azure's managed disk sizes table.
    disk=DiskModel(
        "Premium SSD",
        size_tiers_mbps=(
            (128, 100),
            (256, 125),
            (512, 150),
            (1024, 200),
            (2048, 250),
            (4096, 250),
            (8192, 500),
            (16384, 750),
            (32767, 900),
        ),
    ),
    nat=NatModel("NAT gateway"),
    # The Standard Load Balancer hashes each flow and Application Gateway v2's least
    # connections is a preview: one HAProxy counts every open request and queues for the
    # first free slot. The smallest Cobalt 100 size (Dplsv6: 2 GiB per vCPU).
    balancer_instance_type="Standard_D2pls_v6",
    # 168.63.129.16: the platform's wire server (DNS, health probes, the VM agent).
    metadata_hosts=frozenset({"metadata.azure.com"}),
    metadata_addresses=frozenset({"168.63.129.16"}),
    chart_colour="#0078d4",
    # Blob Storage as az://ACCOUNT/CONTAINER/KEY (infra.core.network_rules), read with the main
    # node's managed identity through the subnet's service endpoint.
    model_store_scheme="az://",
    image_meaning="a version of Canonical:ubuntu-24_04-lts:server-arm64",
    refuses={
        "platform": "the kubernetes platform is EKS's only (AKS is not built; "
        "docs/kubernetes.md says what it needs): `lrc k8s render` writes the objects for any "
        "Kubernetes cluster",
        "kubernetesImage": "there is no kubernetes platform here",
        "kubernetesControllerSha256": "there is no kubernetes platform here",
        "kubernetesControllerImage": "there is no kubernetes platform here",
        "kubernetesApiCidrs": "there is no kubernetes platform here",
        "diskThroughputMibps": "Premium SSD throughput follows the disk's size",
        "zone": "the nodes of a group share a proximity placement group, in no availability "
        "zone, so no update moves them",
        "modelStoreKmsKey": "Blob Storage decrypts a blob under a customer-managed key for any "
        "reader it admits",
    },
    api_key_store="Key Vault",
    limitations={
        "prices": "Premium SSD is billed per size tier, which the catalog does not price: "
        "hourlyCostUsd leaves the disks out and says so",
        "encryption at host": "off unless encryptionAtHost is set: Microsoft does not list it "
        "for Cobalt 100 sizes, and it needs the subscription's EncryptionAtHost feature",
    },
)
