"""A serving group's metrics as its main node reads them, for a stack's ``top`` and cost run.

``llama-rpc-metrics`` (infra/boot/channel_scripts/) runs on a group's main node and asks each node
of the group for its node-exporter metrics and its own llama-server for ``/metrics`` and
``/slots``, inside the private network, and prints one JSON reading, which the provider's command
channel brings back. The script travels in the command itself (``infra.boot.metrics_command``).
The script keeps only what the view and the cost run use, the CPU counters summed over the
cores (``cpu="all"``), so a reading fits every channel's cap. This module reads its text and
fetches nothing:

- ``parse(text) -> GroupReading``: each node's exporter snapshot, the main node's llama-server
  snapshot and slots, and the main node's phase;
- ``usage_reading(group, names) -> usage.Reading``: the cost run's counters of every node;
- ``view_readings(group, names) -> [topview.NodeReading]``: the live view's.

Snapshots are timed by the main node's clock (epoch seconds) when each answer came, so two
readings of one node make an interval whatever the channel took to bring them.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infra.core.layout import node_name
from infra.core.node_text import printable
from infra.observe import metrics
from infra.observe.metrics import MetricsError, Sample, Snapshot
from infra.observe.status import phase_text
from infra.observe.topview import NodeReading as ViewNode
from infra.observe.usage import KvCacheReading, NodeCounters, Reading

PACKED = "gz64:"  # what the script's --pack output starts with
VERSION = 1
# A phase is a word; what the main node's status file says is cut to this and made printable.
PHASE_CHARS = 40
# How a worker's phase shows: only the main node has a status file the script reads; a worker
# is known by whether its exporter answered.
WORKER_ANSWERING = "answering"
WORKER_SILENT = "no answer"


@dataclass(frozen=True)
class NodeMetrics:
    ip: str
    role: str
    exporter: Snapshot | None  # None: it did not answer (``error`` says why)
    error: str = ""


@dataclass(frozen=True)
class GroupReading:
    at: float  # the main node's clock when the reading began, epoch seconds
    phase: str  # the main node's, from its status file
    nodes: tuple[NodeMetrics, ...]  # the main node first, then its workers in --rpc order
    server: Snapshot | None  # llama-server's /metrics; None: ``server_error`` says why
    slots: tuple[Mapping[str, Any], ...] | None
    server_error: str = ""


def unpack(text: str) -> str:
    """The JSON of a reading, packed (``--pack``: gzip in base64) or not."""
    text = text.strip()
    if not text.startswith(PACKED):
        return text
    try:
        return gzip.decompress(base64.b64decode(text[len(PACKED) :], validate=True)).decode()
    except (binascii.Error, OSError, EOFError) as error:
        raise MetricsError(f"a packed reading that does not unpack: {error}") from None


def _samples(rows: Any) -> list[Sample]:
    if not isinstance(rows, list):
        raise MetricsError(f"expected a list of samples, got {type(rows).__name__}")
    samples = []
    for row in rows:
        if not (isinstance(row, list) and len(row) == 3 and isinstance(row[1], dict)):
            raise MetricsError(f"a sample is [name, labels, value], got {row!r}"[:200])
        samples.append(Sample(str(row[0]), {str(k): str(v) for k, v in row[1].items()}, row[2]))
    return samples


def parse(text: str) -> GroupReading:
    """One reading printed by ``llama-rpc-metrics read``."""
    try:
        document = json.loads(unpack(text))
    except json.JSONDecodeError as error:
        raise MetricsError(f"the reading is not JSON ({error}): {text.strip()[:200]!r}") from None
    if not isinstance(document, dict) or document.get("version") != VERSION:
        raise MetricsError(
            f"expected a llama-rpc-metrics reading of version {VERSION}: {text.strip()[:200]!r}"
        )
    nodes = []
    for entry in document["nodes"]:
        exporter = None
        if "exporter" in entry:
            exporter = Snapshot.of(_samples(entry["exporter"]), float(entry["at"]))
        nodes.append(NodeMetrics(entry["ip"], entry["role"], exporter, entry.get("error", "")))
    server_entry = document.get("server") or {}
    server = slots = None
    if "metrics" in server_entry:
        server = Snapshot.of(_samples(server_entry["metrics"]), float(server_entry["at"]))
        slots = tuple(server_entry.get("slots") or ())
    return GroupReading(
        at=float(document["at"]),
        phase=printable(_phase(document), PHASE_CHARS),
        nodes=tuple(nodes),
        server=server,
        slots=slots,
        server_error=str(server_entry.get("error", "")),
    )


def _node_counters(exporter: Snapshot) -> NodeCounters | None:
    cpu = metrics.cpu_busy_seconds(exporter)
    memory = metrics.memory(exporter)
    traffic = metrics.network_bytes(exporter)  # every interface but loopback
    if cpu is None or memory is None or not traffic:
        return None
    return NodeCounters(
        cpu_seconds=cpu,
        memory_bytes=memory.used_bytes,
        received_bytes=sum(b.received for b in traffic.values()),
        sent_bytes=sum(b.sent for b in traffic.values()),
    )


def usage_reading(group: GroupReading, names: Mapping[str, str]) -> Reading:
    """The cost run's reading: each answering node's counters, under its name (``names``: by
    private address), and the KV cache from the main node's slots."""
    nodes = {}
    for node in group.nodes:
        counters = _node_counters(node.exporter) if node.exporter else None
        if counters is not None:
            nodes[names.get(node.ip, node.ip)] = counters
    kv_cache = None
    ratio = metrics.kv_cache_usage(group.server, group.slots) if group.slots else None
    if ratio is not None and group.slots:
        kv_cache = KvCacheReading(ratio, sum(int(slot["n_ctx"]) for slot in group.slots))
    # When the nodes answered (read at once), on the main node's clock.
    times = [n.exporter.taken_at for n in group.nodes if n.exporter is not None]
    at = sum(times) / len(times) if times else group.at
    return Reading(at=at, nodes=nodes, kv_cache=kv_cache)


def view_readings(group: GroupReading, names: Mapping[str, str]) -> list[ViewNode]:
    """The live view's reading of each node of the group."""
    readings = []
    for node in group.nodes:
        main = node.role == "main"
        notes: list[str] = []
        if node.exporter is None:
            notes.append(f"node-exporter did not answer the main node ({node.error})")
        if main and group.server is None and group.phase == "serving":
            notes.append(f"llama-server's /metrics did not answer ({group.server_error})")
        phase = group.phase if main else WORKER_ANSWERING if node.exporter else WORKER_SILENT
        readings.append(
            ViewNode(
                name=names.get(node.ip, node.ip),
                role=node.role,
                phase=phase,
                taken_at=node.exporter.taken_at if node.exporter else group.at,
                exporter=node.exporter,
                server=group.server if main else None,
                slots=group.slots if main else None,
                notes=tuple(notes),
            )
        )
    return readings


def node_names(group_ips: Sequence[Sequence[str]]) -> dict[str, str]:
    """Each node's name by private address, as the stacks name them (``infra.core.layout``), from
    each group's addresses (main first)."""
    return {
        ip: node_name(index, group)
        for group, ips in enumerate(group_ips)
        for index, ip in enumerate(ips)
    }


def _phase(document: dict[str, Any]) -> str:
    """The main node's phase, with the percent it counted of it (``downloading 41%``)."""
    found = document.get("status")
    if isinstance(found, dict) and found:
        return phase_text(found, short=True)
    return str(document.get("phase", "starting"))
