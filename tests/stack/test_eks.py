"""The kubernetes platform (``platform: kubernetes``, aws-eks): the EKS stack under mocks.

What it registers (a private endpoint, network policies enforced by the VPC CNI, Graviton node
groups from launch templates), that the Kubernetes objects it applies are exactly what
``lrc k8s render`` writes for the same stack, its price (the control plane included) against
the resources it makes, what a second ``up`` changes, and the settings it refuses before
anything is created.
"""

from __future__ import annotations

import ipaddress
import json
import urllib.error
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml

from infra import catalog
from infra.boot.node import API_KEY_CREDENTIAL
from infra.clouds import aws as aws_facts
from infra.conformance import rules
from infra.core import costs, outputs, pins
from infra.stack.files import stack_values
from infra.stack.kube import controller, eks, objects
from tests.pulumi_mocks import (
    CONTROLLER_MANIFEST,
    CONTROLLER_PINS,
    GENERATED_KEY,
    KUBERNETES_API_CIDRS,
    NO_KEY,
    REPLICAS,
    ZONES,
    Deployment,
    RecordingMocks,
    deploy,
    deployed,
    deployment,
    overrides_of,
    parsed_config,
    plan_update,
    refused,
    revealed,
    stack_config,
)

P = "llama-rpc-cluster:"
STACK = "aws-eks"
COMPONENT = "llama-rpc-cluster:index:LlamaRpcKubernetesCluster"
CLUSTER = "aws:eks/cluster:Cluster"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
SUBNET = "aws:ec2/subnet:Subnet"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
ADDON = "aws:eks/addon:Addon"
CONTROLLER = "kubernetes:yaml/v2:ConfigFile"
LWS = "kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet"
POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
READY = "kubernetes:apps/v1:DeploymentPatch"
ROLE = "aws:iam/role:Role"
ATTACHMENT = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"
# What the program puts beside the rendered objects: the namespace and the API key's Secret (and,
# outside the namespace, the cluster's own pods' policies and the controller's readiness).
STACK_OWN = {"kubernetes:core/v1:Namespace", "kubernetes:core/v1:Secret", READY}


def applied(d: Deployment) -> list[dict[str, Any]]:
    """The Kubernetes objects the stack applies, as objects (registration order aside)."""
    found = []
    for r in d.resources:
        if not r.typ.startswith("kubernetes:") or r.typ == CONTROLLER or r.typ in STACK_OWN:
            continue
        if r.inputs.get("metadata", {}).get("namespace") != eks.NAMESPACE:
            continue
        found.append({k: v for k, v in r.inputs.items() if v is not None})
    return found


def plain(value: Any) -> Any:
    """Numbers as the engine hands them over (floats) made whole again, to compare with JSON."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def key(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


ANOTHER_MAIN_TYPE = {"mainInstanceType": "c8g.8xlarge"}


@pytest.mark.parametrize(
    "settings",
    [{}, REPLICAS, ANOTHER_MAIN_TYPE, NO_KEY],
    ids=["as-shipped", "replicas", "another-main-type", "no-key"],
)
def test_the_applied_objects_are_what_lrc_k8s_render_writes(settings: dict[str, Any]) -> None:
    """One source of truth: the stack applies the render of its own settings, object for
    object and field for field, with the image it is given."""
    d = deployment(STACK, **settings)
    config = parsed_config(STACK, overrides_of(settings))
    rendered = objects.render(
        config, name=eks.LWS_NAME, namespace=eks.NAMESPACE, image=str(config.kubernetes_image)
    )
    got = sorted((plain(o) for o in applied(d)), key=key)
    assert got == sorted(rendered, key=key)
    leader = next(o for o in got if o["kind"] == "LeaderWorkerSet")
    containers = leader["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"]
    assert {c["image"] for c in containers} == {config.kubernetes_image}


def test_the_api_key_is_a_secret_the_leaders_read_and_none_without_one() -> None:
    d = deployed(STACK)
    [secret] = d.of_type("kubernetes:core/v1:Secret")
    assert secret.inputs["metadata"] == {
        "name": f"{eks.LWS_NAME}-api-key",
        "namespace": "llama-rpc-cluster",
    }
    data = secret.inputs["stringData"]
    assert rules.is_secret(data)  # kept encrypted in the state
    value = revealed(data)[API_KEY_CREDENTIAL]
    assert value.startswith(GENERATED_KEY)
    assert d.outputs[outputs.API_KEY] == value
    assert outputs.API_KEY in d.secret_outputs
    without = deployment(STACK, **NO_KEY)
    assert without.of_type("kubernetes:core/v1:Secret") == []
    assert without.outputs[outputs.API_KEY] is None


def test_the_control_plane_is_private_and_public_only_for_the_given_ranges() -> None:
    d = deployed(STACK)
    [cluster] = d.of_type(CLUSTER)
    vpc = cluster.inputs["vpcConfig"]
    # The shipped stack's range (where `pulumi up` runs), and nothing else, reaches the public
    # endpoint: the program applies the Kubernetes objects through it.
    shipped = stack_config(STACK)[f"{P}kubernetesApiCidrs"]
    assert vpc["endpointPrivateAccess"] is True and vpc["endpointPublicAccess"] is True
    assert vpc["publicAccessCidrs"] == shipped == ["198.51.100.7/32"]
    assert cluster.inputs["version"] == aws_facts.EKS_VERSION
    assert cluster.inputs["upgradePolicy"] == {"supportType": "STANDARD"}
    assert cluster.inputs["accessConfig"]["authenticationMode"] == "API"
    assert d.of_type(INGRESS) == []
    # A public range opens the public endpoint to it alone; a private one (a VPN, a peered
    # network) reaches the private endpoint through the cluster's security group, on 443 only.
    assert KUBERNETES_API_CIDRS["kubernetesApiCidrs"] == ["203.0.113.0/24", "10.8.0.0/16"]
    opened = deployment(STACK, **KUBERNETES_API_CIDRS)
    [cluster] = opened.of_type(CLUSTER)
    vpc = cluster.inputs["vpcConfig"]
    assert vpc["endpointPublicAccess"] is True and vpc["publicAccessCidrs"] == ["203.0.113.0/24"]
    [rule] = opened.of_type(INGRESS)
    assert rule.inputs["securityGroupId"] == "sg-0eks"  # the cluster's own, as EKS made it
    assert (rule.inputs["cidrIpv4"], rule.inputs["fromPort"], rule.inputs["toPort"]) == (
        "10.8.0.0/16",
        443,
        443,
    )
    assert not any("endpoint" in line for line in opened.outputs[outputs.LIMITATIONS])


@pytest.mark.parametrize("ranges", [[], ["10.8.0.0/16"]], ids=["none", "private-only"])
def test_an_endpoint_the_machine_running_up_cannot_reach_is_refused_before_anything(
    ranges: list[str],
) -> None:
    """Private to a VPC that this same `up` creates, the endpoint is out of reach of the
    Kubernetes provider, which runs where `pulumi up` runs: the stack would stop after the
    cluster's quarter of an hour."""
    mocks = RecordingMocks()
    with pytest.raises(Exception, match="kubernetesApiCidrs") as refusal:
        deploy(STACK, {f"{P}kubernetesApiCidrs": ranges}, mocks)
    assert "checkip" in str(refusal.value) and "public address" in str(refusal.value)
    assert mocks.resources == []


def test_the_control_plane_spans_two_zones_and_the_nodes_one() -> None:
    d = deployed(STACK)
    subnets = {r.name.removeprefix("llama-rpc-cluster-"): r.inputs for r in d.of_type(SUBNET)}
    assert set(subnets) == {"public", "private", "control-plane"}
    [cluster] = d.of_type(CLUSTER)
    assert cluster.inputs["vpcConfig"]["subnetIds"] == [
        "llama-rpc-cluster-private-id",
        "llama-rpc-cluster-control-plane-id",
    ]
    node_zone = subnets["private"]["availabilityZone"]
    assert node_zone == ZONES[0] == d.outputs[outputs.ZONE]
    assert subnets["control-plane"]["availabilityZone"] not in (node_zone, None)
    # The zone was asked for without the node zone and the zones EKS refuses.
    [asked] = [c for c in d.calls if c.token.endswith("getAvailabilityZones")]
    assert asked.args["excludeNames"] == [node_zone]
    assert set(asked.args["excludeZoneIds"]) == set(aws_facts.EKS_UNSUPPORTED_ZONE_IDS)
    # Every range inside the VPC, none overlapping.
    vpc = ipaddress.ip_network(parsed_config(STACK).vpc_cidr)
    ranges = [ipaddress.ip_network(s["cidrBlock"]) for s in subnets.values()]
    assert all(r.subnet_of(vpc) for r in ranges)
    assert not any(a.overlaps(b) for i, a in enumerate(ranges) for b in ranges[i + 1 :])
    # The smallest VPC the settings take still holds the three.
    small = deploy(STACK, {f"{P}vpcCidr": "10.9.0.0/23"})
    assert len(small.of_type(SUBNET)) == 3


def addons(d: Deployment) -> dict[str, dict[str, Any]]:
    return {r.inputs["addonName"]: r.inputs for r in d.of_type(ADDON)}


def test_network_policies_are_enforced_by_the_vpc_cni_in_strict_mode() -> None:
    addon = addons(deployed(STACK))["vpc-cni"]
    values = json.loads(addon["configurationValues"])
    assert values["enableNetworkPolicy"] == "true"  # a string, as the add-on's schema takes it
    # Strict: a new pod is denied everything until its policies apply (standard lets all in).
    assert values["env"]["NETWORK_POLICY_ENFORCING_MODE"] == "strict"
    assert addon["resolveConflictsOnCreate"] == "OVERWRITE"


def test_every_node_joins_with_the_cni_in_strict_mode_and_its_agent_in_place() -> None:
    stack = deployed(STACK).stack()
    network = [r for r in stack.resources if r.type == ADDON]
    assert {r.inputs["addonName"] for r in network} == {"vpc-cni", "eks-pod-identity-agent"}
    groups = [r for r in stack.resources if r.type == NODE_GROUP]
    assert groups
    for group in groups:
        for addon in network:
            assert stack.waits_for(group, addon), (group.name, addon.name)


def test_strict_mode_gives_the_clusters_dns_and_the_controller_policies_of_their_own() -> None:
    d = deployed(STACK)
    policies = {
        r.inputs["metadata"]["namespace"]: r.inputs
        for r in d.of_type(POLICY)
        if r.inputs["metadata"]["namespace"] != eks.NAMESPACE
    }
    assert set(policies) == {"kube-system", "lws-system"}
    api = "172.20.0.1/32"  # the mocked cluster's service range, its first address
    vpc = "10.42.0.0/16"
    dns = policies["kube-system"]["spec"]
    assert dns["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    assert dns["policyTypes"] == ["Ingress", "Egress"]
    # Port 53 alone, from any pod; out to the VPC's resolver and the API, nothing else.
    assert [rule["ports"] for rule in dns["ingress"]] == [
        [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    ]
    out = {
        (block["ipBlock"]["cidr"], port["port"])
        for rule in dns["egress"]
        for block in rule["to"]
        for port in rule["ports"]
    }
    assert out == {
        (vpc, 53),
        ("169.254.169.253/32", 53),
        (vpc, 443),
        (api, 443),
    }
    controller = policies["lws-system"]["spec"]
    assert controller["podSelector"] == {"matchLabels": {"control-plane": "controller-manager"}}
    assert controller["ingress"] == [
        {"from": [{"ipBlock": {"cidr": vpc}}], "ports": [{"protocol": "TCP", "port": 9443}]}
    ]
    assert [b["ipBlock"]["cidr"] for b in controller["egress"][0]["to"]] == [vpc, api]
    assert controller["egress"][0]["ports"] == [{"protocol": "TCP", "port": 443}]
    # The DNS's policy is in place before any node joins (CoreDNS never starts without it).
    stack = d.stack()
    [dns_policy] = [r for r in stack.resources if r.name == "llama-rpc-cluster-cluster-dns"]
    groups = [r for r in stack.resources if r.type == NODE_GROUP]
    assert groups and all(stack.waits_for(group, dns_policy) for group in groups)


def test_the_cni_role_is_its_service_accounts_alone_and_the_nodes_hold_no_eni_rights() -> None:
    d = deployed(STACK)
    roles = {r.name: r for r in d.of_type(ROLE)}
    attached = {
        (r.inputs["role"], r.inputs["policyArn"].rsplit("/", 1)[-1]) for r in d.of_type(ATTACHMENT)
    }
    node_policies = {p for role, p in attached if role == "llama-rpc-cluster-node-role"}
    assert node_policies == {"AmazonEKSWorkerNodePolicy", "AmazonEC2ContainerRegistryPullOnly"}
    cni_policies = {p for role, p in attached if role == "llama-rpc-cluster-cni-role"}
    assert cni_policies == {"AmazonEKS_CNI_Policy"}
    # Only EKS Pod Identity takes the CNI's role, and only for aws-node.
    trust = json.loads(roles["llama-rpc-cluster-cni-role"].inputs["assumeRolePolicy"])
    [statement] = trust["Statement"]
    assert statement["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert sorted(statement["Action"]) == ["sts:AssumeRole", "sts:TagSession"]
    cni = addons(d)["vpc-cni"]
    assert cni["podIdentityAssociations"] == [
        {
            "roleArn": "arn:aws:iam::123456789012:role/llama-rpc-cluster-cni-role",
            "serviceAccount": "aws-node",
        }
    ]
    stack = d.stack()
    [addon] = [r for r in stack.resources if r.inputs.get("addonName") == "vpc-cni"]
    for attachment in stack.resources:
        if attachment.type == ATTACHMENT and attachment.inputs["role"].endswith("cni-role"):
            assert stack.waits_for(addon, attachment)


@pytest.mark.parametrize(
    ("settings", "pools"),
    [
        ({}, {"nodes": ("c8g.16xlarge", 3)}),
        (REPLICAS, {"nodes": ("c8g.16xlarge", 6)}),
        (
            {**ANOTHER_MAIN_TYPE, **REPLICAS},
            {"main": ("c8g.8xlarge", 2), "worker": ("c8g.16xlarge", 4)},
        ),
    ],
    ids=["as-shipped", "two-replicas", "another-main-type"],
)
def test_one_graviton_node_group_per_type_from_a_locked_down_launch_template(
    settings: dict[str, Any], pools: dict[str, tuple[str, int]]
) -> None:
    d = deployment(STACK, **settings)
    config = parsed_config(STACK, overrides_of(settings))
    groups = {r.name.removeprefix("llama-rpc-cluster-"): r.inputs for r in d.of_type(NODE_GROUP)}
    templates = {r.name: r.inputs for r in d.of_type(TEMPLATE)}
    assert {
        role: (g["instanceTypes"][0], g["scalingConfig"]["desiredSize"])
        for role, g in groups.items()
    } == pools
    for role, group in groups.items():
        assert group["amiType"] == "AL2023_ARM_64_STANDARD"
        assert group["subnetIds"] == ["llama-rpc-cluster-private-id"]
        assert "remoteAccess" not in group and "diskSize" not in group
        size = group["scalingConfig"]
        assert size["minSize"] == size["desiredSize"] == size["maxSize"]
        template = templates[f"llama-rpc-cluster-{role}-template"]
        assert group["launchTemplate"]["id"] == f"llama-rpc-cluster-{role}-template-id"
        assert template["metadataOptions"]["httpTokens"] == "required"
        # One hop: a pod cannot reach the node's instance metadata, or its role.
        assert template["metadataOptions"]["httpPutResponseHopLimit"] == 1
        [root] = template["blockDeviceMappings"]
        assert root["ebs"]["encrypted"] == "true" and root["ebs"]["volumeType"] == "gp3"
        # The pods' nodeSelector finds the group: every pod of the type has its disk.
        disk = config.main_disk_gb if role in ("main", "nodes") else config.worker_disk_gb
        assert root["ebs"]["volumeSize"] == disk
        assert "imageId" not in template and "instanceType" not in template
        assert "userData" not in template and "iamInstanceProfile" not in template
    # Each pod asks for a node of its own type, and the node groups have one for each.
    lws = next(o for o in applied(d) if o["kind"] == "LeaderWorkerSet")
    template = lws["spec"]["leaderWorkerTemplate"]
    selected = [
        template[t]["spec"]["nodeSelector"][objects.INSTANCE_TYPE_LABEL]
        for t in ("leaderTemplate", "workerTemplate")
    ]
    assert set(selected) == {t for t, _ in pools.values()}


def test_the_controller_comes_from_its_pinned_release_before_the_leader_worker_set() -> None:
    d = deployed(STACK)
    [controller] = d.of_type(CONTROLLER)
    # The provider applies the verified copy of the release's manifest: its objects, with the
    # controller's image by the digest the stack pins, and no image by tag.
    assert "/download/v0.10.0/" in pins.LWS_MANIFEST_URL
    applied = list(yaml.safe_load_all(Path(controller.inputs["file"]).read_text()))
    release = [o for o in yaml.safe_load_all(CONTROLLER_MANIFEST.read_text()) if o]
    image = CONTROLLER_PINS[f"{P}kubernetesControllerImage"]
    [deployment_] = [o for o in applied if o["kind"] == "Deployment"]
    [manager] = deployment_["spec"]["template"]["spec"]["containers"]
    assert manager["image"] == image
    manager["image"] = pins.LWS_IMAGE_BY_TAG
    assert applied == release
    stack = d.stack()
    [lws] = [r for r in stack.resources if r.type == LWS]
    [ctrl] = [r for r in stack.resources if r.type == CONTROLLER]
    [ready] = [r for r in stack.resources if r.type == READY]
    [policy] = [
        r
        for r in stack.resources
        if r.type == POLICY and r.inputs["metadata"]["namespace"] == "lws-system"
    ]
    # The manifest is applied without waiting: its pods need their policy (in its namespace)
    # first. The patch of its Deployment waits for them, and the LeaderWorkerSet for the patch.
    assert ctrl.inputs.get("skipAwait") is True
    assert stack.waits_for(policy, ctrl) and stack.waits_for(ready, policy)
    assert stack.waits_for(lws, ready)
    assert ready.inputs["metadata"]["name"] == "lws-controller-manager"
    assert ready.inputs["metadata"]["namespace"] == "lws-system"
    # The controller's pods need nodes and their network.
    for other in stack.resources:
        if other.type in (NODE_GROUP, ADDON):
            assert stack.waits_for(ctrl, other), other.name
    # Every Kubernetes object goes through the stack's own provider, to the stack's cluster.
    for r in d.resources:
        if r.typ.startswith("kubernetes:"):
            assert d.options_of(r).provider is not None, r.name


def test_every_resource_is_a_child_of_the_component_named_from_it() -> None:
    d = deployed(STACK)
    for r in d.resources:
        if r.typ == COMPONENT:
            continue
        assert r.name.startswith("llama-rpc-cluster-"), r.name
        parent = d.options_of(r).parent
        assert parent is not None and parent.pulumi_resource_type == COMPONENT, r.name


def test_the_outputs_keep_the_contract_and_say_how_to_reach_the_api() -> None:
    out = deployed(STACK).outputs
    assert set(out) == {*outputs.ALL_KEYS, *outputs.DETAIL_KEYS, *outputs.KUBERNETES_KEYS}
    assert out[outputs.PLATFORM] == "kubernetes"
    assert out[outputs.KUBERNETES_NAMESPACE] == eks.NAMESPACE
    assert out[outputs.KUBERNETES_CLUSTER] == "llama-rpc-cluster-eks"
    assert out[outputs.CONNECT_COMMAND] == (
        "aws eks update-kubeconfig --region us-east-1 --name llama-rpc-cluster-eks && "
        "kubectl -n llama-rpc-cluster port-forward service/llama-rpc-api 8080:8080"
    )
    # The leader's --rpc list names the group's workers as the pods' DNS names resolve.
    assert out[outputs.RPC_SERVERS] == "llama-rpc-0-1.llama-rpc:50052,llama-rpc-0-2.llama-rpc:50052"
    assert out[outputs.LLAMA_SERVER_URL] == (
        "http://llama-rpc-0.llama-rpc.llama-rpc-cluster.svc.cluster.local:8080"
    )
    assert out[outputs.BALANCER_URL] is None
    replicas = deployment(STACK, **REPLICAS).outputs
    assert replicas[outputs.BALANCER_URL] == (
        "http://llama-rpc-api.llama-rpc-cluster.svc.cluster.local:8080"
    )
    assert [g[outputs.RPC_SERVERS] for g in replicas[outputs.GROUPS]] == [
        "llama-rpc-0-1.llama-rpc:50052,llama-rpc-0-2.llama-rpc:50052",
        "llama-rpc-1-1.llama-rpc:50052,llama-rpc-1-2.llama-rpc:50052",
    ]


@pytest.mark.parametrize(
    "settings",
    [{}, REPLICAS, ANOTHER_MAIN_TYPE],
    ids=["as-shipped", "two-replicas", "another-main-type"],
)
def test_the_hourly_cost_prices_what_the_stack_makes_and_its_control_plane(
    settings: dict[str, Any],
) -> None:
    """Priced here from the resources themselves: each node group's type and count, each
    node's disk as its launch template gives it, one NAT gateway, and the control plane; no
    balancer node (HAProxy runs as pods)."""
    d = deployment(STACK, **settings)
    templates = {r.name: r.inputs for r in d.of_type(TEMPLATE)}
    nodes = []
    for group in d.of_type(NODE_GROUP):
        entry = catalog.find("aws", "us-east-1", group.inputs["instanceTypes"][0])
        assert entry is not None
        ebs = templates[f"{group.name}-template"]["blockDeviceMappings"][0]["ebs"]
        node = costs.PricedNode(entry, int(ebs["volumeSize"]), int(ebs["throughput"]))
        nodes += [node] * int(group.inputs["scalingConfig"]["desiredSize"])
    expected = costs.hourly_cost("aws", nodes, control_plane=True)
    out = d.outputs
    assert out[outputs.HOURLY_COST_USD] == expected.total
    plane = catalog.service_price("aws", costs.CONTROL_PLANE_ITEM).usd
    assert plane == 0.2  # the fixture catalog's
    without_plane = costs.hourly_cost("aws", nodes)
    assert round(expected.total - without_plane.total, 5) == plane
    assert "Kubernetes control plane $0.2/h" in out[outputs.HOURLY_COST_BASIS]
    # Scaled to no nodes (their disks go with them), the control plane and the NAT go on.
    assert out[outputs.STOPPED_HOURLY_COST_USD] == round(expected.nat_stopped + plane, 5)
    assert not d.of_type("aws:ec2/instance:Instance")


def test_a_second_up_changes_nothing_and_new_settings_reach_only_the_pods() -> None:
    before = deployed(STACK)
    again = deploy(STACK, mocks=RecordingMocks(prior=before))
    actions = plan_update(before, again)
    assert {k for k, a in actions.items() if a != "same"} == set()
    # A new context size: the leaders' settings and their template (which remakes the groups);
    # no node, node group or control plane is touched.
    after = deploy(STACK, {f"{P}contextSize": 2048}, RecordingMocks(prior=before))
    actions = plan_update(before, after)
    touched = {k.split("::")[1] for k, a in actions.items() if a != "same"}
    assert touched == {"llama-rpc-cluster-llama-rpc-leader-env", "llama-rpc-cluster-llama-rpc"}
    assert actions[f"{LWS}::llama-rpc-cluster-llama-rpc"] == "update"
    # A new image: only the LeaderWorkerSet, updated in place.
    after = deploy(
        STACK,
        {f"{P}kubernetesImage": "example.com/llama-rpc:2@sha256:" + "2" * 64},
        RecordingMocks(prior=before),
    )
    actions = plan_update(before, after)
    assert {k for k, a in actions.items() if a != "same"} == {f"{LWS}::llama-rpc-cluster-llama-rpc"}


def test_new_settings_change_the_pod_template_they_reach() -> None:
    """The pods read their settings from ConfigMaps once, at start: a template's digest of them
    is what makes the LeaderWorkerSet remake its groups."""

    def digests(overrides: dict[str, Any]) -> tuple[str, str]:
        config = parsed_config(STACK, overrides)
        lws = next(
            o
            for o in objects.render(config, name="x", namespace="y", image="z")
            if o["kind"] == "LeaderWorkerSet"
        )["spec"]["leaderWorkerTemplate"]
        return tuple(  # type: ignore[return-value]
            lws[t]["metadata"]["annotations"][objects.SETTINGS_DIGEST]
            for t in ("leaderTemplate", "workerTemplate")
        )

    leader, worker = digests({})
    assert digests({}) == (leader, worker)
    new_leader, same_worker = digests({f"{P}contextSize": 2048})
    assert new_leader != leader and same_worker == worker
    commit = digests({f"{P}llamaCppCommit": "0" * 40})
    assert commit[0] != leader and commit[1] != worker


@pytest.mark.parametrize(
    ("overrides", "setting", "words"),
    [
        ({f"{P}kubernetesImage": None}, "kubernetesImage", "lrc k8s render"),
        ({f"{P}kubernetesImage": "My Registry/llama:1"}, "kubernetesImage", "an image reference"),
        ({f"{P}kubernetesImage": "ecr.example.com/llama:"}, "kubernetesImage", "[:TAG]"),
        # A tag alone can be moved to other content: refused, with the way to a digest.
        ({f"{P}kubernetesImage": "ecr.example.com/llama:1"}, "kubernetesImage", "--metadata-file"),
        (
            {f"{P}image": "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-arm64-server-20251001"},
            "image",
            "Amazon Linux 2023",
        ),
        ({f"{P}stopAfterIdleMinutes": 30}, "stopAfterIdleMinutes", "0 replicas"),
        ({f"{P}stopAfterHours": 8}, "stopAfterHours", "0 replicas"),
        (
            {f"{P}model": {"preset": "llama-3.1-8b-q4_0", "urls": ["s3://models/llama.gguf"]}},
            "model.urls",
            "https URLs",
        ),
        ({f"{P}kubernetesApiCidrs": ["0.0.0.0/0"]}, "kubernetesApiCidrs", ""),
        ({f"{P}platform": "k8s"}, "platform", "vm, kubernetes"),
    ],
)
def test_what_the_platform_cannot_do_is_refused_by_name(
    overrides: dict[str, Any], setting: str, words: str
) -> None:
    assert words in refused(STACK, overrides, setting)


@pytest.mark.parametrize(
    ("stack", "overrides", "setting"),
    [
        ("gcp-c4a", {f"{P}platform": "kubernetes"}, "platform"),
        ("azure-cobalt", {f"{P}platform": "kubernetes"}, "platform"),
        ("gcp-c4a", {f"{P}kubernetesImage": "example.com/x:1"}, "kubernetesImage"),
        ("aws-c8g", {f"{P}kubernetesImage": "example.com/x:1"}, "kubernetesImage"),
        ("aws-c8g", {f"{P}kubernetesApiCidrs": ["203.0.113.0/24"]}, "kubernetesApiCidrs"),
    ],
)
def test_the_platforms_settings_are_refused_where_there_is_no_such_platform(
    stack: str, overrides: dict[str, Any], setting: str
) -> None:
    refused(stack, overrides, setting)


def test_the_controller_is_refused_unless_its_manifest_and_image_are_pinned() -> None:
    """Until the program records them, a stack names the manifest's sha256 and the image's
    digest itself; without them, or with bytes of another sha256, nothing is created."""
    for setting, words in (
        ("kubernetesControllerSha256", "sha256sum"),
        ("kubernetesControllerImage", "imagetools inspect registry.k8s.io/lws/lws:v0.10.0"),
    ):
        mocks = RecordingMocks()
        with pytest.raises(pulumi.RunError, match=f"{setting}: is required") as error:
            deploy(STACK, {f"{P}{setting}": None}, mocks)
        assert words in str(error.value)
        assert mocks.resources == []
    mocks = RecordingMocks()
    with pytest.raises(pulumi.RunError, match="has sha256 ab3200df") as error:
        deploy(STACK, {f"{P}kubernetesControllerSha256": "0" * 64}, mocks)
    assert "not " + "0" * 64 in str(error.value)
    assert mocks.resources == []


def test_a_manifest_that_cannot_be_fetched_stops_the_stack_before_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreachable(url: str) -> bytes:
        raise urllib.error.URLError("no route to host")

    monkeypatch.setattr(controller, "download", unreachable)
    monkeypatch.setattr(controller, "manifests_dir", lambda: tmp_path)  # nothing kept yet
    mocks = RecordingMocks()
    with pytest.raises(pulumi.RunError, match=r"could not be fetched .*no route to host"):
        deploy(STACK, None, mocks)
    assert mocks.resources == []


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("kubernetesControllerImage", "registry.k8s.io/lws/lws:v0.10.0"),
        ("kubernetesControllerSha256", "AB" * 32),
        ("kubernetesControllerSha256", "ab" * 31),
    ],
)
def test_a_controller_pin_that_pins_nothing_is_refused_by_name(setting: str, value: str) -> None:
    refused(STACK, {f"{P}{setting}": value}, setting)


def test_a_refused_stack_creates_nothing() -> None:
    mocks = RecordingMocks()
    with pytest.raises(Exception, match="stopAfterHours"):
        deploy(STACK, {f"{P}stopAfterHours": 8}, mocks)
    assert mocks.resources == []


def test_kubectl_and_pulumi_use_the_aws_providers_profile() -> None:
    """The stack's objects are applied with a token the AWS CLI takes on each use, as the AWS
    provider's own profile; connectCommand's kubeconfig names it too."""
    [provider] = deployed(STACK).of_type("pulumi:providers:kubernetes")
    token = json.loads(provider.inputs["kubeconfig"])["users"][0]["user"]["exec"]
    assert token["command"] == "aws" and token["args"][:2] == ["eks", "get-token"]
    assert "env" not in token
    d = deploy(STACK, {"aws:profile": "prod"})
    [provider] = d.of_type("pulumi:providers:kubernetes")
    token = json.loads(provider.inputs["kubeconfig"])["users"][0]["user"]["exec"]
    assert token["env"] == [{"name": "AWS_PROFILE", "value": "prod"}]
    assert "--name llama-rpc-cluster-eks --profile prod && " in d.outputs[outputs.CONNECT_COMMAND]


# --- every pod fits the node groups beside what the platform runs --------------------------------

SMALL_MODEL = {f"{P}model": stack_values("aws-small")[f"{P}model"]}


def test_a_node_type_too_small_for_its_pod_is_refused_before_anything_is_made() -> None:
    """c8g.large nodes: the LeaderWorkerSet controller's two CPUs, CoreDNS, the DaemonSets and
    the kubelet's reserve leave no whole CPU for a pod."""
    mocks = RecordingMocks()
    with pytest.raises(Exception, match="instanceType") as error:
        deploy(STACK, {f"{P}instanceType": "c8g.large", **SMALL_MODEL}, mocks)
    assert "LeaderWorkerSet controller" in str(error.value)
    assert mocks.resources == []


def test_the_shipped_pods_leave_room_for_the_platforms_and_a_greedy_one_is_named() -> None:
    config = parsed_config(STACK)
    rendered = eks.workloads(config)
    assert eks.unschedulable(config, rendered) == []
    # As the pods asked before: every CPU of the node but one.
    for obj in rendered:
        if obj["kind"] == "LeaderWorkerSet":
            template = obj["spec"]["leaderWorkerTemplate"]
            for part in ("leaderTemplate", "workerTemplate"):
                [container] = template[part]["spec"]["containers"]
                container["resources"]["requests"]["cpu"] = str(config.instance_type.vcpus - 1)
    [problem, *_] = eks.unschedulable(config, rendered)
    assert "fits no node" in problem and "c8g.16xlarge" in problem


def test_the_namespace_admits_only_restricted_pods_which_every_rendered_pod_is() -> None:
    """Pod Security admission enforces "restricted" on the stack's namespace: a pod the render
    changed to run as root, say, would be refused by the API server, not run."""
    d = deployed(STACK)
    [namespace] = d.of_type("kubernetes:core/v1:Namespace")
    labels = namespace.inputs["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    for obj in applied(d):
        templates = []
        if obj["kind"] == "LeaderWorkerSet":
            template = obj["spec"]["leaderWorkerTemplate"]
            templates = [template["leaderTemplate"], template["workerTemplate"]]
        elif obj["kind"] == "Deployment":
            templates = [obj["spec"]["template"]]
        for pod in templates:
            assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
