"""Worker-local loading on the local cluster of machines: Gemma 3 270M through two workers, the
model staged by `lrc stage` in the cluster's own S3 store (``--staged``), each node booting from
its user data under systemd (AWS's delivery for the main node, GCP's and Azure's for the workers)
and reading only its own slice of the model from the store (llama-rpc-slice, by the slice
manifest), the workers loading their layers from their own disks (patches 0006 and 0007), again
after their RPC server is killed and after their machine reboots.

What is measured: the ranges each node read, from the store's request log; what the main node's
network interface sent while the group loaded (with every weight sent by the main node, at least
the workers' weights; here, keys); and what each worker received beyond what the store sent it.
Traffic goes only to loopback and to the namespaces these tests create.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.boot import VM_PATHS
from infra.core import outputs
from infra.local import access, cluster, usage
from infra.local.netns import VpcNetwork
from infra.local.options import build_prefix
from infra.local.store import BUCKET, PREFIX
from infra.models import gguf_header
from infra.models.parts import part_paths
from infra.planner import local_load
from infra.stage import slices as slices_manifest
from tests.conftest import GREEDY_PROMPT, complete, free_port, one_node_completion, require_machines
from tests.local.conftest import gemma_down, gemma_up

pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.machines]

WORKERS = ("w1", "w2")


def received_bytes(network: VpcNetwork, node: str) -> int:
    return usage.received_bytes(network.namespace(node))


def rpc_servers(network: VpcNetwork, node: str) -> list[int]:
    listed = subprocess.run(
        ["ip", "netns", "pids", network.namespace(node)], capture_output=True, text=True, timeout=30
    ).stdout.split()
    return [int(p) for p in listed if _comm(int(p)) == "ggml-rpc-server"]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@pytest.fixture(scope="module")
def sliced(llama_source: Path) -> Iterator[dict[str, Any]]:
    require_machines()
    up = gemma_up(llama_source, 2, "l", worker_local=True, machines=True, staged=True,
                  deliveries=("aws", "gcp", "azure"))  # fmt: skip
    try:
        network = up["spec"].network()
        up["network"] = network
        # Read before any request: what the load alone put on each node's wire.
        up["received"] = {node: received_bytes(network, node) for node in WORKERS}
        up["sent"] = usage.sent_bytes(network.namespace("main"))
        up["store_log"] = up["spec"].store.store().requests()
        yield up
    finally:
        gemma_down(up)


def slices(up: dict[str, Any]) -> dict[str, dict[str, int]]:
    statuses = cluster.read_status(up["spec"])
    return {node: statuses[node]["slice"] for node in ("main", *WORKERS)}


def test_each_node_holds_only_its_own_slice(sliced) -> None:
    options = sliced["options"]
    size = options.model.stat().st_size
    main = sliced["spec"].node("main").booted()
    [copy] = list(main.written(f"{VM_PATHS.data_dir}/models").glob("*.gguf"))
    # The main node's copy is sparse: the header, its own layers and the embeddings.
    assert copy.stat().st_size == size
    assert copy.stat().st_blocks * 512 < 0.9 * size
    held = slices(sliced)
    embeddings = gguf_header.tensor_bytes(options.model)["token_embd.weight"]
    # Together the nodes fetched one model and the tied embeddings again (the output head on
    # the last worker), each worker its layers only.
    fetched = sum(held[node]["fetched_bytes"] for node in held)
    assert size < fetched < size + embeddings + 2**20
    assert held["main"]["keyed_bytes"] == sum(held[w]["slice_bytes"] for w in WORKERS)
    assert all(held[w]["fetched_bytes"] == held[w]["slice_bytes"] > 0 for w in WORKERS), held


def store_reads(up: dict[str, Any], node: str, log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The requests ``node`` made of the store, in ``log``."""
    ip = up["spec"].node(node).ip
    return [r for r in log if r["client"] == ip]


# Tensors this close are read as one range by llama-rpc-slice (its GAP).
SLICE_GAP = 4096


def merged(ranges: list[tuple[int, int]], gap: int = 0) -> list[tuple[int, int]]:
    """Half-open byte ranges, joined where at most ``gap`` bytes apart."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if out and start - out[-1][1] <= gap:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def own_ranges(up: dict[str, Any], index: int) -> list[tuple[int, int]]:
    """The bytes of the part the node at ``index`` (main 0, workers after) holds, as the docs
    state it: the main node the header, the embeddings and its layers; a worker its layers, and
    the last one the output head (and the embeddings, when the output is tied to them)."""
    written = slices_manifest.manifest_file(part_paths(up["options"].model))
    manifest = json.loads(written.read_text())
    [part] = manifest["parts"]
    layers = [share["layers"] for share in up["spec"].placement]
    first, last = sum(layers[:index]), index == len(layers) - 1
    wanted = [(0, part["header_size"])] if index == 0 else []
    for tensor in part["tensors"]:
        home = tensor["home"]
        if (
            (home == "layer" and first <= tensor["layer"] < first + layers[index])
            or (home == "input" and (index == 0 or (last and manifest["tied_output"])))
            or (home == "output" and last)
        ):
            wanted.append((tensor["offset"], tensor["offset"] + tensor["size"]))
    return merged(wanted, gap=SLICE_GAP)  # as the node reads them: tensors that lie together


def test_each_node_read_only_its_own_ranges_from_the_store(sliced) -> None:
    """The store's request log: every read of the part is a ranged GET, and together a node's
    ranges are exactly the bytes it holds (and the few bytes between tensors that lie together,
    which it reads with them), each byte once: no node reads the whole part."""
    part = f"/{BUCKET}/{PREFIX}{part_paths(sliced['options'].model)[0].name}"
    for index, node in enumerate(("main", *WORKERS)):
        reads = [r for r in store_reads(sliced, node, sliced["store_log"]) if r["path"] == part]
        reads = [r for r in reads if r["method"] == "GET"]
        assert reads and all(r["status"] == 206 and r["range"] for r in reads), (node, reads[:3])
        got = []
        for read in reads:
            start, end = read["range"].removeprefix("bytes=").split("-")
            assert read["bytes"] == int(end) + 1 - int(start), read
            got.append((int(start), int(end) + 1))
        wanted = own_ranges(sliced, index)
        assert merged(got) == wanted, node
        assert sum(r["bytes"] for r in reads) == sum(end - start for start, end in wanted), node
        # Ranges of the planner's size, not one a tensor.
        ranges = sum(-(-(end - start) // local_load.RANGE_BYTES) for start, end in wanted)
        assert len(reads) == ranges, node


def test_the_workers_get_keys_not_weights(sliced) -> None:
    held = slices(sliced)
    weights = sum(held[node]["slice_bytes"] for node in WORKERS)
    # Sent by the main node, each byte of the workers' slices would leave its interface; with
    # the slices on the workers' own disks, under a tenth of that does (keys, graphs, and its
    # own requests to the store).
    assert sliced["sent"] < 0.1 * weights, (sliced["sent"], held)
    for node in WORKERS:
        # And what reached each worker, beyond what the store sent it, is under a tenth of its
        # slice.
        from_store = sum(r["bytes"] for r in store_reads(sliced, node, sliced["store_log"]))
        beyond = sliced["received"][node] - from_store
        assert beyond < 0.1 * held[node]["slice_bytes"], (node, beyond, held)


def test_the_greedy_text_is_the_same_as_on_one_node(sliced) -> None:
    bin_dir = Path(build_prefix(sliced["options"].cache)) / sliced["spec"].commit / "bin"
    got = complete(sliced["contract"][outputs.LLAMA_SERVER_URL], timeout=120)
    assert got[0] and len(got[1]) == GREEDY_PROMPT["n_predict"]
    assert got == one_node_completion(bin_dir, sliced["options"].model)


def answer_again(url: str, within: float) -> tuple[str, list[tuple[int, float]]] | None:
    """The group's next greedy answer, asked again each half second; None if none came."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            return complete(url, timeout=30)
        except OSError:
            time.sleep(0.5)
    return None


def test_a_killed_worker_reloads_from_its_own_disk(sliced) -> None:
    """kill -9 of a worker's RPC server: the group answers again, the same text, and the worker
    received keys again, not its weights."""
    network: VpcNetwork = sliced["network"]
    url = sliced["contract"][outputs.LLAMA_SERVER_URL]
    before = complete(url, timeout=120)
    [server] = rpc_servers(network, "w2")
    received = received_bytes(network, "w2")
    killed = time.monotonic()
    os.kill(server, signal.SIGKILL)
    after = answer_again(url, 300)
    healed = time.monotonic() - killed
    assert after == before, healed
    assert rpc_servers(network, "w2") not in ([], [server])
    weights = slices(sliced)["w2"]["slice_bytes"]
    assert received_bytes(network, "w2") - received < 0.1 * weights
    print(json.dumps({"healed_seconds": round(healed, 2)}))


def test_a_main_copy_that_lacks_a_tensor_it_would_load_fails_naming_it(sliced, tmp_path) -> None:
    """Patch 0007: a weight listed as elsewhere but placed on the main node (a split that
    disagrees with the slices) stops the load, never computes with the zeros of a hole."""
    bin_dir = Path(build_prefix(sliced["options"].cache)) / sliced["spec"].commit / "bin"
    listed = tmp_path / "elsewhere"
    listed.write_text("blk.0.attn_q.weight\n")
    model = part_paths(sliced["options"].model)[0]
    run = subprocess.run(
        [str(bin_dir / "llama-server"), "-m", str(model), "--host", "127.0.0.1", "--port",
         str(free_port()), "-t", "1"],
        env={**os.environ, "LLAMA_WEIGHTS_ELSEWHERE": str(listed)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode != 0
    assert "blk.0.attn_q.weight is on a worker's disk" in run.stderr + run.stdout


def test_a_rebooted_worker_machine_reloads_from_its_own_disk(sliced) -> None:
    """A reboot of a worker's machine: its slice is still on its disk, so it fetches nothing, and
    the group answers the same text again, the worker having received keys, not its weights."""
    network: VpcNetwork = sliced["network"]
    url = sliced["contract"][outputs.LLAMA_SERVER_URL]
    before = complete(url, timeout=120)
    weights = slices(sliced)["w1"]["slice_bytes"]
    received = received_bytes(network, "w1")  # the namespace, and its counters, outlive a boot
    read_before = len(sliced["spec"].store.store().requests())
    rebooted = time.monotonic()
    access.reboot(sliced["spec"], "w1")
    after = answer_again(url, 600)
    healed = time.monotonic() - rebooted
    assert after == before, healed
    held = slices(sliced)["w1"]
    assert held["fetched_bytes"] == 0 and held["kept_bytes"] == weights, held
    # The store agrees: since the reboot, the worker read the manifest, and no byte of the part.
    since = store_reads(sliced, "w1", sliced["spec"].store.store().requests()[read_before:])
    assert since and not [r for r in since if r["path"].endswith(".gguf")], since
    assert received_bytes(network, "w1") - received < 0.1 * weights
    print(json.dumps({"healed_seconds": round(healed, 2)}))
