"""The local cluster: the VMs' boot scripts, a real llama.cpp build, real network namespaces.

One cluster (a main node and two workers) is brought up for the module; every check runs against
it. Traffic goes only to loopback and to the namespaces these tests create.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra import outputs
from infra.local import cluster
from infra.local.model import cached_model
from infra.local.netns import VpcNetwork, exec_prefix, namespace_pids
from infra.local.source import cache_dir
from tests.conftest import SCRIPTS, free_port, require_netns

pytestmark = [pytest.mark.slow, pytest.mark.netns]

# cache_prompt off: every request evaluates the whole prompt, so results do not depend on what
# the server was asked before.
PROMPT = {
    "prompt": "Hello world, this is",
    "n_predict": 12,
    "temperature": 0,
    "n_probs": 1,
    "cache_prompt": False,
}


def complete(url: str, timeout: float = 60) -> tuple[str, list[tuple[int, float]]]:
    request = urllib.request.Request(
        f"{url}/completion",
        data=json.dumps(PROMPT).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = json.load(response)
    tokens = [(p["id"], p["logprob"]) for p in body["completion_probabilities"]]
    return body["content"], tokens


def port_answers(namespace: str, host: str, port: int) -> bool:
    probe = ["timeout", "3", "bash", "-c", f"exec 3<>/dev/tcp/{host}/{port}"]
    return subprocess.run([*exec_prefix(namespace), *probe], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def up(llama_source: Path) -> Iterator[dict[str, Any]]:
    require_netns()
    cache = cache_dir()
    cluster_id = f"t{os.getpid() % 100000}"
    octet = random.randint(100, 199)
    options = cluster.UpOptions(
        workers=2,
        model=cached_model(llama_source, cache),
        source=llama_source,
        cache=cache,
        cluster_id=cluster_id,
        cidr=f"10.213.{octet}.0/24",
        threads=1,
        worker_wait_seconds=300,
    )
    contract = cluster.up(options, timeout=2400)
    spec = cluster.load_spec(cache, cluster_id)
    network = cluster.network_of(spec)
    assert network is not None and network.main_is_routed_here()
    yield {"contract": contract, "spec": spec, "network": network, "options": options}
    cluster.down(cache, cluster_id)
    assert not [ns for ns in network.namespaces() if Path(f"/run/netns/{ns}").exists()]


def test_outputs_follow_the_contract(up) -> None:
    contract, spec = up["contract"], up["spec"]
    assert set(contract) == set(outputs.ALL_KEYS)
    assert contract[outputs.WORKER_COUNT] == 2
    ips = contract[outputs.WORKER_PRIVATE_IPS]
    base = spec["cidr"].rsplit(".", 1)[0]
    assert contract[outputs.MAIN_PRIVATE_IP] == f"{base}.10"
    assert ips == [f"{base}.11", f"{base}.12"]
    assert contract[outputs.RPC_SERVERS] == ",".join(f"{ip}:50052" for ip in ips)
    assert contract[outputs.LLAMA_SERVER_URL] == f"http://{base}.10:8080"


def test_status_files_record_the_boot(up) -> None:
    statuses = cluster.read_status(up["spec"])
    main = statuses["main"]
    assert main["phase"] == "serving"
    assert main["workers_answered"] == up["contract"][outputs.RPC_SERVERS].split(",")
    assert main["workers_missing"] == []
    for key in ("download_seconds", "load_seconds", "time_to_serve_seconds"):
        assert main[key] >= 0, key
    assert main["build_skipped"] or main["build_seconds"] > 0
    for name in ("w1", "w2"):
        assert statuses[name]["phase"] == "serving"
        assert statuses[name]["role"] == "worker"


def test_greedy_completion_through_workers_equals_one_node(up) -> None:
    """Same text and the same token log-probabilities as the model on one process."""
    through_workers = complete(up["contract"][outputs.LLAMA_SERVER_URL])
    bin_dir = Path(cluster.build_prefix(up["options"].cache)) / up["spec"]["commit"] / "bin"
    port = free_port()
    single = subprocess.Popen(
        [
            str(bin_dir / "llama-server"), "--model", str(up["options"].model),
            "--host", "127.0.0.1", "--port", str(port), "--ctx-size", "1024", "--threads", "1",
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the single-node server did not start"
                time.sleep(0.5)
        one_node = complete(url)
    finally:
        single.terminate()
        single.wait(timeout=30)
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
    assert port_answers(network.namespace("main"), worker_ip, 50052)  # the control
    # On the bridge, but outside the VPC's CIDR.
    outsider = network.add_outsider("out", "192.168.213.5", 24)
    assert not port_answers(outsider, worker_ip, 50052)
    # Inside the VPC's CIDR, but not the main node.
    base = worker_ip.rsplit(".", 1)[0]
    peer = network.add_outsider("peer", f"{base}.50", 24)
    assert not port_answers(peer, worker_ip, 50052)
    # The host reaches the main node through its own link, and has no route to a worker (not
    # probed: without a route, a probe would leave this machine).
    result = subprocess.run(["ip", "-o", "route", "get", worker_ip], capture_output=True, text=True)
    assert network.host_interface not in result.stdout


def test_rerunning_boot_does_not_rebuild(up) -> None:
    node = next(n for n in up["spec"]["nodes"] if n["name"] == "w1")
    started = time.monotonic()
    result = subprocess.run(
        [*exec_prefix(node["namespace"]), "bash", str(SCRIPTS / "node-boot.sh")],
        env={"PATH": os.environ["PATH"], "LLAMA_RPC_ENV_FILE": node["env_file"]},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "already built" in result.stderr
    assert time.monotonic() - started < 30
    status = json.loads(Path(node["status_file"]).read_text())
    assert status["build_skipped"] is True


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


def test_a_bad_checksum_fails_up_and_leaves_nothing_running(up) -> None:
    options = up["options"]
    bad = dataclasses.replace(
        options,
        workers=1,
        cluster_id=f"{options.cluster_id}b",
        cidr=options.cidr.replace("10.213.", "10.214."),
        model_sha256="0" * 64,
        worker_wait_seconds=30,
    )
    with pytest.raises(cluster.LocalClusterError, match="node main failed: checksum mismatch"):
        cluster.up(bad, timeout=600)
    leftovers = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"lrc-{bad.cluster_id}-" not in leftovers
    assert not cluster.state_dir(bad.cache, bad.cluster_id).exists()


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
        log = cluster.state_dir(options.cache, loopback.cluster_id) / "logs" / "w1.log"
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
        spec = cluster.load_spec(alone.cache, alone.cluster_id)
        assert [n["name"] for n in spec["nodes"]] == ["main"]
        main = cluster.read_status(spec)["main"]
        assert main["phase"] == "serving"
        assert "workers_answered" not in main
        assert complete(contract[outputs.LLAMA_SERVER_URL]) == complete(
            up["contract"][outputs.LLAMA_SERVER_URL]
        )
    finally:
        cluster.down(alone.cache, alone.cluster_id)
