"""Spend guards on real machines: a stack's stopAfterIdleMinutes and stopAfterHours as the
local cluster's --stop-after-idle-minutes and --stop-after-hours (fractions: limits of seconds),
each node's guard running under its systemd from the user data a VM gets, powering its machine
off; ``start`` boots them again from their disks, without a rebuild or a download, and the
cluster answers as before.

One cluster, a main node and a worker with both limits, through three boots in order: kept busy
past the deadline, both nodes power off; started, then left idle, the main node goes first and
its worker follows once the main node's connection is gone; started again, it answers within a
fresh deadline. Traffic goes only to the namespaces these tests create."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.core import outputs
from infra.local import cluster
from infra.local.spec import ClusterSpec, api_key_header
from tests.conftest import REPO, complete, generating, one_plus_two, require_machines

pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.machines]

LRC = Path(sys.executable).parent / "lrc"  # the console script the project installs
IDLE_SECONDS = 6
# Long enough for a boot to serve and the idle test to end well inside it.
DEADLINE_SECONDS = 38


@pytest.fixture(scope="module")
def guarded(llama_source: Path) -> Iterator[dict[str, Any]]:
    require_machines()
    options = one_plus_two(
        llama_source, "g", 215, workers=1, machines=True, api_key=True, deliveries=("aws",),
        stop_after_idle_minutes=IDLE_SECONDS / 60, stop_after_hours=DEADLINE_SECONDS / 3600,
    )  # fmt: skip
    contract = cluster.up(options, timeout=1200)
    spec = ClusterSpec.load(options.cache, options.cluster_id)
    yield {"options": options, "contract": contract, "spec": spec, "key": api_key_header(spec)}
    cluster.down(options.cache, options.cluster_id)


def lrc_local(up: dict[str, Any], *args: str, timeout: float = 120) -> str:
    result = subprocess.run(
        [LRC, "local", *args[:1], "--id", up["spec"].id, *args[1:]],
        capture_output=True, text=True, check=False, cwd=REPO, timeout=timeout,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def stopped_at(up: dict[str, Any], name: str, timeout: float) -> float:
    """When (time.time()) the node's machine was seen stopped, polled each second."""
    machine = up["spec"].node(name).booted()
    deadline = time.monotonic() + timeout
    while machine.running():
        assert time.monotonic() < deadline, f"{name} still running after {timeout:.0f} s"
        time.sleep(1)
    return time.time()


def status_of(up: dict[str, Any], name: str) -> dict[str, Any]:
    status: dict[str, Any] = json.loads(up["spec"].node(name).status_file.read_text())
    return status


def answer(up: dict[str, Any]) -> str:
    text, _ = complete(up["contract"][outputs.LLAMA_SERVER_URL], headers=up["key"])
    return text


def test_the_deadline_powers_busy_nodes_off_after_their_boot(guarded) -> None:
    """Kept generating, neither node is ever idle: the main node stops at its deadline from its
    boot, and its worker stops too."""
    with generating(guarded["contract"][outputs.LLAMA_SERVER_URL], guarded["key"], may_stop=True):
        main_off = stopped_at(guarded, "main", timeout=DEADLINE_SECONDS + 120)
        stopped_at(guarded, "w1", timeout=60)
    status = status_of(guarded, "main")
    assert status["last_stop_reason"].startswith(f"deadline: {DEADLINE_SECONDS}s after boot")
    boot_began = status["boot_started_at"]
    assert main_off - boot_began >= DEADLINE_SECONDS
    # Decided within a few seconds of it: the guard looks every second.
    assert status["last_stopped_at"] - boot_began <= DEADLINE_SECONDS + 5, status


def test_start_boots_the_stopped_cluster_without_a_rebuild_and_it_answers(guarded) -> None:
    shown = json.loads(lrc_local(guarded, "start", "--json", timeout=900))
    assert sorted(shown["started"]) == ["main", "w1"]
    url = guarded["contract"][outputs.LLAMA_SERVER_URL]
    assert shown["outputs"][outputs.LLAMA_SERVER_URL] == url
    for name in ("main", "w1"):
        status = status_of(guarded, name)
        assert status["phase"] == "serving" and status["build_skipped"] is True
    assert status_of(guarded, "main")["download_skipped"] is True
    guarded["answer"] = answer(guarded)


def test_an_idle_cluster_powers_off_its_main_node_then_its_worker(guarded) -> None:
    """Left idle after its last answer (the test before): each node stops once the idle limit
    has passed, and within a few seconds of it, its guard looking every second."""
    last_request = time.time()
    main_off = stopped_at(guarded, "main", timeout=60)
    worker_off = stopped_at(guarded, "w1", timeout=60)
    assert worker_off > main_off
    statuses = {name: status_of(guarded, name) for name in ("main", "w1")}
    for status in statuses.values():
        assert status["phase"] == "stopped"
        assert status["last_stop_reason"].startswith(f"idle: {IDLE_SECONDS}s"), status
    # Never short of the limit (each guard counts milliseconds, its status whole seconds): the
    # main node after its last request, the worker after its main node's connection closed,
    # which the main node's power-off does after its guard decided. Nor long after it (a guard
    # looking every 30 s would be up to 30 s late): the worker's wait includes its main node's
    # shutdown.
    decided = {name: status["last_stopped_at"] for name, status in statuses.items()}
    assert IDLE_SECONDS <= decided["main"] - int(last_request) <= IDLE_SECONDS + 10
    assert IDLE_SECONDS <= decided["w1"] - decided["main"] <= IDLE_SECONDS + 20
    shown = lrc_local(guarded, "status")
    assert shown.count("machine stopped") == 2 and "spend guard (idle" in shown, shown


def test_start_gives_each_node_a_fresh_deadline(guarded) -> None:
    started = time.time()
    shown = json.loads(lrc_local(guarded, "start", "--json", timeout=900))
    assert sorted(shown["started"]) == ["main", "w1"]
    assert answer(guarded) == guarded["answer"]
    # Past the earlier boots' deadlines, still serving well inside the new one.
    assert time.time() - started < DEADLINE_SECONDS
    assert guarded["spec"].node("main").booted().running()
