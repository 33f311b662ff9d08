"""What a stack asks of its cloud account, for the preflight, from its checked configuration."""

from __future__ import annotations

from collections import Counter

from infra.clouds import FACTS
from infra.core.layout import PROJECT
from infra.preflight import Needs
from infra.stack.config import ClusterConfig


def needs_of(config: ClusterConfig, stack: str) -> Needs:
    counts: Counter[str] = Counter()
    vcpus: dict[str, int] = {}
    roles = [config.main_instance_type] + [config.instance_type] * config.worker_count
    for instance in roles * config.replicas:
        counts[instance.name] += 1
        vcpus[instance.name] = instance.vcpus
    facts = FACTS[config.cloud]
    return Needs(
        cloud=config.cloud,
        region=config.region,
        stack=stack,
        nodes=dict(counts),
        vcpus=vcpus,
        zone=config.zone,
        network_watcher=config.network_watcher if config.flow_logs else None,
        key_vault=config.cloud == "azure" and config.api_key != "none",
        tags={"project": PROJECT, "stack": facts.tag_value(stack)},
    )
