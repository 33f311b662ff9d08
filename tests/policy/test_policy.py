"""The policy pack (policy/): every stack preset passes every policy under mocks; each invariant,
broken on a copy of what the program registers, is reported naming the resource and the fix;
and the pack itself, run by the real pulumi-policy SDK in its own environment, answers the
engine's analyzer calls as `pulumi preview --policy-pack policy/` would make them."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.core import limits as types
from infra.local.source import cache_dir
from infra.stack.kube import objects as kube
from policy import rules
from tests.conftest import REPO, unavailable
from tests.pulumi_mocks import (
    API_CIDRS,
    BASTION,
    CLOUD_STACKS,
    GUARDED,
    HOST_ENCRYPTION,
    KUBERNETES_API_CIDRS,
    NO_KEY,
    REPLICAS,
    Deployment,
    azure_asg_id,
    cloud_of,
    deploy,
    deployed,
    deployment,
    parsed_config,
    stack_config,
    stack_names,
)

POLICY = REPO / "policy"
PROJECT = "llama-rpc-cluster"
RPC_PORT = rules.DEFAULT_RPC_PORT
METRICS = "metrics-only-from-main"
K8S_RPC = "k8s-rpc-only-from-leader"
GRANTS = "identity-grants-deallocate-only"
ENI = "eks-nodes-hold-no-eni-rights"
STACK_POLICIES = ("rpc-only-from-main", METRICS, K8S_RPC, GRANTS, ENI)
POLICIES = [*rules.RESOURCE_VALIDATORS, *STACK_POLICIES]
# The application security groups' ids, as the mocks give them (Azure's form).
ASG_MAIN = azure_asg_id(f"{PROJECT}-rg", f"{PROJECT}-main-asg")
ASG_WORKER = azure_asg_id(f"{PROJECT}-rg", f"{PROJECT}-worker-asg")


def kubernetes(stack: str) -> bool:
    """Whether a preset's nodes are pods (platform kubernetes: an EKS cluster), not VMs."""
    return stack_config(stack).get(f"{PROJECT}:platform") == "kubernetes"


def preset(cloud: str) -> str:
    """The cloud's preset whose nodes are VMs that the shared variants are deployed on."""
    return CLOUD_STACKS[cloud]


def urn(stack: str, typ: str, name: str) -> str:
    return f"urn:pulumi:{stack}::{PROJECT}::{typ}::{name}"


def resources(stack: str, deployment: Deployment | None = None) -> list[rules.Resource]:
    """What the program registers for a stack, as the stack check sees it: each resource's
    inputs (copied: the deployments are shared), URN, and the id the mocks give it."""
    deployment = deployment or deployed(stack)
    return [
        rules.Resource(
            type=r.typ,
            name=r.name,
            props=_seen(dict(r.inputs), deployment.states[r.typ, r.name][1]),
            urn=urn(stack, r.typ, r.name),
            id=deployment.states[r.typ, r.name][0],
        )
        for r in deployment.resources
    ]


def _seen(inputs: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    """A resource's properties as the stack check sees a made resource: its outputs, here its
    inputs and the identity the cloud gave it (an Azure VM's principal, which its grants name;
    an IAM role's name and ARN, which its attachments and node groups name)."""
    props = copy.deepcopy(inputs)
    if isinstance(state.get("identity"), dict) and "principalId" in state["identity"]:
        props["identity"] = copy.deepcopy(state["identity"])
    if str(state.get("arn", "")).startswith("arn:aws:iam::"):
        props.setdefault("name", state.get("name"))
        props.setdefault("arn", state["arn"])
    return props


def violations(
    stack: str, found: list[rules.Resource], port: int = RPC_PORT
) -> dict[str, list[rules.Violation]]:
    return rules.check_stack(found, port, {"project": PROJECT, "stack": stack})


def messages(
    stack: str,
    found: list[rules.Resource],
    port: int = RPC_PORT,
    baseline: list[rules.Resource] | None = None,
) -> dict[str, list[str]]:
    """The violations of ``found`` beyond those of the preset as the program makes it (which
    test_every_preset_passes_every_policy answers for), by policy."""
    before = violations(stack, resources(stack) if baseline is None else baseline, port)
    after = violations(stack, found, port)
    return {k: [v.message for v in vs if v not in before[k]] for k, vs in after.items()}


def changed(
    found: list[rules.Resource], name: str, change: Callable[[dict[str, Any]], object]
) -> list[rules.Resource]:
    """The stack with one resource's properties changed (on a copy)."""
    assert any(r.name == name for r in found), f"no resource {name}"
    out = []
    for r in found:
        if r.name != name:
            out.append(r)
            continue
        props = copy.deepcopy(dict(r.props))
        change(props)
        out.append(rules.Resource(r.type, r.name, props, r.urn, r.id, r.property_dependencies))
    return out


def added(
    stack: str, found: list[rules.Resource], typ: str, name: str, props: dict[str, Any]
) -> list[rules.Resource]:
    return [*found, rules.Resource(typ, name, props, urn(stack, typ, name), f"{name}-id")]


def only(
    result: dict[str, list[str]], policy: str, name: str, *fix: str, also: tuple[str, ...] = ()
) -> list[str]:
    """The violations, all of one policy (and of each of ``also``, which must report too: a
    rule that opens every port opens the metrics port as well); each names the resource, and
    one names the fix."""
    assert result[policy], f"{policy} reported nothing"
    for other in also:
        assert any(name in m for m in result[other]), (other, result[other])
    others = {k: v for k, v in result.items() if k not in (policy, *also) and v}
    assert not others, others
    assert all(name in m for m in result[policy]), result[policy]
    assert any(all(word in m for word in fix) for m in result[policy]), result[policy]
    return result[policy]


def reported(result: dict[str, list[str]], policy: str, name: str, *fix: str) -> None:
    assert any(name in m and all(w in m for w in fix) for m in result[policy]), result


# --- every preset passes ----------------------------------------------------------------------


@pytest.mark.parametrize("stack", stack_names())
def test_every_preset_passes_every_policy(stack: str) -> None:
    found = resources(stack)
    result = violations(stack, found)
    assert sorted(result) == sorted(POLICIES)
    problems = [f"{policy}: {v.message}" for policy, found_ in result.items() for v in found_]
    assert not problems, "\n".join(problems)
    # ... and not because nothing applied: each preset has nodes and firewall rules (on
    # Kubernetes: node groups from launch templates, and the pods' network policies).
    if kubernetes(stack):
        nodes = {rules.AWS_EKS_NODE_GROUP, rules.AWS_LAUNCH_TEMPLATE}
        firewall = {rules.K8S_NETWORK_POLICY, rules.K8S_LEADER_WORKER_SET, rules.AWS_EKS_CLUSTER}
        assert {r.type for r in found} >= nodes | firewall
    else:
        nodes = {rules.AWS_INSTANCE, rules.GCP_INSTANCE, rules.AZURE_VM}
        firewall = {rules.AWS_INGRESS_RULE, rules.GCP_FIREWALL, rules.AZURE_NSG}
        assert any(r.type in nodes for r in found)
        assert any(r.type in firewall for r in found)


def test_a_preset_on_another_rpc_port_passes_on_that_port() -> None:
    stack = preset("aws")
    d = deploy(stack, {f"{PROJECT}:rpcPort": 50060})
    found = resources(stack, d)
    assert not any(violations(stack, found, 50060).values())
    # Its RPC rule from a CIDR is caught on port 50060, and is nothing to port 50052.
    name = f"{PROJECT}-worker-rpc-from-main"
    bad = changed(
        found, name, lambda p: p.update(referencedSecurityGroupId=None, cidrIpv4="10.42.0.10/32")
    )
    only(
        messages(stack, bad, 50060, baseline=found),
        "rpc-only-from-main",
        name,
        "50060",
        "referenced_security_group_id",
    )
    assert not messages(stack, bad, 50052, baseline=found)["rpc-only-from-main"]


@pytest.mark.parametrize(
    ("cloud", "options"),
    [
        ("aws", API_CIDRS),
        ("aws", {**REPLICAS, **API_CIDRS}),
        ("gcp", API_CIDRS),
        ("gcp", {**REPLICAS, **API_CIDRS}),
        ("azure", {**API_CIDRS, "bastion": True}),
        ("azure", BASTION),
        ("azure", HOST_ENCRYPTION),
    ],
)
def test_the_programs_options_stay_within_the_policy(cloud: str, options: dict[str, Any]) -> None:
    stack = preset(cloud)
    found = resources(stack, deployment(stack, **options))
    assert not any(violations(stack, found).values()), violations(stack, found)


# --- 1. no ingress from the internet ----------------------------------------------------------


@pytest.mark.parametrize(
    "sources",
    [
        {"cidrIpv4": "0.0.0.0/0"},
        {"cidrIpv6": "::/0"},
        {"cidrIpv4": "0.0.0.0/1"},
        {"cidrIpv4": "128.0.0.0/1"},
        {"cidrIpv4": "52.0.0.0/8"},
        {"cidrIpv6": "2001:db8::/32"},
    ],
)
def test_aws_ingress_from_the_internet_is_reported(sources: dict[str, str]) -> None:
    stack = preset("aws")
    name = "hand-edited-api"
    rule = {
        "securityGroupId": f"{PROJECT}-main-sg-id",
        "ipProtocol": "tcp",
        "fromPort": 8080,
        "toPort": 8080,
        **sources,
    }
    found = added(stack, resources(stack), rules.AWS_INGRESS_RULE, name, rule)
    only(messages(stack, found), "no-internet-ingress", name, *sources.values(), "remove")


def test_the_internet_split_in_halves_is_still_the_internet() -> None:
    stack = preset("aws")
    group = f"{PROJECT}-main-sg"
    split = ["0.0.0.0/1", "128.0.0.0/1"]
    inline = [{"protocol": "tcp", "fromPort": 8080, "toPort": 8080, "cidrBlocks": split}]
    found = changed(resources(stack), group, lambda p: p.update(ingress=inline))
    only(messages(stack, found), "no-internet-ingress", group, "0.0.0.0/1, 128.0.0.0/1")
    rule = {
        "type": "ingress",
        "securityGroupId": f"{group}-id",
        "protocol": "tcp",
        "fromPort": 8080,
        "toPort": 8080,
        "cidrBlocks": split,
    }
    found = added(stack, resources(stack), rules.AWS_SECURITY_GROUP_RULE, "halves", rule)
    only(messages(stack, found), "no-internet-ingress", "halves", "0.0.0.0/1, 128.0.0.0/1")


def test_many_narrow_public_ranges_in_one_rule_count_together() -> None:
    assert rules.internet_sources(["35.235.240.0/20", "198.51.100.0/24"]) == []
    assert rules.internet_sources(["52.1.0.0/24"]) == []  # a /24 is the widest public source
    assert rules.internet_sources(["52.1.0.0/25", "52.1.0.128/25"]) == []  # one /24 together
    pieces = ["52.1.0.0/25", "52.1.0.128/25", "52.2.0.0/25"]
    assert rules.internet_sources(pieces) == pieces
    # Private space is never the internet, however wide; Python's is_private is not the test.
    assert rules.internet_sources(["10.0.0.0/8", "172.16.0.0/12", "100.64.0.0/10"]) == []
    assert rules.internet_sources(["fc00::/7"]) == []
    assert rules.internet_sources(["0.0.0.0/1"]) == ["0.0.0.0/1"]


def test_gcp_firewall_open_to_the_internet_on_the_rpc_port_is_reported() -> None:
    stack = preset("gcp")
    name = f"{PROJECT}-worker-rpc-from-main"
    found = changed(resources(stack), name, lambda p: p.update(sourceRanges=["0.0.0.0/0"]))
    result = messages(stack, found)
    reported(result, "no-internet-ingress", name, "0.0.0.0/0", "remove")
    reported(result, "rpc-only-from-main", name, "0.0.0.0/0", "source_tags=[<main tag>]")
    assert {k for k, v in result.items() if v} == {"no-internet-ingress", "rpc-only-from-main"}


def test_gcp_firewall_without_a_source_admits_everyone() -> None:
    stack = preset("gcp")
    name = f"{PROJECT}-main-api-from-iap"
    found = changed(resources(stack), name, lambda p: p.pop("sourceRanges"))
    only(messages(stack, found), "no-internet-ingress", name, "0.0.0.0/0", "source_tags")


def test_gcp_iap_range_and_deny_rules_are_not_the_internet() -> None:
    stack = preset("gcp")
    deny = {"direction": "INGRESS", "denies": [{"protocol": "all"}], "sourceRanges": ["0.0.0.0/0"]}
    egress = {
        "direction": "EGRESS",
        "allows": [{"protocol": "tcp", "ports": ["443"]}],
        "destinationRanges": ["0.0.0.0/0"],
    }
    found = added(stack, resources(stack), rules.GCP_FIREWALL, "deny-all", deny)
    found = added(stack, found, rules.GCP_FIREWALL, "egress-https", egress)
    assert messages(stack, found) == {policy: [] for policy in POLICIES}


@pytest.mark.parametrize(
    "source",
    [
        {"sourceAddressPrefix": "*"},
        {"sourceAddressPrefix": "Internet"},
        {"sourceAddressPrefix": "0.0.0.0/0"},
        {"sourceAddressPrefix": "AzureCloud"},
        {"sourceAddressPrefixes": ["0.0.0.0/1", "128.0.0.0/1"]},
    ],
)
def test_azure_inbound_allow_from_the_internet_is_reported(source: dict[str, Any]) -> None:
    stack = preset("azure")
    name = "hand-edited-api"
    rule = {
        "direction": "Inbound",
        "access": "Allow",
        "protocol": "Tcp",
        "priority": 120,
        "destinationPortRange": "8080",
        "destinationApplicationSecurityGroups": [{"id": ASG_MAIN}],
        **source,
    }
    found = added(stack, resources(stack), rules.AZURE_SECURITY_RULE, name, rule)
    shown = source.get("sourceAddressPrefix") or ", ".join(source["sourceAddressPrefixes"])
    only(messages(stack, found), "no-internet-ingress", name, shown, "remove")


def test_azure_nsg_inline_rule_from_anywhere_is_reported() -> None:
    stack = preset("azure")
    name = f"{PROJECT}-nsg"
    inline = [
        {
            "name": "ssh-from-anywhere",
            "direction": "Inbound",
            "access": "Allow",
            "protocol": "Tcp",
            "sourceAddressPrefix": "*",
            "destinationPortRange": "22",
        }
    ]
    found = changed(resources(stack), name, lambda p: p["securityRules"].extend(inline))
    only(messages(stack, found), "no-internet-ingress", name, "ssh-from-anywhere", "*")


# --- 2. RPC only from the main node -----------------------------------------------------------

AWS_RPC = f"{PROJECT}-worker-rpc-from-main"


@pytest.mark.parametrize(
    ("change", "shown"),
    [
        ({"referencedSecurityGroupId": None, "cidrIpv4": "10.42.0.10/32"}, "10.42.0.10/32"),
        ({"cidrIpv4": "10.42.0.0/24"}, "10.42.0.0/24"),
        ({"referencedSecurityGroupId": f"{PROJECT}-worker-sg-id"}, f"{PROJECT}-worker-sg-id"),
        ({"referencedSecurityGroupId": "sg-0123456789abcdef0"}, "sg-0123456789abcdef0"),
        ({"referencedSecurityGroupId": None, "prefixListId": "pl-12345678"}, "pl-12345678"),
    ],
)
def test_aws_rpc_rule_from_anything_but_the_main_group_is_reported(
    change: dict[str, Any], shown: str
) -> None:
    stack = preset("aws")
    found = changed(resources(stack), AWS_RPC, lambda p: p.update(change))
    only(
        messages(stack, found), "rpc-only-from-main", AWS_RPC, shown, "referenced_security_group_id"
    )


@pytest.mark.parametrize(
    "rule",
    [
        {"ipProtocol": "-1", "referencedSecurityGroupId": f"{PROJECT}-worker-sg-id"},
        {"ipProtocol": "tcp", "fromPort": 0, "toPort": 65535, "cidrIpv4": "10.42.0.0/16"},
        {"ipProtocol": "6", "fromPort": 50000, "toPort": 50100, "cidrIpv4": "10.0.0.0/8"},
    ],
)
def test_aws_rules_whose_ports_include_the_rpc_port_count(rule: dict[str, Any]) -> None:
    stack = preset("aws")
    name = "wide-ports"
    props = {"securityGroupId": f"{PROJECT}-worker-sg-id", **rule}
    found = added(stack, resources(stack), rules.AWS_INGRESS_RULE, name, props)
    every = rule["ipProtocol"] == "-1" or rule["fromPort"] <= rules.METRICS_PORT <= rule["toPort"]
    also = (METRICS,) if every else ()
    only(messages(stack, found), "rpc-only-from-main", name, f"RPC port {RPC_PORT}", also=also)
    # The same sources on the API port only are none of this policy's business.
    props |= {"ipProtocol": "tcp", "fromPort": 8080, "toPort": 8080}
    found = added(stack, resources(stack), rules.AWS_INGRESS_RULE, name, props)
    assert messages(stack, found) == {policy: [] for policy in POLICIES}


def test_aws_inline_and_self_rules_on_the_rpc_port_are_reported() -> None:
    stack = preset("aws")
    group = f"{PROJECT}-worker-sg"
    inline = [{"protocol": "tcp", "fromPort": RPC_PORT, "toPort": RPC_PORT, "self": True}]
    found = changed(resources(stack), group, lambda p: p.update(ingress=inline))
    only(
        messages(stack, found), "rpc-only-from-main", group, "self", "referenced_security_group_id"
    )
    inline = [
        {
            "protocol": "tcp",
            "fromPort": RPC_PORT,
            "toPort": RPC_PORT,
            "securityGroups": [f"{PROJECT}-main-sg-id"],
        }
    ]
    found = changed(resources(stack), group, lambda p: p.update(ingress=inline))
    assert messages(stack, found) == {policy: [] for policy in POLICIES}
    self_rule = {
        "type": "ingress",
        "securityGroupId": f"{group}-id",
        "protocol": "-1",
        "fromPort": 0,
        "toPort": 0,
        "self": True,
    }
    found = added(stack, resources(stack), rules.AWS_SECURITY_GROUP_RULE, "self-all", self_rule)
    only(
        messages(stack, found),
        "rpc-only-from-main",
        "self-all",
        f"{group}-id",
        also=("metrics-only-from-main",),
    )


def test_aws_a_worker_carrying_the_main_group_is_reported() -> None:
    stack = preset("aws")
    name = f"{PROJECT}-worker-1"
    found = changed(
        resources(stack),
        name,
        lambda p: p["vpcSecurityGroupIds"].append(f"{PROJECT}-main-sg-id"),
    )
    only(
        messages(stack, found),
        "rpc-only-from-main",
        name,
        "main node's security group",
        "workers' group",
    )


GCP_RPC = f"{PROJECT}-worker-rpc-from-main"


@pytest.mark.parametrize(
    ("change", "shown"),
    [
        ({"sourceTags": [f"{PROJECT}-worker"]}, f"{PROJECT}-worker"),
        ({"sourceRanges": ["10.42.0.10/32"]}, "10.42.0.10/32"),
        ({"sourceTags": None, "sourceServiceAccounts": ["x@p.iam.gserviceaccount.com"]}, "x@p"),
        ({"allows": [{"protocol": "all"}], "sourceRanges": ["10.42.0.0/24"]}, "10.42.0.0/24"),
    ],
)
def test_gcp_rpc_rule_from_anything_but_the_main_tag_is_reported(
    change: dict[str, Any], shown: str
) -> None:
    stack = preset("gcp")
    found = changed(resources(stack), GCP_RPC, lambda p: p.update(change))
    every = change.get("allows") == [{"protocol": "all"}]
    also = ("metrics-only-from-main",) if every else ()
    only(
        messages(stack, found),
        "rpc-only-from-main",
        GCP_RPC,
        shown,
        "source_tags=[<main tag>]",
        also=also,
    )


def test_gcp_a_worker_carrying_the_main_tag_is_reported() -> None:
    stack = preset("gcp")
    name = f"{PROJECT}-worker-2"
    found = changed(resources(stack), name, lambda p: p["tags"].append(f"{PROJECT}-main"))
    only(messages(stack, found), "rpc-only-from-main", name, f"{PROJECT}-main", "remove the tag")


AZURE_NSG = f"{PROJECT}-nsg"
AZURE_RPC = "g1-allow-rpc-from-main"  # a rule the NSG declares


def nsg_rule(name: str, change: Callable[[dict[str, Any]], object]) -> Callable[[dict], None]:
    """A change to one of the NSG's own rules."""

    def apply(props: dict[str, Any]) -> None:
        [rule] = [rule for rule in props["securityRules"] if rule["name"] == name]
        change(rule)

    return apply


@pytest.mark.parametrize(
    ("change", "shown"),
    [
        (
            {"sourceApplicationSecurityGroups": None, "sourceAddressPrefix": "10.42.0.10"},
            "10.42.0.10",
        ),
        (
            {"sourceApplicationSecurityGroups": None, "sourceAddressPrefix": "VirtualNetwork"},
            "VirtualNetwork",
        ),
        (
            {"sourceApplicationSecurityGroups": [{"id": ASG_WORKER}]},
            ASG_WORKER,
        ),
        (
            {
                "destinationPortRange": "*",
                "sourceApplicationSecurityGroups": None,
                "sourceAddressPrefix": "10.0.0.0/8",
            },
            "10.0.0.0/8",
        ),
    ],
)
def test_azure_rpc_rule_from_anything_but_the_main_asg_is_reported(
    change: dict[str, Any], shown: str
) -> None:
    stack = preset("azure")
    found = changed(resources(stack), AZURE_NSG, nsg_rule(AZURE_RPC, lambda r: r.update(change)))
    # A rule for every port admits the metrics port from the same sources.
    every_port = change.get("destinationPortRange") == "*"
    only(
        messages(stack, found),
        "rpc-only-from-main",
        AZURE_RPC,
        shown,
        "source_application_security_groups",
        also=(METRICS,) if every_port else (),
    )


def test_azure_a_worker_nic_in_the_main_asg_is_reported() -> None:
    stack = preset("azure")
    name = f"{PROJECT}-worker-1-nic"
    main_asg = {"id": ASG_MAIN}
    found = changed(
        resources(stack),
        name,
        lambda p: p["ipConfigurations"][0]["applicationSecurityGroups"].append(main_asg),
    )
    only(
        messages(stack, found),
        "rpc-only-from-main",
        name,
        "application security group",
        "workers' group",
    )


def test_a_preview_traces_unknown_group_ids_through_dependencies() -> None:
    """In a first preview no group has an id yet: the RPC rule's source is unknown, and the
    property's dependencies say which group it came from."""
    stack = preset("aws")
    found = [
        rules.Resource(r.type, r.name, r.props, r.urn, None, r.property_dependencies)
        for r in resources(stack)
    ]
    rpc = next(r for r in found if r.name == AWS_RPC)
    unknown = {**rpc.props, "referencedSecurityGroupId": rules.UNKNOWN}

    def with_deps(group: str | None) -> list[rules.Resource]:
        deps = {"referencedSecurityGroupId": [urn(stack, rules.AWS_SECURITY_GROUP, group)]}
        rule = rules.Resource(rpc.type, rpc.name, unknown, rpc.urn, None, deps if group else {})
        return [rule if r is rpc else r for r in found]

    assert not rules.rpc_only_from_main(with_deps(f"{PROJECT}-main-sg"))
    [worker] = rules.rpc_only_from_main(with_deps(f"{PROJECT}-worker-sg"))
    assert worker.urn == rpc.urn and "not the main node's" in worker.message
    [untraced] = rules.rpc_only_from_main(with_deps(None))
    assert f"cannot be traced to the main node's ({PROJECT}-main-sg)" in untraced.message
    # Without ids and without dependencies, a known id of no group here is not the main's.
    known = rules.Resource(
        rpc.type, rpc.name, {**rpc.props, "referencedSecurityGroupId": "sg-1"}, rpc.urn
    )
    assert rules.rpc_only_from_main([known if r is rpc else r for r in found])


# --- 3. no public addresses -------------------------------------------------------------------


def test_aws_public_addresses_are_reported() -> None:
    stack = preset("aws")
    name = f"{PROJECT}-main"
    for change in (
        lambda p: p.update(associatePublicIpAddress=True),
        lambda p: p.pop("associatePublicIpAddress"),
    ):
        found = changed(resources(stack), name, change)
        only(
            messages(stack, found),
            "no-public-node-addresses",
            name,
            "associate_public_ip_address=False",
        )
    found = added(stack, resources(stack), rules.AWS_EIP, "main-ip", {"instance": f"{name}-id"})
    only(messages(stack, found), "no-public-node-addresses", "main-ip", "remove the attachment")
    association = {"instanceId": f"{name}-id", "allocationId": "eipalloc-1"}
    found = added(
        stack, resources(stack), "aws:ec2/eipAssociation:EipAssociation", "assoc", association
    )
    only(messages(stack, found), "no-public-node-addresses", "assoc", "remove the attachment")


@pytest.mark.parametrize("key", ["accessConfigs", "ipv6AccessConfigs"])
def test_gcp_external_addresses_are_reported(key: str) -> None:
    stack = preset("gcp")
    name = f"{PROJECT}-worker-1"
    found = changed(resources(stack), name, lambda p: p["networkInterfaces"][0].update({key: [{}]}))
    only(messages(stack, found), "no-public-node-addresses", name, f"remove {key}")


def test_azure_public_addresses_are_reported() -> None:
    stack = preset("azure")
    nic = f"{PROJECT}-main-nic"
    public = {
        "id": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/publicIPAddresses/x"
    }
    found = changed(
        resources(stack), nic, lambda p: p["ipConfigurations"][0].update(publicIPAddress=public)
    )
    only(messages(stack, found), "no-public-node-addresses", nic, "publicIPAddress", "remove it")
    vm = f"{PROJECT}-main"
    configs = [
        {
            "name": "nic",
            "ipConfigurations": [{"name": "ip", "publicIPAddressConfiguration": {"name": "pip"}}],
        }
    ]
    found = changed(
        resources(stack),
        vm,
        lambda p: p["networkProfile"].update(networkInterfaceConfigurations=configs),
    )
    only(messages(stack, found), "no-public-node-addresses", vm, "publicIPAddressConfiguration")


# --- 7. internal load balancers ----------------------------------------------------------------


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_replicas_behind_a_balancer_pass_every_policy(cloud: str) -> None:
    stack = preset(cloud)
    found = resources(stack, deployment(stack, **REPLICAS))
    result = violations(stack, found)
    problems = [f"{policy}: {v.message}" for policy, found_ in result.items() for v in found_]
    assert not problems, "\n".join(problems)
    # ... and not because nothing applied: the balancer node is among the resources checked,
    # by the node policies as every node is.
    assert f"{PROJECT}-balancer" in {r.name for r in found}


def test_public_balancers_are_reported() -> None:
    stack = preset("aws")
    for props in ({"internal": False}, {}):
        found = added(stack, resources(stack), rules.AWS_LOAD_BALANCER, "lb", props)
        only(messages(stack, found), "internal-load-balancers", "lb", "internal=True")
    assert not rules.internal_balancers(rules.AWS_LOAD_BALANCER, {"internal": True}, "lb")
    stack = preset("gcp")
    for props in ({"loadBalancingScheme": "EXTERNAL"}, {}):
        found = added(stack, resources(stack), rules.GCP_FORWARDING_RULE, "rule", props)
        only(messages(stack, found), "internal-load-balancers", "rule", '"INTERNAL"')
    internal = {"loadBalancingScheme": "INTERNAL"}
    assert not rules.internal_balancers(rules.GCP_FORWARDING_RULE, internal, "rule")
    stack = preset("azure")
    frontend = {"name": "f", "publicIPAddress": {"id": "/subscriptions/s/publicIPAddresses/x"}}
    props = {"frontendIPConfigurations": [frontend]}
    found = added(stack, resources(stack), rules.AZURE_LOAD_BALANCER, "alb", props)
    only(messages(stack, found), "internal-load-balancers", "alb", "private address")
    private = {"frontendIPConfigurations": [{"name": "f", "privateIPAddress": "10.42.0.5"}]}
    assert not rules.internal_balancers(rules.AZURE_LOAD_BALANCER, private, "alb")


# --- 4. IMDSv2 --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        lambda p: p["metadataOptions"].update(httpTokens="optional"),
        lambda p: p["metadataOptions"].pop("httpTokens"),
        lambda p: p.pop("metadataOptions"),
    ],
)
def test_aws_instances_without_imdsv2_are_reported(
    change: Callable[[dict[str, Any]], object],
) -> None:
    stack = preset("aws")
    name = f"{PROJECT}-worker-1"
    found = changed(resources(stack), name, change)
    only(messages(stack, found), "aws-imdsv2-required", name, '"http_tokens": "required"')


# --- 5. encrypted disks -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "fix"),
    [
        (lambda p: p["rootBlockDevice"].update(encrypted=False), "root_block_device"),
        (lambda p: p["rootBlockDevice"].pop("encrypted"), "root_block_device"),
        (lambda p: p.pop("rootBlockDevice"), "root_block_device"),
        (
            lambda p: p.update(ebsBlockDevices=[{"deviceName": "/dev/sdf", "volumeSize": 100}]),
            "every EBS",
        ),
    ],
)
def test_aws_unencrypted_disks_are_reported(
    change: Callable[[dict[str, Any]], object], fix: str
) -> None:
    stack = preset("aws")
    name = f"{PROJECT}-main"
    found = changed(resources(stack), name, change)
    only(messages(stack, found), "encrypted-node-disks", name, fix)
    volume = {"availabilityZone": "us-east-1a", "size": 100, "encrypted": False}
    found = added(stack, resources(stack), rules.AWS_EBS_VOLUME, "data", volume)
    only(messages(stack, found), "encrypted-node-disks", "data", "encrypted=True")


def test_azure_unmanaged_disks_are_reported() -> None:
    stack = preset("azure")
    name = f"{PROJECT}-worker-2"
    vhd = {"uri": "https://account.blob.core.windows.net/vhds/os.vhd"}

    def unmanaged(p: dict[str, Any]) -> None:
        p["storageProfile"]["osDisk"].pop("managedDisk")
        p["storageProfile"]["osDisk"]["vhd"] = vhd

    found = changed(resources(stack), name, unmanaged)
    only(messages(stack, found), "encrypted-node-disks", name, "osDisk", "managed disk")


# --- 6. stack tags ----------------------------------------------------------------------------


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
@pytest.mark.parametrize("tag", ["project", "stack"])
def test_a_node_without_the_stack_tags_is_reported(cloud: str, tag: str) -> None:
    stack = preset(cloud)
    key = "labels" if cloud == "gcp" else "tags"
    name = f"{PROJECT}-main"
    found = changed(resources(stack), name, lambda p: p[key].pop(tag))
    only(messages(stack, found), "nodes-carry-stack-tags", name, f"{key}[{tag!r}]", "add")
    found = changed(resources(stack), name, lambda p: p[key].update({tag: "someone-else"}))
    only(messages(stack, found), "nodes-carry-stack-tags", name, "'someone-else'", "set it to")


# --- what the checks take, and what they leave to the engine -----------------------------------


def test_resource_checks_never_report_a_value_a_preview_does_not_know() -> None:
    unknown = rules.UNKNOWN
    checks = [
        (
            rules.AWS_INSTANCE,
            {
                "associatePublicIpAddress": unknown,
                "metadataOptions": unknown,
                "rootBlockDevice": unknown,
                "tags": unknown,
            },
        ),
        (
            rules.AWS_INSTANCE,
            {
                "associatePublicIpAddress": False,
                "metadataOptions": {"httpTokens": unknown, "httpPutResponseHopLimit": unknown},
                "rootBlockDevice": {"encrypted": unknown},
                "ebsBlockDevices": [{"encrypted": unknown}],
                "tags": {"project": unknown, "stack": unknown},
            },
        ),
        (rules.AWS_INGRESS_RULE, {"cidrIpv4": unknown}),
        (rules.GCP_FIREWALL, {"allows": [{"protocol": "tcp"}], "sourceRanges": unknown}),
        (
            rules.GCP_INSTANCE,
            {"networkInterfaces": [{"accessConfigs": unknown}], "labels": unknown},
        ),
        (
            rules.AZURE_SECURITY_RULE,
            {"direction": "Inbound", "access": "Allow", "sourceAddressPrefix": unknown},
        ),
        (rules.AWS_EKS_CLUSTER, {"vpcConfig": unknown}),
        (
            rules.AWS_EKS_CLUSTER,
            {
                "vpcConfig": {
                    "endpointPrivateAccess": unknown,
                    "endpointPublicAccess": unknown,
                    "publicAccessCidrs": ["0.0.0.0/0"],
                }
            },
        ),
        (
            rules.AWS_EKS_CLUSTER,
            {"vpcConfig": {"endpointPrivateAccess": True, "publicAccessCidrs": unknown}},
        ),
        (
            rules.AWS_EKS_CLUSTER,
            {"vpcConfig": {"endpointPrivateAccess": True, "publicAccessCidrs": [unknown]}},
        ),
        (rules.AWS_EKS_NODE_GROUP, {"launchTemplate": unknown, "remoteAccess": unknown}),
        (rules.AWS_EKS_NODE_GROUP, {"launchTemplate": {"id": unknown, "version": unknown}}),
        (rules.K8S_SERVICE, {"spec": unknown}),
        (rules.K8S_SERVICE, {"spec": {"type": unknown, "externalIPs": unknown}}),
    ]
    for typ, props in checks:
        for policy, validator in rules.RESOURCE_VALIDATORS.items():
            assert validator(typ, props, "x") == [], (policy, typ, props)


def test_azure_versioned_types_are_checked_too() -> None:
    props = {"direction": "Inbound", "access": "Allow", "sourceAddressPrefix": "*"}
    assert rules.no_internet_ingress("azure-native:network/v20240301:SecurityRule", props, "r")


def test_the_rpc_port_comes_from_policy_config_then_stack_config_then_the_default() -> None:
    assert rules.DEFAULT_RPC_PORT == types.RPC_PORT
    assert rules.rpc_port() == types.RPC_PORT
    assert rules.rpc_port(None, "50060") == 50060
    assert rules.rpc_port(50070.0, "50060") == 50070  # policy config numbers arrive as floats
    with pytest.raises(ValueError, match="llama-rpc-cluster:rpcPort is 'http'"):
        rules.rpc_port(None, "http")
    with pytest.raises(ValueError, match="policy config rpcPort is 70000"):
        rules.rpc_port(70000)


def test_the_rules_import_neither_pulumi_nor_pulumi_policy() -> None:
    """They run in the pack's environment and the project's alike."""
    code = (
        "import sys; sys.path.insert(0, 'policy'); import rules; "
        "assert not {m.split('.')[0] for m in sys.modules} & {'pulumi', 'pulumi_policy'}"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


# --- the pack itself, under the real pulumi-policy SDK ----------------------------------------


def policy_python() -> Path:
    """A Python with the pack's requirements.txt (pulumi-policy pins a protobuf the project's
    lock does not share), made once per requirements and kept in the cache."""
    requirements = (POLICY / "requirements.txt").read_bytes()
    key = hashlib.sha256(requirements + sys.version.encode()).hexdigest()[:16]
    venv = cache_dir() / "policy-venv" / key
    python = venv / "bin" / "python"
    if python.exists():
        return python
    uv = shutil.which("uv")
    if uv is None:
        unavailable("uv is not installed (scripts/install-deps installs it)")
    assert uv is not None
    # A directory of this process's own: another test process may be making the same one.
    building = venv.with_name(f"{key}.{os.getpid()}.tmp")
    shutil.rmtree(building, ignore_errors=True)
    steps = [
        [uv, "venv", "--quiet", "--python", sys.executable, str(building)],
        [
            uv,
            "pip",
            "install",
            "--quiet",
            "--python",
            str(building / "bin" / "python"),
            "-r",
            str(POLICY / "requirements.txt"),
        ],
    ]
    for step in steps:
        result = subprocess.run(step, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            unavailable(f"cannot install policy/requirements.txt: {result.stderr.strip()[-500:]}")
    try:
        building.rename(venv)
    except OSError:  # the other process's came first; the same requirements
        shutil.rmtree(building)
    return python


class Pack:
    """The policy pack served as the Pulumi CLI serves it, and an engine-side client."""

    def __init__(self, stack: str, config: dict[str, str]) -> None:
        import grpc
        from pulumi.runtime.proto import analyzer_pb2_grpc

        env = {
            "PATH": os.environ["PATH"],
            "PULUMI_PROJECT": PROJECT,
            "PULUMI_STACK": stack,
            "PULUMI_DRY_RUN": "true",
            "PULUMI_CONFIG": json.dumps(config),
        }
        # What pulumi-language-python runs for a policy pack: `python -u -m pulumi.policy
        # <engine> <pack directory>`, in the pack's directory.
        self.process = subprocess.Popen(
            [str(policy_python()), "-u", "-m", "pulumi.policy", "127.0.0.1:1", str(POLICY)],
            cwd=POLICY,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        stdout, stderr = self.process.stdout, self.process.stderr
        assert stdout is not None and stderr is not None
        # The pack prints the port it serves on, as every plugin does.
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(60)
        if not line or not line[0].strip().isdigit():
            self.close()
            pytest.fail(f"the policy pack did not start: {stderr.read()}")
        self.channel = grpc.insecure_channel(f"127.0.0.1:{line[0].strip()}")
        self.stub = analyzer_pb2_grpc.AnalyzerStub(self.channel)

    def close(self) -> None:
        if hasattr(self, "channel"):
            self.channel.close()
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def pack() -> Iterator[Callable[..., Pack]]:
    started: dict[tuple[str, str], Pack] = {}

    def start(stack: str, config: dict[str, str] | None = None) -> Pack:
        config = config or {f"{PROJECT}:cloud": cloud_of(stack)}
        key = (stack, json.dumps(config, sort_keys=True))
        if key not in started:
            started[key] = Pack(stack, config)
        return started[key]

    yield start
    for running in started.values():
        running.close()


def struct(props: Any) -> Any:
    from google.protobuf import json_format, struct_pb2
    from pulumi.runtime.rpc import UNKNOWN

    def wire(value: Any) -> Any:
        if value is rules.UNKNOWN:
            return UNKNOWN  # how the engine sends a value a preview does not know
        if isinstance(value, dict):
            return {k: wire(v) for k, v in value.items() if v is not None}
        if isinstance(value, list):
            return [wire(v) for v in value]
        return value

    return json_format.ParseDict(wire(dict(props)), struct_pb2.Struct())


def as_engine_sends(found: list[rules.Resource]) -> list[rules.Resource]:
    """The stack as the engine describes it to a policy: no ids, but for each property the
    resources whose outputs it was computed from (here: whose mock id it holds)."""
    urn_of_id = {r.id: r.urn for r in found if r.id}

    def referenced(value: Any) -> Iterator[str]:
        if isinstance(value, str) and value in urn_of_id:
            yield urn_of_id[value]
        elif isinstance(value, dict):
            for item in value.values():
                yield from referenced(item)
        elif isinstance(value, list):
            for item in value:
                yield from referenced(item)

    return [
        rules.Resource(
            r.type,
            r.name,
            r.props,
            r.urn,
            None,
            {
                key: deps
                for key, value in r.props.items()
                if (deps := sorted(set(referenced(value))))
            },
        )
        for r in found
    ]


def analyze(pack: Pack, found: list[rules.Resource]) -> list[Any]:
    """Every resource check, then the stack check, as the engine calls them: the diagnostics."""
    from pulumi.runtime.proto import analyzer_pb2

    diagnostics = []
    for r in found:
        request = analyzer_pb2.AnalyzeRequest(
            type=r.type, properties=struct(r.props), urn=r.urn, name=r.name
        )
        diagnostics += pack.stub.Analyze(request).diagnostics
    stack = analyzer_pb2.AnalyzeStackRequest(
        resources=[
            analyzer_pb2.AnalyzerResource(
                type=r.type,
                properties=struct(r.props),
                urn=r.urn,
                name=r.name,
                propertyDependencies={
                    k: analyzer_pb2.AnalyzerPropertyDependencies(urns=list(v))
                    for k, v in r.property_dependencies.items()
                },
            )
            for r in found
        ]
    )
    return [*diagnostics, *pack.stub.AnalyzeStack(stack).diagnostics]


Report = tuple[str, str, str]


def report(diagnostics: list[Any]) -> list[Report]:
    """Each diagnostic's policy, message (after the policy description the SDK puts first) and
    URN (the engine fills in a resource check's own)."""
    return sorted((d.policyName, d.message.split("\n", 1)[-1], d.urn) for d in diagnostics)


def expected(stack: str, found: list[rules.Resource], port: int = RPC_PORT) -> list[Report]:
    """What the rules say of the same resources, in the same form."""
    result = rules.check_stack(found, port, {"project": PROJECT, "stack": stack})
    return sorted(
        (
            policy,
            v.message,
            v.urn if policy in STACK_POLICIES else "",
        )
        for policy, found_violations in result.items()
        for v in found_violations
    )


def new_reports(
    pack: Pack, before: list[rules.Resource], after: list[rules.Resource]
) -> list[Report]:
    old = set(report(analyze(pack, before)))
    return [r for r in report(analyze(pack, after)) if r not in old]


def test_the_pack_declares_every_policy_mandatory(pack: Callable[..., Pack]) -> None:
    from google.protobuf import empty_pb2
    from pulumi.runtime.proto import analyzer_pb2

    info = pack(preset("aws")).stub.GetAnalyzerInfo(empty_pb2.Empty())
    assert info.name == "llama-rpc-cluster-security"
    assert sorted(p.name for p in info.policies) == sorted(POLICIES)
    assert {p.enforcementLevel for p in info.policies} == {analyzer_pb2.MANDATORY}
    kinds = {p.name: p.policy_type for p in info.policies}
    for policy in STACK_POLICIES:
        assert kinds.pop(policy) == analyzer_pb2.POLICY_TYPE_STACK
    assert set(kinds.values()) == {analyzer_pb2.POLICY_TYPE_RESOURCE}
    pack_file = yaml.safe_load((POLICY / "PulumiPolicy.yaml").read_text())
    assert pack_file["runtime"]["name"] == "python"
    for policy in ("rpc-only-from-main", K8S_RPC):
        rpc = next(p for p in info.policies if p.name == policy)
        assert "rpcPort" in rpc.configSchema.properties
    assert all(p.remediation_steps for p in info.policies)


def engine_view(stack: str, *, first_preview: bool = False) -> list[rules.Resource]:
    """A preset as the engine hands it to the pack; in a first preview, with every id that
    another resource would have given unknown."""
    found = as_engine_sends(resources(stack))
    if not first_preview:
        # A stack that exists: each resource's outputs, which add what the cloud named.
        states = deployed(stack).states
        return [
            rules.Resource(
                r.type,
                r.name,
                {**states[r.type, r.name][1], **r.props},
                r.urn,
                None,
                r.property_dependencies,
            )
            for r in found
        ]
    ids = {r.id for r in resources(stack) if r.id}

    def unknown(value: Any) -> Any:
        if isinstance(value, str) and value in ids:
            return rules.UNKNOWN
        if isinstance(value, dict):
            return {k: unknown(v) for k, v in value.items()}
        if isinstance(value, list):
            return [unknown(v) for v in value]
        return value

    return [
        rules.Resource(r.type, r.name, unknown(r.props), r.urn, None, r.property_dependencies)
        for r in found
    ]


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
@pytest.mark.parametrize("first_preview", [False, True])
def test_the_pack_reports_what_the_rules_report(
    pack: Callable[..., Pack], cloud: str, first_preview: bool
) -> None:
    """For each cloud's preset, and for it with a node tagged for another stack."""
    from pulumi.runtime.proto import analyzer_pb2

    stack = preset(cloud)
    running = pack(stack)
    found = engine_view(stack, first_preview=first_preview)
    # The program's own stack passes as the engine shows it, ids unknown or not.
    assert report(analyze(running, found)) == expected(stack, found) == []
    node = f"{PROJECT}-main"
    key = "labels" if cloud == "gcp" else "tags"
    broken = changed(found, node, lambda p: p[key].update(stack="another-stack"))
    diagnostics = analyze(running, broken)
    assert report(diagnostics) == expected(stack, broken)
    assert {d.enforcementLevel for d in diagnostics} == {analyzer_pb2.MANDATORY}
    [(policy, message, _)] = new_reports(running, found, broken)
    assert policy == "nodes-carry-stack-tags"
    assert node in message and "another-stack" in message and stack in message


@pytest.mark.parametrize("first_preview", [False, True])
def test_the_pack_reports_an_rpc_rule_from_another_group_on_that_rule(
    pack: Callable[..., Pack], first_preview: bool
) -> None:
    stack = preset("aws")
    running = pack(stack)
    found = engine_view(stack, first_preview=first_preview)
    worker_sg = urn(stack, rules.AWS_SECURITY_GROUP, f"{PROJECT}-worker-sg")
    rpc = next(r for r in found if r.name == AWS_RPC)
    from_worker = rules.Resource(
        rpc.type,
        rpc.name,
        {**rpc.props, "referencedSecurityGroupId": rules.UNKNOWN}
        if first_preview
        else {**rpc.props, "referencedSecurityGroupId": f"{PROJECT}-worker-sg-id"},
        rpc.urn,
        None,
        {**rpc.property_dependencies, "referencedSecurityGroupId": [worker_sg]},
    )
    [(policy, message, where)] = new_reports(
        running, found, [from_worker if r is rpc else r for r in found]
    )
    assert (policy, where) == ("rpc-only-from-main", rpc.urn)
    assert "not the main node's" in message and "referenced_security_group_id" in message
    if first_preview:
        # A source the preview cannot trace to any group is reported too.
        untraced = rules.Resource(rpc.type, rpc.name, from_worker.props, rpc.urn)
        [(_, message, _)] = new_reports(
            running, found, [untraced if r is rpc else r for r in found]
        )
        assert "cannot be traced to the main node's" in message


def test_the_pack_reports_internet_ingress_and_the_rpc_rule_from_a_cidr(
    pack: Callable[..., Pack],
) -> None:
    stack = preset("aws")
    found = engine_view(stack)
    bad = changed(
        found, AWS_RPC, lambda p: p.update(referencedSecurityGroupId=None, cidrIpv4="0.0.0.0/0")
    )
    reports = new_reports(pack(stack), found, bad)
    assert [policy for policy, _, _ in reports] == ["no-internet-ingress", "rpc-only-from-main"]
    assert all(AWS_RPC in message and "0.0.0.0/0" in message for _, message, _ in reports)


def rpc_rule_on(port: int) -> dict[str, Any]:
    return {
        "securityGroupId": f"{PROJECT}-worker-sg-id",
        "ipProtocol": "tcp",
        "fromPort": port,
        "toPort": port,
        "cidrIpv4": "10.42.0.0/24",
    }


def test_the_pack_takes_the_rpc_port_from_the_stack_config(pack: Callable[..., Pack]) -> None:
    stack = preset("aws")
    found = engine_view(stack)
    extra = added(stack, found, rules.AWS_INGRESS_RULE, "on-50060", rpc_rule_on(50060))
    assert new_reports(pack(stack), found, extra) == []
    moved = pack(stack, {f"{PROJECT}:cloud": "aws", f"{PROJECT}:rpcPort": "50060"})
    [(policy, message, _)] = new_reports(moved, found, extra)
    assert policy == "rpc-only-from-main" and "on-50060" in message and "port 50060" in message


def test_the_pack_takes_the_rpc_port_from_the_policy_config_first() -> None:
    """`--policy-pack-config` reaches the pack through Configure, and wins over the stack's."""
    from google.protobuf import struct_pb2
    from pulumi.runtime.proto import analyzer_pb2

    stack = preset("aws")
    running = Pack(stack, {f"{PROJECT}:cloud": "aws", f"{PROJECT}:rpcPort": "50060"})
    try:
        properties = struct_pb2.Struct()
        properties.update({"rpcPort": 50070})
        running.stub.Configure(
            analyzer_pb2.ConfigureAnalyzerRequest(
                policyConfig={
                    "rpc-only-from-main": analyzer_pb2.PolicyConfig(
                        enforcementLevel=analyzer_pb2.MANDATORY, properties=properties
                    )
                }
            )
        )
        found = engine_view(stack)
        extra = added(stack, found, rules.AWS_INGRESS_RULE, "on-50060", rpc_rule_on(50060))
        extra = added(stack, extra, rules.AWS_INGRESS_RULE, "on-50070", rpc_rule_on(50070))
        [(_, message, _)] = new_reports(running, found, extra)
        assert "on-50070" in message and "port 50070" in message
    finally:
        running.close()


def test_googles_probe_ranges_are_the_internet_like_any_public_range() -> None:
    """No managed balancer probes the groups (the balancer is a node), so no firewall needs
    Google's health-check probers: their ranges are public addresses like any other."""
    probes = ["35.191.0.0/16", "130.211.0.0/22"]
    gcp_rule = {"direction": "INGRESS", "allows": [{"protocol": "tcp"}], "sourceRanges": probes}
    assert rules.no_internet_ingress(rules.GCP_FIREWALL, gcp_rule, "probes")
    one = {**gcp_rule, "sourceRanges": ["35.191.0.0/16"]}
    assert rules.no_internet_ingress(rules.GCP_FIREWALL, one, "one")  # one /16 alone


@pytest.mark.parametrize("rule", [AZURE_RPC, "g1-allow-metrics-from-main"])
def test_the_pack_traces_an_azure_rule_from_the_workers_group_by_its_id(
    pack: Callable[..., Pack], rule: str
) -> None:
    """The NSG's inline rules name both groups, so the engine's dependencies cannot tell a
    source from a destination; the group's ARM id does, once it is known."""
    stack = preset("azure")
    running = pack(stack)
    found = engine_view(stack)
    broken = changed(
        found,
        AZURE_NSG,
        nsg_rule(rule, lambda r: r.update(sourceApplicationSecurityGroups=[{"id": ASG_WORKER}])),
    )
    [(policy, message, at)] = new_reports(running, found, broken)
    assert policy == ("rpc-only-from-main" if rule == AZURE_RPC else METRICS)
    assert rule in message and f"{PROJECT}-worker-asg" in message and "not the main" in message
    assert at == urn(stack, rules.AZURE_NSG, AZURE_NSG)


# --- hand edits of every resource type that could break an invariant ---------------------------

TAGS = {"project": PROJECT, "stack": "aws-c8g"}
SAFE_AWS_NODE = {
    "associatePublicIpAddress": False,
    "metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 1},
    "rootBlockDevice": {"encrypted": True},
}


def test_deleting_azures_deny_all_rule_is_reported() -> None:
    """Azure's default AllowVnetInBound (65000) would then admit the whole VNet to 50052."""
    stack = preset("azure")
    found = changed(
        resources(stack),
        AZURE_NSG,
        lambda p: p.update(
            securityRules=[r for r in p["securityRules"] if r["name"] != "deny-other-inbound"]
        ),
    )
    only(messages(stack, found), "rpc-only-from-main", AZURE_NSG, "AllowVnetInBound", "Deny")


@pytest.mark.parametrize("tag", ["AppService", "AzureCloud", "Storage.eastus", "Internet"])
def test_azure_service_tags_are_the_internet(tag: str) -> None:
    stack = preset("azure")
    rule = {
        "direction": "Inbound",
        "access": "Allow",
        "protocol": "Tcp",
        "priority": 300,
        "destinationPortRange": "8080",
        "sourceAddressPrefix": tag,
        "destinationApplicationSecurityGroups": [{"id": ASG_MAIN}],
    }
    found = added(stack, resources(stack), rules.AZURE_SECURITY_RULE, "from-a-service", rule)
    only(messages(stack, found), "no-internet-ingress", "from-a-service", tag)


@pytest.mark.parametrize("props", [{}, {"internal": False}])
def test_a_public_classic_elb_is_reported(props: dict[str, Any]) -> None:
    stack = preset("aws")
    found = added(stack, resources(stack), rules.AWS_CLASSIC_ELB, "classic", props)
    only(messages(stack, found), "internal-load-balancers", "classic", "internal=True")


@pytest.mark.parametrize(
    ("change", "policy", "fix"),
    [
        ({"associatePublicIpAddress": True}, "no-public-node-addresses", "NAT gateway"),
        ({"ipv6AddressCount": 1}, "no-public-node-addresses", "global IPv6"),
        ({"metadataOptions": {"httpTokens": "optional"}}, "aws-imdsv2-required", "IMDSv2"),
        ({"rootBlockDevice": {"encrypted": False}}, "encrypted-node-disks", "encrypted"),
        ({"iamInstanceProfile": "any-profile"}, "identity-on-main-only", "iamInstanceProfile"),
        ({"tags": {"project": PROJECT}}, "nodes-carry-stack-tags", "'stack'"),
    ],
)
def test_aws_spot_requests_are_checked_as_nodes(
    change: dict[str, Any], policy: str, fix: str
) -> None:
    stack = preset("aws")
    name = f"{PROJECT}-spot-worker"
    props = {**SAFE_AWS_NODE, "tags": {**TAGS, "stack": stack}, **change}
    found = added(stack, resources(stack), rules.AWS_SPOT_REQUEST, name, props)
    only(messages(stack, found), policy, name, fix)


@pytest.mark.parametrize("typ", [rules.AWS_LAUNCH_TEMPLATE, rules.AWS_LAUNCH_CONFIGURATION])
@pytest.mark.parametrize(
    ("change", "policy", "fix"),
    [
        ({"associatePublicIpAddress": "true"}, "no-public-node-addresses", "remove it"),
        (
            {"networkInterfaces": [{"associatePublicIpAddress": "true"}]},
            "no-public-node-addresses",
            "networkInterfaces[0]",
        ),
        ({"networkInterfaces": [{"ipv6AddressCount": 2}]}, "no-public-node-addresses", "IPv6"),
        ({"metadataOptions": {"httpTokens": "optional"}}, "aws-imdsv2-required", "IMDSv2"),
        ({"metadataOptions": {}}, "aws-imdsv2-required", "not set"),
        (
            {"blockDeviceMappings": [{"ebs": {"encrypted": "false"}}]},
            "encrypted-node-disks",
            "blockDeviceMappings[0]",
        ),
        ({"iamInstanceProfile": {"name": "p"}}, "identity-on-main-only", "iamInstanceProfile"),
    ],
)
def test_aws_launch_templates_are_checked_for_every_node_they_make(
    typ: str, change: dict[str, Any], policy: str, fix: str
) -> None:
    stack = preset("aws")
    props = {"metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 1}, **change}
    found = added(stack, resources(stack), typ, "template", props)
    only(messages(stack, found), policy, "template", fix)


@pytest.mark.parametrize("typ", [rules.GCP_INSTANCE_TEMPLATE, rules.GCP_REGION_INSTANCE_TEMPLATE])
@pytest.mark.parametrize(
    ("change", "policy", "fix"),
    [
        ({"networkInterfaces": [{"accessConfigs": [{}]}]}, "no-public-node-addresses", "Cloud NAT"),
        ({"serviceAccount": {"email": "x@p.iam"}}, "identity-on-main-only", "serviceAccount"),
        ({"labels": {"project": PROJECT}}, "nodes-carry-stack-tags", "'stack'"),
    ],
)
def test_gcp_instance_templates_are_checked_for_every_node_they_make(
    typ: str, change: dict[str, Any], policy: str, fix: str
) -> None:
    stack = preset("gcp")
    props = {"labels": {"project": PROJECT, "stack": stack}, **change}
    found = added(stack, resources(stack), typ, "template", props)
    only(messages(stack, found), policy, "template", fix)


@pytest.mark.parametrize("typ", rules.GCP_POLICY_RULE_TYPES)
@pytest.mark.parametrize(
    ("ranges", "ports", "policies"),
    [
        (["0.0.0.0/0"], ["8080"], ("no-internet-ingress",)),
        (["10.0.0.0/8"], [str(RPC_PORT)], ("rpc-only-from-main",)),
        (["10.0.0.0/8"], ["9000-9200"], (METRICS,)),
        (["10.0.0.0/8"], None, ("rpc-only-from-main", METRICS)),
    ],
)
def test_gcp_firewall_policy_rules_are_checked(
    typ: str, ranges: list[str], ports: list[str] | None, policies: tuple[str, ...]
) -> None:
    stack = preset("gcp")
    layer4 = {"ipProtocol": "tcp", **({"ports": ports} if ports else {})}
    props = {
        "action": "allow",
        "direction": "INGRESS",
        "priority": 100,
        "match": {"srcIpRanges": ranges, "layer4Configs": [layer4]},
    }
    found = added(stack, resources(stack), typ, "policy-rule", props)
    only(messages(stack, found), policies[0], "policy-rule", also=policies[1:])


def test_a_gcp_firewall_policy_with_rules_is_checked_rule_by_rule() -> None:
    stack = preset("gcp")
    rule = {
        "action": "allow",
        "direction": "INGRESS",
        "priority": 100,
        "match": {"srcIpRanges": ["10.0.0.0/8"], "layer4Configs": [{"ipProtocol": "all"}]},
    }
    deny = {**rule, "action": "deny", "priority": 50}
    typ = rules.GCP_POLICY_WITH_RULES_TYPES[0]
    found = added(stack, resources(stack), typ, "policy", {"rules": [deny, rule]})
    only(messages(stack, found), "rpc-only-from-main", "policy rules[1]", also=(METRICS,))


@pytest.mark.parametrize(
    ("change", "policy", "fix"),
    [
        (
            {
                "virtualMachineProfile": {
                    "networkProfile": {
                        "networkInterfaceConfigurations": [
                            {"ipConfigurations": [{"publicIPAddressConfiguration": {"name": "p"}}]}
                        ]
                    }
                }
            },
            "no-public-node-addresses",
            "publicIPAddressConfiguration",
        ),
        ({"identity": {"type": "SystemAssigned"}}, "identity-on-main-only", "identity"),
        (
            {
                "virtualMachineProfile": {
                    "storageProfile": {"osDisk": {"vhdContainers": ["https://a/b"]}}
                }
            },
            "encrypted-node-disks",
            "managed disks",
        ),
        ({"tags": {"project": PROJECT}}, "nodes-carry-stack-tags", "'stack'"),
    ],
)
def test_azure_scale_sets_are_checked_for_every_node_they_make(
    change: dict[str, Any], policy: str, fix: str
) -> None:
    stack = preset("azure")
    props = {"tags": {"project": PROJECT, "stack": stack}, **change}
    found = added(stack, resources(stack), rules.AZURE_SCALE_SET, "scale-set", props)
    only(messages(stack, found), policy, "scale-set", fix)


def test_a_global_ipv6_address_on_a_worker_is_reported() -> None:
    stack = preset("aws")
    name = f"{PROJECT}-worker-1"
    found = changed(resources(stack), name, lambda p: p.update(ipv6AddressCount=1))
    only(messages(stack, found), "no-public-node-addresses", name, "global IPv6")


@pytest.mark.parametrize(
    ("cloud", "key", "value"),
    [
        ("aws", "iamInstanceProfile", "llama-rpc-cluster-main-profile"),
        ("gcp", "serviceAccount", {"email": "main@p.iam", "scopes": ["cloud-platform"]}),
        ("azure", "identity", {"type": "UserAssigned", "userAssignedIdentities": {"/x": {}}}),
        ("azure", "identity", {"type": "SystemAssigned, UserAssigned"}),
    ],
)
def test_an_identity_on_a_worker_is_reported(cloud: str, key: str, value: Any) -> None:
    """An Azure worker's own (system-assigned) identity is a spend guard's, judged by its
    grants (identity-grants-deallocate-only); a shared, user-assigned one is never a worker's."""
    stack = preset(cloud)
    name = f"{PROJECT}-worker-1"
    found = changed(resources(stack), name, lambda p: p.update({key: value}))
    only(messages(stack, found), "identity-on-main-only", name, key)


@pytest.mark.parametrize(("cloud", "tags"), [("aws", "tags"), ("gcp", "labels"), ("azure", "tags")])
def test_a_worker_named_like_the_main_node_is_still_a_worker(cloud: str, tags: str) -> None:
    """A node is the main node by its name and its role tag together: a second node called
    "*-main" but tagged as a worker gets no identity."""
    stack = preset(cloud)
    main = next(r for r in resources(stack) if r.name == f"{PROJECT}-main")
    props = copy.deepcopy(dict(main.props))
    props[tags] = {**props[tags], "role": "worker"}
    if cloud == "azure":  # the main VM has an identity only to read a staged model
        props["identity"] = {"type": "UserAssigned", "userAssignedIdentities": {"/x": {}}}
    name = f"{PROJECT}-g2-main"
    found = [*resources(stack), rules.Resource(main.type, name, props, urn(stack, main.type, name))]
    result = messages(stack, found)
    reported(result, "identity-on-main-only", name, "remove it")


def test_a_group_named_like_the_main_group_but_tagged_worker_is_not_trusted() -> None:
    stack = preset("aws")
    group = "impostor-main-sg"
    props = {"name": group, "tags": {**TAGS, "stack": stack, "role": "worker"}}
    found = added(stack, resources(stack), rules.AWS_SECURITY_GROUP, group, props)
    found = changed(found, AWS_RPC, lambda p: p.update(referencedSecurityGroupId=f"{group}-id"))
    only(messages(stack, found), "rpc-only-from-main", AWS_RPC, f"{group}-id", "not the main")


@pytest.mark.parametrize(
    ("source", "policies"),
    [
        ({"cidrIpv4": "0.0.0.0/0"}, ("no-internet-ingress", METRICS)),
        ({"cidrIpv4": "10.0.0.0/8"}, (METRICS,)),
        ({"cidrIpv6": "::/0"}, ("no-internet-ingress", METRICS)),
    ],
)
def test_the_metrics_port_from_anything_but_the_main_group_is_reported(
    source: dict[str, str], policies: tuple[str, ...]
) -> None:
    stack = preset("aws")
    props = {
        "securityGroupId": f"{PROJECT}-worker-sg-id",
        "ipProtocol": "tcp",
        "fromPort": rules.METRICS_PORT,
        "toPort": rules.METRICS_PORT,
        **source,
    }
    found = added(stack, resources(stack), rules.AWS_INGRESS_RULE, "metrics-open", props)
    only(messages(stack, found), policies[0], "metrics-open", also=policies[1:])


@pytest.mark.parametrize("cloud", ["gcp", "azure"])
def test_the_metrics_port_from_the_vpc_is_reported_on_every_cloud(cloud: str) -> None:
    stack = preset(cloud)
    if cloud == "gcp":
        name = f"{PROJECT}-worker-metrics-from-main"
        change: Callable[[dict[str, Any]], object] = lambda p: p.update(  # noqa: E731
            sourceTags=None, sourceRanges=["10.0.0.0/8"]
        )
    else:
        name = AZURE_NSG
        change = nsg_rule(
            "g1-allow-metrics-from-main",
            lambda r: r.update(
                sourceApplicationSecurityGroups=None, sourceAddressPrefix="VirtualNetwork"
            ),
        )
    found = changed(resources(stack), name, change)
    only(messages(stack, found), METRICS, name, "node metrics port 9100")


# --- the EKS stack (platform kubernetes): its AWS resources and its Kubernetes objects ----------

EKS = "aws-c8g"  # a preset with workers: a LeaderWorkerSet of size > 1
K8S_NAMESPACE = PROJECT
IMAGE = "registry.example/llama-rpc:1"
LWS = PROJECT  # the LeaderWorkerSet's name (metadata.name)
EKS_CLUSTER = f"{PROJECT}-eks"
WORKER_TEMPLATE = f"{PROJECT}-worker-template"
WORKER_NODES = f"{PROJECT}-worker-nodes"
API_SERVICE = f"{PROJECT}-api"
WORKERS_POLICY = f"{PROJECT}-group-0-workers"


def without_default_deny(found: list[rules.Resource]) -> list[rules.Resource]:
    """A stack's resources without the default-deny NetworkPolicy, so that an edit of a group's
    workers' policy opens their port as it would alone."""
    return [r for r in found if not r.name.endswith("-default-deny")]


def k8s_type(obj: dict[str, Any]) -> str:
    """The Pulumi type token of a Kubernetes object (pulumi-kubernetes: core for the "" group)."""
    group, _, version = obj["apiVersion"].rpartition("/")
    return f"kubernetes:{group or 'core'}/{version}:{obj['kind']}"


def eks_launch_template(stack: str, role: str) -> dict[str, Any]:
    """A node group's launch template as the EKS stack registers it (``infra.stack.kube.eks``)."""
    tags = {"project": PROJECT, "stack": stack, "role": role}
    return {
        "description": f"{role} nodes of {PROJECT}",
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
                    "throughput": 250,
                },
            }
        ],
        "placement": {"groupName": f"{PROJECT}-placement-id"},
        "tagSpecifications": [
            {"resourceType": "instance", "tags": tags},
            {"resourceType": "volume", "tags": tags},
        ],
        "tags": tags,
        "updateDefaultVersion": True,
    }


def eks_resources(
    stack: str = EKS,
    overrides: dict[str, Any] | None = None,
    public_cidrs: list[str] | None = None,
) -> list[rules.Resource]:
    """What the EKS stack registers beyond the VPC (whose types the VM stacks' tests cover): the
    cluster, a launch template and node group per role, and the objects `render` makes."""
    config = parsed_config(stack, {f"{PROJECT}:{k}": v for k, v in (overrides or {}).items()})
    vpc: dict[str, Any] = {
        "subnetIds": [f"{PROJECT}-private-id", f"{PROJECT}-private-b-id"],
        "endpointPrivateAccess": True,
        "endpointPublicAccess": public_cidrs is not None,
    }
    if public_cidrs is not None:
        vpc["publicAccessCidrs"] = public_cidrs
    found: list[tuple[str, str, dict[str, Any]]] = [
        (
            rules.AWS_EKS_CLUSTER,
            EKS_CLUSTER,
            {
                "roleArn": f"arn:aws:iam::123456789012:role/{PROJECT}-cluster-role",
                "version": "1.35",
                "vpcConfig": vpc,
                "accessConfig": {
                    "authenticationMode": "API",
                    "bootstrapClusterCreatorAdminPermissions": True,
                },
                "upgradePolicy": {"supportType": "STANDARD"},
                "tags": {"project": PROJECT, "stack": stack, "role": "control-plane"},
            },
        )
    ]
    for role, instance_type, count in (
        ("main", config.main_instance_type.name, config.replicas),
        ("worker", config.instance_type.name, config.replicas * config.worker_count),
    ):
        template = f"{PROJECT}-{role}-template"
        found.append((rules.AWS_LAUNCH_TEMPLATE, template, eks_launch_template(stack, role)))
        nodes = {
            "clusterName": f"{EKS_CLUSTER}-id",
            "nodeRoleArn": f"arn:aws:iam::123456789012:role/{PROJECT}-node-role",
            "subnetIds": [f"{PROJECT}-private-id"],
            "scalingConfig": {"desiredSize": count, "minSize": count, "maxSize": count},
            "amiType": "AL2023_ARM_64_STANDARD",
            "capacityType": "ON_DEMAND",
            "instanceTypes": [instance_type],
            "launchTemplate": {"id": f"{template}-id", "version": "1"},
            "updateConfig": {"maxUnavailable": 1},
            "labels": {"llama-rpc-cluster/role": role},
            "tags": {"project": PROJECT, "stack": stack, "role": role},
        }
        found.append((rules.AWS_EKS_NODE_GROUP, f"{PROJECT}-{role}-nodes", nodes))
    for obj in kube.render(config, name=LWS, namespace=K8S_NAMESPACE, image=IMAGE):
        found.append((k8s_type(obj), obj["metadata"]["name"], obj))
    return [
        rules.Resource(typ, name, copy.deepcopy(props), urn(stack, typ, name), f"{name}-id")
        for typ, name, props in found
    ]


def of_type(found: list[rules.Resource], typ: str) -> list[rules.Resource]:
    return [r for r in found if r.type == typ]


def eks_messages(
    found: list[rules.Resource], port: int = RPC_PORT, baseline: list[rules.Resource] | None = None
) -> dict[str, list[str]]:
    return messages(EKS, found, port, baseline=eks_resources() if baseline is None else baseline)


def retyped(
    found: list[rules.Resource], typ: str, name: str, change: Callable[[dict[str, Any]], object]
) -> list[rules.Resource]:
    """The stack with one resource, picked by type and name, changed (on a copy)."""
    assert any(r.type == typ and r.name == name for r in found), f"no {typ} {name}"
    out = []
    for r in found:
        if r.type != typ or r.name != name:
            out.append(r)
            continue
        props = copy.deepcopy(dict(r.props))
        change(props)
        out.append(rules.Resource(r.type, r.name, props, r.urn, r.id, r.property_dependencies))
    return out


@pytest.mark.parametrize(
    ("overrides", "public_cidrs"),
    [
        ({}, None),
        ({}, ["203.0.113.0/24", "198.51.100.0/24", "52.1.0.0/24", "10.8.0.0/16"]),
        ({"replicas": 3}, None),
        ({"replicas": 2, "apiAllowedCidrs": ["10.8.0.0/16"]}, ["203.0.113.0/24"]),
    ],
)
def test_the_eks_stack_passes_every_policy(
    overrides: dict[str, Any], public_cidrs: list[str] | None
) -> None:
    found = eks_resources(EKS, overrides, public_cidrs)
    result = violations(EKS, found)
    assert sorted(result) == sorted(POLICIES)
    assert not any(result.values()), result
    # ... and not because nothing applied: every new type is there, and a set with workers.
    types = {r.type for r in found}
    assert {
        rules.AWS_EKS_CLUSTER,
        rules.AWS_EKS_NODE_GROUP,
        rules.AWS_LAUNCH_TEMPLATE,
        rules.K8S_SERVICE,
        rules.K8S_NETWORK_POLICY,
        rules.K8S_LEADER_WORKER_SET,
    } <= types
    [lws] = of_type(found, rules.K8S_LEADER_WORKER_SET)
    assert lws.props["spec"]["leaderWorkerTemplate"]["size"] > 1
    # Without the workers' policies and the default deny, the same stack fails.
    bare = [r for r in found if not r.name.endswith(("-workers", "-default-deny"))]
    assert rules.k8s_rpc_only_from_leader(bare) != []


def test_the_policy_knows_the_labels_and_port_the_program_uses() -> None:
    assert rules.LWS_NAME_LABEL == kube.LWS_NAME_LABEL
    assert rules.LWS_GROUP_INDEX_LABEL == kube.GROUP_INDEX_LABEL
    assert rules.LWS_WORKER_INDEX_LABEL == kube.WORKER_INDEX_LABEL
    assert k8s_type({"apiVersion": kube.LWS_API_VERSION, "kind": "LeaderWorkerSet"}) == (
        rules.K8S_LEADER_WORKER_SET
    )
    assert parsed_config(EKS).rpc_port == rules.DEFAULT_RPC_PORT


# --- 10. the Kubernetes API endpoint is private -------------------------------------------------


@pytest.mark.parametrize(
    ("vpc", "fix"),
    [
        ({"endpointPrivateAccess": False}, "endpointPrivateAccess is False"),
        ({"endpointPrivateAccess": None}, "endpointPrivateAccess is not set"),
        ({"endpointPublicAccess": True, "publicAccessCidrs": None}, "admits 0.0.0.0/0"),
        ({"endpointPublicAccess": True, "publicAccessCidrs": []}, "publicAccessCidrs is not given"),
        ({"endpointPublicAccess": None}, "endpointPublicAccess is not set (EKS's default is true)"),
        ({"endpointPublicAccess": True, "publicAccessCidrs": ["0.0.0.0/0"]}, "from 0.0.0.0/0"),
        ({"endpointPublicAccess": True, "publicAccessCidrs": ["::/0"]}, "from ::/0"),
        (
            {"endpointPublicAccess": True, "publicAccessCidrs": ["203.0.113.0/24", "52.0.0.0/8"]},
            "from 52.0.0.0/8",
        ),
        (
            {"endpointPublicAccess": True, "publicAccessCidrs": ["0.0.0.0/1", "128.0.0.0/1"]},
            "from 0.0.0.0/1, 128.0.0.0/1",
        ),
    ],
)
def test_a_public_kubernetes_api_is_reported(vpc: dict[str, Any], fix: str) -> None:
    def edit(props: dict[str, Any]) -> None:
        for key, value in vpc.items():
            if value is None:
                props["vpcConfig"].pop(key, None)
            else:
                props["vpcConfig"][key] = value

    found = retyped(eks_resources(), rules.AWS_EKS_CLUSTER, EKS_CLUSTER, edit)
    [message] = only(eks_messages(found), "private-kubernetes-api", EKS_CLUSTER, fix)
    assert "vpcConfig." in message


def test_a_kubernetes_api_open_to_named_ranges_passes() -> None:
    """Each range is judged as the program's kubernetesApiCidrs are: a /24 of public space at
    most (each a range of its own, as each apiAllowedCidrs range is a rule of its own)."""
    check = rules.private_kubernetes_api
    private = {"endpointPrivateAccess": True, "endpointPublicAccess": False}
    assert check(rules.AWS_EKS_CLUSTER, {"vpcConfig": private}, "c") == []
    public = {
        "endpointPrivateAccess": True,
        "endpointPublicAccess": True,
        "publicAccessCidrs": ["52.1.0.0/24", "52.2.0.0/24", "10.0.0.0/8", "100.64.0.0/10"],
    }
    assert check(rules.AWS_EKS_CLUSTER, {"vpcConfig": public}, "c") == []
    wide = {**public, "publicAccessCidrs": ["52.0.0.0/16"]}  # a public /16: the internet
    assert check(rules.AWS_EKS_CLUSTER, {"vpcConfig": wide}, "c")
    # Another type with the same inputs is none of this policy's business.
    assert check(rules.AWS_INSTANCE, {"vpcConfig": wide}, "c") == []


# --- 11. EKS nodes from the stack's launch template ---------------------------------------------


@pytest.mark.parametrize(
    ("change", "fix"),
    [
        (lambda p: p.pop("launchTemplate"), "launchTemplate is not set"),
        (lambda p: p.update(launchTemplate={"version": "1"}), "launchTemplate is not set"),
        (
            lambda p: p.update(remoteAccess={"ec2SshKey": "my-key"}),
            "remoteAccess opens SSH",
        ),
        (
            lambda p: p.update(remoteAccess={"ec2SshKey": "k", "sourceSecurityGroupIds": ["sg-1"]}),
            "remove remote_access",
        ),
    ],
)
def test_an_eks_node_group_outside_the_launch_template_is_reported(
    change: Callable[[dict[str, Any]], object], fix: str
) -> None:
    found = retyped(eks_resources(), rules.AWS_EKS_NODE_GROUP, WORKER_NODES, change)
    only(eks_messages(found), "eks-nodes-from-launch-template", WORKER_NODES, fix)


def test_a_node_group_by_template_name_passes() -> None:
    props = {"launchTemplate": {"name": "lt", "version": "$Latest"}}
    assert rules.eks_nodes_from_launch_template(rules.AWS_EKS_NODE_GROUP, props, "ng") == []


def test_the_eks_launch_template_passes_every_resource_policy() -> None:
    props = eks_launch_template(EKS, "worker")
    for policy, validator in rules.RESOURCE_VALIDATORS.items():
        assert validator(rules.AWS_LAUNCH_TEMPLATE, props, WORKER_TEMPLATE) == [], policy


@pytest.mark.parametrize(
    ("change", "policy", "fix"),
    [
        (
            lambda p: p["metadataOptions"].update(httpTokens="optional"),
            "aws-imdsv2-required",
            "httpTokens is 'optional'",
        ),
        (
            lambda p: p["metadataOptions"].pop("httpTokens"),
            "aws-imdsv2-required",
            "httpTokens is not set",
        ),
        (lambda p: p.pop("metadataOptions"), "aws-imdsv2-required", "IMDSv2"),
        (
            lambda p: p["blockDeviceMappings"][0]["ebs"].update(encrypted="false"),
            "encrypted-node-disks",
            "blockDeviceMappings[0].ebs.encrypted",
        ),
        (
            lambda p: p["blockDeviceMappings"][0]["ebs"].pop("encrypted"),
            "encrypted-node-disks",
            "blockDeviceMappings[0].ebs.encrypted",
        ),
        (
            lambda p: p.update(networkInterfaces=[{"associatePublicIpAddress": "true"}]),
            "no-public-node-addresses",
            "networkInterfaces[0].associatePublicIpAddress",
        ),
        (
            lambda p: p.update(iamInstanceProfile={"name": "p"}),
            "identity-on-main-only",
            "iamInstanceProfile",
        ),
    ],
)
def test_the_eks_launch_template_is_checked_for_every_node_it_makes(
    change: Callable[[dict[str, Any]], object], policy: str, fix: str
) -> None:
    found = retyped(eks_resources(), rules.AWS_LAUNCH_TEMPLATE, WORKER_TEMPLATE, change)
    only(eks_messages(found), policy, WORKER_TEMPLATE, fix)


# --- 12. Kubernetes Services stay in the cluster ------------------------------------------------


@pytest.mark.parametrize(
    ("change", "fix"),
    [
        (lambda p: p["spec"].update(type="LoadBalancer"), "spec.type is 'LoadBalancer'"),
        (lambda p: p["spec"].update(type="NodePort"), "spec.type is 'NodePort'"),
        (
            lambda p: p["spec"].update(externalIPs=["198.51.100.7"]),
            "spec.externalIPs (198.51.100.7)",
        ),
    ],
)
def test_a_service_reachable_from_outside_the_cluster_is_reported(
    change: Callable[[dict[str, Any]], object], fix: str
) -> None:
    found = retyped(eks_resources(), rules.K8S_SERVICE, API_SERVICE, change)
    only(eks_messages(found), "cluster-internal-services", API_SERVICE, fix)


def test_a_clusterip_service_passes_and_so_does_one_of_no_type() -> None:
    check = rules.cluster_internal_services
    assert check(rules.K8S_SERVICE, {"spec": {"type": "ClusterIP"}}, "s") == []
    assert check(rules.K8S_SERVICE, {"spec": {"ports": [{"port": 80}]}}, "s") == []
    assert check(rules.K8S_SERVICE, {"spec": {"externalIPs": []}}, "s") == []
    # A patch that turns a Service into a load balancer is a Service that is one.
    patch = {"spec": {"type": "LoadBalancer"}}
    [message] = check(rules.K8S_SERVICE_PATCH, patch, "p")
    assert "p: spec.type is 'LoadBalancer'" in message


# --- 13. on Kubernetes, the RPC port only from the group's leader -------------------------------


def workers_rule(props: dict[str, Any]) -> dict[str, Any]:
    rule: dict[str, Any] = props["spec"]["ingress"][0]
    return rule


LEADER = {kube.LWS_NAME_LABEL: LWS, kube.WORKER_INDEX_LABEL: "0"}


@pytest.mark.parametrize(
    ("change", "fix"),
    [
        (
            lambda p: workers_rule(p)["from"].append({"ipBlock": {"cidr": "10.0.0.0/8"}}),
            "spec.ingress[0].from[1].ipBlock admits 10.0.0.0/8",
        ),
        (
            lambda p: workers_rule(p)["from"][0].update(namespaceSelector={}),
            "spec.ingress[0].from[0].namespaceSelector admits pods of other namespaces",
        ),
        (
            lambda p: workers_rule(p).update({"from": []}),
            "spec.ingress[0] has no `from` and admits every source",
        ),
        (lambda p: workers_rule(p).pop("from"), "spec.ingress[0] has no `from`"),
        (
            lambda p: workers_rule(p)["from"].append({"podSelector": {}}),
            "spec.ingress[0].from[1].podSelector {} admits pods other than the set's leaders",
        ),
        (
            lambda p: workers_rule(p)["from"][0]["podSelector"]["matchLabels"].pop(
                kube.WORKER_INDEX_LABEL
            ),
            "spec.ingress[0].from[0].podSelector",
        ),
        (
            lambda p: workers_rule(p)["from"].append({}),
            "spec.ingress[0].from[1] is empty",
        ),
        (  # a second rule for every port
            lambda p: p["spec"]["ingress"].append({"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}),
            "spec.ingress[1].from[0].ipBlock admits 0.0.0.0/0",
        ),
        (  # the RPC port by its name in the workers' pods
            lambda p: p["spec"]["ingress"].append(
                {"from": [{"podSelector": {}}], "ports": [{"port": "rpc"}]}
            ),
            "spec.ingress[1].from[0].podSelector {}",
        ),
        (  # a range that holds it
            lambda p: p["spec"]["ingress"].append(
                {"from": [{"podSelector": {}}], "ports": [{"port": 50000, "endPort": 50100}]}
            ),
            "spec.ingress[1].from[0].podSelector {}",
        ),
    ],
)
def test_a_workers_policy_admitting_more_than_the_leaders_is_reported(
    change: Callable[[dict[str, Any]], object], fix: str
) -> None:
    found = retyped(eks_resources(), rules.K8S_NETWORK_POLICY, WORKERS_POLICY, change)
    [message] = only(eks_messages(found), K8S_RPC, WORKERS_POLICY, fix)
    assert f"RPC port {RPC_PORT} of LeaderWorkerSet {LWS}'s workers" in message
    assert json.dumps(LEADER)[1:-1] in message  # the fix: the leaders' selector


def test_another_policy_that_picks_the_workers_is_judged_too() -> None:
    """Kubernetes admits what any policy picking a pod admits: a second, wider policy opens the
    port beside the program's narrow one."""
    stack = EKS
    found = eks_resources()
    wide = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "allow-monitoring", "namespace": K8S_NAMESPACE},
        "spec": {
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": PROJECT}},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "obs"}}}]}],
        },
    }
    found = added(stack, found, rules.K8S_NETWORK_POLICY, "allow-monitoring", wide)
    only(eks_messages(found), K8S_RPC, "allow-monitoring", "namespaceSelector")
    # The same policy for other ports, other pods or another namespace is none of its business.
    for edit in (
        lambda p: p["spec"]["ingress"][0].update(ports=[{"port": 9090}]),
        lambda p: p["spec"]["ingress"][0].update(ports=[{"port": RPC_PORT, "protocol": "UDP"}]),
        lambda p: p["spec"]["ingress"][0].update(ports=[{"port": "metrics"}]),
        lambda p: p["spec"]["podSelector"]["matchLabels"].update(app="grafana"),
        lambda p: p["spec"].update(policyTypes=["Egress"]),
        lambda p: p["metadata"].update(namespace="monitoring"),
    ):
        ok = retyped(found, rules.K8S_NETWORK_POLICY, "allow-monitoring", edit)
        assert not any(eks_messages(ok).values()), eks_messages(ok)


@pytest.mark.parametrize(
    ("overrides", "change", "fix"),
    [
        (
            {},
            lambda found: [r for r in found if r.name != WORKERS_POLICY],
            "isolates the workers of group 0,",
        ),
        (
            {"replicas": 3},
            lambda found: [r for r in found if r.name != f"{PROJECT}-group-1-workers"],
            "isolates the workers of group 1,",
        ),
        (
            {},
            lambda found: retyped(
                found,
                rules.K8S_NETWORK_POLICY,
                WORKERS_POLICY,
                lambda p: p["spec"].update(policyTypes=["Egress"]),
            ),
            "group 0,",
        ),
        (
            {},
            lambda found: retyped(
                found,
                rules.K8S_NETWORK_POLICY,
                WORKERS_POLICY,
                lambda p: p["metadata"].update(namespace="default"),
            ),
            f"in namespace {K8S_NAMESPACE}",
        ),
        (
            {},
            lambda found: retyped(
                found,
                rules.K8S_NETWORK_POLICY,
                WORKERS_POLICY,
                lambda p: p["spec"]["podSelector"]["matchLabels"].update(
                    {kube.LWS_NAME_LABEL: "another-set"}
                ),
            ),
            "group 0,",
        ),
        (  # a selector on a label only the controller sets proves nothing
            {},
            lambda found: retyped(
                found,
                rules.K8S_NETWORK_POLICY,
                WORKERS_POLICY,
                lambda p: p["spec"]["podSelector"]["matchLabels"].update(
                    {"leaderworkerset.sigs.k8s.io/group-key": "abc"}
                ),
            ),
            "group 0,",
        ),
    ],
)
def test_workers_no_policy_isolates_are_reported_on_the_leader_worker_set(
    overrides: dict[str, Any],
    change: Callable[[list[rules.Resource]], list[rules.Resource]],
    fix: str,
) -> None:
    # Without the namespace's default deny, which would keep the workers closed whatever
    # their group's policy says.
    baseline = without_default_deny(eks_resources(EKS, overrides))
    result = eks_messages(change(baseline), baseline=baseline)
    [message] = only(result, K8S_RPC, f"LeaderWorkerSet {LWS}", fix)
    assert "spec.leaderWorkerTemplate.size is" in message and "NotIn" in message


def test_a_set_without_workers_needs_no_policy() -> None:
    found = [r for r in eks_resources() if r.type != rules.K8S_NETWORK_POLICY]
    one = retyped(
        found,
        rules.K8S_LEADER_WORKER_SET,
        LWS,
        lambda p: p["spec"]["leaderWorkerTemplate"].update(size=1),
    )
    assert rules.k8s_rpc_only_from_leader(one) == []
    default = retyped(
        found,
        rules.K8S_LEADER_WORKER_SET,
        LWS,
        lambda p: p["spec"]["leaderWorkerTemplate"].pop("size"),  # the CRD's default: 1
    )
    assert rules.k8s_rpc_only_from_leader(default) == []


def test_the_k8s_rpc_check_guards_the_stacks_rpc_port() -> None:
    baseline = eks_resources(EKS, {"rpcPort": 50060})
    assert not any(messages(EKS, baseline, 50060, baseline=[]).values())
    # A rule from anywhere on 50060 is caught on that port and is nothing to 50052.
    open_rule = {"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": 50060}]}
    found = retyped(
        baseline,
        rules.K8S_NETWORK_POLICY,
        WORKERS_POLICY,
        lambda p: p["spec"]["ingress"].append(open_rule),
    )
    only(messages(EKS, found, 50060, baseline=baseline), K8S_RPC, WORKERS_POLICY, "port 50060")
    assert not messages(EKS, found, 50052, baseline=baseline)[K8S_RPC]


@pytest.mark.parametrize(
    "change",
    [
        lambda r: (
            r.props.update(spec=rules.UNKNOWN) if r.type == rules.K8S_LEADER_WORKER_SET else None
        ),
        lambda r: (
            r.props["spec"]["leaderWorkerTemplate"].update(size=rules.UNKNOWN)
            if r.type == rules.K8S_LEADER_WORKER_SET
            else None
        ),
        lambda r: (
            r.props["metadata"].update(namespace=rules.UNKNOWN)
            if r.type == rules.K8S_NETWORK_POLICY
            else None
        ),
        lambda r: (
            r.props["spec"].update(ingress=rules.UNKNOWN) if r.name == WORKERS_POLICY else None
        ),
        lambda r: (
            r.props["spec"]["podSelector"].update(matchLabels=rules.UNKNOWN)
            if r.name == WORKERS_POLICY
            else None
        ),
    ],
)
def test_the_k8s_rpc_check_does_not_judge_what_a_preview_does_not_know(
    change: Callable[[rules.Resource], object],
) -> None:
    """Even a stack with no narrow policy: once the values are known, the update judges it."""
    found = eks_resources()
    broken = retyped(
        found,
        rules.K8S_NETWORK_POLICY,
        WORKERS_POLICY,
        lambda p: workers_rule(p)["from"].append({"ipBlock": {"cidr": "0.0.0.0/0"}}),
    )
    assert rules.k8s_rpc_only_from_leader(broken)
    for r in broken:
        change(r)
    assert rules.k8s_rpc_only_from_leader(broken) == []


def test_the_pack_reports_what_the_rules_report_on_the_eks_stack(
    pack: Callable[..., Pack],
) -> None:
    running = pack(preset("aws"))
    found = eks_resources()
    assert report(analyze(running, found)) == expected(EKS, found) == []
    broken = retyped(
        found,
        rules.AWS_EKS_CLUSTER,
        EKS_CLUSTER,
        lambda p: p["vpcConfig"].update(endpointPublicAccess=True, publicAccessCidrs=["0.0.0.0/0"]),
    )
    broken = retyped(
        broken,
        rules.AWS_EKS_NODE_GROUP,
        WORKER_NODES,
        lambda p: p.update(remoteAccess={"ec2SshKey": "k"}),
    )
    broken = retyped(
        broken, rules.K8S_SERVICE, API_SERVICE, lambda p: p["spec"].update(type="LoadBalancer")
    )
    broken = retyped(
        broken,
        rules.K8S_NETWORK_POLICY,
        WORKERS_POLICY,
        lambda p: workers_rule(p)["from"].append({"ipBlock": {"cidr": "10.0.0.0/8"}}),
    )
    reports = report(analyze(running, broken))
    assert reports == expected(EKS, broken)
    assert sorted(policy for policy, _, _ in reports) == sorted(
        [
            "private-kubernetes-api",
            "eks-nodes-from-launch-template",
            "cluster-internal-services",
            K8S_RPC,
        ]
    )
    [at] = [where for policy, _, where in reports if policy == K8S_RPC]
    assert at == urn(EKS, rules.K8S_NETWORK_POLICY, WORKERS_POLICY)
    # A first preview that knows neither the policies nor the set reports nothing of them.
    for r in broken:
        if r.type in (rules.K8S_NETWORK_POLICY, rules.K8S_LEADER_WORKER_SET):
            r.props["spec"] = rules.UNKNOWN  # type: ignore[index]
    assert [policy for policy, _, _ in report(analyze(running, broken))] == [
        "cluster-internal-services",
        "eks-nodes-from-launch-template",
        "private-kubernetes-api",
    ]


# --- the Kubernetes presets as the program registers them under mocks ---------------------------

KUBERNETES_PRESETS = [s for s in stack_names() if kubernetes(s)]


def named(found: list[rules.Resource], typ: str, suffix: str) -> rules.Resource:
    [r] = [r for r in found if r.type == typ and r.name.endswith(suffix)]
    return r


@pytest.mark.parametrize("stack", KUBERNETES_PRESETS)
@pytest.mark.parametrize("options", [KUBERNETES_API_CIDRS, {**REPLICAS, **API_CIDRS}])
def test_the_kubernetes_options_stay_within_the_policy(stack: str, options: dict[str, Any]) -> None:
    found = resources(stack, deployment(stack, **options))
    assert not any(violations(stack, found).values()), violations(stack, found)
    cluster = named(found, rules.AWS_EKS_CLUSTER, "-eks")
    # Every Kubernetes stack gives the endpoint a public range (the shipped one, or the option's).
    assert cluster.props["vpcConfig"]["endpointPublicAccess"] is True
    policies = of_type(found, rules.K8S_NETWORK_POLICY)
    assert len([p for p in policies if p.name.endswith("-workers")]) == options.get("replicas", 1)


@pytest.mark.parametrize("stack", KUBERNETES_PRESETS)
def test_a_kubernetes_presets_invariants_broken_are_reported(stack: str) -> None:
    found = without_default_deny(resources(stack))
    [lws] = of_type(found, rules.K8S_LEADER_WORKER_SET)
    assert lws.props["spec"]["leaderWorkerTemplate"]["size"] > 1
    cluster = named(found, rules.AWS_EKS_CLUSTER, "-eks")
    workers = named(found, rules.K8S_NETWORK_POLICY, "-group-0-workers")
    [nodes, *_] = of_type(found, rules.AWS_EKS_NODE_GROUP)
    [service, *_] = of_type(found, rules.K8S_SERVICE)
    # (resource to change, change, policy that reports it, the resource it names, the fix)
    cases: list[tuple[rules.Resource, Callable[[dict[str, Any]], object], str, str, str]] = [
        (
            cluster,
            # The shipped stack's endpoint is public to its range: without the range, EKS
            # admits the internet.
            lambda p: p["vpcConfig"].pop("publicAccessCidrs"),
            "private-kubernetes-api",
            cluster.name,
            "EKS admits 0.0.0.0/0",
        ),
        (
            nodes,
            lambda p: p.pop("launchTemplate"),
            "eks-nodes-from-launch-template",
            nodes.name,
            "launchTemplate is not set",
        ),
        (
            service,
            lambda p: p["spec"].update(type="NodePort"),
            "cluster-internal-services",
            service.name,
            "'NodePort'",
        ),
        (
            workers,
            lambda p: workers_rule(p)["from"].append({"ipBlock": {"cidr": "10.0.0.0/8"}}),
            K8S_RPC,
            workers.name,
            "ipBlock admits 10.0.0.0/8",
        ),
        (
            workers,
            lambda p: p["spec"].update(policyTypes=["Egress"]),
            K8S_RPC,
            lws.name,
            "isolates the workers of group 0",
        ),
    ]
    for r, change, policy, name, fix in cases:
        only(messages(stack, retyped(found, r.type, r.name, change)), policy, name, fix)


@pytest.mark.parametrize("stack", KUBERNETES_PRESETS)
@pytest.mark.parametrize("first_preview", [False, True])
def test_the_pack_reports_what_the_rules_report_on_a_kubernetes_preset(
    pack: Callable[..., Pack], stack: str, first_preview: bool
) -> None:
    running = pack(stack)
    found = engine_view(stack, first_preview=first_preview)
    assert report(analyze(running, found)) == expected(stack, found) == []
    workers = named(found, rules.K8S_NETWORK_POLICY, "-group-0-workers")
    broken = retyped(
        found,
        workers.type,
        workers.name,
        lambda p: workers_rule(p)["from"].append({"namespaceSelector": {}}),
    )
    assert report(analyze(running, broken)) == expected(stack, broken)
    [(policy, message, where)] = new_reports(running, found, broken)
    assert (policy, where) == (K8S_RPC, workers.urn)
    assert "namespaceSelector admits pods of other namespaces" in message


# --- spend guards: every stack with one passes, and a worker's identity stays its own ---------


@pytest.mark.parametrize(
    ("cloud", "options"),
    [
        ("aws", GUARDED),
        ("gcp", GUARDED),
        ("azure", GUARDED),
        ("azure", {**GUARDED, **NO_KEY}),
        ("azure", {**GUARDED, **BASTION}),
    ],
)
def test_every_stack_with_a_spend_guard_passes_every_policy(
    cloud: str, options: dict[str, Any]
) -> None:
    stack = preset(cloud)
    found = resources(stack, deployment(stack, **options))
    result = violations(stack, found)
    assert not any(result.values()), result
    if cloud == "azure":  # each worker and the balancer node has its identity and one grant
        grants = [r for r in found if r.type == rules.AZURE_ROLE_ASSIGNMENT]
        assert any("worker" in r.name for r in grants)
        assert f"{PROJECT}-balancer-deallocate" in {r.name for r in grants}
        balancer = next(r for r in found if r.name == f"{PROJECT}-balancer")
        assert balancer.props["identity"]["type"] == "SystemAssigned"


def guarded_azure() -> tuple[str, list[rules.Resource]]:
    stack = preset("azure")
    return stack, resources(stack, deployment(stack, **GUARDED))


CONTRIBUTOR = (
    "/subscriptions/s/providers/Microsoft.Authorization/roleDefinitions/"
    "b24988ac-6180-42a0-ab88-20f7382dd24c"
)


@pytest.mark.parametrize(
    ("change", "fix"),
    [
        (lambda p: p.update(roleDefinitionId=CONTRIBUTOR), "a role other than"),
        (lambda p: p.update(scope=f"{PROJECT}-rg-id"), "not its own VM"),
        (lambda p: p.update(scope=f"{PROJECT}-worker-2-id"), "not its own VM"),
    ],
)
def test_a_workers_identity_granted_more_than_its_own_deallocation_is_reported(
    change: Callable[[dict[str, Any]], object], fix: str
) -> None:
    stack, baseline = guarded_azure()
    name = f"{PROJECT}-worker-1-deallocate"
    found = changed(baseline, name, change)
    result = messages(stack, found, baseline=baseline)
    reported(result, GRANTS, name, fix)


@pytest.mark.parametrize(
    ("change", "fix"),
    [
        (lambda p: p.update(roleDefinitionId=CONTRIBUTOR), "a role other than"),
        (lambda p: p.update(scope=f"{PROJECT}-rg-id"), "not its own VM"),
        (lambda p: p.update(scope=f"{PROJECT}-main-id"), "not its own VM"),
    ],
)
def test_the_balancer_nodes_identity_granted_more_than_its_own_deallocation_is_reported(
    change: Callable[[dict[str, Any]], object], fix: str
) -> None:
    """The balancer node's guard deallocates it with its own identity: a hand edit that widens
    that grant (another role, the resource group, another VM) is reported on the grant."""
    stack, baseline = guarded_azure()
    name = f"{PROJECT}-balancer-deallocate"
    found = changed(baseline, name, change)
    result = messages(stack, found, baseline=baseline)
    reported(result, GRANTS, name, f"{PROJECT}-balancer's identity", fix)


def test_a_user_assigned_identity_on_the_balancer_node_is_reported() -> None:
    """Its own system-assigned identity alone: a shared, user-assigned one may hold anything."""
    stack, baseline = guarded_azure()
    name = f"{PROJECT}-balancer"
    shared = (
        "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ManagedIdentity/"
        "userAssignedIdentities/shared"
    )
    found = changed(
        baseline, name,
        lambda p: p.update(identity={"type": "SystemAssigned, UserAssigned",
                                     "userAssignedIdentities": {shared: {}}}),
    )  # fmt: skip
    reported(messages(stack, found, baseline=baseline), "identity-on-main-only", name)


def test_a_grant_to_a_workers_identity_found_by_dependency_in_a_preview_is_judged() -> None:
    """In a preview the principal is not known: the grant's dependency on the VM tells."""
    stack, baseline = guarded_azure()
    vm = next(r for r in baseline if r.name == f"{PROJECT}-worker-1")
    props = {"principalId": rules.UNKNOWN, "roleDefinitionId": CONTRIBUTOR, "scope": vm.id}
    grant = rules.Resource(
        rules.AZURE_ROLE_ASSIGNMENT, "extra", props, urn(stack, rules.AZURE_ROLE_ASSIGNMENT, "x"),
        property_dependencies={"principalId": [vm.urn]},
    )  # fmt: skip
    result = messages(stack, [*baseline, grant], baseline=baseline)
    reported(result, GRANTS, "extra", "a role other than")
    assert result["narrow-grants"]  # Contributor administers what it is assigned on


@pytest.mark.parametrize(
    ("change", "fix"),
    [
        (
            lambda p: p["permissions"][0]["actions"].append("Microsoft.Compute/*"),
            "beyond deallocate",
        ),
        (lambda p: p.update(assignableScopes=["/subscriptions/s"]), "beyond a resource group"),
    ],
)
def test_the_deallocate_role_widened_is_reported(
    change: Callable[[dict[str, Any]], object], fix: str
) -> None:
    stack, baseline = guarded_azure()
    name = f"{PROJECT}-deallocate-role"
    found = changed(baseline, name, change)
    reported(messages(stack, found, baseline=baseline), GRANTS, name, fix)


# --- the clouds' other providers: the same invariants -----------------------------------------


@pytest.mark.parametrize(
    ("typ", "props", "policy", "shown"),
    [
        (
            "aws-native:ec2:SecurityGroupIngress",
            {"groupId": "g", "ipProtocol": "tcp", "fromPort": 8080, "toPort": 8080,
             "cidrIp": "0.0.0.0/0"},
            "no-internet-ingress",
            "0.0.0.0/0",
        ),
        (
            "aws-native:ec2:SecurityGroup",
            {"groupDescription": "g", "securityGroupIngress": [
                {"ipProtocol": "-1", "cidrIpv6": "::/0"}]},
            "no-internet-ingress",
            "::/0",
        ),
        (
            "azure:network/networkSecurityRule:NetworkSecurityRule",
            {"direction": "Inbound", "access": "Allow", "protocol": "Tcp",
             "sourceAddressPrefix": "Internet", "destinationPortRange": "8080",
             "priority": 100, "networkSecurityGroupName": "n", "resourceGroupName": "rg"},
            "no-internet-ingress",
            "Internet",
        ),
        (
            "azure:network/networkSecurityGroup:NetworkSecurityGroup",
            {"name": "extra", "securityRules": [
                {"name": "open", "direction": "Inbound", "access": "Allow", "protocol": "*",
                 "sourceAddressPrefix": "*", "destinationPortRange": "22", "priority": 100}]},
            "no-internet-ingress",
            "*",
        ),
    ],
)  # fmt: skip
def test_ingress_from_the_internet_through_another_provider_is_reported(
    typ: str, props: dict[str, Any], policy: str, shown: str
) -> None:
    cloud = "aws" if typ.startswith("aws") else "azure"
    stack = preset(cloud)
    found = added(stack, resources(stack), typ, "other-provider", props)
    result = messages(stack, found)
    reported(result, policy, "other-provider", shown)


def test_the_rpc_port_from_a_range_through_aws_native_is_reported() -> None:
    stack = preset("aws")
    rule = {
        "groupId": f"{PROJECT}-worker-sg-id",
        "ipProtocol": "tcp",
        "fromPort": RPC_PORT,
        "toPort": RPC_PORT,
        "cidrIp": "10.0.0.0/16",
    }
    found = added(stack, resources(stack), "aws-native:ec2:SecurityGroupIngress", "native", rule)
    reported(messages(stack, found), "rpc-only-from-main", "native", "10.0.0.0/16", "main node")


def test_the_rpc_port_from_an_address_through_classic_azure_is_reported() -> None:
    stack = preset("azure")
    rule = {
        "direction": "Inbound",
        "access": "Allow",
        "protocol": "Tcp",
        "sourceAddressPrefix": "10.0.0.0/16",
        "destinationPortRange": str(RPC_PORT),
        "priority": 150,
        "networkSecurityGroupName": f"{PROJECT}-nsg",
    }
    typ = "azure:network/networkSecurityRule:NetworkSecurityRule"
    found = added(stack, resources(stack), typ, "classic", rule)
    reported(messages(stack, found), "rpc-only-from-main", "classic", "10.0.0.0/16")


@pytest.mark.parametrize(
    ("typ", "props", "policy", "fix"),
    [
        (
            "aws-native:ec2:Instance",
            {"tags": [{"key": "project", "value": PROJECT}, {"key": "stack", "value": "aws-c8g"}],
             "iamInstanceProfile": "p"},
            "identity-on-main-only",
            "iamInstanceProfile",
        ),
        (
            "aws-native:ec2:Instance",
            {"tags": [{"key": "project", "value": PROJECT}, {"key": "stack", "value": "aws-c8g"}],
             "networkInterfaces": [{"deviceIndex": "0", "associatePublicIpAddress": True}]},
            "no-public-node-addresses",
            "associatePublicIpAddress",
        ),
        (
            "aws-native:ec2:Instance",
            {"tags": [{"key": "project", "value": PROJECT}, {"key": "stack", "value": "aws-c8g"}],
             "blockDeviceMappings": [{"deviceName": "/dev/sda1", "ebs": {"encrypted": False}}]},
            "encrypted-node-disks",
            "rootBlockDevice",
        ),
        (
            "aws-native:ec2:LaunchTemplate",
            {"launchTemplateData": {"metadataOptions": {"httpTokens": "optional",
                                                        "httpPutResponseHopLimit": 1}}},
            "aws-imdsv2-required",
            "http_tokens",
        ),
        (
            "azure:compute/linuxVirtualMachine:LinuxVirtualMachine",
            {"tags": {"project": PROJECT, "stack": "azure-cobalt"},
             "identity": {"type": "UserAssigned", "identityIds": ["/x"]}},
            "identity-on-main-only",
            "identity",
        ),
        (
            "azure:network/networkInterface:NetworkInterface",
            {"ipConfigurations": [{"name": "ip", "publicIpAddressId": "/pip"}]},
            "no-public-node-addresses",
            "public address",
        ),
    ],
)  # fmt: skip
def test_nodes_made_with_another_provider_are_judged_as_nodes(
    typ: str, props: dict[str, Any], policy: str, fix: str
) -> None:
    cloud = "aws" if typ.startswith("aws") else "azure"
    stack = preset(cloud)
    found = added(stack, resources(stack), typ, f"{PROJECT}-worker-9", props)
    reported(messages(stack, found), policy, f"{PROJECT}-worker-9", fix)


def test_a_classic_association_of_a_worker_nic_with_the_main_asg_is_reported() -> None:
    stack = preset("azure")
    typ = rules.AZURE_CLASSIC_ASG_ASSOCIATION
    props = {
        "networkInterfaceId": f"{PROJECT}-worker-1-nic-id",
        "applicationSecurityGroupId": ASG_MAIN,
    }
    found = added(stack, resources(stack), typ, "joined", props)
    reported(messages(stack, found), "rpc-only-from-main", "joined", "workers' group")
    # The main node's own NIC in its group is what the program does.
    props = {**props, "networkInterfaceId": f"{PROJECT}-main-nic-id"}
    assert not messages(stack, added(stack, resources(stack), typ, "own", props))[
        "rpc-only-from-main"
    ]


def test_an_extra_vm_whose_inline_nic_joins_the_main_asg_is_reported() -> None:
    stack = preset("azure")
    nic = {
        "name": "nic",
        "ipConfigurations": [
            {"name": "ip", "applicationSecurityGroups": [{"id": ASG_MAIN}], "subnet": {"id": "s"}}
        ],
    }
    props = {
        "tags": {"project": PROJECT, "stack": stack, "role": "worker"},
        "networkProfile": {"networkInterfaceConfigurations": [nic]},
    }
    found = added(stack, resources(stack), rules.AZURE_VM, "inline", props)
    reported(messages(stack, found), "rpc-only-from-main", "inline", "inline network interface")


# --- the API from a public range: no wider than the config check allows (a /24) ----------------


def test_the_api_from_a_public_16_is_the_internet() -> None:
    stack = preset("aws")
    rule = {
        "securityGroupId": f"{PROJECT}-main-sg-id",
        "ipProtocol": "tcp",
        "fromPort": 8080,
        "toPort": 8080,
        "cidrIpv4": "198.18.0.0/16",
    }
    found = added(stack, resources(stack), rules.AWS_INGRESS_RULE, "api-16", rule)
    only(messages(stack, found), "no-internet-ingress", "api-16", "198.18.0.0/16")
    narrow = added(stack, resources(stack), rules.AWS_INGRESS_RULE, "api-24", {
        **rule, "cidrIpv4": "198.18.0.0/24"})  # fmt: skip
    assert not any(messages(stack, narrow).values())


# --- host-network pods, metadata hop limits, secret stores, grants ---------------------------


@pytest.mark.parametrize(
    ("change", "fix"),
    [
        (lambda t: t["spec"].update(hostNetwork=True), "hostNetwork"),
        (lambda t: t["spec"]["containers"][0]["ports"][0].update(hostPort=50052), "hostPort"),
    ],
)
def test_a_worker_pod_on_the_hosts_network_is_reported(
    change: Callable[[dict[str, Any]], object], fix: str
) -> None:
    found = retyped(
        eks_resources(),
        rules.K8S_LEADER_WORKER_SET,
        LWS,
        lambda p: change(p["spec"]["leaderWorkerTemplate"]["workerTemplate"]),
    )
    reported(eks_messages(found), K8S_RPC, LWS, fix)


@pytest.mark.parametrize("hops", [2, None])
def test_a_metadata_hop_limit_over_one_is_reported(hops: int | None) -> None:
    stack = preset("aws")
    name = f"{PROJECT}-worker-1"

    def change(p: dict[str, Any]) -> None:
        p["metadataOptions"]["httpPutResponseHopLimit"] = hops
        if hops is None:
            del p["metadataOptions"]["httpPutResponseHopLimit"]

    found = changed(resources(stack), name, change)
    only(messages(stack, found), "aws-imdsv2-required", name, "http_put_response_hop_limit")


def test_the_api_key_kept_as_a_plain_ssm_string_is_reported() -> None:
    stack = preset("aws")
    name = f"{PROJECT}-api-key"
    found = changed(resources(stack), name, lambda p: p.update(type="String"))
    only(messages(stack, found), "secret-store-private", name, "SecureString")


@pytest.mark.parametrize(
    ("change", "fix"),
    [
        (lambda p: p["properties"]["networkAcls"].update(defaultAction="Allow"), "Deny"),
        (
            lambda p: p["properties"]["networkAcls"]["ipRules"].append({"value": "0.0.0.0/0"}),
            "ipRules",
        ),
        (lambda p: p["properties"].update(enableRbacAuthorization=False), "access policies"),
    ],
)
def test_a_key_vault_open_to_more_than_the_nodes_is_reported(
    change: Callable[[dict[str, Any]], object], fix: str
) -> None:
    stack = preset("azure")
    name = f"{PROJECT}-key-vault"
    found = changed(resources(stack), name, change)
    only(messages(stack, found), "secret-store-private", name, fix)


def test_a_secret_granted_to_everyone_is_reported() -> None:
    stack = preset("gcp")
    [grant] = [r for r in resources(stack) if r.type == rules.GCP_SECRET_GRANTS[0]]
    found = changed(resources(stack), grant.name, lambda p: p.update(member="allUsers"))
    reported(messages(stack, found), "secret-store-private", grant.name, "allUsers")


@pytest.mark.parametrize(
    ("cloud", "typ", "props", "fix"),
    [
        (
            "aws",
            rules.AWS_ROLE_POLICY_ATTACHMENT,
            {"role": "r", "policyArn": "arn:aws:iam::aws:policy/AdministratorAccess"},
            "AdministratorAccess",
        ),
        (
            "aws",
            rules.AWS_ROLE_POLICY,
            {"role": "r", "policy": json.dumps({"Version": "2012-10-17", "Statement": [
                {"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]})},
            "s3:*",
        ),
        (
            "aws",
            rules.AWS_ROLE_POLICY,
            {"role": "r", "policy": json.dumps({"Statement": [
                {"Effect": "Allow", "Action": "iam:PassRole", "Resource": "*"}]})},
            "every resource",
        ),
        (
            "aws",
            rules.AWS_SSM_DOCUMENT,
            {"documentType": "Command", "content": json.dumps({
                "schemaVersion": "2.2", "parameters": {"cmd": {"type": "String"}},
                "mainSteps": [{"action": "aws:runShellScript", "name": "run",
                               "inputs": {"runCommand": ["{{ cmd }}"]}}]})},
            "takes parameters",
        ),
        ("gcp", rules.GCP_PROJECT_GRANTS[0],
         {"project": "p", "role": "roles/editor", "member": "serviceAccount:x@p"}, "roles/editor"),
        ("gcp", rules.GCP_BUCKET_GRANTS[0],
         {"bucket": "b", "role": "roles/storage.objectViewer", "member": "allUsers"}, "allUsers"),
        ("azure", rules.AZURE_ROLE_ASSIGNMENT,
         {"principalId": "p", "roleDefinitionId": CONTRIBUTOR, "scope": "/subscriptions/s"},
         "administers its scope"),
        ("azure", "azure:authorization/assignment:Assignment",
         {"principalId": "p", "roleDefinitionName": "Owner", "scope": "/subscriptions/s"},
         "administers its scope"),
    ],
)  # fmt: skip
def test_a_broad_grant_is_reported(cloud: str, typ: str, props: dict[str, Any], fix: str) -> None:
    stack = preset(cloud)
    found = added(stack, resources(stack), typ, "broad", props)
    reported(messages(stack, found), "narrow-grants", "broad", fix)


# --- EKS nodes hold no network-interface rights -----------------------------------------------

EKS_PRESET = "aws-eks"  # the shipped EKS stack
NODE_ROLE = f"{PROJECT}-node-role"
CNI_POLICY = "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy"
ENI_STATEMENT = json.dumps(
    {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": ["ec2:*NetworkInterface*"], "Resource": "*"}],
    }
)


def test_the_cni_policy_is_on_the_cnis_own_role_not_the_nodes() -> None:
    found = resources(EKS_PRESET)
    attachments = {
        (r.props["role"], r.props["policyArn"])
        for r in found
        if r.type == rules.AWS_ROLE_POLICY_ATTACHMENT
    }
    assert (f"{PROJECT}-cni-role", CNI_POLICY) in attachments
    assert not [role for role, arn in attachments if arn == CNI_POLICY and role == NODE_ROLE]
    assert violations(EKS_PRESET, found)[ENI] == []


@pytest.mark.parametrize(
    ("typ", "props", "fix"),
    [
        (rules.AWS_ROLE_POLICY_ATTACHMENT, {"role": NODE_ROLE, "policyArn": CNI_POLICY},
         "AmazonEKS_CNI_Policy"),
        (rules.AWS_POLICY_ATTACHMENT, {"roles": [NODE_ROLE], "policyArn": CNI_POLICY},
         "AmazonEKS_CNI_Policy"),
        (rules.AWS_ROLE_POLICY, {"role": NODE_ROLE, "policy": ENI_STATEMENT},
         "ec2:*NetworkInterface*"),
    ],
)  # fmt: skip
def test_network_interface_rights_put_back_on_the_node_role_are_reported(
    typ: str, props: dict[str, Any], fix: str
) -> None:
    found = added(EKS_PRESET, resources(EKS_PRESET), typ, "cni-on-nodes", props)
    only(messages(EKS_PRESET, found), ENI, "cni-on-nodes", fix, NODE_ROLE, "node group")


def test_the_cni_policy_in_the_node_roles_own_list_is_reported() -> None:
    found = changed(
        resources(EKS_PRESET), NODE_ROLE, lambda p: p.update(managedPolicyArns=[CNI_POLICY])
    )
    only(messages(EKS_PRESET, found), ENI, NODE_ROLE, "AmazonEKS_CNI_Policy")


def test_a_preview_traces_an_unknown_role_through_its_dependencies() -> None:
    """In a first preview the node role's name and ARN are unknown: the attachment and the node
    group are traced to it by their properties' dependencies."""
    found = [
        rules.Resource(
            r.type,
            r.name,
            {**r.props, **({"name": rules.UNKNOWN, "arn": rules.UNKNOWN} if r.name == NODE_ROLE
                           else {})},
            r.urn,
            r.id,
            {"nodeRoleArn": [urn(EKS_PRESET, rules.AWS_ROLE, NODE_ROLE)]}
            if r.type == rules.AWS_EKS_NODE_GROUP
            else r.property_dependencies,
        )
        for r in resources(EKS_PRESET)
    ]  # fmt: skip
    assert violations(EKS_PRESET, found)[ENI] == []
    attachment = rules.Resource(
        rules.AWS_ROLE_POLICY_ATTACHMENT,
        "cni-on-nodes",
        {"role": rules.UNKNOWN, "policyArn": CNI_POLICY},
        urn(EKS_PRESET, rules.AWS_ROLE_POLICY_ATTACHMENT, "cni-on-nodes"),
        None,
        {"role": [urn(EKS_PRESET, rules.AWS_ROLE, NODE_ROLE)]},
    )
    [violation] = violations(EKS_PRESET, [*found, attachment])[ENI]
    assert "cni-on-nodes" in violation.message and NODE_ROLE in violation.message


def test_a_cni_without_a_role_of_its_own_is_reported() -> None:
    name = f"{PROJECT}-vpc-cni"
    found = changed(resources(EKS_PRESET), name, lambda p: p.pop("podIdentityAssociations"))
    only(messages(EKS_PRESET, found), ENI, name, "podIdentityAssociations", "aws-node")
    # IRSA is a role of its own too.
    irsa = changed(found, name, lambda p: p.update(serviceAccountRoleArn="arn:aws:iam::1:role/c"))
    assert violations(EKS_PRESET, irsa)[ENI] == []
