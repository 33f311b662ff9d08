"""The Pulumi program: read the stack's config, build the cluster, export the output contract."""

from __future__ import annotations

import pulumi

from infra.stack import config as stack_config
from infra.stack.component import LlamaRpcCluster, LlamaRpcClusterArgs


def run() -> LlamaRpcCluster:
    try:
        config = stack_config.load()
    except stack_config.ConfigError as error:
        # A RunError prints the message alone: nothing has been created at this point.
        raise pulumi.RunError(str(error)) from None
    cluster = LlamaRpcCluster(pulumi.get_project(), LlamaRpcClusterArgs(config=config))
    for key, value in {**cluster.outputs, **cluster.details}.items():
        pulumi.export(key, value)
    return cluster
