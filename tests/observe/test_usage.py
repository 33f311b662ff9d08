"""What every node does during a benchmark: the arithmetic on readings (CPU mean and peak, memory,
bytes, the KV cache), the bytes-per-token measurement against a simulated cluster whose traffic
is known, the reading of /proc and cgroup files, and, on a real local cluster, bytes per generated
token between the main node and its workers inside the band ggml-rpc's messages allow.

Traffic goes only to the namespaces the last test creates.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from infra.costrun import rpc_bytes
from infra.local import usage as local_usage
from infra.observe.usage import (
    KvCacheReading,
    NodeCounters,
    Reading,
    Sampler,
    kv_cache_peak,
    node_figures,
    summarize,
)
from tests.models.test_models import write_gguf

MIB = 1 << 20


def reading(at: float, kv: float | None = None, **nodes: tuple[float, int, int, int]) -> Reading:
    return Reading(
        at=at,
        nodes={name: NodeCounters(*counters) for name, counters in nodes.items()},
        kv_cache=KvCacheReading(kv, 4096) if kv is not None else None,
    )


# --- the figures from readings ----------------------------------------------------------------


def test_cpu_mean_is_the_whole_window_and_peak_the_busiest_interval() -> None:
    readings = [
        reading(0.0, main=(10.0, 100 * MIB, 1_000, 2_000)),
        reading(1.0, main=(10.5, 300 * MIB, 1_500, 2_100)),  # half a core
        reading(2.0, main=(12.0, 200 * MIB, 4_000, 2_500)),  # one and a half cores
        reading(4.0, main=(12.0, 150 * MIB, 4_000, 2_500)),  # idle for two seconds
    ]
    figures = node_figures("main", readings)
    assert figures == {
        "cpu_mean_percent": 50.0,  # 2 CPU seconds over 4 s
        "cpu_peak_percent": 150.0,
        "memory_peak_bytes": 300 * MIB,
        "received_bytes": 3_000,
        "sent_bytes": 500,
        "seconds": 4.0,
    }


def test_a_node_that_restarted_counts_from_zero_and_a_missing_node_is_skipped() -> None:
    readings = [
        reading(0.0, w1=(50.0, MIB, 9_000, 9_000)),
        reading(1.0),  # the node could not be read
        reading(2.0, w1=(1.0, MIB, 100, 200)),  # restarted: counters from zero
    ]
    figures = node_figures("w1", readings)
    assert figures is not None
    assert figures["cpu_mean_percent"] == 50.0 and figures["cpu_peak_percent"] == 50.0
    assert (figures["received_bytes"], figures["sent_bytes"]) == (100, 200)
    assert node_figures("w1", readings[:2]) is None


def test_the_summary_names_every_node_and_the_kv_cache_peak() -> None:
    readings = [
        reading(0.0, kv=0.0, main=(0.0, MIB, 0, 0)),
        reading(1.0, kv=0.25, main=(1.0, MIB, 0, 0)),
        reading(2.0, main=(2.0, MIB, 0, 0)),  # llama-server stopped: no KV reading
        reading(3.0, kv=0.125, main=(2.5, MIB, 0, 0), w1=(0.0, MIB, 0, 0)),
    ]
    summary = summarize(readings, {"main": "main", "w1": "worker"}, interval=1.0, failures=1)
    assert summary["nodes"]["main"]["cpu_peak_percent"] == 100.0
    assert summary["nodes"]["w1"] == {"role": "worker", "not_measured": "fewer than two readings"}
    assert summary["kv_cache"] == {
        "peak_ratio": 0.25, "peak_tokens": 1024, "capacity_tokens": 4096, "readings": 3,
    }  # fmt: skip
    assert summary["seconds"] == 3.0 and summary["failed_readings"] == 1
    assert kv_cache_peak(readings[2:3]) is None


class CountingProbe:
    """Counts readings; fails the ones it is told to."""

    roles: Mapping[str, str] = {"main": "main"}

    def __init__(self, fail_every: int = 0) -> None:
        self.calls = 0
        self.fail_every = fail_every
        self.threads: set[str] = set()

    def read(self) -> Reading:
        self.calls += 1
        self.threads.add(threading.current_thread().name)
        if self.fail_every and self.calls % self.fail_every == 0:
            raise OSError("llama-server is restarting")
        return reading(time.monotonic(), main=(float(self.calls), MIB, 0, 0))


def test_the_sampler_reads_at_its_interval_in_a_thread_and_ends_with_a_reading() -> None:
    probe = CountingProbe(fail_every=3)
    sampler = Sampler(probe, interval=0.02).start()  # type: ignore[arg-type]
    time.sleep(0.3)
    readings = sampler.stop()
    # A first reading, about 15 on the schedule, a last one: a third of them failed.
    assert 8 <= probe.calls <= 20
    assert len(readings) + sampler.failures == probe.calls
    assert sampler.failures == probe.calls // 3 and "restarting" in sampler.last_error
    assert "usage-sampler" in probe.threads
    calls = probe.calls
    time.sleep(0.05)
    assert probe.calls == calls  # stopped
    with pytest.raises(ValueError, match="interval"):
        Sampler(probe, interval=0)  # type: ignore[arg-type]


# --- bytes per token, against a simulated cluster ---------------------------------------------


class SimulatedCluster:
    """A main node and workers whose counters grow as ggml-rpc's would: the prompt's hidden
    states, each generated token's hidden states and logits, control bytes per worker, and the
    previous request's KV cache pulled back from the workers when a request arrives (llama-server's
    prompt cache in RAM). Each figure is a parameter, so a measurement's answer is known."""

    def __init__(self, workers: int = 2, hidden_bytes: int = 1024, vocab: int = 32000) -> None:
        self.hidden, self.vocab = hidden_bytes, vocab
        self.lock = threading.Lock()  # a Sampler reads from its own thread
        self.control = 3000  # per worker and token
        self.kv_per_token = 20_000  # per worker: the state the prompt cache pulls back
        self.prompt_tokens = 17
        self.names = ["main", *(f"w{i}" for i in range(1, workers + 1))]
        self.counters = {name: [0.0, 50 * MIB, 0, 0] for name in self.names}
        self.previous_tokens = 0
        self.now = 0.0

    @property
    def roles(self) -> Mapping[str, str]:
        return {name: "main" if name == "main" else "worker" for name in self.names}

    def describe(self) -> dict[str, str]:
        return {"bytes": "simulated"}

    def recorder(self, interval: float) -> Sampler:
        return Sampler(self, interval)

    def _send(self, source: str, target: str, count: int) -> None:
        self.counters[source][3] += count
        self.counters[target][2] += count

    def _token(self, tokens: int) -> None:
        """``tokens`` at once through every worker, as ggml-rpc moves them."""
        workers = self.names[1:]
        for index, worker in enumerate(workers):
            into = 2 if index == 0 else 1  # the residual stream arrives as two tensors
            self._send("main", worker, tokens * (into * self.hidden + self.control))
            if index < len(workers) - 1:
                self._send(worker, "main", tokens * self.hidden)
        self._send(workers[-1], "main", self.vocab * 4)  # the logits of the last token only
        for name in self.names:
            self.counters[name][0] += 0.01 * tokens

    def complete(self, body: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        with self.lock:
            return self._complete(int(body["n_predict"]))

    def _complete(self, tokens: int) -> dict[str, Any]:
        for worker in self.names[1:]:
            self._send(worker, "main", self.previous_tokens * self.kv_per_token)
        self._token(self.prompt_tokens)
        for _ in range(tokens - 1):
            self._token(1)
        self.previous_tokens = self.prompt_tokens + tokens
        return {"timings": {"predicted_n": tokens, "prompt_n": self.prompt_tokens}}

    def read(self) -> Reading:
        with self.lock:
            return self._read()

    def _read(self) -> Reading:
        self.now += 0.5
        nodes = {
            n: NodeCounters(c[0], int(c[1]), int(c[2]), int(c[3])) for n, c in self.counters.items()
        }
        return Reading(at=self.now, nodes=nodes)


def test_bytes_per_token_are_exactly_what_one_more_token_costs() -> None:
    simulated = SimulatedCluster(workers=2, hidden_bytes=1024, vocab=32000)
    result = rpc_bytes.measure(simulated, rpc_bytes.Lengths(short=8, long=40, repeats=3))
    # Per token: w1 gets two hidden states and sends one back, w2 gets one and sends the logits.
    w1 = 2 * 1024 + 3000 + 1024
    w2 = 1024 + 3000 + 32000 * 4
    assert result["nodes"]["w1"]["bytes_per_token"] == {"mean": w1, "stdev": 0.0, "runs": 3}
    assert result["nodes"]["w2"]["bytes_per_token"]["mean"] == w2
    assert result["nodes"]["w2"]["received_per_token"]["mean"] == 1024 + 3000
    assert result["total_bytes_per_token"]["mean"] == w1 + w2
    # The main node exchanges what the workers do, in the other direction.
    assert result["nodes"]["main"]["bytes_per_token"]["mean"] == w1 + w2
    assert result["prompt_tokens"] == 17 and result["workers"] == 2


def test_a_cluster_without_workers_or_a_server_that_stops_early_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one worker"):
        rpc_bytes.measure(SimulatedCluster(workers=0), rpc_bytes.Lengths())
    stopping = SimulatedCluster()
    stopping.complete = lambda body, timeout: {"timings": {"predicted_n": 8, "prompt_n": 17}}  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="stopped early"):
        rpc_bytes.measure(stopping, rpc_bytes.Lengths())
    with pytest.raises(ValueError, match="short < long"):
        rpc_bytes.Lengths(short=40, long=8)


def test_the_hidden_state_comes_from_the_gguf_header(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", embedding=96, vocab=[f"t{i}" for i in range(300)])
    shape = rpc_bytes.activation_shape(path)
    assert (shape.architecture, shape.n_embd, shape.n_vocab) == ("llama", 96, 300)
    assert (shape.hidden_state_bytes, shape.logits_bytes) == (384, 1200)


def test_what_ggml_rpc_must_carry_and_the_band_around_it() -> None:
    gemma = rpc_bytes.ActivationShape("gemma3", n_embd=640, n_vocab=262144)
    assert rpc_bytes.hidden_state_crossings(1) == 2 and rpc_bytes.hidden_state_crossings(3) == 6
    # Two workers: the hidden state four times (2 x 2560) and the logits (1 MiB).
    assert rpc_bytes.expected_payload_bytes(gemma, 2) == 4 * 2560 + 1048576
    assert rpc_bytes.expected_payload_bytes(gemma, 0) == 0
    low, high = rpc_bytes.plausible_band(gemma, 2)
    assert low == 3 * 2560 + 1048576
    control = rpc_bytes.control_bytes_per_worker()
    assert control == 12 * (9 + 296 + 9 + 4 * 66) + 2 * 256 * 4
    assert high == round((4 * 2560 + 1048576) * 1.1 + 2 * control)
    compared = rpc_bytes.compare(
        {"workers": 2, "total_bytes_per_token": {"mean": 1_072_727.3}}, gemma
    )
    assert compared["ratio_to_hidden_state"] == round(1_072_727.3 / 2560, 2)
    assert compared["ratio_per_crossing"] == round(1_072_727.3 / (4 * 2560), 2)
    assert compared["in_band"]
    assert not rpc_bytes.compare({"workers": 2, "total_bytes_per_token": {"mean": 2560}}, gemma)[
        "in_band"
    ]


# --- reading the host's files -----------------------------------------------------------------


def test_cgroup_cpu_is_read_in_seconds() -> None:
    assert local_usage.cgroup_cpu_seconds("usage_usec 2500000\nuser_usec 2000000\n") == 2.5
    with pytest.raises(ValueError):
        local_usage.cgroup_cpu_seconds("user_usec 1\n")


def test_cpu_of_processes_that_come_and_go_only_grows() -> None:
    account = local_usage.CpuAccount()
    assert account.update({(10, 1): 5.0, (11, 1): 1.0}) == 6.0  # all of it, when first seen
    assert account.update({(10, 1): 6.0, (11, 1): 1.5}) == 7.5
    assert account.update({(10, 1): 6.5, (12, 9): 0.25}) == 8.25  # 11 ended; 12 began
    assert account.update({(10, 50): 0.5}) == 8.75  # 10 ended, and its pid was given again
    assert account.update({}) == 8.75


# --- on a real local cluster ------------------------------------------------------------------


@pytest.fixture
def tiny_cluster(cluster_1p2: dict[str, Any]) -> dict[str, Any]:
    return cluster_1p2


@pytest.mark.slow
@pytest.mark.netns
def test_bytes_per_token_between_main_and_workers_are_what_ggml_rpc_must_send(
    tiny_cluster: dict[str, Any],
) -> None:
    """The generated model (n_embd 256, 32,000 tokens) through two workers: each generated
    token's traffic lies between ggml-rpc's payload (the hidden state crossing 2k - 1 or 2k
    times, the logits once) and that payload with TCP/IP's overhead and each worker's control
    messages (``rpc_bytes.plausible_band``). The nodes are read every 0.2 s meanwhile."""
    options = tiny_cluster["options"]
    probe = local_usage.LocalProbe(tiny_cluster["spec"])
    sampler = Sampler(probe, interval=0.2).start()
    measured = rpc_bytes.measure(probe, rpc_bytes.Lengths(repeats=2))
    summary = summarize(sampler.stop(), probe.roles, interval=0.2)
    shape = rpc_bytes.activation_shape(options.model)
    assert (shape.n_embd, shape.n_vocab) == (256, 32000)
    total = measured["total_bytes_per_token"]["mean"]
    low, high = rpc_bytes.plausible_band(shape, workers=2)
    assert low <= total <= high, (total, low, high, measured)
    # The last worker sends the logits; the main node exchanges what the workers do together.
    last = measured["nodes"]["w2"]
    assert (
        last["bytes_per_token"]["mean"] - last["received_per_token"]["mean"] >= shape.logits_bytes
    )
    main = measured["nodes"]["main"]["bytes_per_token"]["mean"]
    assert main == pytest.approx(total, rel=0.02)
    for name, node in summary["nodes"].items():
        assert node["cpu_mean_percent"] > 0 and node["memory_peak_bytes"] > 10 * MIB, name
        assert node["received_bytes"] > 0 and node["sent_bytes"] > 0, name
    assert summary["kv_cache"] and 0 < summary["kv_cache"]["peak_ratio"] < 1
    assert summary["kv_cache"]["capacity_tokens"] == options.context_size


def test_a_machines_cgroup_is_the_parent_of_its_nspawn_supervisor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine = Path("/sys/fs/cgroup/unified/llama-rpc/lrc-x-main")
    monkeypatch.setattr(local_usage, "process_cgroup", lambda pid: machine / "supervisor")
    assert local_usage.machine_cgroup(1) == machine
    monkeypatch.setattr(local_usage, "process_cgroup", lambda pid: machine)
    assert local_usage.machine_cgroup(1) == machine
    monkeypatch.undo()
    own = local_usage.process_cgroup(os.getpid())
    assert own is not None and (own / "cgroup.procs").is_file()
