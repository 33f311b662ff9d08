"""infra.observe.metrics: the exposition parser, and the figures derived from two snapshots, on text
recorded from the real exporters (tests/fixtures/metrics/README.md says how)."""

from __future__ import annotations

import io
import json
import math
import subprocess
from pathlib import Path
from typing import Any

import pytest

from infra.core import outputs
from infra.local import top
from infra.local.options import LocalClusterError
from infra.local.spec import ClusterSpec, LocalNode, api_key_header
from infra.observe import metrics, topview
from infra.observe.metrics import MetricsError, Snapshot
from tests.conftest import LRC, REPO, generating

FIXTURES = REPO / "tests" / "fixtures" / "metrics"
# The recorded scrapes were about this far apart.
INTERVAL = 2.5


def snapshot(name: str, taken_at: float) -> Snapshot:
    return Snapshot.parse((FIXTURES / name).read_text(), taken_at)


@pytest.fixture
def node() -> tuple[Snapshot, Snapshot]:
    return snapshot("node-exporter-1.prom", 100.0), snapshot("node-exporter-2.prom", 100 + INTERVAL)


@pytest.fixture
def server() -> tuple[Snapshot, Snapshot]:
    return snapshot("llama-server-1.prom", 10.0), snapshot("llama-server-2.prom", 10 + INTERVAL)


def slots(n: int) -> list[dict]:
    loaded: list[dict] = json.loads((FIXTURES / f"llama-server-slots-{n}.json").read_text())
    return loaded


# --- the parser ---


def test_parses_names_labels_and_values_and_skips_comments() -> None:
    text = (
        "# HELP node_load1 1m load average.\n"
        "# TYPE node_load1 gauge\n"
        "node_load1 0.52\n"
        'node_filesystem_avail_bytes{device="/dev/vda",fstype="ext4",mountpoint="/"} 7.28e+10\n'
        "llamacpp:tokens_predicted_total 24\n"
        "\n"
        'http_requests_total{method="post",code="200"} 1027 1395066363000\n'
    )
    samples = metrics.parse_exposition(text)
    assert [(s.name, dict(s.labels), s.value) for s in samples] == [
        ("node_load1", {}, 0.52),
        (
            "node_filesystem_avail_bytes",
            {"device": "/dev/vda", "fstype": "ext4", "mountpoint": "/"},
            7.28e10,
        ),
        ("llamacpp:tokens_predicted_total", {}, 24.0),
        ("http_requests_total", {"method": "post", "code": "200"}, 1027.0),
    ]


def test_label_values_keep_escapes_commas_braces_and_spaces() -> None:
    text = (
        'msdos_file_access_time_seconds{path="C:\\\\DIR\\\\FILE.TXT",error="Cannot find file:\\n'
        '\\"FILE.TXT\\""} 1.458255915e9\n'
        'odd{a="x,y}z", b="with space",} -Inf\n'
        "weird NaN\n"
        "up +Inf\n"
    )
    first, odd, weird, up = metrics.parse_exposition(text)
    assert first.labels == {"path": "C:\\DIR\\FILE.TXT", "error": 'Cannot find file:\n"FILE.TXT"'}
    assert first.value == 1.458255915e9
    assert odd.labels == {"a": "x,y}z", "b": "with space"} and odd.value == -math.inf
    assert math.isnan(weird.value) and up.value == math.inf


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("node_load1", "expected a value"),
        ("node_load1 one", "'one' is not a number"),
        ('node_cpu{cpu="0" 1', "malformed label"),
        ('node_cpu{cpu="0} 1', "unterminated label value"),
        ("{cpu=0} 1", "no metric name"),
        ("node_load1 1 2 3", "expected a value"),
    ],
)
def test_malformed_lines_are_refused_with_their_line_number(line: str, words: str) -> None:
    with pytest.raises(MetricsError, match=words) as refused:
        metrics.parse_exposition(f"# TYPE node_load1 gauge\nnode_load1 1\n{line}\n")
    assert str(refused.value).startswith("line 3: ")


def test_every_recorded_line_parses(node, server) -> None:
    for name in ("node-exporter-1.prom", "llama-server-1.prom"):
        text = (FIXTURES / name).read_text()
        sample_lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
        assert len(metrics.parse_exposition(text)) == len(sample_lines)
    before, _ = node
    assert before.value("node_cpu_seconds_total", cpu="0", mode="user") == 5199.79
    # value() sums what matches: the user time of both cores.
    users = before.select("node_cpu_seconds_total", mode="user")
    assert len(users) == 2 and before.value("node_cpu_seconds_total", mode="user") == sum(
        s.value for s in users
    )
    assert before.value("no_such_metric") is None and not before.has("no_such_metric")


# --- node-exporter ---


def test_cpu_use_per_core_and_mean(node) -> None:
    before, after = node
    use = metrics.cpu_use(before, after)
    assert use is not None
    assert list(use.per_core_percent) == ["0", "1"]
    # Core 0: user +2.01, system +0.12, idle +0.01 (iowait, steal, softirq unchanged).
    assert use.per_core_percent["0"] == pytest.approx(100 * 2.13 / 2.14)
    assert use.mean_percent == pytest.approx(sum(use.per_core_percent.values()) / 2)
    assert all(0 <= p <= 100 for p in use.per_core_percent.values())


def test_cpu_use_counts_iowait_as_idle_and_steal_as_busy() -> None:
    def cpu(idle: float, iowait: float, steal: float, taken_at: float) -> Snapshot:
        lines = [
            f'node_cpu_seconds_total{{cpu="0",mode="{mode}"}} {value}'
            for mode, value in (("idle", idle), ("iowait", iowait), ("steal", steal), ("user", 5))
        ]
        return Snapshot.parse("\n".join(lines), taken_at)

    use = metrics.cpu_use(cpu(10, 0, 0, 0), cpu(11, 1, 2, 4))
    assert use is not None and use.per_core_percent == {"0": 50.0}


def test_cores_come_in_numeric_order() -> None:
    def cores(idle: float, taken_at: float) -> Snapshot:
        return Snapshot.parse(
            "".join(
                f'node_cpu_seconds_total{{cpu="{c}",mode="idle"}} {idle}\n'
                f'node_cpu_seconds_total{{cpu="{c}",mode="user"}} 1\n'
                for c in (10, 2, 1)
            ),
            taken_at,
        )

    use = metrics.cpu_use(cores(1, 0), cores(2, 1))
    assert use is not None and list(use.per_core_percent) == ["1", "2", "10"]
    assert use.mean_percent == 0.0


def test_a_restarted_exporter_counts_from_zero() -> None:
    """A counter lower than before (the node rebooted) is growth from zero, as Prometheus'
    increase() takes it: never a negative rate."""
    before = Snapshot.parse('node_network_receive_bytes_total{device="eth0"} 9000', 0)
    after = Snapshot.parse('node_network_receive_bytes_total{device="eth0"} 400', 2)
    assert metrics.network_use(before, after)["eth0"].received == 400
    assert metrics.increase(10, 4) == 4 and metrics.increase(4, 10) == 6


def test_memory_used_is_total_less_available(node) -> None:
    _, after = node
    memory = metrics.memory(after)
    assert memory is not None
    assert memory.total_bytes == 25_276_063_744
    assert memory.used_bytes == 25_276_063_744 - 24_398_172_160
    assert memory.used_ratio == pytest.approx(memory.used_bytes / memory.total_bytes)
    assert metrics.memory(Snapshot.parse("node_load1 1", 0)) is None


def test_network_bytes_and_rates_per_interface_without_loopback(node) -> None:
    before, after = node
    assert metrics.network_bytes(after) == {"eth0": metrics.NetworkBytes(11269, 5_067_248)}
    use = metrics.network_use(before, after)
    assert set(use) == {"eth0"}
    eth0 = use["eth0"]
    # The 5,000,000-byte file left over eth0 between the scrapes (with its HTTP and TCP).
    assert (eth0.received, eth0.sent) == (11269 - 510, 5_067_248 - 608)
    assert 5_000_000 < eth0.sent < 5_100_000
    assert eth0.sent_per_second == pytest.approx(eth0.sent / INTERVAL)
    assert eth0.received_per_second == pytest.approx(eth0.received / INTERVAL)
    total = metrics.network_total({"eth0": eth0, "eth1": eth0})
    assert (total.sent, total.received_per_second) == (2 * eth0.sent, 2 * eth0.received_per_second)
    loopback = Snapshot.parse(
        'node_network_receive_bytes_total{device="lo"} 5\n'
        'node_network_transmit_bytes_total{device="lo"} 5\n',
        0,
    )
    assert metrics.network_bytes(loopback) == {}


def test_disk_bytes_per_device(node) -> None:
    before, after = node
    use = metrics.disk_use(before, after)
    assert set(use) == {"vda", "zram0"}
    read = after.value("node_disk_read_bytes_total", device="vda")
    start = before.value("node_disk_read_bytes_total", device="vda")
    assert read is not None and start is not None
    assert use["vda"].read_bytes == int(read - start)
    assert use["vda"].read_per_second == pytest.approx(use["vda"].read_bytes / INTERVAL)
    assert use["zram0"] == metrics.DiskUse(0, 0, 0.0, 0.0)


def test_snapshots_out_of_order_are_refused(node) -> None:
    before, after = node
    for pair in ((after, before), (before, before)):
        with pytest.raises(MetricsError, match="must be taken after the first"):
            metrics.network_use(*pair)


# --- llama-server ---


def test_tokens_generated_and_per_second(server) -> None:
    before, after = server
    assert metrics.tokens_generated(before, after) == 24
    assert metrics.tokens_per_second(before, after) == pytest.approx(24 / INTERVAL)
    node_only = Snapshot.parse("node_load1 1", 0), Snapshot.parse("node_load1 1", 1)
    assert metrics.tokens_per_second(*node_only) is None


def test_requests_processing_and_deferred(server) -> None:
    _, after = server
    assert metrics.requests(after) == metrics.Requests(processing=0, deferred=0)
    busy = Snapshot.parse("llamacpp:requests_processing 2\nllamacpp:requests_deferred 3\n", 0)
    assert metrics.requests(busy) == metrics.Requests(2, 3)
    assert metrics.requests(Snapshot.parse("node_load1 1", 0)) is None


def test_a_draft_models_acceptance_from_the_counters(server) -> None:
    """The pinned llama-server's speculative-decoding counters; none without a draft model (the
    recorded server had none), and none before anything was drafted."""
    _, after = server
    assert metrics.draft_acceptance(after) is None
    text = (
        "llamacpp:spec_decode_num_draft_tokens_total 40\n"
        "llamacpp:spec_decode_num_accepted_tokens_total 30\n"
    )
    found = metrics.draft_acceptance(Snapshot.parse(text, 0))
    assert found == metrics.DraftAcceptance(drafted=40, accepted=30) and found.ratio == 0.75
    idle = text.replace(" 40", " 0").replace(" 30", " 0")
    assert metrics.draft_acceptance(Snapshot.parse(idle, 0)) is None


def test_kv_cache_use_from_the_slots(server) -> None:
    """The pinned llama-server exports no KV cache metric: the slots say what each holds."""
    before, after = server
    assert not after.has(metrics.KV_CACHE_USAGE_RATIO)
    assert metrics.kv_cache_usage(before, slots(1)) == 0.0
    # The second slot holds the prompt and the 24 generated tokens (the last not decoded yet).
    held = slots(2)[1]["n_prompt_tokens"]
    assert held == 29
    assert metrics.kv_cache_usage(after, slots(2)) == pytest.approx(held / 1024)
    assert metrics.kv_cache_usage(after, None) is None


def test_a_kv_cache_metric_wins_when_a_build_exports_it() -> None:
    exported = Snapshot.parse("llamacpp:kv_cache_usage_ratio 0.25\n", 0)
    assert metrics.kv_cache_usage(exported, slots(2)) == 0.25


def test_a_slot_without_its_size_is_refused() -> None:
    with pytest.raises(MetricsError, match="n_ctx"):
        metrics.kv_cache_usage(None, [{"id": 0}])


# --- nodes without an exporter ---

# A main node's network namespace (local cluster) as the kernel prints it: its VPC link (eth0)
# and the host's link (tunnel).
PROC_NET_DEV = (FIXTURES / "proc-net-dev.txt").read_text()


def test_proc_net_dev_reads_as_node_exporters_counters() -> None:
    samples = metrics.proc_net_dev_samples(PROC_NET_DEV)
    assert len(samples) == 6
    snap = Snapshot.of(samples, 0)
    assert metrics.network_bytes(snap) == {
        "eth0": metrics.NetworkBytes(5_067_248, 11269),
        "tunnel": metrics.NetworkBytes(866, 936),
    }
    later = Snapshot.of(metrics.proc_net_dev_samples(PROC_NET_DEV.replace("5067248", "5067348")), 2)
    assert metrics.network_use(snap, later)["eth0"].received_per_second == 50.0
    with pytest.raises(MetricsError, match="without byte counters"):
        metrics.proc_net_dev_samples("  eth0: 1 2 3\n")


# --- lrc local top: figures and frame, from readings made here ---


def reading(n: int, **fields) -> topview.NodeReading:
    return topview.NodeReading(taken_at=100.0 + INTERVAL * (n - 1), **fields)


def test_a_machines_main_node_row_has_every_figure(node, server) -> None:
    before = reading(
        1, name="main", role="main", phase="serving", exporter=node[0], server=server[0],
        slots=slots(1),
    )  # fmt: skip
    after = reading(
        2, name="main", role="main", phase="serving", exporter=node[1], server=server[1],
        slots=slots(2),
    )  # fmt: skip
    row = topview.row(before, after, cpus=2)
    cpu = metrics.cpu_use(node[0], node[1])
    assert cpu is not None and row.cpu_percent == pytest.approx(cpu.mean_percent)
    assert (row.memory_bytes, row.memory_total_bytes) == (877_891_584, 25_276_063_744)
    assert row.sent_per_second == pytest.approx((5_067_248 - 608) / INTERVAL)
    assert (row.received_bytes, row.sent_bytes) == (11269, 5_067_248)
    assert row.tokens_per_second == pytest.approx(24 / INTERVAL)
    assert row.kv_cache_percent == pytest.approx(100 * 29 / 1024)
    assert row.requests == metrics.Requests(0, 0)


def test_processes_count_their_cpu_time_over_this_machines_cores() -> None:
    """In processes mode a node's CPU is its processes' time; a process that started in the
    interval counts whole, one that ended does not make the figure negative."""
    start = topview.ProcessUse({(1, 7): 10.0, (2, 7): 5.0, (3, 7): 1.0}, 1000)
    end = topview.ProcessUse({(1, 7): 12.0, (2, 7): 5.5, (4, 9): 0.5}, 3000)  # 3 ended, 4 started
    assert topview.process_cpu_percent(start, end, elapsed=2.0, cpus=2) == pytest.approx(75.0)
    assert topview.process_cpu_percent(start, start, elapsed=2.0, cpus=2) == 0.0
    dev = Snapshot.of(metrics.proc_net_dev_samples(PROC_NET_DEV), 0)
    busier = PROC_NET_DEV.replace("5067248", "5077248")
    row = topview.row(
        reading(1, name="w1", role="worker", phase="serving", processes=start, network=dev),
        reading(2, name="w1", role="worker", phase="serving", processes=end,
                network=Snapshot.of(metrics.proc_net_dev_samples(busier), INTERVAL)),
        cpus=2,
    )  # fmt: skip
    assert row.memory_bytes == 3000 and row.memory_total_bytes is None
    # eth0 only: the host's link (tunnel) carries the user's requests, not traffic between nodes.
    assert row.received_per_second == pytest.approx(10_000 / INTERVAL)
    assert (row.received_bytes, row.sent_bytes) == (5_077_248, 11269)


def test_the_frame_has_a_line_per_node_and_says_why_a_figure_is_missing(node, server) -> None:
    rows = [
        topview.row(
            reading(1, name="main", role="main", phase="serving", exporter=node[0],
                    server=server[0], slots=slots(1)),
            reading(2, name="main", role="main", phase="serving", exporter=node[1],
                    server=server[1], slots=slots(2)),
            cpus=2,
        ),
        topview.row(
            reading(1, name="w1", role="worker", phase="building"),
            reading(2, name="w1", role="worker", phase="building",
                    notes=("node-exporter on port 9100 did not answer (refused)",)),
            cpus=2,
        ),
    ]  # fmt: skip
    text = topview.render(rows, "local cluster 't'", ["legend"])
    lines = text.splitlines()
    assert lines[0] == "local cluster 't'"
    assert lines[1].split()[:4] == ["NODE", "ROLE", "PHASE", "CPU"]
    main, worker = lines[2].split(), lines[3].split()
    assert main[:3] == ["main", "main", "serving"]
    assert float(main[3]) == pytest.approx(rows[0].cpu_percent, abs=0.05)
    assert "837.2 MiB of 23.5 GiB" in lines[2] and "1.9 MiB/s" in lines[2]
    assert main[-3:] == ["2.8", "9.6", "0+0"]  # KV %, tokens/s, requests
    assert worker[:4] == ["w1", "worker", "building", "n/a"]
    assert lines[-2:] == ["legend", "w1: node-exporter on port 9100 did not answer (refused)"]


def test_human_bytes() -> None:
    assert [topview.human_bytes(n) for n in (0, 1023, 1024, 5 * 1024**2, 3 * 1024**4)] == [
        "0 B", "1023 B", "1.0 KiB", "5.0 MiB", "3072.0 GiB",
    ]  # fmt: skip
    assert topview.human_bytes(2048, per_second=True) == "2.0 KiB/s"
    assert topview.human_bytes(None) == "n/a"


# --- top --once on a running local cluster (processes: the host's view of each node) ---


def frame_rows(text: str, names: list[str]) -> dict[str, list[str]]:
    """The frame's line for each node, split in words; fails when a node has none."""
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("NODE "))
    rows = {}
    for line in lines[header + 1 :]:
        if not line.strip():
            break
        rows[line.split()[0]] = line.split()
    assert sorted(rows) == sorted(names), text
    return rows


def top_once_while_generating(spec: ClusterSpec, url: str, interval: float = 2.0) -> str:
    """`lrc local top --once` while the main node generates, so that every column
    has something to show."""
    with generating(url, api_key_header(spec)):
        result = subprocess.run(
            [LRC, "local", "top", "--id", spec.id, "--once",
             "--interval", str(interval)],
            capture_output=True, text=True, check=False, cwd=REPO, timeout=120,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.slow
@pytest.mark.netns
def test_top_once_shows_each_node_of_a_running_cluster(cluster_1p2: dict[str, Any]) -> None:
    spec, contract = cluster_1p2["spec"], cluster_1p2["contract"]
    shown = top_once_while_generating(spec, contract[outputs.LLAMA_SERVER_URL])
    rows = frame_rows(shown, ["main", "w1", "w2"])
    assert "(processes, 3 nodes)" in shown.splitlines()[0]
    for words in rows.values():
        assert words[2] == "serving", shown
        assert 0 <= float(words[3]) <= 100, shown  # CPU %
        assert words[5] in ("KiB", "MiB", "GiB"), shown  # the node's memory
    main, worker = rows["main"], rows["w1"]
    # The main node sent the worker its layers' inputs and got their outputs back.
    assert float(main[-2]) > 0, shown  # tokens/s
    assert 0 < float(main[-3]) <= 100, shown  # KV cache %
    assert "n/a" not in " ".join(main + worker), shown
    assert "as a share of this machine's" in shown
    with generating(contract[outputs.LLAMA_SERVER_URL]):
        result = subprocess.run(
            [LRC, "local", "top", "--id", spec.id, "--json",
             "--interval", "2"],
            capture_output=True, text=True, check=False, cwd=REPO, timeout=120,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)  # one reading, as data
    assert document["schemaVersion"] == 1 and document["cluster"] == spec.id
    nodes = {node["name"]: node for node in document["nodes"]}
    assert sorted(nodes) == ["main", "w1", "w2"]
    assert {node["phase"] for node in nodes.values()} == {"serving"}
    assert nodes["main"]["tokens_per_second"] > 0 and nodes["w1"]["sent_bytes"] > 0


def test_top_redraws_each_frame_until_interrupted(monkeypatch: pytest.MonkeyPatch, node) -> None:
    """Live: every frame is drawn over the last (ANSI home and clear), Ctrl-C ends it cleanly;
    --once prints one plain frame."""
    readings = iter(range(10))

    def read(spec) -> list[topview.NodeReading]:
        n = next(readings)
        exporter = Snapshot.of(node[n % 2].samples, 100.0 + n)
        return [topview.NodeReading("w1", "worker", "serving", 100.0 + n, exporter=exporter)]

    monkeypatch.setattr(top, "read_cluster", read)
    node_ = LocalNode("w1", "worker", "10.0.0.11", "lrc-t-w1", 0, Path("/nonexistent/status"))
    spec = ClusterSpec("t", netns=True, machines=True, cidr="10.0.0.0/24", commit="0" * 40,
                       rpc_port=50052, server_port=8080, context_size=4096, slots=1, placement=(),
                       nodes=(node_,))  # fmt: skip
    naps = []

    def nap(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 3:
            raise KeyboardInterrupt

    out = io.StringIO()
    assert top.run(spec, 0.5, once=False, out=out, sleep=nap, clock=lambda: 0.0) == 0
    frames = out.getvalue().split(topview.CLEAR_SCREEN)
    assert frames[0] == "" and len(frames) == 3 and naps == [0.5, 0.5, 0.5]
    assert all(f.splitlines()[2].startswith("w1 ") for f in frames[1:])
    once = io.StringIO()
    assert top.run(spec, 0.5, once=True, out=once, sleep=lambda _: None) == 0
    assert topview.CLEAR_SCREEN not in once.getvalue() and "every 0.5 s" in once.getvalue()
    with pytest.raises(LocalClusterError, match="--interval 0"):
        top.run(spec, 0, once=True, out=once)
