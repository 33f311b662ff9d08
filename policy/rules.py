"""The invariants every llama-rpc-cluster stack keeps, as plain functions over resource properties.

The policy pack (``__main__.py``) feeds these functions what Pulumi gives a policy: a resource's
type token and its properties under Pulumi's camelCase names (the inputs in a resource check,
the outputs in the stack check). The tests feed them what the program registers under mocks.
Nothing here imports pulumi or pulumi_policy, so the same code runs in both places.

* A resource validator is ``f(resource_type, props, name="") -> list[str]``: one message per
  violation, naming the resource and the fix. A type it does not know passes.
* The stack validator takes every resource of the stack (``Resource``) and returns
  ``Violation``s, which carry the URN of the resource at fault.

During a preview some values are not known yet (the id of a resource still to be created); the
pack hands them over as ``UNKNOWN``. A resource validator never reports a value it cannot see:
the engine checks each resource again, with its inputs known, before it creates it. The stack
check runs once the preview has every resource, so it traces an unknown group reference through
the property's dependencies, and reports a reference it cannot trace. One property can name the
main group beside others (an Azure NSG's inline rules name sources and destinations): there an
unknown reference passes the first preview, and the update's stack check, which sees every id,
traces it (an Azure id by the group's resource group and name).
"""

from __future__ import annotations

import fnmatch
import hashlib
import ipaddress
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

PROJECT: Final = "llama-rpc-cluster"
DEFAULT_RPC_PORT: Final = 50052  # the program's default for `llama-rpc-cluster:rpcPort`
RPC_PORT_KEY: Final = "rpcPort"  # in the policy's config, and in the stack's (project prefix)

# "The internet": one rule whose public sources together cover more addresses than one /24
# (IPv4), as the program's own check of apiAllowedCidrs and kubernetesApiCidrs allows (infra/
# core/network_rules.py, WIDEST_PUBLIC_API_PREFIX), or one /48 (IPv6). Counting addresses, not
# prefixes, also catches a range split into pieces within a rule (0.0.0.0/1 + 128.0.0.0/1, or
# many /25s); each piece wider than the threshold is caught on its own anyway.
WIDEST_PUBLIC_IPV4_SOURCE: Final = 24
WIDEST_PUBLIC_IPV6_SOURCE: Final = 48
# Public ranges that are a cloud's own service, not the internet: Google's IAP TCP forwarding,
# which the GCP stacks' tunnel comes from (cloud.google.com/iap/docs/using-tcp-forwarding,
# "Create a firewall rule"; infra/clouds/gcp.py, IAP_RANGE).
SERVICE_SOURCES: Final = (ipaddress.ip_network("35.235.240.0/20"),)
# Sources that are not the internet: RFC 1918, carrier-grade NAT (RFC 6598), IPv6 unique-local
# and link-local space. (Python's ``is_private`` is no test: it calls 0.0.0.0/1 private.)
INTERNAL_SOURCES: Final = tuple(
    ipaddress.ip_network(text)
    for text in (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "fc00::/7",
        "fe80::/10",
    )
)
# Azure sources that mean everyone. Any other word is a service tag, which stands for a
# service's public addresses (AzureCloud, AppService, Storage.eastus, …), where anyone can
# rent a machine or a site: only the VNet's own and the platform's probes are not the internet.
_OPEN_WORDS: Final = frozenset({"*", "any", "internet"})
_INTERNAL_SERVICE_TAGS: Final = frozenset({"virtualnetwork", "azureloadbalancer"})

# How the program names the main node and what only it carries (infra/clouds/*.py): AWS
# security group "<name>-main-sg", GCP network tag "<name>-main", Azure application security
# group "<name>-main-asg"; the main node is "<name>-main" and its Azure NIC "<name>-main-nic".
MAIN_SECURITY_GROUP: Final = re.compile(r".+-main-sg")
MAIN_NETWORK_TAG: Final = re.compile(r".+-main")
MAIN_APPLICATION_SECURITY_GROUP: Final = re.compile(r".+-main-asg")
MAIN_NODE: Final = re.compile(r".+-main")
MAIN_NIC: Final = re.compile(r".+-main-nic")

REQUIRED_NODE_TAGS: Final = ("project", "stack")

METRICS_PORT: Final = 9100  # prometheus-node-exporter on every node, read by its main node

AWS_INSTANCE: Final = "aws:ec2/instance:Instance"
AWS_SPOT_REQUEST: Final = "aws:ec2/spotInstanceRequest:SpotInstanceRequest"
AWS_LAUNCH_TEMPLATE: Final = "aws:ec2/launchTemplate:LaunchTemplate"
AWS_LAUNCH_CONFIGURATION: Final = "aws:ec2/launchConfiguration:LaunchConfiguration"
AWS_CLASSIC_ELB: Final = "aws:elb/loadBalancer:LoadBalancer"
GCP_INSTANCE_TEMPLATE: Final = "gcp:compute/instanceTemplate:InstanceTemplate"
GCP_REGION_INSTANCE_TEMPLATE: Final = "gcp:compute/regionInstanceTemplate:RegionInstanceTemplate"
GCP_POLICY_RULE_TYPES: Final = (
    "gcp:compute/networkFirewallPolicyRule:NetworkFirewallPolicyRule",
    "gcp:compute/regionNetworkFirewallPolicyRule:RegionNetworkFirewallPolicyRule",
    "gcp:compute/firewallPolicyRule:FirewallPolicyRule",
)
GCP_POLICY_WITH_RULES_TYPES: Final = (
    "gcp:compute/networkFirewallPolicyWithRules:NetworkFirewallPolicyWithRules",
    "gcp:compute/regionNetworkFirewallPolicyWithRules:RegionNetworkFirewallPolicyWithRules",
    "gcp:compute/firewallPolicyWithRules:FirewallPolicyWithRules",
)
AZURE_SCALE_SET: Final = "azure-native:compute:VirtualMachineScaleSet"
AWS_EIP: Final = "aws:ec2/eip:Eip"
AWS_EIP_ASSOCIATION: Final = "aws:ec2/eipAssociation:EipAssociation"
AWS_EBS_VOLUME: Final = "aws:ebs/volume:Volume"
AWS_SECURITY_GROUP: Final = "aws:ec2/securityGroup:SecurityGroup"
AWS_DEFAULT_SECURITY_GROUP: Final = "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup"
AWS_SECURITY_GROUP_RULE: Final = "aws:ec2/securityGroupRule:SecurityGroupRule"
AWS_INGRESS_RULE: Final = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
GCP_INSTANCE: Final = "gcp:compute/instance:Instance"
GCP_FIREWALL: Final = "gcp:compute/firewall:Firewall"
AZURE_SECURITY_RULE: Final = "azure-native:network:SecurityRule"
AZURE_NSG: Final = "azure-native:network:NetworkSecurityGroup"
AZURE_ASG: Final = "azure-native:network:ApplicationSecurityGroup"
AZURE_NIC: Final = "azure-native:network:NetworkInterface"
AZURE_VM: Final = "azure-native:compute:VirtualMachine"
AWS_LOAD_BALANCER: Final = "aws:lb/loadBalancer:LoadBalancer"
AWS_ALB: Final = "aws:alb/loadBalancer:LoadBalancer"
GCP_FORWARDING_RULE: Final = "gcp:compute/forwardingRule:ForwardingRule"
GCP_GLOBAL_FORWARDING_RULE: Final = "gcp:compute/globalForwardingRule:GlobalForwardingRule"
AZURE_LOAD_BALANCER: Final = "azure-native:network:LoadBalancer"
AZURE_ROLE_ASSIGNMENT: Final = "azure-native:authorization:RoleAssignment"
AZURE_ROLE_DEFINITION: Final = "azure-native:authorization:RoleDefinition"
# A spend guard's one permission on Azure: a node deallocates its own VM (infra/stack/backends/
# azure.py, DEALLOCATE_ACTION), through a custom role assigned at that VM's scope.
DEALLOCATE_ACTION: Final = "Microsoft.Compute/virtualMachines/deallocate/action"
AWS_EKS_CLUSTER: Final = "aws:eks/cluster:Cluster"
AWS_EKS_NODE_GROUP: Final = "aws:eks/nodeGroup:NodeGroup"
K8S_SERVICE: Final = "kubernetes:core/v1:Service"
K8S_SERVICE_PATCH: Final = "kubernetes:core/v1:ServicePatch"
K8S_NETWORK_POLICY: Final = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
K8S_LEADER_WORKER_SET: Final = "kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet"
_AWS_GROUPS: Final = (AWS_SECURITY_GROUP, AWS_DEFAULT_SECURITY_GROUP)
# Azure's default inbound rules start here (AllowVnetInBound, 65000).
AZURE_DEFAULT_RULES_PRIORITY: Final = 65000


class _Unknown:
    """A value Pulumi does not know yet (during a preview). One instance: ``UNKNOWN``."""

    _instance: _Unknown | None = None

    def __new__(cls) -> _Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Final = _Unknown()


@dataclass(frozen=True)
class Resource:
    """One resource of the stack, as the stack check sees it."""

    type: str
    name: str
    props: Mapping[str, Any]
    urn: str = ""
    # The provider's id when known (under the tests' mocks, "<name>-id").
    id: str | None = None
    # Property name -> URNs of the resources its value was computed from.
    property_dependencies: Mapping[str, Sequence[str]] = field(default_factory=dict)


class Violation(NamedTuple):
    message: str
    urn: str


# --- reading properties ------------------------------------------------------------------------


def canonical_type(resource_type: str) -> str:
    """The type token the rules judge: without an Azure API version
    (``azure-native:network/v20240301:X``), and for the same resource written with another
    provider of its cloud (AWS's Cloud Control ``aws-native``, Azure's classic ``azure``), the
    type it stands for (``ALIASES``)."""
    kind = re.sub(r"^(azure-native:[A-Za-z]+)/v[0-9a-z]+:", r"\1:", resource_type)
    alias = ALIASES.get(kind)
    return alias.type if alias is not None else kind


# --- the same resources through the clouds' other providers ------------------------------------


def _tag_map(value: Any) -> Any:
    """aws-native's tags (``[{key, value}]``) as the aws provider's map."""
    if not _known(value) or isinstance(value, Mapping):
        return value
    return {
        _mapping(tag).get("key"): _mapping(tag).get("value")
        for tag in _items(value)
        if isinstance(_mapping(tag).get("key"), str)
    }


def _aws_native_rule(rule: Mapping[str, Any]) -> dict[str, Any]:
    """An aws-native ingress entry (a SecurityGroupIngress, or a SecurityGroup's inline one) in
    the aws provider's SecurityGroupRule words."""
    source = rule.get("sourceSecurityGroupId")
    return {
        "type": "ingress",
        "securityGroupId": rule.get("groupId"),
        "protocol": rule.get("ipProtocol"),
        "fromPort": rule.get("fromPort"),
        "toPort": rule.get("toPort"),
        "cidrBlocks": _strings(rule.get("cidrIp")),
        "ipv6CidrBlocks": _strings(rule.get("cidrIpv6")),
        "prefixListIds": _strings(rule.get("sourcePrefixListId")),
        "sourceSecurityGroupId": source,
        "securityGroups": _strings(source),
    }


def _from_aws_native_group(props: Mapping[str, Any]) -> dict[str, Any]:
    ingress = props.get("securityGroupIngress")
    return {
        **props,
        "tags": _tag_map(props.get("tags")),
        "ingress": [_aws_native_rule(_mapping(r)) for r in _items(ingress)]
        if _known(ingress)
        else UNKNOWN,
    }


def _from_aws_native_instance(props: Mapping[str, Any]) -> dict[str, Any]:
    nics = [_mapping(n) for n in _items(props.get("networkInterfaces"))]
    public: Any = None
    if any(n.get("associatePublicIpAddress") is UNKNOWN for n in nics):
        public = UNKNOWN
    elif nics:
        public = any(n.get("associatePublicIpAddress") is True for n in nics)
    disks = [_mapping(_mapping(d).get("ebs")) for d in _items(props.get("blockDeviceMappings"))]
    return {
        **props,
        "tags": _tag_map(props.get("tags")),
        "associatePublicIpAddress": public,
        "vpcSecurityGroupIds": _strings(props.get("securityGroupIds"))
        + [g for n in nics for g in _strings(n.get("groupSet"))],
        # No mapping: the AMI's snapshot decides, as an unset rootBlockDevice.encrypted does.
        "rootBlockDevice": {
            "encrypted": all(d.get("encrypted") is True for d in disks) if disks else None
        },
        "ebsBlockDevices": [{"encrypted": d.get("encrypted")} for d in disks],
        # aws-native's Instance has no metadata options of its own: a launch template's.
        "metadataOptions": props.get("metadataOptions"),
    }


def _from_aws_native_template(props: Mapping[str, Any]) -> dict[str, Any]:
    data = _mapping(props.get("launchTemplateData"))
    if not _known(props.get("launchTemplateData")):
        return {key: UNKNOWN for key in ("metadataOptions", "iamInstanceProfile")}
    return {**data, "vpcSecurityGroupIds": _strings(data.get("securityGroupIds"))}


def _from_aws_native_balancer(props: Mapping[str, Any]) -> dict[str, Any]:
    scheme = props.get("scheme")
    internal = scheme if not _known(scheme) else scheme == "internal"
    return {**props, "internal": internal}


def _from_aws_native_eks(props: Mapping[str, Any]) -> dict[str, Any]:
    return {**props, "vpcConfig": props.get("resourcesVpcConfig")}


def _azure_classic_rule(rule: Mapping[str, Any]) -> dict[str, Any]:
    """A classic azure security rule (standalone or inline) in azure-native's words."""
    groups = rule.get("sourceApplicationSecurityGroupIds")
    return {
        **rule,
        "sourceApplicationSecurityGroups": [{"id": g} for g in _strings(groups)]
        if _known(groups)
        else UNKNOWN,
    }


def _from_azure_classic_nsg(props: Mapping[str, Any]) -> dict[str, Any]:
    rules = props.get("securityRules")
    return {
        **props,
        "networkSecurityGroupName": props.get("name"),
        "securityRules": [_azure_classic_rule(_mapping(r)) for r in _items(rules)]
        if _known(rules)
        else UNKNOWN,
    }


def _from_azure_classic_nic(props: Mapping[str, Any]) -> dict[str, Any]:
    configs = props.get("ipConfigurations")
    if not _known(configs):
        return {**props}
    return {
        **props,
        "ipConfigurations": [
            {**_mapping(c), "publicIPAddress": _mapping(c).get("publicIpAddressId")}
            for c in _items(configs)
        ],
    }


def _from_azure_classic_vm(props: Mapping[str, Any]) -> dict[str, Any]:
    identity = props.get("identity")
    os_disk = _mapping(props.get("storageOsDisk"))
    return {
        **props,
        "identity": {
            **_mapping(identity),
            "userAssignedIdentities": _strings(_mapping(identity).get("identityIds")),
        }
        if _present(identity) and _known(identity)
        else identity,
        "storageProfile": {"osDisk": {"vhd": os_disk.get("vhdUri")}},
    }


def _from_azure_classic_balancer(props: Mapping[str, Any]) -> dict[str, Any]:
    return {
        **props,
        "frontendIPConfigurations": [
            {
                "publicIPAddress": _mapping(f).get("publicIpAddressId"),
                "publicIPPrefix": _mapping(f).get("publicIpPrefixId"),
            }
            for f in _items(props.get("frontendIpConfigurations"))
        ],
    }


class Alias(NamedTuple):
    """A resource type of another provider: the type the rules judge it as, its properties in
    that type's words, and which of its properties became which (for their dependencies)."""

    type: str
    props: Callable[[Mapping[str, Any]], Mapping[str, Any]]
    renamed: Mapping[str, str] = {}


AZURE_CLASSIC_ASG_ASSOCIATION: Final = (
    "azure:network/networkInterfaceApplicationSecurityGroupAssociation:"
    "NetworkInterfaceApplicationSecurityGroupAssociation"
)
ALIASES: Final[Mapping[str, Alias]] = {
    "aws-native:ec2:SecurityGroupIngress": Alias(
        AWS_SECURITY_GROUP_RULE, _aws_native_rule, {"groupId": "securityGroupId"}
    ),
    "aws-native:ec2:SecurityGroup": Alias(
        AWS_SECURITY_GROUP, _from_aws_native_group, {"securityGroupIngress": "ingress"}
    ),
    "aws-native:ec2:Instance": Alias(
        AWS_INSTANCE, _from_aws_native_instance, {"securityGroupIds": "vpcSecurityGroupIds"}
    ),
    "aws-native:ec2:LaunchTemplate": Alias(AWS_LAUNCH_TEMPLATE, _from_aws_native_template),
    "aws-native:ec2:Eip": Alias(AWS_EIP, dict),
    "aws-native:ec2:EipAssociation": Alias(AWS_EIP_ASSOCIATION, dict),
    "aws-native:ec2:Volume": Alias(AWS_EBS_VOLUME, dict),
    "aws-native:elasticloadbalancingv2:LoadBalancer": Alias(
        AWS_LOAD_BALANCER, _from_aws_native_balancer
    ),
    "aws-native:eks:Cluster": Alias(AWS_EKS_CLUSTER, _from_aws_native_eks),
    "aws-native:eks:Nodegroup": Alias(AWS_EKS_NODE_GROUP, dict),
    "azure:network/networkSecurityRule:NetworkSecurityRule": Alias(
        AZURE_SECURITY_RULE,
        _azure_classic_rule,
        {"sourceApplicationSecurityGroupIds": "sourceApplicationSecurityGroups"},
    ),
    "azure:network/networkSecurityGroup:NetworkSecurityGroup": Alias(
        AZURE_NSG, _from_azure_classic_nsg
    ),
    "azure:network/networkInterface:NetworkInterface": Alias(AZURE_NIC, _from_azure_classic_nic),
    "azure:network/applicationSecurityGroup:ApplicationSecurityGroup": Alias(AZURE_ASG, dict),
    "azure:compute/linuxVirtualMachine:LinuxVirtualMachine": Alias(
        AZURE_VM, _from_azure_classic_vm
    ),
    "azure:compute/windowsVirtualMachine:WindowsVirtualMachine": Alias(
        AZURE_VM, _from_azure_classic_vm
    ),
    "azure:compute/virtualMachine:VirtualMachine": Alias(AZURE_VM, _from_azure_classic_vm),
    "azure:compute/linuxVirtualMachineScaleSet:LinuxVirtualMachineScaleSet": Alias(
        AZURE_SCALE_SET, dict
    ),
    "azure:compute/windowsVirtualMachineScaleSet:WindowsVirtualMachineScaleSet": Alias(
        AZURE_SCALE_SET, dict
    ),
    "azure:compute/orchestratedVirtualMachineScaleSet:OrchestratedVirtualMachineScaleSet": Alias(
        AZURE_SCALE_SET, dict
    ),
    "azure:lb/loadBalancer:LoadBalancer": Alias(AZURE_LOAD_BALANCER, _from_azure_classic_balancer),
    "azure:authorization/assignment:Assignment": Alias(AZURE_ROLE_ASSIGNMENT, dict),
    "azure:authorization/roleDefinition:RoleDefinition": Alias(AZURE_ROLE_DEFINITION, dict),
}


def translated(resource_type: str, props: Mapping[str, Any]) -> Mapping[str, Any]:
    """A resource's properties in the words of the type the rules judge it as."""
    kind = re.sub(r"^(azure-native:[A-Za-z]+)/v[0-9a-z]+:", r"\1:", resource_type)
    alias = ALIASES.get(kind)
    return alias.props(props) if alias is not None else props


def as_judged(resource: Resource) -> Resource:
    """A stack's resource with its properties (and their dependencies) in the judged words."""
    alias = ALIASES.get(resource.type)
    if alias is None:
        return resource
    dependencies = {
        alias.renamed.get(key, key): urns for key, urns in resource.property_dependencies.items()
    }
    return Resource(
        resource.type,
        resource.name,
        alias.props(resource.props),
        resource.urn,
        resource.id,
        dependencies,
    )


def _known(value: Any) -> bool:
    return value is not UNKNOWN


def _present(value: Any) -> bool:
    """Set to something: not None, and not an empty string or collection."""
    if value is None:
        return False
    if isinstance(value, str | Sequence | Mapping):
        return len(value) > 0
    return True


def _items(value: Any) -> list[Any]:
    """A list property as a list (absent, unknown or not a list: empty)."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        return list(value)
    return []


def _strings(value: Any) -> list[Any]:
    """A string or list-of-strings property as a list; unknown values stay ``UNKNOWN``."""
    if value is UNKNOWN:
        return [UNKNOWN]
    if isinstance(value, str):
        return [value] if value else []
    return [v for v in _items(value) if v is UNKNOWN or (isinstance(v, str) and v)]


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _flat(rule: Any) -> Mapping[str, Any]:
    """An Azure sub-resource's fields, whether given flat or under ``properties``."""
    rule = _mapping(rule)
    return {**rule, **_mapping(rule.get("properties"))}


def _shown(values: Iterable[Any]) -> str:
    return ", ".join("(unknown)" if v is UNKNOWN else str(v) for v in values)


def _label(resource_type: str, name: str) -> str:
    return f"{resource_type} {name}" if name else resource_type


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def rpc_port(policy_value: Any = None, stack_value: Any = None) -> int:
    """The RPC port to guard: the policy's ``rpcPort``, else the stack's
    ``llama-rpc-cluster:rpcPort``, else the program's default (50052)."""
    for source, value in (
        (f"policy config {RPC_PORT_KEY}", policy_value),
        (f"{PROJECT}:{RPC_PORT_KEY}", stack_value),
    ):
        if value is None or value == "":
            continue
        port = _int(value)
        if port is None or not 1 <= port <= 65535:
            raise ValueError(f"{source} is {value!r}; give a TCP port (1-65535)")
        return port
    return DEFAULT_RPC_PORT


# --- invariant 1: no ingress from the internet --------------------------------------------------


def _span(network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> tuple[int, int]:
    return int(network.network_address), int(network.broadcast_address)


def _internal(network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    first, last = _span(network)
    return any(
        space.version == network.version and _span(space)[0] <= first and last <= _span(space)[1]
        for space in INTERNAL_SOURCES
    )


def _union_size(spans: Iterable[tuple[int, int]]) -> int:
    """How many addresses some ranges cover together (overlaps counted once)."""
    total, reach = 0, -1
    for first, last in sorted(spans):
        if last > reach:
            total += last - max(first, reach + 1) + 1
            reach = last
    return total


def internet_sources(sources: Iterable[Any]) -> list[str]:
    """The sources of one rule that admit the internet: words meaning everyone, or public
    ranges (a cloud's own service's aside) that together cover more than a /24 (IPv4) or a /48
    (IPv6). Empty when none."""
    words: list[str] = []
    public: dict[int, list[tuple[str, tuple[int, int]]]] = {4: [], 6: []}
    for source in sources:
        if not isinstance(source, str) or not source.strip():
            continue
        text = source.strip()
        if text.lower() in _OPEN_WORDS:
            words.append(text)
            continue
        try:
            network = ipaddress.ip_network(text, strict=False)
        except ValueError:
            if text.lower() not in _INTERNAL_SERVICE_TAGS:
                words.append(text)  # a service tag: public addresses of a service
            continue
        if not _internal(network) and not any(
            network.version == service.version and network.subnet_of(service)  # type: ignore[arg-type]
            for service in SERVICE_SOURCES
        ):
            public[network.version].append((text, _span(network)))
    found = words
    for version, bits, widest in (
        (4, 32, WIDEST_PUBLIC_IPV4_SOURCE),
        (6, 128, WIDEST_PUBLIC_IPV6_SOURCE),
    ):
        ranges = public[version]
        if _union_size(span for _, span in ranges) > 2 ** (bits - widest):
            found += [text for text, _ in ranges]
    return found


def _open(label: str, what: str, sources: Iterable[Any]) -> list[str]:
    found = internet_sources(sources)
    if not found:
        return []
    return [
        f"{label}: {what} admits the internet from {', '.join(found)} (public sources wider "
        f"than /{WIDEST_PUBLIC_IPV4_SOURCE} in IPv4 or /{WIDEST_PUBLIC_IPV6_SOURCE} in IPv6 "
        "count as the internet); remove those sources and reach the nodes through the private "
        "tunnel (connectCommand), or admit only your own network's range"
    ]


def _cidrs(rule: Mapping[str, Any]) -> list[Any]:
    return _strings(rule.get("cidrBlocks")) + _strings(rule.get("ipv6CidrBlocks"))


def _azure_sources(rule: Mapping[str, Any]) -> list[Any]:
    return _strings(rule.get("sourceAddressPrefix")) + _strings(rule.get("sourceAddressPrefixes"))


def _gcp_ingress(props: Mapping[str, Any]) -> bool:
    direction = props.get("direction")
    return direction in (None, "", UNKNOWN) or str(direction).upper() == "INGRESS"


def _azure_inbound_allow(rule: Mapping[str, Any]) -> bool:
    return (
        str(rule.get("direction", "")).lower() == "inbound"
        and str(rule.get("access", "")).lower() == "allow"
    )


def _open_aws_ingress_rule(label: str, props: Mapping[str, Any]) -> list[str]:
    return _open(label, "this ingress rule", [props.get("cidrIpv4"), props.get("cidrIpv6")])


def _open_aws_group_rule(label: str, props: Mapping[str, Any]) -> list[str]:
    if str(props.get("type", "")).lower() != "ingress":
        return []
    return _open(label, "this ingress rule", _cidrs(props))


def _open_aws_group(label: str, props: Mapping[str, Any]) -> list[str]:
    found: list[str] = []
    for i, rule in enumerate(_items(props.get("ingress"))):
        found += _open(label, f"inline ingress[{i}]", _cidrs(_mapping(rule)))
    return found


def _open_gcp_firewall(label: str, props: Mapping[str, Any]) -> list[str]:
    if not _gcp_ingress(props) or not _items(props.get("allows")):
        return []  # egress, or a deny rule
    ranges = _strings(props.get("sourceRanges"))
    if not ranges and not any(
        _present(props.get(key)) for key in ("sourceTags", "sourceServiceAccounts")
    ):
        return [
            f"{label}: this ingress rule names no source, and GCP then admits 0.0.0.0/0 (the "
            "internet); set source_tags (or source_ranges) to the sources that need the port"
        ]
    return _open(label, "this ingress rule", ranges)


def _gcp_policy_rules(kind: str, props: Mapping[str, Any], label: str) -> list[tuple[str, Any]]:
    """(where, rule) of each rule of a GCP firewall policy resource (a rule of its own, or a
    policy that lists its rules)."""
    if kind in GCP_POLICY_RULE_TYPES:
        return [(label, props)]
    if kind in GCP_POLICY_WITH_RULES_TYPES:
        return [
            (f"{label} rules[{i}]", _mapping(rule))
            for i, rule in enumerate(_items(props.get("rules")))
        ]
    return []


def _gcp_policy_allows_in(rule: Mapping[str, Any]) -> bool:
    return str(rule.get("action", "")).lower() == "allow" and _gcp_ingress(rule)


def _gcp_policy_covers(rule: Mapping[str, Any], port: int) -> bool:
    configs = _items(_mapping(rule.get("match")).get("layer4Configs"))
    if not configs:
        return True  # every protocol and port
    return _gcp_admits_port(configs, "ipProtocol", port)


def _open_gcp_policy(label: str, props: Mapping[str, Any], kind: str) -> list[str]:
    found: list[str] = []
    for where, rule in _gcp_policy_rules(kind, props, label):
        if _gcp_policy_allows_in(rule):
            ranges = _strings(_mapping(rule.get("match")).get("srcIpRanges"))
            found += _open(where, "this firewall policy rule", ranges)
    return found


def _open_azure_rule(label: str, props: Mapping[str, Any]) -> list[str]:
    if not _azure_inbound_allow(props):
        return []
    return _open(label, "this inbound Allow rule", _azure_sources(props))


def _open_azure_nsg(label: str, props: Mapping[str, Any]) -> list[str]:
    found: list[str] = []
    for i, item in enumerate(_items(props.get("securityRules"))):
        rule = _flat(item)
        if _azure_inbound_allow(rule):
            what = f"inbound Allow rule {rule.get('name') or f'securityRules[{i}]'}"
            found += _open(label, what, _azure_sources(rule))
    return found


_OPEN_CHECKS: Final[Mapping[str, Callable[[str, Mapping[str, Any]], list[str]]]] = {
    AWS_INGRESS_RULE: _open_aws_ingress_rule,
    AWS_SECURITY_GROUP_RULE: _open_aws_group_rule,
    AWS_SECURITY_GROUP: _open_aws_group,
    AWS_DEFAULT_SECURITY_GROUP: _open_aws_group,
    GCP_FIREWALL: _open_gcp_firewall,
    AZURE_SECURITY_RULE: _open_azure_rule,
    AZURE_NSG: _open_azure_nsg,
}


def no_internet_ingress(resource_type: str, props: Mapping[str, Any], name: str = "") -> list[str]:
    """Invariant 1: no firewall rule admits the internet, on any port."""
    kind = canonical_type(resource_type)
    if kind in (*GCP_POLICY_RULE_TYPES, *GCP_POLICY_WITH_RULES_TYPES):
        return _open_gcp_policy(_label(resource_type, name), props, kind)
    check = _OPEN_CHECKS.get(kind)
    return check(_label(resource_type, name), props) if check else []


# --- invariant 3: no public addresses on nodes ------------------------------------------------


def _public_aws_instance(label: str, props: Mapping[str, Any]) -> list[str]:
    public = props.get("associatePublicIpAddress")
    if public is False or not _known(public):
        return []
    state = "is not set (the subnet's default decides)" if public is None else "is true"
    return [
        f"{label}: associatePublicIpAddress {state}; set associate_public_ip_address=False: "
        "nodes stay private and reach the internet through the NAT gateway"
    ]


def _global_ipv6_aws(label: str, props: Mapping[str, Any], where: str = "") -> list[str]:
    """An AWS IPv6 address is global: reachable from the internet wherever a route allows."""
    count = _int(props.get("ipv6AddressCount"))
    if (count or 0) > 0 or _present(props.get("ipv6Addresses")):
        return [
            f"{label}: {where}ipv6AddressCount/ipv6Addresses give the node a global IPv6 "
            "address; remove them: nodes stay on the private IPv4 network"
        ]
    return []


def _public_aws_node(label: str, props: Mapping[str, Any]) -> list[str]:
    return _public_aws_instance(label, props) + _global_ipv6_aws(label, props)


def _public_aws_template(label: str, props: Mapping[str, Any]) -> list[str]:
    """A launch template's (or configuration's) interfaces, which every node it makes gets."""
    found: list[str] = []
    public = props.get("associatePublicIpAddress")
    if _known(public) and str(public).lower() == "true":
        found.append(f"{label}: associatePublicIpAddress is true; remove it")
    for i, item in enumerate(_items(props.get("networkInterfaces"))):
        nic = _mapping(item)
        public = nic.get("associatePublicIpAddress")
        if _known(public) and str(public).lower() == "true":
            found.append(
                f"{label}: networkInterfaces[{i}].associatePublicIpAddress is true; remove it: "
                "nodes stay private and reach the internet through the NAT gateway"
            )
        found += _global_ipv6_aws(label, nic, f"networkInterfaces[{i}].")
    return found


def _public_aws_eip(label: str, props: Mapping[str, Any]) -> list[str]:
    keys = ("instance", "networkInterface", "instanceId", "networkInterfaceId")
    attached = [key for key in keys if _present(props.get(key))]
    if not attached:
        return []
    return [
        f"{label}: gives a node a public address ({', '.join(attached)}); remove the "
        "attachment: only the NAT gateway holds a public address"
    ]


def _public_gcp_instance(label: str, props: Mapping[str, Any]) -> list[str]:
    found: list[str] = []
    for i, nic in enumerate(_items(props.get("networkInterfaces"))):
        for key in ("accessConfigs", "ipv6AccessConfigs"):
            value = _mapping(nic).get(key)
            if _present(value) and _known(value):
                found.append(
                    f"{label}: networkInterfaces[{i}].{key} gives the VM an external address; "
                    f"remove {key}: egress goes through Cloud NAT and access through IAP"
                )
    return found


def _public_azure_nic(label: str, props: Mapping[str, Any]) -> list[str]:
    found: list[str] = []
    for i, config in enumerate(_items(props.get("ipConfigurations"))):
        for key in ("publicIPAddress", "publicIpAddress"):
            value = _flat(config).get(key)
            if _present(value) and _known(value):
                found.append(
                    f"{label}: ipConfigurations[{i}].{key} gives the VM a public address; "
                    "remove it: egress goes through the NAT gateway"
                )
    return found


def _public_azure_scale_set(label: str, props: Mapping[str, Any]) -> list[str]:
    profile = _mapping(props.get("virtualMachineProfile"))
    return _public_azure_vm(label, profile)


def _public_azure_vm(label: str, props: Mapping[str, Any]) -> list[str]:
    found: list[str] = []
    network = _mapping(props.get("networkProfile"))
    for i, nic in enumerate(_items(network.get("networkInterfaceConfigurations"))):
        for j, config in enumerate(_items(_flat(nic).get("ipConfigurations"))):
            if _present(_flat(config).get("publicIPAddressConfiguration")):
                found.append(
                    f"{label}: networkProfile.networkInterfaceConfigurations[{i}]"
                    f".ipConfigurations[{j}].publicIPAddressConfiguration gives the VM a public "
                    "address; remove it: egress goes through the NAT gateway"
                )
    return found


_PUBLIC_CHECKS: Final[Mapping[str, Callable[[str, Mapping[str, Any]], list[str]]]] = {
    AWS_INSTANCE: _public_aws_node,
    AWS_SPOT_REQUEST: _public_aws_node,
    AWS_LAUNCH_TEMPLATE: _public_aws_template,
    AWS_LAUNCH_CONFIGURATION: _public_aws_template,
    AWS_EIP: _public_aws_eip,
    AWS_EIP_ASSOCIATION: _public_aws_eip,
    GCP_INSTANCE: _public_gcp_instance,
    GCP_INSTANCE_TEMPLATE: _public_gcp_instance,
    GCP_REGION_INSTANCE_TEMPLATE: _public_gcp_instance,
    AZURE_NIC: _public_azure_nic,
    AZURE_VM: _public_azure_vm,
    AZURE_SCALE_SET: _public_azure_scale_set,
}


def no_public_addresses(resource_type: str, props: Mapping[str, Any], name: str = "") -> list[str]:
    """Invariant 3: no node has a public address."""
    check = _PUBLIC_CHECKS.get(canonical_type(resource_type))
    return check(_label(resource_type, name), props) if check else []


# --- invariant 4: IMDSv2 ---------------------------------------------------------------------


def imdsv2_required(resource_type: str, props: Mapping[str, Any], name: str = "") -> list[str]:
    """Invariant 4: AWS instances answer only session-token (IMDSv2) metadata requests, and so
    do the spot requests, launch templates and launch configurations that make instances."""
    kinds = (AWS_INSTANCE, AWS_SPOT_REQUEST, AWS_LAUNCH_TEMPLATE, AWS_LAUNCH_CONFIGURATION)
    if canonical_type(resource_type) not in kinds:
        return []
    options = props.get("metadataOptions")
    if not _known(options):
        return []
    label = _label(resource_type, name)
    found: list[str] = []
    tokens = _mapping(options).get("httpTokens")
    if _known(tokens) and tokens != "required":
        state = "is not set (IMDSv1 stays on)" if tokens is None else f"is {tokens!r}"
        found.append(
            f"{label}: metadataOptions.httpTokens {state}; set "
            'metadata_options={"http_tokens": "required"} (IMDSv2 only), so that a request '
            "forged through a node cannot read the instance role's credentials"
        )
    hops = _mapping(options).get("httpPutResponseHopLimit")
    if _known(hops) and _int(hops) != 1:
        # An AMI registered with ImdsSupport v2.0 makes it 2 (EC2 API, Image.ImdsSupport).
        state = (
            "is not set (the AMI's default decides: 2 for IMDSv2 AMIs)"
            if hops is None
            else (f"is {hops!r}")
        )
        found.append(
            f"{label}: metadataOptions.httpPutResponseHopLimit {state}; set "
            '"http_put_response_hop_limit": 1, so that a container on the node (one hop '
            "further) cannot take a metadata token and the node role's credentials"
        )
    return found


# --- invariant 5: encrypted disks --------------------------------------------------------------


def _unencrypted(value: Any) -> bool:
    return _known(value) and value is not True


def _disks_aws_instance(label: str, props: Mapping[str, Any]) -> list[str]:
    found: list[str] = []
    root = props.get("rootBlockDevice")
    encrypted = _mapping(root).get("encrypted")
    if _known(root) and _unencrypted(encrypted):
        state = "is not set" if encrypted is None else "is false"
        found.append(
            f"{label}: rootBlockDevice.encrypted {state} (the root volume would copy the AMI's "
            'unencrypted snapshot); set root_block_device={"encrypted": True}'
        )
    for i, disk in enumerate(_items(props.get("ebsBlockDevices"))):
        if _unencrypted(_mapping(disk).get("encrypted")):
            found.append(
                f"{label}: ebsBlockDevices[{i}].encrypted is not true; set encrypted=True on "
                "every EBS block device"
            )
    return found


def _disks_aws_volume(label: str, props: Mapping[str, Any]) -> list[str]:
    if not _unencrypted(props.get("encrypted")):
        return []
    return [f"{label}: this EBS volume is not encrypted; set encrypted=True"]


def _disks_azure_vm(label: str, props: Mapping[str, Any]) -> list[str]:
    found: list[str] = []
    storage = _mapping(props.get("storageProfile"))
    disks = [("storageProfile.osDisk", storage.get("osDisk"))] + [
        (f"storageProfile.dataDisks[{i}]", disk)
        for i, disk in enumerate(_items(storage.get("dataDisks")))
    ]
    for where, disk in disks:
        if _present(_mapping(disk).get("vhd")):
            found.append(
                f"{label}: {where} is an unmanaged VHD in a storage account; use a managed disk "
                "(managed_disk, no vhd), which Azure encrypts at rest"
            )
    # Encryption at host (the host's disk caches) is a stack setting, not required here:
    # Microsoft does not list it for Cobalt 100 sizes, and it needs a subscription feature.
    return found


def _disks_aws_template(label: str, props: Mapping[str, Any]) -> list[str]:
    found: list[str] = []
    for i, mapping in enumerate(_items(props.get("blockDeviceMappings"))):
        ebs = _mapping(_mapping(mapping).get("ebs"))
        encrypted = ebs.get("encrypted")
        if ebs and _known(encrypted) and str(encrypted).lower() != "true":
            found.append(
                f"{label}: blockDeviceMappings[{i}].ebs.encrypted is not true; set it, so every "
                "node the template makes has encrypted disks"
            )
    return found + (_disks_aws_instance(label, props) if "rootBlockDevice" in props else [])


def _disks_azure_scale_set(label: str, props: Mapping[str, Any]) -> list[str]:
    profile = _mapping(props.get("virtualMachineProfile"))
    found = _disks_azure_vm(label, profile)
    os_disk = _mapping(_mapping(profile.get("storageProfile")).get("osDisk"))
    if _present(os_disk.get("vhdContainers")):
        found.append(
            f"{label}: virtualMachineProfile.storageProfile.osDisk.vhdContainers puts the OS "
            "disks in a storage account; use managed disks"
        )
    return found


_DISK_CHECKS: Final[Mapping[str, Callable[[str, Mapping[str, Any]], list[str]]]] = {
    AWS_INSTANCE: _disks_aws_instance,
    AWS_SPOT_REQUEST: _disks_aws_instance,
    AWS_LAUNCH_TEMPLATE: _disks_aws_template,
    AWS_LAUNCH_CONFIGURATION: _disks_aws_template,
    AWS_EBS_VOLUME: _disks_aws_volume,
    AZURE_VM: _disks_azure_vm,
    AZURE_SCALE_SET: _disks_azure_scale_set,
}


def encrypted_disks(resource_type: str, props: Mapping[str, Any], name: str = "") -> list[str]:
    """Invariant 5: node disks are encrypted at rest (GCP encrypts every disk: nothing to do)."""
    check = _DISK_CHECKS.get(canonical_type(resource_type))
    return check(_label(resource_type, name), props) if check else []


# --- invariant 6: nodes carry the stack's tags ------------------------------------------------

_TAG_PROPERTY: Final = {
    AWS_INSTANCE: "tags",
    AWS_SPOT_REQUEST: "tags",
    GCP_INSTANCE: "labels",
    GCP_INSTANCE_TEMPLATE: "labels",
    GCP_REGION_INSTANCE_TEMPLATE: "labels",
    AZURE_VM: "tags",
    AZURE_SCALE_SET: "tags",
}


def gcp_label_value(text: str) -> str:
    """The label value the program gives a text of its own (the stack's name) on GCP, whose
    label values hold only lowercase letters, digits, '_' and '-' (the program's
    ``infra.clouds.gcp.label_value``; a test keeps the two equal)."""
    value = re.sub(r"[^a-z0-9_-]", "-", text.lower())
    if value == text and len(value) <= 63:
        return value
    digest = hashlib.sha256(text.encode()).hexdigest()[:6]
    return f"{value[:56]}-{digest}"


def node_tags(
    resource_type: str,
    props: Mapping[str, Any],
    name: str = "",
    expected: Mapping[str, str | None] | None = None,
) -> list[str]:
    """Invariant 6: every node carries ``project`` and ``stack`` tags (labels on GCP), equal to
    the stack's own when ``expected`` gives them."""
    key = _TAG_PROPERTY.get(canonical_type(resource_type))
    tags = props.get(key) if key else None
    if key is None or not _known(tags):
        return []
    label = _label(resource_type, name)
    found: list[str] = []
    for tag in REQUIRED_NODE_TAGS:
        value = _mapping(tags).get(tag)
        want = (expected or {}).get(tag)
        if want and key == "labels":
            want = gcp_label_value(want)
        if not _known(value):
            continue
        if not isinstance(value, str) or not value:
            found.append(
                f"{label}: {key} has no {tag!r}; add {key}[{tag!r}] (the program tags every "
                "node with project, stack and role: keep its tags)"
            )
        elif want and value != want:
            found.append(f"{label}: {key}[{tag!r}] is {value!r}, not {want!r}; set it to {want!r}")
    return found


# --- invariant 7: load balancers are internal --------------------------------------------------


def _public_aws_balancer(label: str, props: Mapping[str, Any]) -> list[str]:
    internal = props.get("internal")
    if internal is True or not _known(internal):
        return []
    state = "is not set (AWS makes it internet-facing)" if internal is None else "is false"
    return [
        f"{label}: internal {state}; set internal=True: the balancer forwards to llama-server, "
        "which has no authentication"
    ]


def _public_gcp_rule(label: str, props: Mapping[str, Any]) -> list[str]:
    scheme = props.get("loadBalancingScheme")
    if not _known(scheme) or str(scheme or "").upper().startswith("INTERNAL"):
        return []
    return [
        f"{label}: loadBalancingScheme is {scheme or 'not set (EXTERNAL)'}; set "
        'load_balancing_scheme="INTERNAL": the balancer forwards to llama-server, which has no '
        "authentication"
    ]


def _public_azure_balancer(label: str, props: Mapping[str, Any]) -> list[str]:
    found: list[str] = []
    for i, frontend in enumerate(_items(props.get("frontendIPConfigurations"))):
        for key in ("publicIPAddress", "publicIPPrefix"):
            value = _flat(frontend).get(key)
            if _present(value) and _known(value):
                found.append(
                    f"{label}: frontendIPConfigurations[{i}].{key} makes the balancer public; "
                    "give the frontend a private address in the nodes' subnet instead"
                )
    return found


_BALANCER_CHECKS: Final[Mapping[str, Callable[[str, Mapping[str, Any]], list[str]]]] = {
    AWS_LOAD_BALANCER: _public_aws_balancer,
    AWS_CLASSIC_ELB: _public_aws_balancer,
    AWS_ALB: _public_aws_balancer,
    GCP_FORWARDING_RULE: _public_gcp_rule,
    GCP_GLOBAL_FORWARDING_RULE: _public_gcp_rule,
    AZURE_LOAD_BALANCER: _public_azure_balancer,
}


def internal_balancers(resource_type: str, props: Mapping[str, Any], name: str = "") -> list[str]:
    """Invariant 7: a load balancer in front of the groups takes private traffic only."""
    check = _BALANCER_CHECKS.get(canonical_type(resource_type))
    return check(_label(resource_type, name), props) if check else []


# --- invariant 9: an identity on the main node only --------------------------------------------

_IDENTITY_PROPERTY: Final = {
    AWS_INSTANCE: "iamInstanceProfile",
    AWS_SPOT_REQUEST: "iamInstanceProfile",
    GCP_INSTANCE: "serviceAccount",
    AZURE_VM: "identity",
}


# What makes nodes of no known role: any identity there is a worker's too.
_TEMPLATE_IDENTITY_PROPERTY: Final = {
    AZURE_SCALE_SET: "identity",
    AWS_LAUNCH_TEMPLATE: "iamInstanceProfile",
    AWS_LAUNCH_CONFIGURATION: "iamInstanceProfile",
    GCP_INSTANCE_TEMPLATE: "serviceAccount",
    GCP_REGION_INSTANCE_TEMPLATE: "serviceAccount",
}


def identity_on_main_only(
    resource_type: str, props: Mapping[str, Any], name: str = ""
) -> list[str]:
    """Invariant 9: no node but the main node has a cloud identity (instance profile, service
    account, managed identity): a worker runs the RPC server, the most exposed process, and a
    token there would be its attacker's; a scale set makes nodes of no known role."""
    kind = canonical_type(resource_type)
    label = _label(resource_type, name)
    template = _TEMPLATE_IDENTITY_PROPERTY.get(kind)
    if template is not None:
        value = props.get(template)
        if _present(value) and _known(value):
            return [
                f"{label}: gives the nodes it makes {template}; remove it: only the main node, "
                "which the program makes on its own, has a cloud identity"
            ]
        return []
    key = _IDENTITY_PROPERTY.get(kind)
    value = props.get(key) if key else None
    if key is None or not _present(value) or not _known(value):
        return []
    if is_main_node(resource_type, props, name):
        return []
    if kind == AZURE_VM and _system_assigned_only(value):
        return []  # a spend guard's: its grants are judged by identity-grants-deallocate-only
    return [
        f"{label}: a node other than the main node has {key}; remove it: workers need no "
        "cloud identity, and a token on them would be the RPC port's attacker's"
    ]


def _system_assigned_only(identity: Any) -> bool:
    """An Azure VM's own identity alone (no user-assigned one, which other resources share)."""
    identity = _mapping(identity)
    kind = str(identity.get("type", "")).replace(" ", "").lower()
    return kind == "systemassigned" and not _present(identity.get("userAssignedIdentities"))


# --- invariant 10: the Kubernetes API endpoint is private, or open to named ranges only ---------


def _public_cidr_problems(label: str, cidrs: list[Any]) -> list[str]:
    """Each public-access range judged alone, as the program's kubernetesApiCidrs are (each a
    range of its own, like each apiAllowedCidrs range's rule on the VM stacks)."""
    wide = [text for cidr in cidrs for text in internet_sources([cidr])]
    if not wide:
        return []
    return [
        f"{label}: vpcConfig.publicAccessCidrs admits the internet to the Kubernetes API from "
        f"{', '.join(wide)} (public ranges wider than /{WIDEST_PUBLIC_IPV4_SOURCE} in IPv4 or "
        f"/{WIDEST_PUBLIC_IPV6_SOURCE} in IPv6 count as the internet); list only your own "
        "network's ranges (kubernetesApiCidrs), or set endpoint_public_access=False"
    ]


def private_kubernetes_api(
    resource_type: str, props: Mapping[str, Any], name: str = ""
) -> list[str]:
    """Invariant 10: an EKS cluster's API endpoint is private (``endpointPrivateAccess``), and
    a public endpoint, which EKS opens unless told not to, admits named ranges only, none of
    them the internet (EKS admits 0.0.0.0/0 when ``publicAccessCidrs`` is not given)."""
    if canonical_type(resource_type) != AWS_EKS_CLUSTER:
        return []
    config = props.get("vpcConfig")
    if not _known(config):
        return []
    config = _mapping(config)
    label = _label(resource_type, name)
    found: list[str] = []
    private = config.get("endpointPrivateAccess")
    if _known(private) and private is not True:
        state = "is not set (EKS's default is false)" if private is None else f"is {private!r}"
        found.append(
            f"{label}: vpcConfig.endpointPrivateAccess {state}; set endpoint_private_access=True, "
            "so that the nodes reach the Kubernetes API inside the VPC"
        )
    public = config.get("endpointPublicAccess")
    if not _known(public) or public is False or str(public).lower() == "false":
        return found
    cidrs = config.get("publicAccessCidrs")
    if not _known(cidrs):
        return found
    given = _strings(cidrs)
    if not given:
        state = "is not set (EKS's default is true)" if public is None else "is true"
        found.append(
            f"{label}: vpcConfig.endpointPublicAccess {state} and vpcConfig.publicAccessCidrs is "
            "not given, so EKS admits 0.0.0.0/0 (the internet) to the Kubernetes API; set "
            "endpoint_public_access=False, or public_access_cidrs to your own network's ranges "
            "(kubernetesApiCidrs)"
        )
    return found + _public_cidr_problems(label, given)


# --- invariant 11: EKS nodes come from the stack's launch template ------------------------------


def eks_nodes_from_launch_template(
    resource_type: str, props: Mapping[str, Any], name: str = ""
) -> list[str]:
    """Invariant 11: an EKS managed node group makes its nodes from a launch template of the
    stack's (which the IMDSv2, disk and public-address policies check), and opens no SSH
    (``remoteAccess``, which admits 0.0.0.0/0 to port 22 unless given source groups)."""
    if canonical_type(resource_type) != AWS_EKS_NODE_GROUP:
        return []
    label = _label(resource_type, name)
    found: list[str] = []
    template = props.get("launchTemplate")
    if _known(template) and not any(
        _present(_mapping(template).get(key)) for key in ("id", "name")
    ):
        found.append(
            f"{label}: launchTemplate is not set, so the nodes come from EKS's own template, "
            "whose metadata options and disks are EKS's defaults, not the stack's, and which no "
            "policy checks; set launch_template={id, version} of the stack's template, which "
            "requires IMDSv2 and encrypts its disks"
        )
    remote = props.get("remoteAccess")
    if _present(remote) and _known(remote):
        found.append(
            f"{label}: remoteAccess opens SSH to the nodes (from 0.0.0.0/0 unless "
            "sourceSecurityGroupIds narrows it); remove remote_access: reach the nodes through "
            "kubectl or Session Manager"
        )
    return found


# --- invariant 12: Kubernetes Services stay inside the cluster ---------------------------------


def cluster_internal_services(
    resource_type: str, props: Mapping[str, Any], name: str = ""
) -> list[str]:
    """Invariant 12: a Kubernetes Service is ClusterIP (the default) with no external IPs: a
    LoadBalancer or NodePort Service, or an external IP, reaches the pods from outside the
    cluster, where no NetworkPolicy or security group of the stack's guards the RPC port or the
    API."""
    if canonical_type(resource_type) not in (K8S_SERVICE, K8S_SERVICE_PATCH):
        return []
    spec = props.get("spec")
    if not _known(spec):
        return []
    spec = _mapping(spec)
    label = _label(resource_type, name)
    found: list[str] = []
    kind = spec.get("type")
    if _known(kind) and kind not in (None, "", "ClusterIP"):
        found.append(
            f"{label}: spec.type is {kind!r}; set it to 'ClusterIP' (or leave it unset): only "
            "a ClusterIP Service stays inside the cluster (LoadBalancer and NodePort reach the "
            "pods from outside it); reach the API through kubectl port-forward"
        )
    ips = spec.get("externalIPs")
    if _present(ips) and _known(ips):
        found.append(
            f"{label}: spec.externalIPs ({_shown(_strings(ips))}) admits traffic for those "
            "addresses to the pods from outside the cluster; remove external_ips"
        )
    return found


# --- invariant 15: the API key's store is private ------------------------------------------

AWS_SSM_PARAMETER: Final = "aws:ssm/parameter:Parameter"
AWS_NATIVE_SSM_PARAMETER: Final = "aws-native:ssm:Parameter"
AZURE_KEY_VAULT: Final = "azure-native:keyvault:Vault"
AZURE_CLASSIC_KEY_VAULT: Final = "azure:keyvault/keyVault:KeyVault"
GCP_SECRET_GRANTS: Final = (
    "gcp:secretmanager/secretIamMember:SecretIamMember",
    "gcp:secretmanager/secretIamBinding:SecretIamBinding",
    "gcp:secretmanager/secretIamPolicy:SecretIamPolicy",
)
# Who "everyone" is in a GCP IAM member list.
_GCP_EVERYONE: Final = frozenset({"allusers", "allauthenticatedusers"})


def _gcp_members(props: Mapping[str, Any]) -> list[str]:
    """The members a GCP IAM member, binding or policy resource grants to."""
    members = [m for m in _strings(props.get("member")) + _strings(props.get("members"))]
    policy = props.get("policyData")
    if isinstance(policy, str):
        try:
            document = json.loads(policy)
        except ValueError:
            document = {}
        members += [
            m
            for b in _items(_mapping(document).get("bindings"))
            for m in _strings(b.get("members"))
        ]
    return [m for m in members if isinstance(m, str)]


def _vault_problems(label: str, props: Mapping[str, Any]) -> list[str]:
    """A Key Vault's data plane open beyond named addresses, or read through access policies
    (each of which reads every secret of the vault) rather than per-secret roles."""
    properties = _mapping(props.get("properties")) or props
    found: list[str] = []
    acls = properties.get("networkAcls")
    action = _mapping(acls).get("defaultAction")
    if _known(acls) and _known(action) and str(action).lower() != "deny":
        found.append(
            f"{label}: networkAcls.defaultAction is {action or 'not set (Allow)'}; set it to "
            "Deny with the NAT gateway's address as the one ip rule, so that only the nodes "
            "reach the vault"
        )
    rules = [
        r if isinstance(r, str) else _mapping(r).get("value")
        for r in _items(_mapping(acls).get("ipRules"))
    ]
    if wide := internet_sources(r for r in rules if isinstance(r, str)):
        found.append(f"{label}: networkAcls.ipRules admit the internet ({', '.join(wide)})")
    rbac = properties.get("enableRbacAuthorization")
    if _known(rbac) and rbac is not True:
        found.append(
            f"{label}: enableRbacAuthorization is not true, so access policies (each reading "
            "every secret of the vault) grant access; set it, and grant Key Vault Secrets User "
            "on the one secret"
        )
    return found


def secret_store_private(resource_type: str, props: Mapping[str, Any], name: str = "") -> list[str]:
    """Invariant 15: the store that keeps the API key keeps it secret: an SSM parameter of the
    key is a SecureString; a Key Vault admits named addresses alone and grants per secret; a
    Secret Manager secret is granted to no one at large."""
    kind, label = canonical_type(resource_type), _label(resource_type, name)
    if kind in (AWS_SSM_PARAMETER, AWS_NATIVE_SSM_PARAMETER):
        key = props.get("name")
        kind_of = props.get("type")
        if (
            isinstance(key, str)
            and "api-key" in key
            and _known(kind_of)
            and kind_of != ("SecureString")
        ):
            return [
                f"{label}: keeps the API key as {kind_of or 'an unset type'}, readable by "
                "anyone who may describe parameters and kept in plain text; set "
                'type="SecureString"'
            ]
        return []
    if kind in (AZURE_KEY_VAULT, AZURE_CLASSIC_KEY_VAULT):
        return _vault_problems(label, props)
    if kind in GCP_SECRET_GRANTS:
        everyone = [m for m in _gcp_members(props) if m.lower() in _GCP_EVERYONE]
        if everyone:
            return [
                f"{label}: grants the secret to {', '.join(everyone)}; grant it to the main "
                "node's service account alone"
            ]
    return []


# --- invariant 16: the grants the stack makes are narrow ----------------------------------------

AWS_ROLE_POLICY_ATTACHMENT: Final = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"
AWS_POLICY_ATTACHMENT: Final = "aws:iam/policyAttachment:PolicyAttachment"
AWS_ROLE_POLICY: Final = "aws:iam/rolePolicy:RolePolicy"
AWS_POLICY: Final = "aws:iam/policy:Policy"
AWS_ROLE: Final = "aws:iam/role:Role"
AWS_NATIVE_ROLE: Final = "aws-native:iam:Role"
AWS_NATIVE_ROLE_POLICY: Final = "aws-native:iam:RolePolicy"
AWS_SSM_DOCUMENT: Final = "aws:ssm/document:Document"
GCP_PROJECT_GRANTS: Final = (
    "gcp:projects/iAMMember:IAMMember",
    "gcp:projects/iAMBinding:IAMBinding",
    "gcp:projects/iAMPolicy:IAMPolicy",
)
GCP_BUCKET_GRANTS: Final = (
    "gcp:storage/bucketIAMMember:BucketIAMMember",
    "gcp:storage/bucketIAMBinding:BucketIAMBinding",
    "gcp:storage/bucketIAMPolicy:BucketIAMPolicy",
)
# AWS managed policies that grant an account's administration or whole services: no node or
# cluster role of the stack needs one (the nodes hold inline grants on named resources; EKS's
# roles, its own AmazonEKS* policies).
_BROAD_AWS_POLICIES: Final = re.compile(
    r"arn:aws[a-z-]*:iam::aws:policy/(?:.*/)?(?:AdministratorAccess|PowerUserAccess|"
    r"IAMFullAccess|[A-Za-z0-9]*FullAccess[A-Za-z0-9_]*|AmazonSSMManagedInstanceCore)"
)
# GCP roles that administer a project (basic roles, and any *admin role).
_BROAD_GCP_ROLES: Final = re.compile(r"roles/(?:owner|editor|[A-Za-z.]*[Aa]dmin[A-Za-z.]*)")
# Azure's built-in roles that administer what they are assigned on: Owner, Contributor, User
# Access Administrator, Role Based Access Control Administrator (learn.microsoft.com/azure/
# role-based-access-control/built-in-roles, their GUIDs).
_BROAD_AZURE_ROLES: Final = frozenset(
    {
        "8e3af657-a8ff-443c-a75c-2fe8c4bcb635",
        "b24988ac-6180-42a0-ab88-20f7382dd24c",
        "18d7d88d-d35e-4fb5-a5c3-7773c20a72d9",
        "f58310d9-a9f6-439a-9e8d-f62e7b41a168",
    }
)


# The same roles by name, as the classic provider's assignments may give them.
_BROAD_AZURE_ROLE_NAMES: Final = frozenset(
    {
        "owner",
        "contributor",
        "user access administrator",
        "role based access control administrator",
    }
)


def _statements(document: Any) -> list[Mapping[str, Any]]:
    if isinstance(document, str):
        try:
            document = json.loads(document)
        except ValueError:
            return []
    statements = _mapping(document).get("Statement")
    listed = statements if isinstance(statements, list) else [statements]
    return [_mapping(st) for st in listed if isinstance(st, Mapping)]


def _broad_statement(statement: Mapping[str, Any]) -> str | None:
    """Why one Allow statement of an IAM policy is broader than any grant the stack makes."""
    if str(statement.get("Effect", "")).lower() != "allow":
        return None
    if "NotAction" in statement:
        return "allows every action but those it names (NotAction)"
    actions = [a for a in _strings(statement.get("Action")) if isinstance(a, str)]
    wild = [a for a in actions if a == "*" or a.endswith(":*")]
    if wild:
        return f"allows {', '.join(wild)}"
    resources = [r for r in _strings(statement.get("Resource")) if isinstance(r, str)]
    escalating = [a for a in actions if a.lower().startswith(("iam:", "sts:assumerole"))]
    if escalating and "*" in resources:
        return f"allows {', '.join(escalating)} on every resource"
    return None


def _aws_grant_problems(label: str, kind: str, props: Mapping[str, Any]) -> list[str]:
    found: list[str] = []
    arns = _strings(props.get("policyArn")) + _strings(props.get("managedPolicyArns"))
    for arn in arns:
        if isinstance(arn, str) and _BROAD_AWS_POLICIES.fullmatch(arn):
            found.append(
                f"{label}: attaches {arn}, far beyond what a node or the cluster needs; "
                "grant the actions on the stack's own resources inline instead"
            )
    documents = [props.get("policy"), props.get("policyDocument")] + [
        _mapping(p).get("policyDocument") for p in _items(props.get("policies"))
    ]
    if kind in (AWS_ROLE, AWS_NATIVE_ROLE):
        documents = [_mapping(p).get("policyDocument") for p in _items(props.get("policies"))]
        documents += [_mapping(p).get("policy") for p in _items(props.get("inlinePolicies"))]
    for document in documents:
        for statement in _statements(document):
            if why := _broad_statement(statement):
                found.append(
                    f"{label}: a statement {why}; name the actions and the stack's resources "
                    "they act on"
                )
    return found


def _ssm_document_problems(label: str, props: Mapping[str, Any]) -> list[str]:
    """A Command document runs as root on the node it is sent to: one that takes parameters
    runs whatever its sender passes."""
    if str(props.get("documentType", "")) != "Command":
        return []
    content = props.get("content")
    try:
        document = json.loads(content) if isinstance(content, str) else {}
    except ValueError:
        return []
    if _present(_mapping(document).get("parameters")):
        return [
            f"{label}: this Command document takes parameters, so whoever may send it runs "
            "what they pass, as root; fix its commands and remove parameters"
        ]
    return []


def narrow_grants(resource_type: str, props: Mapping[str, Any], name: str = "") -> list[str]:
    """Invariant 16: the roles, policies and grants the stack makes are narrow: no AWS managed
    policy that administers an account or a whole service, no statement with wildcard actions
    (or iam:/sts:AssumeRole on every resource), no SSM Command document that takes parameters;
    no GCP basic or admin role and nothing granted to everyone; no Azure role that administers
    what it is assigned on."""
    kind, label = canonical_type(resource_type), _label(resource_type, name)
    if kind in (
        AWS_ROLE_POLICY_ATTACHMENT,
        AWS_POLICY_ATTACHMENT,
        AWS_ROLE_POLICY,
        AWS_POLICY,
        AWS_ROLE,
        AWS_NATIVE_ROLE,
        AWS_NATIVE_ROLE_POLICY,
    ):
        return _aws_grant_problems(label, kind, props)
    if kind == AWS_SSM_DOCUMENT:
        return _ssm_document_problems(label, props)
    if kind in (*GCP_PROJECT_GRANTS, *GCP_BUCKET_GRANTS):
        found = [
            f"{label}: grants {role}, which administers the project; grant a predefined role on "
            "the one resource the node reads"
            for role in _strings(props.get("role"))
            if isinstance(role, str) and _BROAD_GCP_ROLES.fullmatch(role)
        ]
        everyone = [m for m in _gcp_members(props) if m.lower() in _GCP_EVERYONE]
        if everyone:
            found.append(f"{label}: grants to {', '.join(everyone)}; grant the node's account")
        return found
    if kind == AZURE_ROLE_ASSIGNMENT:
        role = props.get("roleDefinitionId") or props.get("roleDefinitionName")
        guid = str(role).rsplit("/", 1)[-1].lower() if isinstance(role, str) else ""
        if guid in _BROAD_AZURE_ROLES or guid in _BROAD_AZURE_ROLE_NAMES:
            return [
                f"{label}: assigns a role that administers its scope ({role}); assign the one "
                "built-in or custom role the node needs, on the one resource"
            ]
    return []


RESOURCE_VALIDATORS: Final[Mapping[str, Callable[..., list[str]]]] = {
    "no-internet-ingress": no_internet_ingress,
    "no-public-node-addresses": no_public_addresses,
    "aws-imdsv2-required": imdsv2_required,
    "encrypted-node-disks": encrypted_disks,
    "nodes-carry-stack-tags": node_tags,
    "internal-load-balancers": internal_balancers,
    "identity-on-main-only": identity_on_main_only,
    "private-kubernetes-api": private_kubernetes_api,
    "eks-nodes-from-launch-template": eks_nodes_from_launch_template,
    "cluster-internal-services": cluster_internal_services,
    "secret-store-private": secret_store_private,
    "narrow-grants": narrow_grants,
}


# --- invariant 2: the RPC port only from the main node ----------------------------------------


def _port_ranges(value: Any) -> Iterator[tuple[int, int] | None]:
    """Port ranges from "80", "50000-50100", "*" (or a list of them); None for one unreadable."""
    for part in _strings(value):
        text = "" if part is UNKNOWN else str(part).strip()
        if text.lower() in ("*", "any"):
            yield (0, 65535)
            continue
        low, _, high = text.partition("-")
        first, last = _int(low), _int(high or low)
        yield None if first is None or last is None else (first, last)


def _covers(ranges: Iterable[tuple[int, int] | None], port: int) -> bool:
    """Whether a range includes the port (one that cannot be read counts as including it)."""
    return any(r is None or r[0] <= port <= r[1] for r in ranges)


def _aws_covers(rule: Mapping[str, Any], protocol_key: str, port: int) -> bool:
    protocol = rule.get(protocol_key)
    if protocol is UNKNOWN or str(protocol).lower() in ("-1", "all"):
        return True
    if str(protocol).lower() not in ("tcp", "6"):
        return False
    first, last = _int(rule.get("fromPort")), _int(rule.get("toPort"))
    return first is None or last is None or first <= port <= last


def _gcp_admits_port(entries: list[Any], protocol_key: str, port: int) -> bool:
    """Whether one of a GCP rule's protocol entries (``allows`` of a firewall, ``layer4Configs``
    of a policy rule) takes TCP on ``port``: no ports means every port."""
    for item in entries:
        entry = _mapping(item)
        protocol = entry.get(protocol_key)
        if protocol is not UNKNOWN and str(protocol).lower() not in ("tcp", "6", "all"):
            continue
        ports = entry.get("ports")
        if not _present(ports) or _covers(_port_ranges(ports), port):
            return True
    return False


def _gcp_covers(props: Mapping[str, Any], port: int) -> bool:
    return _gcp_admits_port(_items(props.get("allows")), "protocol", port)


def _azure_covers(rule: Mapping[str, Any], port: int) -> bool:
    protocol = rule.get("protocol")
    if protocol is not UNKNOWN and str(protocol).lower() not in ("tcp", "*", "any"):
        return False
    ranges = [
        *_port_ranges(rule.get("destinationPortRange")),
        *_port_ranges(rule.get("destinationPortRanges")),
    ]
    return _covers(ranges, port)


def _is_group(resource: Resource) -> bool:
    return canonical_type(resource.type) in (*_AWS_GROUPS, AZURE_ASG)


def _role_says_main(props: Mapping[str, Any]) -> bool:
    """The program tags (labels) every resource with its role: a main node's, and the groups
    only it carries, say "main". A name alone is not trusted; an unknown value (a preview) is
    judged again before the resource is made."""
    tags = props.get("labels") if "labels" in props else props.get("tags")
    if not _known(tags):
        return True
    role = _mapping(tags).get("role")
    return not _known(role) or role == "main"


def _is_main_group(resource: Resource) -> bool:
    kind = canonical_type(resource.type)
    if kind in _AWS_GROUPS:
        named = MAIN_SECURITY_GROUP.fullmatch(resource.name) is not None
    elif kind == AZURE_ASG:
        named = MAIN_APPLICATION_SECURITY_GROUP.fullmatch(resource.name) is not None
    else:
        return False
    return named and _role_says_main(resource.props)


def is_main_node(resource_type: str, props: Mapping[str, Any], name: str) -> bool:
    """A node is the main node by its name and its role tag (label) together."""
    if canonical_type(resource_type) == AZURE_NIC:
        return MAIN_NIC.fullmatch(name) is not None and _role_says_main(props)
    return MAIN_NODE.fullmatch(name) is not None and _role_says_main(props)


# An application security group's ARM id: /subscriptions/{s}/resourceGroups/{group}/providers/
# Microsoft.Network/applicationSecurityGroups/{name} (ARM compares names without regard to case).
AZURE_ASG_ID: Final = re.compile(
    r".*/resourceGroups/(?P<group>[^/]+)/providers/Microsoft\.Network/"
    r"applicationSecurityGroups/(?P<name>[^/]+)",
    re.IGNORECASE,
)


class _Stack:
    """The stack's resources, indexed to tell whether a group reference is the main node's."""

    def __init__(self, resources: Sequence[Resource], port: int, what: str = "RPC port") -> None:
        self.port, self.what = port, what
        self.by_urn = {r.urn: r for r in resources if r.urn}
        self.by_id = {r.id: r for r in resources if r.id}
        self.main = [r for r in resources if _is_main_group(r)]
        self.main_ids = {r.id for r in self.main if r.id}

    def refers_to_main(self, value: Any, owner: Resource, prop: str) -> bool | None:
        """Whether a group reference (an id) in ``owner``'s property ``prop`` is a main group:
        True, False, or None when neither its value nor the property's dependencies tell."""
        known = self.by_id.get(value) if isinstance(value, str) else None
        known = known or self.by_azure_id(value)
        if known is not None:
            return _is_main_group(known)
        groups = [
            dep
            for urn in owner.property_dependencies.get(prop, ())
            if (dep := self.by_urn.get(urn)) is not None and _is_group(dep)
        ]
        mains = [g for g in groups if _is_main_group(g)]
        if groups and len(mains) == len(groups):
            return True
        if groups and not mains:
            return False
        if value is UNKNOWN and mains:
            # One property names the main group and another (an NSG's inline rules: sources
            # and destinations). The id is unknown only until the group exists; the update's
            # stack check sees it and traces it by name.
            return True
        if isinstance(value, str) and value and not groups:
            return False  # a known id of no group in this stack
        return None

    def by_azure_id(self, value: Any) -> Resource | None:
        """The application security group an ARM id names, by its resource group and name
        (the engine hands a stack check outputs without ids; an ARM id carries both)."""
        found = AZURE_ASG_ID.fullmatch(value) if isinstance(value, str) else None
        if found is None:
            return None
        group, name = found["group"].lower(), found["name"].lower()
        for r in self.by_urn.values():
            names = {r.props.get("name"), r.props.get("applicationSecurityGroupName")}
            in_group = r.props.get("resourceGroupName")
            if (
                canonical_type(r.type) == AZURE_ASG
                and name in {str(n).lower() for n in names if _known(n) and n}
                and (not _known(in_group) or str(in_group).lower() == group)
            ):
                return r
        return None

    def carries_main(self, values: Iterable[Any], owner: Resource, props: Iterable[str]) -> bool:
        """Whether a node's list of groups holds a main group, by id or by dependency."""
        if any(isinstance(v, str) and v in self.main_ids for v in values):
            return True
        return any(
            (dep := self.by_urn.get(urn)) is not None and _is_main_group(dep)
            for prop in props
            for urn in owner.property_dependencies.get(prop, ())
        )

    def why_not(self, verdict: bool | None) -> str:
        if verdict is False:
            return "not the main node's"
        names = ", ".join(sorted(r.name for r in self.main)) or "none in this stack"
        return f"cannot be traced to the main node's ({names}) in this preview"


_AWS_FIX: Final = (
    "make the main node's security group (*-main-sg) the only source: "
    "referenced_security_group_id=<main group>.id, with no CIDR or prefix list"
)
_GCP_FIX: Final = (
    "make the main node's network tag (*-main) the only source: source_tags=[<main tag>], "
    "with no source_ranges or source_service_accounts"
)
_AZURE_FIX: Final = (
    "make the main node's application security group (*-main-asg) the only source: "
    "source_application_security_groups=[{id: <main ASG>.id}], with no address prefixes"
)


@dataclass
class _RpcRule:
    """The sources of one rule that opens the RPC port, and how to report what is wrong."""

    stack: _Stack
    owner: Resource
    where: str
    fix: str
    problems: list[str] = field(default_factory=list)

    def report(self, problem: str) -> None:
        self.problems.append(
            f"{self.where}: opens the {self.stack.what} {self.stack.port} {problem}; {self.fix}"
        )

    def addresses(self, sources: list[Any], kind: str) -> None:
        if sources:
            self.report(f"to {_shown(sources)}, not the main node's {kind}")

    def groups(self, references: Iterable[tuple[Any, str]], kind: str) -> None:
        for value, prop in references:
            verdict = self.stack.refers_to_main(value, self.owner, prop)
            if verdict is not True:
                self.report(f"to {kind} {_shown([value])} ({self.stack.why_not(verdict)})")


def _rpc_aws(stack: _Stack, r: Resource) -> list[str]:
    kind, props, label = canonical_type(r.type), r.props, _label(r.type, r.name)
    rules: list[tuple[str, Mapping[str, Any], list[Any], list[tuple[Any, str]], bool]] = []
    if kind == AWS_INGRESS_RULE and _aws_covers(props, "ipProtocol", stack.port):
        group = props.get("referencedSecurityGroupId")
        rules.append(
            (
                label,
                props,
                _strings(props.get("cidrIpv4"))
                + _strings(props.get("cidrIpv6"))
                + _strings(props.get("prefixListId")),
                [(group, "referencedSecurityGroupId")] if _present(group) else [],
                False,
            )
        )
    elif (
        kind == AWS_SECURITY_GROUP_RULE
        and str(props.get("type", "")).lower() == "ingress"
        and _aws_covers(props, "protocol", stack.port)
    ):
        group = props.get("sourceSecurityGroupId")
        references = [(group, "sourceSecurityGroupId")] if _present(group) else []
        if props.get("self") is True:
            references.append((props.get("securityGroupId"), "securityGroupId"))
        rules.append(
            (label, props, _cidrs(props) + _strings(props.get("prefixListIds")), references, False)
        )
    elif kind in _AWS_GROUPS:
        for i, item in enumerate(_items(props.get("ingress"))):
            rule = _mapping(item)
            if _aws_covers(rule, "protocol", stack.port):
                references = [(g, "ingress") for g in _strings(rule.get("securityGroups"))]
                others = _cidrs(rule) + _strings(rule.get("prefixListIds"))
                rules.append((f"{label} ingress[{i}]", rule, others, references, True))
    problems: list[str] = []
    for where, rule, others, references, inline in rules:
        check = _RpcRule(stack, r, where, _AWS_FIX)
        check.addresses(others, "group")
        check.groups(references, "security group")
        own = rule.get("self") is True
        if inline and own and not _is_main_group(r):
            check.report("to its own group (self), not the main node's")
        if not others and not references and not own:
            check.report("with no source")
        problems += check.problems
    return problems


def _rpc_gcp(stack: _Stack, r: Resource) -> list[str]:
    props = r.props
    if (
        canonical_type(r.type) != GCP_FIREWALL
        or not _gcp_ingress(props)
        or not _gcp_covers(props, stack.port)
    ):
        return []
    check = _RpcRule(stack, r, _label(r.type, r.name), _GCP_FIX)
    others = _strings(props.get("sourceRanges")) + _strings(props.get("sourceServiceAccounts"))
    tags = _strings(props.get("sourceTags"))
    check.addresses(others, "tag")
    for tag in tags:
        if tag is UNKNOWN or not MAIN_NETWORK_TAG.fullmatch(str(tag)):
            check.report(f"to network tag {_shown([tag])}, not the main node's")
    if not others and not tags:
        check.report("with no source (GCP then admits 0.0.0.0/0)")
    return check.problems


def _rpc_azure(stack: _Stack, r: Resource) -> list[str]:
    kind, label = canonical_type(r.type), _label(r.type, r.name)
    rules: list[tuple[str, Mapping[str, Any], str]] = []
    if kind == AZURE_SECURITY_RULE:
        rules.append((label, r.props, "sourceApplicationSecurityGroups"))
    elif kind == AZURE_NSG:
        for i, item in enumerate(_items(r.props.get("securityRules"))):
            rule = _flat(item)
            rules.append(
                (f"{label} rule {rule.get('name') or f'securityRules[{i}]'}", rule, "securityRules")
            )
    problems: list[str] = []
    for where, rule, prop in rules:
        if not _azure_inbound_allow(rule) or not _azure_covers(rule, stack.port):
            continue
        check = _RpcRule(stack, r, where, _AZURE_FIX)
        prefixes = _azure_sources(rule)
        groups = _items(rule.get("sourceApplicationSecurityGroups"))
        check.addresses(prefixes, "application security group")
        check.groups(
            ((_mapping(g).get("id") if _known(g) else UNKNOWN, prop) for g in groups),
            "application security group",
        )
        if not prefixes and not groups:
            check.report("with no source")
        problems += check.problems
    return problems


def _rpc_gcp_policy(stack: _Stack, r: Resource) -> list[str]:
    """A GCP firewall policy rule names no network tag of the program's: any that admits the
    port admits more than the main node."""
    kind = canonical_type(r.type)
    return [
        f"{where}: opens the {stack.what} {stack.port} through a firewall policy, which cannot "
        f"admit the main node alone; remove it: {_GCP_FIX}"
        for where, rule in _gcp_policy_rules(kind, r.props, _label(r.type, r.name))
        if _gcp_policy_allows_in(rule) and _gcp_policy_covers(rule, stack.port)
    ]


def _is_deny_all_inbound(rule: Mapping[str, Any]) -> bool:
    words = ("*", "any")
    return (
        str(rule.get("direction", "")).lower() == "inbound"
        and str(rule.get("access", "")).lower() == "deny"
        and str(rule.get("protocol", "")).lower() in words
        and str(rule.get("sourceAddressPrefix", "")).lower() in words
        and _covers(_port_ranges(rule.get("destinationPortRange")), 0)
        and _covers(_port_ranges(rule.get("destinationPortRange")), 65535)
        and (_int(rule.get("priority")) or 65536) < AZURE_DEFAULT_RULES_PRIORITY
    )


def _azure_denies_the_rest(resources: Sequence[Resource]) -> list[Violation]:
    """Each network security group holds an inbound rule that denies everything else, before
    Azure's default AllowVnetInBound (65000) admits the whole VNet to every port."""
    standalone: dict[str, list[Mapping[str, Any]]] = {}
    for r in resources:
        if canonical_type(r.type) == AZURE_SECURITY_RULE:
            group = r.props.get("networkSecurityGroupName")
            standalone.setdefault(str(group), []).append(r.props)
    found: list[Violation] = []
    for r in resources:
        if canonical_type(r.type) != AZURE_NSG or not _known(r.props.get("securityRules")):
            continue
        names = {str(r.props.get("networkSecurityGroupName")), r.name}
        rules = [_flat(rule) for rule in _items(r.props.get("securityRules"))]
        rules += [rule for name in names for rule in standalone.get(name, [])]
        if not any(_is_deny_all_inbound(rule) for rule in rules):
            found.append(
                Violation(
                    f"{_label(r.type, r.name)}: no inbound rule denies every other source, so "
                    "Azure's default AllowVnetInBound admits the whole VNet to the RPC and "
                    "metrics ports; add a Deny rule from '*' to '*' on every port, priority below "
                    f"{AZURE_DEFAULT_RULES_PRIORITY} (the program's is at 4000)",
                    r.urn,
                )
            )
    return found


def _rpc_carriers(stack: _Stack, r: Resource) -> list[str]:
    """A node (or NIC) other than the main node's that carries the main node's group or tag."""
    kind, props, label = canonical_type(r.type), r.props, _label(r.type, r.name)
    if kind in (AWS_INSTANCE, AWS_SPOT_REQUEST) and not is_main_node(r.type, props, r.name):
        keys = ("vpcSecurityGroupIds", "securityGroups")
        if stack.carries_main([v for k in keys for v in _strings(props.get(k))], r, keys):
            return [
                f"{label}: carries the main node's security group, so it can reach every "
                "worker's RPC port; give it the workers' group, and keep the main group on the "
                "main node only"
            ]
    elif kind == GCP_INSTANCE and not is_main_node(r.type, props, r.name):
        tags = [t for t in _strings(props.get("tags")) if isinstance(t, str)]
        main_tags = [t for t in tags if MAIN_NETWORK_TAG.fullmatch(t)]
        if main_tags:
            return [
                f"{label}: carries the main node's network tag {', '.join(main_tags)}, so it can "
                "reach every worker's RPC port; remove the tag: only the main node carries it"
            ]
    elif kind == AZURE_NIC and not is_main_node(r.type, props, r.name):
        ids = [
            _mapping(group).get("id")
            for config in _items(props.get("ipConfigurations"))
            for group in _items(_flat(config).get("applicationSecurityGroups"))
        ]
        if stack.carries_main(ids, r, ("ipConfigurations",)):
            return [
                f"{label}: puts a NIC other than the main node's into the main node's "
                "application security group, so it can reach every worker's RPC port; use the "
                "workers' group"
            ]
    elif kind in (AZURE_VM, AZURE_SCALE_SET):
        return _azure_inline_carriers(stack, r)
    elif kind == AZURE_CLASSIC_ASG_ASSOCIATION:
        return _azure_association_carrier(stack, r)
    return []


def _azure_inline_carriers(stack: _Stack, r: Resource) -> list[str]:
    """A VM (not the main node) or a scale set whose inline NIC configurations join the main
    node's application security group."""
    props = r.props
    if canonical_type(r.type) == AZURE_VM and is_main_node(r.type, props, r.name):
        return []
    key = "networkProfile" if canonical_type(r.type) == AZURE_VM else "virtualMachineProfile"
    profile = _mapping(props.get(key))
    network = profile if key == "networkProfile" else _mapping(profile.get("networkProfile"))
    ids = [
        _mapping(group).get("id")
        for nic in _items(network.get("networkInterfaceConfigurations"))
        for config in _items(_flat(nic).get("ipConfigurations"))
        for group in _items(_flat(config).get("applicationSecurityGroups"))
    ]
    if not stack.carries_main(ids, r, (key,)):
        return []
    return [
        f"{_label(r.type, r.name)}: its inline network interface joins the main node's "
        "application security group, so this VM can reach every worker's RPC port; use the "
        "workers' group"
    ]


def _azure_association_carrier(stack: _Stack, r: Resource) -> list[str]:
    """Azure's classic provider joins a NIC to a group with an association of its own."""
    group = r.props.get("applicationSecurityGroupId")
    if stack.refers_to_main(group, r, "applicationSecurityGroupId") is not True:
        return []
    nic_id = r.props.get("networkInterfaceId")
    nics = [stack.by_id.get(nic_id)] if isinstance(nic_id, str) else []
    nics += [stack.by_urn.get(u) for u in r.property_dependencies.get("networkInterfaceId", ())]
    if any(n is not None and is_main_node(n.type, n.props, n.name) for n in nics):
        return []
    return [
        f"{_label(r.type, r.name)}: joins a NIC other than the main node's to the main node's "
        "application security group, so it can reach every worker's RPC port; join the "
        "workers' group"
    ]


def _only_from_main(
    stack: _Stack, resources: Sequence[Resource], *, carriers: bool
) -> list[Violation]:
    checks = [
        _rpc_aws,
        _rpc_gcp,
        _rpc_azure,
        _rpc_gcp_policy,
        *([_rpc_carriers] if carriers else []),
    ]
    violations: list[Violation] = []
    for r in resources:
        for check in checks:
            violations += [Violation(message, r.urn) for message in check(stack, r)]
    return violations


def rpc_only_from_main(
    resources: Sequence[Resource], port: int = DEFAULT_RPC_PORT
) -> list[Violation]:
    """Invariant 2: every rule that opens the RPC port admits the main node's security group,
    network tag or application security group and nothing else, and only the main node
    carries that group or tag. On Azure, the network security group also denies every other
    inbound connection before the VNet's default rule admits the whole VNet."""
    stack = _Stack(resources, port)
    return _only_from_main(stack, resources, carriers=True) + _azure_denies_the_rest(resources)


def metrics_only_from_main(resources: Sequence[Resource]) -> list[Violation]:
    """Invariant 8: the node metrics port is as narrow as RPC: every rule that opens it admits
    the main node's group, tag or application security group alone."""
    stack = _Stack(resources, METRICS_PORT, "node metrics port")
    return _only_from_main(stack, resources, carriers=False)  # the RPC policy reports carriers


# --- invariant 14: a node's own identity may deallocate its own VM and nothing else -----------


def _linked(
    index: Mapping[str, Resource], owner: Resource, prop: str, by: Callable[[Resource], Any]
) -> list[Resource]:
    """The resources ``owner``'s property ``prop`` names: by value (``by`` of each resource),
    or, where the value is not known yet, by the property's dependencies."""
    value = owner.props.get(prop)
    if isinstance(value, str) and value:
        found = [r for r in index.values() if by(r) == value]
        if found:
            return found
    return [index[u] for u in owner.property_dependencies.get(prop, ()) if u in index]


def _principal(vm: Resource) -> Any:
    return _mapping(vm.props.get("identity")).get("principalId")


AZURE_RESOURCE_GROUPS: Final = (
    "azure-native:resources:ResourceGroup",
    "azure:core/resourceGroup:ResourceGroup",
)


def _deallocate_only(role: Resource, groups: set[str]) -> list[str]:
    """What a custom role holds beyond deallocating a VM, or where it may be assigned beyond
    the stack's resource group."""
    found: list[str] = []
    permissions = role.props.get("permissions")
    if not _known(permissions):
        return found
    for i, item in enumerate(_items(permissions)):
        entry = _mapping(item)
        actions = [a for a in _strings(entry.get("actions")) if a is not UNKNOWN]
        extra = [a for a in actions if str(a).lower() != DEALLOCATE_ACTION.lower()]
        others = [k for k in ("dataActions", "notActions", "notDataActions") if entry.get(k)]
        if extra or others:
            found.append(f"permissions[{i}] holds {_shown(extra + others)} beyond deallocate")
    scopes = role.props.get("assignableScopes")
    wide = [
        s
        for s in _strings(scopes)
        if s is not UNKNOWN and s not in groups and "/resourcegroups/" not in s.lower()
    ]
    if wide:
        found.append(f"assignableScopes {_shown(wide)} reach beyond a resource group")
    return found


def identity_grants(resources: Sequence[Resource]) -> list[Violation]:
    """Invariant 14: on Azure, the identity a spend guard gives a VM other than the main node
    (a worker, the balancer node) holds one grant, the stack's custom role of one action
    (``DEALLOCATE_ACTION``) at that VM's own scope; and
    every custom role the stack makes holds that action alone, assignable in a resource group.
    A grant whose principal, role or scope a preview does not know is judged by the update's
    stack check."""
    vms = {r.urn: r for r in resources if canonical_type(r.type) == AZURE_VM}
    roles = {r.urn: r for r in resources if canonical_type(r.type) == AZURE_ROLE_DEFINITION}
    groups = {r.id for r in resources if r.type in AZURE_RESOURCE_GROUPS and r.id}
    violations = [
        Violation(
            f"{_label(r.type, r.name)}: {'; '.join(problems)}; the stack's only custom role is "
            f"a spend guard's, {DEALLOCATE_ACTION} alone, assignable in the stack's resource "
            "group",
            r.urn,
        )
        for r in roles.values()
        if (problems := _deallocate_only(r, groups))
    ]
    for grant in resources:
        if canonical_type(grant.type) != AZURE_ROLE_ASSIGNMENT:
            continue
        owners = _linked(vms, grant, "principalId", _principal)
        workers = [vm for vm in owners if not is_main_node(vm.type, vm.props, vm.name)]
        if not workers:
            continue
        label, vm = _label(grant.type, grant.name), workers[0]
        granted = _linked(roles, grant, "roleDefinitionId", lambda r: r.id)
        if not granted and _known(grant.props.get("roleDefinitionId")):
            violations.append(
                Violation(
                    f"{label}: grants {vm.name}'s identity (a node other than the main node) a "
                    "role other than the stack's deallocate role; remove it: a worker's or the "
                    "balancer node's identity may deallocate its own VM and nothing else (the "
                    "RPC port has no authentication)",
                    grant.urn,
                )
            )
            continue
        scope = grant.props.get("scope")
        scopes = _linked(vms, grant, "scope", lambda r: r.id)
        if _known(scope) and scopes != [vm]:
            violations.append(
                Violation(
                    f"{label}: grants {vm.name}'s identity (a node other than the main node) at "
                    f"{_shown([scope])}, not its own VM; set scope=<that VM>.id",
                    grant.urn,
                )
            )
    return violations


# --- invariant 17: EKS nodes hold no network-interface rights --------------------------------

AWS_EKS_ADDON: Final = "aws:eks/addon:Addon"
AWS_EKS_POD_IDENTITY: Final = "aws:eks/podIdentityAssociation:PodIdentityAssociation"
# The VPC CNI's managed policy: it creates, attaches and modifies network interfaces (and their
# addresses) on every resource. On a node's role, whatever takes the node's credentials could
# move any interface of the account into another security group.
_CNI_POLICY: Final = re.compile(r"arn:aws[a-z-]*:iam::aws:policy/(?:.*/)?AmazonEKS_CNI_Policy")
# The EC2 actions that create or rewire a network interface (the CNI policy's writes).
_ENI_ACTIONS: Final = (
    "ec2:createnetworkinterface",
    "ec2:attachnetworkinterface",
    "ec2:detachnetworkinterface",
    "ec2:deletenetworkinterface",
    "ec2:modifynetworkinterfaceattribute",
    "ec2:assignprivateipaddresses",
    "ec2:unassignprivateipaddresses",
    "ec2:assignipv6addresses",
    "ec2:unassignipv6addresses",
)


def _eni_actions(document: Any) -> list[str]:
    """The actions of a policy document's Allow statements that rewire network interfaces
    (wildcards such as ``ec2:*NetworkInterface*`` included)."""
    found: list[str] = []
    for statement in _statements(document):
        if str(statement.get("Effect", "")).lower() != "allow":
            continue
        for action in _strings(statement.get("Action")):
            if isinstance(action, str) and any(
                fnmatch.fnmatchcase(eni, action.lower()) for eni in _ENI_ACTIONS
            ):
                found.append(action)
    return found


def _role_grants(role: Resource, resources: Sequence[Resource]) -> Iterator[tuple[Resource, str]]:
    """Each grant of a role (the role itself, an attachment or inline policy naming it by name
    or, in a preview, by the property's dependency) that gives network-interface rights, and
    what it gives."""
    name = role.props.get("name")

    def names_role(grant: Resource, prop: str) -> bool:
        value = grant.props.get(prop)
        return (
            isinstance(name, str) and name in _strings(value)
        ) or role.urn in grant.property_dependencies.get(prop, ())

    own = role.props
    for arn in _strings(own.get("managedPolicyArns")):
        if isinstance(arn, str) and _CNI_POLICY.fullmatch(arn):
            yield role, arn
    for inline in [*_items(own.get("inlinePolicies")), *_items(own.get("policies"))]:
        document = _mapping(inline).get("policy") or _mapping(inline).get("policyDocument")
        for action in _eni_actions(document):
            yield role, action
    for grant in resources:
        kind = canonical_type(grant.type)
        attaches = (kind == AWS_ROLE_POLICY_ATTACHMENT and names_role(grant, "role")) or (
            kind == AWS_POLICY_ATTACHMENT and names_role(grant, "roles")
        )
        arn = grant.props.get("policyArn")
        if attaches and isinstance(arn, str) and _CNI_POLICY.fullmatch(arn):
            yield grant, arn
        elif kind in (AWS_ROLE_POLICY, AWS_NATIVE_ROLE_POLICY) and (
            names_role(grant, "role") or names_role(grant, "roleName")
        ):
            document = grant.props.get("policy") or grant.props.get("policyDocument")
            for action in _eni_actions(document):
                yield grant, action


def _node_roles(group: Resource, roles: Mapping[str, Resource]) -> list[Resource]:
    return _linked(roles, group, "nodeRoleArn", lambda r: r.props.get("arn"))


def _cni_has_own_role(resources: Sequence[Resource]) -> bool:
    """Whether the VPC CNI takes a role of its own (a Pod Identity association for aws-node,
    on its add-on or beside it, or IRSA's service account role)."""
    for r in resources:
        kind, props = canonical_type(r.type), r.props
        cni = kind == AWS_EKS_ADDON and props.get("addonName") == "vpc-cni"
        if cni and (
            _present(props.get("serviceAccountRoleArn"))
            or any(
                _mapping(a).get("serviceAccount") in ("aws-node", UNKNOWN)
                for a in _items(props.get("podIdentityAssociations"))
            )
        ):
            return True
        if kind == AWS_EKS_POD_IDENTITY and props.get("serviceAccount") in ("aws-node", UNKNOWN):
            return True
    return False


def eks_nodes_without_eni_rights(resources: Sequence[Resource]) -> list[Violation]:
    """Invariant 17: the role of an EKS node group holds no right to create or rewire network
    interfaces (``AmazonEKS_CNI_Policy``, or the same actions inline), and the VPC CNI of a stack
    with node groups takes a role of its own (EKS Pod Identity, or IRSA) rather than the
    nodes'."""
    roles = {r.urn: r for r in resources if canonical_type(r.type) in (AWS_ROLE, AWS_NATIVE_ROLE)}
    groups = [r for r in resources if canonical_type(r.type) == AWS_EKS_NODE_GROUP]
    violations: list[Violation] = []
    seen: set[tuple[str, str]] = set()
    for group in groups:
        for role in _node_roles(group, roles):
            for grant, what in _role_grants(role, resources):
                if (grant.urn, what) in seen:
                    continue
                seen.add((grant.urn, what))
                violations.append(
                    Violation(
                        f"{_label(grant.type, grant.name)}: gives {what} to {role.name}, the "
                        f"role of node group {group.name}: every node (and whatever takes its "
                        "credentials) could create or move network interfaces of the account; "
                        "give the VPC CNI a role of its own (a Pod Identity association for "
                        "aws-node) and keep the nodes' role to AmazonEKSWorkerNodePolicy and "
                        "image pulls",
                        grant.urn,
                    )
                )
    addons = [
        r
        for r in resources
        if canonical_type(r.type) == AWS_EKS_ADDON and r.props.get("addonName") == "vpc-cni"
    ]
    if groups and addons and not _cni_has_own_role(resources):
        violations.extend(
            Violation(
                f"{_label(addon.type, addon.name)}: the VPC CNI has no role of its own, so it "
                "runs with the nodes' role, which must then hold its network-interface rights; "
                "give it podIdentityAssociations=[{roleArn: <a role with AmazonEKS_CNI_Policy "
                "that trusts pods.eks.amazonaws.com>, serviceAccount: aws-node}]",
                addon.urn,
            )
            for addon in addons
        )
    return violations


# --- invariant 13: on Kubernetes, the RPC port only from the group's leader ---------------------

# The labels the LeaderWorkerSet controller puts on every pod of a set (v0.10.0), as the
# program's infra.stack.kube.objects names them (a test keeps the two equal).
LWS_NAME_LABEL: Final = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX_LABEL: Final = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_INDEX_LABEL: Final = "leaderworkerset.sigs.k8s.io/worker-index"
# Labels a controller adds to the pods with values no manifest tells: the LeaderWorkerSet's own
# (group key, template hash, …) and its StatefulSets'. A selector on one of these may or may not
# pick a worker; on any other label the pod template does not carry, it does not.
_CONTROLLER_LABEL: Final = re.compile(
    r"leaderworkerset\.sigs\.k8s\.io/.*|controller-revision-hash|"
    r"statefulset\.kubernetes\.io/pod-name|apps\.kubernetes\.io/pod-index"
)


def _has_unknown(value: Any) -> bool:
    if value is UNKNOWN:
        return True
    if isinstance(value, Mapping):
        return any(_has_unknown(v) for v in value.values())
    if isinstance(value, Sequence) and not isinstance(value, str):
        return any(_has_unknown(v) for v in value)
    return False


def _pod_label(labels: Mapping[str, str], key: str) -> Any:
    """A pod's label value: a string, None when it has no such label, or ``UNKNOWN`` when only a
    controller sets it."""
    if key in labels:
        return labels[key]
    return UNKNOWN if _CONTROLLER_LABEL.fullmatch(key) else None


def _matches(operator: Any, values: Sequence[str], have: str | None) -> bool:
    if operator == "In":
        return have in values
    if operator == "NotIn":
        return have not in values
    if operator == "Exists":
        return have is not None
    if operator == "DoesNotExist":
        return have is None
    return False  # the API server refuses any other operator


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool | None:
    """Whether a label selector picks a pod with these labels: True, False, or None when it
    rests on a label only a controller sets."""
    terms: list[tuple[str, Any, list[str]]] = [
        (str(key), "In", [str(value)])
        for key, value in _mapping(selector.get("matchLabels")).items()
    ]
    for item in _items(selector.get("matchExpressions")):
        expression = _mapping(item)
        values = [str(v) for v in _items(expression.get("values"))]
        terms.append((str(expression.get("key")), expression.get("operator"), values))
    verdicts: list[bool | None] = []
    for key, operator, values in terms:
        have = _pod_label(labels, key)
        verdicts.append(None if have is UNKNOWN else _matches(operator, values, have))
    if False in verdicts:
        return False
    return None if None in verdicts else True


def _requires(selector: Mapping[str, Any], key: str, value: str) -> bool:
    """Whether a selector picks only pods whose label ``key`` is ``value``."""
    if str(_mapping(selector.get("matchLabels")).get(key)) == value:
        return True
    return any(
        str(expression.get("key")) == key
        and expression.get("operator") == "In"
        and [str(v) for v in _items(expression.get("values"))] == [value]
        for expression in map(_mapping, _items(selector.get("matchExpressions")))
    )


def _isolates_ingress(spec: Mapping[str, Any]) -> bool:
    types = spec.get("policyTypes")
    if types is None:
        return True  # Kubernetes' default: Ingress (and Egress when egress rules are given)
    return "Ingress" in _strings(types)


def _k8s_covers(rule: Mapping[str, Any], port: int, named: Mapping[str, int]) -> bool:
    """Whether an ingress rule admits TCP to ``port`` (no ports: every port; a named port: the
    workers' container port of that name)."""
    entries = _items(rule.get("ports"))
    if not entries:
        return True
    for item in entries:
        entry = _mapping(item)
        if str(entry.get("protocol") or "TCP").upper() != "TCP":
            continue
        value = entry.get("port")
        if value is None:
            return True
        first = _int(value)
        if first is None:
            if named.get(str(value)) == port:
                return True
            continue
        last = _int(entry.get("endPort")) or first
        if first <= port <= last:
            return True
    return False


def _index_values(count: int, start: int, mentioned: Iterable[str]) -> tuple[list[str], bool]:
    """The label values ``start``..``count - 1`` a check needs: those a selector names, and one
    it does not, which stands for every other; and whether it stands for more than itself."""
    named = sorted({v for v in mentioned if v.isdigit() and start <= int(v) < count}, key=int)
    for k in range(start, count):
        if str(k) not in named:
            return [*named, str(k)], count - start > len(named) + 1
    return named, False


@dataclass(frozen=True)
class _LeaderWorkerSet:
    resource: Resource
    name: str
    namespace: Any
    size: int
    replicas: int
    labels: Mapping[str, str]  # the workers' pod template's
    ports: Mapping[str, int]  # the workers' named container ports


def _namespace(r: Resource) -> Any:
    """A Kubernetes object's namespace (None: the provider's default), or ``UNKNOWN``."""
    meta = r.props.get("metadata")
    namespace = _mapping(meta).get("namespace") if _known(meta) else UNKNOWN
    return namespace or None


def _leader_worker_set(r: Resource) -> _LeaderWorkerSet | None:
    """A LeaderWorkerSet with workers whose settings that matter here are all known (None
    otherwise): its name and namespace, size and replicas, the workers' labels and ports."""
    meta, spec = r.props.get("metadata"), r.props.get("spec")
    if not _known(meta) or not _known(spec):
        return None
    meta, spec = _mapping(meta), _mapping(spec)
    template = spec.get("leaderWorkerTemplate")
    pod = _mapping(_mapping(template).get("workerTemplate")) or _mapping(
        _mapping(template).get("leaderTemplate")
    )
    pod_spec = pod.get("spec")
    seen = [
        meta.get("name"),
        meta.get("namespace"),
        spec.get("replicas"),
        template,
        _mapping(template).get("size"),
        pod.get("metadata"),
        pod_spec,
        *(_mapping(c).get("ports") for c in _items(_mapping(pod_spec).get("containers"))),
    ]
    if _has_unknown(seen):
        return None
    template = _mapping(template)
    size = _int(template.get("size", 1))  # the CRD's defaults: size 1, replicas 1
    replicas = _int(spec.get("replicas", 1))
    name = meta.get("name")
    if size is None or size <= 1 or replicas is None or not isinstance(name, str):
        return None
    labels = _mapping(_mapping(pod.get("metadata")).get("labels"))
    ports = {
        str(port["name"]): containerport
        for container in _items(_mapping(pod.get("spec")).get("containers"))
        for port in map(_mapping, _items(_mapping(container).get("ports")))
        if port.get("name") and (containerport := _int(port.get("containerPort"))) is not None
    }
    return _LeaderWorkerSet(
        r,
        name,
        _namespace(r),
        size,
        replicas,
        {str(k): str(v) for k, v in labels.items()},
        ports,
    )


def _peer_problems(where: str, peers: list[Any], lws: _LeaderWorkerSet) -> Iterator[str]:
    for j, item in enumerate(peers):
        peer = _mapping(item)
        at = f"{where}.from[{j}]"
        if "ipBlock" in peer:
            yield f"{at}.ipBlock admits {_mapping(peer['ipBlock']).get('cidr') or 'addresses'}"
        if "namespaceSelector" in peer:
            yield f"{at}.namespaceSelector admits pods of other namespaces"
        selector = peer.get("podSelector")
        if selector is None:
            if "ipBlock" not in peer and "namespaceSelector" not in peer:
                yield f"{at} is empty and admits every source"
        elif not (
            _requires(_mapping(selector), LWS_NAME_LABEL, lws.name)
            and _requires(_mapping(selector), LWS_WORKER_INDEX_LABEL, "0")
        ):
            shown = json.dumps(selector, sort_keys=True)
            yield f"{at}.podSelector {shown} admits pods other than the set's leaders"


def _lws_rpc_violations(
    lws: _LeaderWorkerSet, policies: Sequence[Resource], port: int
) -> list[Violation]:
    """The worker pods of one LeaderWorkerSet: each group's are isolated by a NetworkPolicy of
    their namespace, and every policy that picks them admits the RPC port from the set's
    leaders alone (Kubernetes admits what any policy that picks a pod admits)."""
    mine = [p for p in policies if _namespace(p) == lws.namespace]
    selectors = [_mapping(_mapping(p.props.get("spec")).get("podSelector")) for p in mine]

    def mentioned(key: str) -> list[str]:
        """The values of a label the namespace's policies select on."""
        found = [str(_mapping(s.get("matchLabels")).get(key)) for s in selectors]
        for selector in selectors:
            for expression in map(_mapping, _items(selector.get("matchExpressions"))):
                if expression.get("key") == key:
                    found += [str(v) for v in _items(expression.get("values"))]
        return found

    groups, more_groups = _index_values(lws.replicas, 0, mentioned(LWS_GROUP_INDEX_LABEL))
    workers, _ = _index_values(lws.size, 1, mentioned(LWS_WORKER_INDEX_LABEL))
    label = _label(lws.resource.type, lws.resource.name)
    fix = (
        f"admit the RPC port only from the leaders: from: [{{podSelector: {{matchLabels: "
        f'{{"{LWS_NAME_LABEL}": "{lws.name}", "{LWS_WORKER_INDEX_LABEL}": "0"}}}}}}]'
    )
    problems: dict[tuple[str, str], None] = {}
    bare: list[str] = []
    for group in groups:
        isolated = True
        for worker in workers:
            pod = {
                **lws.labels,
                LWS_NAME_LABEL: lws.name,
                LWS_GROUP_INDEX_LABEL: group,
                LWS_WORKER_INDEX_LABEL: worker,
            }
            picks = [
                (p, verdict)
                for p, selector in zip(mine, selectors, strict=True)
                if _isolates_ingress(_mapping(p.props.get("spec")))
                and (verdict := _selects(selector, pod)) is not False
            ]
            isolated = isolated and any(verdict for _, verdict in picks)
            for p, _ in picks:
                where = _label(p.type, p.name)
                for i, item in enumerate(_items(_mapping(p.props.get("spec")).get("ingress"))):
                    rule = _mapping(item)
                    if not _k8s_covers(rule, port, lws.ports):
                        continue
                    at = f"spec.ingress[{i}]"
                    peers = _items(rule.get("from"))
                    found = (
                        list(_peer_problems(at, peers, lws))
                        if peers
                        else [f"{at} has no `from` and admits every source"]
                    )
                    for problem in found:
                        message = (
                            f"{where}: {problem} to the RPC port {port} of LeaderWorkerSet "
                            f"{lws.name}'s workers; {fix}"
                        )
                        problems[message, p.urn] = None
        if not isolated:
            bare.append(group)
    violations = [Violation(message, at) for message, at in problems]
    if bare:
        others = (
            " (and every other group no policy names)"
            if more_groups and bare[-1] == groups[-1]
            else ""
        )
        violations.insert(
            0,
            Violation(
                f"{label}: spec.leaderWorkerTemplate.size is {lws.size}, but no NetworkPolicy in "
                f"namespace {lws.namespace or '(the provider default)'} isolates the workers of "
                f"group {', '.join(bare)}{others}, so every pod of the cluster reaches their RPC "
                f"port {port}; add one whose podSelector picks them (matchLabels "
                f'{{"{LWS_NAME_LABEL}": "{lws.name}"}}, matchExpressions {LWS_WORKER_INDEX_LABEL} '
                f'NotIn ["0"]), with policyTypes ["Ingress"], and {fix}',
                lws.resource.urn,
            ),
        )
    return violations


def k8s_rpc_only_from_leader(
    resources: Sequence[Resource], port: int = DEFAULT_RPC_PORT
) -> list[Violation]:
    """Invariant 13: on Kubernetes, a LeaderWorkerSet's workers (size > 1) are isolated by a
    NetworkPolicy of their namespace, and every policy that picks them admits the RPC port only
    from a podSelector of the set's leaders (worker index 0): no ipBlock, no namespaceSelector,
    no rule without sources. A set or a namespace's policy not yet known (a preview) is not
    judged: the update's stack check, which sees them, is."""
    policies = [r for r in resources if canonical_type(r.type) == K8S_NETWORK_POLICY]
    violations: list[Violation] = []
    for r in resources:
        if canonical_type(r.type) != K8S_LEADER_WORKER_SET:
            continue
        lws = _leader_worker_set(r)
        if lws is None:
            continue
        unknown = [
            p
            for p in policies
            if _namespace(p) is UNKNOWN
            or (_namespace(p) == lws.namespace and _has_unknown(p.props.get("spec")))
        ]
        if not unknown:
            violations += _lws_rpc_violations(lws, policies, port)
    return violations + _host_network_pods(resources)


def _host_network_pods(resources: Sequence[Resource]) -> list[Violation]:
    """A LeaderWorkerSet's pod on the node's network (``hostNetwork``), or with a port on the
    node's address (``hostPort``), serves outside every NetworkPolicy, which applies to pods on
    the pod network alone: the workers' unauthenticated RPC port would be open to whatever
    reaches the node."""
    found: list[Violation] = []
    for r in resources:
        if canonical_type(r.type) != K8S_LEADER_WORKER_SET:
            continue
        template = _mapping(_mapping(r.props.get("spec")).get("leaderWorkerTemplate"))
        for which in ("workerTemplate", "leaderTemplate"):
            spec = _mapping(_mapping(template.get(which)).get("spec"))
            where = f"{_label(r.type, r.name)}: spec.leaderWorkerTemplate.{which}.spec"
            if spec.get("hostNetwork") is True:
                found.append(
                    Violation(
                        f"{where}.hostNetwork puts the pods on the node's network, where no "
                        "NetworkPolicy applies; remove it",
                        r.urn,
                    )
                )
            for container in map(_mapping, _items(spec.get("containers"))):
                for entry in map(_mapping, _items(container.get("ports"))):
                    if _present(entry.get("hostPort")):
                        found.append(
                            Violation(
                                f"{where}: container {container.get('name')} binds hostPort "
                                f"{entry.get('hostPort')} on the node's address, where no "
                                "NetworkPolicy applies; remove host_port",
                                r.urn,
                            )
                        )
    return found


def check_stack(
    resources: Sequence[Resource],
    port: int = DEFAULT_RPC_PORT,
    expected_tags: Mapping[str, str | None] | None = None,
) -> dict[str, list[Violation]]:
    """Every policy over a whole stack, as the pack runs them: policy name -> violations."""
    resources = [as_judged(r) for r in resources]
    result: dict[str, list[Violation]] = {}
    for policy, validator in RESOURCE_VALIDATORS.items():
        extra = {"expected": expected_tags} if validator is node_tags else {}
        result[policy] = [
            Violation(message, r.urn)
            for r in resources
            for message in validator(r.type, r.props, r.name, **extra)
        ]
    result["rpc-only-from-main"] = rpc_only_from_main(resources, port)
    result["metrics-only-from-main"] = metrics_only_from_main(resources)
    result["k8s-rpc-only-from-leader"] = k8s_rpc_only_from_leader(resources, port)
    result["identity-grants-deallocate-only"] = identity_grants(resources)
    result["eks-nodes-hold-no-eni-rights"] = eks_nodes_without_eni_rights(resources)
    return result
