"""Reaching a local cluster's nodes, as root: a command in a node's machine or namespace (the
local equivalent of SSM Session Manager or IAP), a machine's journal and reboot, and the command
channel the cost run and ``top`` use on a cloud."""

from __future__ import annotations

import shlex
import subprocess

from infra.live import ChannelError
from infra.local.machines import MachineError
from infra.local.netns import exec_prefix
from infra.local.options import LocalClusterError
from infra.local.spec import ClusterSpec


def exec_argv(spec: ClusterSpec, name: str, command: list[str]) -> list[str]:
    """The host command line that runs ``command`` on a node, as root: inside its machine, or
    in its network namespace."""
    node = spec.node(name)
    if node.machine is not None:
        try:
            return node.booted().exec_argv(command)
        except MachineError as error:
            raise LocalClusterError(str(error)) from None
    if not node.namespace:
        raise LocalClusterError(
            "the nodes share this machine's loopback: run the command here, or bring the cluster "
            "up with namespaces (as root) or --machines"
        )
    return [*exec_prefix(node.namespace), *command]


def journal_argv(spec: ClusterSpec, name: str, args: list[str]) -> list[str]:
    """journalctl reading a machine's journal from the host, running or stopped."""
    if not spec.machines:
        raise LocalClusterError(
            f"only machines keep a journal; this cluster's logs are in "
            f"{spec.nodes[0].status_file.parents[2] / 'logs'}"
        )
    return spec.node(name).booted().journal_argv(args)


def reboot(spec: ClusterSpec, name: str) -> None:
    """Stop a machine and start it again: the same disk, a fresh boot, as a VM's reboot."""
    if not spec.machines:
        raise LocalClusterError("reboot is for machines (`up --machines`)")
    machine = spec.node(name).booted()
    try:
        machine.stop()
        machine.start()
    except MachineError as error:
        raise LocalClusterError(str(error)) from None


class LocalChannel:
    """The local cluster: the command runs in the node's machine or namespace, as root."""

    max_output: int | None = None

    def __init__(self, spec: ClusterSpec, node: str):
        self.spec, self.node = spec, node

    def run(self, command: list[str], timeout: float) -> str:
        try:
            argv = exec_argv(self.spec, self.node, command)
        except LocalClusterError as error:
            raise ChannelError(str(error)) from None
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            raise ChannelError(
                f"{shlex.join(command)} on {self.node}: {result.stderr.strip()[-500:]}"
            )
        return result.stdout
