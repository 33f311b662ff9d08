"""Run the Pulumi program for a stack preset under mocks, recording every resource and output."""

from __future__ import annotations

import base64
import gzip
import json
import re
from dataclasses import dataclass, field
from typing import Any

import pulumi
import yaml

from infra.stack.files import config_of, stack_values

ZONES = ["us-east-1a", "us-east-1b", "us-east-1c"]
GCP_ZONES = ["us-central1-c", "us-central1-a", "us-central1-b"]
DISKS = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks"
GCP_SELF_LINKS = "https://www.googleapis.com/compute/v1/projects/my-project/self"


# The stacks this repository ships, by name: the mock tiers sweep these, never whatever else lies
# in stacks/ (a user's own, or one `python -m infra.planner --write-stack` wrote).
REPOSITORY_STACKS = ("aws-c7g", "aws-c8g", "aws-r8g", "aws-small", "azure-cobalt", "gcp-c4a")


def stack_names() -> list[str]:
    return list(REPOSITORY_STACKS)


def stack_config(stack: str) -> dict[str, Any]:
    return stack_values(stack)


def parsed_config(stack: str, overrides: dict[str, Any] | None = None) -> Any:
    """The stack's validated ``ClusterConfig``, as the program reads it."""
    return config_of({**stack_values(stack), **(overrides or {})})


def program_settings(
    stack: str, overrides: dict[str, Any] | None = None
) -> tuple[dict[str, Any], str | None]:
    """A preset's settings, with overrides, as the program reads them: the project's keys
    without their namespace, each value as Pulumi hands it over (JSON text unless a string; a
    None override removes the key), and the region from the cloud's own key."""
    from infra.stack import config as cluster_config
    from infra.stack.settings import decode

    values = {**stack_config(stack), **(overrides or {})}
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
    assert error.key == key, f"the error is about {error.key!r}, not {key!r}: {error}"
    text = str(error)
    assert text.startswith(f"{key if ':' in key else f'llama-rpc-cluster:{key}'}: "), text
    return text


class RecordingMocks(pulumi.runtime.Mocks):
    def __init__(self, unavailable: dict[str, set[str]] | None = None) -> None:
        self.resources: list[pulumi.runtime.MockResourceArgs] = []
        self.calls: list[pulumi.runtime.MockCallArgs] = []
        # zone -> instance types it does not offer
        self.unavailable = unavailable or {}

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.resources.append(args)
        state = dict(args.inputs)
        state.setdefault("name", args.name)
        if args.typ == "azure-native:compute:VirtualMachine":
            # Azure names the OS disk and gives the VM an id of its own.
            disk = f"{DISKS}/{args.name}-os"
            profile = json.loads(json.dumps(state["storageProfile"]))
            profile["osDisk"].setdefault("managedDisk", {})["id"] = disk
            state |= {"storageProfile": profile, "vmId": f"{args.name}-vm-id"}
        if args.typ == "gcp:serviceaccount/account:Account":
            state["email"] = f"{args.inputs['accountId']}@my-project.iam.gserviceaccount.com"
        if args.typ.startswith("gcp:compute/"):
            # Compute resources name each other by URL (an instance in its group, a group as a
            # backend).
            state.setdefault("selfLink", f"{GCP_SELF_LINKS}/{args.name}")
        if args.typ == "azure-native:resources:ResourceGroup":
            state["id"] = f"/subscriptions/s/resourceGroups/{args.name}"
        if args.typ == "azure-native:network:LoadBalancer":
            # Its id as Azure makes it, under its group's (here "<group>-id"): its parts name
            # each other by id.
            group, name = args.inputs["resourceGroupName"], args.inputs["loadBalancerName"]
            return f"{group}-id/providers/Microsoft.Network/loadBalancers/{name}", state
        return f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        self.calls.append(args)
        if args.token == "aws:ssm/getParameter:getParameter":
            return {"name": args.args["name"], "type": "String", "value": "ami-0123456789abcdef0"}
        if args.token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
            wanted = args.args["filters"][0]["values"]
            rows = [
                (zone, t)
                for zone in ZONES
                for t in wanted
                if t not in self.unavailable.get(zone, set())
            ]
            return {
                "id": "us-east-1",
                "locations": [z for z, _ in rows],
                "instanceTypes": [t for _, t in rows],
                "locationTypes": ["availability-zone"] * len(rows),
            }
        if args.token == "gcp:organizations/getClientConfig:getClientConfig":
            return {"id": "c", "project": "my-project", "region": "", "zone": "", "accessToken": ""}
        if args.token == "gcp:compute/getZones:getZones":
            return {"id": args.args["region"], "names": GCP_ZONES, "project": "p"}
        if args.token == "gcp:compute/getMachineTypes:getMachineTypes":
            zone = args.args["zone"]
            names = re.findall(r'name = "([^"]+)"', args.args["filter"])
            offered = [n for n in names if n not in self.unavailable.get(zone, set())]
            return {
                "id": zone,
                "zone": zone,
                "project": "p",
                "filter": args.args["filter"],
                "machineTypes": [machine_type(n) for n in offered],
            }
        return {}


def machine_type(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "description": name,
        "guestCpus": 64,
        "memoryMb": 131072,
        "isSharedCpus": False,
        "maximumPersistentDisks": 128,
        "maximumPersistentDisksSizeGb": 262144,
        "selfLink": name,
        "accelerators": [],
        "bundledLocalSsds": [],
        "deprecateds": [],
    }


@dataclass
class Deployment:
    resources: list[pulumi.runtime.MockResourceArgs]
    outputs: dict[str, Any] = field(default_factory=dict)
    # Each resource's options by name (mocks do not see them: a stack transformation does).
    options: dict[str, pulumi.ResourceOptions] = field(default_factory=dict)

    def of_type(self, typ: str) -> list[pulumi.runtime.MockResourceArgs]:
        return [r for r in self.resources if r.typ == typ]

    def named(self, name: str) -> pulumi.runtime.MockResourceArgs:
        return next(r for r in self.resources if r.name == name)


def deploy(
    stack: str, overrides: dict[str, Any] | None = None, mocks: RecordingMocks | None = None
) -> Deployment:
    """Run the program for a stack preset (with config overrides) and resolve its outputs."""
    from infra.stack import program

    mocks = mocks or RecordingMocks()
    pulumi.runtime.set_mocks(mocks, project="llama-rpc-cluster", stack=stack, preview=False)
    config = {**stack_config(stack), **(overrides or {})}
    pulumi.runtime.set_all_config(
        {k: v if isinstance(v, str) else json.dumps(v) for k, v in config.items() if v is not None}
    )
    deployment = Deployment(mocks.resources)

    def record(
        args: pulumi.ResourceTransformationArgs,
    ) -> pulumi.ResourceTransformationResult | None:
        deployment.options[args.name] = args.opts
        return None

    @pulumi.runtime.test
    def run() -> pulumi.Output[Any]:
        pulumi.runtime.register_stack_transformation(record)
        cluster = program.run()
        everything = {**cluster.outputs, **cluster.details}
        return pulumi.Output.from_input(everything).apply(deployment.outputs.update)

    run()
    return deployment


_presets: dict[str, Deployment] = {}


def deployed(stack: str) -> Deployment:
    """A stack preset deployed under mocks as it is, once per test session."""
    if stack not in _presets:
        _presets[stack] = deploy(stack)
    return _presets[stack]


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
    "env_of",
    "parsed_config",
    "program_settings",
    "refusal",
    "refused",
    "stack_names",
    "user_data_text",
]
