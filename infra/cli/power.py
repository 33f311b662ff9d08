"""A deployed stack's nodes as their cloud runs them: start them (``lrc start``) and read
whether they run (``lrc status``), with the user's own credentials: EC2 through boto3, Compute
Engine and Azure through their CLIs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from infra.cli.deployed import gcp_project
from infra.core import outputs as keys
from infra.observe.channels import ChannelError, Runner, group_outputs, named_output, run_cli

# Seconds a start request may take; the nodes then boot on their own.
START_TIMEOUT_SECONDS = 300


class StartError(RuntimeError):
    """The cloud refused or failed to start the nodes; the message says why."""


def node_ids(found: Mapping[str, Any]) -> list[str]:
    """Every node of the stack, each group's workers before its main node (a main node that
    comes up first waits for them anyway)."""
    ids: list[str] = []
    for group in group_outputs(found):
        ids += [str(worker) for worker in group.get(keys.WORKER_INSTANCE_IDS) or []]
        ids.append(str(group[keys.MAIN_INSTANCE_ID]))
    return ids


def start_aws(ids: list[str], *, ec2: Any) -> list[str]:
    """EC2 StartInstances, once for every node; each node's state as EC2 then reports it."""
    try:
        answer = ec2.start_instances(InstanceIds=ids)
    except Exception as error:  # noqa: BLE001 (botocore's errors: said as they are)
        raise StartError(f"EC2 StartInstances: {error}") from None
    states = {i["InstanceId"]: i["CurrentState"]["Name"] for i in answer["StartingInstances"]}
    return [f"{node}: {states.get(node, 'not reported')}" for node in ids]


def start_gcp(
    found: Mapping[str, Any], ids: list[str], *, project: str, runner: Runner = run_cli
) -> list[str]:
    """``gcloud compute instances start``, every node at once (a TERMINATED VM starts; a running
    one is left as it is)."""
    zone = named_output(found, keys.ZONE, "--zone")
    if zone is None or not project:
        raise StartError(
            "a GCP stack needs its zone (the stack's `zone` output) and project "
            "(gcp:project or GOOGLE_CLOUD_PROJECT)"
        )
    argv = ["gcloud", "compute", "instances", "start", *ids, "--zone", zone, "--project", project]
    _run(argv, runner)
    return [f"{node}: starting" for node in ids]


def start_azure(found: Mapping[str, Any], ids: list[str], *, runner: Runner = run_cli) -> list[str]:
    """``az vm start`` for each node (a deallocated VM is allocated again and boots)."""
    group = named_output(found, keys.RESOURCE_GROUP, "--resource-group")
    if group is None:
        raise StartError("the stack names no resource group (its `resourceGroup` output)")
    for node in ids:
        _run(["az", "vm", "start", "--resource-group", group, "--name", node, "--no-wait"], runner)
    return [f"{node}: starting" for node in ids]


def _run(argv: list[str], runner: Runner) -> str:
    try:
        result = runner(argv, START_TIMEOUT_SECONDS)
    except (ChannelError, OSError) as error:
        raise StartError(f"{' '.join(argv[:4])}: {error}") from None
    if result.returncode != 0:
        raise StartError(f"{' '.join(argv[:4])}: {result.stderr.strip()[-500:]}")
    return str(result.stdout)


# Each cloud's words for a VM that is not running and costs no compute: EC2's instance state,
# Compute Engine's status, Azure's power state code.
STOPPED_STATES = frozenset(
    {"stopping", "stopped", "STOPPING", "TERMINATED", "PowerState/deallocating",
     "PowerState/deallocated", "PowerState/stopped"}
)  # fmt: skip


def power_state_aws(ids: list[str], *, ec2: Any) -> dict[str, str]:
    """EC2 DescribeInstances: each instance's state name."""
    try:
        answer = ec2.describe_instances(InstanceIds=ids)
    except Exception as error:  # noqa: BLE001 (botocore's errors: said as they are)
        raise StartError(f"EC2 DescribeInstances: {error}") from None
    return {
        instance["InstanceId"]: instance["State"]["Name"]
        for reservation in answer["Reservations"]
        for instance in reservation["Instances"]
    }


def power_state_gcp(
    found: Mapping[str, Any], ids: list[str], *, project: str, runner: Runner = run_cli
) -> dict[str, str]:
    """Each VM's Compute Engine status (RUNNING, STOPPING, TERMINATED, ...)."""
    zone = named_output(found, keys.ZONE, "--zone")
    if zone is None or not project:
        raise StartError("a GCP stack needs its zone output and project")
    return {
        node: _run(["gcloud", "compute", "instances", "describe", node, "--zone", zone,
                    "--project", project, "--format=value(status)"], runner).strip()
        for node in ids
    }  # fmt: skip


def power_state_azure(
    found: Mapping[str, Any], ids: list[str], *, runner: Runner = run_cli
) -> dict[str, str]:
    """Each VM's power state code (PowerState/running, PowerState/deallocated, ...)."""
    group = named_output(found, keys.RESOURCE_GROUP, "--resource-group")
    if group is None:
        raise StartError("the stack names no resource group (its `resourceGroup` output)")
    query = "instanceView.statuses[?starts_with(code, 'PowerState/')].code | [0]"
    return {
        node: _run(["az", "vm", "get-instance-view", "--resource-group", group, "--name", node,
                    "--query", query, "--output", "tsv"], runner).strip()
        for node in ids
    }  # fmt: skip


def power_states(stack: str, found: Mapping[str, Any], ids: list[str]) -> dict[str, str]:
    """Each node's state as its cloud reports it, with the user's credentials."""
    cloud = str(found.get(keys.CLOUD))
    readers: dict[str, Callable[[], dict[str, str]]] = {
        "aws": lambda: power_state_aws(ids, ec2=_ec2(str(found[keys.REGION]))),
        "gcp": lambda: power_state_gcp(found, ids, project=gcp_project(stack), runner=run_cli),
        "azure": lambda: power_state_azure(found, ids, runner=run_cli),
    }
    if cloud not in readers:
        raise StartError(f"no way to read node states on cloud {cloud!r}")
    return readers[cloud]()


def start(stack: str, found: Mapping[str, Any]) -> list[str]:
    """Start every node of a deployed stack with the user's credentials; a line per node."""
    cloud = str(found.get(keys.CLOUD))
    ids = node_ids(found)
    starters: dict[str, Callable[[], list[str]]] = {
        "aws": lambda: start_aws(ids, ec2=_ec2(str(found[keys.REGION]))),
        "gcp": lambda: start_gcp(found, ids, project=gcp_project(stack), runner=run_cli),
        "azure": lambda: start_azure(found, ids, runner=run_cli),
    }
    if cloud not in starters:
        raise StartError(f"no way to start nodes on cloud {cloud!r}")
    return starters[cloud]()


def _ec2(region: str) -> Any:
    import boto3  # noqa: PLC0415

    return boto3.client("ec2", region_name=region)
