"""Run the Pulumi program for a stack preset under mocks, recording every resource and output."""

from __future__ import annotations

import base64
import copy
import gzip
import hashlib
import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml

from infra.conformance import RESOURCE_RULES, rules
from infra.core.layout import PROJECT
from infra.core.limits import MAX_WORKERS
from infra.preflight import Account, Needs, QuotaReading
from infra.stack.files import config_of, stack_values

ZONES = ["us-east-1a", "us-east-1b", "us-east-1c"]
# What Azure reports: the subscription a stack deploys to, and a VM identity's principal.
SUBSCRIPTION = "00000000-0000-0000-0000-000000000001"
PRINCIPAL = "11111111-2222-3333-4444-555555555555"


def principal_of(vm: str) -> str:
    """The principal id of a VM's system-assigned identity, as the mocks answer (one per VM)."""
    return f"{PRINCIPAL[:-12]}{zlib.crc32(vm.encode()):012d}"


GCP_ZONES = ["us-central1-c", "us-central1-a", "us-central1-b"]
DISKS = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks"
GCP_SELF_LINKS = "https://www.googleapis.com/compute/v1/projects/my-project/self"


# The stacks this repository ships, by name: the mock tiers sweep these, never whatever else lies
# in stacks/ (a user's own, or one `lrc plan --write-stack` wrote).
REPOSITORY_STACKS = (
    "aws-c7g",
    "aws-c8g",
    "aws-eks",
    "aws-r8g",
    "aws-small",
    "azure-cobalt",
    "gcp-c4a",
)
# The stacks whose nodes are Kubernetes pods (platform: kubernetes), not VMs.
KUBERNETES_STACKS = ("aws-eks",)


def stack_names() -> list[str]:
    return list(REPOSITORY_STACKS)


def vm_stack_names() -> list[str]:
    """The shipped stacks whose nodes are VMs."""
    return [s for s in REPOSITORY_STACKS if s not in KUBERNETES_STACKS]


def stack_config(stack: str) -> dict[str, Any]:
    return stack_values(stack)


def parsed_config(stack: str, overrides: dict[str, Any] | None = None) -> Any:
    """The stack's validated ``ClusterConfig``, as the program reads it."""
    return config_of({**stack_values(stack), **(overrides or {})})


# The LeaderWorkerSet manifest the tests apply (tests/conftest.py serves it for the release's
# URL), and the pins a Kubernetes stack is deployed with here: its sha256, and an image by digest.
CONTROLLER_MANIFEST = Path(__file__).parent / "fixtures" / "lws-manifest" / "manifests.yaml"
CONTROLLER_PINS = {
    "llama-rpc-cluster:kubernetesControllerSha256": hashlib.sha256(
        CONTROLLER_MANIFEST.read_bytes()
    ).hexdigest(),
    "llama-rpc-cluster:kubernetesControllerImage": "registry.k8s.io/lws/lws@sha256:" + "5" * 64,
}


def program_settings(
    stack: str, overrides: dict[str, Any] | None = None
) -> tuple[dict[str, Any], str | None]:
    """A preset's settings, with overrides, as the program reads them: the project's keys
    without their namespace, each value as Pulumi hands it over (JSON text unless a string; a
    None override removes the key), and the region from the cloud's own key. A Kubernetes
    preset is deployed with the tests' controller pins (``CONTROLLER_PINS``)."""
    from infra.stack import config as cluster_config
    from infra.stack.settings import decode

    values = {**stack_config(stack), **(overrides or {})}
    if values.get(f"{PROJECT}:platform") == "kubernetes":
        values = {**stack_config(stack), **CONTROLLER_PINS, **(overrides or {})}
    given = {
        k: v if isinstance(v, str) else json.dumps(v) for k, v in values.items() if v is not None
    }
    project = f"{cluster_config.PROJECT}:"
    settings = {k.removeprefix(project): v for k, v in given.items() if k.startswith(project)}
    cloud = str(decode(settings.get("cloud", "aws")))
    return settings, given.get(cluster_config.REGION_KEYS.get(cloud, ""))


def refusal(stack: str, overrides: dict[str, Any]) -> Any:
    """The ``ConfigError`` the config check raises for a preset with these overrides (the
    program raises it before it registers anything)."""
    from infra.stack import config as cluster_config

    settings, region = program_settings(stack, overrides)
    try:
        cluster_config.from_settings(settings, region=region)
    except cluster_config.ConfigError as error:
        return error
    raise AssertionError(f"{stack} with {overrides} was accepted")


def refused(stack: str, overrides: dict[str, Any], key: str) -> str:
    """What the config check says when it refuses a preset with these overrides; the error must
    be about ``key`` and name it first (the project's keys with their namespace)."""
    error = refusal(stack, overrides)
    assert error.setting == key, f"the error is about {error.setting!r}, not {key!r}: {error}"
    text = str(error)
    assert text.startswith(f"{key if ':' in key else f'llama-rpc-cluster:{key}'}: "), text
    return text


def azure_asg_id(group: str, name: str) -> str:
    """An application security group's id as Azure makes it: NSG rules name groups by id."""
    return (
        f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{group}"
        f"/providers/Microsoft.Network/applicationSecurityGroups/{name}"
    )


class RecordingMocks(pulumi.runtime.Mocks):
    """Record what the program registers. With ``prior`` (the deployment of an earlier ``up``),
    answer as the engine does for a resource that exists: its id stays, and an input it ignores
    (``ignore_changes``) keeps the value it was created with."""

    def __init__(self, prior: Deployment | None = None, *, ignore_changes: bool = True) -> None:
        self.resources: list[pulumi.runtime.MockResourceArgs] = []
        self.calls: list[pulumi.runtime.MockCallArgs] = []
        self.states: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
        self.prior = prior
        self.ignore_changes = ignore_changes  # False: as if no resource ignored a change
        # The run's resource options by (type, name), which deploy() records.
        self.options: dict[tuple[str, str], pulumi.ResourceOptions] = {}

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.resources.append(args)
        resource_id, state = self.answer(args)
        kept = self.prior.states.get((args.typ, args.name)) if self.prior else None
        if kept is not None:
            resource_id, old = kept
            options = self.options.get((args.typ, args.name))
            ignored = (options.ignore_changes if options else None) or []
            for prop in ignored if self.ignore_changes else []:
                if prop in old:
                    state[prop] = old[prop]
        self.states[args.typ, args.name] = (resource_id, state)
        return resource_id, state

    def answer(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        state = dict(args.inputs)
        state.setdefault("name", args.name)
        if args.typ == "azure-native:compute:VirtualMachine":
            # Azure names the OS disk and gives the VM an id of its own.
            disk = f"{DISKS}/{args.name}-os"
            profile = json.loads(json.dumps(state["storageProfile"]))
            profile["osDisk"].setdefault("managedDisk", {})["id"] = disk
            state |= {"storageProfile": profile, "vmId": f"{args.name}-vm-id"}
        if args.typ == "random:index/randomPassword:RandomPassword":
            # The provider's own result: `length` letters and digits.
            state["result"] = (GENERATED_KEY * 10)[: int(args.inputs["length"])]
        if args.typ == "azure-native:keyvault:Vault":
            state["name"] = args.inputs["vaultName"]  # a given name is the resource's name
        if args.typ == "random:index/randomString:RandomString":
            # `length` characters of the classes asked for (here: lowercase letters, digits).
            state["result"] = ("0123456789abcdefghijklmnopqrstuvwxyz" * 8)[
                : int(args.inputs["length"])
            ]
        if args.typ == "aws:iam/role:Role":
            state["arn"] = f"arn:aws:iam::123456789012:role/{args.name}"
        if args.typ == "aws:eks/cluster:Cluster":
            # What EKS gives a new cluster: its endpoint and certificate authority.
            state["endpoint"] = "https://0123456789ABCDEF.gr7.us-east-1.eks.amazonaws.com"
            state["certificateAuthority"] = {"data": "Q0VSVElGSUNBVEU="}
            state["vpcConfig"] = {**state["vpcConfig"], "clusterSecurityGroupId": "sg-0eks"}
            # The service range EKS picks for a cluster in a 10.x VPC (EKS API
            # KubernetesNetworkConfigRequest: 10.100.0.0/16 or 172.20.0.0/16).
            state["kubernetesNetworkConfig"] = {"serviceIpv4Cidr": "172.20.0.0/16"}
        if args.typ == "aws:ec2/launchTemplate:LaunchTemplate":
            state["latestVersion"] = 1
        if args.typ == "aws:ssm/parameter:Parameter":
            state["arn"] = f"arn:aws:ssm:us-east-1:123456789012:parameter{args.inputs['name']}"
        if args.typ == "gcp:serviceaccount/account:Account":
            state["email"] = f"{args.inputs['accountId']}@my-project.iam.gserviceaccount.com"
        if args.typ.startswith("gcp:compute/"):
            # Compute resources name each other by URL (an instance in its group, a group as a
            # backend).
            state.setdefault("selfLink", f"{GCP_SELF_LINKS}/{args.name}")
        if args.typ == "azure-native:compute:VirtualMachine" and "identity" in state:
            state["identity"] = {
                **state["identity"],
                "principalId": principal_of(args.name),
                "tenantId": "t",
            }
        if args.typ == "azure-native:resources:ResourceGroup":
            state["id"] = f"/subscriptions/s/resourceGroups/{args.name}"
        if args.typ == "azure-native:network:ApplicationSecurityGroup":
            return azure_asg_id(args.inputs["resourceGroupName"], args.name), state
        if args.typ == "azure-native:keyvault:Secret":
            # A secret's id is its vault's, then /secrets/ and its name.
            group, vault = args.inputs["resourceGroupName"], args.inputs["vaultName"]
            vaults = f"/subscriptions/s/resourceGroups/{group}/providers/Microsoft.KeyVault/vaults"
            return f"{vaults}/{vault}/secrets/{args.inputs['secretName']}", state
        if args.typ == "azure-native:network:LoadBalancer":
            # Its id as Azure makes it, under its group's (here "<group>-id"): its parts name
            # each other by id.
            group, name = args.inputs["resourceGroupName"], args.inputs["loadBalancerName"]
            return f"{group}-id/providers/Microsoft.Network/loadBalancers/{name}", state
        return f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        self.calls.append(args)
        answers = {
            "aws:ssm/getParameter:getParameter": lambda a: {
                "name": a["name"], "type": "String", "value": "ami-0123456789abcdef0"
            },
            "aws:ec2/getAmi:getAmi": lambda a: {"id": "ami-0fedcba9876543210", **a},
            "aws:index/getAvailabilityZones:getAvailabilityZones": lambda a: {
                "names": [z for z in ZONES if z not in a.get("excludeNames", [])],
                "zoneIds": [f"use1-az{i}" for i in (1, 2, 4)], "id": "us-east-1",
            },
            "azure-native:authorization:getClientConfig": lambda a: {
                "clientId": "c", "objectId": "o", "subscriptionId": SUBSCRIPTION, "tenantId": "t"
            },
            "gcp:organizations/getClientConfig:getClientConfig": lambda a: {
                "id": "c", "project": "my-project", "region": "", "zone": "", "accessToken": ""
            },
        }  # fmt: skip
        answer = answers.get(args.token)
        return answer(args.args) if answer else {}


# What the mocked random provider generates for an API key (repeated to the length asked).
GENERATED_KEY = "GeneratedApiKey0123456789"
# How the engine hands a provider a secret input (rules.SECRET_SIGNATURE beside the value).
revealed = rules.revealed
is_secret_input = rules.is_secret


@dataclass
class Deployment:
    resources: list[pulumi.runtime.MockResourceArgs]
    outputs: dict[str, Any] = field(default_factory=dict)
    # Each resource's options by (type, name) (mocks do not see them: a stack transformation
    # does).
    options: dict[tuple[str, str], pulumi.ResourceOptions] = field(default_factory=dict)
    # What the mocks answered for each resource: (type, name) -> (id, state).
    states: dict[tuple[str, str], tuple[str, dict[str, Any]]] = field(default_factory=dict)
    # The outputs Pulumi keeps as secrets (encrypted in the state, hidden without
    # --show-secrets).
    secret_outputs: set[str] = field(default_factory=set)
    # The invokes the program made, in order.
    calls: list[pulumi.runtime.MockCallArgs] = field(default_factory=list)

    def of_type(self, typ: str) -> list[pulumi.runtime.MockResourceArgs]:
        return [r for r in self.resources if r.typ == typ]

    def named(self, name: str) -> pulumi.runtime.MockResourceArgs:
        return next(r for r in self.resources if r.name == name)

    def options_of(self, resource: pulumi.runtime.MockResourceArgs) -> pulumi.ResourceOptions:
        return self.options[resource.typ, resource.name]

    def identities(self) -> dict[str, str]:
        """Each resource's id and the texts of its outputs (what its dependents' inputs hold of
        it) -> its key."""
        identities: dict[str, str] = {}
        for (typ, name), (resource_id, state) in self.states.items():
            if typ.startswith(rules.PROGRAM_TYPE_PREFIX):
                continue
            key = rules.key_of(typ, name)
            identities[resource_id] = key
            given = set(_texts(self.inputs_of(typ, name)))
            for text in _texts(state):
                if text not in given:
                    identities.setdefault(text, key)
        return identities

    def stack(self) -> rules.Stack:
        """The resources as the cloud rules see them: inputs, and what each waits for, given
        by ``depends_on`` or through an input that holds another resource's id or output."""
        identities = self.identities()
        found = []
        for r in self.resources:
            texts = _texts(r.inputs)
            waits = {identities[text] for text in texts if text in identities}
            # An id inside a longer one (an Azure sub-resource's id, built from its parent's).
            waits |= {
                name
                for text in texts
                if "/" in text
                for known, name in identities.items()
                if known.endswith("-id") and known in text
            }
            options = self.options.get((r.typ, r.name))
            for other in (options.depends_on if options else None) or []:
                waits.add(rules.key_of(other.pulumi_resource_type, other.pulumi_resource_name))
            waits.discard(rules.key_of(r.typ, r.name))
            found.append(rules.Registered(r.typ, r.name, dict(r.inputs), frozenset(waits)))
        return rules.Stack(found, identities)

    def inputs_of(self, typ: str, name: str) -> dict[str, Any]:
        return next(dict(r.inputs) for r in self.resources if (r.typ, r.name) == (typ, name))


def _paths_of(value: Any, wanted: set[str], path: str = "") -> set[str]:
    """The paths in an input tree whose text is one of ``wanted`` (or, for a path-like id, is
    built from one: an Azure sub-resource's id from its parent's)."""
    if isinstance(value, str):
        built = "/" in value and any(t.endswith("-id") and t in value for t in wanted)
        return {path} if value in wanted or built else set()
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return set()
    found: set[str] = set()
    for key, item in items:
        found |= _paths_of(item, wanted, f"{path}.{key}".lstrip("."))
    return found


def plan_update(
    before: Deployment,
    after: Deployment,
    forced: frozenset[str] = frozenset(),
    *,
    ignore_changes: bool = True,
) -> dict[str, str]:
    """What ``pulumi up`` does to each resource going from ``before`` to ``after`` (the program
    run again under mocks that keep the prior state, ``RecordingMocks(prior=...)``): "create",
    "replace", "update", "same" or "delete", by key. A resource is replaced when an input its
    cloud's rules say replaces it changes (``ResourceRules.replaced_on``), or one of its
    ``replace_on_changes``, or it is ``forced`` (``pulumi up --replace``), or one of its
    ``replace_with`` is; a replaced resource has a new id and outputs, so every input holding
    them changes too. Inputs under ``ignore_changes`` are not compared."""
    old = {rules.key_of(r.typ, r.name): r for r in before.resources}
    new = {rules.key_of(r.typ, r.name): r for r in after.resources}
    changed: dict[str, set[str]] = {}
    for key, r in new.items():
        if key in old and not r.typ.startswith(rules.PROGRAM_TYPE_PREFIX):
            options = after.options.get((r.typ, r.name))
            ignored = (options.ignore_changes or []) if options and ignore_changes else []
            paths = rules.changed_paths(dict(old[key].inputs), dict(r.inputs))
            changed[key] = {p for p in paths if not any(rules.covers(i, p) for i in ignored)}
    by_key: dict[str, set[str]] = {}
    for text, key in before.identities().items():
        by_key.setdefault(key, set()).add(text)
    replaced = set(forced)
    while True:
        size = len(replaced) + sum(map(len, changed.values()))
        for key, paths in changed.items():
            r = new[key]
            options = after.options.get((r.typ, r.name))
            patterns = (
                *RESOURCE_RULES[r.typ].replaced_on,
                *((options and options.replace_on_changes) or []),
            )
            if any(rules.covers(p, path) for p in patterns for path in paths):
                replaced.add(key)
            others = (options and options.replace_with) or []
            if any(
                rules.key_of(o.pulumi_resource_type, o.pulumi_resource_name) in replaced
                for o in others
            ):
                replaced.add(key)
        for key in replaced:
            texts = by_key.get(key, set())
            for other, r in new.items():
                if other in changed and texts:
                    changed[other] |= _paths_of(dict(r.inputs), texts)
        if len(replaced) + sum(map(len, changed.values())) == size:
            break
    actions = {key: "delete" for key in old if key not in new}
    for key in new:
        if key not in old:
            actions[key] = "create"
        elif key in replaced:
            actions[key] = "replace"
        else:
            actions[key] = "update" if changed.get(key) else "same"
    return actions


def refused_replacements(
    before: Deployment, after: Deployment, actions: dict[str, str]
) -> dict[str, str]:
    """The replacements of ``actions`` (``plan_update``) the cloud refuses, by key, and why: made
    create-first while the old resource still holds a value the new one asks for
    (``ResourceRules.held``, such as a fixed private address)."""
    old = {rules.key_of(r.typ, r.name): r for r in before.resources}
    found = {}
    for r in after.resources:
        key = rules.key_of(r.typ, r.name)
        if actions.get(key) != "replace":
            continue
        options = after.options.get((r.typ, r.name))
        why = rules.create_first_clash(
            RESOURCE_RULES[r.typ],
            dict(old[key].inputs),
            dict(r.inputs),
            delete_before_replace=bool(options and options.delete_before_replace),
        )
        if why:
            found[key] = why
    return found


def _texts(value: Any) -> list[str]:
    """Every string in an input tree."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for item in value.values() for text in _texts(item)]
    if isinstance(value, list | tuple):
        return [text for item in value for text in _texts(item)]
    return []


def ready_account(needs: Needs, unavailable: dict[str, set[str]] | None = None) -> Account:
    """An account that offers the types in every zone (but those ``unavailable`` lists) and has
    quota for them: what the preflight reads of a ready account."""
    zones = {"aws": ZONES, "gcp": GCP_ZONES}.get(needs.cloud, [])
    offers = {
        zone: frozenset(set(needs.types) - (unavailable or {}).get(zone, set())) for zone in zones
    }
    quotas = tuple(QuotaReading(quota, limit=100_000.0, used=0.0) for quota in needs.quota_needs())
    return Account(
        needs.cloud,
        needs.region,
        zone_offers=offers or None,
        quotas=quotas,
        network_watcher=needs.network_watcher,
        insights_registered=True,
    )


def without_version_aliases(
    args: pulumi.ResourceTransformationArgs,
) -> pulumi.ResourceTransformationResult | None:
    """The resource without the aliases its provider gives it for each API version of its type
    (Azure's: 30 a type). Mocks resolve no alias, and the runtime would make every one a URN,
    which is most of an Azure deployment's time; the program's own aliases stay."""
    aliases = args.opts.aliases or []
    kept = [a for a in aliases if not _version_alias(a)]
    if len(kept) == len(aliases):
        return None
    opts = copy.copy(args.opts)
    opts.aliases = kept or None
    return pulumi.ResourceTransformationResult(args.props, opts)


def _version_alias(alias: Any) -> bool:
    """An alias that names another type alone (``Alias(type_=...)``), as providers give them."""
    unset = ("name", "parent", "stack", "project")  # an Alias leaves them at ...
    return (
        isinstance(alias, pulumi.Alias)
        and isinstance(alias.type_, str)
        and all(getattr(alias, field) is ... for field in unset)
    )


def deploy(
    stack: str,
    overrides: dict[str, Any] | None = None,
    mocks: RecordingMocks | None = None,
    *,
    stack_name: str | None = None,
    account: Callable[[Needs], Account] | None = None,
    secret_keys: list[str] | None = None,
) -> Deployment:
    """Run the program for a stack preset (with config overrides) and resolve its outputs; as a
    stack of another name, if given (Pulumi stack names may hold capitals, '.' and '_'). The
    preflight reads ``account`` (``ready_account`` by default)."""
    from infra.stack import program

    mocks = mocks or RecordingMocks()
    pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=stack_name or stack, preview=False)
    config = {**stack_config(stack), **(overrides or {})}
    if config.get(f"{PROJECT}:platform") == "kubernetes":
        config = {**stack_config(stack), **CONTROLLER_PINS, **(overrides or {})}
    pulumi.runtime.set_all_config(
        {k: v if isinstance(v, str) else json.dumps(v) for k, v in config.items() if v is not None},
        # As `pulumi config set --secret` keeps them (a test may say otherwise).
        secret_keys=[f"{PROJECT}:apiKey"] if secret_keys is None else secret_keys,
    )
    deployment = Deployment(
        mocks.resources, options=mocks.options, states=mocks.states, calls=mocks.calls
    )
    running = [True]

    def record(
        args: pulumi.ResourceTransformationArgs,
    ) -> pulumi.ResourceTransformationResult | None:
        # A stack transformation outlives its run (the runtime keeps it), and must not record
        # a later run's options.
        if running[0]:
            deployment.options[args.type_, args.name] = args.opts
        return without_version_aliases(args)

    @pulumi.runtime.test
    def run() -> pulumi.Output[Any]:
        pulumi.runtime.register_stack_transformation(record)
        cluster = program.run(account or ready_account)
        everything = {**cluster.outputs, **cluster.details}

        def secrets(flags: list[bool]) -> None:
            deployment.secret_outputs.update(
                key for key, secret in zip(everything, flags, strict=True) if secret
            )

        pulumi.Output.all(
            *(
                pulumi.Output.from_input(value.is_secret())
                if isinstance(value, pulumi.Output)
                else pulumi.Output.from_input(False)
                for value in everything.values()
            )
        ).apply(secrets)
        return pulumi.Output.from_input(everything).apply(deployment.outputs.update)

    try:
        run()
    finally:
        running[0] = False
    return deployment


# The preset of each cloud whose nodes are VMs that the shared variants below are deployed on.
CLOUD_STACKS = {"aws": "aws-c8g", "gcp": "gcp-c4a", "azure": "azure-cobalt"}
# The variants several test files read (settings for ``deployment``): two serving groups behind
# the balancer node, each of two slots;
REPLICAS: dict[str, Any] = {"replicas": 2, "slots": 2}
# its first group alone (what it was before the second);
ONE_GROUP: dict[str, Any] = {k: v for k, v in REPLICAS.items() if k != "replicas"}
# the same with both spend guards on every node;
GUARDED: dict[str, Any] = {**REPLICAS, "stopAfterIdleMinutes": 30, "stopAfterHours": 12}
# the largest stack: three groups of the most workers llama.cpp takes;
LARGEST: dict[str, Any] = {"replicas": 3, "workerCount": MAX_WORKERS, "maxHourlyUsd": 10_000}
# no flow logs;
NO_FLOW_LOGS: dict[str, Any] = {"flowLogs": False}
# the API reached from a wide private range (the VPC's among it) and a public one;
API_CIDRS: dict[str, Any] = {"apiAllowedCidrs": ["10.0.0.0/8", "203.0.113.0/24"]}
# Azure: replicas behind a Bastion host and those ranges.
BASTION: dict[str, Any] = {**REPLICAS, **API_CIDRS, "bastion": True}
# Azure: encryption at host, on a pinned image.
HOST_ENCRYPTION: dict[str, Any] = {"encryptionAtHost": True, "image": "24.04.202510010"}
# EKS: its API endpoint reached from a public and a private range.
KUBERNETES_API_CIDRS: dict[str, Any] = {"kubernetesApiCidrs": ["203.0.113.0/24", "10.8.0.0/16"]}
# An API key of the stack's own (a secret setting), and none at all (browsers held to one origin).
GIVEN_KEY: dict[str, Any] = {"apiKey": "a-team-key-of-our-own-1234"}
NO_KEY: dict[str, Any] = {
    "apiKey": "none",
    "serverArgs": ["--cors-origins", "https://chat.example.com"],
}
# A model staged in each cloud's store, in parts (Azure's in three containers, one part at a
# container's top).
STAGED_URLS = {
    "aws": ["s3://my-models/llama/part-1.gguf", "s3://my-models/llama/part-2.gguf"],
    "gcp": [
        "gs://my-models/llama/part-00001-of-00002.gguf",
        "gs://my-models/llama/part-00002-of-00002.gguf",
    ],
    "azure": [
        "az://mymodels/models/llama/part-00001-of-00002.gguf",
        "az://mymodels/models/llama/part-00002-of-00002.gguf",
        "az://mymodels/other/extra.gguf",
        "az://mymodels/top/p.gguf",
    ],
}
# An SSE-KMS bucket's key, in the stacks' region.
KMS_KEY = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"


def cloud_of(stack: str) -> str:
    return str(stack_config(stack).get(f"{PROJECT}:cloud", "aws"))


def one_node() -> dict[str, Any]:
    """A model that fits one node (aws-small's), and no workers."""
    return {"model": stack_config("aws-small")[f"{PROJECT}:model"], "workerCount": 0}


def staged_model(cloud: str) -> dict[str, Any]:
    """The cloud's preset's model staged in its store (``STAGED_URLS``), without checksums."""
    model = stack_config(CLOUD_STACKS[cloud])[f"{PROJECT}:model"]
    extra = {"modelStoreResourceGroup": "models-rg"} if cloud == "azure" else {}
    return {"model": {**model, "urls": STAGED_URLS[cloud], "sha256": []}, **extra}


# Deployments by (stack, stack name, settings), made once per test process: every test that
# reads a variant reads the same one, and its fingerprint when it was made. Each has its own
# mocks and records; none may be changed.
_deployments: dict[tuple[str, str | None, str], tuple[Deployment, str]] = {}


def _fingerprint(d: Deployment) -> str:
    """What a test could change of a deployment by mistake: its inputs, states and outputs."""
    seen = repr(([(r.typ, r.name, r.inputs) for r in d.resources], d.states, d.outputs))
    return hashlib.sha256(seen.encode()).hexdigest()


def deployment(stack: str, *, stack_name: str | None = None, **settings: Any) -> Deployment:
    """A stack preset deployed under mocks with these settings (the project's keys without
    their namespace; another namespace's key with it, ``**{"aws:region": ...}``), as a stack
    of another name if given, once per test session."""
    overrides = overrides_of(settings)
    key = (stack, stack_name, json.dumps(overrides, sort_keys=True))
    if key not in _deployments:
        made = deploy(stack, overrides, stack_name=stack_name)
        _deployments[key] = made, _fingerprint(made)
    found, fingerprint = _deployments[key]
    assert _fingerprint(found) == fingerprint, f"a test changed the deployment of {key}"
    return found


def overrides_of(settings: dict[str, Any]) -> dict[str, Any]:
    """Settings as a preset's overrides: the project's keys with their namespace."""
    return {k if ":" in k else f"{PROJECT}:{k}": value for k, value in settings.items()}


def deployed(stack: str) -> Deployment:
    """A stack preset deployed under mocks as it is, once per test session."""
    return deployment(stack)


def tag_path(typ: str) -> str | None:
    """The input that carries a resource type's tags (labels on GCP), as its cloud's rules say;
    None: the type takes none."""
    entry = RESOURCE_RULES.get(typ)
    found = [r.path for r in entry.rules if isinstance(r, rules.Tags)] if entry else []
    return found[0] if found else None


def user_data_text(instance_inputs: dict[str, Any]) -> str:
    """The cloud-config an instance boots with, however it was delivered."""
    if instance_inputs.get("userDataBase64"):
        return gzip.decompress(base64.b64decode(instance_inputs["userDataBase64"])).decode()
    text: str = instance_inputs["userData"]
    return text


def custom_data_text(value: str) -> str:
    """An Azure VM's cloud-config from its base64 customData, gzipped when the plain text is
    over Azure's limit (cloud-init unpacks it)."""
    raw = base64.b64decode(value)
    return (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()


def env_of(user_data: str) -> dict[str, str]:
    files = yaml.safe_load(user_data)["write_files"]
    env_file = next(f for f in files if f["path"] == "/etc/llama-rpc/node.env")
    pairs = (line.split("=", 1) for line in env_file["content"].splitlines())
    return {k: v.strip("'") for k, v in pairs}


__all__ = [
    "Deployment",
    "RecordingMocks",
    "custom_data_text",
    "deploy",
    "deployed",
    "deployment",
    "env_of",
    "parsed_config",
    "program_settings",
    "refusal",
    "refused",
    "stack_names",
    "user_data_text",
]
