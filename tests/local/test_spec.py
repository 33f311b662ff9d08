"""The local cluster's record (``cluster.json``): what ``up`` keeps and every other part reads."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.core import outputs
from infra.local import cluster
from infra.local.options import LocalClusterError
from infra.local.spec import BalancerEntry, ClusterSpec, LocalNode, MachineEntry, StoreEntry

MACHINE = MachineEntry(
    name="lrc-t-main",
    directory=Path("/c/clusters/t/nodes/main"),
    image_root=Path("/c/image"),
    binds=(("/src", "/opt/llama.cpp-source"),),
    cloud="aws",
    field="user_data_base64",
    gzipped=True,
)


def two_groups() -> ClusterSpec:
    nodes = (
        LocalNode(
            "main", "main", "10.9.0.10", "lrc-t-main", 0, Path("/s/main.json"), machine=MACHINE
        ),
        LocalNode(
            "w1", "worker", "10.9.0.11", "lrc-t-w1", 0, Path("/s/w1.json"), env_file=Path("/e/w1")
        ),
        LocalNode(
            "r2main",
            "main",
            "10.9.0.30",
            "lrc-t-r2main",
            1,
            Path("/s/r2.json"),
            env_file=Path("/e"),
        ),
        LocalNode(
            "r2w1",
            "worker",
            "10.9.0.31",
            "lrc-t-r2w1",
            1,
            Path("/s/r2w1.json"),
            env_file=Path("/e"),
        ),
    )
    return ClusterSpec(
        id="t", netns=True, machines=False, cidr="10.9.0.0/24", commit="a" * 40,
        rpc_port=50052, server_port=8080, context_size=4096, slots=2,
        placement=({"node": "main", "layers": 2, "bytes": 10},), nodes=nodes, replicas=2,
        balancer=BalancerEntry("lb", "10.9.0.5", "lrc-t-lb", Path("/c/clusters/t/balancer")),
        api_key_file=Path("/c/clusters/t/api-key"),
        store=StoreEntry("s3", "10.9.0.4", "lrc-t-s3", Path("/c/clusters/t/store")),
    )  # fmt: skip


def one_process_node() -> ClusterSpec:
    """On loopback: no namespace, machine, balancer or key."""
    node = LocalNode("main", "main", "127.0.0.10", None, 0, Path("/s"), env_file=Path("/e"))
    return dataclasses.replace(
        two_groups(), id="local", netns=False, cidr="127.0.0.0/24", nodes=(node,), replicas=1,
        balancer=None, api_key_file=None, store=None,
    )  # fmt: skip


@pytest.mark.parametrize("spec", [two_groups(), one_process_node()], ids=["two-groups", "one"])
def test_the_record_reads_back_as_it_was_written(tmp_path: Path, spec: ClusterSpec) -> None:
    spec.write(tmp_path)
    assert ClusterSpec.read(tmp_path) == spec


def test_the_record_is_the_specs_fields_as_json(tmp_path: Path) -> None:
    two_groups().write(tmp_path)
    stored = json.loads((tmp_path / "cluster.json").read_text())
    main = stored["nodes"][0]
    assert main["machine"]["directory"] == "/c/clusters/t/nodes/main"
    assert main["machine"]["binds"] == [["/src", "/opt/llama.cpp-source"]]
    assert (main["status_file"], main["env_file"]) == ("/s/main.json", None)
    assert stored["balancer"]["directory"] == "/c/clusters/t/balancer"


# The record as lrc wrote it before it was the spec's own fields: a machine's entries beside the
# node's, and before replicas, placements and machines, no group, replicas or balancer at all.
FLAT_MACHINE = {
    "name": "main", "role": "main", "ip": "10.9.0.10", "namespace": "lrc-t-main", "group": 0,
    "status_file": "/s", "machine": "lrc-t-main", "directory": "/d", "image_root": "/i",
    "binds": [], "delivery": {"cloud": "aws", "field": "user_data", "gzipped": True},
}  # fmt: skip
BEFORE_REPLICAS = {
    "id": "t", "netns": False, "cidr": "127.0.0.0/24", "commit": "b" * 40,
    "rpc_port": 50052, "server_port": 8080, "context_size": 4096, "slots": 1,
    "nodes": [{"name": "main", "role": "main", "ip": "127.0.0.10", "namespace": None,
               "env_file": "/e", "status_file": "/s"}],
}  # fmt: skip


def stored(change: Callable[[dict[str, Any]], None]) -> str:
    """The record of ``two_groups()`` as ``write`` stores it, changed."""
    with tempfile.TemporaryDirectory() as state:
        two_groups().write(Path(state))
        record = json.loads((Path(state) / "cluster.json").read_text())
    change(record)
    return json.dumps(record)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (json.dumps(BEFORE_REPLICAS), "cluster lacks api_key_file, balancer, machines, placement, "
         "replicas"),
        (stored(lambda r: r["nodes"].__setitem__(0, FLAT_MACHINE)),
         "cluster.nodes[0] lacks env_file and holds binds, delivery, directory, image_root"),
        (stored(lambda r: r["nodes"][1].update(zone="a")),
         "cluster.nodes[1] holds zone, which it does not know"),
        (stored(lambda r: r["nodes"][1].update(role="leader")),
         "cluster.nodes[1].role is 'leader', not"),
        (stored(lambda r: r.update(replicas="2")), "cluster.replicas is '2', not int"),
        (stored(lambda r: r.update(netns=1)), "cluster.netns is 1, not bool"),
        (stored(lambda r: r["nodes"][0]["machine"].update(binds=[["/src"]])),
         "cluster.nodes[0].machine.binds[0] holds 1 items, not 2"),
        (stored(lambda r: r.update(balancer=["lb"])), "cluster.balancer is ['lb'], not"),
        ('{"id": "t", "nodes": [', "Expecting value"),
    ],
    ids=["before-replicas", "flat-machine", "unknown-field", "unknown-role", "text-for-number",
         "number-for-flag", "short-bind", "list-for-object", "cut-short"],
)  # fmt: skip
def test_a_record_in_another_layout_is_refused_with_the_command_that_clears_it(
    tmp_path: Path, text: str, problem: str
) -> None:
    """The record is a cache every ``up`` rewrites: one another version of lrc wrote is never
    read with guesses, and nothing reads a cluster from it."""
    state = tmp_path / "clusters" / "t"
    state.mkdir(parents=True)
    (state / "cluster.json").write_text(text)
    with pytest.raises(LocalClusterError) as refused:
        ClusterSpec.read(state)
    message = str(refused.value)
    assert problem in message, message
    assert f"{state / 'cluster.json'} is not in the layout this lrc writes" in message
    assert "`lrc local down --id t`" in message
    assert f"if nothing of it runs any more, remove {state}" in message
    with pytest.raises(LocalClusterError, match="not in the layout"):
        cluster.down(tmp_path, "t")  # nothing stopped or removed on a guess
    assert (state / "cluster.json").read_text() == text


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
    assert "lrc-t-s3" in network.namespaces()  # the store's, removed with the others
    on_loopback = one_process_node()
    assert on_loopback.entry_url() == "http://127.0.0.10:8080" and on_loopback.network() is None
    assert on_loopback.contract()[outputs.MAIN_INSTANCE_ID] == "main"  # no namespace: its name


def test_a_node_that_is_not_a_machine_is_not_booted_as_one() -> None:
    spec = two_groups()
    assert spec.node("main").booted().name == "lrc-t-main"
    with pytest.raises(LocalClusterError, match="node w1 is not a machine"):
        spec.node("w1").booted()


def test_no_cluster_up_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LocalClusterError, match="no local cluster 'x' is up; start one with"):
        ClusterSpec.load(tmp_path, "x")
