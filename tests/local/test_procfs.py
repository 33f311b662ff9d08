"""A node's CPU time and memory, read from /proc: the one definition the local ``top`` and the
cost run's usage probe share (``infra.local.procfs``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infra.local import procfs


def test_a_processes_cpu_time_is_read_past_a_command_name_with_spaces() -> None:
    ticks = os.sysconf("SC_CLK_TCK")
    stat = (
        f"4242 (llama server) (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 {3 * ticks} {ticks} "
        "0 0 20 0 4 0 987654 123456 789"
    )
    assert procfs.process_cpu_seconds(stat) == (987654, 4.0)
    own = Path(f"/proc/{os.getpid()}/stat").read_text()
    started, seconds = procfs.process_cpu_seconds(own)
    assert seconds == pytest.approx(sum(os.times()[:2]), abs=0.1) and started > 0


def test_pss_is_read_in_bytes() -> None:
    rollup = "55d0-7ffc ---p 00000000 00:00 0 [rollup]\nRss: 2048 kB\nPss: 1536 kB\n"
    assert procfs.pss_bytes(rollup) == 1536 * 1024
    with pytest.raises(ValueError):
        procfs.pss_bytes("Rss: 1 kB\n")
    own = Path(f"/proc/{os.getpid()}/smaps_rollup").read_text()
    assert procfs.pss_bytes(own) > 0


def test_the_host_itself_is_in_no_cluster_namespace() -> None:
    found = procfs.namespace_processes(["lrc-absent-main"])
    assert found == {"lrc-absent-main": []}


def test_a_nodes_use_counts_each_process_by_pid_and_start_and_its_memory_once() -> None:
    pid = os.getpid()
    started, _ = procfs.process_cpu_seconds(Path(f"/proc/{pid}/stat").read_text())
    use = procfs.node_use([pid, 999_999_999])  # the second never existed: left out
    assert list(use.cpu_seconds) == [(pid, started)]
    pss = procfs.pss_bytes(Path(f"/proc/{pid}/smaps_rollup").read_text())
    assert use.memory_bytes == pytest.approx(pss, rel=0.05)  # read twice: a little may move
    # Proportional: never more than the resident set, which counts every shared page whole.
    rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    assert 0 < use.memory_bytes <= rss * 1.05
