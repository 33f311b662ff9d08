"""Reaching a local cluster's nodes: the command channel the cost run and a stack's ``top`` use
on a cloud, here run in the node's machine or namespace."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Mapping
from typing import Any

from infra.local import cluster
from infra.observe.channels import ChannelError


class LocalChannel:
    """The local cluster: the command runs in the node's machine or namespace, as root."""

    max_output: int | None = None

    def __init__(self, spec: Mapping[str, Any], node: str):
        self.spec, self.node = spec, node

    def run(self, command: list[str], timeout: float) -> str:
        try:
            argv = cluster.exec_argv(dict(self.spec), self.node, command)
        except cluster.LocalClusterError as error:
            raise ChannelError(str(error)) from None
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            raise ChannelError(
                f"{shlex.join(command)} on {self.node}: {result.stderr.strip()[-500:]}"
            )
        return result.stdout
