"""AWS Graviton: a VPC with a private subnet behind a NAT gateway, security groups that open the
RPC port from the main node's group only, a cluster placement group, and SSM instead of SSH.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import pulumi
import pulumi_aws as aws

from infra.clouds.base import CloudBackend, Node, NodeSpec
from infra.config import ClusterConfig

UBUNTU_AMI_PARAMETER = (
    "/aws/service/canonical/ubuntu/server/24.04/stable/current/arm64/hvm/ebs-gp3/ami-id"
)
SSM_POLICY_ARN = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
# Graviton families carry a "g" after the generation digit: c8g, r7gd, c7gn, t4g, x2gd, im4gn.
_ARM_TYPE = re.compile(r"[a-z]+\d+[a-z]*g[a-z]*\.[a-z0-9]+")
# Egress the nodes need while booting: package mirrors (80), GitHub, the model host and the SSM
# endpoints (443). The VPC's DNS resolver and the metadata service are not filtered by groups.
BOOT_EGRESS_PORTS = (80, 443)


def choose_zone(locations: Sequence[str], offered: Sequence[str], needed: Sequence[str]) -> str:
    """The first zone (by name) that offers every needed instance type."""
    zones: dict[str, set[str]] = {}
    for zone, instance_type in zip(locations, offered, strict=True):
        zones.setdefault(zone, set()).add(instance_type)
    for zone in sorted(zones):
        if set(needed) <= zones[zone]:
            return zone
    raise ValueError(
        f"no availability zone in this region offers {', '.join(sorted(set(needed)))}; "
        "choose another instanceType or region"
    )


def is_s3_url(url: str) -> bool:
    host = urlparse(url).hostname or ""
    return host.endswith(".amazonaws.com") and (".s3." in f".{host}" or host.startswith("s3."))


@dataclass(frozen=True)
class AwsNetwork:
    vpc: aws.ec2.Vpc
    private_subnet: aws.ec2.Subnet
    placement_group: aws.ec2.PlacementGroup
    instance_profile: aws.iam.InstanceProfile
    ami: pulumi.Output[str]


@dataclass(frozen=True)
class AwsFirewall:
    main: aws.ec2.SecurityGroup
    worker: aws.ec2.SecurityGroup


class AwsBackend(CloudBackend[AwsNetwork, AwsFirewall]):
    name = "aws"
    arm_examples = "Graviton: c8g, m8g, r8g, c7g, r7g, c6g, r6g"

    def is_arm(self, instance_type: str) -> bool:
        return _ARM_TYPE.fullmatch(instance_type) is not None

    def network(self, name: str, config: ClusterConfig, parent: pulumi.Resource) -> AwsNetwork:
        opts = pulumi.ResourceOptions(parent=parent)
        tags = self.tags(config, "network")
        needed = sorted({config.instance_type.name, config.main_instance_type.name})
        offerings = aws.ec2.get_instance_type_offerings_output(
            location_type="availability-zone",
            filters=[{"name": "instance-type", "values": needed}],
            opts=pulumi.InvokeOutputOptions(parent=parent),
        )
        zone = pulumi.Output.all(offerings.locations, offerings.instance_types).apply(
            lambda args: choose_zone(args[0], args[1], needed)
        )
        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=str(config.vpc_cidr),
            enable_dns_support=True,
            enable_dns_hostnames=True,
            tags={**tags, "Name": f"{name}-vpc"},
            opts=opts,
        )
        # Nodes live in the private subnet; the public one holds only the NAT gateway.
        public, private = (
            aws.ec2.Subnet(
                f"{name}-{kind}",
                vpc_id=vpc.id,
                cidr_block=str(cidr),
                availability_zone=zone,
                map_public_ip_on_launch=False,
                tags={**tags, "Name": f"{name}-{kind}"},
                opts=opts,
            )
            for kind, cidr in (("public", config.public_subnet), ("private", config.private_subnet))
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
        nat_ip = aws.ec2.Eip(f"{name}-nat", domain="vpc", tags=tags, opts=opts)
        nat = aws.ec2.NatGateway(
            f"{name}-nat", allocation_id=nat_ip.id, subnet_id=public.id, tags=tags, opts=opts
        )
        private_routes = aws.ec2.RouteTable(
            f"{name}-private-routes",
            vpc_id=vpc.id,
            routes=[{"cidr_block": "0.0.0.0/0", "nat_gateway_id": nat.id}],
            tags=tags,
            opts=opts,
        )
        aws.ec2.RouteTableAssociation(
            f"{name}-private-routes",
            subnet_id=private.id,
            route_table_id=private_routes.id,
            opts=opts,
        )
        if any(is_s3_url(url) for url in config.model.urls):
            # Model downloads from S3 stay inside AWS and skip the NAT's per-GB charge.
            aws.ec2.VpcEndpoint(
                f"{name}-s3",
                vpc_id=vpc.id,
                service_name=f"com.amazonaws.{config.region}.s3",
                vpc_endpoint_type="Gateway",
                route_table_ids=[private_routes.id],
                tags=tags,
                opts=opts,
            )
        placement = aws.ec2.PlacementGroup(
            f"{name}-placement", strategy="cluster", tags=tags, opts=opts
        )
        role = aws.iam.Role(
            f"{name}-node",
            assume_role_policy=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Principal": {"Service": "ec2.amazonaws.com"},
                            "Action": "sts:AssumeRole",
                        }
                    ],
                }
            ),
            tags=tags,
            opts=opts,
        )
        aws.iam.RolePolicyAttachment(
            f"{name}-node-ssm", role=role.name, policy_arn=SSM_POLICY_ARN, opts=opts
        )
        profile = aws.iam.InstanceProfile(f"{name}-node", role=role.name, tags=tags, opts=opts)
        ami = aws.ssm.get_parameter_output(
            name=UBUNTU_AMI_PARAMETER, opts=pulumi.InvokeOutputOptions(parent=parent)
        ).value
        return AwsNetwork(vpc, private, placement, profile, ami)

    def firewall(
        self, name: str, config: ClusterConfig, network: AwsNetwork, parent: pulumi.Resource
    ) -> AwsFirewall:
        opts = pulumi.ResourceOptions(parent=parent)
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
        for i, cidr in enumerate(config.api_allowed_cidrs):
            source = {"cidr_ipv6": cidr} if ":" in cidr else {"cidr_ipv4": cidr}
            rule(
                ingress,
                f"main-api-{i}",
                "main",
                config.server_port,
                "llama-server API from apiAllowedCidrs",
                **source,
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
        return AwsFirewall(main=main, worker=worker)

    def node(
        self,
        spec: NodeSpec,
        config: ClusterConfig,
        network: AwsNetwork,
        firewall: AwsFirewall,
        parent: pulumi.Resource,
    ) -> Node:
        tags = self.tags(config, spec.role)
        group = firewall.main if spec.role == "main" else firewall.worker
        throughput = spec.disk_throughput_mibps or 125
        # gp3 allows 0.25 MiB/s per provisioned IOPS: more throughput needs more IOPS.
        iops = max(3000, math.ceil(throughput * 4))
        user_data = spec.user_data
        instance = aws.ec2.Instance(
            spec.name,
            ami=network.ami,
            instance_type=spec.instance_type,
            subnet_id=network.private_subnet.id,
            private_ip=spec.private_ip,
            associate_public_ip_address=False,
            vpc_security_group_ids=[group.id],
            iam_instance_profile=network.instance_profile.name,
            placement_group=network.placement_group.name,
            metadata_options={
                "http_tokens": "required",
                "http_endpoint": "enabled",
                "http_put_response_hop_limit": 1,
            },
            root_block_device={
                "volume_type": "gp3",
                "volume_size": spec.disk_gb,
                "throughput": throughput,
                "iops": iops,
                "encrypted": True,
                "delete_on_termination": True,
                "tags": {**tags, "Name": spec.name},
            },
            ebs_optimized=True,
            user_data=None if user_data.gzipped else user_data.value,
            user_data_base64=user_data.value if user_data.gzipped else None,
            user_data_replace_on_change=True,
            tags={**tags, "Name": spec.name},
            opts=pulumi.ResourceOptions(parent=parent),
        )
        return Node(instance_id=instance.id, private_ip=instance.private_ip)

    def connect_command(
        self, config: ClusterConfig, network: AwsNetwork, main: Node
    ) -> pulumi.Output[str]:
        port = config.server_port
        parameters = json.dumps({"portNumber": [str(port)], "localPortNumber": [str(port)]})
        return pulumi.Output.concat(
            f"aws ssm start-session --region {config.region} --target ",
            main.instance_id,
            f" --document-name AWS-StartPortForwardingSession --parameters '{parameters}'",
        )
