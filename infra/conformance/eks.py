"""The input rules of the AWS APIs behind a Kubernetes stack on EKS (``infra.conformance.rules``):
the cluster, its Graviton managed node groups and their launch templates, the VPC CNI add-on,
and the IAM policies the cluster's and the nodes' roles carry.

Names as EKS and EC2 take them (and as Pulumi makes them), the values and combinations the APIs
refuse, the order they need (a role's policies before the cluster or node group that uses it),
and the inputs whose change replaces a resource (the Terraform AWS provider's ForceNew, under
pulumi-aws 7). The VPC, its subnets and the IAM roles are the VM stacks' types
(``infra.conformance.aws``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from infra.clouds import aws
from infra.conformance.aws import (
    EBS,
    GP3_IOPS_PER_GIB,
    GP3_MIBPS_PER_IOPS,
    IAM_NAME,
    IAM_NAME_MEANING,
    TF,
    tags,
)
from infra.conformance.kubernetes import (
    DNS1123_SUBDOMAIN,
    LABELS,
    SUBDOMAIN_MAX,
    SUBDOMAIN_MEANING,
    Labels,
)
from infra.conformance.rules import (
    NAME,
    ORDER,
    AutoName,
    Between,
    Matches,
    Name,
    OneOf,
    Registered,
    Requires,
    ResourceRules,
    Rule,
    Stack,
    Text,
    by_type,
    values_at,
)

CLUSTER = "aws:eks/cluster:Cluster"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
ADDON = "aws:eks/addon:Addon"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
ATTACHMENT = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"

EKS_API = "https://docs.aws.amazon.com/eks/latest/APIReference/"
CREATE_CLUSTER = f"{EKS_API}API_CreateCluster.html"
NODEGROUP_API = f"{EKS_API}API_Nodegroup.html"
NODE_LABELS_API = f"{EKS_API}API_UpdateLabelsPayload.html"
# The EKS user guide's source (awsdocs/amazon-eks-user-guide at 4d52b4d0).
GUIDE = "awsdocs/amazon-eks-user-guide @4d52b4d0 latest/ug/"
NETWORK_REQS = f"{GUIDE}networking/network-reqs.adoc"
ENDPOINT = f"{GUIDE}clusters/cluster-endpoint.adoc"
LAUNCH_TEMPLATES = f"{GUIDE}nodes/launch-templates.adoc"
CLUSTER_ROLE = f"{GUIDE}security/iam-reference/cluster-iam-role.adoc"
NODE_ROLE = f"{GUIDE}security/iam-reference/create-node-role.adoc"
POD_IDENTITY = f"{GUIDE}manage-access/aws-access/service-accounts.adoc"
ADDON_IAM = f"{GUIDE}workloads/add-ons-iam.adoc"
NETWORK_POLICY_GUIDE = (
    f"{GUIDE}networking/eks-networking-add-ons.adoc (cni-network-policy-configure)"
)
VPC_CNI = "aws/amazon-vpc-cni-k8s @b5218838"
VPC_CNI_VALUES = f"{VPC_CNI} charts/aws-vpc-cni/values.yaml (env: strings)"
VPC_CNI_MODES = f"{VPC_CNI} README.md (NETWORK_POLICY_ENFORCING_MODE, v1.17.1+)"
SERVICE_ACCOUNT_NAME = (
    "kubernetes/kubernetes pkg/apis/core/validation ValidateServiceAccountName (NameIsDNSSubdomain)"
)
SDK = "pulumi_aws 7.51.1 "  # the installed SDK's argument docs
AUTONAME = "pulumi/pulumi-aws provider/autonaming.go @0c5f6583 (logical name, '-', 7 characters)"
CREATE_LAUNCH_TEMPLATE = (
    "https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateLaunchTemplate.html"
)
LAUNCH_TEMPLATE_EBS = (
    "https://docs.aws.amazon.com/AWSEC2/latest/APIReference/"
    "API_LaunchTemplateEbsBlockDeviceRequest.html"
)
LAUNCH_TEMPLATE_TAGS = (
    "https://docs.aws.amazon.com/AWSEC2/latest/APIReference/"
    "API_LaunchTemplateTagSpecificationRequest.html"
)
ATTACH_ROLE_POLICY = "https://docs.aws.amazon.com/IAM/latest/APIReference/API_AttachRolePolicy.html"
IAM_ARNS = (
    "https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_identifiers.html#identifiers-arns"
)
PROGRAM = "the program's rule"
METADATA_OPTIONS = f"{SDK}ec2/_inputs.py LaunchTemplateMetadataOptionsArgs"

# ^[0-9A-Za-z][A-Za-z0-9\-_]* (CreateCluster name; nodegroupName the same, 63 at most).
EKS_NAME = re.compile(r"[0-9A-Za-z][A-Za-z0-9_-]*")
EKS_NAME_MEANING = "letters, digits, '-' and '_', starting with a letter or digit"
# CreateLaunchTemplate: [a-zA-Z0-9\(\)\.\-/_]+, 3-128; the provider stops at 125.
LAUNCH_TEMPLATE_NAME = re.compile(r"[a-zA-Z0-9().\-/_]+")
# An AWS managed policy (arn:aws:iam::aws:policy/...) or an account's, with an optional path.
POLICY_ARN = re.compile(
    r"arn:aws(-cn|-us-gov)?:iam::(aws|\d{12}):policy/([\w+=,.@-]+/)*[\w+=,.@-]+"
)

# The node group AMI types (EKS API Nodegroup.amiType; the CDK's NodegroupAmiType lists them);
# the nodes are Graviton, so the program takes the ARM_64 ones only (_graviton).
ARM_AMI_TYPES = (
    "AL2023_ARM_64_STANDARD",
    "AL2023_ARM_64_NVIDIA",
    "AL2_ARM_64",
    "BOTTLEROCKET_ARM_64",
    "BOTTLEROCKET_ARM_64_FIPS",
    "BOTTLEROCKET_ARM_64_NVIDIA",
)
AMI_TYPES = (
    *ARM_AMI_TYPES,
    "AL2023_x86_64_STANDARD",
    "AL2023_x86_64_NVIDIA",
    "AL2023_x86_64_NEURON",
    "AL2_x86_64",
    "AL2_x86_64_GPU",
    "BOTTLEROCKET_x86_64",
    "BOTTLEROCKET_x86_64_FIPS",
    "BOTTLEROCKET_x86_64_NVIDIA",
    "WINDOWS_CORE_2019_x86_64",
    "WINDOWS_FULL_2019_x86_64",
    "WINDOWS_CORE_2022_x86_64",
    "WINDOWS_FULL_2022_x86_64",
    "CUSTOM",
)
AMI_TYPE_LIST = (
    "https://docs.aws.amazon.com/cdk/api/v2/python/aws_cdk.aws_eks/NodegroupAmiType.html"
)
MAX_TAINTS = 50
INT32_MAX = 2**31 - 1
# The managed policies each role needs (and the ones the program attaches).
CLUSTER_POLICIES = (("AmazonEKSClusterPolicy",),)
NODE_POLICIES = (
    ("AmazonEKSWorkerNodePolicy",),
    # The user guide now names PullOnly; the older ReadOnly holds its permissions.
    ("AmazonEC2ContainerRegistryPullOnly", "AmazonEC2ContainerRegistryReadOnly"),
)
CNI_POLICY = ("AmazonEKS_CNI_Policy",)
POD_IDENTITY_AGENT = "eks-pod-identity-agent"
POD_IDENTITY_PRINCIPAL = "pods.eks.amazonaws.com"
POD_IDENTITY_ACTIONS = frozenset({"sts:AssumeRole", "sts:TagSession"})


def _attachments(role: Registered, stack: Stack) -> list[Registered]:
    """The stack's policy attachments of a role (their ``role`` holds its name, its id)."""
    found = []
    for other in stack.resources:
        owner = stack.owner(other.inputs.get("role")) if other.type == ATTACHMENT else None
        if owner is not None and owner.key == role.key:
            found.append(other)
    return found


@dataclass(frozen=True)
class AfterRoleAttachments(Rule):
    """The resource is made after every policy attachment of the role it is given (at
    ``role``), and so deleted before them. ``After`` waits for every resource of a type; this
    for the attachments of its own role only (the cluster's are not the nodes')."""

    family: ClassVar[str] = ORDER
    role: str
    why: str
    source: str

    def problems(self, resource: Registered, stack: Stack) -> Iterator[str]:
        role = stack.owner(resource.inputs.get(self.role))
        if role is None:  # an unknown role is the policies rule's to report
            return
        for attachment in _attachments(role, stack):
            if not stack.waits_for(resource, attachment):
                yield (
                    f"is not made after {attachment.name} ({ATTACHMENT}), a policy of its role "
                    f"{role.name}: {self.why}"
                )


def _policy_name(attachment: Registered) -> str:
    return str(attachment.inputs.get("policyArn", "")).rsplit("/", 1)[-1]


def _role_carries(
    path: str, groups: tuple[tuple[str, ...], ...], why: str, *, cni: bool = False
) -> Callable[[Registered, Stack], str | None]:
    """A check that the role at ``path`` carries, of each group, one of its managed policies
    (and, with ``cni``, the VPC CNI's when the CNI takes the nodes' permissions)."""

    def check(resource: Registered, stack: Stack) -> str | None:
        role = stack.owner(resource.inputs.get(path))
        if role is None:
            return f"{path} is not a role the stack makes: its policies cannot be checked"
        attached = {_policy_name(a) for a in _attachments(role, stack)}
        needed = (*groups, *((CNI_POLICY,) if cni and _cni_on_nodes(stack) else ()))
        missing = [" or ".join(group) for group in needed if not attached & set(group)]
        if missing:
            return f"its role {role.name} lacks {', '.join(missing)}: {why}"
        return None

    return check


def _cni_on_nodes(stack: Stack) -> bool:
    """Whether the VPC CNI takes its AWS permissions from the nodes' role: it does unless its
    add-on is given a role of its own (IRSA or Pod Identity)."""
    return not any(
        r.type == ADDON
        and r.inputs.get("addonName") == "vpc-cni"
        and (r.inputs.get("serviceAccountRoleArn") or r.inputs.get("podIdentityAssociations"))
        for r in stack.resources
    )


def _associated_roles(resource: Registered, stack: Stack) -> list[tuple[str, Registered | None]]:
    """Each Pod Identity association's role ARN and the stack's role it names (None if none)."""
    return [
        (str(arn), stack.owner(arn))
        for _, arn in values_at(resource.inputs, "podIdentityAssociations.*.roleArn")
    ]


def _trusts_pod_identity(role: Registered) -> bool:
    """Whether a role's trust policy lets EKS Pod Identity take it: an Allow statement for the
    pods.eks.amazonaws.com principal with sts:AssumeRole and sts:TagSession."""
    text = role.inputs.get("assumeRolePolicy")
    try:
        document = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return False
    statements = (document or {}).get("Statement") if isinstance(document, dict) else None
    for statement in statements if isinstance(statements, list) else [statements]:
        if not isinstance(statement, dict) or statement.get("Effect") != "Allow":
            continue
        principal = (statement.get("Principal") or {}).get("Service")
        services = principal if isinstance(principal, list) else [principal]
        actions = statement.get("Action")
        actions = set(actions if isinstance(actions, list) else [actions])
        if POD_IDENTITY_PRINCIPAL in services and actions >= POD_IDENTITY_ACTIONS:
            return True
    return False


def _pod_identity_roles(resource: Registered, stack: Stack) -> str | None:
    for arn, role in _associated_roles(resource, stack):
        if role is None:
            return f"podIdentityAssociations roleArn {arn!r} is not a role the stack makes"
        if not _trusts_pod_identity(role):
            return (
                f"podIdentityAssociations: the role {role.name} does not trust "
                f"{POD_IDENTITY_PRINCIPAL} with sts:AssumeRole and sts:TagSession; EKS Pod "
                "Identity cannot take it"
            )
    return None


def _pod_identity_agent(resource: Registered, stack: Stack) -> str | None:
    """An association gives a pod nothing without the agent on the cluster's nodes."""
    if not resource.inputs.get("podIdentityAssociations"):
        return None
    cluster = resource.inputs.get("clusterName")
    if not any(
        other.type == ADDON
        and other.inputs.get("addonName") == POD_IDENTITY_AGENT
        and other.inputs.get("clusterName") == cluster
        for other in stack.resources
    ):
        return (
            f"podIdentityAssociations without the {POD_IDENTITY_AGENT} add-on on its cluster: "
            "the pods would get no credentials"
        )
    return None


def _cni_role_policies(resource: Registered, stack: Stack) -> str | None:
    """The VPC CNI's own role carries the CNI's policy (the nodes' role no longer does)."""
    if resource.inputs.get("addonName") != "vpc-cni":
        return None
    for _, role in _associated_roles(resource, stack):
        if role is None:
            continue
        attached = {_policy_name(a) for a in _attachments(role, stack)}
        if not attached & set(CNI_POLICY):
            return (
                f"its role {role.name} lacks {CNI_POLICY[0]}: the CNI could not give pods addresses"
            )
    return None


@dataclass(frozen=True)
class ServiceAccounts(Rule):
    """Each Pod Identity association names a service account as Kubernetes names one."""

    family: ClassVar[str] = NAME
    source: str

    def problems(self, resource: Registered, _stack: Stack) -> Iterator[str]:
        for where, value in values_at(resource.inputs, "podIdentityAssociations.*.serviceAccount"):
            text = str(value)
            if not (1 <= len(text) <= SUBDOMAIN_MAX and DNS1123_SUBDOMAIN.fullmatch(text)):
                yield f"{where} {text!r}: not a service account's name, {SUBDOMAIN_MEANING}"


@dataclass(frozen=True)
class AfterAssociatedRoles(Rule):
    """An add-on with Pod Identity associations is made after its roles' policy attachments:
    its pods start with the role's permissions, not without them."""

    family: ClassVar[str] = ORDER
    source: str = (
        "the program's rule: the add-on's pods take their role's credentials as they start "
        f"({ADDON_IAM})"
    )

    def problems(self, resource: Registered, stack: Stack) -> Iterator[str]:
        for _, role in _associated_roles(resource, stack):
            if role is None:  # _pod_identity_roles reports it
                continue
            for attachment in _attachments(role, stack):
                if not stack.waits_for(resource, attachment):
                    yield (
                        f"is not made after {attachment.name} ({ATTACHMENT}), a policy of its "
                        f"Pod Identity role {role.name}"
                    )


def _owners(resource: Registered, stack: Stack, path: str) -> list[tuple[Any, Registered | None]]:
    return [(value, stack.owner(value)) for _, value in values_at(resource.inputs, path)]


def _two_zones(resource: Registered, stack: Stack) -> str | None:
    subnets = _owners(resource, stack, "vpcConfig.subnetIds.*")
    if len(subnets) < 2:
        return f"vpcConfig.subnetIds holds {len(subnets)} subnet(s); EKS takes two at least"
    unknown = [value for value, subnet in subnets if subnet is None]
    if unknown:
        return f"vpcConfig.subnetIds {unknown[0]!r} is not a subnet the stack makes: no zone known"
    zones = {
        s.inputs.get("availabilityZone") or s.inputs.get("availabilityZoneId")
        for _, s in subnets
        if s is not None
    }
    if len(zones - {None}) < 2:
        names = ", ".join(s.name for _, s in subnets if s is not None)
        return f"vpcConfig.subnetIds ({names}) are not in two availability zones"
    return None


def _endpoint_access(resource: Registered, _stack: Stack) -> str | None:
    config = resource.inputs.get("vpcConfig") or {}
    # EKS's defaults: a public endpoint, no private one.
    if not config.get("endpointPublicAccess", True) and not config.get("endpointPrivateAccess"):
        return (
            "vpcConfig.endpointPublicAccess is false without endpointPrivateAccess: EKS turns "
            "public access off only with private access on"
        )
    return None


def _private_endpoint_dns(resource: Registered, stack: Stack) -> str | None:
    """A private endpoint is a Route 53 private zone, which resolves only in a VPC with DNS
    hostnames and DNS support on."""
    if not (resource.inputs.get("vpcConfig") or {}).get("endpointPrivateAccess"):
        return None
    for _, subnet in _owners(resource, stack, "vpcConfig.subnetIds.*"):
        vpc = stack.owner(subnet.inputs.get("vpcId")) if subnet else None
        if vpc and not (
            vpc.inputs.get("enableDnsHostnames") and vpc.inputs.get("enableDnsSupport", True)
        ):
            return (
                f"vpcConfig.endpointPrivateAccess needs enableDnsHostnames and enableDnsSupport "
                f"on {vpc.name}: nodes would not resolve the private endpoint"
            )
    return None


def _instance_types(resource: Registered, stack: Stack) -> list[str]:
    types = [str(t) for _, t in values_at(resource.inputs, "instanceTypes.*")]
    template = stack.owner((resource.inputs.get("launchTemplate") or {}).get("id"))
    if not types and template and template.inputs.get("instanceType"):
        types = [str(template.inputs["instanceType"])]
    return types


def _graviton(resource: Registered, stack: Stack) -> str | None:
    ami = str(resource.inputs.get("amiType"))
    if "_ARM_64" not in ami:
        return f"amiType {ami!r} is not an ARM_64 type: the nodes are Graviton"
    others = [t for t in _instance_types(resource, stack) if not aws.FACTS.is_arm(t)]
    if others:
        return f"instance types {', '.join(others)} are not Graviton, and amiType {ami} is Arm"
    return None


def _scaling(resource: Registered, _stack: Stack) -> str | None:
    scaling = resource.inputs.get("scalingConfig") or {}
    low, want, high = (scaling.get(k) for k in ("minSize", "desiredSize", "maxSize"))
    if low is None or want is None or high is None:
        return "scalingConfig takes minSize, desiredSize and maxSize"
    if not low <= want <= high:
        return f"scalingConfig: minSize {low} <= desiredSize {want} <= maxSize {high} fails"
    return None


def _update_config(resource: Registered, _stack: Stack) -> str | None:
    update = resource.inputs.get("updateConfig")
    if update is not None and (update.get("maxUnavailable") is None) == (
        update.get("maxUnavailablePercentage") is None
    ):
        return "updateConfig takes one of maxUnavailable and maxUnavailablePercentage"
    return None


def _taints(resource: Registered, _stack: Stack) -> str | None:
    count = len(resource.inputs.get("taints") or [])
    return f"{count} taints; a node group takes {MAX_TAINTS}" if count > MAX_TAINTS else None


def _with_template(resource: Registered, _stack: Stack) -> str | None:
    """What a node group with a launch template must leave to the template."""
    if not resource.inputs.get("launchTemplate"):
        return None
    for given in ("diskSize", "remoteAccess"):
        if resource.inputs.get(given) is not None:
            return f"{given} with a launchTemplate: the template sets the disk and access"
    return None


def _template_problems(resource: Registered, stack: Stack) -> Iterator[str]:
    """What the launch template of a managed node group must not set."""
    reference = resource.inputs.get("launchTemplate")
    if not reference:
        return
    template = stack.owner(reference.get("id") or reference.get("name"))
    if template is None:
        yield f"launchTemplate {reference!r} is not a launch template the stack makes"
        return
    given, name = template.inputs, template.name
    for field_name, why in (
        ("iamInstanceProfile", "EKS gives the nodes the node group's role"),
        ("instanceInitiatedShutdownBehavior", "EKS controls the instances' lifecycle"),
        ("hibernationOptions", "EKS controls the instances' lifecycle"),
    ):
        if given.get(field_name) is not None:
            yield f"its launch template {name} sets {field_name}: {why}"
    if any(True for _ in values_at(given, "networkInterfaces.*.subnetId")):
        yield f"its launch template {name} sets a subnet: the node group's subnetIds do"
    if given.get("instanceType") and resource.inputs.get("instanceTypes"):
        yield f"instance types in both the node group and its launch template {name}"
    if given.get("imageId") and resource.inputs.get("amiType"):
        yield f"amiType with a custom AMI in its launch template {name}"
    if given.get("imageId") and not (given.get("userData") or given.get("userDataBase64")):
        yield (
            f"its launch template {name} gives an AMI without user data: EKS merges none into "
            "a custom AMI's, and the nodes never join"
        )


def _template_contents(resource: Registered, stack: Stack) -> str | None:
    return next(_template_problems(resource, stack), None)


def _json_text(resource: Registered, _stack: Stack) -> str | None:
    text = resource.inputs.get("configurationValues")
    if text is None:
        return None
    try:
        parsed = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        return f"configurationValues {text!r} is not JSON text of an object"
    return None


# The modes the VPC CNI's node agent takes, and the add-on's network policy switch (a string).
NETWORK_POLICY_MODES = ("standard", "strict")
BOOLEAN_TEXT = ("true", "false")


def _cni_values(resource: Registered) -> dict[str, Any] | None:
    """The VPC CNI add-on's configuration as an object (None for another add-on, or text that
    is not a JSON object, which _json_text reports)."""
    if resource.inputs.get("addonName") != "vpc-cni":
        return None
    text = resource.inputs.get("configurationValues")
    try:
        values = json.loads(text) if isinstance(text, str) else {}
    except ValueError:
        return None
    return values if isinstance(values, dict) else None


def _cni_value_problems(values: dict[str, Any]) -> Iterator[str]:
    env = values.get("env") or {}
    if not isinstance(env, dict):
        yield "configurationValues env is not a map of variables"
        return
    others = [key for key, value in env.items() if not isinstance(value, str)]
    if others:
        yield f"configurationValues env.{others[0]} is not a string (the add-on takes strings)"
    switch = values.get("enableNetworkPolicy", "false")
    if switch not in BOOLEAN_TEXT:
        yield f'configurationValues enableNetworkPolicy {switch!r} is not "true" or "false"'
    mode = env.get("NETWORK_POLICY_ENFORCING_MODE")
    if mode is not None and mode not in NETWORK_POLICY_MODES:
        yield (
            f"configurationValues env.NETWORK_POLICY_ENFORCING_MODE {mode!r} is not one of "
            f"{', '.join(NETWORK_POLICY_MODES)}"
        )
    if mode == "strict" and switch != "true":
        yield (
            "configurationValues env.NETWORK_POLICY_ENFORCING_MODE strict without "
            'enableNetworkPolicy "true": the mode is the policy agent\'s, which the switch turns '
            "on (the guide's steps 1 and 2)"
        )


def _vpc_cni_values(resource: Registered, _stack: Stack) -> str | None:
    """The VPC CNI's configuration: its env values are strings (the container's environment),
    enableNetworkPolicy is "true" or "false", and a policy mode is one the agent knows and comes
    with the agent's enforcement on (the EKS guide sets both)."""
    values = _cni_values(resource)
    return None if values is None else next(_cni_value_problems(values), None)


def _gp3_blocks(resource: Registered, _stack: Stack) -> str | None:
    for where, ebs in values_at(resource.inputs, "blockDeviceMappings.*.ebs"):
        if ebs.get("volumeType") != "gp3":
            continue
        size, iops, mibps = ebs.get("volumeSize"), ebs.get("iops"), ebs.get("throughput")
        if mibps is not None and iops is not None and mibps > iops * GP3_MIBPS_PER_IOPS:
            return f"{where}: gp3 throughput {mibps} MiB/s needs {int(mibps / 0.25)} IOPS"
        if iops is not None and size is not None and iops > size * GP3_IOPS_PER_GIB:
            return f"{where}: gp3 takes {GP3_IOPS_PER_GIB} IOPS per GiB, not {iops} on {size}"
    return None


ROLE_ORDER_WHY = (
    "without its policies first EKS cannot create (or, on destroy, delete) the EC2 "
    "infrastructure it manages"
)
ROLE_ORDER_SOURCE = (
    f"{SDK}eks/cluster.py (role_arn: 'explicit dependencies on the IAM Role permissions'); "
    "eks/node_group.py example (depends_on the node role's attachments)"
)

RULES = by_type(
    ResourceRules(
        CLUSTER,
        (
            tags(),
            Name(
                "name",
                EKS_NAME,
                1,
                100,
                EKS_NAME_MEANING,
                f"{CREATE_CLUSTER}; {SDK}eks/cluster.py; {AUTONAME}",
                AutoName(max_length=255),
            ),
            OneOf(
                "accessConfig.authenticationMode",
                ("CONFIG_MAP", "API", "API_AND_CONFIG_MAP"),
                f"{SDK}eks/_inputs.py ClusterAccessConfigArgs",
            ),
            OneOf(
                "upgradePolicy.supportType",
                ("STANDARD", "EXTENDED"),
                f"{SDK}eks/_inputs.py ClusterUpgradePolicyArgs",
            ),
            OneOf(
                "enabledClusterLogTypes.*",
                ("api", "audit", "authenticator", "controllerManager", "scheduler"),
                f"{GUIDE}clusters/control-plane-logs.adoc",
            ),
            OneOf(
                "encryptionConfig.resources.*",
                ("secrets",),
                f"{SDK}eks/_inputs.py ClusterEncryptionConfigArgs",
            ),
            Requires(_two_zones, f"{NETWORK_REQS}; {SDK}eks/_inputs.py ClusterVpcConfigArgs"),
            Requires(
                _endpoint_access,
                f"{ENDPOINT} ('You must enable private access to disable public access')",
            ),
            Requires(_private_endpoint_dns, ENDPOINT),
            Requires(
                _role_carries("roleArn", CLUSTER_POLICIES, "EKS cannot manage the cluster"),
                CLUSTER_ROLE,
            ),
            AfterRoleAttachments("roleArn", ROLE_ORDER_WHY, ROLE_ORDER_SOURCE),
        ),
        # Not replaced: subnetIds and security groups (UpdateClusterConfig), endpoint access,
        # version, logs, upgradePolicy. Removing encryptionConfig replaces the cluster (adding
        # it does not); authenticationMode cannot go back from API to CONFIG_MAP (refused).
        replaced_on=(
            "name",
            "roleArn",
            "bootstrapSelfManagedAddons",
            "accessConfig.bootstrapClusterCreatorAdminPermissions",
            "kubernetesNetworkConfig.ipFamily",
            "kubernetesNetworkConfig.serviceIpv4Cidr",
            "outpostConfig.controlPlaneInstanceType",
            "outpostConfig.controlPlanePlacement.groupName",
        ),
        source=f"{TF}eks/cluster.go",
    ),
    ResourceRules(
        NODE_GROUP,
        (
            tags(),
            Name(
                "nodeGroupName",
                EKS_NAME,
                1,
                63,
                EKS_NAME_MEANING,
                f"{SDK}eks/node_group.py; {TF}eks/node_group.go; pulumi/pulumi-aws "
                "provider/resource_overrides.go @015d3438 (AutoName nodeGroupName 255)",
                AutoName(max_length=255),
            ),
            OneOf("amiType", AMI_TYPES, f"{NODEGROUP_API}; {AMI_TYPE_LIST}"),
            Requires(_graviton, f"{PROGRAM}: Graviton nodes, an ARM_64 AMI ({AMI_TYPE_LIST})"),
            OneOf("capacityType", ("ON_DEMAND", "SPOT"), f"{SDK}eks/node_group.py"),
            Between("scalingConfig.minSize", 0, INT32_MAX, f"{TF}eks/node_group.go"),
            Between("scalingConfig.desiredSize", 0, INT32_MAX, f"{TF}eks/node_group.go"),
            Between("scalingConfig.maxSize", 1, INT32_MAX, f"{TF}eks/node_group.go"),
            Requires(_scaling, f"{EKS_API}API_NodegroupScalingConfig.html"),
            Between("updateConfig.maxUnavailable", 1, 100, f"{TF}eks/node_group.go"),
            Between("updateConfig.maxUnavailablePercentage", 1, 100, f"{TF}eks/node_group.go"),
            Requires(_update_config, f"{TF}eks/node_group.go (ExactlyOneOf)"),
            Requires(_taints, f"{TF}eks/node_group.go (MaxItems 50); {SDK}eks/_inputs.py"),
            OneOf(
                "taints.*.effect",
                ("NO_SCHEDULE", "NO_EXECUTE", "PREFER_NO_SCHEDULE"),
                f"{SDK}eks/_inputs.py NodeGroupTaintArgs",
            ),
            Text("taints.*.key", 63, f"{SDK}eks/_inputs.py NodeGroupTaintArgs"),
            Text("taints.*.value", 63, f"{SDK}eks/_inputs.py NodeGroupTaintArgs"),
            # EKS takes keys and values of 1-63 characters each, in Kubernetes' syntax.
            Labels("labels", f"{NODE_LABELS_API}; {LABELS}", key_max=63, value_min=1),
            Requires(_with_template, f"{LAUNCH_TEMPLATES}; {SDK}eks/node_group.py"),
            Requires(_template_contents, LAUNCH_TEMPLATES),
            Requires(
                _role_carries(
                    "nodeRoleArn", NODE_POLICIES, "the nodes cannot join or pull images", cni=True
                ),
                NODE_ROLE,
            ),
            AfterRoleAttachments("nodeRoleArn", ROLE_ORDER_WHY, ROLE_ORDER_SOURCE),
        ),
        # In place: labels, taints, scalingConfig, updateConfig, version, releaseVersion,
        # launchTemplate.version (a new template version rolls the nodes).
        replaced_on=(
            "amiType",
            "capacityType",
            "clusterName",
            "diskSize",
            "instanceTypes",
            "launchTemplate.id",
            "launchTemplate.name",
            "nodeGroupName",
            "nodeGroupNamePrefix",
            "nodeRoleArn",
            "remoteAccess",
            "subnetIds",
        ),
        source=f"{TF}eks/node_group.go @012e0a32",
    ),
    ResourceRules(
        ADDON,
        (
            tags(),
            OneOf("resolveConflictsOnCreate", ("NONE", "OVERWRITE"), f"{SDK}eks/addon.py"),
            OneOf(
                "resolveConflictsOnUpdate", ("NONE", "OVERWRITE", "PRESERVE"), f"{SDK}eks/addon.py"
            ),
            Requires(_json_text, f"{SDK}eks/addon.py ('a single JSON string')"),
            Requires(_vpc_cni_values, f"{NETWORK_POLICY_GUIDE}; {VPC_CNI_VALUES}; {VPC_CNI_MODES}"),
            # EKS Pod Identity: the service account's name, a role that trusts the service's
            # principal, the agent on the cluster, and (for the CNI) its policy on that role.
            ServiceAccounts(
                f"{SDK}eks/_inputs.py AddonPodIdentityAssociationArgs; {SERVICE_ACCOUNT_NAME}"
            ),
            Requires(_pod_identity_roles, f"{POD_IDENTITY} (the role's trust policy)"),
            Requires(
                _pod_identity_agent, f"{POD_IDENTITY} ('The EKS Pod Identity Agent is required')"
            ),
            Requires(_cni_role_policies, f"{GUIDE}networking/cni-iam-role.adoc; {NODE_ROLE}"),
            AfterAssociatedRoles(),
        ),
        # In place: addonVersion, configurationValues, serviceAccountRoleArn.
        replaced_on=("addonName", "clusterName"),
        source=f"{TF}eks/addon.go @00a35305",
    ),
    ResourceRules(
        LAUNCH_TEMPLATE,
        (
            tags(),
            # The instances' and volumes' tags (the node group's own reach only the group).
            tags("tagSpecifications.*.tags"),
            Name(
                "name",
                LAUNCH_TEMPLATE_NAME,
                3,
                # The API takes 128; the provider's ValidLaunchTemplateName stops at 125.
                125,
                "letters, digits and ( ) . - / _",
                f"{CREATE_LAUNCH_TEMPLATE}; hashicorp/terraform-provider-aws internal/verify "
                f"(ValidLaunchTemplateName); {AUTONAME}",
            ),
            Text("description", 255, f"{CREATE_LAUNCH_TEMPLATE} (VersionDescription)"),
            OneOf(
                "tagSpecifications.*.resourceType",
                ("instance", "volume", "network-interface", "spot-instances-request"),
                LAUNCH_TEMPLATE_TAGS,
            ),
            OneOf("metadataOptions.httpEndpoint", ("enabled", "disabled"), METADATA_OPTIONS),
            OneOf("metadataOptions.httpTokens", ("required", "optional"), METADATA_OPTIONS),
            Between("metadataOptions.httpPutResponseHopLimit", 1, 64, METADATA_OPTIONS),
            OneOf(
                "blockDeviceMappings.*.ebs.volumeType",
                ("gp3",),
                f"{PROGRAM}: the only type its disk model prices",
            ),
            Between("blockDeviceMappings.*.ebs.volumeSize", 1, 65_536, EBS),
            # The launch limits (RunInstances'), as for an instance's root volume.
            Between(
                "blockDeviceMappings.*.ebs.throughput",
                125,
                aws.GP3_LAUNCH_MAX_MIBPS,
                LAUNCH_TEMPLATE_EBS,
            ),
            Between(
                "blockDeviceMappings.*.ebs.iops", 3000, aws.GP3_LAUNCH_MAX_IOPS, LAUNCH_TEMPLATE_EBS
            ),
            Requires(_gp3_blocks, EBS),
            # pulumi-aws takes these as the strings "true" and "false".
            OneOf(
                "blockDeviceMappings.*.ebs.encrypted",
                ("true",),
                f"{PROGRAM}: encrypted disks (policy/rules.py); {SDK}ec2/_inputs.py",
            ),
            OneOf(
                "blockDeviceMappings.*.ebs.deleteOnTermination",
                ("true", "false"),
                f"{SDK}ec2/_inputs.py LaunchTemplateBlockDeviceMappingEbsArgs",
            ),
        ),
        # Any other change is a new version of the template.
        replaced_on=("name", "namePrefix"),
        source=f"{TF}ec2/ec2_launch_template.go",
    ),
    ResourceRules(
        ATTACHMENT,
        (
            Name(
                "role",
                IAM_NAME,
                1,
                64,
                IAM_NAME_MEANING,
                ATTACH_ROLE_POLICY,
                autoname=None,
            ),
            Matches(
                "policyArn",
                POLICY_ARN,
                "a managed policy's ARN (arn:aws:iam::aws:policy/... or an account's)",
                f"{ATTACH_ROLE_POLICY}; {IAM_ARNS}",
            ),
        ),
        replaced_on=("role", "policyArn"),
        source=f"{TF}iam/role_policy_attachment.go",
    ),
)
