"""The spend guard (``llama-rpc-guard``) and Azure's deallocation (``llama-rpc-deallocate``), run
on this machine against loopback stand-ins: llama-server's recorded ``/metrics``, a listening RPC
port, and the Azure metadata service and Resource Manager answering with their documented
responses. The power-off is a stand-in command that records its time; the machines tier
(``tests/local/test_spend_guard.py``) powers real machines off."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, SCRIPTS, free_port, require_tool

METRICS = REPO / "tests" / "fixtures" / "metrics"
AZURE = REPO / "tests" / "fixtures" / "azure"
BEFORE = (METRICS / "llama-server-1.prom").read_text()  # n_decode_total 0
AFTER = (METRICS / "llama-server-2.prom").read_text()  # one completion later: 25
KEY = "k" * 32


class _Server(http.server.BaseHTTPRequestHandler):
    """llama-server's /metrics as the test sets it (``None``: not answering, as while loading),
    refusing a request without the key when one is set; or Azure, recording each request."""

    def do_GET(self) -> None:
        state = self.server.state  # type: ignore[attr-defined]
        state["requests"].append(("GET", self.path, dict(self.headers)))
        if "azure" in state:
            self._azure(state)
            return
        if state.get("key") and self.headers.get("Authorization") != f"Bearer {state['key']}":
            self._send(401, b"{}")
        elif state["metrics"] is None:
            self._send(503, b'{"error": "Loading model"}')
        else:
            self._send(200, state["metrics"].encode())

    def do_POST(self) -> None:
        state = self.server.state  # type: ignore[attr-defined]
        state["requests"].append(("POST", self.path, dict(self.headers)))
        self._send(state["azure"]["deallocate"], b"")

    def _azure(self, state: dict[str, Any]) -> None:
        if self.headers.get("Metadata") != "true":
            self._send(400, b'{"error": "Bad request: Required metadata header not specified"}')
        elif self.path.startswith("/metadata/identity/oauth2/token"):
            self._send(200, (AZURE / "imds-token.json").read_bytes())
        else:
            self._send(200, (AZURE / "imds-instance-compute.json").read_bytes())

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[int, dict[str, Any]]]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    httpd.state = {"metrics": BEFORE, "requests": []}  # type: ignore[attr-defined]
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    yield httpd.server_address[1], httpd.state  # type: ignore[attr-defined]
    httpd.shutdown()


class Guard:
    """The guard as its unit runs it, with a recording stand-in for the power-off."""

    def __init__(self, tmp_path: Path, **settings: str):
        self.off = tmp_path / "powered-off"
        stand_in = tmp_path / "poweroff"
        stand_in.write_text(f"#!/bin/sh\ndate +%s.%N > {self.off}\n")
        stand_in.chmod(0o755)
        (tmp_path / "run").mkdir(exist_ok=True)
        (tmp_path / "data").mkdir(exist_ok=True)
        self.status_file = tmp_path / "data" / "status.json"
        self.env = {
            "PATH": os.environ["PATH"],
            "INVOCATION_ID": "0" * 32,  # systemd's, for each run of a unit
            "LLAMA_RPC_ENV_FILE": str(tmp_path / "absent.env"),
            "LLAMA_DATA_DIR": str(tmp_path / "data"),
            "RUNTIME_DIRECTORY": str(tmp_path / "run"),
            "LLAMA_POWEROFF": str(stand_in),
            "LLAMA_NODE_IP": "127.0.0.1",
            "GUARD_INTERVAL_SECONDS": "0.2",
            "STOP_AFTER_IDLE_SECONDS": "0",
            "STOP_AFTER_SECONDS": "0",
            **settings,
        }
        self.started = time.time()
        self.process = subprocess.Popen(
            ["bash", str(SCRIPTS / "llama-rpc-guard")], env=self.env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip

    def powered_off_after(self, timeout: float) -> float | None:
        """Seconds from the start to the power-off, or None if none came within ``timeout``."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        if not self.off.exists():
            return None
        return float(self.off.read_text()) - self.started

    def status(self) -> dict[str, Any]:
        return json.loads(self.status_file.read_text()) if self.status_file.exists() else {}

    def stop(self) -> str:
        if self.process.poll() is None:
            self.process.kill()
        return self.process.communicate()[1]


def test_an_idle_main_node_powers_off_after_the_idle_time_and_says_why(server, tmp_path) -> None:
    port, _ = server
    guard = Guard(tmp_path, LLAMA_ROLE="main", SERVER_PORT=str(port), STOP_AFTER_IDLE_SECONDS="2")
    after = guard.powered_off_after(timeout=20)
    log = guard.stop()
    assert after is not None, log
    assert 2 <= after < 6, after
    status = guard.status()
    assert status["last_stop_reason"].startswith("idle: 2s"), status
    assert abs(status["last_stopped_at"] - time.time()) < 30
    assert "stopping this node: idle" in log


def test_a_request_in_hand_or_a_decode_keeps_the_main_node_up(server, tmp_path) -> None:
    port, state = server
    state["metrics"] = BEFORE.replace("requests_processing 0", "requests_processing 1")
    guard = Guard(tmp_path, LLAMA_ROLE="main", SERVER_PORT=str(port), STOP_AFTER_IDLE_SECONDS="2")
    try:
        assert guard.powered_off_after(timeout=3) is None, "a busy slot is not idle"
        state["metrics"] = BEFORE.replace("requests_deferred 0", "requests_deferred 2")
        assert guard.powered_off_after(timeout=3) is None, "a queued request is not idle"
        state["metrics"] = BEFORE  # nothing in hand: the idle time starts from here
        time.sleep(1)
        state["metrics"] = AFTER  # a completion was decoded since the last look
        freed = time.time()
        after = guard.powered_off_after(timeout=20)
    finally:
        log = guard.stop()
    assert after is not None, log
    assert guard.started + after - freed >= 2, "the idle time runs from the last decode"


def test_a_main_node_that_does_not_serve_yet_is_never_idle(server, tmp_path) -> None:
    port, state = server
    state["metrics"] = None  # 503 Loading model
    guard = Guard(tmp_path, LLAMA_ROLE="main", SERVER_PORT=str(port), STOP_AFTER_IDLE_SECONDS="1")
    try:
        assert guard.powered_off_after(timeout=2.5) is None
        state["metrics"] = BEFORE
        assert guard.powered_off_after(timeout=20) is not None
    finally:
        guard.stop()


def test_a_main_node_that_never_serves_is_idle_after_its_serve_deadline(tmp_path) -> None:
    """A server that cannot start (a flag it refuses at start, a model it cannot load) never
    answers: past the serve deadline the node counts as idle, and stops."""
    guard = Guard(
        tmp_path, LLAMA_ROLE="main", SERVER_PORT=str(free_port()), STOP_AFTER_IDLE_SECONDS="1",
        SERVE_DEADLINE_SECONDS="2",
    )  # fmt: skip
    after = guard.powered_off_after(timeout=20)
    log = guard.stop()
    assert after is not None, log
    assert 3 <= after < 8, after  # the deadline, then the idle time
    assert guard.status()["last_stop_reason"].startswith("idle: 1s"), guard.status()


def test_a_server_that_stops_answering_gets_the_serve_deadline_again(server, tmp_path) -> None:
    """The deadline runs from the server's last answer, so a restart after serving (a new
    load) is not cut short, and a server that never comes back does not keep the node on."""
    port, state = server
    state["metrics"] = BEFORE.replace("requests_processing 0", "requests_processing 1")
    guard = Guard(
        tmp_path, LLAMA_ROLE="main", SERVER_PORT=str(port), STOP_AFTER_IDLE_SECONDS="1",
        SERVE_DEADLINE_SECONDS="3",
    )  # fmt: skip
    try:
        assert guard.powered_off_after(timeout=4) is None  # busy, past the deadline from boot
        state["metrics"] = None
        assert guard.powered_off_after(timeout=2) is None  # within 3 s of its last answer
        assert guard.powered_off_after(timeout=20) is not None
    finally:
        guard.stop()


def test_a_worker_its_main_node_never_reaches_is_idle_after_the_deadline(tmp_path) -> None:
    port = free_port()
    with socket.create_server(("127.0.0.1", port)):
        guard = Guard(
            tmp_path, LLAMA_ROLE="worker", RPC_PORT=str(port), STOP_AFTER_IDLE_SECONDS="1",
            SERVE_DEADLINE_SECONDS="2",
        )  # fmt: skip
        after = guard.powered_off_after(timeout=20)
        log = guard.stop()
    assert after is not None, log
    assert 3 <= after < 8, after


def test_the_guard_reads_a_keyed_servers_metrics_with_the_key(server, tmp_path) -> None:
    port, state = server
    state["key"] = KEY
    key_file = tmp_path / "llama-rpc-api-key"
    key_file.write_text(KEY)
    keyless = Guard(tmp_path, LLAMA_ROLE="main", SERVER_PORT=str(port), STOP_AFTER_IDLE_SECONDS="1")
    try:  # refused (401), the server looks unready: never idle
        assert keyless.powered_off_after(timeout=2.5) is None
    finally:
        keyless.stop()
    keyed = Guard(
        tmp_path, LLAMA_ROLE="main", SERVER_PORT=str(port), STOP_AFTER_IDLE_SECONDS="1",
        API_KEY_FILE=str(key_file),
    )  # fmt: skip
    try:
        assert keyed.powered_off_after(timeout=20) is not None
    finally:
        keyed.stop()
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert KEY not in ps


def test_the_deadline_powers_off_from_the_boot_even_while_busy(server, tmp_path) -> None:
    port, state = server
    state["metrics"] = BEFORE.replace("requests_processing 0", "requests_processing 1")
    guard = Guard(
        tmp_path, LLAMA_ROLE="main", SERVER_PORT=str(port), STOP_AFTER_IDLE_SECONDS="600",
        STOP_AFTER_SECONDS="2",
    )  # fmt: skip
    after = guard.powered_off_after(timeout=20)
    guard.stop()
    assert after is not None and 2 <= after < 5, after
    assert guard.status()["last_stop_reason"].startswith("deadline: 2s after boot")
    # A guard restarted later in the same boot keeps the boot's start: due at once.
    again = Guard(tmp_path, LLAMA_ROLE="main", SERVER_PORT=str(port), STOP_AFTER_SECONDS="2")
    after = again.powered_off_after(timeout=20)
    again.stop()
    assert after is not None and after < 1.5, after


def test_a_worker_follows_once_its_main_nodes_connection_is_gone(tmp_path) -> None:
    port = free_port()
    with socket.create_server(("127.0.0.1", port)) as listener:
        guard = Guard(
            tmp_path, LLAMA_ROLE="worker", RPC_PORT=str(port), STOP_AFTER_IDLE_SECONDS="1"
        )
        try:
            # No client yet (its main node is still getting ready): not idle.
            assert guard.powered_off_after(timeout=2.5) is None
            with socket.create_connection(("127.0.0.1", port)):
                accepted, _ = listener.accept()
                assert guard.powered_off_after(timeout=2.5) is None, "a connected worker is busy"
                gone = time.time()  # the guard cannot see the connection gone before this
                accepted.close()
            after = guard.powered_off_after(timeout=20)
        finally:
            log = guard.stop()
    assert after is not None, log
    assert guard.started + after - gone >= 1
    assert guard.status()["last_stop_reason"].startswith("idle: 1s")


def test_the_guard_runs_only_as_its_unit(tmp_path) -> None:
    guard = Guard(tmp_path, LLAMA_ROLE="main", STOP_AFTER_SECONDS="1", INVOCATION_ID="")
    guard.process.wait(timeout=20)
    log = guard.stop()
    assert guard.process.returncode == 78
    assert "llama-rpc-guard.service only" in log
    assert not guard.off.exists()


def test_an_azure_node_deallocates_itself_with_its_own_identity(server, tmp_path) -> None:
    port, state = server
    state["azure"] = {"deallocate": 202}
    endpoint = f"http://127.0.0.1:{port}"
    guard = Guard(
        tmp_path, LLAMA_ROLE="main", SERVER_PORT=str(free_port()), STOP_AFTER_SECONDS="1",
        STOP_BY="azure-deallocate", AZURE_IMDS_ENDPOINT=endpoint, AZURE_ARM_ENDPOINT=endpoint,
        DEALLOCATE_GRACE_SECONDS="0",
    )  # fmt: skip
    after = guard.powered_off_after(timeout=30)
    log = guard.stop()
    assert after is not None, log
    token = json.loads((AZURE / "imds-token.json").read_text())["access_token"]
    compute = json.loads((AZURE / "imds-instance-compute.json").read_text())
    posts = [(path, headers) for method, path, headers in state["requests"] if method == "POST"]
    assert [path for path, _ in posts] == [
        f"{compute['resourceId']}/deallocate?api-version=2024-07-01"
    ]
    assert all(headers["Authorization"] == f"Bearer {token}" for _, headers in posts)
    asked = [path for method, path, _ in state["requests"] if method == "GET"]
    assert any("resource=https%3A%2F%2Fmanagement.azure.com%2F" in path for path in asked)
    assert "deallocation accepted" in log
    assert token not in log


def test_a_refused_deallocation_still_powers_the_node_off_and_says_so(server, tmp_path) -> None:
    port, state = server
    state["azure"] = {"deallocate": 403}  # AuthorizationFailed: no grant on that VM
    endpoint = f"http://127.0.0.1:{port}"
    guard = Guard(
        tmp_path, LLAMA_ROLE="main", SERVER_PORT=str(free_port()), STOP_AFTER_SECONDS="1",
        STOP_BY="azure-deallocate", AZURE_IMDS_ENDPOINT=endpoint, AZURE_ARM_ENDPOINT=endpoint,
        DEALLOCATE_ATTEMPTS="2", DEALLOCATE_RETRY_DELAY="0.2",
    )  # fmt: skip
    after = guard.powered_off_after(timeout=60)
    log = guard.stop()
    assert after is not None, log
    assert "Resource Manager said 403" in log
    assert "not deallocated: powering off" in log
    assert len([r for r in state["requests"] if r[0] == "POST"]) == 2


def _run_deallocate_on_a_worker(
    server: tuple[int, dict[str, Any]], tmp_path: Path, stop_exit: int
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """llama-rpc-deallocate as a worker's guard runs it, with stand-ins for systemctl (exiting
    ``stop_exit``) and nft that record their arguments; the nft commands it ran."""
    port, state = server
    state["azure"] = {"deallocate": 202}
    endpoint = f"http://127.0.0.1:{port}"
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    for name, code in (("systemctl", stop_exit), ("nft", 0)):
        stand_in = bin_dir / name
        stand_in.write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\nexit {code}\n')
        stand_in.chmod(0o755)
    result = subprocess.run(
        ["python3", str(SCRIPTS / "llama-rpc-deallocate")],
        env={
            "PATH": f"{bin_dir}:{os.environ['PATH']}", "LLAMA_ROLE": "worker",
            "AZURE_IMDS_ENDPOINT": endpoint, "AZURE_ARM_ENDPOINT": endpoint,
            "DEALLOCATE_GRACE_SECONDS": "0",
        },
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    ran = calls.read_text().splitlines() if calls.exists() else []
    return result, [line for line in ran if line.startswith("nft ")]


def test_a_worker_lifts_its_egress_rule_and_keeps_its_rpc_source_filter(server, tmp_path) -> None:
    """The table holds the RPC port's source filter too: only the output chain goes."""
    result, nft = _run_deallocate_on_a_worker(server, tmp_path, stop_exit=0)
    assert result.returncode == 0, result.stderr
    assert nft == ["nft delete chain inet llama_rpc output"]


def test_a_worker_whose_rpc_server_did_not_stop_keeps_its_egress_rule(server, tmp_path) -> None:
    """Were the stop to fail, ggml-rpc-server would reach Resource Manager's network: the rule
    stays, and without it the deallocation fails and the guard powers the node off."""
    result, nft = _run_deallocate_on_a_worker(server, tmp_path, stop_exit=1)
    assert nft == []
    assert "did not stop: its egress rule stays" in result.stderr


# --- a balancer node: the real HAProxy, as the balancer node runs it, in front of two groups ---


class _Main(http.server.BaseHTTPRequestHandler):
    """A group's main node as HAProxy sees it: /health 200 once serving (503 while loading), and
    a completion that takes ``seconds`` to generate."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        state = self.server.state  # type: ignore[attr-defined]
        if self.path == "/health":
            self._send(200 if state["serving"] else 503)
            return
        time.sleep(state["seconds"])
        self._send(200)

    def _send(self, code: int) -> None:
        self.send_response(code)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


class _Mains(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # HAProxy closes a health check's connection as soon as it has the status


class Balancer:
    """Two groups' main nodes on loopback addresses of their own and HAProxy in front of them,
    with the configuration and stats socket a guarded balancer node has (``haproxy -db``)."""

    def __init__(self, directory: Path, *, serving: bool) -> None:
        from infra.boot.balancer import BalancerBoot, haproxy_config

        self.port = free_port()
        self.mains: list[http.server.ThreadingHTTPServer] = []
        for address in ("127.0.0.2", "127.0.0.3"):
            main = _Mains((address, self.port), _Main)
            main.state = {"serving": serving, "seconds": 0}  # type: ignore[attr-defined]
            threading.Thread(target=main.serve_forever, args=(0.05,), daemon=True).start()
            self.mains.append(main)
        self.socket = directory / "stats.sock"  # a unix socket's path: 107 bytes at most
        boot = BalancerBoot(
            listen_ip="127.0.0.1", port=self.port, mains=("127.0.0.2", "127.0.0.3"),
            server_port=self.port, slots=1, timeout_seconds=60,
        )  # fmt: skip
        config = directory / "haproxy.cfg"
        config.write_text(haproxy_config(boot, stats_socket=str(self.socket), stats_level="user"))
        self.process = subprocess.Popen(
            [require_tool("haproxy"), "-db", "-f", str(config)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.time() + 10
        while not self.socket.is_socket():
            assert self.process.poll() is None and time.time() < deadline, self.process.stderr
            time.sleep(0.05)

    def serving(self, serving: bool) -> None:
        for main in self.mains:
            main.state["serving"] = serving  # type: ignore[attr-defined]

    def request(self, seconds: float = 0) -> int:
        """A completion through the balancer; its HTTP status (503: no group took it)."""
        for main in self.mains:
            main.state["seconds"] = seconds  # type: ignore[attr-defined]
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as client:
            client.sendall(b"GET /v1/models HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")
            return int(client.recv(64).split()[1])

    def close(self) -> None:
        self.process.kill()
        self.process.wait()
        for main in self.mains:
            main.shutdown()
            main.server_close()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    import shutil
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix="guard-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def serving_balancer(short_dir: Path) -> Iterator[Balancer]:
    balancer = Balancer(short_dir, serving=True)
    yield balancer
    balancer.close()


def balancer_guard(tmp_path: Path, balancer: Balancer, **settings: str) -> Guard:
    from infra.boot.balancer import BACKEND

    return Guard(
        tmp_path, LLAMA_ROLE="balancer", BALANCER_STATS_SOCKET=str(balancer.socket),
        BALANCER_BACKEND=BACKEND, **settings,
    )  # fmt: skip


def wait_until_up(balancer: Balancer) -> None:
    """Both groups passed HAProxy's health checks (two in a row, a second apart)."""
    deadline = time.time() + 10
    while balancer.request() != 200:
        assert time.time() < deadline, "no group came up behind HAProxy"
        time.sleep(0.2)


def test_a_balancer_node_stops_once_no_request_reached_a_group_for_the_idle_time(
    serving_balancer, tmp_path
) -> None:
    wait_until_up(serving_balancer)
    guard = balancer_guard(tmp_path, serving_balancer, STOP_AFTER_IDLE_SECONDS="2")
    try:
        until = time.time() + 3
        while time.time() < until:  # a request every half second: never 2 s idle
            last_sent = time.time()  # the guard cannot see a request before it is sent
            assert serving_balancer.request() == 200
            assert guard.powered_off_after(timeout=0.5) is None, "requests keep it on"
        after = guard.powered_off_after(timeout=20)
    finally:
        log = guard.stop()
    assert after is not None, log
    assert guard.started + after - last_sent >= 2, "the idle time runs from the last request"
    assert guard.status()["last_stop_reason"].startswith("idle: 2s"), guard.status()


def test_a_request_a_group_still_generates_keeps_the_balancer_node_on(
    serving_balancer, tmp_path
) -> None:
    wait_until_up(serving_balancer)
    guard = balancer_guard(tmp_path, serving_balancer, STOP_AFTER_IDLE_SECONDS="1")
    try:
        answered: list[int] = []
        sent = time.time()  # the group answers 5 s after it gets the request
        slow = threading.Thread(target=lambda: answered.append(serving_balancer.request(5)))
        slow.start()
        assert guard.powered_off_after(timeout=4) is None, "a generation in hand is not idle"
        slow.join()
        assert answered == [200]
        after = guard.powered_off_after(timeout=20)
    finally:
        log = guard.stop()
    assert after is not None, log
    assert guard.started + after - sent >= 5 + 1, "the idle time runs from the answer"


def test_requests_no_group_takes_do_not_keep_the_balancer_node_on(
    serving_balancer, tmp_path
) -> None:
    """Every group idle and stopped: HAProxy answers 503 itself, which is no work, so a client
    that keeps knocking does not keep the balancer node (and its bill) on."""
    wait_until_up(serving_balancer)
    guard = balancer_guard(tmp_path, serving_balancer, STOP_AFTER_IDLE_SECONDS="2")
    try:
        assert guard.powered_off_after(timeout=1) is None
        serving_balancer.serving(False)  # the groups' guards stopped them
        gone = time.time()
        while (after := guard.powered_off_after(timeout=0.3)) is None:
            assert time.time() - gone < 20, "knocking kept the balancer on"
            serving_balancer.request()
    finally:
        log = guard.stop()
    assert after is not None, log
    assert guard.started + after - gone >= 2
    assert serving_balancer.request() == 503, "HAProxy, not a group, answered"


def test_a_balancer_node_waits_for_its_groups_to_serve_until_their_deadline(
    short_dir, tmp_path
) -> None:
    """While every group is still building or loading, the balancer node is not idle; past the
    groups' serve deadline, with none ever serving, it is."""
    loading = Balancer(short_dir, serving=False)
    try:
        guard = balancer_guard(
            tmp_path, loading, STOP_AFTER_IDLE_SECONDS="1", SERVE_DEADLINE_SECONDS="2"
        )
        after = guard.powered_off_after(timeout=20)
        log = guard.stop()
        assert after is not None, log
        assert 3 <= after < 8, after  # the deadline, then the idle time
        # A group that comes up within the deadline ends the wait: the idle time runs from it.
        second_boot = tmp_path / "second-boot"
        second_boot.mkdir()
        again = balancer_guard(
            second_boot, loading, STOP_AFTER_IDLE_SECONDS="1", SERVE_DEADLINE_SECONDS="600"
        )
        try:
            assert again.powered_off_after(timeout=2.5) is None, "groups still loading"
            loading.serving(True)
            after = again.powered_off_after(timeout=20)
        finally:
            log = again.stop()
        assert after is not None, log
    finally:
        loading.close()


def test_a_balancer_whose_haproxy_does_not_answer_is_busy_until_the_deadline(
    short_dir, tmp_path
) -> None:
    """HAProxy not installed yet, or restarting: not idle, for the serve deadline after boot."""
    absent = short_dir / "absent.sock"
    guard = Guard(
        tmp_path, LLAMA_ROLE="balancer", BALANCER_STATS_SOCKET=str(absent),
        BALANCER_BACKEND="groups", STOP_AFTER_IDLE_SECONDS="1", SERVE_DEADLINE_SECONDS="2",
    )  # fmt: skip
    after = guard.powered_off_after(timeout=20)
    log = guard.stop()
    assert after is not None, log
    assert 3 <= after < 8, after


def test_a_guard_of_an_unknown_role_refuses_to_run(tmp_path) -> None:
    guard = Guard(tmp_path, LLAMA_ROLE="gateway", STOP_AFTER_IDLE_SECONDS="1")
    guard.process.wait(timeout=20)
    log = guard.stop()
    assert guard.process.returncode == 78
    assert "not main, worker or balancer" in log
