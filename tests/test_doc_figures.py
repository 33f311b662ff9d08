"""Every figure the README and docs/ quote that the code computes (prices, speeds, times to serve,
placements) is the code's figure today, from the product's own catalog: a price refresh or a
model change that moves one fails here, naming the page, the sentence and the figure it should
now say."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import re
import shlex
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from infra import catalog, models
from infra.boot import balancer
from infra.cli import lrc
from infra.core.units import duration
from infra.planner import local_load, search
from infra.planner.engines import LLAMA_8B_DRAFT
from infra.planner.report import first_token
from infra.stack.files import stack_config
from tests.conftest import REPO
from tests.pulumi_mocks import parsed_config


@pytest.fixture(autouse=True)
def product_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pages quote the product's catalog, not the tests' fixture prices."""
    monkeypatch.setenv(catalog.DIRECTORY_VARIABLE, str(catalog.PACKAGE_DIR))


def command(*args: str) -> tuple[int, str]:
    """``lrc ARGS`` run here: its exit code and what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = lrc.main(list(args))
    return code, out.getvalue()


@functools.cache
def plan(*args: str) -> dict[str, Any]:
    code, shown = command("plan", *args, "--json")
    assert code == 0, (args, shown)
    document: dict[str, Any] = json.loads(shown)
    return document


def option(document: dict[str, Any], provider: str, instance: str, nodes: int) -> dict[str, Any]:
    found = [
        o for o in document["options"]
        if (o["provider"], o["instanceType"], o["nodes"]) == (provider, instance, nodes)
    ]  # fmt: skip
    assert len(found) == 1, f"the planner has no {nodes} x {instance} on {provider}"
    return found[0]


PLAN_405B = ("llama-3.1-405b-q4_0",)
ARMS_GUIDE = ("llama-3.1-405b-q4_0", "--instance-type", "c8g.16xlarge", "--count", "3")


DRAFT = "llama.cpp layer split with a draft model"


def drafted(name: str) -> str:
    """A draft line's figure as the page quotes it: ``2.06 tok/s (draft 1``."""
    lines = plan(*ARMS_GUIDE, "--engines")["engines"]["aws"]
    line = next(line for line in lines if line["engine"] == name)
    return f"{line['predictedDecodeTps']:.2f} tok/s (draft {line['draftMax']}"


def engine(name: str) -> float:
    """One engine's predicted tok/s for Arm's three c8g.16xlarge (``plan --engines``)."""
    lines = plan(*ARMS_GUIDE, "--engines")["engines"]["aws"]
    return float(next(line for line in lines if line["engine"] == name)["predictedDecodeTps"])


def stack(name: str) -> dict[str, Any]:
    """The cluster a shipped stack deploys, priced as its ``hourlyCostUsd`` is."""
    return option(plan("--stack", name), *_only(plan("--stack", name)))


def _only(document: dict[str, Any]) -> tuple[str, str, int]:
    (found,) = document["options"]
    return found["provider"], found["instanceType"], found["nodes"]


def vcpus(name: str) -> str:
    """The vCPUs a shipped stack asks of its account's quota (the preflight's figure)."""
    needs = stack_config(name).needs(name)
    return str(sum(count * needs.vcpus[kind] for kind, count in needs.nodes.items()))


def layers(name: str) -> list[int]:
    return [int(share["layers"]) for share in stack(name)["placement"]]


def dollars(value: float) -> str:
    return f"${value:.2f}"


def costrun_dry_run() -> dict[str, str]:
    """Each stack's predicted cost of a cost run, as `lrc costrun run --dry-run` prints it."""
    code, shown = command(
        "costrun", "run", "--stack", "aws-c8g", "--stack", "gcp-c4a", "--stack", "azure-cobalt",
        "--dry-run",
    )  # fmt: skip
    assert code == 0, shown
    return dict(re.findall(r"^(\S+) .*this run (\S+)$", shown, re.M))


CLOUD_NAMES = {"aws": "AWS", "gcp": "GCP", "azure": "Azure"}
# A model shaped as Llama 3.1 405B (126 layers, its KV cache per token), of any size.
SHAPED_AS_405B = ("--layers", "126", "--kv-bytes-per-token", "516096")


def largest_vm(provider: str, region: str) -> str:
    """The cloud's Arm VM with the most memory in the region's catalog, as the README names it:
    ``x8g.48xlarge (3,072 GiB)``."""
    biggest = max(catalog.types_in(provider, region), key=lambda t: t.memory_gib)
    return f"{biggest.name} ({biggest.memory_gib:,.0f} GiB)"


def picked(document: dict[str, Any], provider: str) -> dict[str, Any]:
    found: dict[str, Any] = document["options"][document["picks"][provider]]
    return found


def priced(found: dict[str, Any]) -> str:
    """``$2.97/h, 503 $/Mtok``, each marked ``+`` where the price leaves a part out."""
    plus = "+" if found["pricePartial"] else ""
    return (
        f"{dollars(found['hourlyUsd'])}{plus}/h, {found['usdPerMillionTokens']:,.0f}{plus} $/Mtok"
    )


def nodes_of(found: dict[str, Any]) -> str:
    return f"{found['nodes']} x {found['instanceType']}"


def sized(name: str) -> str:
    return f"{name} ({models.PRESETS[name].size_gb:,.0f} GB)"


def one_vm_holds(name: str, provider: str) -> bool:
    """Whether some single VM of the cloud holds the preset: the planner's fewest nodes is one."""
    fewest: int = min(o["nodes"] for o in plan(name)["options"] if o["provider"] == provider)
    return fewest == 1


def what_one_vm_holds() -> list[list[str]]:
    """The README's opening table, cloud by cloud in its home region: its largest Arm VM, the
    largest preset one VM holds, each preset none holds with the planner's pick, and the pick for
    the 405B."""
    rows = []
    for provider, region in search.home_regions(["aws", "gcp", "azure"]):
        by_size = sorted(models.PRESETS, key=lambda name: models.PRESETS[name].size_bytes)
        alone = [name for name in by_size if one_vm_holds(name, provider)]
        pooled = [name for name in by_size if not one_vm_holds(name, provider)]
        rows.append([
            CLOUD_NAMES[provider],
            largest_vm(provider, region),
            sized(alone[-1]),
            "; ".join(f"{sized(name)}: {nodes_of(picked(plan(name), provider))}"
                      for name in pooled) or "none",
            f"{nodes_of(picked(plan(*PLAN_405B), provider))} "
            f"({priced(picked(plan(*PLAN_405B), provider))})",
        ])  # fmt: skip
    return rows


def pools_from(provider: str) -> str:
    """The smallest size, in steps of 50 GB, at which the cloud's pick for a model shaped as the
    405B pools several nodes; one node below it, down to the 405B's own size."""
    size = 250
    while not picked(plan("--size-gb", str(size), *SHAPED_AS_405B, "--cloud", provider),
                     provider)["rpcNeeded"]:  # fmt: skip
        size += 50
        assert size <= 3000, f"{provider}: one node up to 3 TB"
    return f"{size:,} GB on {CLOUD_NAMES[provider]}"


def reference_against_pick() -> str:
    reference, pick = stack("aws-c8g"), picked(plan(*PLAN_405B), "aws")
    times = reference["usdPerMillionTokens"] / pick["usdPerMillionTokens"]
    return (
        f"{reference['predictedDecodeTps']:.2f} tok/s and "
        f"{reference['usdPerMillionTokens']:,.0f} $/Mtok, {times:.1f} times"
    )


def arms_timeline(kind: str, path: str) -> dict[str, Any]:
    """A timeline of Arm's three c8g.16xlarge: ``timeToServe`` or ``timeToHeal`` on a path."""
    found: dict[str, Any] = option(plan(*ARMS_GUIDE), "aws", "c8g.16xlarge", 3)[kind][path]
    return found


def total(kind: str, path: str) -> str:
    return f"{arms_timeline(kind, path)['totalSeconds']} s"


def slowest(kind: str, path: str, prefix: str) -> dict[str, Any]:
    phases = [p for p in arms_timeline(kind, path)["phases"] if p["name"].startswith(prefix)]
    found: dict[str, Any] = max(phases, key=lambda p: p["seconds"])
    return found


def worker_local_serve() -> str:
    """``boot 90 s, the slices in 37 s at the disks' write of 2,000 MiB/s``."""
    fetch = slowest("timeToServe", "staged-local", "fetch")
    disk = re.search(r"its disk's write, (\d+) MiB/s", fetch["basis"])
    assert disk, fetch["basis"]
    boot = slowest("timeToServe", "staged-local", "boot")["seconds"]
    return (
        f"boot {boot} s, the slices in {fetch['seconds']} s at the disks' write of {int(disk[1]):,}"
    )


def worker_cache_read() -> str:
    """``76.7 GB of cache files, 25.6 GB of them from its disk at 1,637 MiB/s, and repacking
    them, 18 s``."""
    load = slowest("timeToServe", "staged-local", "load worker")
    read = re.search(
        r"^([\d.]+) GB.*?, ([\d.]+) GB from its disk .*? at (\d+) MiB/s", load["basis"]
    )
    assert read, load["basis"]
    return (
        f"{read[1]} GB of cache files, {read[2]} GB of them from its disk at {int(read[3]):,} "
        f"MiB/s, and repacking them, {load['seconds']} s"
    )


def goal(kind: str) -> str:
    """``within the 180 s goal by 35 s`` or ``over the 180 s goal by 12 s``."""
    found = option(plan(*ARMS_GUIDE), "aws", "c8g.16xlarge", 3)["serveGoals"][kind]
    side = "within" if found["met"] else "over"
    return f"{side} the {found['goalSeconds']} s goal by {abs(found['overSeconds'])} s"


def heal_bound() -> str:
    """The heal's binding phase is the slowest worker's reload: its seconds."""
    found = option(plan(*ARMS_GUIDE), "aws", "c8g.16xlarge", 3)["serveGoals"]["heal"]
    assert found["binding"].startswith("load worker"), "the page says a worker's reload binds"
    return f"{slowest('timeToHeal', 'worker-local', 'load worker')['seconds']} s"


NUMBER_WORDS = {2: "two", 3: "three", 4: "four"}


def _seconds(setting: str) -> float:
    """An HAProxy time as the balancer writes it (``1s``, ``250ms``), in seconds."""
    if setting.endswith("ms"):
        return int(setting.removesuffix("ms")) / 1000
    return int(setting.removesuffix("s"))


def seconds_to_fall() -> str:
    """From the last check a group passed to its being taken out: the next check, then the
    failures after it at the fast interval."""
    fall = _seconds(balancer.CHECK_INTERVAL) + _seconds(balancer.CHECK_FAST_INTERVAL) * (
        balancer.CHECKS_TO_FALL - 1
    )
    return f"{fall:g}"


@dataclass(frozen=True)
class Figure:
    page: str
    says: str  # the sentence, `{}` where the figure stands (line breaks and spaces as one)
    value: Callable[[], str]


def worker_local(what: str) -> str:
    """A figure of ``bench/results/worker_local.json``: bytes as MB (one decimal past 1),
    seconds as the median of each kill's."""
    found = json.loads((REPO / "bench/results/worker_local.json").read_text())
    runs = found["runs"]
    arm, kind = what.split(":")
    mine = [r for r in runs if r["arm"] == arm]
    if kind == "load":
        mean = sum(sum(r["worker_received_bytes"].values()) for r in mine) / len(mine)
        return f"{mean / 1e6:.2f}" if mean < 1e6 else f"{mean / 1e6:.0f}"
    if kind == "heal":
        heals = [h["worker_received_bytes"] for r in mine for h in r["heals"]]
        mean = sum(heals) / len(heals)
        return f"{mean / 1e6:.2f}" if mean < 1e6 else f"{mean / 1e6:.0f}"
    if kind == "ratio":
        return f"{found['summary']['received_ratio'] * 100:.2f}"
    number = int(kind.removeprefix("kill"))
    seconds = sorted(r["heals"][number]["seconds"] for r in runs)
    return f"{statistics.median(seconds):.1f}"


def worker_local_machines(what: str) -> str:
    """A figure of ``bench/results/worker_local_machines.json``: what the rebooted worker
    received, in MB, by arm; seconds as the median of each reboot's over every run."""
    found = json.loads((REPO / "bench/results/worker_local_machines.json").read_text())
    runs = found["runs"]
    arm, kind = what.split(":")
    if kind == "received":
        got = [h["worker_received_bytes"] for r in runs if r["arm"] == arm for h in r["reboots"]]
        mean = sum(got) / len(got)
        return f"{mean / 1e6:.2f}" if mean < 1e6 else f"{mean / 1e6:.0f}"
    number = int(kind.removeprefix("reboot"))
    return f"{statistics.median(r['reboots'][number]['seconds'] for r in runs):.1f}"


def worker_local_staged(what: str) -> str:
    """A figure of ``bench/results/worker_local_staged.json``: the main node's sent bytes by arm
    (mean MB), their ratio (%), and a node's reads of the part in the local arm (MB, count)."""
    found = json.loads((REPO / "bench/results/worker_local_staged.json").read_text())
    runs = found["runs"]
    kind, _, which = what.partition(":")
    if kind == "ratio":
        return f"{found['summary']['main_sent_ratio'] * 100:.2f}"
    if kind == "sent":
        got = [r["main_sent_bytes"] for r in runs if r["arm"] == which]
        mean = sum(got) / len(got)
        return f"{mean / 1e6:.2f}" if mean < 1e6 else f"{mean / 1e6:.0f}"
    arm = "sent" if kind == "whole" else "local"
    [reads] = {json.dumps(r["store_reads"][which]) for r in runs if r["arm"] == arm}
    read = json.loads(reads)  # the same in every run of the arm
    assert read["gets"] == read["ranged"]
    return f"{read['bytes'] / 1e6:.0f}" if kind in ("mb", "whole") else str(read["gets"])


FIGURES = [
    Figure("docs/planner.md", "`abort` ({} s: a request sent at once",
           lambda: f"{local_load.ABORT_SECONDS:g}"),
    Figure("docs/planner.md", "a small model ({} s from the kill to the group",
           lambda: f"{local_load.BACK_SECONDS:g}"),
    Figure("docs/loader.md", "interface sent {} MB while the group loaded, against",
           lambda: worker_local_staged("sent:local")),
    Figure("docs/loader.md", "loaded, against {} MB when it downloaded the whole model",
           lambda: worker_local_staged("sent:sent")),
    Figure("docs/loader.md", "sent the workers their weights ({} %). By the store's",
           lambda: worker_local_staged("ratio")),
    Figure("docs/loader.md", "16 MiB at most: the main node {} MB in",
           lambda: worker_local_staged("mb:main")),
    Figure("docs/loader.md", "the main node 208 MB in {} (the header",
           lambda: worker_local_staged("gets:main")),
    Figure("docs/loader.md", "the workers {} MB in 2 and", lambda: worker_local_staged("mb:w1")),
    Figure("docs/loader.md", "the workers 22 MB in {} and", lambda: worker_local_staged("gets:w1")),
    Figure("docs/loader.md", "MB in 2 and {} MB in 13 (the last",
           lambda: worker_local_staged("mb:w2")),
    Figure("docs/loader.md", "and 201 MB in {} (the last", lambda: worker_local_staged("gets:w2")),
    Figure("docs/loader.md", "the main node alone read the whole {} MB",
           lambda: worker_local_staged("whole:main")),
    Figure("docs/loader.md", "received {} MB while the group loaded again",
           lambda: worker_local_machines("local:received")),
    Figure("docs/loader.md", "loaded again, against {} MB with the weights sent; the group",
           lambda: worker_local_machines("sent:received")),
    Figure("docs/loader.md", "the group answered again in {} s either way",
           lambda: worker_local_machines("x:reboot0")),
    Figure("docs/loader.md", "and in {} s at the second reboot",
           lambda: worker_local_machines("x:reboot1")),
    Figure("docs/loader.md", "the workers received {} MB while the group loaded",
           lambda: worker_local("local:load")),
    Figure("docs/loader.md", "against {} MB with the weights sent",
           lambda: worker_local("sent:load")),
    Figure("docs/loader.md", "with the weights sent ({} %)", lambda: worker_local("x:ratio")),
    Figure("docs/loader.md", "RPC server, {} MB against", lambda: worker_local("local:heal")),
    Figure("docs/loader.md", "MB against {} MB. The group", lambda: worker_local("sent:heal")),
    Figure("docs/loader.md", "as fast either way ({} s, and", lambda: worker_local("x:kill0")),
    Figure("docs/loader.md", "s, and {} s at the second kill", lambda: worker_local("x:kill1")),
    Figure("docs/planner.md", "three c8g.16xlarge, staged: {} as above,",
           lambda: total("timeToServe", "staged")),
    Figure("docs/planner.md", "as above, {} with worker-local loading and a prebuilt binary (",
           lambda: total("timeToServe", "staged-local")),
    Figure("docs/planner.md", "binary ({} MiB/s, then the slowest load", worker_local_serve),
    Figure("docs/planner.md", "a worker reading its {}), within the 180", worker_cache_read),
    Figure("docs/planner.md", "), {}. After a lost worker",
           lambda: goal("serve")),
    Figure("docs/planner.md", "the group serves again in {} when the main node sends",
           lambda: total("timeToHeal", "main-sends")),
    Figure("docs/planner.md", "the weights again, in {} when each node reloads from",
           lambda: total("timeToHeal", "worker-local")),
    Figure("docs/planner.md", "reloads from its own disk, {}: the restart", lambda: goal("heal")),
    Figure("docs/planner.md", "then the slowest worker's reload ({}).", heal_bound),
    Figure("README.md", "$0.30/h, serving about {} after `pulumi up`",
           lambda: duration(stack("aws-small")["timeToServe"]["internet"]["totalSeconds"])),
    Figure("README.md", "and {} vCPUs of the account's Standard On-Demand",
           lambda: vcpus("aws-small")),
    Figure("README.md", "three c8g.16xlarge, serves the same model at {} the pick's cost per",
           reference_against_pick),
    Figure("README.md", "pick first pools nodes at about {}, past what their largest VM holds",
           lambda: f"{pools_from('gcp')}, {pools_from('azure')}"),
    Figure("README.md", "VM holds, and {}, where several smaller VMs cost less per token",
           lambda: pools_from("aws")),
    Figure("README.md", "up to 3 TB (the pick for kimi-k2-q8_0 there is {}).",
           lambda: nodes_of(picked(plan("kimi-k2-q8_0"), "aws"))),
    Figure("docs/planner.md", "The largest Arm VMs are {} on Azure; the largest open",
           lambda: "{} on Google Cloud and {}".format(
               *(largest_vm(*where) for where in search.home_regions(["gcp", "azure"])))),
    Figure("README.md", "Qwen2.5-1.5B-Instruct for about {}/h",
           lambda: dollars(stack("aws-small")["hourlyUsd"])),
    Figure("README.md", "(`aws-c8g`: {} stopped, for the NAT gateway and the disks)",
           lambda: "{}/h running, {}/h".format(dollars(stack("aws-c8g")["hourlyUsd"]),
                                               dollars(stack("aws-c8g")["stoppedHourlyUsd"]))),
    Figure("README.md", "every slot busy (`aws-c8g`: {};",
           lambda: f"{parsed_config('aws-c8g').generation_timeout_seconds:,} s"),
    Figure("README.md", "; `aws-r8g`: {}). The client's",
           lambda: f"{parsed_config('aws-r8g').generation_timeout_seconds:,} s"),
    Figure("docs/kubernetes.md", "aws-eks: {} plane (aws-c8g on VMs:",
           lambda: "{}/h, of which {} is the control".format(
               dollars(stack("aws-eks")["hourlyUsd"]),
               dollars(stack("aws-eks")["hourlyUsdParts"]["controlPlane"]))),
    Figure("docs/kubernetes.md", "(aws-c8g on VMs: {}/h)",
           lambda: dollars(stack("aws-c8g")["hourlyUsd"])),
    Figure("docs/planner.md", "three c8g.16xlarge ({}/h with NAT and disks)",
           lambda: dollars(option(plan(*ARMS_GUIDE), "aws", "c8g.16xlarge", 3)["hourlyUsd"])),
    Figure("docs/planner.md", "at the same predicted speed for {}/h",
           lambda: dollars(option(plan(*PLAN_405B), "aws", "c8g.16xlarge", 2)["hourlyUsd"])),
    Figure("docs/planner.md", "r8g.12xlarge (384 GiB) holds it alone for {}",
           lambda: "{}/h at {:.2f} tok/s".format(
               dollars(option(plan(*PLAN_405B), "aws", "r8g.12xlarge", 1)["hourlyUsd"]),
               option(plan(*PLAN_405B), "aws", "r8g.12xlarge", 1)["predictedDecodeTps"])),
    Figure("docs/planner.md", "one r8g.8xlarge costs less per hour ({}) but decodes at",
           lambda: dollars(option(plan(*PLAN_405B), "aws", "r8g.8xlarge", 1)["hourlyUsd"])),
    Figure("docs/planner.md", "but decodes at {} tok/s, on 32 of",
           lambda: "{:.2f}".format(
               option(plan(*PLAN_405B), "aws", "r8g.8xlarge", 1)["predictedDecodeTps"])),
    Figure("docs/planner.md", "c4a-highmem-32 is predicted at {} before its disks",
           lambda: "{:.2f} tok/s for {}/h".format(
               option(plan(*PLAN_405B), "gcp", "c4a-highmem-32", 1)["predictedDecodeTps"],
               dollars(option(plan(*PLAN_405B), "gcp", "c4a-highmem-32", 1)["hourlyUsd"]))),
    Figure("docs/planner.md", "(`aws-small`'s 125 MiB/s main disk: {}/h,",
           lambda: dollars(stack("aws-small")["hourlyUsd"])),
    Figure("docs/planner.md", "with the default 1000 MiB/s shows {}/h)",
           lambda: dollars(option(plan(
               "--size-gb", "1.12", "--layers", "28", "--kv-bytes-per-token", "28672",
               "--instance-type", "c8g.large", "--count", "3", "--cloud", "aws",
           ), "aws", "c8g.large", 3)["hourlyUsd"])),
    Figure("docs/azure.md", "`azure-cobalt` is priced at {}/h: the instances",
           lambda: dollars(stack("azure-cobalt")["hourlyUsd"])),
    Figure("docs/gcp.md", "c4a-standard-32 main node ({}/h: the instances",
           lambda: dollars(stack("gcp-c4a")["hourlyUsd"])),
    Figure("docs/aws.md", "the NAT gateway and its public address ({}/h)",
           lambda: dollars(stack("aws-c8g")["hourlyUsdParts"]["nat"])),
    Figure("docs/aws.md", "through the NAT gateway costs about {} for each serving group",
           lambda: f"${stack('aws-c8g')['downloadUsd']:.0f}"),
    Figure("docs/aws.md", "per-GB charge (the 405B model: {} at $0.045/GB)",
           lambda: dollars(option(plan(*PLAN_405B), "aws", "r8g.8xlarge", 1)["downloadUsd"])),
    Figure("docs/aws.md", "The planner puts the 405B on one r8g.8xlarge at {} to serve staged,",
           lambda: "{} minutes".format(round(option(plan(*PLAN_405B), "aws", "r8g.8xlarge", 1)
                                             ["timeToServe"]["staged"]["totalSeconds"] / 60))),
    Figure("docs/aws.md", "against {} from the internet at 2 Gbit/s",
           lambda: str(round(option(plan(*PLAN_405B), "aws", "r8g.8xlarge", 1)
                             ["timeToServe"]["internet"]["totalSeconds"] / 60))),
    Figure("docs/aws.md", "`aws-c8g` needs {} vCPUs of", lambda: vcpus("aws-c8g")),
    Figure("docs/azure.md", "(`azure-cobalt` needs {}, within", lambda: vcpus("azure-cobalt")),
    Figure("docs/placement.md", "aws-c8g's three c8g.16xlarge hold {} layers",
           lambda: " + ".join(map(str, layers("aws-c8g")))),
    Figure("docs/placement.md", "aws-r8g's smaller main node {} of 126",
           lambda: str(layers("aws-r8g")[0])),
    Figure("docs/planner.md", "reading its share of the weights in turn: {} tok/s for the 405B",
           lambda: f"{engine('llama.cpp layer split over RPC'):.2f}"),
    Figure("docs/planner.md", "a draft of k. At {} a token (the top is",
           lambda: "{:.0f}-{:.0f} %".format(*(100 * a for a in LLAMA_8B_DRAFT.per_token_range))),
    Figure("docs/planner.md", "workers three c8g.16xlarge are predicted at {}),",
           lambda: drafted(DRAFT + ", workers as upstream (GGML_RPC_REPACK=0)")),
    Figure("docs/planner.md", "with workers that repack (patch 0005) at {}).",
           lambda: drafted(DRAFT + ", workers repack (patch 0005)")),
    Figure("docs/planner.md", "activations twice a layer: {} tok/s, with an assumed",
           lambda: f"{engine('tensor parallel on 3 nodes'):.2f}"),
    Figure("docs/cost-runs.md", "The three stacks above are predicted at {} (Azure, slow to",
           lambda: "{} (AWS), {} (GCP) and {}".format(*(costrun_dry_run()[stack] for stack in (
               "aws-c8g", "gcp-c4a", "azure-cobalt")))),
    Figure("docs/replicas.md", "else after two failed checks (within {} s of its main node's port",
           seconds_to_fall),
    Figure("docs/replicas.md", "a main node that hangs takes the checks' {} s timeout each",
           lambda: balancer.CHECK_TIMEOUT.removesuffix("s")),
    Figure("docs/local.md", "two failed checks take a group out (within {} s of its main",
           seconds_to_fall),
    Figure("docs/replicas.md", "is sent again, to another group, up to {} times",
           lambda: NUMBER_WORDS[balancer.RETRIES]),
    Figure("docs/replicas.md", "is sent to up to {} more groups",
           lambda: NUMBER_WORDS[balancer.RETRIES]),
    Figure("docs/replicas.md", "reads each request whole before sending it ({} s to send it)",
           lambda: balancer.REQUEST_TIMEOUT.removesuffix("s")),
    Figure("docs/replicas.md", "one of up to {} bytes, headers and body (a 256 KiB buffer)",
           lambda: f"{balancer.RETRIED_REQUEST_BYTES:,}"),
    Figure("docs/replicas.md", "headers and body (a {} KiB buffer)",
           lambda: str(balancer.BUFFER_BYTES // 1024)),
    Figure("docs/local.md", "a request of up to {} bytes, headers and body, can be",
           lambda: f"{balancer.RETRIED_REQUEST_BYTES:,}"),
    Figure("docs/replicas.md", "HAProxy holds every group's slots and {} waiting requests",
           lambda: str(balancer.QUEUED_REQUESTS)),
]  # fmt: skip


def page_text(page: str) -> str:
    return " ".join((REPO / page).read_text().split())


@pytest.mark.parametrize("figure", FIGURES, ids=lambda f: f"{f.page}: {f.says[:40]}")
def test_a_quoted_figure_is_the_codes(figure: Figure) -> None:
    expected = figure.says.format(figure.value())
    assert expected in page_text(figure.page), f"{figure.page} should say: {expected}"


def _table(page: str, header: str) -> list[list[str]]:
    lines = (REPO / page).read_text().splitlines()
    start = lines.index(header) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


STACKS_TABLE = "| stack | nodes | model | $/h | of which instances |"


@pytest.mark.parametrize(("page", "cloud"), [("docs/aws.md", "aws")])
def test_the_stacks_table_gives_each_stacks_price(page: str, cloud: str) -> None:
    rows = _table(page, STACKS_TABLE)
    shipped = sorted(p.name.split(".")[1] for p in (REPO / "stacks").glob(f"Pulumi.{cloud}-*.yaml"))
    assert sorted(row[0].strip("`") for row in rows) == shipped
    for name, _nodes, _model, hourly, instances in rows:
        priced = stack(name.strip("`"))
        assert (hourly, instances) == (
            f"{priced['hourlyUsd']:.2f}",
            f"{priced['hourlyUsdParts']['instances']:.2f}",
        ), name


PLANNER_TABLE = (
    "| provider | instance type | nodes | layers | $/h | tok/s | first token (1,000-token prompt) "
    "| $/Mtok | to serve: internet / staged |"
)


TIMES = "\N{MULTIPLICATION SIGN}"


def _layers(cell: str) -> list[int]:
    """``15 + 16 TIMES 6 + 15`` (TIMES the multiplication sign) → 15, 16 six times, 15."""
    counts: list[int] = []
    for term in cell.split(" + "):
        count, _, times = term.partition(f" {TIMES} ")
        counts += [int(count)] * int(times or 1)
    return counts


def test_the_405b_table_is_the_planners() -> None:
    rows = _table("docs/planner.md", PLANNER_TABLE)
    assert len(rows) >= 8
    for provider_cell, instance_cell, nodes, layers, hourly, tps, first, per_mtok, serve in rows:
        provider, picked = provider_cell.removesuffix(" *"), provider_cell.endswith(" *")
        instance = instance_cell.split(" (")[0]
        document = plan(*ARMS_GUIDE) if "--count 3" in instance_cell else plan(*PLAN_405B)
        found = option(document, provider, instance, int(nodes))
        row = f"{provider} {instance} x {nodes}"
        if document is plan(*PLAN_405B):
            assert picked == (document["options"].index(found) == document["picks"][provider]), row
        assert _layers(layers) == [share["layers"] for share in found["placement"]], row
        partial = "+" if found["pricePartial"] else ""
        price = "unknown" if found["hourlyUsd"] is None else f"{found['hourlyUsd']:.2f}{partial}"
        assert hourly.split(" (")[0] == price, row
        speed = found["predictedDecodeTps"]
        assert tps.split(" (")[0] == ("n/a" if speed is None else f"{speed:.2f}"), row
        waited = found["predictedFirstTokenSeconds"]
        assert found["promptTokens"] in (None, 1000), row
        assert first == ("n/a" if waited is None else first_token(waited)), row
        cost = found["usdPerMillionTokens"]
        assert per_mtok == ("n/a" if cost is None else f"{cost:,.0f}{partial}"), row
        internet, staged = (
            duration(found["timeToServe"][way]["totalSeconds"]) for way in ("internet", "staged")
        )
        assert serve == f"{internet.removesuffix(' min')} / {staged}", row


WHAT_ONE_VM_HOLDS = (
    "| cloud | largest Arm VM | largest preset one VM holds (4,096 tokens) "
    "| presets no VM holds: the pick | Llama 3.1 405B Q4_0 (229 GB): the pick |"
)


def test_the_readme_opens_with_what_one_vm_holds_on_each_cloud() -> None:
    """The table the README leads with is the planner's today: a preset that grows past a VM,
    a new type in the catalog or a new pick for the 405B changes a cell here."""
    assert _table("README.md", WHAT_ONE_VM_HOLDS) == what_one_vm_holds()
    head = (REPO / "README.md").read_text().split("```", 1)[0]
    assert WHAT_ONE_VM_HOLDS in head, "the README leads with the table, before its commands"
    assert f"({plan(*PLAN_405B)['model']['sizeGb']:.0f} GB)" in WHAT_ONE_VM_HOLDS


def test_the_opening_table_names_a_cluster_only_where_no_vm_holds_the_model() -> None:
    """The claim the table makes: on GCP and Azure the largest mixtures of experts need several
    VMs, and every VM of AWS's largest holds them (x8g up to 3 TiB)."""
    rows = {row[0]: row for row in what_one_vm_holds()}
    assert rows["AWS"][3] == "none"
    for cloud in ("GCP", "Azure"):
        assert "kimi-k2-q8_0" in rows[cloud][3] and "deepseek-v3.1-q8_0" in rows[cloud][3]
        assert "kimi-k2-q8_0" not in rows[cloud][2]


FLAGSHIP_TABLE = (
    "| model | provider | instance type | nodes | layers | $/h | tok/s "
    "| first token (1,000-token prompt) | $/Mtok | to serve: internet / staged |"
)
FLAGSHIP_MODELS = ("kimi-k2-q8_0", "deepseek-v3.1-q8_0")


def test_the_plans_where_one_vm_is_not_enough_are_the_planners() -> None:
    """docs/planner.md's table of the largest mixtures of experts: each cloud's pick for each,
    its placement, price, speed, first token and time to serve as the planner gives them."""
    rows = _table("docs/planner.md", FLAGSHIP_TABLE)
    shown = [(row[0].strip("`"), row[1]) for row in rows]
    assert shown == [(m, p) for m in FLAGSHIP_MODELS for p in ("aws", "gcp", "azure")]
    for row in rows:
        model, provider = row[0].strip("`"), row[1]
        assert row[2:] == _plan_row(picked(plan(model), provider)), f"{model} on {provider}"


def _plan_row(found: dict[str, Any]) -> list[str]:
    """A row of the planner page's tables, from instance type to time to serve."""
    partial = "+" if found["pricePartial"] else ""
    speed, waited, cost = (
        found["predictedDecodeTps"], found["predictedFirstTokenSeconds"],
        found["usdPerMillionTokens"],
    )  # fmt: skip
    internet, staged = (
        duration(found["timeToServe"][way]["totalSeconds"]) for way in ("internet", "staged")
    )
    layers = [share["layers"] for share in found["placement"]]
    return [
        found["instanceType"],
        str(found["nodes"]),
        " + ".join(map(str, layers)),
        "unknown" if found["hourlyUsd"] is None else f"{found['hourlyUsd']:.2f}{partial}",
        "n/a" if speed is None else f"{speed:.2f}",
        "n/a" if waited is None else first_token(waited),
        "n/a" if cost is None else f"{cost:,.0f}{partial}",
        f"{internet.removesuffix(' min')} / {staged}",
    ]


def _normal(text: str) -> str:
    return " ".join(text.split())


def test_the_shown_planner_output_is_what_the_command_prints() -> None:
    """The example under "How one group serves several streams": each table line shown begins a
    line the command prints today (columns on the right left out), and the summary after the
    rows left out (…) is its text, cut where it shows …."""
    text = (REPO / "docs" / "planner.md").read_text()
    block = text.split("\n$ lrc plan ", 1)[1].split("\n```", 1)[0]
    asked, *shown = block.splitlines()
    code, printed = command("plan", *shlex.split(asked))
    assert code == 0
    lines = [_normal(line) for line in printed.splitlines()]
    cut = [line.strip() for line in shown].index("…")
    for line in shown[:cut]:
        assert any(p.startswith(_normal(line)) for p in lines), f"docs/planner.md: {line}"
    summary = _normal(" ".join(shown[cut + 1 :]))
    for piece in filter(None, (part.strip() for part in summary.split("…"))):
        assert piece in _normal(printed), f"docs/planner.md: {piece}"


# The regions the planner page says the shipped catalog has, cloud by cloud.
CATALOG_REGIONS = {
    "aws": ["us-east-1", "us-west-2", "eu-central-1", "ap-northeast-1"],
    "gcp": ["us-central1", "us-east4", "europe-west4", "asia-southeast1"],
    "azure": ["eastus", "westus2", "westeurope", "southeastasia"],
}


@pytest.mark.parametrize("cloud", sorted(CATALOG_REGIONS))
def test_the_405b_plan_answers_in_each_region_with_dated_prices_and_speeds(cloud: str) -> None:
    """Four regions per cloud (US east and west, Europe, Asia), without credentials: every row
    priced with a source and a date, and ranked by $/Mtok; x8g where AWS offers it."""
    page = (REPO / "docs" / "planner.md").read_text()
    regions = CATALOG_REGIONS[cloud]
    assert sorted({e.region for e in catalog.load() if e.provider == cloud}) == sorted(regions)
    for region in regions:
        assert region in page, region
        document = plan(*PLAN_405B, "--cloud", cloud, "--region", region)
        rows = document["options"]
        assert rows and {o["region"] for o in rows} == {region}
        for row in rows:
            entry = catalog.find(cloud, region, row["instanceType"])
            assert entry is not None and entry.hourly_usd and entry.price_date, row
            assert entry.price_source and row["predictedDecodeTps"], row
        ranked = [o["usdPerMillionTokens"] for o in rows if o["nodes"] and o["usdPerMillionTokens"]]
        assert ranked == sorted(ranked)
    x8g = {e.region for e in catalog.load() if e.name.startswith("x8g.")}
    assert x8g == ({"us-east-1", "us-west-2", "eu-central-1"} if cloud == "aws" else x8g)
    default = {o["region"] for o in plan(*PLAN_405B, "--cloud", cloud)["options"]}
    assert default == {regions[0]}  # the home region, unless told


def test_azure_prices_its_405b_rows_and_the_plan_ranks_them() -> None:
    rows = [o for o in plan(*PLAN_405B)["options"] if o["provider"] == "azure"]
    assert rows and all(o["hourlyUsd"] and o["usdPerMillionTokens"] for o in rows)
    assert all(o["pricePartial"] for o in rows)  # Premium SSD: per tier, not priced


@pytest.mark.parametrize("name", ["aws-c7g", "aws-c8g", "aws-eks", "aws-r8g", "aws-small",
                                  "azure-cobalt", "gcp-c4a"])  # fmt: skip
def test_a_shipped_stacks_header_quotes_its_price(name: str) -> None:
    """The comment that opens a stack file says its $/h as the planner prices the stack."""
    header = " ".join(
        line.removeprefix("#").strip()
        for line in (REPO / "stacks" / f"Pulumi.{name}.yaml").read_text().splitlines()
        if line.startswith("#")
    )
    (quoted,) = re.findall(r"About (\$[\d.]+)/h", header)
    assert quoted == dollars(stack(name)["hourlyUsd"]), f"stacks/Pulumi.{name}.yaml says {quoted}/h"
