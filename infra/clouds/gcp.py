"""GCP facts: Axion naming, Hyperdisk limits, label rules, regions, service account ids."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

from infra.clouds.base import (
    CloudFacts,
    DiskModel,
    NatModel,
    Range,
    Right,
    UserDataChannel,
    VcpuQuota,
    reserved_tag_problem,
)

# https://cloud.google.com/compute/docs/labeling-resources#requirements: at most 64 labels;
# keys start with a lowercase letter; keys and values hold at most 63 lowercase letters,
# digits, '_' or '-'.
MAX_LABELS = 64
_LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")
# Google's IAP TCP forwarding range: the only source the main node's API port admits
# (https://cloud.google.com/iap/docs/using-tcp-forwarding#create-firewall-rule).
IAP_RANGE = "35.235.240.0/20"


def label_set_problem(labels: Mapping[str, str]) -> str | None:
    """Why a resource's whole label set breaks GCP's rules, or None."""
    if len(labels) > MAX_LABELS:
        return f"{len(labels)} labels; GCP allows {MAX_LABELS}"
    for key, value in labels.items():
        if not _LABEL_KEY.fullmatch(key):
            return (
                f"label key {key!r} must start with a lowercase letter and hold at most 63 "
                "lowercase letters, digits, '_' or '-'"
            )
        if not _LABEL_VALUE.fullmatch(value):
            return (
                f"label value {value!r} (key {key!r}) may hold at most 63 lowercase letters, "
                "digits, '_' or '-'"
            )
    return None


def label_problem(labels: Mapping[str, str]) -> str | None:
    """Why the user's labels break GCP's rules, beside the program's, or None."""
    reserved = reserved_tag_problem(labels)
    if reserved:
        return reserved
    if len(labels) > MAX_LABELS - 3:
        return f"{len(labels)} labels; GCP allows {MAX_LABELS} and the program sets 3"
    return label_set_problem(labels)


def vcpu_quota(instance_type: str) -> VcpuQuota:
    """A family's regional CPU quota (the metric ``regions.get`` reports): C4A_CPUS for
    c4a-standard-32 (https://cloud.google.com/compute/resource-usage#cpu_quota)."""
    family = instance_type.split("-", 1)[0].upper()
    return VcpuQuota(f"{family}_CPUS", f"{family} CPUs")


# The project's CPUs in every region together (``projects.get``'s quotas), which caps every
# family: small on new projects (a trial project's is 12), and a stack must fit it as well
# (https://cloud.google.com/compute/resource-usage#cpu_quota).
ALL_REGIONS_CPUS = VcpuQuota("CPUS_ALL_REGIONS", "CPUs in all regions")


# What the deployer needs beyond making resources: the binding of the API key's secret to the
# main nodes' service account (SecretIamMember, a setIamPolicy), which the basic Editor role
# lacks (it holds no *.setIamPolicy). Asked of projects.testIamPermissions.
SECRET_SET_IAM = "secretmanager.secrets.setIamPolicy"  # noqa: S105 (a permission)
IAM_SOURCE = (
    "https://cloud.google.com/iam/docs/roles-overview#basic (Editor: no setIamPolicy); "
    "https://cloud.google.com/secret-manager/docs/access-control"
)


def deployer_rights(*, api_key: bool) -> tuple[Right, ...]:
    """The permissions a stack with these features needs of its deployer, beyond Editor's."""
    if not api_key:
        return ()
    return (
        Right(
            SECRET_SET_IAM,
            "apiKey",
            "the main nodes' read of the API key's secret",
            "Secret Manager Admin (roles/secretmanager.admin) or Owner on the project (Editor "
            "cannot set IAM policies)",
            "set apiKey to none with --cors-origins in serverArgs",
            IAM_SOURCE,
        ),
    )


def label_value(text: str) -> str:
    """A text the program sets as a label value (the stack's name), made valid: Pulumi stack
    names may hold capitals and '.', label values may not. A text that had to change gets a
    digest of itself, so two stacks never share a value."""
    value = re.sub(r"[^a-z0-9_-]", "-", text.lower())
    if value == text and len(value) <= 63:
        return value
    digest = hashlib.sha256(text.encode()).hexdigest()[:6]
    return f"{value[:56]}-{digest}"


def service_account_id(project: str, stack: str) -> str:
    """A service account id unique to the stack: ids are per GCP project, and two stacks of this
    program in one project must not share (or delete) each other's account. 6-30 characters,
    ``[a-z]([-a-z0-9]*[a-z0-9])``."""
    digest = hashlib.sha256(f"{project}/{stack}".encode()).hexdigest()[:8]
    readable = re.sub(r"[^a-z0-9-]", "-", stack.lower()).strip("-")[:12].strip("-")
    return f"lrc-{readable}-{digest}" if readable else f"lrc-{digest}"


FACTS = CloudFacts(
    name="gcp",
    region_key="gcp:region",
    # us-central1, europe-west4, northamerica-northeast1 (a zone adds "-a")
    region_pattern=re.compile(r"[a-z]+-[a-z]+\d+"),
    region_example="us-central1",
    zone_suffix=re.compile(r"-[a-z]"),
    zone_example="-a",
    # Axion (C4A, N4A) and Ampere Altra (T2A) are Google's Arm families.
    arm_pattern=re.compile(r"(c4a|n4a|t2a)-[a-z0-9-]+"),
    arm_examples="Axion: c4a-standard-*, c4a-highmem-*, c4a-highcpu-*",
    # A4X and A4X Max: accelerator-optimized, on the NVIDIA Grace platform only.
    grace_pattern=re.compile(r"a4x(-max)?-[a-z0-9-]+"),
    # Hyperdisk Balanced: https://cloud.google.com/compute/docs/disks/hyperdisks#hd-size-limits;
    # a boot disk is at least its image: 10 GB for ubuntu-2404-lts-arm64.
    boot_disk_gb=Range(10, 65_536),
    disk_throughput_mibps=Range(140, 2_400),
    vpc_widest_prefix=8,
    tag_problem=label_problem,
    tag_word="label",
    tag_value=label_value,
    vcpu_quota=vcpu_quota,
    # Tier_1 networking, from 32 vCPUs on C4A:
    # https://cloud.google.com/compute/docs/networking/configure-vm-with-high-bandwidth-configuration
    fast_network_min_vcpus=32,
    fast_network_name="Tier_1 networking",
    # Canonical's project and arm64 Ubuntu 24.04 images only, by family or by version.
    image_pattern=re.compile(
        r"projects/ubuntu-os-cloud/global/images/"
        r"(family/ubuntu-2404-lts-arm64|ubuntu-2404-noble-arm64-v\d{8}[a-z]?)"
    ),
    image_example="projects/ubuntu-os-cloud/global/images/ubuntu-2404-noble-arm64-v20251001",
    # https://cloud.google.com/compute/docs/metadata/setting-custom-metadata#limitations: one
    # value holds 256 KB, and metadata values are text, so gzip does not help.
    user_data=UserDataChannel("metadata.user-data", 256 * 1024),
    # Hyperdisk Balanced (C4A takes no Persistent Disk) includes 3,000 IOPS and 140 MiB/s, and
    # bills what is provisioned above them. Throughput is provisioned with 4 IOPS per MiB/s:
    # Google's table of how much throughput a disk's IOPS carry could not be read, and 4 per
    # MiB/s is gp3's rule, so a main disk is never refused for too few IOPS.
    disk=DiskModel("Hyperdisk Balanced", included_mibps=140, included_iops=3000, iops_per_mibps=4),
    # https://cloud.google.com/nat/pricing: per VM behind the gateway, flat above 32 VMs.
    nat=NatModel("Cloud NAT", per_vm_cap=32),
    # An internal Application Load Balancer's Envoys pick the better of two random groups each
    # and queue nothing: one HAProxy counts every open request and queues for the first free
    # slot. The smallest C4A; HAProxy's few long requests need little of it.
    balancer_instance_type="c4a-standard-1",
    server_listens_on_all=True,
    metadata_hosts=frozenset({"metadata", "metadata.google.internal"}),
    metadata_addresses=frozenset(),
    chart_colour="#4285f4",
    # Cloud Storage, read with the main node's service account through Private Google Access.
    model_store_scheme="gs://",
    image_meaning="an arm64 Ubuntu 24.04 image (or its family) of the ubuntu-os-cloud project",
    refuses={
        "platform": "the kubernetes platform is EKS's only (GKE is not built; "
        "docs/kubernetes.md says what it needs): `lrc k8s render` writes the objects for any "
        "Kubernetes cluster",
        "kubernetesImage": "there is no kubernetes platform here",
        "kubernetesControllerSha256": "there is no kubernetes platform here",
        "kubernetesControllerImage": "there is no kubernetes platform here",
        "kubernetesApiCidrs": "there is no kubernetes platform here",
        "sshPublicKey": "nodes are reached through IAP with OS Login; project SSH keys are blocked",
        "bastion": "connectCommand forwards through IAP already",
        "encryptionAtHost": "Google encrypts every disk at rest already",
        "networkWatcher": "subnet flow logs need no watcher",
        "modelStoreKmsKey": "Cloud Storage decrypts an object under a customer-managed key for "
        "any reader it admits",
    },
    api_key_store="Secret Manager",
    limitations={
        "placement": "C4A has no compact placement policy; all nodes share one zone instead",
        "labels": "networks, subnets, routers, NAT, firewall rules and instance groups take no "
        "labels; their names carry the project instead",
    },
)
