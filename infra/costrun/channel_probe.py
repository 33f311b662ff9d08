"""A stack's usage, read by its main node through the command channel.

``llama-rpc-metrics`` on the first serving group's main node reads every node of the group inside
the private network (``infra.observe.group_metrics``). A reading (``read``) is one command; during
the benchmark the node records a reading every interval itself (``record``, a transient systemd
unit), and the file comes back afterwards in pieces that fit the channel's cap (``dump``). So
the benchmark runs undisturbed by channel commands, on Azure too, whose Run Command runs one
command at a time per VM, and the readings are timed by the node's clock, not the channel's.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from infra.boot import metrics_command
from infra.core import outputs as keys
from infra.core.outputs import group_outputs
from infra.live import Channel, ChannelError
from infra.observe import group_metrics
from infra.observe.usage import Reading

READ_TIMEOUT_SECONDS = 120
RECORD_UNIT = "llama-rpc-usage"
RECORD_FILE = "/run/llama-rpc-usage.jsonl"  # root's alone
# A recording ends by itself after this long, should nothing stop it.
RECORD_LIMIT_SECONDS = 4 * 3600
# Room for the length line and a newline within a channel's cap.
DUMP_MARGIN = 64
# A channel that brings back this little (Azure Run Command, tens of seconds a command) reads at
# least this far apart, so that the recording comes back in a few commands.
SMALL_CAP_CHARS = 8192
SMALL_CAP_INTERVAL_SECONDS = 10.0
ATTEMPTS = 2  # each command that brings the recording back


class ChannelProbe:
    """Reads the first serving group through its main node's command channel."""

    def __init__(self, channel: Channel, stack_outputs: Mapping[str, Any]) -> None:
        self.channel = channel
        group = group_outputs(stack_outputs)[0]
        ips = [str(group[keys.MAIN_PRIVATE_IP]), *map(str, group[keys.WORKER_PRIVATE_IPS])]
        self.names = group_metrics.node_names([ips])
        self._roles = {self.names[ip]: "main" if i == 0 else "worker" for i, ip in enumerate(ips)}

    @property
    def roles(self) -> Mapping[str, str]:
        return self._roles

    def describe(self) -> dict[str, str]:
        return {
            "cpu": "node-exporter on each node: every core's busy seconds (node_cpu_seconds_total "
            "but idle and iowait)",
            "memory": "node-exporter: MemTotal - MemAvailable",
            "bytes": "node-exporter: every interface but loopback (the main node's carries the "
            "command channel and the readings too)",
            "kv_cache": "llama-server /slots on the main node",
            "read": "llama-rpc-metrics on the main node, inside the private network",
        }

    def read(self) -> Reading:
        command = metrics_command.read_command(self.channel.max_output)
        text = self.channel.run(command, READ_TIMEOUT_SECONDS)
        return group_metrics.usage_reading(group_metrics.parse(text), self.names)

    def complete(self, body: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        encoded = base64.b64encode(json.dumps(body).encode()).decode()
        command = metrics_command.command("complete", encoded, "--timeout", str(timeout))
        reply: dict[str, Any] = json.loads(self.channel.run(command, timeout + 60))
        return reply

    def recorder(self, interval: float) -> NodeRecorder:
        cap = self.channel.max_output
        if cap is not None and cap < SMALL_CAP_CHARS:
            interval = max(interval, SMALL_CAP_INTERVAL_SECONDS)
        return NodeRecorder(self, interval)


class NodeRecorder:
    """The main node records a reading every ``interval`` seconds between ``start`` and ``stop``;
    ``stop`` brings the readings back."""

    def __init__(self, probe: ChannelProbe, interval: float) -> None:
        if interval <= 0:
            raise ValueError(f"the sampling interval must be positive, got {interval}")
        self.probe, self.interval = probe, interval
        self.failures = 0
        self.last_error = ""

    def start(self) -> NodeRecorder:
        # A recorder an earlier run left (a failed start, a kept stack) goes first.
        self.probe.channel.run(
            [
                "sh", "-c", 'systemctl stop "$1" 2>/dev/null; rm -f "$2"; shift 2; exec "$@"',
                "sh", RECORD_UNIT, RECORD_FILE,
                "systemd-run", f"--unit={RECORD_UNIT}", "--collect", "--quiet",
                *metrics_command.command(
                    "record", "--out", RECORD_FILE, "--interval", str(self.interval),
                    "--seconds", str(RECORD_LIMIT_SECONDS),
                ),
            ],
            READ_TIMEOUT_SECONDS,
        )  # fmt: skip
        return self

    def stop(self) -> list[Reading]:
        channel = self.probe.channel
        # systemctl stop waits for the recorder's last reading (it ends the window); a recorder
        # that already ended (its time limit) left its file all the same.
        channel.run(["sh", "-c", f"systemctl stop {RECORD_UNIT} || true"], READ_TIMEOUT_SECONDS)
        limit = (channel.max_output or 1 << 30) - DUMP_MARGIN
        pieces: list[str] = []
        total = None
        while total is None or sum(map(len, pieces)) < total:
            offset = sum(map(len, pieces))
            text = self._piece(offset, limit)
            length, _, piece = text.strip("\n").partition("\n")
            total = int(length)
            if not piece and sum(map(len, pieces)) < total:
                raise ValueError(f"the recording stopped at {offset} of {total} characters")
            pieces.append(piece.strip())
        readings = []
        for line in group_metrics.unpack("".join(pieces)).splitlines():
            try:
                readings.append(
                    group_metrics.usage_reading(group_metrics.parse(line), self.probe.names)
                )
            except (ValueError, KeyError) as error:
                self.failures += 1
                self.last_error = f"{type(error).__name__}: {error}"
        return readings

    def _piece(self, offset: int, limit: int) -> str:
        command = metrics_command.command(
            "dump", RECORD_FILE, "--offset", str(offset), "--limit", str(limit)
        )
        for attempt in range(ATTEMPTS):
            try:
                return self.probe.channel.run(command, READ_TIMEOUT_SECONDS)
            except ChannelError:
                if attempt + 1 == ATTEMPTS:
                    raise
        raise AssertionError("unreachable")
