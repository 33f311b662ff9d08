"""A serving group read by its main node (infra/boot/channel_scripts/llama-rpc-metrics) and brought
back through a command channel: the script runs here against exporters and a llama-server that serve
the recorded fixtures on loopback addresses, the way it runs on a main node; what it prints is
read by infra.observe.group_metrics, the stack's `top` (infra.observe.top) and the cost run's
channel probe."""

from __future__ import annotations

import contextlib
import http.server
import io
import json
import random
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from infra.boot import metrics_command
from infra.boot.installed import installed_text
from infra.cli import deployed
from infra.cli import top as top_command
from infra.clouds import FACTS
from infra.core import outputs
from infra.core.limits import MAX_WORKERS
from infra.costrun import channel_probe
from infra.costrun.channel_probe import RECORD_UNIT, ChannelProbe, NodeRecorder
from infra.live import Access, ChannelError, LiveError, stack_channels
from infra.observe import group_metrics, metrics, top, usage
from infra.observe.metrics import Snapshot
from tests.conftest import REPO, free_port

SCRIPT = metrics_command.SCRIPT
FIXTURES = REPO / "tests" / "fixtures" / "metrics"
MAIN, WORKER_1, WORKER_2 = "127.0.0.10", "127.0.0.11", "127.0.0.12"


def exporter_text(cores: int = 0, devices: int = 0, seed: int | None = None) -> str:
    """The recorded node-exporter answer; with ``cores``, CPU counters for that many cores, and
    with ``devices``, that many more network interfaces (a large node's answer), each counter
    drawn from ``seed`` (so that nodes differ, as real ones do, and compress as little)."""
    text = (FIXTURES / "node-exporter-1.prom").read_text()
    if not cores and not devices:
        return text
    draw = random.Random(seed)
    lines = [line for line in text.splitlines() if not line.startswith("node_cpu_seconds_total")]
    for core in range(cores):
        for mode in ("idle", "iowait", "irq", "nice", "softirq", "steal", "system", "user"):
            seconds = draw.uniform(1e3, 1e7)
            lines.append(f'node_cpu_seconds_total{{cpu="{core}",mode="{mode}"}} {seconds:.2f}')
    for device in range(devices):
        received, sent = draw.randrange(10**9, 10**13), draw.randrange(10**9, 10**13)
        lines.append(f'node_network_receive_bytes_total{{device="ens{device}"}} {received}')
        lines.append(f'node_network_transmit_bytes_total{{device="ens{device}"}} {sent}')
    return "\n".join(lines) + "\n"


Handler = type[http.server.BaseHTTPRequestHandler]


def handler(routes: Mapping[str, str], posts: list[Any]) -> Handler:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            body = routes.get(path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write((body or "").encode())

        def do_POST(self) -> None:
            posts.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            reply = {"content": "x" * 3000, "tokens_predicted": 4, "timings": {"predicted_n": 4}}
            self.send_response(200)
            self.end_headers()
            self.wfile.write(json.dumps(reply).encode())

    return Handler


@contextlib.contextmanager
def serving(ip: str, port: int, routes: Mapping[str, str], posts: list[Any]) -> Iterator[None]:
    server = http.server.ThreadingHTTPServer((ip, port), handler(routes, posts))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


class Group:
    """A main node's node.env and status file, its exporters and llama-server on loopback."""

    def __init__(self, tmp: Path, workers: list[str], exporters: Mapping[str, str]):
        self.metrics_port, self.server_port = free_port(), free_port()
        self.status = tmp / "status.json"
        self.status.write_text(json.dumps({"phase": "serving"}))
        self.env_file = tmp / "node.env"
        self.env_file.write_text(
            "\n".join([
                "LLAMA_ROLE=main",
                f"LLAMA_NODE_IP={MAIN}",
                f"RPC_WORKERS={','.join(f'{w}:50052' for w in workers)}",
                f"METRICS_PORT={self.metrics_port}",
                f"SERVER_PORT={self.server_port}",
                f"LLAMA_STATUS_FILE={self.status}",
            ])
            + "\n"
        )  # fmt: skip
        self.ips = (MAIN, *workers)
        self.exporters = exporters
        self.posts: list[Any] = []

    @contextlib.contextmanager
    def up(self) -> Iterator[Group]:
        server = {
            "/metrics": (FIXTURES / "llama-server-2.prom").read_text(),
            "/slots": (FIXTURES / "llama-server-slots-2.json").read_text(),
        }
        with contextlib.ExitStack() as stack:
            for ip, text in self.exporters.items():
                stack.enter_context(serving(ip, self.metrics_port, {"/metrics": text}, []))
            stack.enter_context(serving(MAIN, self.server_port, server, self.posts))
            yield self


class ScriptChannel:
    """A command channel to the loopback main node: llama-rpc-metrics runs from the source tree;
    systemd-run and systemctl stop, which the recorder uses on a node, start and stop it here."""

    def __init__(self, group: Group, max_output: int | None = None):
        self.group, self.max_output = group, max_output
        self.env = {"LLAMA_RPC_ENV_FILE": str(group.env_file), "PATH": "/usr/bin:/bin"}
        self.units: dict[str, subprocess.Popen[str]] = {}
        self.commands: list[list[str]] = []

    def argv(self, command: list[str]) -> list[str]:
        """The script from the source tree; what installs it on a node is tested on its own."""
        assert command[:4] == metrics_command.command(), command
        return [sys.executable, str(SCRIPT), *command[4:]]

    def run(self, command: list[str], timeout: float) -> str:
        self.commands.append(command)
        if "systemd-run" in command:
            at = command.index("systemd-run")
            unit = command[at + 1].removeprefix("--unit=")
            self.units[unit] = subprocess.Popen(
                self.argv(command[at + 4 :]), env=self.env, text=True, stderr=subprocess.PIPE
            )
            return ""
        if command[:2] == ["sh", "-c"] and command[2].startswith("systemctl stop "):
            process = self.units.pop(command[2].split()[2])
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0, process.stderr
            return ""
        result = subprocess.run(
            self.argv(command), env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if result.returncode != 0:
            raise ChannelError(result.stderr)
        if self.max_output is not None:
            assert len(result.stdout) <= self.max_output, "over the channel's cap"
        return result.stdout


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    """A main node and two workers; the second worker's exporter does not answer."""
    exporters = {MAIN: exporter_text(), WORKER_1: exporter_text()}
    with Group(tmp_path, [WORKER_1, WORKER_2], exporters).up() as running:
        yield running


def stack_outputs(ips: tuple[str, ...]) -> dict[str, Any]:
    main, *workers = ips
    return {
        outputs.CLOUD: "aws",
        outputs.MAIN_PRIVATE_IP: main,
        outputs.WORKER_PRIVATE_IPS: workers,
        outputs.GROUPS: [
            {
                outputs.MAIN_PRIVATE_IP: main,
                outputs.WORKER_PRIVATE_IPS: workers,
                outputs.MAIN_INSTANCE_ID: "vm-main",
            }
        ],
    }


def test_a_reading_keeps_every_figure_the_exporters_and_llama_server_give(group) -> None:
    text = ScriptChannel(group).run(metrics_command.read_command(), 60)
    assert text.startswith(group_metrics.PACKED)
    read = group_metrics.parse(text)
    assert read.phase == "serving"
    assert [(n.ip, n.role) for n in read.nodes] == [
        (MAIN, "main"), (WORKER_1, "worker"), (WORKER_2, "worker"),
    ]  # fmt: skip
    assert read.nodes[2].exporter is None and "refused" in read.nodes[2].error.lower()
    whole = Snapshot.parse(exporter_text(), 0.0)
    for node in read.nodes[:2]:
        kept = node.exporter
        assert kept is not None
        # The CPU counters are summed over the cores, and every figure derived from them holds.
        assert {s.labels.get("cpu") for s in kept.select("node_cpu_seconds_total")} == {"all"}
        assert metrics.cpu_busy_seconds(kept) == pytest.approx(metrics.cpu_busy_seconds(whole))
        assert metrics.memory(kept) == metrics.memory(whole)
        assert metrics.network_bytes(kept) == metrics.network_bytes(whole)
    server = Snapshot.parse((FIXTURES / "llama-server-2.prom").read_text(), 0.0)
    slots = json.loads((FIXTURES / "llama-server-slots-2.json").read_text())
    assert read.server is not None
    assert read.server.value(metrics.TOKENS_PREDICTED) == server.value(metrics.TOKENS_PREDICTED)
    assert metrics.kv_cache_usage(read.server, read.slots) == metrics.kv_cache_usage(server, slots)


def test_a_reading_carries_the_percent_the_main_node_counted(group) -> None:
    """`top`'s phase column: the download's or the load's percent, where the node counts it."""
    group.status.write_text(json.dumps(
        {"phase": "downloading", "download_done_bytes": 41, "download_total_bytes": 100}
    ))  # fmt: skip
    read = group_metrics.parse(ScriptChannel(group).run(metrics_command.read_command(), 60))
    assert read.phase == "downloading 41%"
    group.status.write_text(json.dumps({"phase": "loading", "load_sent_bytes": None}))
    read = group_metrics.parse(ScriptChannel(group).run(metrics_command.read_command(), 60))
    assert read.phase == "loading"


def test_a_reading_of_the_largest_group_fits_azure_run_commands_cap(tmp_path: Path) -> None:
    """The largest group (a main node and MAX_WORKERS workers) of 64-core nodes with two
    interfaces each, every counter different: one reading fits the smallest channel's cap, so
    top and the cost run work on every cloud."""
    workers = [f"127.0.0.{20 + i}" for i in range(MAX_WORKERS)]
    exporters = {  # two interfaces: Azure's accelerated NIC and its virtual function
        ip: exporter_text(cores=64, devices=2, seed=n) for n, ip in enumerate((MAIN, *workers))
    }
    assert min(map(len, exporters.values())) > 30_000  # what one node's full answer weighs
    # A reading over a channel's cap fails with the reason, rather than coming back cut short.
    small = Group(tmp_path, workers[:2], exporters)
    with small.up(), pytest.raises(ChannelError, match="over the command channel's 500"):
        ScriptChannel(small).run(metrics_command.read_command(500), 60)
    with Group(tmp_path, workers, exporters).up() as running:
        cap = FACTS["azure"].command_output_chars
        assert cap is not None
        text = ScriptChannel(running, max_output=cap).run(metrics_command.read_command(cap), 60)
    read = group_metrics.parse(text)
    assert len(read.nodes) == MAX_WORKERS + 1 and all(n.exporter for n in read.nodes)
    for node, ip in zip(read.nodes, (MAIN, *workers), strict=True):
        assert node.exporter is not None and node.ip == ip
        whole = Snapshot.parse(exporters[ip], 0.0)
        assert metrics.cpu_busy_seconds(node.exporter) == pytest.approx(
            metrics.cpu_busy_seconds(whole)
        )
        assert metrics.network_bytes(node.exporter) == metrics.network_bytes(whole)


def test_top_for_a_stack_shows_every_node_and_says_which_did_not_answer(group) -> None:
    channel = ScriptChannel(group)
    groups = top.stack_groups(stack_outputs(group.ips), [channel])
    out = io.StringIO()
    assert top.run("aws-c8g", groups, interval=0.2, once=True, out=out) == 0
    shown = out.getvalue()
    lines = {line.split()[0]: line.split() for line in shown.splitlines()[2:] if line}
    assert lines["main"][1:3] == ["main", "serving"], shown
    assert lines["worker-1"][1:3] == ["worker", group_metrics.WORKER_ANSWERING], shown
    assert "of" in lines["worker-1"], shown  # memory: used of total, from the exporter
    assert lines["worker-2"][1:4] == ["worker", "no", "answer"], shown
    assert "worker-2: node-exporter did not answer the main node" in shown
    assert channel.commands == [metrics_command.read_command(channel.max_output)] * 2


def test_top_names_a_group_whose_main_node_cannot_be_reached(group) -> None:
    class Broken:
        max_output = None

        def run(self, command: list[str], timeout: float) -> str:
            raise ChannelError("SSM Failed on i-0main: agent offline")

    found = top.read_stack(top.stack_groups(stack_outputs(group.ips), [Broken()]), {
        MAIN: "main", WORKER_1: "worker-1", WORKER_2: "worker-2",
    })  # fmt: skip
    assert [r.phase for r in found] == ["unknown"] * 3
    assert "agent offline" in found[0].notes[0]


def test_the_cost_run_probe_reads_records_and_completes_through_the_channel(
    group, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reading, a request, and a recording brought back in pieces that fit the channel's cap
    (a small one here, so that it takes several)."""
    monkeypatch.setattr(channel_probe, "RECORD_FILE", str(tmp_path / "usage.jsonl"))
    channel = ScriptChannel(group, max_output=FACTS["azure"].command_output_chars)
    probe = ChannelProbe(channel, stack_outputs(group.ips))
    assert probe.roles == {"main": "main", "worker-1": "worker", "worker-2": "worker"}
    reading = probe.read()
    assert set(reading.nodes) == {"main", "worker-1"}  # worker-2's exporter does not answer
    assert reading.nodes["main"].cpu_seconds > 0 and reading.kv_cache is not None
    reply = probe.complete({"prompt": "hello", "n_predict": 4}, timeout=30)
    assert reply == {"tokens_predicted": 4, "timings": {"predicted_n": 4}}  # no content
    assert group.posts == [{"prompt": "hello", "n_predict": 4}]

    # A small cap (Azure's) reads less often, so that the recording comes back in few commands.
    assert probe.recorder(0.1).interval == channel_probe.SMALL_CAP_INTERVAL_SECONDS
    channel.max_output = None
    assert probe.recorder(0.1).interval == 0.1
    channel.max_output = 700  # here, to bring a short recording back in several pieces
    recorder = NodeRecorder(probe, 0.1).start()
    assert RECORD_UNIT in channel.units
    threading.Event().wait(2.0)
    readings = recorder.stop()
    dumps = [c for c in channel.commands if c[4:5] == ["dump"]]
    assert len(dumps) > 1, "a recording this long comes back in several pieces"
    assert len(readings) >= 5 and recorder.failures == 0
    assert [r.at for r in readings] == sorted(r.at for r in readings)
    summary = usage.summarize(readings, probe.roles, interval=0.1)
    assert summary["nodes"]["main"]["memory_peak_bytes"] > 0
    assert summary["nodes"]["worker-2"]["not_measured"] == "fewer than two readings"
    assert summary["kv_cache"]["capacity_tokens"] == 1024


def test_the_script_refuses_a_worker_and_a_bad_interval(group, tmp_path: Path) -> None:
    env = {"LLAMA_RPC_ENV_FILE": str(group.env_file)}
    bad = subprocess.run(
        [sys.executable, str(SCRIPT), "record", "--out", str(tmp_path / "r"), "--interval", "0"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert bad.returncode != 0 and "--interval must be positive" in bad.stderr
    group.env_file.write_text(group.env_file.read_text().replace("=main", "=worker"))
    worker = subprocess.run(
        [sys.executable, str(SCRIPT), "read"], env=env, capture_output=True, text=True, check=False
    )
    assert worker.returncode != 0 and "run it on a main node" in worker.stderr


def test_a_reading_that_is_not_the_scripts_is_refused() -> None:
    with pytest.raises(metrics.MetricsError, match="version 1"):
        group_metrics.parse('{"version": 99}')
    with pytest.raises(metrics.MetricsError, match="does not unpack"):
        group_metrics.parse(group_metrics.PACKED + "not base64!")
    with pytest.raises(metrics.MetricsError, match="not JSON"):
        group_metrics.parse("Traceback (most recent call last):")


def test_the_command_installs_the_script_once_per_version_and_runs_it(
    group, tmp_path: Path
) -> None:
    """What a node runs: sh unpacks the script (without its comments) under its directory unless
    that version is there, then runs it; the second time it only runs it."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    command = metrics_command.command("read")
    command[2] = command[2].replace("f=/run/", f"f={run_dir}/")
    env = {
        "LLAMA_RPC_ENV_FILE": str(group.env_file),
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
    }
    first = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    installed = list(run_dir.iterdir())
    assert [p.name[: len(metrics_command.NAME)] for p in installed] == [metrics_command.NAME]
    assert installed[0].read_text() == installed_text(SCRIPT)
    assert group_metrics.parse(first.stdout).phase == "serving"
    installed[0].write_text(
        installed[0]
        .read_text()
        .replace("def main():", "def main():\n    print('kept')\n    return\ndef _old():")
    )
    second = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    assert second.stdout == "kept\n"  # the installed copy of this version ran, not a new one


def test_the_top_command_reads_the_stacks_outputs_and_draws_one_frame(
    group, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(deployed, "stack_outputs", lambda stack: stack_outputs(group.ips))
    asked: list[dict[str, Any]] = []

    def channels(found: Mapping[str, Any], **options: Any) -> list[ScriptChannel]:
        asked.append(dict(found))
        return [ScriptChannel(group)]

    monkeypatch.setattr(deployed, "stack_channels", channels)
    assert top_command.main(["--stack", "aws-c8g", "--once", "--interval", "0.2"]) == 0
    shown = capsys.readouterr().out
    assert "stack 'aws-c8g' (3 nodes)" in shown and "worker-2" in shown
    assert asked == [stack_outputs(group.ips)]
    assert top_command.main(["--stack", "aws-c8g", "--json", "--interval", "0.2"]) == 0
    document = json.loads(capsys.readouterr().out)  # one reading's rows, as data
    assert document["schemaVersion"] == 1 and document["stack"] == "aws-c8g"
    assert [n["name"] for n in document["nodes"]] == ["main", "worker-1", "worker-2"]
    assert document["nodes"][0]["phase"] == "serving"
    assert document["nodes"][0]["memory_bytes"] > 0 and document["nodes"][2]["notes"]
    monkeypatch.setattr(deployed, "stack_outputs", lambda stack: {})
    assert top_command.main(["--stack", "aws-c8g", "--once"]) == 2
    assert "has no outputs: deploy it with `pulumi up --stack aws-c8g`" in capsys.readouterr().err


def logged_in(argv: Sequence[str], timeout: float = 0) -> subprocess.CompletedProcess[str]:
    """gcloud and az, logged in, with no project configured in gcloud."""
    answers = {
        "gcloud auth": "token\n",
        "gcloud config": "\n",
        "az account": '{"accessToken": "t", "subscription": "s"}',
    }
    return subprocess.CompletedProcess(list(argv), 0, answers[" ".join(argv[:2])], "")


# No project named anywhere (gcloud has none configured); and one named in the stack file.
NOWHERE = Access("us-central1", environ={}, which=lambda tool: tool, runner=logged_in)
NAMED = Access("us-central1", {"gcp:project": "proj"}, environ={}, which=lambda tool: tool,
               runner=logged_in)  # fmt: skip


def test_a_channel_that_cannot_be_built_says_what_is_missing() -> None:
    base = stack_outputs((MAIN,)) | {outputs.MAIN_INSTANCE_ID: "vm-main"}
    gcp = base | {outputs.CLOUD: "gcp", outputs.ZONE: "us-central1-a"}
    with pytest.raises(ChannelError, match="GOOGLE_CLOUD_PROJECT"):
        stack_channels(gcp, access=NOWHERE)
    with pytest.raises(ChannelError, match="the stack's `zone` output"):
        stack_channels(base | {outputs.CLOUD: "gcp"}, access=NAMED)
    azure = base | {outputs.CLOUD: "azure", outputs.CONNECT_COMMAND: "az network bastion tunnel"}
    with pytest.raises(ChannelError, match="resourceGroup"):
        stack_channels(azure, access=NOWHERE)
    with pytest.raises(LiveError, match="no live operations for cloud 'local'"):
        stack_channels(base | {outputs.CLOUD: "local"}, access=NOWHERE)
    [channel] = stack_channels(gcp, access=NAMED)
    assert (channel.max_output, channel.zone) == (None, "us-central1-a")  # type: ignore[attr-defined]
    [channel] = stack_channels(azure | {outputs.RESOURCE_GROUP: "rg-1"}, access=NOWHERE)
    assert channel.resource_group == "rg-1"  # type: ignore[attr-defined]


def test_a_stack_deployed_before_the_location_outputs_is_still_reached() -> None:
    """Its zone and resource group are read from the ``connectCommand`` it printed."""
    base = stack_outputs((MAIN,)) | {outputs.MAIN_INSTANCE_ID: "vm-main"}
    old_gcp = base | {
        outputs.CLOUD: "gcp",
        outputs.CONNECT_COMMAND: "gcloud … --zone=europe-west4-b",
    }
    [channel] = stack_channels(old_gcp, access=NAMED)
    assert channel.zone == "europe-west4-b"  # type: ignore[attr-defined]
    old_azure = base | {
        outputs.CLOUD: "azure",
        outputs.CONNECT_COMMAND: "az network bastion tunnel --resource-group rg-old --name b",
    }
    [channel] = stack_channels(old_azure, access=NOWHERE)
    assert channel.resource_group == "rg-old"  # type: ignore[attr-defined]


def test_a_node_that_answers_too_much_or_writes_escapes_is_held_to_text(tmp_path: Path) -> None:
    """The script reads as root what other nodes answer and what the service user writes: an
    answer past its cap is that node's error, not memory spent, and the main node's phase
    reaches the reader printable and short."""
    flood = "node_load1 1\n" * 200_000  # 2.6 MB
    exporters = {MAIN: exporter_text(), WORKER_1: flood}
    with Group(tmp_path, [WORKER_1], exporters).up() as group:
        group.status.write_text(json.dumps({"phase": "serving\x1b]0;owned\x07" + "x" * 100}))
        read = group_metrics.parse(ScriptChannel(group).run(metrics_command.read_command(), 60))
    worker = read.nodes[1]
    assert worker.exporter is None and "over 1048576 bytes" in worker.error
    assert read.nodes[0].exporter is not None
    assert "\x1b" not in read.phase and read.phase.startswith("serving\\x1b]0;owned\\x07")
    assert len(read.phase) <= 60


@pytest.mark.parametrize("document", ["llama-rpc-cluster-read-metrics-0a1b2c3", None])
def test_an_aws_reading_goes_as_the_stacks_document_and_anything_else_as_a_shell_script(
    document: str | None,
) -> None:
    """With the stack's document, a watcher needs ``ssm:SendCommand`` on it alone; a stack from
    before it (no such output) is read through AWS-RunShellScript as before."""
    import boto3
    from botocore.stub import Stubber

    ssm = boto3.client(
        "ssm", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s"
    )
    found = stack_outputs((MAIN,)) | {outputs.METRICS_DOCUMENT: document}
    access = Access("us-east-1", aws_clients=lambda service, region: ssm)
    [channel] = stack_channels(found, access=access)
    channel.sleep = lambda _: None  # type: ignore[attr-defined]
    reading = metrics_command.read_command(channel.max_output)
    other = ["cat", "/var/lib/llama-rpc/status.json"]
    command_id = "0" * 36  # SSM ids are 36 characters
    stubs = Stubber(ssm)
    shell = "AWS-RunShellScript"
    for command in (reading, other):
        sent: dict[str, Any] = {"InstanceIds": ["vm-main"]}
        if command is reading and document:
            sent["DocumentName"] = document
        else:
            sent["DocumentName"] = shell
            sent["Parameters"] = {
                "commands": [shlex.join(command)],
                "executionTimeout": ["60"],
            }
        stubs.add_response("send_command", {"Command": {"CommandId": command_id}}, sent)
        stubs.add_response(
            "get_command_invocation",
            {"Status": "Success", "StandardOutputContent": "ok"},
            {"CommandId": command_id, "InstanceId": "vm-main"},
        )
    with stubs:
        assert channel.run(reading, 60) == "ok"
        assert channel.run(other, 60) == "ok"
    stubs.assert_no_pending_responses()
