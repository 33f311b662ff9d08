"""The local cluster: the VMs' boot scripts, a real llama.cpp build, real network namespaces.

One cluster (a main node and two workers) is brought up for the module; every check runs against
it. Traffic goes only to loopback and to the namespaces these tests create.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from infra.core import outputs
from infra.local import cluster
from infra.local.netns import VpcNetwork, exec_prefix, namespace_pids
from infra.local.options import LocalClusterError, build_prefix, state_dir
from infra.local.spec import ClusterSpec
from tests.conftest import (
    GREEDY_PROMPT,
    SCRIPTS,
    complete,
    one_node_completion,
    port_answers,
    post,
    tokens_of_length,
)

pytestmark = [pytest.mark.slow, pytest.mark.netns]

PROMPT = GREEDY_PROMPT


@pytest.fixture
def up(cluster_1p2: dict[str, Any]) -> dict[str, Any]:
    return cluster_1p2


def test_outputs_follow_the_contract(up) -> None:
    contract, spec = up["contract"], up["spec"]
    assert set(contract) == set(outputs.ALL_KEYS)
    assert contract[outputs.WORKER_COUNT] == 2
    ips = contract[outputs.WORKER_PRIVATE_IPS]
    base = spec.cidr.rsplit(".", 1)[0]
    assert contract[outputs.MAIN_PRIVATE_IP] == f"{base}.10"
    assert ips == [f"{base}.11", f"{base}.12"]
    assert contract[outputs.RPC_SERVERS] == ",".join(f"{ip}:50052" for ip in ips)
    assert contract[outputs.LLAMA_SERVER_URL] == f"http://{base}.10:8080"


def test_the_main_node_reports_the_placement_it_was_given(up) -> None:
    """llama-server's own account of where it put each layer (read from its load log into the
    status file) equals the computed placement: 4 layers on 3 nodes, which do not divide evenly,
    the main node holding its share on its CPU."""
    planned = up["spec"].placement
    placed = cluster.read_status(up["spec"])["main"]["placement"]
    assert [(p["node"], p["layers"]) for p in placed] == [(p["node"], p["layers"]) for p in planned]
    assert sorted(p["layers"] for p in planned) == [1, 1, 2] and planned[0]["layers"] >= 1
    for got, want in zip(placed, planned, strict=True):
        # llama.cpp reports each buffer to 0.01 MiB; a node has at most three (model, KV).
        assert abs(got["bytes"] - want["bytes"]) <= 3 * 0.005 * 1024**2, (got, want)


def test_a_request_gets_the_whole_context(up) -> None:
    """contextSize is what one request gets, prompt and completion: a prompt of context - 64
    tokens (counted by the server) completes 64 tokens; one token more than fits is refused at
    once with the server's own error."""
    url, context = up["contract"][outputs.LLAMA_SERVER_URL], up["options"].context_size
    prompt = tokens_of_length(url, context - 64)
    started = time.monotonic()
    body = post(url, "/completion", {"prompt": prompt, "n_predict": 64, "temperature": 0,
                                     "cache_prompt": False}, timeout=300)  # fmt: skip
    assert body["tokens_evaluated"] == context - 64 and body["tokens_predicted"] == 64
    print(f"{context - 64}-token prompt and 64 tokens: {time.monotonic() - started:.1f} s")
    too_long = tokens_of_length(url, context)
    started = time.monotonic()
    with pytest.raises(urllib.error.HTTPError) as refused:
        post(url, "/completion", {"prompt": too_long, "n_predict": 8}, timeout=60)
    error = json.loads(refused.value.read())["error"]
    assert refused.value.code == 400 and error["type"] == "exceed_context_size_error"
    assert error["n_ctx"] == context and error["n_prompt_tokens"] == context
    assert time.monotonic() - started < 30


def test_every_slot_serves_a_whole_context_at_the_same_time(up) -> None:
    """slots: 2 gives two requests at once a context each, and the placement llama-server
    reports counts the KV cache of both slots."""
    options = up["options"]
    two = dataclasses.replace(
        options,
        cluster_id=f"{options.cluster_id}p",
        cidr=options.cidr.replace("10.213.", "10.212."),
        context_size=2048,
        slots=2,
    )
    try:
        contract = cluster.up(two, timeout=600)
        url = contract[outputs.LLAMA_SERVER_URL]
        spec = ClusterSpec.load(two.cache, two.cluster_id)
        placed = cluster.read_status(spec)["main"]["placement"]
        for got, want in zip(placed, spec.placement, strict=True):
            assert abs(got["bytes"] - want["bytes"]) <= 3 * 0.005 * 1024**2, (got, want)
        prompts = [tokens_of_length(url, 2048 - 64) for _ in range(2)]
        results: list[Any] = [None, None]

        def ask(i: int) -> None:
            body = {"prompt": prompts[i], "n_predict": 64, "temperature": 0, "cache_prompt": False}
            results[i] = post(url, "/completion", body, timeout=300)

        askers = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
        for asker in askers:
            asker.start()
        for asker in askers:
            asker.join(300)
        assert [r["tokens_predicted"] for r in results] == [64, 64]
        assert {r["id_slot"] for r in results} == {0, 1}  # served side by side
    finally:
        cluster.down(two.cache, two.cluster_id)


def test_status_files_record_the_boot(up) -> None:
    statuses = cluster.read_status(up["spec"])
    main = statuses["main"]
    assert main["phase"] == "serving"
    assert main["workers_answered"] == up["contract"][outputs.RPC_SERVERS].split(",")
    assert main["workers_missing"] == []
    for key in ("download_seconds", "load_seconds", "time_to_serve_seconds"):
        assert main[key] >= 0, key
    assert main["build_skipped"] or main["build_seconds"] > 0
    # The download counted to its end; the load's total is the weights planned for the workers.
    assert main["download_done_bytes"] == main["download_total_bytes"] == main["model_bytes"]
    for name in ("w1", "w2"):
        assert statuses[name]["phase"] == "serving"
        assert statuses[name]["role"] == "worker"


def test_greedy_completion_through_workers_equals_one_node(up) -> None:
    """Same text and the same token log-probabilities as the model on one process."""
    through_workers = complete(up["contract"][outputs.LLAMA_SERVER_URL])
    bin_dir = Path(build_prefix(up["options"].cache)) / up["spec"].commit / "bin"
    one_node = one_node_completion(bin_dir, up["options"].model)
    assert through_workers[0] and len(through_workers[1]) == PROMPT["n_predict"]
    assert through_workers == one_node


def test_workers_listen_on_their_private_ip_only(up) -> None:
    network: VpcNetwork = up["network"]
    for name, ip in zip(network.node_names[1:], network.node_ips[1:], strict=True):
        listening = subprocess.run(
            [*exec_prefix(network.namespace(name)), "ss", "-Hltn", "sport", "= :50052"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert listening.split()[3] == f"{ip}:50052"


def test_rpc_port_is_closed_to_everyone_but_the_main_node(up) -> None:
    network: VpcNetwork = up["network"]
    worker_ip = network.node_ips[1]
    assert port_answers(exec_prefix(network.namespace("main")), worker_ip, 50052)  # the control
    # On the bridge, but outside the VPC's CIDR.
    outsider = network.add_outsider("out", "192.168.213.5", 24)
    assert not port_answers(exec_prefix(outsider), worker_ip, 50052)
    # Inside the VPC's CIDR, but not the main node.
    base = worker_ip.rsplit(".", 1)[0]
    peer = network.add_outsider("peer", f"{base}.50", 24)
    assert not port_answers(exec_prefix(peer), worker_ip, 50052)
    # The host reaches the main node through its own link, and has no route to a worker (not
    # probed: without a route, a probe would leave this machine).
    result = subprocess.run(["ip", "-o", "route", "get", worker_ip], capture_output=True, text=True)
    assert network.host_interface not in result.stdout


def test_a_serving_worker_reaches_nothing_beyond_the_cluster(up) -> None:
    """The RPC server is the process most exposed to remote-code bugs: once it serves, its node
    opens no connection outside the cluster's network (the main node, unrestricted, is the
    control)."""
    network: VpcNetwork = up["network"]
    outside = "192.168.214.5"
    listener = network.add_outsider("far", outside, 24)
    server = subprocess.Popen(
        [*exec_prefix(listener), "python3", "-c",
         "import socket, time; s = socket.create_server(('0.0.0.0', 9999)); time.sleep(60)"],
    )  # fmt: skip
    try:
        for node in (network.node_names[0], network.node_names[1]):
            # A route to the outsider's network over the bridge, which the cluster lacks.
            subprocess.run(
                [*exec_prefix(network.namespace(node)), "ip", "route", "replace",
                 "192.168.214.0/24", "dev", "eth0"], check=True,
            )  # fmt: skip
        subprocess.run([*exec_prefix(listener), "ip", "route", "replace", str(network.cidr),
                        "dev", "eth0"], check=True)  # fmt: skip
        deadline = time.monotonic() + 10
        while not port_answers(exec_prefix(network.namespace("main")), outside, 9999):
            assert time.monotonic() < deadline, "the control never reached the outsider"
            time.sleep(0.2)
        assert not port_answers(
            exec_prefix(network.namespace(network.node_names[1])), outside, 9999
        )
        # Inside the cluster the worker still reaches other nodes (the main node's API).
        port = up["spec"].server_port
        assert port_answers(
            exec_prefix(network.namespace(network.node_names[1])), network.node_ips[0], port
        )
    finally:
        server.kill()
        server.wait()


def test_rerunning_boot_does_not_rebuild(up) -> None:
    node = up["spec"].node("w1")
    status_file = node.status_file
    serving = status_file.read_text()
    started = time.monotonic()
    try:
        result = subprocess.run(
            [*exec_prefix(node.namespace), "bash", str(SCRIPTS / "node-boot.sh")],
            env={"PATH": os.environ["PATH"], "LLAMA_RPC_ENV_FILE": str(node.env_file)},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert "already built" in result.stderr
        assert time.monotonic() - started < 30
        assert json.loads(status_file.read_text())["build_skipped"] is True
    finally:
        # The boot alone ends in "booted"; its server never stopped, so the node still serves,
        # as the status said before (the shared cluster is read by other tests).
        status_file.write_text(serving)


def test_a_killed_worker_comes_back_and_the_main_serves_again(up) -> None:
    url = up["contract"][outputs.LLAMA_SERVER_URL]
    before = complete(url)
    network: VpcNetwork = up["network"]
    namespace = network.namespace("w2")
    servers = [
        pid for pid in namespace_pids(namespace)
        if Path(f"/proc/{pid}/comm").read_text().strip() == "ggml-rpc-server"
    ]  # fmt: skip
    assert len(servers) == 1
    os.kill(servers[0], signal.SIGKILL)
    deadline = time.monotonic() + 300
    after = None
    while time.monotonic() < deadline:
        try:
            after = complete(url, timeout=30)
            break
        except OSError:
            time.sleep(1)
    assert after == before
    replaced = [
        pid for pid in namespace_pids(namespace)
        if Path(f"/proc/{pid}/comm").read_text().strip() == "ggml-rpc-server"
    ]  # fmt: skip
    assert replaced and replaced != servers


def test_a_failed_up_leaves_nothing_running_and_keeps_its_evidence(up) -> None:
    options = up["options"]
    bad = dataclasses.replace(
        options,
        workers=1,
        cluster_id=f"{options.cluster_id}b",
        cidr=options.cidr.replace("10.213.", "10.214."),
        model_sha256="0" * 64,
        worker_wait_seconds=30,
    )
    state = state_dir(bad.cache, bad.cluster_id)
    try:
        with pytest.raises(LocalClusterError) as failed:
            cluster.up(bad, timeout=600)
        message = str(failed.value)
        assert message.startswith("node main failed: checksum mismatch")
        # The error shows the end of the node's log, which is still there.
        log = state / "logs" / "main.log"
        assert (
            f"lines of {log}" in message and "fetch-model.sh: error: checksum mismatch" in message
        )
        assert "checksum mismatch" in log.read_text()
        spec = ClusterSpec.load(bad.cache, bad.cluster_id)
        assert cluster.read_status(spec)["main"]["phase"] == "failed"
        leftovers = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert f"lrc-{bad.cluster_id}-" not in leftovers
        assert not any(
            f"lrc-{bad.cluster_id}" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
            for pid in os.listdir("/proc")
            if pid.isdigit() and Path(f"/proc/{pid}/cmdline").exists()
        )
        # The next up starts afresh: it fails the same way, with a log of its own run only.
        with pytest.raises(LocalClusterError):
            cluster.up(bad, timeout=600)
        assert log.read_text().count("checksum mismatch for") == 1
    finally:
        assert cluster.down(bad.cache, bad.cluster_id)
    assert not state.exists()


def test_without_namespaces_the_nodes_share_loopback(up) -> None:
    options = up["options"]
    loopback = dataclasses.replace(
        options, workers=1, cluster_id=f"{options.cluster_id}l", worker_wait_seconds=60, netns=False
    )
    try:
        contract = cluster.up(loopback, timeout=600)
        assert contract[outputs.MAIN_PRIVATE_IP] == "127.0.0.10"
        assert contract[outputs.RPC_SERVERS] == "127.0.0.11:50052"
        text, tokens = complete(contract[outputs.LLAMA_SERVER_URL])
        assert text and len(tokens) == PROMPT["n_predict"]
        log = state_dir(options.cache, loopback.cluster_id) / "logs" / "w1.log"
        assert "skipping /opt/llama-rpc/bin/rpc-firewall.sh: it needs root" in log.read_text()
    finally:
        cluster.down(loopback.cache, loopback.cluster_id)


def test_a_model_that_fits_one_node_is_served_without_workers(up) -> None:
    """workerCount 0: the main node serves alone, and answers as the cluster with workers does."""
    options = up["options"]
    alone = dataclasses.replace(
        options,
        workers=0,
        cluster_id=f"{options.cluster_id}s",
        cidr=options.cidr.replace("10.213.", "10.215."),
    )
    try:
        contract = cluster.up(alone, timeout=600)
        assert contract[outputs.WORKER_PRIVATE_IPS] == []
        assert contract[outputs.RPC_SERVERS] == ""
        spec = ClusterSpec.load(alone.cache, alone.cluster_id)
        assert [n.name for n in spec.nodes] == ["main"]
        main = cluster.read_status(spec)["main"]
        assert main["phase"] == "serving"
        assert "workers_answered" not in main
        assert complete(contract[outputs.LLAMA_SERVER_URL]) == complete(
            up["contract"][outputs.LLAMA_SERVER_URL]
        )
    finally:
        cluster.down(alone.cache, alone.cluster_id)
