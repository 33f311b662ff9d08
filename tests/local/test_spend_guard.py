"""Spend guards on real machines: a stack's stopAfterIdleMinutes and stopAfterHours as the
local cluster's --stop-after-idle-minutes and --stop-after-hours, each node's guard running under
its systemd from the user data a VM gets, powering its machine off; ``start`` boots them again
from their disks, without a rebuild or a download, and the cluster answers as before.

Two clusters, one after the other: a main node and a worker with an idle limit (the main node
goes first, its worker follows once the main node's connection is gone), and a main node alone
with a deadline. Traffic goes only to the namespaces these tests create."""

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
from tests.conftest import REPO, complete, one_plus_two, require_machines

pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.machines]

LRC = Path(sys.executable).parent / "lrc"  # the console script the project installs
IDLE_MINUTES = 0.75  # 45 s
DEADLINE_HOURS = 0.04  # 144 s


def _up(llama_source: Path, prefix: str, octet: int, **changes: Any) -> dict[str, Any]:
    require_machines()
    options = one_plus_two(
        llama_source, prefix, octet, machines=True, api_key=True, deliveries=("aws",), **changes
    )
    contract = cluster.up(options, timeout=1200)
    spec = ClusterSpec.load(options.cache, options.cluster_id)
    return {"options": options, "contract": contract, "spec": spec, "key": api_key_header(spec)}


def _down(up: dict[str, Any]) -> None:
    cluster.down(up["options"].cache, up["options"].cluster_id)


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


@pytest.fixture(scope="module")
def idle(llama_source: Path) -> Iterator[dict[str, Any]]:
    up = _up(llama_source, "gi", 215, workers=1, stop_after_idle_minutes=IDLE_MINUTES)
    yield up
    _down(up)


def test_an_idle_cluster_powers_off_its_main_node_then_its_worker(idle) -> None:
    idle["answer"] = answer(idle)
    last_request = time.time()
    main_off = stopped_at(idle, "main", timeout=300)
    worker_off = stopped_at(idle, "w1", timeout=300)
    assert worker_off > main_off
    limit = IDLE_MINUTES * 60
    statuses = {name: status_of(idle, name) for name in ("main", "w1")}
    for status in statuses.values():
        assert status["phase"] == "stopped"
        assert status["last_stop_reason"].startswith(f"idle: {limit:.0f}s"), status
    # Never short of the limit (each guard decides in whole seconds): the main node after its
    # last request, the worker after its main node's connection closed, which the main node's
    # power-off does after its guard decided.
    decided = {name: status["last_stopped_at"] for name, status in statuses.items()}
    assert decided["main"] - int(last_request) >= limit
    assert decided["w1"] - decided["main"] >= limit
    shown = lrc_local(idle, "status")
    assert shown.count("machine stopped") == 2 and "spend guard (idle" in shown, shown


def test_start_boots_the_stopped_cluster_without_a_rebuild_and_it_answers(idle) -> None:
    shown = json.loads(lrc_local(idle, "start", "--json", timeout=900))
    assert sorted(shown["started"]) == ["main", "w1"]
    assert shown["outputs"][outputs.LLAMA_SERVER_URL] == idle["contract"][outputs.LLAMA_SERVER_URL]
    for name in ("main", "w1"):
        status = status_of(idle, name)
        assert status["phase"] == "serving" and status["build_skipped"] is True
    assert status_of(idle, "main")["download_skipped"] is True
    assert answer(idle) == idle["answer"]


@pytest.fixture(scope="module")
def deadline(llama_source: Path, idle) -> Iterator[dict[str, Any]]:
    _down(idle)  # one cluster at a time: this machine has two cores
    up = _up(llama_source, "gd", 216, workers=0, stop_after_hours=DEADLINE_HOURS)
    yield up
    _down(up)


def test_the_deadline_powers_a_node_off_after_its_boot_and_start_brings_it_back(deadline) -> None:
    seconds = round(DEADLINE_HOURS * 3600)
    machine = deadline["spec"].node("main").booted()
    answer(deadline)  # busy or not, the deadline holds
    off = stopped_at(deadline, "main", timeout=seconds + 120)
    status = status_of(deadline, "main")
    assert status["last_stop_reason"].startswith(f"deadline: {seconds}s after boot"), status
    boot_began = status["boot_started_at"]
    assert off - boot_began >= seconds
    started = time.time()
    shown = json.loads(lrc_local(deadline, "start", "--json", timeout=900))
    assert shown["started"] == ["main"] and machine.running()
    assert answer(deadline)
    assert status_of(deadline, "main")["build_skipped"] is True
    # A fresh deadline from the new boot: still serving well inside it.
    assert time.time() - started < seconds
