"""The input rules of Google Cloud's APIs for every resource type the program creates
(``infra.conformance.rules``): Compute Engine names (RFC 1035, 63 characters, which pulumi-gcp
lowercases for networks, subnets, routers and NAT but not for the rest), labels where a type
takes them, the values and combinations the program's inputs must keep, and the inputs whose
change replaces a resource (the Google provider's ForceNew, from magic-modules).
"""

from __future__ import annotations

import re

from infra.clouds import gcp
from infra.conformance.rules import (
    AutoName,
    Between,
    Name,
    OneOf,
    Registered,
    Requires,
    ResourceRules,
    Stack,
    Tags,
    Text,
    by_type,
)

MM = "GoogleCloudPlatform/magic-modules mmv1/products/compute/"
PULUMI_GCP = "pulumi/pulumi-gcp provider/resources.go"
# Compute Engine resource names (verify.ValidateGCEName): RFC 1035, 1-63 characters.
GCE_NAME = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
GCE_NAME_MEANING = "a Compute Engine name: a lowercase letter, then lowercase letters, digits, '-'"
NAMING = "https://cloud.google.com/compute/docs/naming-resources"
LABELS = "https://cloud.google.com/compute/docs/labeling-resources#requirements"
SM_CREATE = "https://cloud.google.com/secret-manager/docs/reference/rest/v1/projects.secrets/create"
SM_LIMITS = "https://cloud.google.com/secret-manager/quotas#content_limits"
# The program grants one role on a secret, the narrowest that reads it.
SM_ENABLE = "https://cloud.google.com/secret-manager/docs/configuring-secret-manager#enable_api"
SM_ROLES = "https://cloud.google.com/secret-manager/docs/access-control"
HYPERDISK = "https://cloud.google.com/compute/docs/disks/hd-types/hyperdisk-balanced"
# Hyperdisk Balanced provisions at most 500 IOPS per GiB, and at most a quarter of its IOPS in
# MiB/s of throughput (the "Size and performance limits" of Hyperdisk Balanced).
HYPERDISK_IOPS_PER_GIB = 500
HYPERDISK_MIBPS_PER_IOPS = 0.25
DESCRIPTION = Text("description", 2048, f"{NAMING} (a resource's description)")


def gce_name(autoname: AutoName) -> Name:
    return Name("name", GCE_NAME, 1, 63, GCE_NAME_MEANING, f"{NAMING}; {PULUMI_GCP}", autoname)


# Networks, subnets, routers and NAT: lowercased, 63 at most (lowercaseAutoName); the others
# take the generic auto-name, neither lowercased nor held to 63.
LOWERCASED = gce_name(AutoName(max_length=63, lowercase=True))
PLAIN = gce_name(AutoName())


def _hyperdisk(resource: Registered, _stack: Stack) -> str | None:
    params = (resource.inputs.get("bootDisk") or {}).get("initializeParams") or {}
    if params.get("type") != "hyperdisk-balanced":
        return None
    size, iops = params.get("size"), params.get("provisionedIops")
    mibps = params.get("provisionedThroughput")
    if mibps is not None and iops is None:
        return "Hyperdisk Balanced throughput is set without IOPS to carry it"
    if mibps is not None and iops is not None and mibps > iops * HYPERDISK_MIBPS_PER_IOPS:
        return f"{mibps} MiB/s of Hyperdisk Balanced throughput needs {int(mibps * 4)} IOPS"
    if iops is not None and size is not None and iops > size * HYPERDISK_IOPS_PER_GIB:
        return f"Hyperdisk Balanced takes {HYPERDISK_IOPS_PER_GIB} IOPS per GiB: {iops} on {size}"
    return None


# Network tags (an instance's; a firewall rule's sources and targets): RFC 1035, 1-63
# characters, as a Compute Engine name.
NETWORK_TAGS = "https://cloud.google.com/vpc/docs/add-remove-network-tags"


def network_tags(*paths: str) -> Requires:
    def check(resource: Registered, _stack: Stack) -> str | None:
        for path in paths:
            for tag in resource.inputs.get(path) or []:
                if not GCE_NAME.fullmatch(str(tag)):
                    return f"network tag {tag!r} ({path}): {GCE_NAME_MEANING}, at most 63"
        return None

    return Requires(check, NETWORK_TAGS)


def _display_name(resource: Registered, _stack: Stack) -> str | None:
    name = resource.inputs.get("displayName", "")
    if len(name.encode()) > 100:
        return f"displayName of {len(name.encode())} bytes; IAM takes 100"
    return None


def labels(path: str = "labels") -> Tags:
    return Tags(path, gcp.label_set_problem, LABELS)


RULES = by_type(
    ResourceRules(
        "gcp:compute/network:Network",
        (LOWERCASED, DESCRIPTION),
        replaced_on=("name", "description", "autoCreateSubnetworks"),
        source=f"{MM}Network.yaml",
    ),
    ResourceRules(
        "gcp:compute/subnetwork:Subnetwork",
        (
            LOWERCASED,
            DESCRIPTION,
            OneOf(
                "logConfig.aggregationInterval",
                tuple(
                    f"INTERVAL_{t}"
                    for t in ("5_SEC", "30_SEC", "1_MIN", "5_MIN", "10_MIN", "15_MIN")
                ),
                f"{MM}Subnetwork.yaml",
            ),
            Between("logConfig.flowSampling", 0, 1, f"{MM}Subnetwork.yaml"),
        ),
        replaced_on=("name", "network", "region", "description"),
        source=f"{MM}Subnetwork.yaml",
    ),
    ResourceRules(
        "gcp:compute/router:Router",
        (LOWERCASED, DESCRIPTION),
        replaced_on=("name", "network", "region"),
        source=f"{MM}Router.yaml",
    ),
    ResourceRules(
        "gcp:compute/routerNat:RouterNat",
        (
            Name(
                "name",
                GCE_NAME,
                2,
                63,
                GCE_NAME_MEANING,
                f"{MM}RouterNat.yaml; {PULUMI_GCP}",
                AutoName(max_length=63, lowercase=True),
            ),
        ),
        replaced_on=("name", "router", "region"),
        source=f"{MM}RouterNat.yaml",
    ),
    ResourceRules(
        "gcp:serviceaccount/account:Account",
        (
            Name(
                "accountId",
                re.compile(r"[a-z](?:[-a-z0-9]*[a-z0-9])?"),
                6,
                30,
                "a service account id: a lowercase letter, then lowercase letters, digits, '-'",
                "https://cloud.google.com/iam/docs/service-accounts-create",
                AutoName(max_length=30),
            ),
            Requires(_display_name, "https://cloud.google.com/iam/docs/service-accounts-create"),
        ),
        replaced_on=("accountId", "project"),
        source="GoogleCloudPlatform/magic-modules resource_google_service_account.go",
    ),
    ResourceRules(
        "gcp:projects/service:Service",
        (
            OneOf("service", ("secretmanager.googleapis.com",), SM_ENABLE),
            # Destroying one stack must not turn the API off under another.
            OneOf("disableOnDestroy", (False,), SM_ENABLE),
        ),
        replaced_on=("service", "project"),
        source="GoogleCloudPlatform/magic-modules resource_google_project_service.go",
    ),
    ResourceRules(
        "gcp:secretmanager/secret:Secret",
        (
            labels(),
            Name(
                "secretId",
                re.compile(r"[A-Za-z0-9_-]+"),
                1,
                255,
                "a secret id: letters, digits, '-' and '_'",
                SM_CREATE,
                None,
            ),
            Requires(
                lambda r, _: None if r.inputs.get("replication") else "replication is required",
                SM_CREATE,
            ),
        ),
        replaced_on=("secretId", "project", "replication"),
        source="GoogleCloudPlatform/magic-modules mmv1/products/secretmanager/Secret.yaml",
    ),
    ResourceRules(
        "gcp:secretmanager/secretVersion:SecretVersion",
        # The payload: at most 64 KiB.
        (Text("secretData", 65_536, SM_LIMITS, required=True),),
        replaced_on=("secret", "secretData"),
        source="GoogleCloudPlatform/magic-modules mmv1/products/secretmanager/SecretVersion.yaml",
    ),
    ResourceRules(
        "gcp:secretmanager/secretIamMember:SecretIamMember",
        (OneOf("role", ("roles/secretmanager.secretAccessor",), SM_ROLES),),
        replaced_on=("secretId", "role", "member", "condition"),
        source="GoogleCloudPlatform/magic-modules tpgiamresource/resource_iam_member.go",
    ),
    ResourceRules(
        "gcp:storage/bucketIAMMember:BucketIAMMember",
        (
            Requires(
                lambda r, _: (
                    "an IAM condition holds at most 12 logical operators"
                    if str((r.inputs.get("condition") or {}).get("expression", "")).count("||")
                    + str((r.inputs.get("condition") or {}).get("expression", "")).count("&&")
                    > 12
                    else None
                ),
                "https://cloud.google.com/iam/docs/conditions-overview#limits",
            ),
        ),
        replaced_on=("bucket", "role", "member", "condition"),
        source="GoogleCloudPlatform/magic-modules tpgiamresource/resource_iam_member.go",
    ),
    ResourceRules(
        "gcp:compute/firewall:Firewall",
        (
            PLAIN,
            DESCRIPTION,
            OneOf("direction", ("INGRESS", "EGRESS"), f"{MM}Firewall.yaml"),
            network_tags("sourceTags", "targetTags"),
            Requires(
                lambda r, _: (
                    None
                    if r.inputs.get("direction") != "INGRESS"
                    or any(r.inputs.get(k) for k in ("sourceRanges", "sourceTags"))
                    else "an INGRESS rule needs sourceRanges or sourceTags"
                ),
                f"{MM}Firewall.yaml",
            ),
        ),
        replaced_on=("name", "direction", "network"),
        source=f"{MM}Firewall.yaml",
    ),
    ResourceRules(
        "gcp:compute/instance:Instance",
        (
            PLAIN,
            labels(),
            labels("bootDisk.initializeParams.labels"),
            Between("bootDisk.initializeParams.provisionedThroughput", 140, 2400, HYPERDISK),
            Between("bootDisk.initializeParams.provisionedIops", 3000, 160_000, HYPERDISK),
            Requires(_hyperdisk, HYPERDISK),
            OneOf(
                "networkPerformanceConfig.totalEgressBandwidthTier",
                ("DEFAULT", "TIER_1"),
                "https://cloud.google.com/compute/docs/networking/configure-vm-with-high-bandwidth-configuration",
            ),
            OneOf("networkInterfaces.*.nicType", ("GVNIC",), "C4A requires gVNIC"),
            network_tags("tags"),
            Requires(
                lambda r, _: (
                    None
                    if len(str((r.inputs.get("metadata") or {}).get("user-data", ""))) <= 256 * 1024
                    else "metadata user-data over 256 KB"
                ),
                "https://cloud.google.com/compute/docs/metadata/setting-custom-metadata#limitations",
            ),
        ),
        replaced_on=(
            "name",
            "zone",
            "hostname",
            "bootDisk.initializeParams.type",
            "bootDisk.initializeParams.image",
            "bootDisk.initializeParams.provisionedIops",
            "bootDisk.initializeParams.provisionedThroughput",
            "networkInterfaces.*.networkIp",
            "networkInterfaces.*.nicType",
        ),
        source="GoogleCloudPlatform/magic-modules resource_compute_instance.go.tmpl",
        held=("networkInterfaces.*.networkIp",),
        held_source=(
            'IP_IN_USE_BY_ANOTHER_RESOURCE ("IP ... is already being used by another '
            'resource", hashicorp/terraform#18998)'
        ),
    ),
    ResourceRules(
        "gcp:compute/instanceGroup:InstanceGroup",
        (PLAIN, DESCRIPTION),
        replaced_on=("name", "zone", "description", "network", "project"),
        source="GoogleCloudPlatform/magic-modules resource_compute_instance_group.go.tmpl",
    ),
)
