"""Every resource of every shipped stack, and of a matrix of variants, against its cloud's API
input rules (``infra.conformance``): mocks accept any input, the clouds do not.

Each rule family is shown to catch a broken input, the breakages the rules were written for
among them (an apostrophe in an EC2 rule description, a bucket name over 63 characters, a GCP
connection-tracking timeout without per-client affinity, an Azure VM that deletes a NIC it does
not own, a NAT gateway made before the internet gateway, two subnets of one VNet written at
once).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.clouds import FACTS
from infra.conformance import RESOURCE_RULES, rules
from infra.core.layout import PROJECT
from infra.core.limits import MAX_WORKERS
from tests.pulumi_mocks import (
    API_CIDRS,
    BASTION,
    CLOUD_STACKS,
    GUARDED,
    KMS_KEY,
    KUBERNETES_API_CIDRS,
    KUBERNETES_STACKS,
    LARGEST,
    NO_FLOW_LOGS,
    REPLICAS,
    Deployment,
    cloud_of,
    deployed,
    deployment,
    one_node,
    stack_names,
    staged_model,
)

NODE_TYPES = {
    "aws:ec2/instance:Instance",
    "aws:eks/nodeGroup:NodeGroup",
    "gcp:compute/instance:Instance",
    "azure-native:compute:VirtualMachine",
}
KUBERNETES_STACK = KUBERNETES_STACKS[0]
# The largest stacks, once per cloud.
LARGEST_CASES = [
    pytest.param(CLOUD_STACKS[cloud], "largest", id=f"{cloud}-largest") for cloud in sorted(FACTS)
]


def many_tags(cloud: str) -> dict[str, str]:
    """As many user tags as the cloud takes beside the program's, each as long as it may be."""
    if cloud == "gcp":
        return {f"k{i:02d}-" + "x" * 59: "v" * 63 for i in range(61)}
    # AWS and Azure: 50 a resource, of which the program sets 4 (Azure's OS disks).
    return {f"k{i:02d}" + "x" * 125: "v" * 256 for i in range(46)}


# Each variant, once per code path: its settings on each cloud's VM preset (None: not on that
# cloud) and on the EKS stack (None: not there). The largest stacks and another stack name:
# below.
VARIANTS: dict[str, tuple[Callable[[str], dict[str, Any] | None], dict[str, Any] | None]] = {
    "replicas": (lambda cloud: REPLICAS, REPLICAS),
    "one node": (lambda cloud: one_node(), one_node()),
    "staged model": (staged_model, None),
    "SSE-KMS staged model": (
        lambda cloud: (
            {**staged_model(cloud), "modelStoreKmsKey": KMS_KEY} if cloud == "aws" else None
        ),
        None,
    ),
    "no flow logs": (lambda cloud: NO_FLOW_LOGS, NO_FLOW_LOGS),
    "API CIDRs": (lambda cloud: API_CIDRS, API_CIDRS),
    # The balancer node's API rules (on Azure, with a Bastion: below).
    "replicas and API CIDRs": (
        lambda cloud: {**REPLICAS, **API_CIDRS} if cloud != "azure" else None,
        {**REPLICAS, **API_CIDRS},
    ),
    "many tags": (lambda cloud: {"tags": many_tags(cloud)}, {"tags": many_tags("aws")}),
    "bastion": (lambda cloud: BASTION if cloud == "azure" else None, None),
    "one group behind a bastion": (
        lambda cloud: {**API_CIDRS, "bastion": True} if cloud == "azure" else None,
        None,
    ),
    "zone or watcher set": (
        lambda cloud: {
            "aws": {"zone": "us-east-1c"},
            "gcp": {"zone": "us-central1-c"},
            "azure": {"networkWatcher": "ops-rg/nw-eastus"},
        }[cloud],
        {"zone": "us-east-1c"},
    ),
    "spend guards": (lambda cloud: GUARDED, None),
    "Kubernetes API CIDRs": (None, KUBERNETES_API_CIDRS),
    "another main type": (None, {"mainInstanceType": "c8g.8xlarge"}),
}


def variant_settings(stack: str, variant: str) -> dict[str, Any] | None:
    on_vms, on_kubernetes = VARIANTS[variant]
    if stack in KUBERNETES_STACKS:
        return on_kubernetes
    return on_vms(cloud_of(stack)) if on_vms else None


def run(stack: str, variant: str) -> Deployment:
    """A stack as shipped, or a variant of it (shared with the other files that deploy it)."""
    if variant == "as shipped":
        return deployed(stack)
    settings = LARGEST if variant == "largest" else variant_settings(stack, variant)
    assert settings is not None
    return deployment(stack, **settings)


def broken(d: Deployment) -> list[str]:
    return [str(v) for v in rules.violations(d.stack(), RESOURCE_RULES)]


CASES = [
    *(pytest.param(stack, "as shipped", id=f"{stack}-as-shipped") for stack in stack_names()),
    *(
        pytest.param(stack, variant, id=f"{stack}-{variant.replace(' ', '-')}")
        for stack in [*CLOUD_STACKS.values(), KUBERNETES_STACK]
        for variant in VARIANTS
        if variant_settings(stack, variant) is not None
    ),
]


@pytest.mark.parametrize(("stack", "variant"), CASES)
def test_every_resource_keeps_its_clouds_rules(stack: str, variant: str) -> None:
    d = run(stack, variant)
    assert any(r.typ in NODE_TYPES for r in d.resources)  # the program ran
    assert broken(d) == []


@pytest.mark.parametrize("cloud", sorted(FACTS))
def test_the_largest_stack_keeps_its_clouds_rules(cloud: str) -> None:
    d = run(CLOUD_STACKS[cloud], "largest")
    nodes = [r for r in d.resources if r.typ in NODE_TYPES and not r.name.endswith("-balancer")]
    assert len(nodes) == 3 * (MAX_WORKERS + 1)
    assert broken(d) == []


def test_the_largest_kubernetes_stack_keeps_its_clouds_rules() -> None:
    d = run(KUBERNETES_STACK, "largest")
    [pool] = d.of_type("aws:eks/nodeGroup:NodeGroup")
    assert pool.inputs["scalingConfig"]["desiredSize"] == 3 * (MAX_WORKERS + 1)
    assert broken(d) == []


@pytest.mark.parametrize("cloud", sorted(FACTS))
def test_a_stack_name_with_capitals_and_a_dot_keeps_its_clouds_rules(cloud: str) -> None:
    """Pulumi stack names may hold capitals and '.', GCP label values may not."""
    d = deployment(CLOUD_STACKS[cloud], stack_name="Prod.gcp", **REPLICAS)
    assert broken(d) == []
    tagged = [
        r
        for r in d.resources
        if isinstance(r.inputs.get("labels" if cloud == "gcp" else "tags"), dict)
    ]
    values = {r.inputs["labels" if cloud == "gcp" else "tags"]["stack"] for r in tagged}
    assert len(values) == 1
    [value] = values
    assert value == FACTS[cloud].tag_value("Prod.gcp")
    assert (value == "Prod.gcp") == (cloud != "gcp")


def test_every_type_the_program_creates_has_rules() -> None:
    made = {
        r.typ
        for stack, variant in [(c.values[0], c.values[1]) for c in CASES]
        for r in run(str(stack), str(variant)).resources
        if not r.typ.startswith(rules.PROGRAM_TYPE_PREFIX)
    }
    assert made <= set(RESOURCE_RULES)
    # ... and no rules for a type the program never makes (staged-model and balancer types
    # included: the matrix makes every one).
    assert set(RESOURCE_RULES) - made <= {"azure-native:network:SecurityRule"}


# --- each rule family catches a broken input ---------------------------------------------------


def changed(
    d: Deployment, typ: str, change: Callable[[rules.Registered], rules.Registered]
) -> rules.Stack:
    """The deployment's stack with the first resource of a type changed."""
    stack = d.stack()
    [first] = [r for r in stack.resources if r.type == typ][:1]
    resources = [change(r) if r is first else r for r in stack.resources]
    return dataclasses.replace(stack, resources=resources)


def with_inputs(**values: Any) -> Callable[[rules.Registered], rules.Registered]:
    return lambda r: dataclasses.replace(r, inputs={**r.inputs, **values})


def families(stack: rules.Stack) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for v in rules.violations(stack, RESOURCE_RULES):
        found.setdefault(v.family, []).append(v.message)
    return found


def only(stack: rules.Stack, family: str, *words: str) -> None:
    """The stack breaks rules of one family only, with a message holding the words."""
    found = families(stack)
    assert set(found) == {family}, found
    assert any(all(w in m for w in words) for m in found[family]), found


AWS = "aws-c8g"
AWS_INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"


def test_names_a_bucket_name_over_63_characters_is_caught() -> None:
    stack = changed(
        run(AWS, "replicas"),
        "aws:s3/bucket:Bucket",
        lambda r: dataclasses.replace(r, name="llama-rpc-cluster-flow-logs-" + "x" * 40),
    )
    only(stack, rules.NAME, "over 63")


def test_names_a_given_name_outside_the_rules_is_caught() -> None:
    only(
        changed(
            run("gcp-c4a", "as shipped"),
            "gcp:compute/instance:Instance",
            lambda r: dataclasses.replace(r, name="Llama-Main"),
        ),
        rules.NAME,
        "not a Compute Engine name",
    )
    only(
        changed(
            run("azure-cobalt", "as shipped"),
            "azure-native:storage:StorageAccount",
            with_inputs(accountName="LRCflow0123"),
        ),
        rules.NAME,
        "lowercase",
    )


def test_text_an_apostrophe_in_an_ec2_rule_description_is_caught() -> None:
    only(
        changed(
            run(AWS, "as shipped"),
            AWS_INGRESS,
            with_inputs(description="node metrics from inside the cluster's network"),
        ),
        rules.TEXT,
        '"\'"',
    )


def test_text_a_long_nsg_rule_description_is_caught() -> None:
    def long_description(r: rules.Registered) -> rules.Registered:
        first, *rest = r.inputs["securityRules"]
        return dataclasses.replace(
            r, inputs={**r.inputs, "securityRules": [{**first, "description": "x" * 141}, *rest]}
        )

    only(
        changed(
            run("azure-cobalt", "as shipped"),
            "azure-native:network:NetworkSecurityGroup",
            long_description,
        ),
        rules.TEXT,
        "141 characters",
    )


@pytest.mark.parametrize(
    ("stack", "typ", "prop", "tags", "words"),
    [
        (AWS, "aws:ec2/vpc:Vpc", "tags", {"aws:owner": "me"}, ("aws: prefix",)),
        (
            "gcp-c4a",
            "gcp:compute/instance:Instance",
            "labels",
            {"stack": "Prod.gcp"},
            ("label value",),
        ),
        (
            "azure-cobalt",
            "azure-native:network:VirtualNetwork",
            "tags",
            {"Team": "a", "team": "b"},
            ("differ only in case",),
        ),
        (AWS, "aws:ec2/vpc:Vpc", "tags", None, ("carries no tags",)),
    ],
)
def test_tags_a_tag_the_cloud_refuses_is_caught(
    stack: str, typ: str, prop: str, tags: dict[str, str] | None, words: tuple[str, ...]
) -> None:
    def retag(r: rules.Registered) -> rules.Registered:
        if tags is None:
            return dataclasses.replace(r, inputs={k: v for k, v in r.inputs.items() if k != prop})
        return with_inputs(**{prop: {**r.inputs[prop], **tags}})(r)

    only(changed(run(stack, "as shipped"), typ, retag), rules.TAGS, *words)


@pytest.mark.parametrize(
    ("stack", "variant", "typ", "values", "words"),
    [
        (
            AWS,
            "as shipped",
            "aws:ec2/flowLog:FlowLog",
            {"maxAggregationInterval": 300},
            ("60, 600",),
        ),
        # A volume of its own takes 2,000 MiB/s (as a launch volume does: below).
        (
            AWS,
            "as shipped",
            "aws:ebs/volume:Volume",
            {"throughput": 2001, "iops": 9000},
            ("throughput is 2001", "125-2000"),
        ),
        (
            "gcp-c4a",
            "as shipped",
            "gcp:compute/subnetwork:Subnetwork",
            {"logConfig": {"flowSampling": 2}},
            ("0-1",),
        ),
    ],
)
def test_values_a_value_out_of_bounds_is_caught(
    stack: str, variant: str, typ: str, values: dict[str, Any], words: tuple[str, ...]
) -> None:
    only(changed(run(stack, variant), typ, with_inputs(**values)), rules.VALUE, *words)


def secret(value: Any) -> dict[str, Any]:
    """A secret input as the engine hands it over (and the program's are)."""
    return {rules.SECRET_SIGNATURE: "1b47061264138c4ac30d75fd1eb44270", "value": value}


@pytest.mark.parametrize(
    ("stack", "typ", "values", "limit"),
    [
        (AWS, "aws:ssm/parameter:Parameter", {"value": secret("k" * 8193), "tier": "Advanced"},
         "1-8192"),
        ("gcp-c4a", "gcp:secretmanager/secretVersion:SecretVersion",
         {"secretData": secret("k" * 65_537)}, "1-65536"),
        # Empty: the wrapper itself is not, so only a rule that reads inside catches it.
        ("gcp-c4a", "gcp:secretmanager/secretVersion:SecretVersion",
         {"secretData": secret("")}, "holds 0 characters"),
        ("azure-cobalt", "azure-native:keyvault:Secret",
         {"properties": secret({"value": "k" * 25_601})}, "1-25600"),
    ],
)  # fmt: skip
def test_text_a_secret_over_its_stores_limit_is_caught_through_the_secret(
    stack: str, typ: str, values: dict[str, Any], limit: str
) -> None:
    """The program's keys reach the rules as secrets: the rule reads the value inside."""
    shipped = run(stack, "as shipped")
    [kept] = [r for r in shipped.resources if r.typ == typ][:1]
    assert any(rules.is_secret(v) for v in kept.inputs.values())  # as the program gives it
    only(changed(shipped, typ, with_inputs(**values)), rules.TEXT, limit)


def test_combinations_a_standard_parameter_over_4_kb_is_caught() -> None:
    """A boot file's parameter takes the advanced tier past a standard parameter's 4 KB."""
    shipped = run(AWS, "as shipped")
    value = secret("0644 " + "k" * 4092)
    standard = with_inputs(value=value, tier="Standard")
    only(changed(shipped, "aws:ssm/parameter:Parameter", standard), rules.COMBINATION, "4096")
    advanced = changed(
        shipped, "aws:ssm/parameter:Parameter", with_inputs(value=value, tier="Advanced")
    )
    assert not families(advanced)


@pytest.mark.parametrize(
    ("typ", "values"),
    [
        ("gcp:compute/instance:Instance", {"tags": ["Llama-main"]}),
        ("gcp:compute/firewall:Firewall", {"targetTags": ["a" * 64]}),
        ("gcp:compute/firewall:Firewall", {"sourceTags": ["main-"]}),
    ],
)
def test_combinations_a_gcp_network_tag_outside_rfc_1035_is_caught(
    typ: str, values: dict[str, Any]
) -> None:
    only(changed(run("gcp-c4a", "replicas"), typ, with_inputs(**values)), rules.COMBINATION,
         "network tag")  # fmt: skip


def test_combinations_a_vm_that_deletes_its_own_nic_is_caught() -> None:
    def delete_nic(r: rules.Registered) -> rules.Registered:
        [nic] = r.inputs["networkProfile"]["networkInterfaces"]
        profile = {"networkInterfaces": [{**nic, "deleteOption": "Delete"}]}
        return with_inputs(networkProfile=profile)(r)

    only(
        changed(
            run("azure-cobalt", "as shipped"), "azure-native:compute:VirtualMachine", delete_nic
        ),
        rules.COMBINATION,
        "set Detach",
    )


def test_combinations_gp3_throughput_beyond_its_iops_is_caught() -> None:
    def throttle(r: rules.Registered) -> rules.Registered:
        return with_inputs(
            rootBlockDevice={**r.inputs["rootBlockDevice"], "throughput": 1000, "iops": 3000}
        )(r)

    only(
        changed(run(AWS, "as shipped"), "aws:ec2/instance:Instance", throttle),
        rules.COMBINATION,
        "4000 IOPS",
    )


def test_values_a_launch_volume_takes_what_a_volume_takes_and_no_more() -> None:
    """RunInstances' EbsBlockDevice takes gp3's 125-2,000 MiB/s and 3,000-80,000 IOPS, as
    CreateVolume does (the EC2 service model, botocore 1.44.5)."""

    def speed(throughput: int, iops: int) -> Callable[[rules.Registered], rules.Registered]:
        return lambda r: with_inputs(
            rootBlockDevice={**r.inputs["rootBlockDevice"], "throughput": throughput, "iops": iops}
        )(r)

    shipped = run(AWS, "as shipped")
    assert not families(changed(shipped, "aws:ec2/instance:Instance", speed(2000, 8000)))
    only(
        changed(shipped, "aws:ec2/instance:Instance", speed(2500, 10_000)),
        rules.VALUE,
        "rootBlockDevice.throughput is 2500",
        "125-2000",
    )


def test_combinations_a_pod_no_node_can_hold_is_caught() -> None:
    """The requests each LeaderWorkerSet pod made before, every CPU of its node but one, leave
    no room for the controller's CPU, CoreDNS, the DaemonSets and the kubelet's reserve."""

    def greedy(r: rules.Registered) -> rules.Registered:
        spec = copy.deepcopy(dict(r.inputs["spec"]))
        template = spec["leaderWorkerTemplate"]
        for part in ("leaderTemplate", "workerTemplate"):
            [container] = template[part]["spec"]["containers"]
            container["resources"]["requests"]["cpu"] = "63"
        return with_inputs(spec=spec)(r)

    shipped = run(KUBERNETES_STACK, "as shipped")
    assert broken(shipped) == []
    only(
        changed(shipped, "kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet", greedy),
        rules.COMBINATION,
        "fits no node",
    )


@pytest.mark.parametrize(
    ("typ", "path", "change", "words"),
    [
        ("kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet",
         ("leaderWorkerTemplate", "workerTemplate", "spec"),
         lambda spec: spec.update(hostNetwork=True), "host namespaces: hostNetwork"),
        ("kubernetes:apps/v1:Deployment", ("template", "spec"),
         lambda spec: spec["securityContext"].pop("seccompProfile"), "seccomp"),
    ],
)  # fmt: skip
def test_combinations_a_pod_its_namespaces_pod_security_refuses_is_caught(
    typ: str, path: tuple[str, ...], change: Callable[[dict[str, Any]], object], words: str
) -> None:
    """The stack's namespace enforces the restricted profile: a pod template outside it would
    be refused by the API server."""

    def break_it(r: rules.Registered) -> rules.Registered:
        spec = copy.deepcopy(dict(r.inputs["spec"]))
        target = spec
        for key in path:
            target = target[key]
        change(target)
        return with_inputs(spec=spec)(r)

    only(changed(run(KUBERNETES_STACK, "replicas"), typ, break_it), rules.COMBINATION, words)


def test_names_a_volume_attached_as_the_root_device_is_caught() -> None:
    only(
        changed(
            run(AWS, "as shipped"),
            "aws:ec2/volumeAttachment:VolumeAttachment",
            with_inputs(deviceName="/dev/sda"),
        ),
        rules.NAME,
        "/dev/sd[f-p]",
    )


def test_combinations_a_volume_attached_across_zones_is_caught() -> None:
    only(
        changed(
            run(AWS, "as shipped"),
            "aws:ebs/volume:Volume",
            with_inputs(availabilityZone="us-east-1b"),
        ),
        rules.COMBINATION,
        "in us-east-1b attached to llama-rpc-cluster-main in us-east-1a",
    )


def test_order_a_nat_gateway_made_beside_the_internet_gateway_is_caught() -> None:
    def no_wait(r: rules.Registered) -> rules.Registered:
        return dataclasses.replace(
            r, depends_on=frozenset(n for n in r.depends_on if not n.endswith("-igw"))
        )

    only(
        changed(run(AWS, "as shipped"), "aws:ec2/natGateway:NatGateway", no_wait),
        rules.ORDER,
        "internet gateway",
    )


def test_order_two_subnets_of_one_vnet_written_at_once_are_caught() -> None:
    d = run("azure-cobalt", "bastion")
    stack = d.stack()
    subnets = [r for r in stack.resources if r.type == "azure-native:network:Subnet"]
    assert len(subnets) == 2
    assert families(stack) == {}
    loose = [
        dataclasses.replace(
            r, depends_on=frozenset(n for n in r.depends_on if not n.endswith("-private"))
        )
        if r.type == "azure-native:network:Subnet"
        else r
        for r in stack.resources
    ]
    only(dataclasses.replace(stack, resources=loose), rules.ORDER, "one subnet of a VNet at a time")


def test_an_nsg_rule_of_its_own_would_be_written_beside_the_others() -> None:
    """Standalone rules of one NSG, made at once, are caught; the program declares them in the
    NSG instead."""
    stack = run("azure-cobalt", "as shipped").stack()
    rule = {
        "networkSecurityGroupName": "llama-rpc-cluster-nsg",
        "securityRuleName": "a",
        "priority": 100,
    }
    extra = [
        rules.Registered(
            "azure-native:network:SecurityRule", f"rule-{i}", {**rule, "securityRuleName": f"r{i}"}
        )
        for i in range(2)
    ]
    only(
        dataclasses.replace(stack, resources=[*stack.resources, *extra]),
        rules.ORDER,
        "one write to an NSG",
    )


def test_unknown_type_a_resource_with_no_rules_is_caught() -> None:
    stack = run(AWS, "as shipped").stack()
    new = rules.Registered(
        "aws:ec2/keyPair:KeyPair", "llama-rpc-cluster-key", {"publicKey": "ssh-ed25519 AAAA"}
    )
    only(
        dataclasses.replace(stack, resources=[*stack.resources, new]),
        rules.UNKNOWN_TYPE,
        "no input rules",
    )


def rule_classes(cls: type[rules.Rule] = rules.Rule) -> Iterator[type[rules.Rule]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from rule_classes(sub)


def test_each_rule_family_is_shown_to_catch_a_broken_input_above() -> None:
    """``rules.FAMILIES`` is every family a rule or a missing rule set reports, and each is the
    one family some test of this file expects a broken input to break (``only``)."""
    calls = [
        node
        for node in ast.walk(ast.parse(Path(__file__).read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "only"
    ]
    shown = {
        getattr(rules, call.args[1].attr)
        for call in calls
        if len(call.args) > 1 and isinstance(call.args[1], ast.Attribute)
    }
    assert shown == set(rules.FAMILIES)
    reported = {c.family for c in rule_classes() if "family" in vars(c)} | {rules.UNKNOWN_TYPE}
    assert reported == set(rules.FAMILIES)


ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"


def test_combinations_a_roles_inline_policies_are_counted_together_without_white_space() -> None:
    """IAM's 10,240 characters are all of a role's inline policies together, white space not
    counted: two of 6,000 break it, one of 11,000 that is mostly white space does not."""
    shipped = run(AWS, "as shipped")
    stack = shipped.stack()
    main_policies = [
        r for r in stack.resources if r.type == ROLE_POLICY and r.name.startswith(f"{PROJECT}-main")
    ]
    assert len(main_policies) >= 2 and len({r.inputs["role"] for r in main_policies}) == 1
    first, second = main_policies[:2]
    large = {first.key: "x" * 6_000, second.key: "y" * 6_000}
    resources = [
        with_inputs(policy=large[r.key])(r) if r.key in large else r for r in stack.resources
    ]
    only(dataclasses.replace(stack, resources=resources), rules.COMBINATION, "12,", "together")
    spaced = "{" + " " * 3_000 + "z" * 8_000 + "}"
    assert not families(changed(shipped, ROLE_POLICY, with_inputs(policy=spaced)))


def test_an_ssm_parameter_pulumi_names_itself_keeps_the_rules() -> None:
    """pulumi-aws names a parameter when the program does not (its name input is optional)."""
    [name_rule] = [
        rule
        for rule in RESOURCE_RULES["aws:ssm/parameter:Parameter"].rules
        if isinstance(rule, rules.Name)
    ]
    assert name_rule.autoname is not None
    shipped = run(AWS, "as shipped")

    def unnamed(r: rules.Registered) -> rules.Registered:
        return dataclasses.replace(r, inputs={k: v for k, v in r.inputs.items() if k != "name"})

    assert not families(changed(shipped, "aws:ssm/parameter:Parameter", unnamed))
    reserved = with_inputs(name="/aws/llama")
    only(changed(shipped, "aws:ssm/parameter:Parameter", reserved), rules.NAME, "not a name")
