"""Whether a Kubernetes stack's pods fit its nodes: what a node keeps for itself (the kubelet's
reserve and eviction threshold, by the EKS AMI's own formula), what the platform runs beside the
stack (DaemonSets on every node; the LeaderWorkerSet controller and CoreDNS on any node), and a
packing of the stack's pods into its node groups that names each pod that fits nowhere.

The scheduler places the platform's pods first (the controller is applied before the
LeaderWorkerSet, CoreDNS comes with the cluster) on whichever node it likes, and no priority lets
the stack's pods preempt them: so every node keeps room for all of them at once. One rule for the
pods' requests (``infra.stack.kube.objects``) and for the check of a deployed graph
(``infra.conformance.kubernetes``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MILLI = 1000  # millicores a CPU
MIB = 1024**2

NODEADM = "awslabs/amazon-eks-ami nodeadm/internal/kubelet/config.go @81fec2e8"
MAX_PODS_SOURCE = (
    "https://docs.aws.amazon.com/eks/latest/userguide/choosing-instance-type.html (managed node "
    "groups cap max pods at 110 under 30 vCPUs, 250 above; nodeadm's ENI formula gives more "
    "on every Graviton type of 30 vCPUs or more)"
)
LWS_MANAGER = "kubernetes-sigs/lws v0.10.0 config/manager/manager.yaml (replicas 2; cpu 1, 1Gi)"
VPC_CNI = (
    "aws/amazon-vpc-cni-k8s @b5218838 charts/aws-vpc-cni values.yaml (resources.requests.cpu "
    "25m) and templates/daemonset.yaml (aws-node and aws-eks-nodeagent both take it)"
)
COREDNS = (
    "kubernetes/kubernetes cluster/addons/dns/coredns/coredns.yaml.base (requests cpu 100m, "
    "memory 70Mi), two replicas as EKS installs it"
)
KUBE_PROXY = "EKS's kube-proxy DaemonSet (requests cpu 100m, as kube-up's kube-proxy) ⚠"

# The AL2023 kubelet's kube-reserved CPU: 6 % of the first core, 1 % of the second, 0.5 % of
# the third and fourth, 0.25 % of the rest (getCPUMillicoresToReserve, in basis points).
CPU_RESERVE_STEPS: tuple[tuple[int | None, int], ...] = (
    (1 * MILLI, 600),
    (2 * MILLI, 100),
    (4 * MILLI, 50),
    (None, 25),
)
# Its kube-reserved memory: 11 MiB a pod it may run, plus 255 MiB (getMemoryMebibytesToReserve);
# and evictionHard memory.available 100Mi.
MEMORY_PER_POD_MIB = 11
MEMORY_BASE_MIB = 255
EVICTION_MEMORY_BYTES = 100 * MIB
SMALL_NODE_VCPUS = 30
MAX_PODS_SMALL, MAX_PODS_LARGE = 110, 250


@dataclass(frozen=True)
class Requests:
    """What a pod (or a container) asks the scheduler for."""

    cpu_milli: int
    memory_bytes: int

    def __add__(self, other: Requests) -> Requests:
        return Requests(self.cpu_milli + other.cpu_milli, self.memory_bytes + other.memory_bytes)

    def __sub__(self, other: Requests) -> Requests:
        return Requests(self.cpu_milli - other.cpu_milli, self.memory_bytes - other.memory_bytes)

    def holds(self, other: Requests) -> bool:
        return self.cpu_milli >= other.cpu_milli and self.memory_bytes >= other.memory_bytes

    def __str__(self) -> str:
        return f"{self.cpu_milli}m CPU, {self.memory_bytes // MIB}Mi"


NOTHING = Requests(0, 0)


def total(requests: Iterable[Requests]) -> Requests:
    found = NOTHING
    for each in requests:
        found += each
    return found


@dataclass(frozen=True)
class PlatformPod:
    """A pod the platform runs, not the stack: ``count`` of them, with their source."""

    name: str
    requests: Requests
    count: int
    source: str


# On every node (DaemonSets): kube-proxy, the VPC CNI (aws-node with its policy agent).
DAEMONSETS = (
    PlatformPod("kube-proxy", Requests(100, 0), 1, KUBE_PROXY),
    PlatformPod("aws-node", Requests(50, 0), 1, VPC_CNI),
)
# On any node: the LeaderWorkerSet controller and CoreDNS.
CLUSTER_PODS = (
    PlatformPod("the LeaderWorkerSet controller", Requests(MILLI, 1024 * MIB), 2, LWS_MANAGER),
    PlatformPod("CoreDNS", Requests(100, 70 * MIB), 2, COREDNS),
)


def kube_reserved_cpu_milli(vcpus: int) -> int:
    capacity, reserved, start = vcpus * MILLI, 0, 0
    for end, basis_points in CPU_RESERVE_STEPS:
        top = capacity if end is None else min(capacity, end)
        if top > start:
            reserved += (top - start) * basis_points // 10_000
        start = end if end is not None else start
    return reserved


def max_pods(vcpus: int) -> int:
    return MAX_PODS_SMALL if vcpus < SMALL_NODE_VCPUS else MAX_PODS_LARGE


def allocatable(vcpus: int, memory_bytes: int) -> Requests:
    """What the kubelet of an EKS AL2023 node offers pods (its capacity less kube-reserved and
    the eviction threshold). The capacity is the type's nominal memory: the kernel's own share
    is not known before a node boots ⚠."""
    memory_reserved = (MEMORY_PER_POD_MIB * max_pods(vcpus) + MEMORY_BASE_MIB) * MIB
    return Requests(
        vcpus * MILLI - kube_reserved_cpu_milli(vcpus),
        memory_bytes - memory_reserved - EVICTION_MEMORY_BYTES,
    )


def beside(extra: Iterable[Requests] = ()) -> Requests:
    """What every node keeps for pods other than its own stack pod: the DaemonSets, every
    platform pod that may land on it, and ``extra`` (the stack's own pods of no node type)."""
    platform = [p.requests for p in DAEMONSETS] + [
        p.requests for p in CLUSTER_PODS for _ in range(p.count)
    ]
    return total([*platform, *extra])


def room(vcpus: int, memory_bytes: int, extra: Iterable[Requests] = ()) -> Requests:
    """What a node of the type leaves for the stack's pods chosen to run on it."""
    return allocatable(vcpus, memory_bytes) - beside(extra)


@dataclass(frozen=True)
class NodeGroup:
    instance_type: str
    vcpus: int
    memory_bytes: int
    count: int


@dataclass(frozen=True)
class Pod:
    """A stack pod, bound to one instance type by its node selector (None: any node)."""

    name: str
    instance_type: str | None
    requests: Requests


def unplaced(pods: Sequence[Pod], groups: Sequence[NodeGroup]) -> list[str]:
    """Each stack pod bound to an instance type that fits no node once every node keeps room for
    the platform's pods and the stack's pods of no type: the bound pods packed largest first
    into the nodes of their type."""
    extra = [pod.requests for pod in pods if pod.instance_type is None]
    pods = [pod for pod in pods if pod.instance_type is not None]
    nodes = [group.instance_type for group in groups for _ in range(group.count)]
    free = [room(g.vcpus, g.memory_bytes, extra) for g in groups for _ in range(g.count)]
    problems = []
    for pod in sorted(pods, key=lambda p: (-p.requests.cpu_milli, -p.requests.memory_bytes)):
        for index, instance_type in enumerate(nodes):
            if instance_type == pod.instance_type and free[index].holds(pod.requests):
                free[index] -= pod.requests
                break
        else:
            kept = [
                str(room(g.vcpus, g.memory_bytes, extra))
                for g in groups
                if g.instance_type == pod.instance_type
            ]
            where = f"a {pod.instance_type} node leaves {kept[0]}" if kept else "no node group"
            problems.append(
                f"{pod.name} asks {pod.requests} on {pod.instance_type}, and fits no node "
                f"({where} beside the platform's pods; the others are taken)"
            )
    return problems


# Kubernetes resource quantities (the suffixes the program and the platforms write).
_QUANTITY = re.compile(r"(?P<number>\d+(?:\.\d+)?)(?P<suffix>m|k|M|G|Ki|Mi|Gi|Ti)?")
_FACTORS = {
    None: 1, "m": 0.001, "k": 10**3, "M": 10**6, "G": 10**9,
    "Ki": 1024, "Mi": MIB, "Gi": 1024**3, "Ti": 1024**4,
}  # fmt: skip


def quantity(text: Any) -> float:
    found = _QUANTITY.fullmatch(str(text))
    if found is None:
        raise ValueError(f"{text!r} is not a resource quantity")
    return float(found["number"]) * _FACTORS[found["suffix"]]


def container_requests(container: Mapping[str, Any]) -> Requests:
    asked = (container.get("resources") or {}).get("requests") or {}
    cpu = quantity(asked.get("cpu", 0)) * MILLI
    return Requests(round(cpu), round(quantity(asked.get("memory", 0))))


def pod_requests(spec: Mapping[str, Any]) -> Requests:
    """A pod spec's requests as the scheduler counts them: its containers' sum, or its largest
    init container's where that is more."""
    running = total(container_requests(c) for c in spec.get("containers") or [])
    for init in spec.get("initContainers") or []:
        first = container_requests(init)
        running = Requests(
            max(running.cpu_milli, first.cpu_milli),
            max(running.memory_bytes, first.memory_bytes),
        )
    return running


INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"


def _pod(name: str, template: Mapping[str, Any]) -> Pod:
    spec = template.get("spec") or {}
    bound = (spec.get("nodeSelector") or {}).get(INSTANCE_TYPE_LABEL)
    return Pod(name, None if bound is None else str(bound), pod_requests(spec))


def leaderworkerset_size(lws: Mapping[str, Any]) -> int:
    """How many pods a LeaderWorkerSet makes."""
    spec = lws.get("spec") or {}
    size = int((spec.get("leaderWorkerTemplate") or {}).get("size", 1))
    return int(spec.get("replicas", 1)) * size


def pod_slots(groups: Sequence[NodeGroup]) -> int:
    """The most pods the node groups' kubelets run (each node's maxPods)."""
    return sum(group.count * max_pods(group.vcpus) for group in groups)


def leaderworkerset_pods(lws: Mapping[str, Any]) -> list[Pod]:
    """The pods a LeaderWorkerSet makes: ``replicas`` groups of a leader and ``size - 1``
    workers (the worker template serves the leader too when there is no leader template)."""
    spec = lws.get("spec") or {}
    template = spec.get("leaderWorkerTemplate") or {}
    worker = template.get("workerTemplate") or {}
    leader = template.get("leaderTemplate") or worker
    pods = []
    for group in range(int(spec.get("replicas", 1))):
        pods.append(_pod(f"group {group}'s leader", leader))
        pods += [
            _pod(f"group {group}'s worker {index}", worker)
            for index in range(1, int(template.get("size", 1)))
        ]
    return pods


def deployment_pods(name: str, deployment: Mapping[str, Any]) -> list[Pod]:
    spec = deployment.get("spec") or {}
    template = spec.get("template") or {}
    return [_pod(f"{name} {index}", template) for index in range(int(spec.get("replicas", 1)))]
