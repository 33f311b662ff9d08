"""The cloud-config emitter (``infra.boot.cloud_yaml``), which writes each block once and
replays it: the same bytes as PyYAML's own emitter for every node of every shipped stack (and
its balancer node), and for blocks written again at other columns and depths. A node's user
data that changed would replace the node."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from infra.boot import balancer, cloud_config, cloud_yaml
from infra.boot.cloud_yaml import dump
from tests.pulumi_mocks import (
    GUARDED,
    KUBERNETES_STACKS,
    NO_KEY,
    overrides_of,
    parsed_config,
    stack_names,
)


class PlainDumper(yaml.SafeDumper):
    """PyYAML's emitter as it is, with the same representer."""


PlainDumper.add_representer(str, cloud_yaml._represent_str)


def plain(config: dict[str, Any]) -> str:
    return yaml.dump(config, Dumper=PlainDumper, sort_keys=False, width=100)


@pytest.mark.parametrize("stack", stack_names())
def test_every_node_gets_the_bytes_pyyamls_emitter_writes(stack: str) -> None:
    # Replicas with guards (on EKS, which refuses guards: without a key) bring every script.
    settings = NO_KEY if stack in KUBERNETES_STACKS else GUARDED
    for overrides in ({}, overrides_of(settings)):
        config = parsed_config(stack, overrides)
        nodes = [
            cloud_config(boot) for group in range(config.replicas) for boot in config.boots(group)
        ]
        if config.balancer_boot is not None:
            nodes.append(balancer.cloud_config(config.balancer_boot))
        for node in nodes:
            assert dump(node) == plain(node)


def ours(value: Any) -> str:
    """Any document through the emitter ``dump`` uses."""
    return yaml.dump(value, Dumper=cloud_yaml._LiteralDumper, sort_keys=False, width=100)


def test_a_block_written_again_elsewhere_is_written_as_there() -> None:
    """The same literal and double-quoted blocks again at another column with the same
    indentation, at another indentation in the same column, alone as a document, in the next
    document: each as PyYAML's emitter writes it there."""
    literal = "#!/bin/bash\nset -eu\n\necho 'a # b'\n"
    quoted = "a line with a trailing space \n\ttabbed\n" * 12  # no literal block: split lines
    kept = "two breaks at the end\n\n"
    document = {
        "q": quoted,
        "quoted": quoted,  # the same indentation, another column
        "abc": literal,  # column 4, indentation 2
        "b": {"c": literal, "d": [literal, quoted, {"e": kept}]},  # column 4, indentation 4
        "f": [[quoted, literal], kept],
    }
    for value in (document, literal, quoted, [literal], document):
        assert ours(value) == plain(value)
    assert '"a line with a trailing space' in plain(document)
