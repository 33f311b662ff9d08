"""Replicas on the local cluster: serving groups behind HAProxy, health-checked on /health.

The fast tests check the settings, the balancer's configuration (HAProxy's own ``-c``) and its
health checks against stand-in servers on loopback. The netns tier brings up two groups of a
main node and one worker serving the generated model, and sends requests from a namespace of its
own on the VPC bridge: both groups answer; one group's main node is killed, and then its worker,
and every request is still answered while it comes back; each group's workers take RPC from their
own main only.
Traffic goes only to loopback and to the namespaces these tests create.
"""

from __future__ import annotations

import dataclasses
import http.server
import ipaddress
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from infra.boot.balancer import SERVED_BY_HEADER, balancer_boot, group_server_name
from infra.cli.local import main
from infra.core import layout, outputs, sizing
from infra.core.limits import MAX_REPLICAS, MAX_WORKERS, SERVER_PORT
from infra.local import balancer as lb
from infra.local import cluster
from infra.local import options as local_options
from infra.local.netns import MAX_INTERFACE_NAME, VpcNetwork, exec_prefix, namespace_pids
from infra.local.nodes import node_short_name
from infra.local.options import LocalClusterError, UpOptions, plan_placement, state_dir
from infra.local.spec import BALANCER_NODE, ClusterSpec, api_key_header
from tests.conftest import (
    completion_client,
    free_port,
    one_plus_two,
    port_answers,
    require_netns,
    require_tool,
)
from tests.models.test_models import write_gguf

# What the clients send (tests.conftest.completion_client): greedy, no cached prompt reused.
BODY = {"prompt": "Hello world, this is", "temperature": 0, "cache_prompt": False}


# --- settings: refused before anything starts ---------------------------------------------


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_gguf(tmp_path / "m.gguf")


def test_a_cidr_too_small_for_the_groups_names_both_flags(tmp_path: Path, model: Path) -> None:
    """Two groups of a main and two workers reach .32: a /27 ends at .31."""
    options = UpOptions(
        workers=2, model=model, source=tmp_path, cache=tmp_path / "cache", cidr="10.9.8.0/27",
        replicas=2,
    )  # fmt: skip
    with pytest.raises(LocalClusterError) as refused:
        cluster.up(options)
    assert str(refused.value) == (
        "--cidr 10.9.8.0/27 --replicas 2: the last group's nodes reach 10.9.8.32, beyond the "
        "private subnet 10.9.8.0/27; give a /26 or larger --cidr, or fewer --replicas or --workers"
    )
    assert not state_dir(options.cache, options.cluster_id).exists()
    # The same groups with one worker each end at .31, the broadcast address: still refused.
    with pytest.raises(LocalClusterError, match="give a /26 or larger"):
        cluster.up(dataclasses.replace(options, workers=1))


def test_without_haproxy_replicas_name_the_install_step(
    monkeypatch, tmp_path: Path, model: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    options = UpOptions(
        workers=1, model=model, source=tmp_path, cache=tmp_path / "cache", netns=False, replicas=2
    )
    with pytest.raises(LocalClusterError) as refused:
        cluster.up(options)
    assert "run scripts/install-deps (it installs Debian's haproxy package)" in str(refused.value)
    assert not state_dir(options.cache, options.cluster_id).exists()


def test_every_node_name_fits_an_interface_name() -> None:
    names = [node_short_name(i, g) for g in range(MAX_REPLICAS) for i in range(MAX_WORKERS + 1)]
    assert len(set(names)) == len(names)
    assert max(len(n) for n in [*names, BALANCER_NODE]) <= MAX_INTERFACE_NAME
    assert names[:2] == ["main", "w1"] and "r2main" in names and "r10w15" in names


def test_every_node_of_every_group_gets_an_equal_share_of_memory(
    monkeypatch, tmp_path: Path
) -> None:
    """48 GiB: two nodes get 24 GiB each; three groups of two nodes 8 GiB each."""
    monkeypatch.setattr(local_options, "machine_memory_bytes", lambda: 48 * 1024**3)
    gguf = write_gguf(tmp_path / "m.gguf", layers=6)
    one = UpOptions(workers=1, model=gguf, source=tmp_path, cache=tmp_path)
    for replicas, share in ((1, 24), (3, 8)):
        options = dataclasses.replace(one, replicas=replicas)
        usable = {s.usable_bytes for s in plan_placement(options).shares}
        assert usable == {sizing.usable_of(share * 1024**3)}


# --- the balancer against stand-in servers on loopback ---------------------------------------


def test_the_rendered_configuration_passes_haproxys_check(tmp_path: Path) -> None:
    haproxy = require_tool("haproxy")
    balancer = lb.Balancer(namespace=None, directory=tmp_path / "lb")
    boot = balancer_boot(ipaddress.IPv4Network("10.9.8.0/24"), ["10.9.8.10", "10.9.8.30"],
                         server_port=8080, slots=2, timeout_seconds=4096)  # fmt: skip
    assert boot is not None
    balancer.write_config(boot)
    lb.check_config(haproxy, balancer.config)
    text = balancer.config.read_text()
    assert "option httpchk GET /health" in text and "http-check expect status 200" in text
    # Each group takes as many requests as it has slots; the rest wait in HAProxy's queue.
    assert "server group1 10.9.8.10:8080 maxconn 2" in text
    assert "server group2 10.9.8.30:8080 maxconn 2" in text
    for timeout in ("client", "server", "queue"):
        assert f"timeout {timeout} 4096s" in text
    assert "bind 10.9.8.5:8080" in text
    broken = tmp_path / "broken.cfg"
    broken.write_text(text.replace("balance leastconn", "balance fewestconn"))
    with pytest.raises(lb.BalancerError, match="is invalid"):
        lb.check_config(haproxy, broken)


@dataclass
class StandIn:
    """A loopback HTTP server playing a group's llama-server: /health answers ``health``; every
    other request is counted and answered with the server's name."""

    name: str
    health: int = 200
    served: list[str] = field(default_factory=list)


def _stand_in(ip: str, port: int, state: StandIn) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def _answer(self, code: int, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._answer(state.health, b"{}")
                return
            state.served.append(self.path)
            self._answer(200, state.name.encode())

    server = http.server.ThreadingHTTPServer((ip, port), Handler)
    # HAProxy closes a health check's connection as soon as it has the status line.
    server.handle_error = lambda request, address: None  # type: ignore[method-assign]
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server


def _wait_for(states: dict[str, str], balancer: lb.Balancer, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while balancer.group_states() != states:
        assert time.monotonic() < deadline, balancer.group_states()
        time.sleep(0.1)


def test_only_groups_that_pass_the_health_check_get_requests(tmp_path: Path) -> None:
    """HAProxy in front of two stand-in groups on loopback: both healthy, both get requests; one
    answering /health with 503 (as llama-server does while it loads) gets none; one gone gets
    none, and a request that meets it before its checks fail is sent to the other."""
    require_tool("haproxy")
    port = free_port()
    groups = [StandIn("group1"), StandIn("group2")]
    mains = ["127.0.0.10", "127.0.0.30"]
    servers = [_stand_in(ip, port, g) for ip, g in zip(mains, groups, strict=True)]
    balancer = lb.Balancer(namespace=None, directory=tmp_path / "lb")
    boot = balancer_boot(ipaddress.IPv4Network("127.0.0.0/24"), mains, server_port=port,
                         slots=1, timeout_seconds=600)  # fmt: skip
    assert boot is not None and boot.listen_ip == "127.0.0.5"
    balancer.write_config(boot)
    balancer.start()
    url = f"http://127.0.0.5:{port}/v1/models"

    def ask(times: int) -> list[str]:
        answers = []
        for _ in range(times):
            with urllib.request.urlopen(url, timeout=10) as response:
                answers.append(response.read().decode())
                assert response.headers[SERVED_BY_HEADER] == answers[-1]
        return answers

    try:
        _wait_for({"group1": "UP", "group2": "UP"}, balancer)
        assert sorted(set(ask(6))) == ["group1", "group2"]
        groups[0].health = 503
        _wait_for({"group1": "DOWN", "group2": "UP"}, balancer)
        before = len(groups[0].served)
        assert set(ask(6)) == {"group2"} and len(groups[0].served) == before
        groups[0].health = 200
        _wait_for({"group1": "UP", "group2": "UP"}, balancer)
        assert "group1" in ask(6)
        servers[1].shutdown()
        servers[1].server_close()
        # Before the checks notice, a refused connection is retried on the other group.
        assert set(ask(6)) == {"group1"}
        _wait_for({"group1": "UP", "group2": "DOWN"}, balancer)
    finally:
        balancer.stop()
        for server in servers:
            server.server_close()
    assert not balancer.alive()


# --- two groups on the VPC bridge --------------------------------------------------------------


@pytest.fixture(scope="module")
def up(llama_source: Path) -> Iterator[dict[str, Any]]:
    require_netns()
    require_tool("haproxy")
    # Keyed: every request through the balancer carries the API key; its checks need none.
    options = one_plus_two(llama_source, "rep", 217, workers=1, replicas=2, api_key=True)
    started = time.monotonic()
    contract = cluster.up(options, timeout=1200)
    print(f"two groups up in {time.monotonic() - started:.1f} s")
    spec = ClusterSpec.load(options.cache, options.cluster_id)
    network = spec.network()
    assert network is not None
    base = str(network.cidr.network_address).rsplit(".", 1)[0]
    client = network.add_outsider("cl", f"{base}.200", network.cidr.prefixlen)
    assert spec.balancer is not None
    balancer = spec.balancer.balancer()
    yield {
        "contract": contract,
        "spec": spec,
        "network": network,
        "options": options,
        "client": client,
        "balancer": balancer,
    }
    assert cluster.down(options.cache, options.cluster_id)
    assert not [ns for ns in network.namespaces() if Path(f"/run/netns/{ns}").exists()]
    assert not Path(f"/run/netns/{client}").exists()
    assert not balancer.alive()


def run_client(
    up: dict[str, Any], count: int, n_predict: int = 8, keyed: bool = True
) -> list[dict[str, Any]]:
    """``count`` requests, one after another, through the balancer from the test's namespace
    (``keyed``: with the cluster's API key)."""
    client = completion_client(
        up["contract"][outputs.BALANCER_URL], {**BODY, "n_predict": n_predict}, count=count,
        key_file=up["spec"].api_key_file if keyed else None,
    )  # fmt: skip
    result = subprocess.run(
        [*exec_prefix(up["client"]), *client],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    return [json.loads(line) for line in result.stdout.splitlines()]


def start_client(up: dict[str, Any], stop: Path, log: Path) -> subprocess.Popen[bytes]:
    """Requests through the balancer, one after another, until ``stop`` exists."""
    client = completion_client(
        up["contract"][outputs.BALANCER_URL], {**BODY, "n_predict": 32}, count=-1, stop=stop,
        key_file=up["spec"].api_key_file,
    )  # fmt: skip
    return subprocess.Popen(
        [*exec_prefix(up["client"]), *client], stdout=log.open("w"), stderr=subprocess.STDOUT
    )


def predicted_tokens(up: dict[str, Any], main_ip: str) -> int:
    """llama-server's own count of tokens generated, read from its /metrics."""
    key = api_key_header(up["spec"])["Authorization"]
    result = subprocess.run(
        [*exec_prefix(up["client"]), "curl", "-s", "--max-time", "5", "--header", "@-",
         f"http://{main_ip}:{SERVER_PORT}/metrics"],
        input=f"Authorization: {key}\n", capture_output=True, text=True, check=True,
    )  # fmt: skip
    for line in result.stdout.splitlines():
        if line.startswith("llamacpp:tokens_predicted_total "):
            return int(float(line.split()[1]))
    raise AssertionError(f"no tokens_predicted_total in {main_ip}'s metrics")


@pytest.mark.slow
@pytest.mark.netns
def test_the_contract_lists_each_group_and_the_balancer(up) -> None:
    contract, network = up["contract"], up["network"]
    subnet = layout.private_subnet(network.cidr)
    base = str(subnet.network_address).rsplit(".", 1)[0]
    assert set(contract) == set(outputs.ALL_KEYS)
    assert contract[outputs.REPLICAS] == 2
    assert contract[outputs.BALANCER_URL] == f"http://{base}.5:{SERVER_PORT}"
    groups = contract[outputs.GROUPS]
    assert [set(g) for g in groups] == [set(outputs.GROUP_KEYS)] * 2
    for number, group in enumerate(groups):
        main_ip, *worker_ips = layout.node_ips(subnet, 1, group=number)
        assert group[outputs.MAIN_PRIVATE_IP] == main_ip
        assert group[outputs.WORKER_PRIVATE_IPS] == worker_ips
        assert group[outputs.RPC_SERVERS] == f"{worker_ips[0]}:50052"
        assert group[outputs.LLAMA_SERVER_URL] == f"http://{main_ip}:{SERVER_PORT}"
    assert groups[1][outputs.MAIN_PRIVATE_IP] == f"{base}.30"
    assert groups[1][outputs.MAIN_INSTANCE_ID] == network.namespace("r2main")
    # The top-level node keys are the first group's.
    assert {k: contract[k] for k in outputs.GROUP_KEYS} == groups[0]


@pytest.mark.slow
@pytest.mark.netns
def test_requests_through_the_balancer_reach_both_groups(up, capsys) -> None:
    """Eight requests through the balancer: every one answered with the same greedy text, both
    groups answering; each main node's own token count grows by exactly what it answered."""
    mains = {g[outputs.MAIN_PRIVATE_IP] for g in up["contract"][outputs.GROUPS]}
    assert len(mains) == 2
    by_group = {
        group_server_name(i): g[outputs.MAIN_PRIVATE_IP]
        for i, g in enumerate(up["contract"][outputs.GROUPS])
    }
    before = {name: predicted_tokens(up, ip) for name, ip in by_group.items()}
    rows = run_client(up, 8)
    assert [r["status"] for r in rows] == [200] * 8, rows
    assert len({r["content"] for r in rows}) == 1
    assert {r["group"] for r in rows} == {"group1", "group2"}
    for name, ip in by_group.items():
        answered = sum(r["tokens"] for r in rows if r["group"] == name)
        assert predicted_tokens(up, ip) - before[name] == answered, name
    # `status` shows each group as the balancer's checks see it.
    capsys.readouterr()
    assert main(["status", "--id", up["options"].cluster_id]) == 0
    shown = capsys.readouterr().out
    assert "group 1 (balancer: UP, check L7OK" in shown
    assert "group 2 (balancer: UP, check L7OK" in shown
    assert "  r2main serving" in shown


@pytest.mark.slow
@pytest.mark.netns
def test_through_the_balancer_a_request_without_the_key_is_refused(up) -> None:
    """The balancer passes the key on and the groups check it: without it every request is
    refused 401 by whichever group gets it, while the balancer's checks (/health) keep both
    groups up."""
    rows = run_client(up, 4, keyed=False)
    assert [r["status"] for r in rows] == [401] * 4, rows
    assert {r["group"] for r in rows} <= {"group1", "group2", None}
    assert [r["status"] for r in run_client(up, 2)] == [200, 200]
    balancer: lb.Balancer = up["balancer"]
    groups = [row for row in balancer.stats() if row["svname"].startswith("group")]
    assert [row["status"] for row in groups] == ["UP", "UP"]


@pytest.mark.slow
@pytest.mark.netns
def test_each_groups_workers_take_rpc_from_their_own_main_only(up) -> None:
    network: VpcNetwork = up["network"]
    groups = up["contract"][outputs.GROUPS]
    worker_1 = groups[0][outputs.WORKER_PRIVATE_IPS][0]
    worker_2 = groups[1][outputs.WORKER_PRIVATE_IPS][0]
    main_1, main_2 = network.namespace("main"), network.namespace("r2main")
    assert port_answers(exec_prefix(main_1), worker_1, 50052)  # the controls
    assert port_answers(exec_prefix(main_2), worker_2, 50052)
    assert not port_answers(exec_prefix(main_2), worker_1, 50052)
    assert not port_answers(exec_prefix(main_1), worker_2, 50052)
    assert not port_answers(exec_prefix(network.namespace(BALANCER_NODE)), worker_1, 50052)
    # Both groups' workers serve, and each main node's API is open inside the VPC (the
    # balancer's checks reach it).
    assert port_answers(exec_prefix(up["client"]), groups[1][outputs.MAIN_PRIVATE_IP], SERVER_PORT)


def processes(namespace: str, name: str) -> list[int]:
    """The processes named ``name`` (their comm, at most 15 characters) in ``namespace``."""
    return [
        pid
        for pid in namespace_pids(namespace)
        if Path(f"/proc/{pid}/comm").read_text().strip() == name
    ]


def llama_servers(namespace: str) -> list[int]:
    return processes(namespace, "llama-server")


@dataclass
class Outage:
    """What the clients saw while group 1 failed: every request, those open when the killed
    process died and those sent while group 1 was out, the balancer's log meanwhile, and when
    (seconds after the kill) group 1 was checked down and up again."""

    answered: list[dict[str, Any]]
    in_flight: list[dict[str, Any]]
    during: list[dict[str, Any]]
    logged: str
    down_after: float
    up_after: float

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.answered if r["status"] != 200]

    @property
    def redispatched(self) -> list[str]:
        """Requests the balancer sent again to another group."""
        return REDISPATCHED.findall(self.logged)

    @property
    def error_lines(self) -> list[str]:
        """The balancer's log lines of requests answered with an error status."""
        return [line for line in self.logged.splitlines() if BALANCER_ERROR.search(line)]


def _through_an_outage(up: dict[str, Any], tmp_path: Path, node: str, process: str) -> Outage:
    """Two clients send requests through the balancer without pause. While group 1 answers one,
    ``process`` on its node ``node`` is killed (SIGKILL); the clients go on until group 1 is
    checked down, up again, and has answered again."""
    network: VpcNetwork = up["network"]
    balancer: lb.Balancer = up["balancer"]
    namespace = network.namespace(node)
    stop = tmp_path / "stop"
    logs = [tmp_path / f"client{i}.jsonl" for i in range(2)]
    logged_before = balancer.log.stat().st_size  # earlier tests' requests are not this one's
    clients = [start_client(up, stop, log) for log in logs]

    def rows() -> list[dict[str, Any]]:
        lines = [line for log in logs for line in log.read_text().splitlines()]
        return [json.loads(line) for line in lines]

    def wait(what: str, done: Any, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"{what} after {timeout} s: {rows()[-5:]}"
            assert all(c.poll() is None for c in clients), "a client stopped"
            time.sleep(0.05)
        return time.monotonic()

    try:
        both = {"group1", "group2"}
        wait("both groups answering", lambda: {r["group"] for r in rows()} >= both, 60)
        (killed,) = processes(namespace, process)
        # Kill while group 1 has a request open.
        wait("a request open on group 1", lambda: _open_on(balancer, "group1") > 0, 30)
        killed_at = time.monotonic()
        os.kill(killed, signal.SIGKILL)
        # The process dies, and its sockets close, a little after the signal is sent.
        gone_at = wait("the killed process gone", lambda: not _alive(killed), 10)
        down_at = wait("group 1 checked down", lambda: _state(balancer, "group1") == "DOWN", 60)
        back_at = wait("group 1 checked up", lambda: _state(balancer, "group1") == "UP", 300)
        wait(
            "group 1 answering again",
            lambda: any(r["group"] == "group1" and r["start"] > back_at for r in rows()),
            60,
        )
    finally:
        stop.touch()
        for client in clients:
            client.wait(timeout=150)
    answered = rows()
    outage = Outage(
        answered=answered,
        in_flight=[r for r in answered if r["start"] < gone_at and r["end"] > killed_at],
        during=[r for r in answered if gone_at < r["start"] and r["end"] < back_at],
        logged=balancer.log.read_bytes()[logged_before:].decode(errors="replace"),
        down_after=down_at - killed_at,
        up_after=back_at - killed_at,
    )
    print(
        f"{process} killed on {node}: {len(answered)} requests, {len(outage.failed)} failed; "
        f"{len(outage.in_flight)} open while it died ({(gone_at - killed_at) * 1000:.0f} ms after "
        f"the signal), answered by {[r['group'] for r in outage.in_flight]}; group 1 checked "
        f"down {outage.down_after:.1f} s after the kill, up again after {outage.up_after:.1f} s; "
        f"{len(outage.during)} requests meanwhile, answered by "
        f"{sorted({str(r['group']) for r in outage.during})}; {len(outage.redispatched)} sent "
        f"again by the balancer; failed: {outage.failed}, in its log: {outage.error_lines}"
    )
    return outage


def _assert_no_request_lost(outage: Outage) -> None:
    """Every request answered, by the other group while group 1 was out; the one group 1 had
    open when it failed sent again (the balancer's log marks it)."""
    assert outage.in_flight  # two clients: one request or two are always open
    assert not outage.failed and not outage.error_lines, (outage.failed, outage.error_lines)
    assert outage.redispatched
    assert all(r["content"] for r in outage.answered)
    assert outage.during and {r["group"] for r in outage.during} == {"group2"}


@pytest.mark.slow
@pytest.mark.netns
def test_killing_one_groups_main_keeps_every_request_answered(
    up: dict[str, Any], tmp_path: Path
) -> None:
    """Group 1's main node's llama-server is killed while it answers a request. Every request
    is answered: those that meet the dead group (the one in flight, and any sent before it is
    taken out) are sent again to group 2 by the balancer, which reads each request whole before
    sending it so that it can; group 1's supervisor restarts it, it loads, passes its checks
    again and answers again."""
    main_ns = up["network"].namespace("main")
    (before,) = llama_servers(main_ns)
    _assert_no_request_lost(_through_an_outage(up, tmp_path, "main", "llama-server"))
    # The supervisor started a new llama-server in group 1's main node, which serves.
    (restarted,) = llama_servers(main_ns)
    assert restarted != before
    assert cluster.read_status(up["spec"])["main"]["phase"] == "serving"


# An HTTP log line's connection counts: actconn/feconn/beconn/srv_conn/retries, "+" marking a
# request sent again to another server.
REDISPATCHED = re.compile(r" \d+/\d+/\d+/\d+/\+\d+ ")
# An HTTP log line of a request answered with an error status (HAProxy's own or a server's).
BALANCER_ERROR = re.compile(r'api \S+ [-\d/]+ [45]\d\d .*"(?:GET|POST) ')


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _state(balancer: lb.Balancer, group: str) -> str:
    return balancer.group_states()[group]


def _open_on(balancer: lb.Balancer, group: str) -> int:
    return next(int(r["scur"] or 0) for r in balancer.stats() if r["svname"] == group)
