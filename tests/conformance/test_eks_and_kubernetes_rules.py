"""The EKS stack's AWS and Kubernetes input rules (``infra.conformance.eks``,
``infra.conformance.kubernetes``) on a stack built by hand as ``infra.stack.kube.eks``
registers it: it keeps every rule, and each broken input is caught by the rule
family it belongs to, with a message naming the input. No program run, no network.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
from typing import Any

import pytest

from infra.conformance import (
    RESOURCE_RULES,
    aws,
    azure,
    eks,
    gcp,
    kubernetes,
    random_provider,
    rules,
)
from infra.conformance.eks import ADDON, ATTACHMENT, CLUSTER, LAUNCH_TEMPLATE, NODE_GROUP
from infra.conformance.kubernetes import (
    CONFIG_FILE,
    CONFIG_MAP,
    DEPLOYMENT_PATCH,
    DEPLOYMENT_TYPE,
    LEADER_WORKER_SET,
    NAMESPACE,
    NETWORK_POLICY_TYPE,
    PROVIDER,
    SECRET,
    SERVICE_TYPE,
)
from tests.stack.test_conformance import only

N = "llama-rpc-cluster"
VPC = "aws:ec2/vpc:Vpc"
SUBNET = "aws:ec2/subnet:Subnet"
ROLE = "aws:iam/role:Role"
ACCOUNT = "123456789012"
TAGS = {"project": N, "stack": "eks", "role": "main"}
LABELS = {
    "app.kubernetes.io/name": N,
    "app.kubernetes.io/instance": N,
    "llama-rpc-cluster/cloud": "aws",
}
NS = "llama"
LWS_URL = "https://github.com/kubernetes-sigs/lws/releases/download/v0.10.0/manifests.yaml"
# The verified copy the program applies (infra.stack.kube.controller).
LWS_COPY = f"/home/me/.cache/llama-rpc-cluster/lws/v0.10.0-{'a' * 16}-{'5' * 16}.yaml"
KUBECONFIG = json.dumps(
    {
        "apiVersion": "v1",
        "clusters": [{"name": "eks", "cluster": {"server": "https://example.eks.amazonaws.com"}}],
        "contexts": [{"name": "eks", "context": {"cluster": "eks", "user": "aws"}}],
        "current-context": "eks",
        "users": [{"name": "aws", "user": {"exec": {"command": "aws"}}}],
    }
)
DROP = object()  # removes an input
POD_IDENTITY_TRUST = json.dumps(
    {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "pods.eks.amazonaws.com"},
                "Action": ["sts:AssumeRole", "sts:TagSession"],
            }
        ],
    }
)


def role_name(role: str) -> str:
    return f"{N}-{role}-1a2b3c4"  # as Pulumi names it


def role_arn(role: str) -> str:
    return f"arn:aws:iam::{ACCOUNT}:role/{role_name(role)}"


def policy(name: str) -> str:
    return f"arn:aws:iam::aws:policy/{name}"


def meta(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": NS, "labels": dict(LABELS), **extra}


def build() -> rules.Stack:
    """The EKS stack as the program registers it, with the ids and outputs its inputs hold."""
    found: list[rules.Registered] = []
    owners: dict[str, str] = {}

    def add(
        type_: str, name: str, inputs: dict[str, Any], *waits: str, ids: tuple[str, ...] = ()
    ) -> str:
        key = rules.key_of(type_, name)
        found.append(rules.Registered(type_, name, inputs, frozenset(waits)))
        owners.update(dict.fromkeys(ids, key))
        return key

    vpc = add(
        VPC,
        f"{N}-vpc",
        {
            "cidrBlock": "10.0.0.0/16",
            "enableDnsHostnames": True,
            "enableDnsSupport": True,
            "tags": TAGS,
        },
        ids=("vpc-1",),
    )
    subnets = [
        add(
            SUBNET,
            f"{N}-{name}",
            {"vpcId": "vpc-1", "cidrBlock": cidr, "availabilityZone": zone, "tags": TAGS},
            vpc,
            ids=(subnet_id,),
        )
        for name, subnet_id, zone, cidr in (
            ("private", "subnet-a", "us-east-1a", "10.0.1.0/24"),
            ("private-b", "subnet-b", "us-east-1b", "10.0.2.0/24"),
        )
    ]
    roles = {
        role: add(
            ROLE,
            f"{N}-{role}",
            {"assumeRolePolicy": trust, "tags": TAGS},
            ids=(role_name(role), role_arn(role)),
        )
        for role, trust in (
            ("cluster-role", "{}"),
            ("node-role", "{}"),
            ("cni-role", POD_IDENTITY_TRUST),
        )
    }
    attachments = {
        name: add(
            ATTACHMENT,
            f"{N}-{name}",
            {"role": role_name(role), "policyArn": policy(arn)},
            roles[role],
        )
        for name, role, arn in (
            ("cluster-policy", "cluster-role", "AmazonEKSClusterPolicy"),
            ("node-worker-policy", "node-role", "AmazonEKSWorkerNodePolicy"),
            ("node-registry-policy", "node-role", "AmazonEC2ContainerRegistryReadOnly"),
            ("cni-policy", "cni-role", "AmazonEKS_CNI_Policy"),
        )
    }
    cluster = add(
        CLUSTER,
        f"{N}-eks",
        {
            "roleArn": role_arn("cluster-role"),
            "version": "1.35",
            "vpcConfig": {
                "subnetIds": ["subnet-a", "subnet-b"],
                "endpointPrivateAccess": True,
                "endpointPublicAccess": True,
                "publicAccessCidrs": ["203.0.113.0/24"],
            },
            "accessConfig": {
                "authenticationMode": "API",
                "bootstrapClusterCreatorAdminPermissions": True,
            },
            "upgradePolicy": {"supportType": "STANDARD"},
            "tags": TAGS,
        },
        roles["cluster-role"],
        attachments["cluster-policy"],
        *subnets,
        ids=(f"{N}-eks-1a2b3c4",),
    )
    agent = add(
        ADDON,
        f"{N}-pod-identity-agent",
        {
            "clusterName": f"{N}-eks-1a2b3c4",
            "addonName": "eks-pod-identity-agent",
            "resolveConflictsOnCreate": "OVERWRITE",
            "resolveConflictsOnUpdate": "OVERWRITE",
            "tags": TAGS,
        },
        cluster,
    )
    cni = add(
        ADDON,
        f"{N}-vpc-cni",
        {
            "clusterName": f"{N}-eks-1a2b3c4",
            "addonName": "vpc-cni",
            "configurationValues": json.dumps(
                {"enableNetworkPolicy": "true", "env": {"NETWORK_POLICY_ENFORCING_MODE": "strict"}}
            ),
            "podIdentityAssociations": [
                {"roleArn": role_arn("cni-role"), "serviceAccount": "aws-node"}
            ],
            "resolveConflictsOnCreate": "OVERWRITE",
            "resolveConflictsOnUpdate": "OVERWRITE",
            "tags": TAGS,
        },
        cluster,
        agent,
        roles["cni-role"],
        attachments["cni-policy"],
    )
    template = add(
        LAUNCH_TEMPLATE,
        f"{N}-nodes-template",
        {
            "description": "The llama-rpc-cluster nodes",
            "metadataOptions": {
                "httpEndpoint": "enabled",
                "httpTokens": "required",
                "httpPutResponseHopLimit": 1,
            },
            "blockDeviceMappings": [
                {
                    "deviceName": "/dev/xvda",
                    "ebs": {
                        "volumeSize": 200,
                        "volumeType": "gp3",
                        "encrypted": "true",
                        "deleteOnTermination": "true",
                        "throughput": 500,
                        "iops": 3000,
                    },
                }
            ],
            "tagSpecifications": [
                {"resourceType": "instance", "tags": TAGS},
                {"resourceType": "volume", "tags": TAGS},
            ],
            "tags": TAGS,
            "updateDefaultVersion": True,
        },
        ids=("lt-0123456789abcdef0",),
    )
    add(
        NODE_GROUP,
        f"{N}-nodes",
        {
            "clusterName": f"{N}-eks-1a2b3c4",
            "nodeRoleArn": role_arn("node-role"),
            "subnetIds": ["subnet-a"],
            "scalingConfig": {"desiredSize": 3, "minSize": 3, "maxSize": 3},
            "amiType": "AL2023_ARM_64_STANDARD",
            "capacityType": "ON_DEMAND",
            "instanceTypes": ["c8g.16xlarge"],
            "launchTemplate": {"id": "lt-0123456789abcdef0", "version": "1"},
            "updateConfig": {"maxUnavailable": 1},
            "labels": {"llama-rpc-cluster/role": "llama"},
            "tags": TAGS,
        },
        cluster,
        template,
        roles["node-role"],
        subnets[0],
        *(attachments[a] for a in ("node-worker-policy", "node-registry-policy")),
        agent,
        cni,
    )
    provider = add(PROVIDER, f"{N}-k8s", {"kubeconfig": KUBECONFIG}, cluster)
    controller = add(
        CONFIG_FILE, f"{N}-lws-controller", {"file": LWS_COPY, "skipAwait": True}, provider
    )
    system = {"app.kubernetes.io/part-of": N}
    add(
        NETWORK_POLICY_TYPE,
        f"{N}-cluster-dns",
        {
            "metadata": {"name": f"{N}-cluster-dns", "namespace": "kube-system", "labels": system},
            "spec": {
                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [{"ports": [{"port": 53, "protocol": "UDP"}]}],
                "egress": [{"ports": [{"port": 53, "protocol": "UDP"}]}],
            },
        },
        provider,
    )
    controller_policy = add(
        NETWORK_POLICY_TYPE,
        f"{N}-lws-controller-policy",
        {
            "metadata": {"name": f"{N}-lws-controller", "namespace": "lws-system"},
            "spec": {
                "podSelector": {"matchLabels": {"control-plane": "controller-manager"}},
                "policyTypes": ["Ingress"],
                "ingress": [{"ports": [{"port": 9443, "protocol": "TCP"}]}],
            },
        },
        provider,
        controller,
    )
    ready = add(
        DEPLOYMENT_PATCH,
        f"{N}-lws-controller-ready",
        {"metadata": {"name": "lws-controller-manager", "namespace": "lws-system"}},
        provider,
        controller,
        controller_policy,
    )
    namespace = add(NAMESPACE, f"{N}-namespace", {"metadata": {"name": NS}}, provider)
    inside = (provider, namespace)
    add(
        CONFIG_MAP,
        f"{N}-env",
        {"metadata": meta(f"{N}-env"), "data": {"LLAMA_PORT": "8080"}},
        *inside,
    )
    add(
        SECRET,
        f"{N}-api-key",
        {
            "metadata": meta(f"{N}-api-key"),
            "type": "Opaque",
            # A secret input, as the engine hands it over.
            "stringData": {"llama-api-key": {rules.SECRET_SIGNATURE: "x", "value": "k" * 48}},
        },
        *inside,
    )
    add(
        SERVICE_TYPE,
        f"{N}-api",
        {
            "metadata": meta(f"{N}-api"),
            "spec": {
                "type": "ClusterIP",
                "selector": {"leaderworkerset.sigs.k8s.io/name": N},
                "ports": [{"name": "api", "port": 8080, "targetPort": "api", "protocol": "TCP"}],
            },
        },
        *inside,
    )
    add(
        NETWORK_POLICY_TYPE,
        f"{N}-api-policy",
        {
            "metadata": meta(f"{N}-api"),
            "spec": {
                "podSelector": {"matchLabels": {"leaderworkerset.sigs.k8s.io/name": N}},
                "policyTypes": ["Ingress"],
                "ingress": [{"ports": [{"port": 8080, "protocol": "TCP"}]}],
            },
        },
        *inside,
    )
    balancer = {**LABELS, "llama-rpc-cluster/role": "balancer"}
    add(
        DEPLOYMENT_TYPE,
        f"{N}-balancer",
        {
            "metadata": meta(f"{N}-balancer"),
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"llama-rpc-cluster/role": "balancer"}},
                "template": {"metadata": {"labels": balancer}, "spec": {"containers": []}},
            },
        },
        *inside,
    )
    add(
        LEADER_WORKER_SET,
        f"{N}-lws",
        {
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            "metadata": meta(N),
            "spec": {
                "replicas": 1,
                "startupPolicy": "LeaderCreated",
                "leaderWorkerTemplate": {
                    "size": 3,
                    "restartPolicy": "RecreateGroupOnPodRestart",
                    "leaderTemplate": {"metadata": {"labels": LABELS}},
                    "workerTemplate": {"metadata": {"labels": LABELS}, "spec": {}},
                },
            },
        },
        *inside,
        controller,
        ready,
    )
    return rules.Stack(found, owners)


def named(stack: rules.Stack, name: str) -> rules.Registered:
    [found] = [r for r in stack.resources if r.name == name]
    return found


def put(inputs: Any, path: str, value: Any) -> None:
    *heads, last = path.split(".")
    for head in heads:
        inputs = inputs[int(head)] if isinstance(inputs, list) else inputs.setdefault(head, {})
    if isinstance(inputs, list):
        inputs[int(last)] = value
    elif value is DROP:
        inputs.pop(last, None)
    else:
        inputs[last] = value


def changed(stack: rules.Stack, name: str, /, **paths: Any) -> rules.Stack:
    """The stack with one resource's inputs changed (``a__b`` for the path ``a.b``)."""
    old = named(stack, name)
    inputs = copy.deepcopy(dict(old.inputs))
    for path, value in paths.items():
        put(inputs, path.replace("__", "."), value)
    new = dataclasses.replace(old, inputs=inputs)
    return dataclasses.replace(stack, resources=[new if r is old else r for r in stack.resources])


def waiting(stack: rules.Stack, name: str, *, drop: str) -> rules.Stack:
    """The stack with one resource no longer waiting for another (by logical name)."""
    old = named(stack, name)
    new = dataclasses.replace(old, depends_on=old.depends_on - {named(stack, drop).key})
    return dataclasses.replace(stack, resources=[new if r is old else r for r in stack.resources])


def without(stack: rules.Stack, name: str) -> rules.Stack:
    return dataclasses.replace(stack, resources=[r for r in stack.resources if r.name != name])


STACK = build()


def test_the_eks_stack_as_the_program_registers_it_keeps_every_rule() -> None:
    assert rules.violations(STACK, RESOURCE_RULES) == []
    assert {r.type for r in STACK.resources} >= {*eks.RULES, *kubernetes.RULES}


def test_the_new_types_clash_with_no_other_clouds_rules() -> None:
    others = [aws.RULES, gcp.RULES, azure.RULES, random_provider.RULES]
    for new in (eks.RULES, kubernetes.RULES):
        assert all(not set(new) & set(other) for other in others)
    assert not set(eks.RULES) & set(kubernetes.RULES)
    assert RESOURCE_RULES[ROLE] is aws.RULES[ROLE]


def test_every_rule_and_every_replacement_names_its_source() -> None:
    for entry in (*eks.RULES.values(), *kubernetes.RULES.values()):
        assert all(rule.source for rule in entry.rules), entry.type
        assert entry.source or not entry.replaced_on, entry.type


E = f"{N}-eks"
G = f"{N}-nodes"
T = f"{N}-nodes-template"
CNI = f"{N}-vpc-cni"
EBS = "blockDeviceMappings__0__ebs"
CASES = [
    # The cluster.
    (E, {"name": "x" * 101}, rules.NAME, "name", "outside 1-100"),
    (E, {"name": "eks.cluster"}, rules.NAME, "name 'eks.cluster'"),
    (E, {"tags": DROP}, rules.TAGS, "tags"),
    (E, {"accessConfig__authenticationMode": "IAM"}, rules.VALUE, "authenticationMode"),
    (E, {"upgradePolicy__supportType": "LTS"}, rules.VALUE, "supportType"),
    (E, {"enabledClusterLogTypes": ["api", "kubelet"]}, rules.VALUE, "enabledClusterLogTypes"),
    (E, {"vpcConfig__subnetIds": ["subnet-a"]}, rules.COMBINATION, "subnetIds", "two"),
    (E, {"vpcConfig__subnetIds": ["subnet-a", "subnet-x"]}, rules.COMBINATION, "subnet-x"),
    (
        E,
        {"vpcConfig__endpointPublicAccess": False, "vpcConfig__endpointPrivateAccess": False},
        rules.COMBINATION,
        "endpointPublicAccess",
        "endpointPrivateAccess",
    ),
    # The node group.
    (G, {"nodeGroupName": "n" * 64}, rules.NAME, "nodeGroupName", "outside 1-63"),
    (G, {"amiType": "AL2023_x86_64_STANDARD"}, rules.COMBINATION, "amiType", "Graviton"),
    (G, {"amiType": "UBUNTU_ARM_64"}, rules.VALUE, "amiType"),
    (G, {"instanceTypes": ["c7i.16xlarge"]}, rules.COMBINATION, "c7i.16xlarge", "Graviton"),
    (G, {"capacityType": "RESERVED"}, rules.VALUE, "capacityType"),
    (G, {"scalingConfig__desiredSize": 4}, rules.COMBINATION, "desiredSize 4", "maxSize 3"),
    (
        G,
        {"scalingConfig": {"minSize": 0, "desiredSize": 0, "maxSize": 0}},
        rules.VALUE,
        "scalingConfig.maxSize",
    ),
    (G, {"updateConfig__maxUnavailable": 101}, rules.VALUE, "updateConfig.maxUnavailable"),
    (G, {"updateConfig__maxUnavailablePercentage": 10}, rules.COMBINATION, "maxUnavailable"),
    (
        G,
        {"taints": [{"key": f"k{i}", "effect": "NO_SCHEDULE"} for i in range(51)]},
        rules.COMBINATION,
        "51 taints",
    ),
    (G, {"taints": [{"key": "k", "effect": "NoSchedule"}]}, rules.VALUE, "taints.0.effect"),
    (G, {"labels": {"role": "a b"}}, rules.TAGS, "labels", "'a b'"),
    (G, {"labels": {f"example.com/{'a' * 55}": "x"}}, rules.TAGS, "labels", "takes 63"),
    (G, {"labels": {"role": ""}}, rules.TAGS, "labels", "empty value"),
    (G, {"diskSize": 200}, rules.COMBINATION, "diskSize", "launchTemplate"),
    (G, {"remoteAccess": {"ec2SshKey": "k"}}, rules.COMBINATION, "remoteAccess"),
    (G, {"launchTemplate__id": "lt-other"}, rules.COMBINATION, "launchTemplate"),
    # What the node group's launch template must leave to EKS.
    (T, {"iamInstanceProfile": {"name": "p"}}, rules.COMBINATION, "iamInstanceProfile"),
    (T, {"instanceType": "c8g.16xlarge"}, rules.COMBINATION, "instance types"),
    (T, {"networkInterfaces": [{"subnetId": "subnet-a"}]}, rules.COMBINATION, "subnet"),
    (T, {"imageId": "ami-0abc"}, rules.COMBINATION, "custom AMI"),
    # The launch template's own inputs.
    (T, {"name": "nodes template"}, rules.NAME, "name 'nodes template'"),
    (T, {"name": "t" * 126}, rules.NAME, "outside 3-125"),
    (T, {"description": "d" * 256}, rules.TEXT, "description"),
    (T, {"metadataOptions__httpTokens": "maybe"}, rules.VALUE, "httpTokens"),
    (T, {"metadataOptions__httpPutResponseHopLimit": 65}, rules.VALUE, "HopLimit"),
    (
        T,
        {f"{EBS}__throughput": 2001, f"{EBS}__iops": 9000},  # over what a launch takes
        rules.VALUE,
        "ebs.throughput",
    ),
    (T, {"blockDeviceMappings__0__ebs__throughput": 1000}, rules.COMBINATION, "4000 IOPS"),
    (T, {"blockDeviceMappings__0__ebs__iops": 80_001}, rules.VALUE, "ebs.iops"),
    (T, {"blockDeviceMappings__0__ebs__encrypted": "false"}, rules.VALUE, "ebs.encrypted"),
    (T, {"blockDeviceMappings__0__ebs__volumeType": "gp2"}, rules.VALUE, "ebs.volumeType"),
    (
        T,
        {"tagSpecifications__1__resourceType": "launch-template"},
        rules.VALUE,
        "tagSpecifications.1.resourceType",
    ),
    (T, {"tagSpecifications__0__tags": {"project": N}}, rules.TAGS, "tagSpecifications", "stack"),
    # The add-on and the roles' policies.
    (
        f"{N}-vpc-cni",
        {"configurationValues": "enableNetworkPolicy=true"},
        rules.COMBINATION,
        "JSON",
    ),
    (f"{N}-vpc-cni", {"resolveConflictsOnCreate": "PRESERVE"}, rules.VALUE, "OnCreate"),
    (
        f"{N}-vpc-cni",
        {"configurationValues": json.dumps({"env": {"NETWORK_POLICY_ENFORCING_MODE": "strict"}})},
        rules.COMBINATION,
        "strict without enableNetworkPolicy",
    ),
    (
        f"{N}-vpc-cni",
        {
            "configurationValues": json.dumps(
                {"enableNetworkPolicy": "true", "env": {"NETWORK_POLICY_ENFORCING_MODE": "strikt"}}
            )
        },
        rules.COMBINATION,
        "'strikt'",
    ),
    (
        f"{N}-vpc-cni",
        {"configurationValues": json.dumps({"enableNetworkPolicy": True})},
        rules.COMBINATION,
        "enableNetworkPolicy True",
    ),
    (
        f"{N}-vpc-cni",
        {"configurationValues": json.dumps({"env": {"WARM_IP_TARGET": 2}})},
        rules.COMBINATION,
        "env.WARM_IP_TARGET",
    ),
    (
        f"{N}-vpc-cni",
        {"podIdentityAssociations__0__serviceAccount": "AWS_node"},
        rules.NAME,
        "podIdentityAssociations.0.serviceAccount",
    ),
    (
        f"{N}-vpc-cni",
        {"podIdentityAssociations__0__roleArn": f"arn:aws:iam::{ACCOUNT}:role/elsewhere"},
        rules.COMBINATION,
        "not a role the stack makes",
    ),
    (
        f"{N}-cni-role",
        {"assumeRolePolicy": POD_IDENTITY_TRUST.replace(', "sts:TagSession"', "")},
        rules.COMBINATION,
        "does not trust pods.eks.amazonaws.com",
    ),
    (
        f"{N}-cni-role",
        {"assumeRolePolicy": POD_IDENTITY_TRUST.replace("pods.eks", "ec2")},
        rules.COMBINATION,
        "cni-role",
    ),
    (
        f"{N}-lws-controller-ready",
        {"metadata__name": "lws-webhook"},
        rules.VALUE,
        "metadata.name",
        "'lws-controller-manager'",
    ),
    (f"{N}-cluster-policy", {"policyArn": "AmazonEKSClusterPolicy"}, rules.VALUE, "policyArn"),
    # The Kubernetes provider and the LWS controller.
    (f"{N}-k8s", {"kubeconfig": DROP}, rules.COMBINATION, "kubeconfig"),
    (f"{N}-k8s", {"kubeconfig": "apiVersion: v1"}, rules.COMBINATION, "kubeconfig", "JSON"),
    (
        f"{N}-lws-controller",
        {"file": "https://github.com/kubernetes-sigs/lws/releases/latest/download/manifests.yaml"},
        rules.COMBINATION,
        "file",
        "pinned",
    ),
    # Even the release's own URL: its asset can be replaced.
    (f"{N}-lws-controller", {"file": LWS_URL}, rules.COMBINATION, "verified copy"),
    (
        f"{N}-lws-controller",
        {"file": LWS_COPY.replace("-" + "5" * 16, "")},
        rules.COMBINATION,
        "image digest",
    ),
    # Object names, namespaces and labels.
    (f"{N}-namespace", {"metadata__name": "Llama"}, rules.NAME, "metadata.name 'Llama'"),
    (f"{N}-namespace", {"metadata__name": "n" * 64}, rules.NAME, "metadata.name", "1-63"),
    (f"{N}-env", {"metadata__name": "llama_env"}, rules.NAME, "metadata.name"),
    (f"{N}-env", {"metadata__name": "a" * 254}, rules.NAME, "metadata.name", "1-253"),
    (f"{N}-env", {"metadata__name": DROP}, rules.NAME, "metadata.name is not given"),
    (f"{N}-env", {"metadata__namespace": DROP}, rules.NAME, "metadata.namespace"),
    (f"{N}-env", {"metadata__namespace": "Llama"}, rules.NAME, "metadata.namespace"),
    (f"{N}-env", {"metadata__labels__role": "-bad"}, rules.TAGS, "metadata.labels", "'-bad'"),
    (f"{N}-env", {"metadata__labels__role": "v" * 64}, rules.TAGS, "metadata.labels"),
    (f"{N}-env", {"metadata__labels": {"a/b/c": "x"}}, rules.TAGS, "'a/b/c'"),
    (f"{N}-env", {"metadata__labels": {"Bad_Prefix/x": "x"}}, rules.TAGS, "prefix"),
    (f"{N}-api", {"metadata__name": "1llama"}, rules.NAME, "RFC 1035"),
    (f"{N}-lws", {"metadata__name": "llama.rpc"}, rules.NAME, "RFC 1035"),
    # ConfigMap and Secret data.
    (f"{N}-env", {"data__LLAMA PORT": "1"}, rules.COMBINATION, "data.LLAMA PORT"),
    (f"{N}-env", {"data": {"..x": "1"}}, rules.COMBINATION, "data...x"),
    (f"{N}-env", {"data__big": "x" * (1024 * 1024 + 1)}, rules.COMBINATION, "1 MiB"),
    (
        f"{N}-env",
        {"binaryData": {"LLAMA_PORT": base64.b64encode(b"1").decode()}},
        rules.COMBINATION,
        "twice",
    ),
    (f"{N}-api-key", {"stringData__big": "x" * (1024 * 1024)}, rules.COMBINATION, "1 MiB"),
    (f"{N}-api-key", {"data": {"k": "not base64!"}}, rules.COMBINATION, "base64"),
    # Service, NetworkPolicy, Deployment, LeaderWorkerSet values.
    (f"{N}-api", {"spec__type": "LoadBalancer"}, rules.VALUE, "spec.type", "ClusterIP"),
    (f"{N}-api", {"spec__ports__0__port": 70_000}, rules.VALUE, "spec.ports.0.port"),
    (f"{N}-api", {"spec__selector": {"app": "a b"}}, rules.TAGS, "spec.selector"),
    (f"{N}-api-policy", {"spec__policyTypes": ["Both"]}, rules.VALUE, "policyTypes"),
    (
        f"{N}-balancer",
        {"spec__selector__matchLabels": {"llama-rpc-cluster/role": "lb"}},
        rules.COMBINATION,
        "spec.selector",
    ),
    (f"{N}-lws", {"apiVersion": "leaderworkerset.x-k8s.io/v2"}, rules.VALUE, "apiVersion"),
    (f"{N}-lws", {"spec__replicas": -1}, rules.VALUE, "spec.replicas"),
    (f"{N}-lws", {"spec__leaderWorkerTemplate__size": 0}, rules.VALUE, "size"),
    (f"{N}-lws", {"spec__startupPolicy": "Eager"}, rules.VALUE, "startupPolicy"),
    (
        f"{N}-lws",
        {"spec__replicas": 1_000_000, "spec__leaderWorkerTemplate__size": 3000},
        rules.COMBINATION,
        "spec.replicas",
        "size 3000",
    ),
]


@pytest.mark.parametrize(
    ("name", "paths", "family", "words"),
    [pytest.param(c[0], c[1], c[2], c[3:], id=f"{c[0]}-{next(iter(c[1]))}") for c in CASES],
)
def test_a_broken_input_is_caught(
    name: str, paths: dict[str, Any], family: str, words: tuple[str, ...]
) -> None:
    only(changed(STACK, name, **paths), family, *words)


def test_a_cluster_needs_subnets_in_two_zones() -> None:
    stack = changed(STACK, f"{N}-private-b", availabilityZone="us-east-1a")
    only(stack, rules.COMBINATION, "subnetIds", "two availability zones")


def test_a_private_endpoint_needs_the_vpcs_dns_hostnames() -> None:
    stack = changed(STACK, f"{N}-vpc", enableDnsHostnames=False)
    only(stack, rules.COMBINATION, "endpointPrivateAccess", "enableDnsHostnames")
    public_only = changed(stack, E, vpcConfig__endpointPrivateAccess=False)
    assert rules.violations(public_only, RESOURCE_RULES) == []


def test_the_cluster_and_nodes_wait_for_their_own_roles_policies() -> None:
    only(waiting(STACK, E, drop=f"{N}-cluster-policy"), rules.ORDER, "cluster-policy")
    only(waiting(STACK, G, drop=f"{N}-node-worker-policy"), rules.ORDER, "node-worker-policy")
    # The CNI starts with its own role's policy.
    only(waiting(STACK, CNI, drop=f"{N}-cni-policy"), rules.ORDER, "cni-policy", "Pod Identity")
    # The cluster does not wait for the nodes' policies (After would ask it to): no rule asks.
    cluster = named(STACK, E)
    assert not STACK.waits_for(cluster, named(STACK, f"{N}-node-worker-policy"))


def test_each_role_carries_the_policies_eks_needs() -> None:
    only(without(STACK, f"{N}-cluster-policy"), rules.COMBINATION, "AmazonEKSClusterPolicy")
    only(without(STACK, f"{N}-node-registry-policy"), rules.COMBINATION, "ContainerRegistry")
    # The CNI's policy is on its own role, which Pod Identity gives aws-node.
    only(
        without(STACK, f"{N}-cni-policy"), rules.COMBINATION, "cni-role lacks AmazonEKS_CNI_Policy"
    )
    # Without a role of its own, the CNI runs with the nodes', which must then carry it.
    on_nodes = changed(STACK, CNI, podIdentityAssociations=DROP)
    only(on_nodes, rules.COMBINATION, "node-role lacks AmazonEKS_CNI_Policy")
    # IRSA takes the policy off the nodes' role as well.
    own_role = changed(on_nodes, CNI, serviceAccountRoleArn=f"arn:aws:iam::{ACCOUNT}:role/cni")
    assert rules.violations(own_role, RESOURCE_RULES) == []
    only(changed(STACK, E, roleArn="arn:aws:iam::1:role/x"), rules.COMBINATION, "roleArn")


def test_pod_identity_needs_its_agent_on_the_cluster() -> None:
    only(without(STACK, f"{N}-pod-identity-agent"), rules.COMBINATION, "eks-pod-identity-agent")
    elsewhere = changed(STACK, f"{N}-pod-identity-agent", clusterName="another-cluster")
    only(elsewhere, rules.COMBINATION, "podIdentityAssociations without")


def test_objects_wait_for_their_namespace_and_the_lws_for_its_controller() -> None:
    only(waiting(STACK, f"{N}-env", drop=f"{N}-namespace"), rules.ORDER, "namespace 'llama'")
    # (Waiting for the controller's readiness waits for its manifest too.)
    unready = waiting(STACK, f"{N}-lws", drop=f"{N}-lws-controller-ready")
    only(unready, rules.ORDER, "ready")
    only(waiting(unready, f"{N}-lws", drop=f"{N}-lws-controller"), rules.ORDER, "CRD")
    # The controller's namespace is its manifest's: what lives there waits for the manifest.
    policy, ready = f"{N}-lws-controller-policy", f"{N}-lws-controller-ready"
    only(waiting(STACK, policy, drop=f"{N}-lws-controller"), rules.ORDER, "'lws-system'")
    alone = waiting(waiting(STACK, ready, drop=f"{N}-lws-controller"), ready, drop=policy)
    only(alone, rules.ORDER, "'lws-system'")


@pytest.mark.parametrize(
    ("typ", "path", "replaced"),
    [
        (CLUSTER, "accessConfig.bootstrapClusterCreatorAdminPermissions", True),
        (CLUSTER, "vpcConfig.subnetIds.0", False),
        (NODE_GROUP, "instanceTypes.0", True),
        (NODE_GROUP, "launchTemplate.version", False),
        (NODE_GROUP, "scalingConfig.desiredSize", False),
        (ADDON, "configurationValues", False),
        (LAUNCH_TEMPLATE, "blockDeviceMappings.0.ebs.volumeSize", False),
        (ATTACHMENT, "policyArn", True),
        (PROVIDER, "kubeconfig", True),
        (CONFIG_MAP, "data.LLAMA_PORT", True),
        (SECRET, "stringData.llama-api-key", True),
        (SERVICE_TYPE, "spec.clusterIP", True),
        (SERVICE_TYPE, "spec.type", False),
        (DEPLOYMENT_TYPE, "spec.selector.matchLabels.app", True),
        (DEPLOYMENT_TYPE, "spec.replicas", False),
        (LEADER_WORKER_SET, "metadata.namespace", True),
        (LEADER_WORKER_SET, "spec.leaderWorkerTemplate.size", False),
    ],
)
def test_the_inputs_that_replace_a_resource(typ: str, path: str, replaced: bool) -> None:
    patterns = RESOURCE_RULES[typ].replaced_on
    assert any(rules.covers(p, path) for p in patterns) == replaced
