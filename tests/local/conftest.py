"""The local clusters that several files of this tier read (``tests.shared``)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.local import cluster
from infra.local.model import real_model
from infra.local.options import UpOptions, state_dir
from infra.local.source import cache_dir
from infra.local.spec import ClusterSpec, api_key_header
from tests.conftest import one_plus_two, require_machines, require_netns, require_tool
from tests.shared import shared

# Whose delivery of the user data each machine gets, in node order (main, w1, r2main, r2w1):
# AWS's gzip with the boot files beyond it, GCP's plain text, Azure's base64 for a main node and
# for a worker.
DELIVERIES = ("aws", "gcp", "azure", "azure")


@pytest.fixture
def machines_2x2(llama_source: Path) -> dict[str, Any]:
    """Two serving groups of a main node and a worker, as machines behind the balancer, keyed,
    one slot each (the generated model): what test_machines and test_idle_group read. A
    namespace of the tests' own on the VPC bridge (``client``) sends through the balancer."""
    return shared("machines_2x2", lambda: _machines_2x2(llama_source))


def _machines_2x2(llama_source: Path) -> Iterator[dict[str, Any]]:
    require_machines()
    require_netns()
    require_tool("haproxy")
    # Keyed: the API key reaches llama-server as a systemd credential, as on a VM.
    options = one_plus_two(
        llama_source, "m", 214, workers=1, replicas=2, slots=1, context_size=4096,
        machines=True, deliveries=DELIVERIES, api_key=True,
    )  # fmt: skip
    cache, cluster_id = options.cache, options.cluster_id
    contract = cluster.up(options, timeout=2400)
    spec = ClusterSpec.load(cache, cluster_id)
    network = spec.network()
    assert network is not None and network.main_is_routed_here() and spec.balancer is not None
    base = str(network.cidr.network_address).rsplit(".", 1)[0]
    yield {
        "contract": contract,
        "spec": spec,
        "network": network,
        "options": options,
        "key": api_key_header(spec),
        "client": network.add_outsider("cl", f"{base}.200", network.cidr.prefixlen),
        "balancer": spec.balancer.balancer(),
    }
    assert cluster.down(cache, cluster_id)
    assert not [ns for ns in network.namespaces() if Path(f"/run/netns/{ns}").exists()]
    assert not state_dir(cache, cluster_id).exists()


# Gemma 3 270M's clusters: the context a request gets (a prompt that fills it is evaluated
# through the workers on one thread each, about 15 s).
GEMMA_CONTEXT = 2048


def gemma_up(llama_source: Path, workers: int, suffix: str, **changes: Any) -> dict[str, Any]:
    """A cluster serving Gemma 3 270M (processes in namespaces, on a /24 of 10.216.x of its own,
    named for its variant and a random number), with ``changes`` to its options; the caller
    takes it down."""
    require_netns()
    cache = cache_dir()
    # Apart by variant, so that clusters up at once never share a range.
    variant = (
        8 * ("worker_local" in changes)
        + 4 * ("draft_model" in changes)
        + 2 * ("server_args" in changes)
        + (workers > 0)
    )
    options = UpOptions(
        **{
            "workers": workers,
            "model": real_model(cache),
            "source": llama_source,
            "cache": cache,
            "cluster_id": f"g{suffix}{random.randint(0, 99999)}",
            "cidr": f"10.216.{random.randint(0, 15) * 16 + variant}.0/24",
            "threads": 1,
            "context_size": GEMMA_CONTEXT,
            # Whatever this machine's memory: the placement (6 + 6 + 6 layers through two
            # workers) does not move with it, nor with a draft on the main node.
            "node_memory_bytes": 8 * 1024**3,
            "worker_wait_seconds": 300,
            **changes,
        }
    )
    contract = cluster.up(options, timeout=2400)
    spec = ClusterSpec.load(cache, options.cluster_id)
    return {"contract": contract, "spec": spec, "options": options}


def gemma_down(up: dict[str, Any]) -> None:
    cluster.down(up["options"].cache, up["options"].cluster_id)


@pytest.fixture
def gemma_1p2(llama_source: Path) -> dict[str, Any]:
    """Gemma 3 270M through two workers, as a user runs it (CPU repacking on the main node, no
    draft): what test_real_model and test_draft_model read."""
    return shared("gemma_1p2", lambda: _gemma_1p2(llama_source))


def _gemma_1p2(llama_source: Path) -> Iterator[dict[str, Any]]:
    up = gemma_up(llama_source, 2, "w")
    yield up
    gemma_down(up)
