"""What every node of a deployed stack is doing, refreshed live (``lrc top --stack S``).

The view of ``lrc local top`` (``infra.observe.topview``), read through the provider's
command channel (``infra.live``: SSM, IAP SSH, Run Command): each serving group's main
node runs ``llama-rpc-metrics``, which reads every node of its group inside the private network
(node-exporter on each, and its own llama-server), and the groups are asked at once. Nothing is
opened to the outside for it: the metrics port stays closed to everything beyond the cluster's
network.

A channel command takes seconds (Azure's Run Command tens of them), so a frame is drawn from two
readings at least ``--interval`` apart, timed by the main node's clock.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TextIO

from infra.boot import metrics_command
from infra.core import outputs as keys
from infra.core.outputs import group_outputs
from infra.live import Channel, ChannelError
from infra.observe import group_metrics
from infra.observe.metrics import MetricsError
from infra.observe.topview import NodeReading, Row, live, render, row

READ_TIMEOUT_SECONDS = 120
DEFAULT_INTERVAL_SECONDS = 10.0
FOOTER = (
    "RX, TX: bytes on every interface but loopback (since boot), and per second; a main node's "
    "also carry the requests, the command channel and these readings. KV %: KV cache cells in "
    "use; TOK/s: tokens generated; REQ: requests processing+deferred.",
    "CPU %: the share of all the node's cores busy; MEMORY: MemTotal - MemAvailable "
    "(node-exporter). A worker's "
    "phase is not known to its main node: 'answering' says its exporter answered.",
)


@dataclass(frozen=True)
class Group:
    """A serving group: the channel to its main node, and its nodes' addresses (main first)."""

    channel: Channel
    ips: tuple[str, ...]


def stack_groups(stack_outputs: Mapping[str, Any], channels: Sequence[Channel]) -> list[Group]:
    found = group_outputs(stack_outputs)
    if len(found) != len(channels):
        raise ValueError(f"{len(found)} serving groups but {len(channels)} channels")
    return [
        Group(channel, (str(g[keys.MAIN_PRIVATE_IP]), *map(str, g[keys.WORKER_PRIVATE_IPS])))
        for g, channel in zip(found, channels, strict=True)
    ]


def read_group(group: Group, names: Mapping[str, str]) -> list[NodeReading]:
    """Every node of the group, in order; a group that could not be read says why."""
    try:
        command = metrics_command.read_command(group.channel.max_output)
        text = group.channel.run(command, READ_TIMEOUT_SECONDS)
        read = {r.name: r for r in group_metrics.view_readings(group_metrics.parse(text), names)}
        why = "the main node did not list it (is its node.env this stack's?)"
    except (ChannelError, MetricsError, OSError) as error:
        read, why = {}, f"the main node could not be read: {error}"
    now = time.time()
    return [
        read.get(names[ip])
        or NodeReading(names[ip], "main" if i == 0 else "worker", "unknown", now, notes=(why,))
        for i, ip in enumerate(group.ips)
    ]


def read_stack(groups: Sequence[Group], names: Mapping[str, str]) -> list[NodeReading]:
    with ThreadPoolExecutor(max_workers=max(1, len(groups))) as pool:
        return [r for found in pool.map(lambda g: read_group(g, names), groups) for r in found]


def safe_row(before: NodeReading, after: NodeReading) -> Row:
    try:
        return row(before, after, cpus=1)  # cpus: only for processes, which a stack has not
    except MetricsError as error:
        return Row(after.name, after.role, after.phase, notes=(*after.notes, str(error)))


def rows(before: Sequence[NodeReading], after: Sequence[NodeReading]) -> list[Row]:
    return [safe_row(b, a) for b, a in zip(before, after, strict=True)]


def frame(title: str, before: Sequence[NodeReading], after: Sequence[NodeReading]) -> str:
    return render(rows(before, after), title, FOOTER)


def run(
    stack: str,
    groups: Sequence[Group],
    *,
    interval: float,
    once: bool,
    out: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    draw_rows: Callable[[list[Row]], str] | None = None,
) -> int:
    """Print a frame at most every ``interval`` seconds until interrupted; with ``once``, one
    frame from two readings ``interval`` apart; with ``draw_rows``, once, what it draws of the
    rows (``--json``)."""
    if interval <= 0:
        raise ValueError(f"--interval {interval}: give a positive number of seconds")
    names = group_metrics.node_names([g.ips for g in groups])
    nodes = sum(len(g.ips) for g in groups)
    shown_groups = f", {len(groups)} serving groups" if len(groups) > 1 else ""

    def draw(before: list[NodeReading], after: list[NodeReading]) -> str:
        title = (
            f"stack {stack!r} ({nodes} nodes{shown_groups}) · every {interval:g} s or as "
            f"fast as the channel answers · {time.strftime('%H:%M:%S')}"
        )
        return frame(title, before, after)

    def shown(before: list[NodeReading], after: list[NodeReading]) -> str:
        return draw(before, after) if draw_rows is None else draw_rows(rows(before, after))

    return live(
        lambda: read_stack(groups, names), shown,
        interval=interval, once=once or draw_rows is not None, out=out or sys.stdout,
        sleep=sleep, clock=clock,
    )  # fmt: skip
