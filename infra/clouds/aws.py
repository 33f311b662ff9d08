"""AWS facts: Graviton naming, gp3 limits, tag rules, regions. No SDK here."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

from infra.clouds.base import (
    PROGRAM_TAGS,
    CloudFacts,
    DiskModel,
    ModelDisk,
    NatModel,
    Range,
    UserDataChannel,
    VcpuQuota,
    reserved_tag_problem,
)

# The account Canonical publishes Ubuntu's AMIs from (https://ubuntu.com/server/docs/find-ubuntu-images-on-aws).
CANONICAL_OWNER = "099720109477"
# Tags the program sets on AWS resources besides project, stack and role.
NAME_TAG = "Name"
# https://docs.aws.amazon.com/tag-editor/latest/userguide/best-practices-and-strats.html
# (50 tags per resource; keys 1-128 and values 0-256 characters; the aws: prefix is reserved).
# IAM roles carry the tags too, and IAM allows only letters, digits, spaces and _ . : / = + - @
# (https://docs.aws.amazon.com/IAM/latest/UserGuide/id_tags.html).
MAX_TAGS = 50
# SSM Parameter Store values: a standard parameter holds 4 KB, an advanced one 8 KB ($0.05 a
# month; https://docs.aws.amazon.com/systems-manager/latest/userguide/parameter-store-advanced-parameters.html).
SSM_STANDARD_VALUE_CHARS = 4096
SSM_ADVANCED_VALUE_CHARS = 8192
_TAG_PUNCTUATION = set("_.:/=+-@ ")
# gp3 (https://docs.aws.amazon.com/ebs/latest/userguide/general-purpose.html): 125-2,000 MiB/s
# and 3,000-80,000 IOPS for a volume of CreateVolume (the EC2 API reference's CreateVolume and
# ModifyVolume), and the same for one made with an instance or a launch template (the EC2
# model's EbsBlockDevice and LaunchTemplateEbsBlockDeviceRequest, botocore 1.44.5; the Terraform
# provider's launch template validation followed in hashicorp/terraform-provider-aws#44604).
GP3_VOLUME_MAX_MIBPS = 2000
GP3_VOLUME_MAX_IOPS = 80_000
GP3_LAUNCH_MAX_MIBPS = 2000
GP3_LAUNCH_MAX_IOPS = 80_000
# An EBS volume on a Nitro instance is an NVMe disk whose model is this, whatever device name
# the attachment gives (https://docs.aws.amazon.com/ebs/latest/userguide/nvme-ebs-volumes.html);
# /dev/sdf is the first name the EC2 guide recommends for a volume attached to a running node.
MODEL_DISK = ModelDisk(device_model="Amazon Elastic Block Store", device_name="/dev/sdf")


def _tag_text_ok(text: str) -> bool:
    return all(c.isalnum() or c in _TAG_PUNCTUATION for c in text)


def _set_problems(tags: Mapping[str, str]) -> Iterator[str]:
    if len({key.lower() for key in tags}) != len(tags):
        yield "two tag names differ only in case; IAM treats them as one"
    if len(tags) > MAX_TAGS:
        yield f"{len(tags)} tags; AWS allows {MAX_TAGS} per resource"
    for key, value in tags.items():
        if key.lower().startswith("aws:"):
            yield f"tag {key!r}: the aws: prefix is reserved for AWS"
        if not 1 <= len(key) <= 128 or len(value) > 256:
            yield f"tag {key!r}: names hold 1-128 characters and values at most 256"
        if not (_tag_text_ok(key) and _tag_text_ok(value)):
            yield (
                f"tag {key!r}={value!r}: AWS (IAM) tags hold only letters, digits, spaces "
                "and _ . : / = + - @"
            )


def tag_set_problem(tags: Mapping[str, str]) -> str | None:
    """Why a resource's whole tag set breaks AWS's rules (EC2 and IAM), or None."""
    return next(_set_problems(tags), None)


def _tag_problems(tags: Mapping[str, str]) -> Iterator[str | None]:
    yield reserved_tag_problem(tags, (NAME_TAG,))
    program = {key.lower() for key in (*PROGRAM_TAGS, NAME_TAG)}
    for key in tags:
        # IAM compares tag keys without case: "Project" collides with the program's "project".
        if key.lower() in program:
            yield f"tag {key!r} collides with the program's {key.lower()!r} (IAM ignores case)"
    if len(tags) > MAX_TAGS - 4:  # project, stack, role and Name
        yield f"{len(tags)} tags; AWS allows {MAX_TAGS} per resource and the program sets 4"
    yield tag_set_problem(tags)


def tag_problem(tags: Mapping[str, str]) -> str | None:
    """Why the user's tags break AWS's rules (EC2 and IAM), beside the program's, or None."""
    return next((problem for problem in _tag_problems(tags) if problem), None)


# On-Demand vCPU quotas per region, by the first letter of the instance family
# (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-on-demand-instances.html#ec2-on-demand-instances-limits):
# Graviton's c, m and r count as Standard (5 vCPUs on a new account), x8g as X (0).
_QUOTAS = (
    (
        "acdhimrtz",
        VcpuQuota("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
    ),
    ("x", VcpuQuota("L-7295265B", "Running On-Demand X instances")),
)


# A KMS key's ARN (a single-Region key, or a multi-Region one: mrk-…):
# https://docs.aws.amazon.com/kms/latest/developerguide/concepts.html#key-id-key-ARN
KMS_KEY_ARN = re.compile(
    r"arn:aws(?:-[a-z]+)*:kms:([a-z0-9-]+):\d{12}:key/"
    r"(?:[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}|mrk-[0-9a-f]{32})"
)


# EKS (the kubernetes platform). The version is one in standard support ($0.10/h; extended
# support is $0.60/h): 1.35 until 2027-03-27 (docs.aws.amazon.com/eks/latest/userguide/
# kubernetes-versions.html). With support_type STANDARD, EKS upgrades it at the end rather than
# bill extended support.
EKS_VERSION = "1.35"
EKS_SUPPORT_TYPE = "STANDARD"
# Amazon Linux 2023 for Arm, EKS's own node image (kernel 6.1: the VPC CNI's network policies
# need 5.10 or later), kept current by EKS.
EKS_NODE_AMI_TYPE = "AL2023_ARM_64_STANDARD"
AWS_POLICY = "arn:aws:iam::aws:policy/"
EKS_CLUSTER_POLICIES = ("AmazonEKSClusterPolicy",)
# A node's kubelet and image pulls from ECR, pulls only (ReadOnly would also list and describe
# every repository of the account) (docs.aws.amazon.com/eks/latest/userguide/create-node-role.html).
# Not the VPC CNI's policy: it creates, attaches and modifies network interfaces on any resource
# ("*"), and on the node's role anything that takes the node's credentials could move an
# interface of the account into another security group. The guide recommends a role of the CNI's
# own instead, which EKS Pod Identity gives the aws-node service account alone.
EKS_NODE_POLICIES = (
    "AmazonEKSWorkerNodePolicy",
    "AmazonEC2ContainerRegistryPullOnly",
)
# The VPC CNI's own role (IPv4 clusters), for its service account in kube-system
# (docs.aws.amazon.com/eks/latest/userguide/cni-iam-role.html; the add-on takes a Pod Identity
# association from v1.15.5-eksbuild.1: add-ons-iam.adoc, "Pod Identity Support Reference").
EKS_CNI_POLICIES = ("AmazonEKS_CNI_Policy",)
EKS_CNI_SERVICE_ACCOUNT = "aws-node"
# The add-on whose DaemonSet hands Pod Identity credentials to pods (host network, so it runs
# before the CNI does); without it an association gives a pod nothing.
EKS_POD_IDENTITY_AGENT = "eks-pod-identity-agent"
# The service principal a Pod Identity role trusts, with both actions (the guide's trust policy).
EKS_POD_IDENTITY_PRINCIPAL = "pods.eks.amazonaws.com"
# The VPC CNI enforces NetworkPolicy objects (enableNetworkPolicy, a string) in strict mode
# (NETWORK_POLICY_ENFORCING_MODE): a new pod starts denied until its policies are in place, where
# the standard mode lets everything reach it until then; a pod no policy selects stays denied,
# so the stack gives the cluster's DNS and the LWS controller policies of their own. It keeps few
# spare addresses a node (WARM_IP_TARGET, MINIMUM_IP_TARGET): by default a node holds a whole
# spare ENI's worth (50 on a 16xlarge), and 48 nodes would exhaust the /24 their pods share.
# The add-on's configuration takes the chart's env (charts/aws-vpc-cni/values.yaml, v1.23.1),
# NETWORK_POLICY_ENFORCING_MODE among them (v1.17.1 on: the CNI's README).
# docs.aws.amazon.com/eks/latest/userguide/cni-network-policy-configure.html (step 1, strict
# mode); github.com/aws/amazon-vpc-cni-k8s docs/eni-and-ip-target.md.
EKS_NETWORK_POLICY_MODE = "strict"
EKS_VPC_CNI_CONFIGURATION = {
    "enableNetworkPolicy": "true",
    "env": {
        "WARM_IP_TARGET": "2",
        "MINIMUM_IP_TARGET": "4",
        "NETWORK_POLICY_ENFORCING_MODE": EKS_NETWORK_POLICY_MODE,
    },
}
# The VPC's DNS resolver as pods reach it from the host's resolv.conf: the VPC's base + 2 (inside
# the VPC's range) and this link-local address (docs.aws.amazon.com/vpc/latest/userguide/
# AmazonDNS-concepts.html).
VPC_RESOLVER_LINK_LOCAL = "169.254.169.253/32"
# EKS refuses control-plane subnets in these zones (by zone id: docs.aws.amazon.com/eks/latest/
# userguide/network-reqs.html).
EKS_UNSUPPORTED_ZONE_IDS = ("use1-az3", "usw1-az2", "cac1-az3")


def vcpu_quota(instance_type: str) -> VcpuQuota | None:
    letter = instance_type[:1].lower()
    return next((quota for letters, quota in _QUOTAS if letter in letters), None)


FACTS = CloudFacts(
    name="aws",
    region_key="aws:region",
    # us-east-1, ap-southeast-2, us-gov-west-1, eu-central-2, il-central-1
    region_pattern=re.compile(r"[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d"),
    region_example="us-east-1",
    # Availability zones only: Local and Wavelength Zones (us-east-1-bos-1a) need an opt-in and
    # hold no cluster placement groups, and the program never picks them.
    zone_suffix=re.compile(r"[a-z]"),
    zone_example="a",
    # Graviton families carry a "g" after the generation digit: c8g, r7gd, c7gn, t4g, x2gd.
    arm_pattern=re.compile(r"[a-z]+\d+[a-z]*g[a-z]*\.[a-z0-9]+"),
    arm_examples="Graviton: c8g, m8g, r8g, c7g, r7g, c6g, r6g",
    # P6e-GB200: sold as UltraServer capacity blocks (a Grace per two B200s).
    grace_pattern=re.compile(r"p6e-gb200\.[a-z0-9]+"),
    # gp3: https://docs.aws.amazon.com/ebs/latest/userguide/general-purpose.html (64 TiB since
    # 2025), up to 2,000 MiB/s whether CreateVolume or RunInstances makes it. The main node's
    # model has a volume of its own (MODEL_DISK), which outlives a replaced node.
    # A root volume is at least its AMI's snapshot: 8 GiB for Canonical's Ubuntu 24.04 AMIs.
    boot_disk_gb=Range(8, 65_536),
    disk_throughput_mibps=Range(125, GP3_VOLUME_MAX_MIBPS),
    boot_disk_max_mibps=GP3_LAUNCH_MAX_MIBPS,
    model_disk=MODEL_DISK,
    # https://docs.aws.amazon.com/vpc/latest/userguide/vpc-cidr-blocks.html: /16 to /28
    vpc_widest_prefix=16,
    tag_problem=tag_problem,
    tag_word="tag",
    vcpu_quota=vcpu_quota,
    # Canonical's AMI names, which the program looks up among Canonical's own arm64 images
    # only (CANONICAL_OWNER): an AMI id could be anyone's, of any architecture.
    image_pattern=re.compile(
        r"ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24\.04-arm64-server-\d{8}(\.\d{1,2})?"
    ),
    image_example="ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-arm64-server-20251001",
    # https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/user-data.html: 16 KB, before the
    # API's base64; user_data_base64 takes gzip (cloud-init unpacks it).
    # SSM GetCommandInvocation returns the first 24,000 characters of stdout.
    command_output_chars=24_000,
    # 16 KB holds the boot's first steps: the rest (the later scripts, the llama.cpp patches)
    # are parameters the node reads with its role.
    user_data=UserDataChannel(
        "user_data", 16 * 1024, gzip_field="user_data_base64", files_store="aws-ssm"
    ),
    disk=DiskModel("gp3", included_mibps=125, included_iops=3000, iops_per_mibps=4),
    nat=NatModel("NAT gateway"),
    # One HAProxy counts every open request and queues for the first free slot; an internal ALB
    # counts per node (two zones at least) and queues nothing. 2 vCPUs of Graviton4 carry
    # HAProxy's few long requests many times over.
    balancer_instance_type="c8g.large",
    metadata_hosts=frozenset({"instance-data", "instance-data.ec2.internal"}),
    metadata_addresses=frozenset({"fd00:ec2::254", "fd00:ec2::23"}),
    chart_colour="#ff9900",
    model_store_scheme="s3://",
    image_meaning="the name of one of Canonical's arm64 Ubuntu 24.04 AMIs",
    api_key_store="SSM Parameter Store (SecureString)",
    refuses={
        "sshPublicKey": "nodes are reached with SSM Session Manager (connectCommand), not SSH",
        "bastion": "connectCommand forwards through SSM Session Manager already",
        "encryptionAtHost": "every EBS volume of the cluster is encrypted already",
        "networkWatcher": "VPC flow logs need no watcher",
    },
)
