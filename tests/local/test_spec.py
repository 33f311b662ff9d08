"""The local cluster's record (``cluster.json``): what ``up`` keeps and every other part reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.core import outputs
from infra.local.options import LocalClusterError
from infra.local.spec import BalancerEntry, ClusterSpec, LocalNode, MachineEntry

MACHINE = MachineEntry(
    name="lrc-t-main",
    directory="/c/clusters/t/nodes/main",
    image_root="/c/image",
    binds=(("/src", "/opt/llama.cpp-source"),),
    cloud="aws",
    field="user_data_base64",
    gzipped=True,
)


def two_groups() -> ClusterSpec:
    nodes = (
        LocalNode("main", "main", "10.9.0.10", "lrc-t-main", 0, "/s/main.json", machine=MACHINE),
        LocalNode("w1", "worker", "10.9.0.11", "lrc-t-w1", 0, "/s/w1.json", env_file="/e/w1"),
        LocalNode("r2main", "main", "10.9.0.30", "lrc-t-r2main", 1, "/s/r2.json", env_file="/e"),
        LocalNode("r2w1", "worker", "10.9.0.31", "lrc-t-r2w1", 1, "/s/r2w1.json", env_file="/e"),
    )
    return ClusterSpec(
        id="t", netns=True, machines=False, cidr="10.9.0.0/24", commit="a" * 40,
        rpc_port=50052, server_port=8080, context_size=4096, slots=2,
        placement=({"node": "main", "layers": 2, "bytes": 10},), nodes=nodes, replicas=2,
        balancer=BalancerEntry("lb", "10.9.0.5", "lrc-t-lb", "/c/clusters/t/balancer"),
    )  # fmt: skip


def test_the_record_reads_back_as_it_was_written(tmp_path: Path) -> None:
    spec = two_groups()
    spec.write(tmp_path)
    assert ClusterSpec.read(tmp_path) == spec
    stored = json.loads((tmp_path / "cluster.json").read_text())
    assert stored["nodes"][0]["machine"] == "lrc-t-main"  # the layout older readers know
    assert stored["nodes"][0]["delivery"] == {"cloud": "aws", "field": MACHINE.field,
                                              "gzipped": True}  # fmt: skip


def test_a_record_from_before_replicas_and_placements_still_reads(tmp_path: Path) -> None:
    old = {
        "id": "local", "netns": False, "cidr": "127.0.0.0/24", "commit": "b" * 40,
        "rpc_port": 50052, "server_port": 8080, "context_size": 4096, "slots": 1,
        "nodes": [{"name": "main", "role": "main", "ip": "127.0.0.10", "namespace": None,
                   "env_file": "/e", "status_file": "/s"}],
    }  # fmt: skip
    (tmp_path / "cluster.json").write_text(json.dumps(old))
    spec = ClusterSpec.read(tmp_path)
    assert (spec.replicas, spec.balancer, spec.placement, spec.machines) == (1, None, (), False)
    assert spec.contract()[outputs.MAIN_INSTANCE_ID] == "main"  # no namespace: its name


def test_groups_nodes_and_the_entry_point() -> None:
    spec = two_groups()
    assert [[n.name for n in group] for group in spec.groups()] == [
        ["main", "w1"],
        ["r2main", "r2w1"],
    ]
    assert [n.name for n in spec.main_nodes()] == ["main", "r2main"]
    assert spec.node("lrc-t-w1").name == "w1" and spec.node("lrc-t-main").name == "main"
    with pytest.raises(LocalClusterError, match="no node 'w9' in cluster 't'; its nodes: main, "):
        spec.node("w9")
    assert spec.entry_url() == "http://10.9.0.5:8080"  # the balancer
    assert spec.from_entry("curl x") == "lrc local exec --id t main -- curl x"
    contract = spec.contract()
    assert contract[outputs.BALANCER_URL] == "http://10.9.0.5:8080"
    assert contract[outputs.RPC_SERVERS] == "10.9.0.11:50052"
    assert contract[outputs.GROUPS][1][outputs.MAIN_PRIVATE_IP] == "10.9.0.30"
    network = spec.network()
    assert network is not None and "lrc-t-lb" in network.namespaces()


def test_a_node_that_is_not_a_machine_is_not_booted_as_one() -> None:
    spec = two_groups()
    assert spec.node("main").booted().name == "lrc-t-main"
    with pytest.raises(LocalClusterError, match="node w1 is not a machine"):
        spec.node("w1").booted()


def test_no_cluster_up_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LocalClusterError, match="no local cluster 'x' is up; start one with"):
        ClusterSpec.load(tmp_path, "x")
