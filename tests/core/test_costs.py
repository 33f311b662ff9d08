"""One cost function: the stack's hourlyCostUsd and the planner's figure for the same cluster are
the same number, and ``infra.core.costs`` prices what each cloud charges for, naming what it cannot
price instead of guessing."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra import catalog, planner
from infra.catalog import InstanceType
from infra.cli import plan as plan_command
from infra.core import costs, outputs, sizing
from infra.costrun.cloud import PulumiTarget
from tests.conftest import CATALOG_FIXTURE
from tests.pulumi_mocks import (
    deploy,
    deployed,
    parsed_config,
    stack_config,
    stack_names,
    vm_stack_names,
)

P = "llama-rpc-cluster:"
# Settings the planner never chooses: it prices a cluster with the default disks.
PLANNER_DEFAULTS = ("diskThroughputMibps", "mainDiskGb", "workerDiskGb")


def homogeneous(stack: str) -> dict[str, Any]:
    """Overrides that make a preset the cluster the planner evaluates: every node of the
    workers' type, with the default disks (None removes a setting)."""
    config = stack_config(stack)
    return {key: None for key in config if key.removeprefix(P) in PLANNER_DEFAULTS} | (
        {f"{P}mainInstanceType": None} if f"{P}mainInstanceType" in config else {}
    )


def unpriced_in(basis: str) -> set[str]:
    """The parts a cost basis names as having no catalog price."""
    match = re.fullmatch(r"unknown: no catalog price for (.*)", basis) or re.search(
        r"; without (.*?) \(no catalog price\)", basis
    )
    return set(match.group(1).split(", ")) if match else set()


@pytest.mark.parametrize("stack", stack_names())
def test_a_homogeneous_cluster_costs_what_the_planner_says(stack: str) -> None:
    overrides = homogeneous(stack)
    deployment = deploy(stack, overrides) if overrides else deployed(stack)
    config = parsed_config(stack, overrides)
    assert config.main_instance_type == config.instance_type
    option = planner.evaluate(
        config.model,
        config.instance_type,
        config.worker_count + 1,
        config.context_size,
        slots=config.slots,
        platform=config.platform,
    )
    assert option.fits
    out = deployment.outputs
    assert out[outputs.HOURLY_COST_USD] == option.cost.total
    assert unpriced_in(out[outputs.HOURLY_COST_BASIS]) == set(option.cost.unpriced)


def test_the_homogeneous_comparisons_include_unpriced_parts() -> None:
    """Otherwise the comparison of unpriced parts above would compare nothing."""
    named = set()
    for stack in stack_names():
        overrides = homogeneous(stack)
        config = parsed_config(stack, overrides)
        named |= set(config.hourly_cost.unpriced)
    assert any(part.endswith(" instances") for part in named)
    assert any(part.endswith(" disks") for part in named)


@pytest.mark.parametrize("stack", stack_names())
def test_the_stack_the_planner_and_the_cost_run_give_one_figure(
    stack: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """As shipped (mixed node types in aws-r8g and gcp-c4a, disk settings in aws-small): the
    stack's output, ``plan --stack`` and the cost run's prediction are one number, exactly, and
    leave out the same parts."""
    out = deployed(stack).outputs
    assert plan_command.main(["--stack", stack, "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)["options"][0]
    predicted = PulumiTarget(stack).predict()
    assert out[outputs.HOURLY_COST_USD] == planned["hourlyUsd"] == predicted.hourly_usd
    assert out[outputs.HOURLY_COST_BASIS] == predicted.note
    assert unpriced_in(predicted.note) == set(predicted.unpriced)


def test_one_figure_is_compared_where_every_part_has_a_price() -> None:
    """Otherwise the agreement above could be None == None everywhere."""
    totals = [deployed(stack).outputs[outputs.HOURLY_COST_USD] for stack in stack_names()]
    assert sum(total is not None for total in totals) >= 3


@pytest.mark.parametrize(
    "stack", [s for s in vm_stack_names() if stack_config(s)[f"{P}cloud"] == "aws"]
)
def test_an_aws_figure_prices_the_instances_and_volumes_created(stack: str) -> None:
    d = deployed(stack)
    instances = sorted(
        d.of_type("aws:ec2/instance:Instance"), key=lambda r: r.name != "llama-rpc-cluster-main"
    )
    # A main node's model volume, by the instance it is attached to.
    volumes = {r.name: r.inputs for r in d.of_type("aws:ebs/volume:Volume")}
    attached = {
        a.inputs["instanceId"].removesuffix("-id"): volumes[a.inputs["volumeId"][: -len("-id")]]
        for a in d.of_type("aws:ec2/volumeAttachment:VolumeAttachment")
    }
    assert set(attached) == {i.name for i in instances if i.name.endswith("-main")}
    nodes = []
    for instance in instances:
        root = instance.inputs["rootBlockDevice"]
        entry = catalog.find("aws", "us-east-1", instance.inputs["instanceType"])
        assert entry is not None
        model = attached.get(instance.name)
        if model is None:
            nodes.append(costs.PricedNode(entry, root["volumeSize"], root.get("throughput")))
        else:
            assert root.get("throughput") in (None, 125)  # the system disk at the baseline
            node = costs.PricedNode(entry, model["size"], model["throughput"], root["volumeSize"])
            nodes.append(node)
    assert d.outputs[outputs.HOURLY_COST_USD] == costs.hourly_cost("aws", nodes).total


# --- infra.core.costs against a price list of round numbers ---

AWS_PRICES = {
    "nat_gateway_hour": 0.05,
    "public_ip_hour": 0.01,
    "disk_gb_month": 0.1,
    "disk_mibps_month": 0.05,
    "disk_iops_month": 0.01,
}
GCP_PRICES = {"nat_vm_hour": 0.002, "public_ip_hour": 0.01, "disk_gb_month": 0.2}


@pytest.fixture
def price_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[[str, dict[str, float | None]], None]:
    """Makes the catalog's NAT and disk prices these (None: unknown) for one provider."""

    def use(provider: str, prices: dict[str, float | None]) -> None:
        for name in (catalog.INSTANCES_NAME, catalog.CPUS_NAME, catalog.DISKS_NAME):
            shutil.copy(CATALOG_FIXTURE / name, tmp_path / name)
        rows = ["provider,item,usd,unit,source,date"] + [
            f"{provider},{item},unknown,per unit,not found,"
            if usd is None
            else f"{provider},{item},{usd},per unit,test price,2026-02-01"
            for item, usd in prices.items()
        ]
        (tmp_path / catalog.SERVICES_NAME).write_text("\n".join(rows) + "\n")
        monkeypatch.setenv(catalog.DIRECTORY_VARIABLE, str(tmp_path))

    return use


def instance(
    name: str, hourly_usd: float | None, provider: str = "aws", region: str = "r"
) -> InstanceType:
    return InstanceType(
        provider,
        region,
        name,
        "arm64",
        "graviton4",
        8,
        64,
        10,
        hourly_usd,
        "test price",
        "2026-02-01",
    )


def gp3(gb: int, mibps: int | None = None) -> float:
    """A gp3 volume's monthly charge at AWS_PRICES, from the price list's terms."""
    throughput = max(125, mibps or 0)
    iops = max(3000, 4 * throughput)
    return (
        gb * AWS_PRICES["disk_gb_month"]
        + (throughput - 125) * AWS_PRICES["disk_mibps_month"]
        + (iops - 3000) * AWS_PRICES["disk_iops_month"]
    )


def test_a_cluster_costs_its_instances_one_nat_gateway_and_its_disks(price_list) -> None:
    price_list("aws", AWS_PRICES)
    nodes = costs.cluster_nodes(
        instance("big", 2.0), instance("small", 1.0), 2,
        main_disk_gb=300, worker_disk_gb=100, main_disk_throughput_mibps=1000,
    )  # fmt: skip
    cost = costs.hourly_cost("aws", nodes)
    assert cost.instances == 4.0
    assert cost.nat == 0.06  # one gateway and its address, whatever the node count
    # The main node's model volume, its system disk (the model has a volume of its own), the
    # workers' disks.
    main_disks = gp3(300, 1000) + gp3(sizing.WORKER_DISK_GB)
    assert cost.disks == round((main_disks + 2 * gp3(100)) / costs.HOURS_PER_MONTH, 5)
    assert cost.total == round(4.0 + 0.06 + cost.disks, 5)
    assert cost.unpriced == ()
    assert cost.instance_counts == (("big", 1, 2.0), ("small", 2, 1.0))
    assert "instances: test price, 2026-02-01" in cost.basis


def test_a_stopped_cluster_costs_its_disks_and_its_nat(price_list) -> None:
    """Every instance stopped: the disks and the NAT go on; AWS's gateway and its address are
    by the hour, whatever runs. (GCP's Cloud NAT charges per VM running: below.)"""
    price_list("aws", AWS_PRICES)
    nodes = costs.cluster_nodes(
        instance("big", 2.0),
        instance("small", 1.0),
        2,
        main_disk_gb=300,
        worker_disk_gb=100,
        main_disk_throughput_mibps=None,
    )
    cost = costs.hourly_cost("aws", nodes)
    assert cost.stopped == round(0.06 + (cost.disks or 0), 5)
    assert f"with every instance stopped ${cost.stopped}/h" in cost.basis


def test_a_stopped_gcp_cluster_pays_no_per_vm_nat_and_the_balancer_nodes_disk(price_list) -> None:
    price_list("gcp", GCP_PRICES)
    gcp = [costs.PricedNode(instance("c4a", 1.0, "gcp", "us-central1"), 100)] * 3
    running = costs.hourly_cost("gcp", gcp)
    assert running.nat == round(3 * 0.002 + 0.01, 5)
    assert running.stopped == round(0.01 + (running.disks or 0), 5)
    with_balancer = costs.hourly_cost("gcp", gcp, balancer=True)
    # The balancer node: the fixture's c4a-standard-1 and its system disk. It sends through the
    # NAT too while it runs; its spend guard stops it with the groups, and then its disk alone
    # goes on, and no per-VM NAT charge.
    disk = sizing.WORKER_DISK_GB * GCP_PRICES["disk_gb_month"] / costs.HOURS_PER_MONTH
    assert with_balancer.balancer == round(0.0449 + disk, 5)
    assert with_balancer.balancer_disk == round(disk, 5)
    assert with_balancer.nat == round(4 * 0.002 + 0.01, 5)
    assert with_balancer.disks == running.disks
    assert with_balancer.stopped == round(0.01 + (running.disks or 0) + disk, 5)
    assert with_balancer.stopped < running.stopped + with_balancer.balancer
    assert any(s.startswith("balancer node: test fixture") for s in with_balancer.sources)


def test_a_stopped_cluster_with_no_priced_part_has_no_figure(price_list) -> None:
    price_list("aws", dict.fromkeys(AWS_PRICES))
    assert costs.hourly_cost("aws", [costs.PricedNode(instance("m", 1.0), 100)]).stopped is None


def test_an_unknown_instance_price_leaves_no_total_and_names_the_type(price_list) -> None:
    price_list("aws", AWS_PRICES)
    nodes = [
        costs.PricedNode(instance("known", 1.0), 50),
        costs.PricedNode(instance("new", None), 50),
    ]
    cost = costs.hourly_cost("aws", nodes)
    assert cost.instances is None and cost.total is None
    assert cost.unpriced == ("new instances",)
    assert cost.basis == "unknown: no catalog price for new instances"
    assert cost.nat is not None and cost.disks is not None  # what is known is still priced


@pytest.mark.parametrize("missing", ["nat_gateway_hour", "public_ip_hour"])
def test_an_unknown_nat_price_is_named_and_left_out_of_the_total(price_list, missing) -> None:
    price_list("aws", {**AWS_PRICES, missing: None})
    cost = costs.hourly_cost("aws", [costs.PricedNode(instance("m", 1.0), 100)])
    assert cost.nat is None
    assert cost.unpriced == ("NAT gateway",)
    assert cost.total == round(1.0 + (cost.disks or 0), 5)
    assert "without NAT gateway (no catalog price)" in cost.basis


def test_a_price_missing_from_the_list_is_unknown_too(price_list) -> None:
    price_list("aws", {k: v for k, v in AWS_PRICES.items() if k != "disk_gb_month"})
    cost = costs.hourly_cost("aws", [costs.PricedNode(instance("m", 1.0), 100)])
    assert cost.disks is None
    assert cost.unpriced == ("gp3 disks",)
    assert cost.total == round(1.0 + (cost.nat or 0), 5)


def test_an_unknown_disk_price_is_named_and_left_out_of_the_total(price_list) -> None:
    price_list("aws", {**AWS_PRICES, "disk_iops_month": None})
    baseline = costs.hourly_cost("aws", [costs.PricedNode(instance("m", 1.0), 100)])
    assert baseline.unpriced == ()  # no IOPS above the included 3000: its price is not needed
    fast = costs.hourly_cost("aws", [costs.PricedNode(instance("m", 1.0), 100, 1000)])
    assert fast.disks is None
    assert fast.unpriced == ("gp3 disks",)
    assert fast.total == round(1.0 + (fast.nat or 0), 5)


@pytest.mark.parametrize(
    ("mibps", "extra_mibps", "extra_iops"),
    [
        (None, 0, 0),  # the baseline: 125 MiB/s and 3000 IOPS are in the size price
        (125, 0, 0),
        (500, 375, 0),  # 500 MiB/s needs 2000 IOPS: the included 3000 cover it
        (750, 625, 0),  # 3000 IOPS exactly
        (751, 626, 4),  # 4 IOPS per MiB/s beyond that
        (1000, 875, 1000),
    ],
)
def test_gp3_charges_throughput_above_125_and_iops_above_3000_at_4_per_mibps(
    price_list, mibps: int | None, extra_mibps: int, extra_iops: int
) -> None:
    price_list("aws", AWS_PRICES)
    cost = costs.hourly_cost("aws", [costs.PricedNode(instance("m", 1.0), 200, mibps)])
    monthly = (
        200 * AWS_PRICES["disk_gb_month"]
        + extra_mibps * AWS_PRICES["disk_mibps_month"]
        + extra_iops * AWS_PRICES["disk_iops_month"]
    )
    assert cost.disks == round(monthly / costs.HOURS_PER_MONTH, 5)


@pytest.mark.parametrize(
    ("vms", "charged"), [(1, 1), (3, 3), (16, 16), (32, 32), (33, 32), (40, 32)]
)
def test_gcp_cloud_nat_is_charged_per_vm_up_to_32(price_list, vms: int, charged: int) -> None:
    price_list("gcp", GCP_PRICES)
    nodes = [costs.PricedNode(instance("c4a", 1.0, provider="gcp"), 10)] * vms
    cost = costs.hourly_cost("gcp", nodes)
    assert cost.nat == round(charged * GCP_PRICES["nat_vm_hour"] + GCP_PRICES["public_ip_hour"], 5)
