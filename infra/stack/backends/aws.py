"""AWS Graviton: a VPC with a private subnet behind a NAT gateway; per serving group, security
groups that open the RPC port from that group's main node only and a cluster placement group;
a balancer node (HAProxy, ``infra.boot.balancer``) in front of the groups when there are
several; and SSM instead of SSH.

Baseline (AWS Foundational Security Best Practices): the VPC's default security group holds no
rules (EC2.2), its default network ACL refuses SSH and RDP from anywhere (EC2.21), VPC flow logs
go to an S3 bucket of the stack (EC2.6), nodes take IMDSv2 only (EC2.8) and encrypted volumes
(EC2.7), and have no public address (EC2.9). Only the main node has an instance role, with what
Session Manager needs; workers and the balancer node have none.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlparse

import pulumi
import pulumi_aws as aws

from infra.boot.balancer import render as render_balancer
from infra.boot.deliver import Delivery, deliver, packed
from infra.boot.metrics_command import read_command
from infra.boot.render import BOOT_ROOT, fetched_files
from infra.clouds import aws as aws_facts
from infra.clouds.base import FLOW_LOG_RETENTION_DAYS, ModelDisk, Provisioned
from infra.clouds.stores import listed_prefixes, s3_object
from infra.core import outputs, sizing
from infra.core.limits import METRICS_PORT
from infra.stack.backends.base import (
    BalancerPlace,
    CloudBackend,
    GroupSpec,
    Node,
    NodeSpec,
    node_options,
)
from infra.stack.config import ClusterConfig

UBUNTU_AMI_PARAMETER = (
    "/aws/service/canonical/ubuntu/server/24.04/stable/current/arm64/hvm/ebs-gp3/ami-id"
)
# What the main node's SSM agent needs for Session Manager (the tunnel) and Run Command (the
# cost run, infra.observe.top), and no more. AWS's AmazonSSMManagedInstanceCore would also let any
# process on the node read every SSM parameter and document of the region. Session Manager:
# the actions of AWS's AWSCloud9SSMInstanceProfile policy; Run Command: the ec2messages actions
# (https://docs.aws.amazon.com/systems-manager/latest/userguide/setup-instance-permissions.html).
# None of them takes a resource narrower than "*".
AGENT_POLICY = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Sid": "SessionManager",
            "Effect": "Allow",
            "Action": [
                "ssm:UpdateInstanceInformation",
                "ssmmessages:CreateControlChannel",
                "ssmmessages:CreateDataChannel",
                "ssmmessages:OpenControlChannel",
                "ssmmessages:OpenDataChannel",
            ],
            "Resource": "*",
        },
        {
            "Sid": "RunCommand",
            "Effect": "Allow",
            "Action": [
                "ec2messages:AcknowledgeMessage",
                "ec2messages:DeleteMessage",
                "ec2messages:FailMessage",
                "ec2messages:GetEndpoint",
                "ec2messages:GetMessages",
                "ec2messages:SendReply",
            ],
            "Resource": "*",
        },
    ],
}
# Port forwarding to an address the instance reaches (llama-server listens on the main node's
# private address, not its loopback, which AWS-StartPortForwardingSession would use):
# https://docs.aws.amazon.com/systems-manager/latest/userguide/session-manager-working-with-sessions-start.html#sessions-remote-port-forwarding
PORT_FORWARD_DOCUMENT = "AWS-StartPortForwardingSessionToRemoteHost"
# Egress the nodes need while booting: package mirrors (80), GitHub, the model host and the SSM
# endpoints (443). The VPC's DNS resolver and the metadata service are not filtered by groups.
# Workers close all egress beyond the VPC once serving (their host firewall, rpc-firewall.sh).
BOOT_EGRESS_PORTS = (80, 443)
# Remote administration ports the default network ACL refuses from anywhere (EC2.21).
ADMIN_PORTS = (22, 3389)


def is_s3_url(url: str) -> bool:
    if s3_object(url):
        return True
    host = urlparse(url).hostname or ""
    return host.endswith(".amazonaws.com") and (".s3." in f".{host}" or host.startswith("s3."))


# Who may take an EC2 node role: the EC2 service, for the node's instance profile.
EC2_ASSUME_ROLE = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Principal": {"Service": "ec2.amazonaws.com"},
            "Action": "sts:AssumeRole",
        }
    ],
}


def api_key_policy(parameter_arn: str) -> dict[str, object]:
    """The main node's one read of the stack's API key: GetParameter on its parameter alone (the
    AWS-managed key that encrypts a SecureString admits any reader SSM admits)."""
    return {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "ssm:GetParameter", "Resource": parameter_arn}],
    }


def files_policy_text(name: str, parameter_arn: str) -> str:
    return json.dumps(files_policy(parameter_arn.removesuffix(name)))


def files_policy(path_arn: str) -> dict[str, object]:
    """A node's one read of its role's boot files: the parameters under that path."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": "ssm:GetParametersByPath", "Resource": path_arn}
        ],
    }


def staged_model_policy(
    objects: list[tuple[str, str]], kms_key: str | None = None, region: str = ""
) -> dict[str, Any]:
    """GetObject on each part, and ListBucket only for the prefixes rclone lists to read them
    (``clouds.stores.listed_prefixes``); nothing else in any bucket. With the KMS key of an
    SSE-KMS bucket, Decrypt with that key for requests S3 makes in the region, and no other."""
    buckets = sorted({bucket for bucket, _ in objects})
    prefixes = {b: listed_prefixes([k for o, k in objects if o == b]) for b in buckets}
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": "s3:GetObject",
                "Resource": [f"arn:aws:s3:::{bucket}/{key}" for bucket, key in objects],
            },
            *(
                {
                    "Effect": "Allow",
                    "Action": "s3:ListBucket",
                    "Resource": f"arn:aws:s3:::{bucket}",
                    "Condition": {"StringEquals": {"s3:prefix": prefixes[bucket]}},
                }
                for bucket in buckets
            ),
            *(
                [
                    {
                        "Effect": "Allow",
                        "Action": "kms:Decrypt",
                        "Resource": kms_key,
                        "Condition": {
                            "StringEquals": {"kms:ViaService": f"s3.{region}.amazonaws.com"}
                        },
                    }
                ]
                if kms_key
                else []
            ),
        ],
    }


@dataclass(frozen=True)
class AwsNetwork:
    vpc: aws.ec2.Vpc
    private_subnet: aws.ec2.Subnet
    main_profile: aws.iam.InstanceProfile
    main_role: aws.iam.Role
    ami: pulumi.Input[str]
    # The balancer node's place and security group, with a balancer: made with the network,
    # since every main node's group admits it and it admits every main node.
    balancer: BalancerPlace[aws.ec2.SecurityGroup] | None = None
    # The main node's boot files beyond its user data and their grant, which its first boot
    # reads.
    boot_files: list[pulumi.Resource] = field(default_factory=list)
    # The private subnet's route out through the NAT gateway.
    routes_out: tuple[aws.ec2.RouteTableAssociation, ...] = ()


@dataclass(frozen=True)
class PrivateRoutes:
    """The private subnets' route table (out through the NAT gateway, which it waits for) and
    each subnet's association with it: a node reaches the internet once both exist."""

    table: aws.ec2.RouteTable
    associations: tuple[aws.ec2.RouteTableAssociation, ...]


@dataclass(frozen=True)
class AwsGroup:
    main: aws.ec2.SecurityGroup
    worker: aws.ec2.SecurityGroup
    placement: aws.ec2.PlacementGroup


def model_mirrors(config: ClusterConfig) -> list[tuple[str, int]]:
    """(address/32, port) of each private mirror the main node downloads the model from on a
    port of its own (the config check allows other ports for private addresses only); the
    egress to it opens that address and port alone."""
    found = set()
    for url in config.fetched_urls:
        parts = urlparse(url)
        if parts.port and parts.port not in BOOT_EGRESS_PORTS and parts.hostname:
            found.add((f"{parts.hostname}/32", parts.port))
    return sorted(found)


# How long a reading may take on the node (it asks each node of its group at once).
METRICS_READ_SECONDS = 120


def private_instance(
    name: str, tags: dict[str, str], *, root_gb: int, disk: Provisioned, user_data: Delivery
) -> dict[str, Any]:
    """What every instance of the stack has: IMDSv2 only, one hop (EC2.8); an encrypted gp3
    root; its user data, a change of which replaces it (cloud-init reads it on first boot
    only); its name as a tag."""
    return {
        "metadata_options": {
            "http_tokens": "required",
            "http_endpoint": "enabled",
            "http_put_response_hop_limit": 1,
        },
        "root_block_device": {
            "volume_type": "gp3",
            "volume_size": root_gb,
            "throughput": disk.throughput_mibps,
            "iops": disk.iops,
            "encrypted": True,
            "delete_on_termination": True,
            "tags": {**tags, "Name": name},
        },
        "ebs_optimized": True,
        "user_data": None if user_data.gzipped else user_data.value,
        "user_data_base64": user_data.value if user_data.gzipped else None,
        "user_data_replace_on_change": True,
        "tags": {**tags, "Name": name},
    }


def metrics_document_content() -> dict[str, Any]:
    """An SSM Command document that takes one reading of a group's metrics, the command the
    channel would otherwise send through AWS-RunShellScript: ``ssm:SendCommand`` on this
    document lets a watcher run it and nothing else.
    https://docs.aws.amazon.com/systems-manager/latest/userguide/documents-schemas-features.html"""
    reading = read_command(aws_facts.FACTS.command_output_chars)
    return {
        "schemaVersion": "2.2",
        "description": "llama-rpc-cluster: one reading of a serving group's node metrics (top)",
        "mainSteps": [
            {
                "action": "aws:runShellScript",
                "name": "readMetrics",
                "inputs": {
                    "runCommand": [shlex.join(reading)],
                    "timeoutSeconds": str(METRICS_READ_SECONDS),
                },
            }
        ],
    }


class AwsBackend(CloudBackend[AwsNetwork, AwsGroup]):
    facts = aws_facts.FACTS

    def network(
        self, name: str, config: ClusterConfig, parent: pulumi.Resource, *, zone: str | None
    ) -> AwsNetwork:
        opts = pulumi.ResourceOptions(parent=parent)
        tags = self.tags(config, "network")
        if zone is None:
            raise ValueError("AWS subnets need a zone (the preflight chooses one)")
        vpc, (public, private), private_routes = self.vpc_behind_nat(
            name,
            config,
            parent,
            public_range=config.public_subnet,
            private=[("private", config.private_subnet, zone)],
            zone=zone,
        )
        if any(is_s3_url(url) for url in config.fetched_urls):
            # Model downloads from S3 stay inside AWS and skip the NAT's per-GB charge.
            aws.ec2.VpcEndpoint(
                f"{name}-s3",
                vpc_id=vpc.id,
                service_name=f"com.amazonaws.{config.region}.s3",
                vpc_endpoint_type="Gateway",
                route_table_ids=[private_routes.table.id],
                tags=tags,
                opts=opts,
            )
        self.baseline(name=name, vpc=vpc, subnets=[public, private], tags=tags, opts=opts)
        if config.flow_logs:
            self.flow_logs(name, vpc, tags, opts)
        # The main node's role: its SSM agent (the tunnel, Run Command), and reads of its boot
        # files, and of the model and the API key where the stack has them. Workers get no role.
        role = aws.iam.Role(
            f"{name}-main-role",
            assume_role_policy=json.dumps(EC2_ASSUME_ROLE),
            tags=self.tags(config, "main"),
            opts=opts,
        )
        aws.iam.RolePolicy(
            f"{name}-main-agent", role=role.id, policy=json.dumps(AGENT_POLICY), opts=opts
        )
        staged = [obj for obj in map(s3_object, config.fetched_urls) if obj]
        if staged:
            # Read-only on the model's own objects: the node reads them with this role.
            aws.iam.RolePolicy(
                f"{name}-main-model-read",
                role=role.id,
                policy=json.dumps(
                    staged_model_policy(staged, config.model_store_kms_key, config.region)
                ),
                opts=opts,
            )
        profile = aws.iam.InstanceProfile(
            f"{name}-main-profile", role=role.name, tags=self.tags(config, "main"), opts=opts
        )
        boot_files = self._boot_files(name, config, role, opts)
        invoke = pulumi.InvokeOutputOptions(parent=parent)
        ami: pulumi.Input[str] = (
            # A pinned image by name, among Canonical's own arm64 AMIs only.
            aws.ec2.get_ami_output(
                owners=[aws_facts.CANONICAL_OWNER],
                filters=[
                    {"name": "name", "values": [config.image]},
                    {"name": "architecture", "values": ["arm64"]},
                ],
                most_recent=True,
                opts=invoke,
            ).id
            if config.image
            else aws.ssm.get_parameter_output(name=UBUNTU_AMI_PARAMETER, opts=invoke).value
        )
        balancer = None
        if config.balancer_boot is not None:
            group = aws.ec2.SecurityGroup(
                f"{name}-balancer-sg",
                vpc_id=vpc.id,
                description="internal balancer: the API from main nodes and apiAllowedCidrs",
                tags={**self.tags(config, "balancer"), "Name": f"{name}-balancer-sg"},
                opts=opts,
            )
            balancer = BalancerPlace(config.balancer_boot, group)
        return AwsNetwork(
            vpc, private, profile, role, ami, balancer, boot_files, private_routes.associations
        )

    def vpc_behind_nat(
        self,
        name: str,
        config: ClusterConfig,
        parent: pulumi.Resource,
        *,
        public_range: ipaddress.IPv4Network,
        private: Sequence[tuple[str, ipaddress.IPv4Network, pulumi.Input[str]]],
        zone: str,
    ) -> tuple[aws.ec2.Vpc, list[aws.ec2.Subnet], PrivateRoutes]:
        """The VPC, its public subnet (the NAT gateway's) in ``zone``, and each private subnet
        (kind, range, zone) routed out through the NAT; the subnets, public first, and the
        private subnets' routes."""
        opts = pulumi.ResourceOptions(parent=parent)
        tags = self.tags(config, "network")
        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=str(config.vpc_cidr),
            enable_dns_support=True,
            enable_dns_hostnames=True,
            tags={**tags, "Name": f"{name}-vpc"},
            opts=opts,
        )
        # Nodes live in the private subnet; the public one holds only the NAT gateway. The
        # subnets hold the stack's zone: without the setting, the one the stack was created in
        # is kept when another zone comes first later (a zone change replaces a subnet, and with
        # it every node). Replaced, a subnet goes first: its range can only be used once.
        subnet_opts = pulumi.ResourceOptions(
            parent=parent,
            delete_before_replace=True,
            ignore_changes=[] if config.zone else ["availabilityZone"],
        )
        public, *privates = (
            aws.ec2.Subnet(
                f"{name}-{kind}",
                vpc_id=vpc.id,
                cidr_block=str(cidr),
                availability_zone=subnet_zone,
                map_public_ip_on_launch=False,
                tags={**tags, "Name": f"{name}-{kind}"},
                opts=subnet_opts,
            )
            for kind, cidr, subnet_zone in (("public", public_range, zone), *private)
        )
        gateway = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=vpc.id, tags=tags, opts=opts)
        public_routes = aws.ec2.RouteTable(
            f"{name}-public-routes",
            vpc_id=vpc.id,
            routes=[{"cidr_block": "0.0.0.0/0", "gateway_id": gateway.id}],
            tags=tags,
            opts=opts,
        )
        aws.ec2.RouteTableAssociation(
            f"{name}-public-routes", subnet_id=public.id, route_table_id=public_routes.id, opts=opts
        )
        # A public NAT gateway fails ("has no Internet gateway attached") when it comes first,
        # and a destroy that detaches the gateway before the NAT's public address is gone retries
        # for minutes: both follow the gateway (the provider's own "Public NAT" example).
        after_gateway = pulumi.ResourceOptions(parent=parent, depends_on=[gateway])
        nat_ip = aws.ec2.Eip(f"{name}-nat", domain="vpc", tags=tags, opts=after_gateway)
        nat = aws.ec2.NatGateway(
            f"{name}-nat",
            allocation_id=nat_ip.id,
            subnet_id=public.id,
            tags=tags,
            opts=after_gateway,
        )
        private_routes = aws.ec2.RouteTable(
            f"{name}-private-routes",
            vpc_id=vpc.id,
            routes=[{"cidr_block": "0.0.0.0/0", "nat_gateway_id": nat.id}],
            tags=tags,
            opts=opts,
        )
        associations = [
            aws.ec2.RouteTableAssociation(
                f"{name}-{kind}-routes",
                subnet_id=subnet.id,
                route_table_id=private_routes.id,
                opts=opts,
            )
            for (kind, _, _), subnet in zip(private, privates, strict=True)
        ]
        return vpc, [public, *privates], PrivateRoutes(private_routes, tuple(associations))

    def baseline(
        self,
        *,
        name: str,
        vpc: aws.ec2.Vpc,
        subnets: list[aws.ec2.Subnet],
        tags: dict[str, Any],
        opts: pulumi.ResourceOptions,
    ) -> None:
        """Adopt the VPC's default security group with no rules (nothing uses it: EC2.2) and its
        default network ACL refusing remote administration from anywhere (EC2.21)."""
        aws.ec2.DefaultSecurityGroup(
            f"{name}-default-sg",
            vpc_id=vpc.id,
            tags={**tags, "Name": f"{name}-default-sg"},
            opts=opts,
        )
        # NACLs are stateless and match the destination port: denying 22 and 3389 inbound
        # leaves replies to the nodes' own connections (to ephemeral ports) alone.
        deny: list[aws.ec2.DefaultNetworkAclIngressArgsDict] = [
            {
                "rule_no": 10 + i,
                "action": "deny",
                "protocol": "tcp",
                "from_port": port,
                "to_port": port,
                "cidr_block": "0.0.0.0/0",
            }
            for i, port in enumerate(ADMIN_PORTS)
        ]
        allow: aws.ec2.DefaultNetworkAclIngressArgsDict = {
            "rule_no": 100,
            "action": "allow",
            "protocol": "-1",
            "from_port": 0,
            "to_port": 0,
            "cidr_block": "0.0.0.0/0",
        }
        aws.ec2.DefaultNetworkAcl(
            f"{name}-default-nacl",
            default_network_acl_id=vpc.default_network_acl_id,
            subnet_ids=[subnet.id for subnet in subnets],
            ingress=[*deny, allow],
            egress=[allow],
            tags={**tags, "Name": f"{name}-default-nacl"},
            opts=opts,
        )

    def _boot_files(
        self,
        name: str,
        config: ClusterConfig,
        role: aws.iam.Role,
        opts: pulumi.ResourceOptions,
    ) -> list[pulumi.Resource]:
        """The main node's boot files beyond its user data (``render.fetched_files``: its later
        scripts and the llama.cpp patch set) as String parameters under its path, which it reads
        at boot with its role (a worker has no role: its user data holds all its files). What
        the main nodes wait for."""
        main = config.boots()[0]
        path = config.files_path(main.role)
        parameters = []
        for file in fetched_files(main):
            relative = str(PurePosixPath(file["path"]).relative_to(BOOT_ROOT))
            value = f"{file['permissions']} {packed(file['content'])}"
            parameters.append(
                aws.ssm.Parameter(
                    f"{name}-main-{PurePosixPath(relative).name}",
                    name=f"{path}/{relative}",
                    type="String",
                    tier="Standard"
                    if len(value) <= aws_facts.SSM_STANDARD_VALUE_CHARS
                    else "Advanced",
                    value=value,
                    description="a boot file of llama-rpc-cluster's main nodes",
                    tags=self.tags(config, "main"),
                    opts=opts,
                )
            )
        if not parameters:
            return []
        # The path's ARN: the last parameter's, without its name under the path.
        policy = parameters[-1].arn.apply(functools.partial(files_policy_text, f"/{relative}"))
        grant = aws.iam.RolePolicy(
            f"{name}-main-boot-files", role=role.id, policy=policy, opts=opts
        )
        return [*parameters, grant]

    def flow_logs(
        self, name: str, vpc: aws.ec2.Vpc, tags: dict[str, Any], opts: pulumi.ResourceOptions
    ) -> None:
        """VPC flow logs to a private S3 bucket of the stack (S3 is the cheaper destination;
        the bucket goes with ``pulumi destroy``, logs and all)."""
        bucket = aws.s3.Bucket(f"{name}-flow-logs", force_destroy=True, tags=tags, opts=opts)
        aws.s3.BucketPublicAccessBlock(
            f"{name}-flow-logs",
            bucket=bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=opts,
        )
        aws.s3.BucketLifecycleConfiguration(
            f"{name}-flow-logs",
            bucket=bucket.id,
            rules=[
                {
                    "id": "expire",
                    "status": "Enabled",
                    "filter": {},
                    "expiration": {"days": FLOW_LOG_RETENTION_DAYS},
                }
            ],
            opts=opts,
        )
        # AWS adds the bucket policy that lets the log delivery service write:
        # https://docs.aws.amazon.com/vpc/latest/userguide/flow-logs-s3-permissions.html
        aws.ec2.FlowLog(
            f"{name}-flow-logs",
            vpc_id=vpc.id,
            traffic_type="ALL",
            log_destination_type="s3",
            log_destination=bucket.arn,
            max_aggregation_interval=600,
            tags=tags,
            opts=opts,
        )

    def group(
        self, spec: GroupSpec, config: ClusterConfig, network: AwsNetwork, parent: pulumi.Resource
    ) -> AwsGroup:
        opts = pulumi.ResourceOptions(parent=parent)
        name = spec.name
        groups = {}
        for role, text in (
            ("main", "llama-server main node: API only from apiAllowedCidrs"),
            ("worker", "ggml-rpc-server workers: RPC only from the main node"),
        ):
            groups[role] = aws.ec2.SecurityGroup(
                f"{name}-{role}-sg",
                vpc_id=network.vpc.id,
                description=text,
                tags={**self.tags(config, role), "Name": f"{name}-{role}-sg"},
                opts=opts,
            )
        main, worker = groups["main"], groups["worker"]

        def rule(
            kind: type[aws.vpc.SecurityGroupIngressRule] | type[aws.vpc.SecurityGroupEgressRule],
            rule_name: str,
            role: str,
            port: int,
            description: str,
            **peer: Any,
        ) -> None:
            kind(
                f"{name}-{rule_name}",
                security_group_id=groups[role].id,
                ip_protocol="tcp",
                from_port=port,
                to_port=port,
                description=description,
                tags=self.tags(config, role),
                opts=opts,
                **peer,
            )

        ingress, egress = aws.vpc.SecurityGroupIngressRule, aws.vpc.SecurityGroupEgressRule
        rule(
            ingress,
            "worker-rpc-from-main",
            "worker",
            config.rpc_port,
            "llama.cpp RPC from the main node",
            referenced_security_group_id=main.id,
        )
        rule(
            egress,
            "main-rpc-to-workers",
            "main",
            config.rpc_port,
            "llama.cpp RPC to the workers",
            referenced_security_group_id=worker.id,
        )
        rule(
            egress,
            "main-metrics-to-workers",
            "main",
            METRICS_PORT,
            "node metrics of its workers, read by llama-rpc-metrics (infra.observe.top)",
            referenced_security_group_id=worker.id,
        )
        for i, cidr in enumerate(config.api_allowed_cidrs):
            rule(
                ingress,
                f"main-api-{i}",
                "main",
                config.server_port,
                "llama-server API from apiAllowedCidrs",
                cidr_ipv4=cidr,
            )
        for role in groups:
            for port in BOOT_EGRESS_PORTS:
                rule(
                    egress,
                    f"{role}-egress-{port}",
                    role,
                    port,
                    "packages, llama.cpp source, model, SSM",
                    cidr_ipv4="0.0.0.0/0",
                )
        # Node metrics as narrow as RPC: a worker's from its own main node, which reads them;
        # the main node reads its own and admits no one.
        rule(
            ingress,
            "worker-metrics-from-main",
            "worker",
            METRICS_PORT,
            "node metrics, read by the main node of the group",
            referenced_security_group_id=main.id,
        )
        if network.balancer is not None:
            rule(
                ingress,
                "main-api-from-balancer",
                "main",
                config.server_port,
                "requests and health checks from the internal balancer",
                referenced_security_group_id=network.balancer.firewall.id,
            )
            if spec.index == 0:  # where connectCommand's tunnel ends
                rule(
                    egress,
                    "main-api-to-balancer",
                    "main",
                    config.server_port,
                    "the tunnel (connectCommand) to the internal balancer",
                    referenced_security_group_id=network.balancer.firewall.id,
                )
        for i, (address, port) in enumerate(model_mirrors(config)):
            rule(
                egress,
                f"main-egress-mirror-{i}",
                "main",
                port,
                "the model mirror",
                cidr_ipv4=address,
            )
        placement = aws.ec2.PlacementGroup(
            f"{name}-placement", strategy="cluster", tags=self.tags(config, "network"), opts=opts
        )
        return AwsGroup(main=main, worker=worker, placement=placement)

    def balancer(
        self,
        name: str,
        config: ClusterConfig,
        network: AwsNetwork,
        *,
        groups: Sequence[AwsGroup],
        mains: Sequence[Node],  # noqa: ARG002 (HAProxy takes the mains' fixed addresses)
        parent: pulumi.Resource,
    ) -> Node | None:
        """The balancer node at the balancer's fixed address: HAProxy (``infra.boot.balancer``)
        sends each request to a group with a free slot, and queues it for the first to free one
        when none has. Its security group admits the server port from the first group's main
        node (the tunnel) and apiAllowedCidrs, and lets it reach the main nodes and, for its
        package, the NAT gateway."""
        if network.balancer is None:
            return None
        boot, balancer_group = network.balancer.boot, network.balancer.firewall
        opts = pulumi.ResourceOptions(parent=parent)
        tags = self.tags(config, "balancer")
        api = config.server_port

        def rule(
            kind: type[aws.vpc.SecurityGroupIngressRule] | type[aws.vpc.SecurityGroupEgressRule],
            rule_name: str,
            port: int,
            description: str,
            **peer: Any,
        ) -> None:
            kind(
                f"{name}-balancer-{rule_name}",
                security_group_id=balancer_group.id,
                ip_protocol="tcp",
                from_port=port,
                to_port=port,
                description=description,
                tags=tags,
                opts=opts,
                **peer,
            )

        ingress, egress = aws.vpc.SecurityGroupIngressRule, aws.vpc.SecurityGroupEgressRule
        rule(
            ingress,
            "api-from-tunnel",
            api,
            "the tunnel through the main node of the first group (connectCommand)",
            referenced_security_group_id=groups[0].main.id,
        )
        for i, group in enumerate(groups):
            rule(
                egress,
                f"to-main-{i + 1}",
                api,
                "requests and health checks to the main nodes",
                referenced_security_group_id=group.main.id,
            )
        for i, cidr in enumerate(config.api_allowed_cidrs):
            rule(ingress, f"api-{i}", api, "llama-server API from apiAllowedCidrs", cidr_ipv4=cidr)
        for port in BOOT_EGRESS_PORTS:
            rule(
                egress,
                f"egress-{port}",
                port,
                "the HAProxy package, through the NAT gateway",
                cidr_ipv4="0.0.0.0/0",
            )
        user_data = deliver(render_balancer(boot), "aws")
        disk = self.facts.disk.provision(None)
        balancer_name = f"{name}-balancer"
        ignore = [] if config.image else ["ami"]
        instance = aws.ec2.Instance(
            balancer_name,
            ami=network.ami,
            instance_type=self.facts.balancer_instance_type,
            subnet_id=network.private_subnet.id,
            private_ip=boot.listen_ip,
            associate_public_ip_address=False,
            vpc_security_group_ids=[balancer_group.id],
            # Its spend guard powers it off: stopped, not terminated, as the groups' nodes.
            instance_initiated_shutdown_behavior="stop",
            # New groups or timeouts mean a new balancer node: cloud-init reads user data once.
            **private_instance(
                balancer_name, tags, root_gb=sizing.WORKER_DISK_GB, disk=disk, user_data=user_data
            ),
            # It keeps its fixed address: the old node goes first. Its package comes through the
            # NAT gateway, so it waits for the private subnets' route out.
            opts=node_options(parent, ignore_changes=ignore, depends_on=list(network.routes_out)),
        )
        return Node(instance_id=instance.id, private_ip=instance.private_ip)

    def node(
        self,
        spec: NodeSpec,
        config: ClusterConfig,
        network: AwsNetwork,
        group: AwsGroup,
        parent: pulumi.Resource,
    ) -> Node:
        tags = self.tags(config, spec.role)
        security_group = group.main if spec.role == "main" else group.worker
        user_data = spec.user_data
        main = spec.role == "main"
        # A main node's model has a volume of its own (model_volume): its root, like a worker's,
        # holds the system and the build, at gp3's baseline.
        model_disk = self.facts.model_disk if main else None
        root_gb = sizing.WORKER_DISK_GB if model_disk else spec.disk_gb
        disk = self.facts.disk.provision(None)
        # Without a pinned image every up resolves SSM's "current" AMI; a new Ubuntu release
        # must not replace running nodes, so each keeps the image it was created with.
        # Setting `image` makes the change deliberate: every node is replaced with it.
        ignore = [] if config.image else ["ami"]
        instance = aws.ec2.Instance(
            spec.name,
            ami=network.ami,
            instance_type=spec.instance_type,
            subnet_id=network.private_subnet.id,
            private_ip=spec.private_ip,
            associate_public_ip_address=False,
            vpc_security_group_ids=[security_group.id],
            iam_instance_profile=network.main_profile.name if main else None,
            placement_group=group.placement.name,
            # A power-off from inside (a spend guard's) stops the instance: its compute charge
            # ends, its disk stays. "terminate" would delete the node and its model.
            instance_initiated_shutdown_behavior="stop",
            # New boot data means a new node: cloud-init reads user data on first boot only.
            **private_instance(spec.name, tags, root_gb=root_gb, disk=disk, user_data=user_data),
            opts=node_options(
                parent, ignore_changes=ignore, depends_on=network.boot_files if main else []
            ),
        )
        if model_disk is not None:
            self.model_volume(
                spec,
                network=network,
                instance=instance,
                tags=tags,
                parent=parent,
                model_disk=model_disk,
            )
        return Node(instance_id=instance.id, private_ip=instance.private_ip)

    def model_volume(
        self,
        spec: NodeSpec,
        *,
        network: AwsNetwork,
        instance: aws.ec2.Instance,
        tags: dict[str, str],
        parent: pulumi.Resource,
        model_disk: ModelDisk,
    ) -> None:
        """The main node's model volume: made by CreateVolume (gp3, up to 2,000 MiB/s), and
        attached once the node runs; the node waits for it and
        mounts it (model-disk.sh). It outlives a replaced main node, which keeps its verified
        model, but not a new size; ``pulumi destroy`` deletes it."""
        disk = self.facts.disk.provision(spec.disk_throughput_mibps)
        volume = aws.ebs.Volume(
            f"{spec.name}-model",
            availability_zone=network.private_subnet.availability_zone,
            type="gp3",
            size=spec.disk_gb,
            throughput=disk.throughput_mibps,
            iops=disk.iops,
            encrypted=True,
            tags={**tags, "Name": f"{spec.name}-model"},
            # EBS refuses to shrink a volume, and would fail `up` halfway: a new size (which comes
            # with a new model, mostly) is a new volume.
            opts=pulumi.ResourceOptions(parent=parent, replace_on_changes=["size"]),
        )
        aws.ec2.VolumeAttachment(
            f"{spec.name}-model-attachment",
            device_name=model_disk.device_name,
            volume_id=volume.id,
            instance_id=instance.id,
            # Detached from a stopped node only: the model's file system is mounted while it runs.
            stop_instance_before_detaching=True,
            opts=pulumi.ResourceOptions(parent=parent, delete_before_replace=True),
        )

    def keep_api_key(
        self,
        name: str,
        config: ClusterConfig,
        network: AwsNetwork,
        key: pulumi.Output[str],
        parent: pulumi.Resource,
    ) -> None:
        """An SSM SecureString (encrypted with the account's AWS-managed key), and on the main
        role a GetParameter on it alone: the node reads it at boot (llama-rpc-secret)."""
        opts = pulumi.ResourceOptions(parent=parent)
        parameter = aws.ssm.Parameter(
            f"{name}-api-key",
            name=config.api_key_parameter,
            type="SecureString",
            value=key,
            description="the API key of llama-rpc-cluster stack: main nodes read it at boot",
            tags=self.tags(config, "main"),
            opts=opts,
        )
        aws.iam.RolePolicy(
            f"{name}-main-api-key",
            role=network.main_role.id,
            policy=parameter.arn.apply(lambda arn: json.dumps(api_key_policy(arn))),
            opts=opts,
        )

    def location(self, network: AwsNetwork) -> dict[str, pulumi.Input[str] | None]:
        return {
            outputs.ZONE: network.private_subnet.availability_zone,
            outputs.RESOURCE_GROUP: None,
        }

    def metrics_document(
        self, name: str, config: ClusterConfig, parent: pulumi.Resource
    ) -> pulumi.Output[str]:
        document = aws.ssm.Document(
            f"{name}-read-metrics",
            document_type="Command",
            document_format="JSON",
            content=json.dumps(metrics_document_content()),
            tags=self.tags(config, "main"),
            opts=pulumi.ResourceOptions(parent=parent),
        )
        return document.name

    def connect_command(
        self,
        config: ClusterConfig,
        network: AwsNetwork,  # noqa: ARG002 (the Backend interface)
        main: Node,
        balancer: Node | None,  # noqa: ARG002 (it has no role, so no Session Manager)
    ) -> pulumi.Output[str]:
        port = str(config.server_port)
        # Through the first group's main node, to the balancer node when there is one.
        host = config.entry_ip
        parameters = json.dumps({"host": [host], "portNumber": [port], "localPortNumber": [port]})
        return pulumi.Output.concat(
            f"aws ssm start-session --region {config.region} --target ",
            main.instance_id,
            f" --document-name {PORT_FORWARD_DOCUMENT} --parameters '{parameters}'",
        )
