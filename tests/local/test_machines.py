"""The local cluster as machines: each node's exact user data through real cloud-init and real
systemd, in a ``systemd-nspawn`` machine on the VPC bridge.

The shared ``machines_2x2`` (two serving groups of a main node and a worker, behind the
balancer), each node's user data delivered as a different cloud delivers it: the first main
node's as AWS (gzip), its worker's as GCP (plain), the second group's as Azure (base64). Traffic
goes only to loopback and to the namespaces these tests create. The tests run in order: the last
ones reboot nodes and break the first main node's settings on purpose, and put them back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import io
import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.boot import BOOT_UNIT, ROLE_UNIT, VM_PATHS, metrics_command
from infra.core import outputs
from infra.core.limits import METRICS_PORT
from infra.costrun.channel_probe import RECORD_UNIT, ChannelProbe
from infra.local import access, cluster
from infra.local.access import LocalChannel
from infra.local.machines import Machine
from infra.local.netns import VpcNetwork, exec_prefix
from infra.local.options import LocalClusterError, build_prefix
from infra.local.spec import ClusterSpec
from infra.observe import group_metrics, metrics, usage
from infra.observe import top as stack_top
from tests.conftest import (
    GREEDY_PROMPT,
    LRC,
    REPO,
    complete,
    completion_client,
    generating,
    one_node_completion,
    port_answers,
)
from tests.local.conftest import DELIVERIES
from tests.observe.test_metrics import frame_rows, top_once_while_generating

pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.machines]

# Every node, group by group: the first group's main node and worker, then the second's.
NODES = ("main", "w1", "r2main", "r2w1")


@pytest.fixture
def up(machines_2x2: dict[str, Any]) -> dict[str, Any]:
    return machines_2x2


def ip_of(up: dict[str, Any], name: str) -> str:
    network: VpcNetwork = up["network"]
    return network.node_ips[network.node_names.index(name)]


def machine(up: dict[str, Any], name: str) -> Machine:
    spec = up["spec"]
    return spec.node(name).booted()


def on(up: dict[str, Any], name: str, *command: str, stdin: str | None = None) -> str:
    """Run a command on a node, through `lrc local exec`'s own path; its output."""
    argv = access.exec_argv(up["spec"], name, list(command))
    result = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (command, result.stdout, result.stderr)
    return result.stdout


def unit_state(up: dict[str, Any], name: str, unit: str) -> dict[str, str]:
    shown = on(up, name, "systemctl", "show", unit, "-p", "ActiveState,SubState,Result")
    shown += on(up, name, "systemctl", "show", unit, "-p", "ExecMainStatus,NRestarts")
    return dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)


def wait_for(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not after {timeout:.0f} s"
        time.sleep(1)


def wait_serving(up: dict[str, Any], timeout: float = 600) -> None:
    url = up["contract"][outputs.LLAMA_SERVER_URL]

    def serving() -> bool:
        if cluster.read_status(up["spec"])["main"].get("phase") != "serving":
            return False
        try:
            complete(url, timeout=30, headers=up["key"])
        except OSError:
            return False
        return True

    wait_for(serving, timeout, "the main node serving")


def delivered_config(up: dict[str, Any], name: str) -> dict[str, Any]:
    """The cloud-config a node was given, read back from what its datasource handed over."""
    received = (machine(up, name).directory / "user-data").read_bytes()
    text = gzip.decompress(received) if received[:2] == b"\x1f\x8b" else received
    config: dict[str, Any] = yaml.safe_load(text)
    return config


def cli(up: dict[str, Any], *args: str) -> str:
    result = subprocess.run(
        [LRC, "local", *args[:1], "--id", up["spec"].id, *args[1:]],
        capture_output=True, text=True, check=False, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_exec_journal_and_status_reach_the_machines_from_the_command_line(up) -> None:
    assert cli(up, "exec", "w1", "--", "hostname").strip() == machine(up, "w1").name
    assert cli(up, "exec", "main", "--", "id", "-un").strip() == "root"
    journal = cli(up, "journal", "w1", "-u", ROLE_UNIT["worker"], "-o", "cat")
    assert "open only to" in journal
    status = json.loads(cli(up, "status", "--json"))
    assert {n: s["phase"] for n, s in status["nodes"].items()} == dict.fromkeys(NODES, "serving")
    assert status["outputs"][outputs.INSTANCE_TYPE] == "machine"


def test_each_node_got_its_clouds_delivery(up) -> None:
    """The first main node's user data arrived gzipped (AWS), its worker's as plain text (GCP),
    the second group's nodes' decoded from base64 (Azure): its main node's gzipped too (a main
    node's files are over Azure's 64 KB of base64 plain), its worker's plain (about 61 KB):
    cloud-init took each."""
    nodes = {n.name: n for n in up["spec"].nodes}
    delivered = {name: node.machine for name, node in nodes.items()}
    assert [delivered[n].cloud for n in NODES] == list(DELIVERIES)  # type: ignore[union-attr]
    assert [delivered[n].gzipped for n in NODES] == [True, False, True, False]  # type: ignore[union-attr]
    for name in ("main", "r2main"):
        assert (machine(up, name).directory / "user-data").read_bytes()[:2] == b"\x1f\x8b"
    for name in ("w1", "r2w1"):
        user_data = (machine(up, name).directory / "user-data").read_bytes()
        assert user_data.startswith(b"#cloud-config"), name
    for name in nodes:
        raw = on(up, name, "cloud-init", "query", "userdata")
        assert raw.startswith("#cloud-config")
        assert yaml.safe_load(raw) == delivered_config(up, name)


def test_cloud_init_is_done_without_errors(up) -> None:
    for name in NODES:
        status = ["cloud-init", "status", "--long", "--format=json"]
        result = subprocess.run(
            access.exec_argv(up["spec"], name, status), capture_output=True, text=True, check=False
        )
        report = json.loads(result.stdout)
        assert result.returncode == 0, result.stdout
        assert report["status"] == "done", report
        assert report["errors"] == [] and not report["recoverable_errors"], report


def test_the_service_user_and_every_written_file_are_as_configured(up) -> None:
    for name in NODES:
        user = on(up, name, "getent", "passwd", "llama").strip().split(":")
        assert user[5:] == [VM_PATHS.data_dir, "/usr/sbin/nologin"]
        assert int(user[2]) < 1000  # a system user
        for entry in delivered_config(up, name)["write_files"]:
            mode, owner = on(up, name, "stat", "-c", "%a %U:%G", entry["path"]).split()
            assert int(mode, 8) == int(entry["permissions"], 8), entry["path"]
            assert owner == entry.get("owner", "root:root"), entry["path"]
            assert on(up, name, "cat", entry["path"]) == entry["content"], entry["path"]


def test_units_are_active_and_servers_run_as_the_service_user(up) -> None:
    for name, process in (("main", "llama-server"), ("w1", "ggml-rpc-server")):
        role = "main" if name == "main" else "worker"
        states = on(up, name, "systemctl", "is-active", BOOT_UNIT, ROLE_UNIT[role]).split()
        assert states == ["active", "active"]
        owners = on(up, name, "ps", "-C", process, "-o", "user=").split()
        assert owners == ["llama"]


def test_units_use_every_option_they_set(up) -> None:
    """systemd 257 knows every key of the units (RestartSteps= and the like need >= 254)."""
    for name, role in (("main", "main"), ("w1", "worker")):
        verify = subprocess.run(
            access.exec_argv(
                up["spec"], name,
                ["systemd-analyze", "verify", f"/etc/systemd/system/{BOOT_UNIT}",
                 f"/etc/systemd/system/{ROLE_UNIT[role]}"],
            ),
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert "Unknown key" not in verify.stderr, verify.stderr
        shown = on(
            up, name, "systemctl", "show", BOOT_UNIT,
            "-p", "RestartSteps,RestartMaxDelayUSec,RestartMode",
        )  # fmt: skip
        assert sorted(shown.split()) == [
            "RestartMaxDelayUSec=10min",
            "RestartMode=direct",
            "RestartSteps=6",
        ]


def test_the_firewall_is_in_place_before_the_rpc_server_listens(up) -> None:
    lines = on(
        up, "w1", "journalctl", "-b", "-u", ROLE_UNIT["worker"], "-o", "cat", "--no-pager"
    ).splitlines()
    firewall = next(i for i, line in enumerate(lines) if "open only to" in line)
    # ggml-rpc-server's own first words, once it has its address and port.
    server = next(i for i, line in enumerate(lines) if "Starting RPC server" in line)
    assert firewall < server, lines
    assert "llama_rpc" in on(up, "w1", "nft", "list", "tables")


def test_rpc_port_is_closed_outside_the_vpc_and_between_workers(up) -> None:
    """A worker's RPC port answers its own main node only: not the other worker, nor the other
    group's main node, nor a host outside the VPC."""
    network: VpcNetwork = up["network"]
    w1, w2 = ip_of(up, "w1"), ip_of(up, "r2w1")
    assert port_answers(access.exec_argv(up["spec"], "main", []), w1, 50052)  # the controls
    assert port_answers(access.exec_argv(up["spec"], "r2main", []), w2, 50052)
    assert not port_answers(access.exec_argv(up["spec"], "r2w1", []), w1, 50052)
    assert not port_answers(access.exec_argv(up["spec"], "w1", []), w2, 50052)
    assert not port_answers(access.exec_argv(up["spec"], "r2main", []), w1, 50052)
    outsider = network.add_outsider("out", "192.168.214.5", 24)
    assert not port_answers(exec_prefix(outsider), w1, 50052)


def metrics_text(up: dict[str, Any], where: str, url: str, keyed: bool = False) -> str:
    """GET a metrics URL from inside a node's namespace (the cluster's own network); ``keyed``:
    with the API key (llama-server's own /metrics and /slots), given to curl on its stdin."""
    argv = [*exec_prefix(up["network"].namespace(where)), "curl", "-sf", "--max-time", "5",
            "--header", "@-", url]  # fmt: skip
    given = "".join(f"{k}: {v}\n" for k, v in up["key"].items()) if keyed else ""
    result = subprocess.run(argv, input=given, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, (url, result.stderr)
    return result.stdout


def test_node_exporter_serves_each_node_to_the_cluster_on_its_private_address(up) -> None:
    for name in NODES:
        ip = ip_of(up, name)
        # Asked from the group's main node: another node's address, inside the cluster's network.
        main = "main" if up["spec"].node(name).group == 0 else "r2main"
        snapshot = metrics.Snapshot.parse(
            metrics_text(up, main, f"http://{ip}:{METRICS_PORT}/metrics"), 0
        )
        assert metrics.memory(snapshot) is not None, name
        assert snapshot.select("node_cpu_seconds_total", mode="idle"), name
        assert "eth0" in metrics.network_bytes(snapshot), name
        assert snapshot.select("node_disk_read_bytes_total") or snapshot.has("node_load1")
        listening = on(up, name, "ss", "-Hltn", f"sport = :{METRICS_PORT}").split()
        assert f"{ip}:{METRICS_PORT}" in listening, listening  # not 0.0.0.0 or [::]
        assert on(up, name, "ps", "-C", "prometheus-node-exporter", "-o", "user=").split() == [
            "prometheus"
        ]
        assert "llama_rpc_metrics" in on(up, name, "nft", "list", "tables")


def test_the_metrics_port_is_as_narrow_as_rpc(up) -> None:
    """Hosts outside the cluster's network reach the nodes (a route back is added for the test),
    yet not their metrics port: the host over its link to the main node, and a namespace on the
    bridge with an address outside the VPC; inside it, only a worker's own main node does.
    Controls: the API port, and a listener on a worker."""
    network: VpcNetwork = up["network"]
    main_ip, w1 = ip_of(up, "main"), ip_of(up, "w1")
    host = subprocess.run(
        ["curl", "-sf", "--max-time", "5", f"http://{main_ip}:{METRICS_PORT}/metrics"],
        capture_output=True, check=False,
    )  # fmt: skip
    assert host.returncode != 0  # the host's link address is not the cluster's
    assert complete(up["contract"][outputs.LLAMA_SERVER_URL], headers=up["key"])[1]
    outsider = network.add_outsider("mout", "192.168.214.7", 24)
    routes = [network.namespace(n) for n in ("main", "w1")]
    listener = ["timeout", "60", "python3", "-m", "http.server", "--bind", w1, "9999"]
    control = subprocess.Popen(
        access.exec_argv(up["spec"], "w1", listener),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for ns in routes:
            subprocess.run(
                ["ip", "-n", ns, "route", "add", "192.168.214.0/24", "dev", "eth0"], check=True
            )
        wait_for(lambda: port_answers(exec_prefix(outsider), w1, 9999), 30, "the control")
        assert port_answers(exec_prefix(outsider), main_ip, 8080)
        for ip in (main_ip, w1):
            assert not port_answers(exec_prefix(outsider), ip, METRICS_PORT), ip
        # As narrow as RPC: a worker's answers its own main node, and no other node (another
        # group's worker or main node); the main node's answers no one but itself.
        assert port_answers(access.exec_argv(up["spec"], "main", []), w1, METRICS_PORT)
        for other in ("r2w1", "r2main"):
            assert not port_answers(access.exec_argv(up["spec"], other, []), w1, METRICS_PORT)
        assert not port_answers(access.exec_argv(up["spec"], "w1", []), main_ip, METRICS_PORT)
        assert port_answers(access.exec_argv(up["spec"], "main", []), main_ip, METRICS_PORT)
    finally:
        control.kill()
        control.wait()
        for ns in routes:
            subprocess.run(["ip", "-n", ns, "route", "del", "192.168.214.0/24"], check=False)


SERVICE = "llama"
AS_SERVICE = ["setpriv", f"--reuid={SERVICE}", f"--regid={SERVICE}", "--init-groups"]


def test_the_service_user_can_put_nothing_where_root_writes(up) -> None:
    """The attack: as the service user, a link where root writes (the status file, a lock, a
    model part's download) would hand root's files to it at the next boot. Root's directories
    take nothing from it; what it may write is the status file in place, and its own state
    directory, which root never touches."""
    data = VM_PATHS.data_dir
    for name in ("main", "w1"):
        targets = [f"{data}/status.json", f"{data}/status.json.lock", f"{data}/planted"]
        if name == "main":
            models = on(up, name, "sh", "-c", f"ls {data}/models").split()
            targets += [f"{data}/models/{models[0]}.partial", f"{data}/models/{models[0]}"]
        for target in targets:
            link = [*AS_SERVICE, "ln", "-sfn", "/etc/passwd", target]
            plant = subprocess.run(
                access.exec_argv(up["spec"], name, link),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert plant.returncode != 0 and "Permission denied" in plant.stderr, (name, target)
        owners = on(up, name, "stat", "-c", "%n %U:%G %a", data, f"{data}/status.json")
        assert owners.split("\n")[:2] == [
            f"{data} root:{SERVICE} 2750",
            f"{data}/status.json root:{SERVICE} 660",
        ]
        state = on(up, name, "stat", "-c", "%U:%G %a", f"{data}/service").split()
        assert state[0] == f"{SERVICE}:{SERVICE}" and int(state[1], 8) & 0o777 == 0o750
        # It updates the status in place, as its services do; root reads what it wrote.
        on(up, name, *AS_SERVICE, f"{VM_PATHS.bin_dir}/llama-rpc-status", "--file",
           f"{data}/status.json", "set", "service_probe=1")  # fmt: skip
        shown = on(up, name, f"{VM_PATHS.bin_dir}/llama-rpc-status", "--file",
                   f"{data}/status.json", "get", "service_probe")  # fmt: skip
        assert shown.strip() == "1"
        assert on(up, name, "stat", "-c", "%U", "/etc/passwd").strip() == "root"


def test_only_root_reaches_the_metadata_service(up) -> None:
    """A stand-in for the clouds' metadata service at 169.254.169.254 (a namespace of this test
    on the cluster's bridge): root on a node reaches it, the service user does not, so code
    running as the service user cannot take the node's credentials. DNS and NTP pass."""
    network: VpcNetwork = up["network"]
    metadata = network.add_outsider("mmeta", "169.254.169.254", 32)
    nodes = [network.namespace(n) for n in ("main", "w1")]
    server = subprocess.Popen(
        [*exec_prefix(metadata), "python3", "-m", "http.server", "--bind", "169.254.169.254", "80"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for ns in nodes:
            subprocess.run(
                ["ip", "-n", ns, "route", "add", "169.254.169.254/32", "dev", "eth0"], check=True
            )
        token = ["curl", "-sf", "--max-time", "5", "-o", "/dev/null", "http://169.254.169.254/"]
        for name in ("main", "w1"):
            wait_for(
                lambda name=name: (
                    subprocess.run(
                        access.exec_argv(up["spec"], name, token), capture_output=True
                    ).returncode
                    == 0
                ),
                30,
                f"root on {name} reaching the stand-in",
            )
            denied = subprocess.run(
                access.exec_argv(up["spec"], name, [*AS_SERVICE, *token]),
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert denied.returncode != 0, name
            assert "llama_rpc_metadata" in on(up, name, "nft", "list", "tables")
    finally:
        server.kill()
        server.wait()
        for ns in nodes:
            subprocess.run(["ip", "-n", ns, "route", "del", "169.254.169.254/32"], check=False)


def test_llama_server_serves_its_metrics_on_the_main_node(up) -> None:
    url = up["contract"][outputs.LLAMA_SERVER_URL]
    main_ip = ip_of(up, "main")

    def read() -> metrics.Snapshot:
        text = metrics_text(up, "w1", f"http://{main_ip}:8080/metrics", keyed=True)
        return metrics.Snapshot.parse(text, time.monotonic())

    before = read()
    complete(url, headers=up["key"])
    after = read()
    generated = metrics.tokens_generated(before, after)
    assert generated is not None and generated > 0
    assert metrics.requests(after) == metrics.Requests(0, 0)
    slots = json.loads(metrics_text(up, "main", f"http://{main_ip}:8080/slots", keyed=True))
    usage = metrics.kv_cache_usage(after, slots)
    assert usage is not None and 0 < usage <= 1


def test_top_shows_every_machine_with_its_figures(up) -> None:
    """`top --once` while the main node generates: every node's traffic from its exporter, its
    CPU and memory from its processes, the main node's tokens/s and KV cache from llama-server."""
    shown = top_once_while_generating(up["spec"], up["contract"][outputs.LLAMA_SERVER_URL])
    rows = frame_rows(shown, list(NODES))
    assert "(machines, 4 nodes, 2 serving groups)" in shown.splitlines()[0]
    for words in rows.values():
        assert words[2] == "serving", shown
        assert 0 <= float(words[3]) <= 100, shown  # CPU %
        assert "of" in words, shown  # memory: the machine's processes, of the host's
        assert "n/a" not in words, shown
    main = rows["main"]
    assert float(main[3]) > 0 and float(main[-2]) > 0, shown  # CPU %, tokens/s
    assert "node-exporter in a machine reads the host's CPU and memory" in shown


@contextlib.contextmanager
def generating_from_client(up: dict[str, Any], url: str, tmp_path: Path) -> Iterator[None]:
    """A main node this machine has no route to (the second group's) keeps generating for the
    block, asked from the tests' namespace on the VPC bridge."""
    stop = tmp_path / "stop-generating"
    client = completion_client(
        url, GREEDY_PROMPT, count=-1, stop=stop, key_file=up["spec"].api_key_file
    )
    asking = subprocess.Popen([*exec_prefix(up["client"]), *client], stdout=subprocess.DEVNULL)
    try:
        yield
    finally:
        stop.touch()
        asking.wait(timeout=150)


def test_a_stacks_top_reads_every_node_through_the_main_nodes_command_channel(
    up, tmp_path: Path
) -> None:
    """`lrc top`'s path on a stack, over the local command channel: the command
    installs llama-rpc-metrics in each group's main machine, which reads each machine's exporter
    inside the VPC (the main node's egress to its workers' metrics port) and its own
    llama-server."""
    channels = [LocalChannel(up["spec"], main) for main in ("main", "r2main")]
    groups = stack_top.stack_groups(up["contract"], channels)
    names = group_metrics.node_names([group.ips for group in groups])
    mains = [names[group.ips[0]] for group in groups]
    out = io.StringIO()
    second = up["contract"][outputs.GROUPS][1][outputs.LLAMA_SERVER_URL]
    with (
        generating(up["contract"][outputs.LLAMA_SERVER_URL], up["key"]),
        generating_from_client(up, second, tmp_path),
    ):
        assert stack_top.run("local", groups, interval=3.0, once=True, out=out) == 0
    shown = out.getvalue()
    rows = frame_rows(shown, list(names.values()))
    for name, words in rows.items():
        if name in mains:
            assert words[1:3] == ["main", "serving"], shown
            assert float(words[-2]) > 0, shown  # tokens/s
        else:
            assert words[1:3] == ["worker", group_metrics.WORKER_ANSWERING], shown
        assert "n/a" not in words[:11], shown  # CPU, memory, traffic: every node's exporter
        assert float(words[3]) > 0, shown
    for main in ("main", "r2main"):
        installed = on(up, main, "sh", "-c", "ls /run | grep llama-rpc-metrics")
        assert installed.strip().startswith(metrics_command.NAME), installed


def test_the_cost_runs_usage_is_recorded_on_the_main_node_and_brought_back(up) -> None:
    """The cost run's channel probe: a transient unit records a reading each half second while
    the main node generates; the readings come back through the channel, and a request sent
    through it is answered."""
    channel = LocalChannel(up["spec"], "main")
    probe = ChannelProbe(channel, up["contract"])
    # The recorder's unit installs the script itself (systemd-run expands $ in its command).
    on(up, "main", "sh", "-c", f"rm -f /run/{metrics_command.NAME}-*")
    recorder = probe.recorder(0.5).start()
    try:
        with generating(up["contract"][outputs.LLAMA_SERVER_URL], up["key"]):
            time.sleep(4)
    finally:
        readings = recorder.stop()
    state = on(up, "main", "sh", "-c", f"systemctl is-active {RECORD_UNIT} || true").strip()
    assert state in ("inactive", "unknown"), state  # stopped, and collected
    assert len(readings) >= 6 and recorder.failures == 0
    summary = usage.summarize(readings, probe.roles, interval=0.5)
    for name, figures in summary["nodes"].items():
        assert figures["cpu_peak_percent"] > 0 and figures["memory_peak_bytes"] > 0, name
        assert figures["received_bytes"] > 0 and figures["sent_bytes"] > 0, name
    assert summary["kv_cache"] is not None and summary["kv_cache"]["peak_ratio"] > 0
    reply = probe.complete({"prompt": "Hello", "n_predict": 4, "ignore_eos": True}, 120)
    assert reply["timings"]["predicted_n"] == 4


def test_the_api_answers_only_requests_that_carry_the_key(up) -> None:
    """The key reaches llama-server as a systemd credential (ImportCredential from root's
    /etc/credstore): a request without it, or with another, is refused 401; with it, answered;
    /health answers anyone (the balancers' checks). The key is in no user data, environment
    file or command line on the node."""
    url = up["contract"][outputs.LLAMA_SERVER_URL]
    for headers in ({}, {"Authorization": "Bearer not-the-key"}):
        with pytest.raises(urllib.error.HTTPError) as refused:
            complete(url, headers=headers)
        assert refused.value.code == 401
    assert complete(url, headers=up["key"])[1]
    with urllib.request.urlopen(f"{url}/health", timeout=10) as health:
        assert health.status == 200
    key = up["key"]["Authorization"].removeprefix("Bearer ")
    entry = up["spec"].node("main").machine
    assert entry is not None
    machine_dir = Path(entry.directory)
    assert key not in (machine_dir / "user-data").read_text(errors="replace")
    assert key not in on(up, "main", "cat", "/etc/llama-rpc/node.env")
    assert key not in on(up, "main", "sh", "-c", "cat /proc/$(pidof llama-server)/cmdline")
    assert key not in on(up, "main", "sh", "-c", "cat /proc/$(pidof llama-server)/environ")
    listed = on(
        up, "main", "stat", "-c", "%U %a", "/etc/credstore", "/etc/credstore/llama-rpc-api-key"
    )
    assert listed.split() == ["root", "700", "root", "600"]


def test_greedy_completion_through_machines_equals_one_node(up) -> None:
    through_machines = complete(up["contract"][outputs.LLAMA_SERVER_URL], headers=up["key"])
    bin_dir = build_prefix(up["options"].cache) / up["spec"].commit / "bin"
    assert through_machines[1] and through_machines == one_node_completion(
        bin_dir, up["options"].model
    )
    up["completion"] = through_machines


def test_the_build_step_ran_and_found_the_build_complete(up) -> None:
    for status in cluster.read_status(up["spec"]).values():
        assert status["build_skipped"] is True
    log = on(up, "r2w1", "journalctl", "-u", BOOT_UNIT, "-o", "cat", "--no-pager")
    assert "already built" in log


# What the clients of the worker test send through the balancer, one after another.
THROUGH_THE_BALANCER = {"prompt": "Once upon a time", "temperature": 0, "n_predict": 32,
                        "cache_prompt": False}  # fmt: skip


def restarts(up: dict[str, Any], name: str, unit: str) -> int:
    return int(unit_state(up, name, unit)["NRestarts"])


class Clients:
    """Two clients sending requests through the balancer one after another from the client's
    namespace, one slot a group, so that both groups are busy; each request's row (its start
    and end, the group that answered, the status) read with ``rows``."""

    def __init__(self, up: dict[str, Any], directory: Path):
        self.stop = directory / "stop"
        self.logs = [directory / f"client{i}.jsonl" for i in range(2)]
        client = completion_client(
            up["contract"][outputs.BALANCER_URL], THROUGH_THE_BALANCER, count=-1, stop=self.stop,
            timeout=600, key_file=up["spec"].api_key_file,
        )  # fmt: skip
        self.running = [
            subprocess.Popen([*exec_prefix(up["client"]), *client], stdout=log.open("w"))
            for log in self.logs
        ]

    def rows(self) -> list[dict[str, Any]]:
        return [json.loads(line) for log in self.logs for line in log.read_text().splitlines()]

    def end(self) -> list[dict[str, Any]]:
        """Stop sending (each client ends its request in hand) and every request's row."""
        self.stop.touch()
        for running in self.running:
            running.wait(timeout=650)
        return self.rows()


def test_systemd_restarts_a_killed_worker_and_the_main_serves_again(
    up: dict[str, Any], tmp_path: Path
) -> None:
    """Two clients send requests through the balancer, one slot a group, so both groups are
    busy. Group 1's worker is killed (SIGKILL) while group 1 answers one: its main node's
    llama-server aborts on its next RPC (llama.cpp #26724) and systemd restarts both. The
    balancer sends the request group 1 had open to group 2 (waiting for its slot), takes group 1
    out until it serves again, and no request fails; then group 1 answers again, the same greedy
    text as before."""
    balancer = up["balancer"]
    worker, main = ROLE_UNIT["worker"], ROLE_UNIT["main"]
    before = {"w1": restarts(up, "w1", worker), "main": restarts(up, "main", main)}
    clients = Clients(up, tmp_path)
    rows = clients.rows

    def state(group: str) -> str:
        return str(balancer.group_states()[group])

    def open_on(group: str) -> int:
        return next(int(r["scur"] or 0) for r in balancer.stats() if r["svname"] == group)

    try:
        wait_for(lambda: {r["group"] for r in rows()} >= {"group1", "group2"}, 120, "both answer")
        wait_for(lambda: open_on("group1") > 0, 60, "a request open on group 1")
        on(up, "w1", "systemctl", "kill", "--signal=SIGKILL", worker)
        # From when the kill has landed: a request that group 1 finished while the command was
        # on its way is not one sent during the failure.
        killed_at = time.monotonic()
        wait_for(lambda: restarts(up, "w1", worker) > before["w1"], 120, "the worker restarted")
        wait_for(lambda: restarts(up, "main", main) > before["main"], 120, "the main restarted")
        # The last moment group 1 was seen out of rotation: the balancer may put it back up to
        # a poll before this loop sees it, and a request it answers then is not one sent during
        # the failure.
        seen_out = [killed_at]

        def back_up() -> bool:
            if state("group1") == "UP":
                return True
            seen_out.append(time.monotonic())
            return False

        wait_for(back_up, 600, "group 1 checked up again")
        back_at = time.monotonic()
        wait_for(
            lambda: any(r["group"] == "group1" and r["start"] > back_at for r in rows()),
            120,
            "group 1 answering again",
        )
    finally:
        answered = clients.end()
    during = [r for r in answered if killed_at < r["start"] and r["end"] < seen_out[-1]]
    print(
        f"{len(answered)} requests; group 1 back {back_at - killed_at:.1f} s after its worker "
        f"was killed; {len(during)} meanwhile, answered by {sorted({r['group'] for r in during})}"
    )
    assert [r for r in answered if r["status"] != 200] == []
    assert during and {r["group"] for r in during} == {"group2"}
    wait_serving(up)
    assert complete(up["contract"][outputs.LLAMA_SERVER_URL], headers=up["key"]) == up["completion"]


def test_a_rebooted_worker_and_main_come_back_without_rebuilding_or_downloading(
    up: dict[str, Any], tmp_path: Path
) -> None:
    """Group 1's worker, then its main node, rebooted while two clients keep both groups busy
    through the balancer: no request fails (group 2 answers what group 1 could not), and group 1
    comes back from its disks."""
    spec = up["spec"]
    instances = on(up, "main", "ls", "/var/lib/cloud/instances").split()
    clients = Clients(up, tmp_path)
    try:
        wait_for(lambda: {r["group"] for r in clients.rows()} >= {"group1", "group2"}, 120,
                 "both answer")  # fmt: skip
        rebooted_at = time.monotonic()
        for name in ("w1", "main"):
            access.reboot(spec, name)
        wait_serving(up, timeout=900)
        served_at = time.monotonic()
    finally:
        answered = clients.end()
    assert [r for r in answered if r["status"] != 200] == []
    assert [r for r in answered if rebooted_at < r["start"] and r["end"] < served_at]
    statuses = cluster.read_status(spec)
    assert statuses["main"]["download_skipped"] is True
    for status in statuses.values():
        assert status["build_skipped"] is True
    # The same instance: cloud-init ran its once-per-instance steps once.
    assert on(up, "main", "ls", "/var/lib/cloud/instances").split() == instances
    assert on(up, "main", "journalctl", "--list-boots", "--no-pager").count("\n") >= 2
    assert complete(up["contract"][outputs.LLAMA_SERVER_URL], headers=up["key"]) == up["completion"]


def test_metrics_come_back_after_a_reboot_behind_their_firewall(up) -> None:
    """The rebooted nodes (the test before) start their exporter again, its table first."""
    for name in ("main", "w1"):
        ip = ip_of(up, name)
        wait_for(  # asked by the main node, the one node each exporter answers
            lambda ip=ip: port_answers(access.exec_argv(up["spec"], "main", []), ip, METRICS_PORT),
            120,
            f"{name}'s exporter after its reboot",
        )
        assert "llama_rpc_metrics" in on(up, name, "nft", "list", "tables")
        journal = on(up, name, "journalctl", "-b", "-u", "prometheus-node-exporter", "-o", "cat")
        assert "Listening on" in journal and f"address={ip}:{METRICS_PORT}" in journal, journal


# Each bad boot input that tests/boot/test_scripts.py covers and that a node's settings can carry,
# given to the main node's boot under systemd: (settings, words of the error, final). A final
# error stops the unit (exit 78, RestartPreventExitStatus=); any other is retried.
OTHER_COMMIT = "1" * 40
BAD_BOOTS = [
    ({"LLAMA_CPP_COMMIT": "0c1e570"}, "not a full 40-character commit", True),
    (
        {"LLAMA_CPP_COMMIT": OTHER_COMMIT, "LLAMA_CPP_SOURCE": "/etc"},
        "is not a llama.cpp source tree",
        True,
    ),
    ({"MODEL_URLS": ""}, "MODEL_URLS", True),
    ({"MODEL_SHA256": "0" * 64 + " " + "1" * 64}, "give one per part", True),
    ({"MODEL_SHA256": "0" * 64}, "checksum mismatch", True),
    ({"MODEL_URLS": "file:///srv/models/"}, "does not end in a file name", True),
    (
        {"MODEL_URLS": "file:///srv/models/a/x.gguf file:///srv/models/b/x.gguf"},
        "both save as",
        True,
    ),
    (
        {"MODEL_URLS": "http://127.0.0.1:9/model.gguf", "DOWNLOAD_ATTEMPTS": "1"},
        "127.0.0.1:9",
        False,
    ),
]


def test_bad_boot_inputs_fail_under_systemd_as_designed(up) -> None:
    env_file = VM_PATHS.env_file
    good = on(up, "main", "cat", env_file)
    try:
        for settings, words, final in BAD_BOOTS:
            override = "".join(f"{key}='{value}'\n" for key, value in settings.items())
            on(up, "main", "tee", env_file, stdin=good + override)
            on(up, "main", "systemctl", "restart", "--no-block", BOOT_UNIT)

            def failed(final: bool = final) -> dict[str, str] | None:
                state = unit_state(up, "main", BOOT_UNIT)
                if final and state["ActiveState"] == "failed":
                    return state
                if not final and state["SubState"] == "auto-restart":
                    return state
                return None

            state = wait_for(failed, 180, f"the boot failing on {settings}")
            status = cluster.read_status(up["spec"])["main"]
            assert status["phase"] == "failed", (settings, status)
            assert words in status["last_error"], (settings, status["last_error"])
            if final:
                assert state["ExecMainStatus"] == "78", (settings, state)
            else:
                assert state["ActiveState"] == "activating", (settings, state)
            shown = subprocess.run(
                access.exec_argv(up["spec"], "main", ["systemctl", "status", BOOT_UNIT]),
                capture_output=True, text=True, check=False,
            ).stdout  # fmt: skip
            assert ("failed" if final else "auto-restart") in shown, shown
    finally:
        on(up, "main", "tee", env_file, stdin=good)
        on(up, "main", "systemctl", "restart", "--no-block", BOOT_UNIT, ROLE_UNIT["main"])
    wait_serving(up)
    assert complete(up["contract"][outputs.LLAMA_SERVER_URL], headers=up["key"]) == up["completion"]


def test_a_failed_up_stops_every_machine_and_keeps_their_journals(up) -> None:
    """A main node whose model fails its checksum: `up` names the node and the error, with its
    journal; no machine runs and no root stays mounted; the journal is still read from the host
    until `down`."""
    options = up["options"]
    broken = dataclasses.replace(
        options, cluster_id=f"{options.cluster_id}f", cidr="10.214.99.0/24", model_sha256="0" * 64,
        replicas=1,
    )  # fmt: skip
    with pytest.raises(LocalClusterError) as failed:
        cluster.up(broken, timeout=600)
    message = str(failed.value)
    assert message.startswith("node main failed: checksum mismatch"), message
    assert "llama-rpc-boot.service" in message  # the journal's lines
    spec = ClusterSpec.load(options.cache, broken.cluster_id)
    try:
        for node in spec.nodes:
            machine_ = node.booted()
            assert not machine_.running() and not machine_.root.is_mount()
        journal = subprocess.run(
            access.journal_argv(spec, "main", ["-u", BOOT_UNIT, "-o", "cat"]),
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert "checksum mismatch" in journal
        assert cluster.read_status(spec)["main"]["phase"] == "failed"
    finally:
        assert cluster.down(options.cache, broken.cluster_id)
    assert not Path(f"/run/netns/lrc-{broken.cluster_id}-main").exists()
