"""What every node does during a stack's benchmark: CPU, memory, the KV cache, and the bytes each
node sends and receives on the cluster's network.

A ``UsageProbe`` reads every node at once (``Reading``: cumulative counters, as a node's kernel
keeps them); a ``Sampler`` reads it at a fixed interval in a thread while the benchmark runs;
``summarize`` turns the readings into the report's figures:

- CPU, in percent of one core (100 % = one core busy, as ``top`` counts): the mean over the
  whole window (CPU seconds used / seconds elapsed), and the peak over any one interval;
- memory: the highest reading;
- the KV cache: the highest share of its cells in use, and the tokens that share is;
- bytes received and sent on each node's cluster-facing interface over the window.

How the counters are read is the probe's business: the local cluster reads each node's processes
and network namespace from the host (``infra.local.usage``).
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from infra.observe.metrics import increase

# One reading a second: short enough to catch a decode burst of a few seconds, long enough that
# reading every node's processes costs a 2-core host little.
DEFAULT_INTERVAL_SECONDS = 1.0


class UsageUnavailable(RuntimeError):
    """The figures cannot be measured for this stack; the message says why."""


@dataclass(frozen=True)
class NodeCounters:
    """One node's counters at one moment. CPU and bytes are cumulative (they only grow while the
    node runs); memory is what the node holds now."""

    cpu_seconds: float
    memory_bytes: int
    received_bytes: int
    sent_bytes: int


@dataclass(frozen=True)
class KvCacheReading:
    used_ratio: float  # 0-1: the share of the cache's cells holding tokens
    capacity_tokens: int  # the cells of every slot together


@dataclass(frozen=True)
class Reading:
    at: float  # seconds on one clock (the host's monotonic one, or a main node's epoch)
    nodes: Mapping[str, NodeCounters]
    kv_cache: KvCacheReading | None = None


class UsageProbe(Protocol):
    """Reads a running cluster's nodes, and sends requests to its main node."""

    @property
    def roles(self) -> Mapping[str, str]:
        """Each node's name and role ("main" or "worker"), the main node first."""
        ...

    def read(self) -> Reading:
        """Every node's counters now (safe to call from two threads)."""
        ...

    def complete(self, body: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        """POST ``body`` to the main node's llama-server ``/completion``; its reply."""
        ...

    def describe(self) -> dict[str, str]:
        """How each figure is read, for the report."""
        ...

    def recorder(self, interval: float) -> Recorder:
        """What reads every node each ``interval`` seconds while the benchmark runs."""
        ...


class Recorder(Protocol):
    """Readings at a fixed interval from ``start`` until ``stop``, which returns them."""

    interval: float
    failures: int  # readings that failed
    last_error: str

    def start(self) -> Recorder: ...

    def stop(self) -> list[Reading]: ...


@dataclass
class Sampler:
    """Reads a probe every ``interval`` seconds in a thread, from ``start`` until ``stop``.

    The schedule is fixed (start + k x interval), so a slow reading does not shift the next;
    readings that fail are counted and the last error kept, and do not stop the sampling.
    """

    probe: UsageProbe
    interval: float = DEFAULT_INTERVAL_SECONDS
    clock: Callable[[], float] = time.monotonic
    readings: list[Reading] = field(default_factory=list)
    failures: int = 0
    last_error: str = ""

    def __post_init__(self) -> None:
        if self.interval <= 0:
            raise ValueError(f"the sampling interval must be positive, got {self.interval}")
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="usage-sampler", daemon=True)

    def start(self) -> Sampler:
        self._take()
        self._thread.start()
        return self

    def stop(self) -> list[Reading]:
        """Stop sampling, take a last reading (so the window ends now), and return them all."""
        self._stopped.set()
        self._thread.join()
        self._take()
        return list(self.readings)

    def _run(self) -> None:
        started = self.clock()
        tick = 1
        while not self._stopped.wait(max(0.0, started + tick * self.interval - self.clock())):
            self._take()
            tick = int((self.clock() - started) / self.interval) + 1

    def _take(self) -> None:
        try:
            self.readings.append(self.probe.read())
        except Exception as error:  # noqa: BLE001 (a node restarting (llama-bench stops llama-server))
            self.failures += 1
            self.last_error = f"{type(error).__name__}: {error}"


def _percent(cpu_seconds: float, seconds: float) -> float:
    return 100.0 * max(cpu_seconds, 0.0) / seconds if seconds > 0 else 0.0


def node_figures(name: str, readings: Sequence[Reading]) -> dict[str, Any] | None:
    """One node's figures over the readings that have it; None with fewer than two."""
    seen = [(r.at, r.nodes[name]) for r in readings if name in r.nodes]
    if len(seen) < 2:
        return None
    pairs = list(itertools.pairwise(seen))
    # Each interval's growth; a counter that went backwards (the node restarted) counts from
    # zero, as Prometheus' increase() does.
    cpu = [increase(a.cpu_seconds, b.cpu_seconds) for (_, a), (_, b) in pairs]
    peaks = [
        _percent(used, b_at - a_at) for used, ((a_at, _), (b_at, _)) in zip(cpu, pairs, strict=True)
    ]
    received = sum(increase(a.received_bytes, b.received_bytes) for (_, a), (_, b) in pairs)
    sent = sum(increase(a.sent_bytes, b.sent_bytes) for (_, a), (_, b) in pairs)
    seconds = seen[-1][0] - seen[0][0]
    return {
        "cpu_mean_percent": round(_percent(sum(cpu), seconds), 1),
        "cpu_peak_percent": round(max(peaks), 1),
        "memory_peak_bytes": max(node.memory_bytes for _, node in seen),
        "received_bytes": int(received),
        "sent_bytes": int(sent),
        "seconds": round(seconds, 2),
    }


def kv_cache_peak(readings: Sequence[Reading]) -> dict[str, Any] | None:
    """The highest KV cache use seen, and the tokens it was; None when never read."""
    seen = [r.kv_cache for r in readings if r.kv_cache is not None]
    if not seen:
        return None
    peak = max(seen, key=lambda kv: kv.used_ratio)
    return {
        "peak_ratio": round(peak.used_ratio, 4),
        "peak_tokens": round(peak.used_ratio * peak.capacity_tokens),
        "capacity_tokens": peak.capacity_tokens,
        "readings": len(seen),
    }


def summarize(
    readings: Sequence[Reading],
    roles: Mapping[str, str],
    *,
    interval: float,
    failures: int = 0,
    last_error: str = "",
) -> dict[str, Any]:
    """The report's ``usage`` figures for one stack's benchmark window."""
    nodes = {}
    for name, role in roles.items():
        figures = node_figures(name, readings)
        nodes[name] = {"role": role, **(figures or {"not_measured": "fewer than two readings"})}
    return {
        "interval_seconds": interval,
        "readings": len(readings),
        "failed_readings": failures,
        "last_error": last_error,
        "seconds": round(readings[-1].at - readings[0].at, 2) if len(readings) > 1 else 0.0,
        "nodes": nodes,
        "kv_cache": kv_cache_peak(readings),
    }


def spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "mean": round(statistics.fmean(values), 1),
        "stdev": round(statistics.stdev(values), 1) if len(values) > 1 else 0.0,
        "runs": len(values),
    }
