"""The names and limits every part of the product shares: clouds, node roles, ports, sizes."""

from __future__ import annotations

from typing import Literal, get_args

# A cloud's name: a key of ``infra.clouds.FACTS``, the registry that lists them.
Cloud = str
Role = Literal["main", "worker"]
# How a stack's nodes run: a VM each, or as pods of a Kubernetes cluster (EKS).
VM, KUBERNETES = "vm", "kubernetes"
PLATFORMS = (VM, KUBERNETES)
ROLES: tuple[Role, ...] = get_args(Role)

RPC_PORT = 50052
SERVER_PORT = 8080
# The services run as an unprivileged user, which cannot bind ports below this.
LOWEST_UNPRIVILEGED_PORT = 1024
# llama.cpp has 16 device slots, and at the pinned commit `--tensor-split` refuses a 16th value
# ("got 16 input configs, but system only has 16 devices"); the placement needs one per worker.
MAX_WORKERS = 15
MAX_NODES = MAX_WORKERS + 1
# Serving groups behind one balancer: each a main node and its workers, at their own addresses
# (``infra.core.layout.group_ips``), so that ten full groups still fit the private /24.
MAX_REPLICAS = 10
# prometheus-node-exporter's port on every node: open from inside the cluster only.
METRICS_PORT = 9100

# Speculative decoding's defaults: 8 tokens a step at most, the length the published acceptance
# the planner uses was measured at; the draft stops below 0.75 (llama.cpp's default before it
# became 0, at which acceptance collapses: ggml-org/llama.cpp#25908).
DEFAULT_DRAFT_MAX = 8
DEFAULT_DRAFT_P_MIN = 0.75
MAX_DRAFT_TOKENS = 64
