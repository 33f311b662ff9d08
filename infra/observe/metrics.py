"""What a node is doing, from its metrics: parse them, and derive figures from two snapshots.

Every node runs prometheus-node-exporter on ``METRICS_PORT``; the main node's llama-server
serves ``/metrics`` (started with ``--metrics``) and ``/slots`` on its API port. This module
reads their text and turns two snapshots taken some seconds apart into the figures a person
watches. It fetches nothing (``infra.local.top`` and the cost run fetch), so it is pure.

API
- ``parse_exposition(text) -> list[Sample]``: the Prometheus text exposition format.
- ``Snapshot.parse(text, taken_at)`` / ``Snapshot.of(samples, taken_at)``: samples and the
  monotonic time they were read; ``snapshot.value(name, **labels)`` sums the matching samples.
  Two snapshots of the same source (node-exporter, or llama-server) make an interval.
- Node-exporter, from one snapshot: ``memory(s) -> Memory | None`` (used = MemTotal -
  MemAvailable), ``network_bytes(s) -> {device: NetworkBytes}`` (lo excluded).
- Node-exporter, from one: ``cpu_busy_seconds(s)``, every core's busy seconds together.
- Node-exporter, from two: ``cpu_use(a, b) -> CpuUse | None`` (busy % of each core and their
  mean), ``network_use(a, b) -> {device: NetworkUse}`` (bytes in the interval and per second),
  ``disk_use(a, b) -> {device: DiskUse}``.
- llama-server: ``tokens_generated(a, b)`` and ``tokens_per_second(a, b)`` (from
  ``llamacpp:tokens_predicted_total``), ``requests(s) -> Requests`` (processing, deferred),
  ``draft_acceptance(s) -> DraftAcceptance | None`` (a draft model's drafted and accepted tokens),
  ``kv_cache_usage(s, slots)``: the ratio of KV cache cells in use (the pinned llama.cpp exports
  no KV metric, so it is read from ``/slots``: tokens each slot holds over its ``n_ctx``; a
  ``llamacpp:kv_cache_usage_ratio`` sample, which newer builds export, wins when present).
- ``proc_net_dev_samples(text)``: a network namespace's ``/proc/net/dev`` as node-exporter's
  ``node_network_{receive,transmit}_bytes_total`` samples, so the same functions read a node
  that runs no exporter (the local cluster's processes mode).

Counters that went backwards (the exporter or the server restarted) count from zero, as
Prometheus' ``increase()`` does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# node-exporter's CPU modes that are not work: the rest (user, system, nice, irq, softirq,
# steal) is time the core was busy. iowait is idle time spent waiting for a disk.
IDLE_CPU_MODES = frozenset({"idle", "iowait"})
LOOPBACK_DEVICES = frozenset({"lo"})


class MetricsError(ValueError):
    """Metrics text that does not follow the exposition format, or snapshots that do not pair."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        return self.name == name and all(self.labels.get(k) == v for k, v in labels.items())


# A metric name (llama-server's have a colon: llamacpp:tokens_predicted_total).
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def parse_exposition(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition (version 0.0.4); comments are skipped."""
    samples = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            samples.append(_parse_sample(line))
        except MetricsError as error:
            raise MetricsError(f"line {number}: {error}: {line[:120]!r}") from None
    return samples


def _parse_sample(line: str) -> Sample:
    name_match = _NAME.match(line)
    if not name_match:
        raise MetricsError("no metric name")
    name, rest = name_match.group(), line[name_match.end() :]
    labels: dict[str, str] = {}
    if rest.startswith("{"):
        labels, rest = _parse_labels(rest[1:])
    fields = rest.split()
    if not fields or len(fields) > 2:  # value, and an optional timestamp in ms
        raise MetricsError("expected a value and at most a timestamp after the name")
    return Sample(name, labels, _parse_value(fields[0]))


def _parse_labels(text: str) -> tuple[dict[str, str], str]:
    """Labels up to the closing brace, and the text after it."""
    labels: dict[str, str] = {}
    position = 0
    while True:
        while text[position : position + 1] in (" ", ","):
            position += 1
        if text[position : position + 1] == "}":
            return labels, text[position + 1 :]
        label = _LABEL_NAME.match(text, position)
        if not label or text[label.end() : label.end() + 2] != '="':
            raise MetricsError("malformed label")
        position = label.end() + 2
        value = []
        while True:
            if position >= len(text):
                raise MetricsError("unterminated label value")
            char = text[position]
            if char == "\\" and position + 1 < len(text):
                value.append(_ESCAPES.get(text[position + 1], "\\" + text[position + 1]))
                position += 2
            elif char == '"':
                position += 1
                break
            else:
                value.append(char)
                position += 1
        labels[label.group()] = "".join(value)


def _parse_value(text: str) -> float:
    special = {"+Inf": math.inf, "Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}
    if text in special:
        return special[text]
    try:
        return float(text)
    except ValueError:
        raise MetricsError(f"value {text!r} is not a number") from None


@dataclass(frozen=True)
class Snapshot:
    """One read of one source's metrics, and when (``time.monotonic()`` seconds) it was read."""

    taken_at: float
    samples: tuple[Sample, ...] = field(repr=False)

    @classmethod
    def parse(cls, text: str, taken_at: float) -> Snapshot:
        return cls(taken_at, tuple(parse_exposition(text)))

    @classmethod
    def of(cls, samples: Iterable[Sample], taken_at: float) -> Snapshot:
        return cls(taken_at, tuple(samples))

    def select(self, name: str, **labels: str) -> list[Sample]:
        return [s for s in self.samples if s.matches(name, labels)]

    def value(self, name: str, **labels: str) -> float | None:
        """The sum of the samples with this name and these labels; None when there are none."""
        found = self.select(name, **labels)
        return sum(s.value for s in found) if found else None

    def has(self, name: str) -> bool:
        return any(s.name == name for s in self.samples)


def _elapsed(before: Snapshot, after: Snapshot) -> float:
    elapsed = after.taken_at - before.taken_at
    if elapsed <= 0:
        raise MetricsError(
            f"the second snapshot must be taken after the first (taken_at {before.taken_at} "
            f"then {after.taken_at})"
        )
    return elapsed


def increase(before: float, after: float) -> float:
    """A counter's growth; a counter that went backwards restarted from zero."""
    return after - before if after >= before else after


def _by_label(snapshot: Snapshot, name: str, label: str) -> dict[str, float]:
    totals: dict[str, float] = {}
    for sample in snapshot.select(name):
        key = sample.labels.get(label)
        if key is not None:
            totals[key] = totals.get(key, 0.0) + sample.value
    return totals


# --- node-exporter ------------------------------------------------------------------------


@dataclass(frozen=True)
class CpuUse:
    """Busy share of each core in the interval, in percent (0-100), and the cores' mean."""

    mean_percent: float
    per_core_percent: Mapping[str, float]


def cpu_use(before: Snapshot, after: Snapshot) -> CpuUse | None:
    """From ``node_cpu_seconds_total{cpu,mode}``; None when the exporter reports no CPU."""
    _elapsed(before, after)
    busy_before, total_before = _cpu_seconds(before)
    busy_after, total_after = _cpu_seconds(after)
    per_core: dict[str, float] = {}
    for cpu, total in total_after.items():
        if cpu not in total_before:
            continue
        spent = increase(total_before[cpu], total)
        busy = increase(busy_before[cpu], busy_after[cpu])
        # Measured against the core's own seconds, not the wall clock: the snapshots' times and
        # the kernel's accounting never quite agree, and this stays within 0-100.
        per_core[cpu] = 100.0 * min(max(busy / spent, 0.0), 1.0) if spent > 0 else 0.0
    if not per_core:
        return None
    ordered = dict(sorted(per_core.items(), key=lambda item: _core_order(item[0])))
    return CpuUse(sum(ordered.values()) / len(ordered), ordered)


def cpu_busy_seconds(snapshot: Snapshot) -> float | None:
    """CPU seconds every core together spent busy since boot (100 % of one core for one second
    is one); None when the exporter reports no CPU."""
    busy, total = _cpu_seconds(snapshot)
    return sum(busy.values()) if total else None


def _core_order(cpu: str) -> tuple[int, str]:
    return (int(cpu), "") if cpu.isdigit() else (1 << 30, cpu)


def _cpu_seconds(snapshot: Snapshot) -> tuple[dict[str, float], dict[str, float]]:
    busy: dict[str, float] = {}
    total: dict[str, float] = {}
    for sample in snapshot.select("node_cpu_seconds_total"):
        cpu, mode = sample.labels.get("cpu"), sample.labels.get("mode")
        if cpu is None or mode is None:
            continue
        total[cpu] = total.get(cpu, 0.0) + sample.value
        busy.setdefault(cpu, 0.0)
        if mode not in IDLE_CPU_MODES:
            busy[cpu] += sample.value
    return busy, total


@dataclass(frozen=True)
class Memory:
    used_bytes: int
    total_bytes: int

    @property
    def used_ratio(self) -> float:
        return self.used_bytes / self.total_bytes if self.total_bytes else 0.0


def memory(snapshot: Snapshot) -> Memory | None:
    """Used memory as ``free`` counts it: MemTotal - MemAvailable (page cache is not used)."""
    total = snapshot.value("node_memory_MemTotal_bytes")
    available = snapshot.value("node_memory_MemAvailable_bytes")
    if total is None or available is None:
        return None
    return Memory(int(total - available), int(total))


@dataclass(frozen=True)
class NetworkBytes:
    received: int
    sent: int


def network_bytes(snapshot: Snapshot) -> dict[str, NetworkBytes]:
    """Bytes each interface received and sent since boot; loopback excluded."""
    received = _by_label(snapshot, "node_network_receive_bytes_total", "device")
    sent = _by_label(snapshot, "node_network_transmit_bytes_total", "device")
    return {
        device: NetworkBytes(int(received[device]), int(sent.get(device, 0.0)))
        for device in sorted(received)
        if device not in LOOPBACK_DEVICES
    }


@dataclass(frozen=True)
class NetworkUse:
    """One interface over an interval: bytes, and bytes per second."""

    received: int
    sent: int
    received_per_second: float
    sent_per_second: float


def network_use(before: Snapshot, after: Snapshot) -> dict[str, NetworkUse]:
    """Per interface (loopback excluded) present in both snapshots."""
    elapsed = _elapsed(before, after)
    start = network_bytes(before)
    use = {}
    for device, end in network_bytes(after).items():
        if device not in start:
            continue
        received = int(increase(start[device].received, end.received))
        sent = int(increase(start[device].sent, end.sent))
        use[device] = NetworkUse(received, sent, received / elapsed, sent / elapsed)
    return use


def network_total(use: Mapping[str, NetworkUse]) -> NetworkUse:
    """Every interface's figures added up (a node's traffic to the rest of the cluster)."""
    return NetworkUse(
        sum(u.received for u in use.values()),
        sum(u.sent for u in use.values()),
        sum(u.received_per_second for u in use.values()),
        sum(u.sent_per_second for u in use.values()),
    )


@dataclass(frozen=True)
class DiskUse:
    read_bytes: int
    written_bytes: int
    read_per_second: float
    written_per_second: float


def disk_use(before: Snapshot, after: Snapshot) -> dict[str, DiskUse]:
    """From ``node_disk_{read,written}_bytes_total{device}``, per block device."""
    elapsed = _elapsed(before, after)
    read_start = _by_label(before, "node_disk_read_bytes_total", "device")
    written_start = _by_label(before, "node_disk_written_bytes_total", "device")
    read_end = _by_label(after, "node_disk_read_bytes_total", "device")
    written_end = _by_label(after, "node_disk_written_bytes_total", "device")
    use = {}
    for device in sorted(read_end):
        if device not in read_start:
            continue
        read = int(increase(read_start[device], read_end[device]))
        written = int(increase(written_start.get(device, 0.0), written_end.get(device, 0.0)))
        use[device] = DiskUse(read, written, read / elapsed, written / elapsed)
    return use


# --- llama-server -------------------------------------------------------------------------

TOKENS_PREDICTED = "llamacpp:tokens_predicted_total"
REQUESTS_PROCESSING = "llamacpp:requests_processing"
REQUESTS_DEFERRED = "llamacpp:requests_deferred"
KV_CACHE_USAGE_RATIO = "llamacpp:kv_cache_usage_ratio"
# Speculative decoding (a draft model): tokens drafted and those the model accepted.
DRAFT_TOKENS = "llamacpp:spec_decode_num_draft_tokens_total"
DRAFT_ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"


@dataclass(frozen=True)
class DraftAcceptance:
    drafted: int
    accepted: int

    @property
    def ratio(self) -> float:
        return self.accepted / self.drafted


def draft_acceptance(snapshot: Snapshot) -> DraftAcceptance | None:
    """The drafted tokens the model accepted since llama-server started; None without a draft
    model, or before it drafted anything."""
    drafted, accepted = snapshot.value(DRAFT_TOKENS), snapshot.value(DRAFT_ACCEPTED)
    if not drafted or accepted is None:
        return None
    return DraftAcceptance(int(drafted), int(accepted))


def tokens_generated(before: Snapshot, after: Snapshot) -> int | None:
    """Tokens llama-server generated in the interval (prompt tokens not counted)."""
    start, end = before.value(TOKENS_PREDICTED), after.value(TOKENS_PREDICTED)
    if start is None or end is None:
        return None
    return int(increase(start, end))


def tokens_per_second(before: Snapshot, after: Snapshot) -> float | None:
    """Generated tokens per wall-clock second over the interval, every request together."""
    elapsed = _elapsed(before, after)
    generated = tokens_generated(before, after)
    return None if generated is None else generated / elapsed


@dataclass(frozen=True)
class Requests:
    processing: int
    deferred: int


def requests(snapshot: Snapshot) -> Requests | None:
    processing = snapshot.value(REQUESTS_PROCESSING)
    deferred = snapshot.value(REQUESTS_DEFERRED)
    if processing is None or deferred is None:
        return None
    return Requests(int(processing), int(deferred))


def kv_cache_usage(snapshot: Snapshot | None, slots: Sequence[Any] | None = None) -> float | None:
    """The share (0-1) of the KV cache's cells holding tokens.

    ``slots`` is llama-server's ``/slots`` JSON: each slot's ``n_ctx`` is its share of the cache
    (``--ctx-size`` / ``--parallel``), and ``n_prompt_tokens`` the tokens it holds (prompt and
    generated; a finished request's tokens stay cached for the next one, so they count).
    """
    if snapshot is not None:
        ratio = snapshot.value(KV_CACHE_USAGE_RATIO)
        if ratio is not None:
            return ratio
    if not slots:
        return None
    held = capacity = 0
    for slot in slots:
        if not isinstance(slot, Mapping) or not isinstance(slot.get("n_ctx"), int):
            raise MetricsError(f"a /slots entry without an integer n_ctx: {slot!r}"[:200])
        capacity += slot["n_ctx"]
        held += min(int(slot.get("n_prompt_tokens") or 0), slot["n_ctx"])
    return held / capacity if capacity else None


# --- nodes without an exporter ------------------------------------------------------------


def proc_net_dev_samples(text: str) -> list[Sample]:
    """``/proc/net/dev`` (of a network namespace) as node-exporter's network byte counters."""
    samples = []
    for line in text.splitlines():
        if ":" not in line or line.lstrip().startswith(("Inter-", "face")):
            continue
        device, counters = line.split(":", 1)
        fields = counters.split()
        if len(fields) < 9 or not (fields[0].isdigit() and fields[8].isdigit()):
            raise MetricsError(f"/proc/net/dev line without byte counters: {line!r}")
        labels = {"device": device.strip()}
        samples.append(Sample("node_network_receive_bytes_total", labels, float(fields[0])))
        samples.append(Sample("node_network_transmit_bytes_total", labels, float(fields[8])))
    return samples
