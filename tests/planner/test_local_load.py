"""Worker-local loading's time to serve and the time to heal after a lost worker: the phases as
the design runs them, each bound by the limit its basis names, beside the path where the main
node sends every weight. Nodes and models are this file's own, not the catalog's."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from statistics import median

import pytest

from infra.catalog import InstanceType
from infra.cli.plan import main as plan_main
from infra.core import placement, sizing
from infra.models import custom
from infra.planner import local_load, search, serve
from infra.planner.local_load import Disk, Group
from infra.planner.serve import GB, MIB, Phase, ServeTime
from tests.conftest import REPO

# A node shaped as a 64-vCPU Graviton4 with 128 GiB and 30 Gbit/s (memory bandwidth from the
# fixture catalog's CPU family).
NODE = InstanceType(
    provider="aws",
    region="us-east-1",
    name="fixture.16xlarge",
    arch="arm64",
    cpu_family="graviton4",
    vcpus=64,
    memory_gib=128,
    network_gbps=30,
    hourly_usd=1.0,
    price_source="test fixture",
    price_date="2026-01-01",
)
# A dense model of 210 GB and 120 layers: about 70 GB a node on three, more than half a node's
# memory, so no node's memory holds its slice beside its loaded copy.
MODEL = custom(210, 120, 500_000)
DISK_MIBPS = 2000.0


def layout_of(node: InstanceType, nodes: int) -> placement.Placement:
    return placement.place(MODEL, 4096, 1, [sizing.usable_memory_bytes(node)] * nodes)


def phases(timeline: ServeTime) -> dict[str, Phase]:
    return {p.name: p for p in timeline.phases}


def test_each_node_fetches_its_own_slice_then_loads_it_from_its_own_disk() -> None:
    """Every node boots, fetches the binary and its slice at once; every load starts when the
    last slice is in. Each fetch runs at its disk's write (the page cache takes it only up to
    the dirty limit). Each load reads from the page cache what memory holds beside the loaded
    copy and the rest from the disk: the main node by page faults beside its repack, each
    worker its cache files on one thread, then repacks them. The total is boot, the slowest
    fetch, the slowest load."""
    layout = layout_of(NODE, 3)
    timeline = local_load.time_to_serve(MODEL, NODE, NODE, layout, DISK_MIBPS)
    found = phases(timeline)
    assert list(found) == ["boot", "binary", "fetch main", "fetch worker 1", "fetch worker 2",
                           "load main", "load worker 1", "load worker 2"]  # fmt: skip
    boot = found["boot"]
    fetches = [found[n] for n in ("fetch main", "fetch worker 1", "fetch worker 2")]
    assert all(p.start == boot.end for p in [found["binary"], *fetches])
    loads = [found[n] for n in ("load main", "load worker 1", "load worker 2")]
    assert {p.start for p in loads} == {max(p.end for p in fetches)}
    usable = sizing.usable_memory_bytes(NODE)
    for share, fetch in zip(layout.shares, fetches, strict=True):
        assert fetch.seconds == pytest.approx(share.weight_bytes / (DISK_MIBPS * MIB))
        assert fetch.basis.split(" GB at ", 1)[1].startswith("its disk's write")
        assert local_load.disk_bytes(share, NODE) == share.weight_bytes + share.bytes - usable > 0
    repack, _ = serve.repack_rate(NODE)
    read = DISK_MIBPS * MIB * local_load.READ_SHARE[serve.DEFAULT_READ_AHEAD_KB]
    cached = serve.POPULATE_GBPS * GB
    for index in (1, 2):
        share = layout.shares[index]
        disk = local_load.disk_bytes(share, NODE)
        assert found[f"load worker {index}"].seconds == pytest.approx(
            (share.weight_bytes - disk) / cached + disk / read + share.weight_bytes / repack
        )
        assert "8-byte keys, no weights" in found[f"load worker {index}"].basis
    main = layout.shares[0]
    disk = local_load.disk_bytes(main, NODE)
    paged = serve.demand_paged_mibps(NODE, DISK_MIBPS)[0] * MIB
    assert found["load main"].seconds == pytest.approx(
        max((main.weight_bytes - disk) / cached + disk / paged, main.weight_bytes / repack)
    )
    assert timeline.total_seconds == pytest.approx(
        boot.seconds + max(p.seconds for p in fetches) + max(p.seconds for p in loads)
    )


def test_a_fetch_is_bound_by_the_least_of_the_network_the_store_and_the_disk() -> None:
    """A 10 Gbit/s node is bound by its network, one with a fast disk and network by its 64
    ranged reads at the store's rate per connection; the basis names the limit first."""
    layout = layout_of(NODE, 3)
    slow = dataclasses.replace(NODE, network_gbps=10)
    fetch = phases(local_load.time_to_serve(MODEL, slow, slow, layout, DISK_MIBPS))[
        "fetch worker 1"
    ]
    assert fetch.seconds == pytest.approx(layout.shares[1].weight_bytes / (10 * GB / 8))
    assert fetch.basis.split(" GB at ", 1)[1].startswith("the node's network")
    fast = dataclasses.replace(NODE, network_gbps=100)
    fetch = phases(local_load.time_to_serve(MODEL, fast, fast, layout, 8000))["fetch worker 1"]
    streams = local_load.SLICE_STREAMS * serve.STORE_STREAM_MBPS * 1e6
    assert fetch.seconds == pytest.approx(layout.shares[1].weight_bytes / streams)
    assert f"{local_load.SLICE_STREAMS} ranged reads" in fetch.basis.split("(beside")[0]


def test_a_slice_memory_holds_beside_its_copy_loads_from_the_page_cache() -> None:
    """With memory for the slice beside its loaded copy, the load reads no byte from the disk,
    however slow; the fetch still writes it at the disk's pace."""
    big = dataclasses.replace(NODE, memory_gib=512)
    layout = layout_of(big, 3)
    assert all(local_load.disk_bytes(share, big) == 0 for share in layout.shares)
    found = phases(local_load.time_to_serve(MODEL, big, big, layout, 125))
    weights = layout.shares[1].weight_bytes
    assert found["fetch worker 1"].seconds == pytest.approx(weights / (125 * MIB))
    repack, _ = serve.repack_rate(big)
    assert found["load worker 1"].seconds == pytest.approx(
        weights / (serve.POPULATE_GBPS * GB) + weights / repack
    )


def test_one_node_serves_as_staged_with_the_binary_in_the_builds_place() -> None:
    """One node has no slice to take: the staged timeline, the binary instead of the build,
    the load as soon as the check is done."""
    small = custom(60, 40, 100_000)
    layout = placement.place(small, 4096, 1, [sizing.usable_memory_bytes(NODE)])
    staged = serve.time_to_serve(small, NODE, layout, DISK_MIBPS, path="staged")
    local = local_load.time_to_serve(small, NODE, NODE, layout, DISK_MIBPS)
    assert [p.name for p in local.phases] == [
        "binary" if p.name == "build" else p.name for p in staged.phases
    ]
    old, new = phases(staged), phases(local)
    assert new["download"] == old["download"] and new["verify"] == old["verify"]
    first = next(p for p in local.phases if p.name.startswith("load"))
    assert first.start == pytest.approx(max(new["binary"].end, new["verify"].end))
    assert old["build"].end > old["verify"].end  # the build bound it
    assert local.total_seconds < staged.total_seconds


def test_a_cache_read_is_the_measured_share_of_the_disk_within_its_iops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One thread's read() at the kernel's read-ahead runs at the measured share of the disk's
    rate; where the disk's IOPS of the largest I/O it counts as one cannot carry that, the IOPS
    bound it (gp3: 4 IOPS per MiB/s as the stack provisions them)."""
    disk = Disk(2000, serve.DEFAULT_READ_AHEAD_KB)
    rate, basis = local_load.cache_read_rate(NODE, disk)
    assert rate == pytest.approx(2000 * MIB * local_load.READ_SHARE[128])
    assert "read() on one thread" in basis
    monkeypatch.setitem(serve.IOPS_IO_KIB, "gp3", 64)
    rate, basis = local_load.cache_read_rate(NODE, disk)
    assert rate == pytest.approx(8000 * 64 * 1024)
    assert "8000 IOPS of 64 KiB" in basis


def test_read_shares_are_the_read_ahead_benchmarks() -> None:
    """READ_SHARE is bench/readahead.py's read() medians against its reference."""
    arms = json.loads((REPO / "bench/results/readahead.json").read_text())["arms"]
    reference = arms["read@16384"]["median"]
    for kib, share in local_load.READ_SHARE.items():
        assert share == pytest.approx(arms[f"read@{kib}"]["median"] / reference)


def test_a_heal_restarts_then_reloads_and_worker_local_sends_no_weights() -> None:
    """Both heals wait the measured restart (abort, RestartSec, start); the main-sends heal then
    loads as the patched loader does at boot; the worker-local one as worker-local loading
    loads at boot, with no fetch: shorter."""
    layout = layout_of(NODE, 3)
    group = Group(MODEL, NODE, NODE, layout, DISK_MIBPS)
    sends = local_load.time_to_heal(group, "main-sends")
    local = local_load.time_to_heal(group, "worker-local")
    for heal in (sends, local):
        assert [p.name for p in heal.phases[:3]] == ["abort", "restart", "start"]
        assert heal.phases[2].end == pytest.approx(local_load.BACK_SECONDS)
        assert heal.phases[1].seconds == local_load.RESTART_SECONDS
    restarted = local_load.BACK_SECONDS
    boot_loads = serve.patched_load(MODEL, NODE, layout, DISK_MIBPS, restarted)
    assert list(sends.phases[3:]) == boot_loads
    served = local_load.time_to_serve(MODEL, NODE, NODE, layout, DISK_MIBPS)
    for phase in local.phases[3:]:
        assert phase.seconds == pytest.approx(phases(served)[phase.name].seconds)
        assert phase.start == pytest.approx(restarted)
    assert not any(p.name.startswith("fetch") for p in local.phases)
    assert local.total_seconds < sends.total_seconds
    with pytest.raises(ValueError, match="path must be one of"):
        local_load.time_to_heal(group, "rebuild")


def test_the_heal_figures_are_the_benchmarks() -> None:
    """ABORT_SECONDS and BACK_SECONDS are bench/worker_local.py --machines's medians over every
    run's first kill (both arms: the restart is the same), and systemd started the main node's
    server again no sooner than RestartSec after it exited."""
    runs = json.loads((REPO / "bench/results/worker_local_machines.json").read_text())["runs"]
    first = [run["heals"][0] for run in runs]
    assert round(median(h["abort_seconds"] for h in first), 1) == local_load.ABORT_SECONDS
    assert round(median(h["seconds"] for h in first), 1) == local_load.BACK_SECONDS
    for heal in first:
        assert heal["restart_seconds"] - heal["abort_seconds"] >= local_load.RESTART_SECONDS
        assert heal["restart_seconds"] < heal["seconds"]


def test_the_restart_figures_are_the_units() -> None:
    """RESTART_SECONDS is what both units wait before a restart, RESTART_MAX_SECONDS the most
    they wait after many (bench/results/worker_local_machines.json: with a 5 min cap, a boot's
    fourth lost worker kept its group away a minute)."""
    for unit in ("llama-server.service", "llama-rpc-worker.service"):
        text = (REPO / "cloud-init/systemd" / unit).read_text()
        assert f"RestartSec={local_load.RESTART_SECONDS:g}\n" in text
        assert f"RestartMaxDelaySec={local_load.RESTART_MAX_SECONDS:g}s\n" in text


def test_one_node_has_no_worker_to_lose() -> None:
    small = custom(20, 40, 100_000)
    option = search.evaluate(small, NODE, 1, 4096)
    assert option.heal == {}
    assert local_load.PATH in option.serve
    with pytest.raises(ValueError, match="no worker to lose"):
        local_load.time_to_heal(Group(small, NODE, NODE, option.placement, 1000), "worker-local")


def test_an_option_works_out_each_timeline_once_and_only_when_read(monkeypatch) -> None:
    """A search weighs every candidate cluster; only the ones shown need their timelines."""
    made: list[str] = []

    def heal(group: Group, path: str) -> ServeTime:
        made.append(path)
        return ServeTime(path, (Phase("restart", 0.0, 1.0, "basis"),))

    monkeypatch.setattr(local_load, "time_to_heal", heal)
    option = search.evaluate(MODEL, NODE, 3, 4096)
    assert made == []
    first = option.heal["worker-local"]
    assert option.heal["worker-local"] is first and made == ["worker-local"]
    assert sorted(option.heal) == sorted(local_load.HEAL_PATHS)
    assert made == ["worker-local"]


def timeline(*spans: tuple[str, float, float]) -> ServeTime:
    return ServeTime(
        "test", tuple(Phase(name, start, seconds, "b") for name, start, seconds in spans)
    )


def test_a_verdict_names_the_critical_path_the_binding_phase_and_the_margin() -> None:
    late = timeline(
        ("boot", 0, 90),
        ("binary", 90, 1),
        ("fetch main", 90, 40),
        ("fetch worker 1", 90, 50),
        ("load main", 140, 30),
        ("load worker 1", 140, 60),
    )
    found = local_load.verdict(late, 180)
    assert [p.name for p in found.path] == ["boot", "fetch worker 1", "load worker 1"]
    assert not found.met and found.over_seconds == pytest.approx(20)
    assert found.binding.name == "boot"
    assert "misses the 180 s goal by 20 s; binds: boot (90 s)" in found.line()
    early = local_load.verdict(late, 250)
    assert early.met and "within the 250 s goal by 50 s" in early.line()
    assert early.to_json()["criticalPath"] == ["boot", "fetch worker 1", "load worker 1"]


def run_plan(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = plan_main(list(args))
    return code, out.getvalue()


# The model above on three of the fixture catalog's c8g.16xlarge.
CLUSTER = ("--size-gb", "210", "--layers", "120", "--kv-bytes-per-token", "500000",
           "--instance-type", "c8g.16xlarge", "--count", "3")  # fmt: skip


def test_plan_of_one_cluster_prints_both_serve_paths_and_both_heals_phase_by_phase() -> None:
    code, shown = run_plan(*CLUSTER)
    assert code == 0, shown
    section = shown[shown.index("time to serve, staged, phase by phase") :]
    for title in [*local_load_titles()]:
        assert title in section
    for name in ("build", "download", "binary", "fetch worker 2", "abort", "restart"):
        assert f"      {name} " in section
    assert section.count("goal by") == 4
    code, shown = run_plan(*CLUSTER, "--json")
    found = json.loads(shown)["options"][0]
    assert set(found["timeToHeal"]) == set(local_load.HEAL_PATHS)
    assert local_load.PATH in found["timeToServe"]
    goals = found["serveGoals"]
    assert goals["serve"]["goalSeconds"] == local_load.SERVE_GOAL_SECONDS
    assert goals["heal"]["met"] == (
        found["timeToHeal"]["worker-local"]["totalSeconds"] <= local_load.HEAL_GOAL_SECONDS
    )


def local_load_titles() -> list[str]:
    from infra.planner import timelines

    return [*timelines.SERVE_TITLES.values(), *timelines.HEAL_TITLES.values()]


def test_a_search_shows_no_timelines() -> None:
    code, shown = run_plan("--size-gb", "210", "--layers", "120", "--kv-bytes-per-token", "500000")
    assert code == 0
    assert "phase by phase" not in shown
