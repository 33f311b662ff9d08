"""The local cluster as a cost-run target: machines on this machine, the command channel is
`lrc local exec`, and the audit looks for any process, namespace, mount or state the
cluster could have left."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from infra.costrun.rpc_bytes import ActivationShape, activation_shape
from infra.costrun.target import Prediction, StepError, parse_status
from infra.live import ChannelError
from infra.local import cluster
from infra.local import image as node_image
from infra.local.access import LocalChannel
from infra.local.machines import unavailable_reason
from infra.local.options import LocalClusterError, UpOptions, can_use_netns, state_dir
from infra.local.spec import ClusterSpec
from infra.local.usage import LocalProbe
from infra.observe.status import STATUS_COMMAND


class LocalTarget:
    provider = "local"

    def __init__(self, options: UpOptions, *, timeout: float = 1800) -> None:
        self.options = options
        self.name = f"local-{options.cluster_id}"
        self.timeout = timeout
        self._spec: ClusterSpec | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "provider": "local",
            "region": "this machine",
            "machine": f"{os.cpu_count()} cores, {platform.machine()}, {platform.node()}",
            "nodes": {"main": "machine", "workers": self.options.workers},
            "llama_cpp_commit": self.options.commit,
            "model": self.options.model.name,
            **({"draft_model": draft.name} if (draft := self.options.draft_model) else {}),
        }

    def predict(self) -> Prediction:
        return Prediction(
            hourly_usd=0.0,
            note="this machine is not in the catalog: no $ and no planner prediction",
        )

    def preflight(self) -> list[str]:
        missing = []
        if reason := unavailable_reason():
            missing.append(reason)
        elif not can_use_netns():
            missing.append("network namespaces need root, iproute2 and nftables")
        if node_image.cached(self.options.cache) is None:
            missing.append("the node image is not built: run `lrc local image`")
        if not self.options.model.is_file():
            missing.append(f"the model {self.options.model} does not exist")
        return missing

    def up(self) -> dict[str, Any]:
        try:
            contract = cluster.up(self.options, timeout=self.timeout)
        except LocalClusterError as error:
            raise StepError(str(error)) from None
        self._spec = ClusterSpec.load(self.options.cache, self.options.cluster_id)
        return contract

    def _exec(self, command: list[str], timeout: float) -> str:
        spec = self._spec or ClusterSpec.load(self.options.cache, self.options.cluster_id)
        try:
            return LocalChannel(spec, "main").run(command, timeout)
        except ChannelError as error:
            raise StepError(str(error)) from None

    def node_status(self) -> dict[str, Any]:
        return parse_status(self._exec(STATUS_COMMAND, timeout=30))

    def run_on_main(self, command: list[str], timeout: float) -> str:
        return self._exec(command, timeout)

    def usage_probe(self) -> LocalProbe:
        return LocalProbe(
            self._spec or ClusterSpec.load(self.options.cache, self.options.cluster_id)
        )

    def activation_shape(self) -> ActivationShape:
        return activation_shape(self.options.model)

    def destroy(self) -> None:
        try:
            cluster.down(self.options.cache, self.options.cluster_id)
        except LocalClusterError as error:
            raise StepError(str(error)) from None

    def leftovers(self) -> list[str]:
        prefix = f"lrc-{self.options.cluster_id}-"
        found = [
            f"network namespace {ns}"
            for ns in subprocess.run(
                ["ip", "netns", "list"], capture_output=True, text=True, check=False
            ).stdout.split()
            if ns.startswith(prefix)
        ]
        state = state_dir(self.options.cache, self.options.cluster_id)
        if state.exists():
            found.append(f"state directory {state}")
        for line in Path("/proc/self/mounts").read_text().splitlines():
            mount_point = line.split()[1]
            if mount_point.startswith(str(state)):
                found.append(f"mount {mount_point}")
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                command = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(
                arg.decode(errors="replace").startswith(f"--machine={prefix}") for arg in command
            ):
                found.append(f"process {entry.name} (systemd-nspawn of {prefix}*)")
        return found
