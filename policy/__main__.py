"""llama-rpc-cluster-security: the Pulumi policy pack every llama-rpc-cluster stack must pass.

    pulumi preview --policy-pack policy/

The checks themselves live in ``rules.py`` (plain functions, tested with the project); this
file only adapts Pulumi's policy arguments to them. Pulumi runs the pack from this directory,
in its own environment (``requirements.txt``), so ``rules`` imports as a top-level module.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pulumi
import rules
from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    PolicyPack,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    Severity,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import UnknownValueError

PACK_NAME = "llama-rpc-cluster-security"


def plain(value: Any) -> Any:
    """Pulumi's property proxies as plain dicts and lists, with ``rules.UNKNOWN`` where a
    preview does not know a value yet (the proxy raises on reading one)."""
    if isinstance(value, Mapping):
        return {key: _read(value, key) for key in value}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [_read(value, i) for i in range(len(value))]
    return value


def _read(container: Any, key: Any) -> Any:
    try:
        return plain(container[key])
    except UnknownValueError:
        return rules.UNKNOWN


def expected_tags() -> dict[str, str | None]:
    """The project and stack being checked, as the language host tells a policy pack."""
    return {"project": os.environ.get("PULUMI_PROJECT"), "stack": os.environ.get("PULUMI_STACK")}


def resource_policy(
    name: str,
    description: str,
    check: Callable[..., list[str]],
    remediation: str,
    severity: Severity,
) -> ResourceValidationPolicy:
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        extra = {"expected": expected_tags()} if check is rules.node_tags else {}
        props = rules.translated(args.resource_type, plain(args.props))
        for message in check(args.resource_type, props, args.name, **extra):
            report_violation(message, None)

    return ResourceValidationPolicy(
        name=name,
        description=description,
        validate=validate,
        severity=severity,
        remediation_steps=remediation,
    )


def stack_resource(resource: Any) -> rules.Resource:
    props = plain(resource.props)
    identity = props.get("id")
    return rules.as_judged(
        rules.Resource(
            type=resource.resource_type,
            name=resource.name,
            props=props,
            urn=resource.urn,
            id=identity if isinstance(identity, str) and identity else None,
            property_dependencies={
                key: [dependency.urn for dependency in dependencies]
                for key, dependencies in resource.property_dependencies.items()
            },
        )
    )


def guarded_port(args: StackValidationArgs) -> int:
    """The RPC port: the policy's ``rpcPort``, else the stack's, else the program's default."""
    port: int = rules.rpc_port(
        args.get_config().get(rules.RPC_PORT_KEY),
        pulumi.Config(rules.PROJECT).get(rules.RPC_PORT_KEY),
    )
    return port


def rpc_port_schema() -> PolicyConfigSchema:
    return PolicyConfigSchema(
        properties={
            rules.RPC_PORT_KEY: {
                "type": "integer",
                "minimum": 1,
                "maximum": 65535,
                "description": "The RPC port to guard; without it, the stack's "
                f"{rules.PROJECT}:{rules.RPC_PORT_KEY}, else {rules.DEFAULT_RPC_PORT}.",
            }
        }
    )


def validate_rpc(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    resources = [stack_resource(r) for r in args.resources]
    for violation in rules.rpc_only_from_main(resources, guarded_port(args)):
        report_violation(violation.message, violation.urn or None)


def validate_k8s_rpc(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    resources = [stack_resource(r) for r in args.resources]
    for violation in rules.k8s_rpc_only_from_leader(resources, guarded_port(args)):
        report_violation(violation.message, violation.urn or None)


def validate_identity_grants(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    resources = [stack_resource(r) for r in args.resources]
    for violation in rules.identity_grants(resources):
        report_violation(violation.message, violation.urn or None)


def validate_eks_node_roles(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    resources = [stack_resource(r) for r in args.resources]
    for violation in rules.eks_nodes_without_eni_rights(resources):
        report_violation(violation.message, violation.urn or None)


def validate_metrics(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    resources = [stack_resource(r) for r in args.resources]
    for violation in rules.metrics_only_from_main(resources):
        report_violation(violation.message, violation.urn or None)


POLICIES = [
    resource_policy(
        "no-internet-ingress",
        "No firewall rule admits the internet: 0.0.0.0/0, ::/0, '*', 'Internet', or public "
        f"ranges wider than /{rules.WIDEST_PUBLIC_IPV4_SOURCE} (IPv4) or "
        f"/{rules.WIDEST_PUBLIC_IPV6_SOURCE} (IPv6) in one rule.",
        rules.no_internet_ingress,
        "Remove the wide sources; reach the main node through the private tunnel "
        "(connectCommand), or list your own network in apiAllowedCidrs.",
        Severity.CRITICAL,
    ),
    StackValidationPolicy(
        name="rpc-only-from-main",
        description="The llama.cpp RPC port (unauthenticated) admits only the main node's "
        "security group, network tag or application security group, only the main node "
        "carries it, and on Azure the NSG denies every other inbound source.",
        validate=validate_rpc,
        config_schema=rpc_port_schema(),
        severity=Severity.CRITICAL,
        remediation_steps="Make the main node's group, tag or application security group the "
        "rule's only source, and keep it off every other node.",
    ),
    StackValidationPolicy(
        name="metrics-only-from-main",
        description=f"The node metrics port ({rules.METRICS_PORT}, prometheus-node-exporter) is "
        "as narrow as RPC: it admits only the main node's security group, network tag or "
        "application security group.",
        validate=validate_metrics,
        severity=Severity.HIGH,
        remediation_steps="Make the main node's group, tag or application security group the "
        "rule's only source: the main node reads its workers' metrics, and its own locally.",
    ),
    StackValidationPolicy(
        name="identity-grants-deallocate-only",
        description="On Azure, a worker's or the balancer node's identity (a spend guard's) "
        "holds one grant: the "
        "stack's custom role of one action, deallocate, at its own VM's scope; and every custom "
        "role the stack makes holds that action alone, assignable in a resource group.",
        validate=validate_identity_grants,
        severity=Severity.HIGH,
        remediation_steps="Grant a worker's or the balancer node's identity the stack's "
        "deallocate role at its own "
        "VM's scope and nothing else; keep the custom role to that one action.",
    ),
    resource_policy(
        "identity-on-main-only",
        "No node but the main node has a cloud identity (instance profile, service account, "
        "managed identity).",
        rules.identity_on_main_only,
        "Remove the identity from the worker (or the scale set).",
        Severity.HIGH,
    ),
    resource_policy(
        "secret-store-private",
        "The API key's store keeps it secret: an SSM parameter of the key is a SecureString, a "
        "Key Vault admits named addresses alone and grants per secret (role-based access), a "
        "Secret Manager secret is granted to no one at large.",
        rules.secret_store_private,
        "Make the key's parameter a SecureString; deny the vault's network by default and "
        "enable RBAC; grant the secret to the main node's account alone.",
        Severity.HIGH,
    ),
    resource_policy(
        "narrow-grants",
        "The roles and grants the stack makes are narrow: no AWS managed policy that "
        "administers an account or a whole service, no wildcard actions, no SSM Command "
        "document that takes parameters, no GCP basic or admin role, nothing granted to "
        "everyone, no Azure role that administers its scope.",
        rules.narrow_grants,
        "Grant the named actions on the stack's own resources, through the stack's own "
        "inline policies, predefined roles or custom role.",
        Severity.HIGH,
    ),
    StackValidationPolicy(
        name="eks-nodes-hold-no-eni-rights",
        description="On EKS, a node group's role holds no right to create or rewire network "
        "interfaces (AmazonEKS_CNI_Policy, or its actions inline), and the VPC CNI takes a role "
        "of its own (EKS Pod Identity or IRSA) instead of the nodes'.",
        validate=validate_eks_node_roles,
        severity=Severity.HIGH,
        remediation_steps="Attach AmazonEKS_CNI_Policy to a role that trusts "
        "pods.eks.amazonaws.com, give it to the vpc-cni add-on's aws-node service account "
        "(podIdentityAssociations), and keep it off the node role.",
    ),
    resource_policy(
        "no-public-node-addresses",
        "No node has a public IP address: egress goes through NAT, access through a tunnel.",
        rules.no_public_addresses,
        "Remove the public address (associate_public_ip_address=False on AWS, no access_configs "
        "on GCP, no public_ip_address on an Azure NIC).",
        Severity.HIGH,
    ),
    resource_policy(
        "aws-imdsv2-required",
        "AWS instances require IMDSv2 session tokens for instance metadata.",
        rules.imdsv2_required,
        'Set metadata_options={"http_tokens": "required"}.',
        Severity.HIGH,
    ),
    resource_policy(
        "encrypted-node-disks",
        "Node disks are encrypted at rest: encrypted EBS volumes on AWS, managed disks (and "
        "encryption at host when set) on Azure; GCP always encrypts.",
        rules.encrypted_disks,
        "Set encrypted=True on EBS volumes; use managed disks on Azure.",
        Severity.HIGH,
    ),
    resource_policy(
        "nodes-carry-stack-tags",
        "Every node carries the 'project' and 'stack' tags (labels on GCP) of its stack.",
        rules.node_tags,
        "Keep the program's tags on the node: project, stack and role.",
        Severity.LOW,
    ),
    resource_policy(
        "internal-load-balancers",
        "The load balancer in front of the serving groups is internal: no public frontend.",
        rules.internal_balancers,
        "Set internal=True on AWS, load_balancing_scheme INTERNAL on GCP, and a private "
        "frontend address on Azure.",
        Severity.CRITICAL,
    ),
    resource_policy(
        "private-kubernetes-api",
        "An EKS cluster's Kubernetes API endpoint is private (endpointPrivateAccess), and a "
        "public endpoint (EKS's default) admits named ranges only, none wider than "
        f"/{rules.WIDEST_PUBLIC_IPV4_SOURCE} (IPv4) or /{rules.WIDEST_PUBLIC_IPV6_SOURCE} (IPv6) "
        "of public space.",
        rules.private_kubernetes_api,
        "Set endpoint_private_access=True, and endpoint_public_access=False or "
        "public_access_cidrs to your own network's ranges (kubernetesApiCidrs).",
        Severity.CRITICAL,
    ),
    resource_policy(
        "eks-nodes-from-launch-template",
        "An EKS managed node group makes its nodes from a launch template of the stack's (which "
        "the IMDSv2 and disk policies check) and opens no SSH (remoteAccess).",
        rules.eks_nodes_from_launch_template,
        "Give the node group launch_template={id, version} of the stack's template, and remove "
        "remote_access.",
        Severity.HIGH,
    ),
    resource_policy(
        "cluster-internal-services",
        "A Kubernetes Service is ClusterIP (the default) with no externalIPs: nothing outside "
        "the cluster reaches the pods' RPC port or API through it.",
        rules.cluster_internal_services,
        "Set the Service's type to ClusterIP (or leave it unset) and remove externalIPs; reach "
        "the API through kubectl port-forward.",
        Severity.CRITICAL,
    ),
    StackValidationPolicy(
        name="k8s-rpc-only-from-leader",
        description="On Kubernetes, a LeaderWorkerSet's workers (size > 1) are isolated by a "
        "NetworkPolicy of their namespace, and every policy that selects them admits the RPC "
        "port only from a podSelector of the set's leaders (worker index 0).",
        validate=validate_k8s_rpc,
        config_schema=rpc_port_schema(),
        severity=Severity.CRITICAL,
        remediation_steps="Give each group's workers a NetworkPolicy (policyTypes Ingress) whose "
        "only source for the RPC port is a podSelector of the set's leaders: no ipBlock, no "
        "namespaceSelector, no rule without `from`.",
    ),
]

PolicyPack(
    name=PACK_NAME,
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=POLICIES,
)
