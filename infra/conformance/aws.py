"""The input rules of AWS's APIs for every resource type the program creates
(``infra.conformance.rules``).

Names, descriptions and tags as EC2, ELBv2, IAM and S3 take them; the values and combinations the
program's inputs must keep; the order the APIs need; the inputs whose change replaces a resource
(the Terraform AWS provider's ForceNew, under pulumi-aws 7).
"""

from __future__ import annotations

import base64
import re

from infra.clouds import aws
from infra.conformance.rules import (
    After,
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
    values_at,
)

SSM_DOCUMENTS = (
    "https://docs.aws.amazon.com/systems-manager/latest/APIReference/API_CreateDocument.html; "
    "https://docs.aws.amazon.com/general/latest/gr/ssm.html (a Command document: 64 KB)"
)
TF = "hashicorp/terraform-provider-aws internal/service/"
PULUMI_AWS = "pulumi/pulumi-aws provider/resource_overrides.go and aliases.go"
TAG_RULES = "https://docs.aws.amazon.com/tag-editor/latest/userguide/best-practices-and-strats.html"
# https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateSecurityGroup.html, and the
# same set for rule descriptions (hashicorp/terraform-provider-aws#18874: "Invalid rule
# description. Valid descriptions are strings less than 256 characters from the following set").
SG_API = "https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateSecurityGroup.html"
SG_TEXT = re.compile(r"[A-Za-z0-9 ._\-:/()#,@\[\]+=&;{}!$*]*")
SG_TEXT_MEANING = "security groups take only a-zA-Z0-9. _-:/()#,@[]+=&;{}!$*"
IAM_NAME = re.compile(r"[\w+=,.@-]+")
IAM_NAME_MEANING = "IAM names hold letters, digits and _+=,.@- only"
EBS = "https://docs.aws.amazon.com/ebs/latest/userguide/general-purpose.html"
USER_DATA = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/user-data.html"
SHUTDOWN = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/Using_ChangingInstanceInitiatedShutdownBehavior.html"
CREATE_VOLUME = "https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateVolume.html"
EC2_BLOCK_DEVICE = "https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_EbsBlockDevice.html"
DEVICE_NAMES = "https://docs.aws.amazon.com/ebs/latest/userguide/device_naming.html"
DEVICE_NAME = re.compile(r"/dev/sd[f-p]")
# gp3: a volume provisions at most 0.25 MiB/s per IOPS and 500 IOPS per GiB.
GP3_MIBPS_PER_IOPS = 0.25
GP3_IOPS_PER_GIB = 500


# IAM: a role's inline policies hold 10,240 characters together, white space not counted.
ROLE_INLINE_POLICY_CHARS = 10_240


def _policy_chars(r: Registered) -> int:
    return sum(not c.isspace() for c in str(r.inputs.get("policy", "")))


def _role_inline_policies(r: Registered, stack: Stack) -> str | None:
    role = r.inputs.get("role")
    policies = [o for o in stack.resources if o.type == r.type and o.inputs.get("role") == role]
    total = sum(_policy_chars(o) for o in policies)
    if total <= ROLE_INLINE_POLICY_CHARS:
        return None
    return (
        f"the role's {len(policies)} inline policies hold {total:,} characters without white "
        f"space; IAM takes {ROLE_INLINE_POLICY_CHARS:,} for all of a role's together"
    )


SSM_PARAMETER_API = (
    "https://docs.aws.amazon.com/systems-manager/latest/APIReference/API_PutParameter.html"
)
SSM_PARAMETER_NAMES = (
    "https://docs.aws.amazon.com/systems-manager/latest/userguide/sysman-paramstore-su-create.html"
)


def tags(path: str = "tags") -> Tags:
    return Tags(path, aws.tag_set_problem, TAG_RULES)


def sg_text(path: str, *, required: bool = False) -> Text:
    return Text(path, 255, SG_API, SG_TEXT, SG_TEXT_MEANING, required=required)


def _gp3_root(resource: Registered, _stack: Stack) -> str | None:
    disk = resource.inputs.get("rootBlockDevice") or {}
    if disk.get("volumeType") != "gp3":
        return None
    return _gp3(disk.get("volumeSize"), disk.get("iops"), disk.get("throughput"))


def _gp3_volume(resource: Registered, _stack: Stack) -> str | None:
    if resource.inputs.get("type") != "gp3":
        return None
    inputs = resource.inputs
    return _gp3(inputs.get("size"), inputs.get("iops"), inputs.get("throughput"))


def _gp3(size: int | None, iops: int | None, mibps: int | None) -> str | None:
    if mibps is not None and iops is not None and mibps > iops * GP3_MIBPS_PER_IOPS:
        return f"gp3 throughput {mibps} MiB/s needs at least {int(mibps / 0.25)} IOPS, not {iops}"
    if iops is not None and size is not None and iops > size * GP3_IOPS_PER_GIB:
        return f"gp3 takes at most {GP3_IOPS_PER_GIB} IOPS per GiB: {iops} on {size} GiB"
    return None


def _attached_in_its_zone(resource: Registered, stack: Stack) -> str | None:
    """A volume attaches only to an instance in its own availability zone."""
    volume = stack.owner(resource.inputs.get("volumeId"))
    instance = stack.owner(resource.inputs.get("instanceId"))
    subnet = stack.owner(instance.inputs.get("subnetId")) if instance else None
    if volume is None or instance is None or subnet is None:
        return "attaches a volume or an instance that the stack does not make"
    zone, node_zone = volume.inputs.get("availabilityZone"), subnet.inputs.get("availabilityZone")
    if zone != node_zone:
        return f"volume {volume.name} in {zone} attached to {instance.name} in {node_zone}"
    return None


def _user_data(resource: Registered, _stack: Stack) -> str | None:
    text, packed = resource.inputs.get("userData"), resource.inputs.get("userDataBase64")
    raw = len(text.encode()) if text else len(base64.b64decode(packed)) if packed else 0
    if raw > aws.FACTS.user_data.limit_bytes:
        return f"user data of {raw} bytes; EC2 takes {aws.FACTS.user_data.limit_bytes}"
    if not resource.inputs.get("userDataReplaceOnChange"):
        return "new user data must replace the node (cloud-init reads it on the first boot only)"
    return None


def _parameter_value(resource: Registered, _stack: Stack) -> str | None:
    limit = aws.SSM_STANDARD_VALUE_CHARS
    for _, value in values_at(resource.inputs, "value"):
        if resource.inputs.get("tier", "Standard") == "Standard" and len(str(value)) > limit:
            return (
                f"a value of {len(str(value))} characters; a standard parameter holds {limit} "
                f"(tier Advanced: {aws.SSM_ADVANCED_VALUE_CHARS})"
            )
    return None


RULES = by_type(
    ResourceRules(
        "aws:ec2/vpc:Vpc",
        (tags(),),
        replaced_on=("cidrBlock",),
        source=f"{TF}ec2/vpc_.go",
    ),
    ResourceRules(
        "aws:ec2/subnet:Subnet",
        (tags(),),
        replaced_on=("availabilityZone", "availabilityZoneId", "cidrBlock", "vpcId"),
        source=f"{TF}ec2/vpc_subnet.go",
    ),
    ResourceRules("aws:ec2/internetGateway:InternetGateway", (tags(),)),
    ResourceRules(
        "aws:ec2/routeTable:RouteTable",
        (tags(),),
        replaced_on=("vpcId",),
        source=f"{TF}ec2/vpc_route_table.go",
    ),
    ResourceRules(
        "aws:ec2/routeTableAssociation:RouteTableAssociation",
        (),
        replaced_on=("subnetId", "gatewayId"),
        source=f"{TF}ec2/vpc_route_table_association.go",
    ),
    ResourceRules(
        "aws:ec2/eip:Eip",
        (
            tags(),
            OneOf("domain", ("vpc",), "pulumi-aws 7: Eip(domain='vpc'); the vpc flag is gone"),
            After(
                ("aws:ec2/internetGateway:InternetGateway",),
                "an EIP may need the VPC's internet gateway first",
                "pulumi_aws.ec2.Eip docs: 'EIP may require IGW to exist prior to association'",
            ),
        ),
        replaced_on=("domain",),
        source=f"{TF}ec2/vpc_eip.go",
    ),
    ResourceRules(
        "aws:ec2/natGateway:NatGateway",
        (
            tags(),
            After(
                ("aws:ec2/internetGateway:InternetGateway",),
                "a public NAT gateway fails without an attached internet gateway, and a destroy "
                "that detaches the gateway first retries for minutes",
                "pulumi_aws.ec2.NatGateway 'Public NAT' example (depends_on the internet gateway)",
            ),
        ),
        replaced_on=("allocationId", "subnetId", "connectivityType"),
        source=f"{TF}ec2/vpc_nat_gateway.go",
    ),
    ResourceRules(
        "aws:ec2/vpcEndpoint:VpcEndpoint",
        (tags(), OneOf("vpcEndpointType", ("Gateway",), f"{TF}ec2/vpc_endpoint.go")),
        replaced_on=("vpcId", "serviceName", "vpcEndpointType"),
        source=f"{TF}ec2/vpc_endpoint.go",
    ),
    ResourceRules(
        "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup",
        (tags(), sg_text("ingress.*.description"), sg_text("egress.*.description")),
        replaced_on=("vpcId",),
        source=f"{TF}ec2/vpc_default_security_group.go",
    ),
    ResourceRules(
        "aws:ec2/defaultNetworkAcl:DefaultNetworkAcl",
        (
            tags(),
            Between(
                "ingress.*.ruleNo",
                1,
                32766,
                "https://docs.aws.amazon.com/vpc/latest/userguide/nacl-rules.html",
            ),
            OneOf("ingress.*.action", ("allow", "deny"), f"{TF}ec2/vpc_network_acl.go"),
        ),
        replaced_on=("defaultNetworkAclId",),
        source=f"{TF}ec2/vpc_default_network_acl.go",
    ),
    ResourceRules(
        "aws:s3/bucket:Bucket",
        (
            tags(),
            Name(
                "bucket",
                re.compile(r"(?!xn--)[a-z0-9](?:[a-z0-9-]|\.(?!\.))*[a-z0-9]"),
                3,
                63,
                "a bucket name: lowercase letters, digits, '-' and single '.'",
                "https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html; "
                f"{PULUMI_AWS} (AutoName 63, lowercased)",
                AutoName(max_length=63, lowercase=True),
            ),
        ),
        replaced_on=("bucket",),
        source=f"{TF}s3/bucket.go",
    ),
    ResourceRules(
        "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
        (),
        replaced_on=("bucket",),
        source=f"{TF}s3/bucket_public_access_block.go",
    ),
    ResourceRules(
        "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration",
        (
            Between(
                "rules.*.expiration.days",
                1,
                2**31 - 1,
                "https://docs.aws.amazon.com/AmazonS3/latest/API/API_LifecycleExpiration.html",
            ),
        ),
        replaced_on=("bucket",),
        source=f"{TF}s3/bucket_lifecycle_configuration.go",
    ),
    ResourceRules(
        "aws:ec2/flowLog:FlowLog",
        (
            tags(),
            OneOf(
                "maxAggregationInterval",
                (60, 600),
                "https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateFlowLogs.html",
            ),
            OneOf("trafficType", ("ACCEPT", "REJECT", "ALL"), f"{TF}ec2/vpc_flow_log.go"),
            OneOf(
                "logDestinationType",
                ("cloud-watch-logs", "s3", "kinesis-data-firehose"),
                f"{TF}ec2/vpc_flow_log.go",
            ),
        ),
        # Flow logs have no update call: every input but the tags replaces one.
        replaced_on=(
            "vpcId",
            "trafficType",
            "logDestination",
            "logDestinationType",
            "maxAggregationInterval",
        ),
        source=f"{TF}ec2/vpc_flow_log.go",
    ),
    ResourceRules(
        "aws:iam/role:Role",
        (
            tags(),
            Name(
                "name",
                IAM_NAME,
                1,
                64,
                IAM_NAME_MEANING,
                "https://docs.aws.amazon.com/IAM/latest/APIReference/API_CreateRole.html; "
                f"{PULUMI_AWS} (AutoName 64)",
                AutoName(max_length=64),
            ),
        ),
        replaced_on=("name", "path"),
        source=f"{TF}iam/role.go",
    ),
    ResourceRules(
        "aws:iam/rolePolicy:RolePolicy",
        (
            Name(
                "name",
                IAM_NAME,
                1,
                128,
                IAM_NAME_MEANING,
                "https://docs.aws.amazon.com/IAM/latest/APIReference/API_PutRolePolicy.html",
            ),
            Requires(
                _role_inline_policies,
                "https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_iam-quotas.html "
                "(Role policy size: all inline policies of a role together; white space is not "
                "counted)",
            ),
        ),
        replaced_on=("name", "role"),
        source=f"{TF}iam/role_policy.go",
    ),
    ResourceRules(
        "aws:ssm/parameter:Parameter",
        (
            tags(),
            # A name, or a fully qualified one ('/' and its path), not starting with aws or ssm.
            Name(
                "name",
                re.compile(
                    r"(?!(?i:aws|ssm))[A-Za-z0-9_.\-]+"
                    r"|/(?!(?i:aws|ssm))[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+){0,14}"
                ),
                1,
                1011,
                "a name, or a path of at most 15 levels, of letters, digits, '_', '.' and '-', "
                "not starting with aws or ssm",
                SSM_PARAMETER_NAMES,
                # pulumi-aws names a parameter when the program does not (its name input is
                # optional); the program always gives a path, so the bridge replaces one
                # delete-first.
                AutoName(),
            ),
            Text("description", 1024, SSM_PARAMETER_API),
            OneOf("type", ("String", "StringList", "SecureString"), SSM_PARAMETER_API),
            OneOf("tier", ("Standard", "Advanced", "Intelligent-Tiering"), SSM_PARAMETER_API),
            # A value of 1-4096 characters (standard), or 8192 (advanced).
            Text("value", aws.SSM_ADVANCED_VALUE_CHARS, SSM_PARAMETER_API, required=True),
            Requires(_parameter_value, SSM_PARAMETER_API),
        ),
        replaced_on=("name",),
        source=f"{TF}ssm/parameter.go",
    ),
    ResourceRules(
        "aws:ssm/document:Document",
        (
            tags(),
            Name(
                "name",
                # Names starting with aws, amazon or amzn are AWS's own, in any case.
                re.compile(r"(?!(?i:aws|amazon|amzn))[A-Za-z0-9_.-]+"),
                3,
                128,
                "letters, digits, '_', '-' and '.', not starting with aws, amazon or amzn",
                f"{SSM_DOCUMENTS}; {TF}ssm/document.go",
            ),
            OneOf("documentType", ("Command",), SSM_DOCUMENTS),
            OneOf("documentFormat", ("JSON", "YAML"), SSM_DOCUMENTS),
            Requires(
                lambda r, _: (
                    f"content of {len(str(r.inputs.get('content', '')))} bytes; a Command "
                    "document holds at most 64 KB"
                    if len(str(r.inputs.get("content", "")).encode()) > 64 * 1024
                    else None
                ),
                SSM_DOCUMENTS,
            ),
        ),
        # A new content is a new version, made the default in place.
        replaced_on=("name",),
        source=f"{TF}ssm/document.go",
    ),
    ResourceRules(
        "aws:iam/instanceProfile:InstanceProfile",
        (
            tags(),
            # Pulumi's auto-name stops at 255; IAM at 128.
            Name(
                "name",
                IAM_NAME,
                1,
                128,
                IAM_NAME_MEANING,
                "https://docs.aws.amazon.com/IAM/latest/APIReference/API_CreateInstanceProfile.html",
            ),
        ),
        replaced_on=("name", "path"),
        source=f"{TF}iam/instance_profile.go",
    ),
    ResourceRules(
        "aws:ec2/securityGroup:SecurityGroup",
        (
            tags(),
            Name(
                "name",
                re.compile(r"(?!sg-)[A-Za-z0-9 ._\-:/()#,@\[\]+=&;{}!$*]+"),
                1,
                255,
                f"{SG_TEXT_MEANING}, not starting with 'sg-'",
                SG_API,
            ),
            sg_text("description", required=True),
        ),
        # A description cannot be changed: EC2 has no call for it.
        replaced_on=("name", "description", "vpcId"),
        source=f"{TF}ec2/vpc_security_group.go",
    ),
    *(
        ResourceRules(
            f"aws:vpc/securityGroup{kind}Rule:SecurityGroup{kind}Rule",
            (
                tags(),
                sg_text("description"),
                Between("fromPort", -1, 65535, f"{TF}vpc/security_group_{kind.lower()}_rule.go"),
                Between("toPort", -1, 65535, f"{TF}vpc/security_group_{kind.lower()}_rule.go"),
            ),
            replaced_on=("securityGroupId",),
            source=f"{TF}vpc/security_group_{kind.lower()}_rule.go",
        )
        for kind in ("Ingress", "Egress")
    ),
    ResourceRules(
        "aws:ec2/placementGroup:PlacementGroup",
        (
            tags(),
            Name(
                "name",
                re.compile(r"[\x20-\x7e]+"),
                1,
                255,
                "printable ASCII",
                "https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreatePlacementGroup.html",
            ),
            OneOf(
                "strategy", ("cluster", "partition", "spread"), f"{TF}ec2/ec2_placement_group.go"
            ),
        ),
        replaced_on=("name", "strategy", "partitionCount", "spreadLevel"),
        source=f"{TF}ec2/ec2_placement_group.go",
    ),
    ResourceRules(
        "aws:ec2/instance:Instance",
        (
            tags(),
            tags("rootBlockDevice.tags"),
            Between("rootBlockDevice.throughput", 125, aws.GP3_LAUNCH_MAX_MIBPS, EC2_BLOCK_DEVICE),
            Between("rootBlockDevice.iops", 3000, aws.GP3_LAUNCH_MAX_IOPS, EC2_BLOCK_DEVICE),
            Between("rootBlockDevice.volumeSize", 8, 65_536, EBS),
            Between("metadataOptions.httpPutResponseHopLimit", 1, 64, f"{TF}ec2/ec2_instance.go"),
            OneOf("metadataOptions.httpTokens", ("required", "optional"), USER_DATA),
            OneOf("instanceInitiatedShutdownBehavior", ("stop", "terminate"), SHUTDOWN),
            Requires(_gp3_root, EBS),
            Requires(_user_data, USER_DATA),
        ),
        replaced_on=(
            "ami",
            "availabilityZone",
            "subnetId",
            "privateIp",
            "placementGroup",
            "ebsOptimized",
            "rootBlockDevice.encrypted",
            "rootBlockDevice.kmsKeyId",
            # With userDataReplaceOnChange, which the program always sets.
            "userData",
            "userDataBase64",
        ),
        source=f"{TF}ec2/ec2_instance.go",
        held=("privateIp",),
        held_source=(
            "InvalidIPAddress.InUse, https://docs.aws.amazon.com/AWSEC2/latest/APIReference/"
            "errors-overview.html; pulumi/pulumi#10923"
        ),
    ),
    ResourceRules(
        "aws:ebs/volume:Volume",
        (
            tags(),
            OneOf("type", ("gp3",), "the program's rule: the only type its disk model prices"),
            Between("throughput", 125, aws.GP3_VOLUME_MAX_MIBPS, CREATE_VOLUME),
            Between("iops", 3000, aws.GP3_VOLUME_MAX_IOPS, CREATE_VOLUME),
            Between("size", 1, 65_536, CREATE_VOLUME),
            Requires(_gp3_volume, EBS),
            Requires(
                lambda r, _: None if r.inputs.get("availabilityZone") else "no availability zone",
                CREATE_VOLUME,
            ),
        ),
        # ModifyVolume grows a volume and never shrinks it (the provider's CustomizeDiff does not
        # replace a smaller one, so `up` would fail halfway): the program replaces it on any
        # new size (replace_on_changes).
        replaced_on=("availabilityZone", "encrypted", "kmsKeyId", "snapshotId", "outpostArn"),
        source=f"{TF}ec2/ebs_volume.go",
    ),
    ResourceRules(
        "aws:ec2/volumeAttachment:VolumeAttachment",
        (
            Name(
                "deviceName",
                DEVICE_NAME,
                8,
                8,
                "/dev/sd[f-p] (the names the EC2 guide recommends for EBS volumes)",
                DEVICE_NAMES,
                autoname=None,
            ),
            Requires(_attached_in_its_zone, CREATE_VOLUME),
        ),
        replaced_on=("deviceName", "instanceId", "volumeId"),
        source=f"{TF}ec2/ec2_volume_attachment.go",
    ),
)
