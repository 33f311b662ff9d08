"""The Pulumi program: read the stack's config, ask the cloud account what the stack needs (the
preflight), build the cluster (VMs, or with platform kubernetes an EKS cluster), export the
output contract. Nothing is created before both pass.
"""

from __future__ import annotations

import pulumi

from infra import preflight
from infra.live import LiveError, Reader, live_cloud
from infra.stack import config as stack_config
from infra.stack.component import LlamaRpcCluster, LlamaRpcClusterArgs
from infra.stack.kube.eks import LlamaRpcKubernetesCluster, LlamaRpcKubernetesClusterArgs


def run(read_account: Reader | None = None) -> LlamaRpcCluster | LlamaRpcKubernetesCluster:
    """``read_account``: how the preflight reads the account (the provider's credentials by
    default; tests give recorded answers)."""
    try:
        config = stack_config.load()
    except stack_config.ConfigError as error:
        # A RunError prints the message alone: nothing has been created at this point.
        raise pulumi.RunError(str(error)) from None
    needs = config.needs(pulumi.get_stack())
    live = live_cloud(config.cloud)
    # The provider's own settings the preflight reads with (its credentials and profile).
    settings = {
        f"{config.cloud}:{key}": pulumi.Config(config.cloud).get(key)
        for key in live.provider_settings
    }
    if read_account is None:
        read_account = live.program_reader(settings)
    try:
        account = read_account(needs)
    except LiveError as error:
        raise pulumi.RunError(f"preflight: {error}") from None
    for unread in account.unread:
        pulumi.log.warn(f"preflight: {unread}")
    problems = preflight.problems(needs, account)
    if problems:
        raise pulumi.RunError(
            "the cloud account is not ready for this stack, and nothing was created:\n"
            + "\n".join(f"  - {problem}" for problem in problems)
        )
    zone = preflight.zone_for(needs, account)
    cluster: LlamaRpcCluster | LlamaRpcKubernetesCluster
    if config.kubernetes:
        kube_args = LlamaRpcKubernetesClusterArgs(
            config=config, zone=zone, aws_profile=settings.get("aws:profile")
        )
        cluster = LlamaRpcKubernetesCluster(pulumi.get_project(), kube_args)
    else:
        cluster = LlamaRpcCluster(pulumi.get_project(), LlamaRpcClusterArgs(config, zone))
    for key, value in {**cluster.outputs, **cluster.details}.items():
        pulumi.export(key, value)
    return cluster
