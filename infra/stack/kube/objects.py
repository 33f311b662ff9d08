"""A stack's serving groups as Kubernetes objects: one LeaderWorkerSet (``replicas`` groups of a
leader, the main node, and ``workerCount`` workers), the API's Service (with replicas, in front of
HAProxy configured as the VMs' balancer node is), a NetworkPolicy per group and one for the
leaders, and the boot settings as ConfigMaps.

One source of truth: a pod runs the script its VM counterpart runs (``llama-server.sh``,
``rpc-worker.sh``, ``fetch-model.sh`` from the image, ``infra.stack.kube.image``) with the
environment a VM's ``node.env`` holds (``NodeBoot.env``), so the leader's llama-server flags are
the main node's and a worker's ggml-rpc-server flags a worker node's. Only what a pod learns when it
starts differs: its address (the pod's IP) and its group's workers (their DNS names in the
LeaderWorkerSet's headless service, with the group's index).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from dataclasses import replace
from typing import Any

from infra.boot.balancer import BalancerBoot, haproxy_config
from infra.boot.node import API_KEY_CREDENTIAL, VM_PATHS, NodeBoot
from infra.catalog import InstanceType
from infra.core import image_refs, scheduling
from infra.core.errors import SettingError
from infra.core.limits import METRICS_PORT
from infra.stack.config import ClusterConfig, kubernetes_refusals
from infra.stack.kube.image import UID

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
# The labels the LeaderWorkerSet controller puts on every pod of a group (v0.10.0).
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
ARCH_LABEL = "kubernetes.io/arch"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# GKE taints Arm node pools with kubernetes.io/arch=arm64:NoSchedule, and AKS and EKS pools may
# be given the same taint: a pod of an Arm image tolerates it.
ARM_TOLERATION = {"key": ARCH_LABEL, "operator": "Equal", "value": "arm64", "effect": "NoSchedule"}
# Where systemd hands llama-server.service its credentials on a VM ($CREDENTIALS_DIRECTORY): the
# key's Secret is mounted there, so the server reads it from the same path.
CREDENTIALS_DIRECTORY = "/run/credentials/llama-server.service"
# The VM boot settings a pod does not take: its address and its group's workers are the pod's
# own (set when it starts); the key comes from a Secret, not the cloud's store; the model lives
# on the pod's volume, not a disk of the node's.
POD_SET = ("LLAMA_NODE_IP", "RPC_WORKERS")
NOT_IN_PODS = ("API_KEY_SOURCE", "LLAMA_RPC_FILES_SOURCE", "MODEL_DISK_GB", "MODEL_DISK_MODEL")
GROUP_INDEX = "LWS_GROUP_INDEX"
MIB = 1024**2
# The balancer in front of the leaders (with a balancer boot): the HAProxy Ubuntu 24.04 packages,
# as the VMs' balancer node runs, from the pods' own image (pinned by its digest), in the
# foreground (-db), as the image's user, with the configuration the balancer node runs.
HAPROXY = "/usr/sbin/haproxy"
HAPROXY_CONFIG_DIR = "/etc/llama-rpc-balancer"
HAPROXY_REQUESTS = {"cpu": "250m", "memory": "128Mi"}
# Where the Pod Security "restricted" profile needs a value, every pod has it
# (https://kubernetes.io/docs/concepts/security/pod-security-standards/#restricted): seccomp
# RuntimeDefault, a non-root user, no privilege escalation, every capability dropped.
SECCOMP = {"type": "RuntimeDefault"}
# (The pod's securityContext sets the user and seccomp for all its containers.)
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
# llama-server reads ${XDG_CONFIG_HOME:-$HOME/.config}/llama.cpp/config.ini before its flags
# (common/arg.cpp at the pin); the pod's home is its writable data volume, so the server's
# configuration directory is one the image's user cannot create.
READ_ONLY_CONFIG_HOME = "/nonexistent"
# The cluster's DNS (CoreDNS, k8s-app=kube-dns in kube-system), which a pod whose egress is
# limited must be let reach (aws/aws-network-policy-agent#230).
DNS_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
}
DNS_PORTS = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
# The leader fetches the model over HTTPS (fetch-model.sh, https URLs only) from outside the
# cluster: anywhere but the private ranges (the cluster, its nodes, the VPC) and link-local
# addresses (the instance metadata service).
HTTPS_PORT = 443
NOT_OUTSIDE = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16")
BALANCER_ROLE_LABEL = "llama-rpc-cluster/role"
SETTINGS_DIGEST = "llama-rpc-cluster/settings-sha256"  # a pod template's annotation
# The cluster's DNS domain: the leaders' names, which HAProxy resolves itself, are absolute.
CLUSTER_DOMAIN = "cluster.local"
# In its pod the balancer listens on the pod's one interface.
POD_ADDRESSES = "0.0.0.0"  # noqa: S104


# A name the LeaderWorkerSet's pods and Service derive theirs from (RFC 1035 labels: the pods'
# DNS names in the headless service), kept short enough for its suffixes.
NAME = re.compile(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?")
NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# A StorageClass is named as a DNS subdomain (253 characters at most).
STORAGE_CLASS = re.compile(
    r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)


# The image a render that writes the build context alone checks the stack with (its objects are
# not written: they need the pushed image's digest).
UNBUILT_IMAGE = "llama-rpc@sha256:" + "0" * 64


class RenderError(SettingError):
    """A stack setting the Kubernetes objects cannot honour."""


def check_names(*, name: str, namespace: str, image: str, storage_class: str | None = None) -> None:
    """``lrc k8s render``'s ``--name``, ``--namespace``, ``--image`` and ``--storage-class``,
    before anything is rendered."""
    if storage_class is not None and not STORAGE_CLASS.fullmatch(storage_class):
        why = f"{storage_class!r}: a StorageClass's name, lowercase letters, digits, '-' and '.'"
        raise RenderError("--storage-class", why)
    if not NAME.fullmatch(name):
        why = f"{name!r}: 1-40 lowercase letters, digits and '-', from a letter"
        raise RenderError("--name", why)
    if not image_refs.is_pinned_image_reference(image):
        raise RenderError("--image", f"{image!r} is not {image_refs.PINNED_MEANING}")
    if not NAMESPACE.fullmatch(namespace):
        raise RenderError("--namespace", f"{namespace!r}: lowercase letters, digits and '-'")


def refusals(config: ClusterConfig) -> list[RenderError]:
    """What of the stack a LeaderWorkerSet cannot do, each naming its setting and the way out
    (the EKS stack's config check refuses the same: ``kubernetes_refusals``), and a node too
    small for its pod beside what the platform runs."""
    found = [RenderError(setting, why) for setting, why in kubernetes_refusals(config)]
    return found + fit_refusals(config)


def floating(config: ClusterConfig) -> list[scheduling.Requests]:
    """The stack's own pods of no instance type, which may land on any node: with replicas,
    HAProxy."""
    if config.balancer_boot is None:
        return []
    return [scheduling.container_requests({"resources": {"requests": HAPROXY_REQUESTS}})]


def room(config: ClusterConfig, instance: InstanceType) -> scheduling.Requests:
    """What a node of the type leaves its one LeaderWorkerSet pod: its allocatable less the
    DaemonSets and every pod that may land beside it (``infra.core.scheduling``)."""
    return scheduling.room(instance.vcpus, instance.memory_bytes, floating(config))


def pod_cpus(config: ClusterConfig, instance: InstanceType) -> int:
    """The whole CPUs a pod on the type asks for (llama.cpp's threads)."""
    return room(config, instance).cpu_milli // scheduling.MILLI


def pods_needs(config: ClusterConfig) -> list[tuple[str, InstanceType, int]]:
    """(setting, instance type, memory) of the leader and, with workers, the workers."""
    shares = config.placement.shares
    main_setting = (
        "instanceType"
        if config.main_instance_type.name == config.instance_type.name
        else "mainInstanceType"
    )
    found = [(main_setting, config.main_instance_type, shares[0].need_bytes)]
    if config.worker_count:
        found.append(("instanceType", config.instance_type, max(s.need_bytes for s in shares[1:])))
    return found


def fit_refusals(config: ClusterConfig) -> list[RenderError]:
    """A pod that no node of its type can hold once the node keeps room for the kubelet and
    what the platform runs beside the stack: it would stay Pending, and its group never
    serve."""
    platform = ", ".join(f"{p.name} ({p.count} x {p.requests})" for p in scheduling.CLUSTER_PODS)
    found = []
    for setting, instance, need in pods_needs(config):
        left = room(config, instance)
        if left.cpu_milli < scheduling.MILLI or left.memory_bytes < need:
            found.append(
                RenderError(
                    setting,
                    f"a {instance.name} node leaves {left} for the stack's pod once it keeps "
                    f"the kubelet's reserve, kube-proxy and the VPC CNI, and room for "
                    f"{platform}{' and HAProxy' if floating(config) else ''}; the pod needs a "
                    f"whole CPU and {-(-need // MIB)}Mi: choose a larger type",
                )
            )
    return found


def _env(boot: NodeBoot) -> dict[str, str]:
    env = boot.env(VM_PATHS)
    return {k: v for k, v in env.items() if k not in (*POD_SET, *NOT_IN_PODS)}


def _settings_digest(env: dict[str, str]) -> dict[str, str]:
    """A pod template's digest of the settings its pods read once, at start, from their
    ConfigMap: new settings change the template, and the LeaderWorkerSet (or Deployment) makes
    its pods again (a ConfigMap's change alone reaches no running pod)."""
    text = json.dumps(env, sort_keys=True).encode()
    return {SETTINGS_DIGEST: hashlib.sha256(text).hexdigest()}


def _labels(name: str, config: ClusterConfig) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "llama-rpc-cluster",
        "app.kubernetes.io/instance": name,
        "llama-rpc-cluster/cloud": config.cloud,
    }


def worker_hosts(name: str, workers: int, rpc_port: int) -> str:
    """The leader's ``--rpc`` list: each worker of its group by its DNS name in the
    LeaderWorkerSet's headless service (``<name>-<group>-<worker>.<name>``), the group's index
    expanded by Kubernetes from the pod's label."""
    return ",".join(f"{name}-$({GROUP_INDEX})-{i}.{name}:{rpc_port}" for i in range(1, workers + 1))


def _pod_env(*extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"name": "LLAMA_NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {
            "name": GROUP_INDEX,
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{GROUP_INDEX_LABEL}']"}},
        },
        *extra,
    ]


def _threads(container: str) -> dict[str, Any]:
    """llama.cpp's threads: the CPUs the container asks for (the VM's are all its cores)."""
    field = {"containerName": container, "resource": "requests.cpu", "divisor": "1"}
    return {"name": "LLAMA_THREADS", "valueFrom": {"resourceFieldRef": field}}


def _resources(cpus: int, need_bytes: int) -> dict[str, Any]:
    memory = f"{-(-need_bytes // MIB)}Mi"
    return {"requests": {"cpu": str(cpus), "memory": memory}, "limits": {"memory": memory}}


def _pod(
    instance_type: str,
    *,
    containers: list[dict[str, Any]],
    volumes: list[dict[str, Any]],
    init: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeSelector": {ARCH_LABEL: "arm64", INSTANCE_TYPE_LABEL: instance_type},
        "tolerations": [ARM_TOLERATION],
        # The image's llama user, as on a VM: never root.
        "securityContext": _pod_security(UID, fs_group=True),
        "automountServiceAccountToken": False,
        "containers": containers,
        "volumes": volumes,
    }
    if init:
        spec["initContainers"] = init
    return spec


def _container(
    name: str, image: str, script: str, env_from: str, env: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "command": [f"{VM_PATHS.bin_dir}/{script}"],
        "envFrom": [{"configMapRef": {"name": env_from}}],
        "env": env,
        "securityContext": copy.deepcopy(CONTAINER_SECURITY),
        "volumeMounts": [{"name": "data", "mountPath": VM_PATHS.data_dir}],
    }


def _pod_security(uid: int, *, fs_group: bool = False) -> dict[str, Any]:
    security: dict[str, Any] = {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid}
    if fs_group:
        security["fsGroup"] = uid
    return {**security, "seccompProfile": dict(SECCOMP)}


def render(
    config: ClusterConfig,
    *,
    name: str,
    namespace: str,
    image: str,
    storage_class: str | None = None,
) -> list[dict[str, Any]]:
    """The stack's Kubernetes objects, in the order to apply them. Raises the first refusal.
    ``storage_class``: each pod's data (the leader's model, a worker's RPC cache) on a volume of
    that class, kept when its group is made again; else on the node's own storage."""
    for refusal in refusals(config):
        raise refusal
    main, *workers = config.boots(0)
    labels = _labels(name, config)
    meta = {"namespace": namespace, "labels": labels}
    leader_env, worker_env = f"{name}-leader-env", f"{name}-worker-env"
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": leader_env, **meta},
            "data": _env(main),
        }
    ]
    if workers:
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": worker_env, **meta},
                "data": _env(workers[0]),
            }
        )
    shares = config.placement.shares
    main_cpus = pod_cpus(config, config.main_instance_type)
    leader_extra: list[dict[str, Any]] = [_threads("llama-server")]
    if workers:
        hosts = worker_hosts(name, len(workers), config.rpc_port)
        leader_extra.append({"name": "RPC_WORKERS", "value": hosts})
    if main.api_key_file:
        leader_extra.append({"name": "CREDENTIALS_DIRECTORY", "value": CREDENTIALS_DIRECTORY})
    leader_extra.append({"name": "XDG_CONFIG_HOME", "value": READ_ONLY_CONFIG_HOME})
    server = _container(
        "llama-server", image, "llama-server.sh", leader_env, _pod_env(*leader_extra)
    )
    server["ports"] = [{"name": "api", "containerPort": config.server_port}]
    server["resources"] = _resources(main_cpus, shares[0].need_bytes)
    server["readinessProbe"] = {
        "httpGet": {"path": "/health", "port": "api"},
        "periodSeconds": 10,
        "failureThreshold": 3,
    }
    fetch = _container("fetch-model", image, "fetch-model.sh", leader_env, _pod_env())
    # The model: as large as the main node's disk, on the node's own storage (or a claim's).
    data = {"name": "data", "emptyDir": {"sizeLimit": f"{config.main_disk_gb}Gi"}}
    volumes: list[dict[str, Any]] = [] if storage_class else [data]
    if main.api_key_file:
        server["volumeMounts"].append(
            {"name": "api-key", "mountPath": CREDENTIALS_DIRECTORY, "readOnly": True}
        )
        volumes.append(
            {
                "name": "api-key",
                "secret": {
                    "secretName": f"{name}-api-key",
                    "items": [{"key": API_KEY_CREDENTIAL, "path": API_KEY_CREDENTIAL}],
                    "defaultMode": 0o400,
                },
            }
        )
    leader = {
        "metadata": {"labels": labels, "annotations": _settings_digest(objects[0]["data"])},
        "spec": _pod(
            config.main_instance_type.name, containers=[server], volumes=volumes, init=[fetch]
        ),
    }
    template: dict[str, Any] = {
        "size": len(workers) + 1,
        # A group whose pod restarts is made again whole: llama-server cannot take a worker back
        # mid-flight, as on VMs (a worker that restarts makes its main node load again).
        "restartPolicy": "RecreateGroupOnPodRestart",
        "leaderTemplate": leader,
    }
    if workers:
        worker_cpus = pod_cpus(config, config.instance_type)
        rpc = _container(
            "ggml-rpc-server", image, "rpc-worker.sh", worker_env,
            _pod_env(_threads("ggml-rpc-server")),
        )  # fmt: skip
        rpc["ports"] = [{"name": "rpc", "containerPort": config.rpc_port}]
        rpc["resources"] = _resources(worker_cpus, max(s.need_bytes for s in shares[1:]))
        rpc["readinessProbe"] = {"tcpSocket": {"port": "rpc"}, "periodSeconds": 5}
        template["workerTemplate"] = {
            "metadata": {"labels": labels, "annotations": _settings_digest(objects[1]["data"])},
            "spec": _pod(
                config.instance_type.name,
                containers=[rpc],
                volumes=[] if storage_class else [{"name": "data", "emptyDir": {}}],
            ),
        }
    else:
        template["workerTemplate"] = leader
    if storage_class:
        template.update(data_claims(config, storage_class, labels))
    objects.append(
        {
            "apiVersion": LWS_API_VERSION,
            "kind": "LeaderWorkerSet",
            "metadata": {"name": name, **meta},
            "spec": {
                "replicas": config.replicas,
                # Workers start with the leader; the leader waits for them (wait-workers.sh).
                "startupPolicy": "LeaderCreated",
                "leaderWorkerTemplate": template,
            },
        }
    )
    leaders = {LWS_NAME_LABEL: name, WORKER_INDEX_LABEL: "0"}
    target = leaders
    if config.balancer_boot is not None:
        objects += balancer_objects(
            config, config.balancer_boot, name=name, namespace=namespace, labels=labels,
            image=image,
        )  # fmt: skip
        target = balancer_labels(name)
    objects.append(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": f"{name}-api", **meta},
            "spec": {
                "type": "ClusterIP",  # inside the cluster only
                "selector": target,
                "ports": [{"name": "api", "port": config.server_port, "targetPort": "api"}],
            },
        }
    )
    objects += network_policies(config, name=name, namespace=namespace, labels=labels)
    return objects


def data_claims(
    config: ClusterConfig, storage_class: str, labels: dict[str, str]
) -> dict[str, Any]:
    """The pods' data on claims of the storage class: the LeaderWorkerSet's StatefulSets make
    one a pod (data-NAME-G for a leader, data-NAME-G-W for a worker) and keep it when the group
    is made again or scaled down (the retention policy's Retain), so a restarted group reads
    the model and the workers' tensor caches it had. Each pod has its own: they run on
    different nodes, where a ReadWriteOnce volume cannot be shared. Sized for the model (the
    main node's disk), the most any pod holds."""
    claim = {
        "metadata": {"name": "data", "labels": labels},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": storage_class,
            "resources": {"requests": {"storage": f"{config.main_disk_gb}Gi"}},
        },
    }
    return {
        "volumeClaimTemplates": [claim],
        "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
    }


def balancer_labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/instance": name, BALANCER_ROLE_LABEL: "balancer"}


def leader_names(config: ClusterConfig, name: str, namespace: str) -> tuple[str, ...]:
    """Each group's leader by its DNS name in the LeaderWorkerSet's headless service."""
    return tuple(
        f"{name}-{group}.{name}.{namespace}.svc.{CLUSTER_DOMAIN}"
        for group in range(config.replicas)
    )


def balancer_config(
    config: ClusterConfig, balancer: BalancerBoot, name: str, namespace: str
) -> str:
    """HAProxy's configuration for the leaders: the VMs' balancer node's, listening on every
    address of its pod, each group's main node by its pod's DNS name."""
    pods = replace(balancer, listen_ip=POD_ADDRESSES, mains=leader_names(config, name, namespace))
    return haproxy_config(pods, by_name=True)


def balancer_objects(
    config: ClusterConfig,
    balancer: BalancerBoot,
    *,
    name: str,
    namespace: str,
    labels: dict[str, str],
    image: str,
) -> list[dict[str, Any]]:
    """With replicas, HAProxy in front of the leaders, as the VMs' balancer node is: a request
    goes to a group with a free slot, and waits for one when none has (kube-proxy alone would
    spread connections blindly)."""
    meta = {"namespace": namespace, "labels": labels}
    pod_labels = {**labels, **balancer_labels(name)}
    container = {
        "name": "haproxy",
        "image": image,
        "command": [HAPROXY, "-db", "-f", f"{HAPROXY_CONFIG_DIR}/haproxy.cfg"],
        "ports": [{"name": "api", "containerPort": config.server_port}],
        "readinessProbe": {"tcpSocket": {"port": "api"}, "periodSeconds": 5},
        "resources": {"requests": HAPROXY_REQUESTS, "limits": {"memory": "512Mi"}},
        "securityContext": copy.deepcopy(CONTAINER_SECURITY),
        "volumeMounts": [{"name": "config", "mountPath": HAPROXY_CONFIG_DIR, "readOnly": True}],
    }
    settings = {"haproxy.cfg": balancer_config(config, balancer, name, namespace)}
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{name}-balancer", **meta},
            "data": settings,
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": f"{name}-balancer", **meta},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": balancer_labels(name)},
                "template": {
                    "metadata": {"labels": pod_labels, "annotations": _settings_digest(settings)},
                    "spec": {
                        "nodeSelector": {ARCH_LABEL: "arm64"},
                        "tolerations": [ARM_TOLERATION],
                        "securityContext": _pod_security(UID),
                        "automountServiceAccountToken": False,
                        "containers": [container],
                        "volumes": [{"name": "config", "configMap": {"name": f"{name}-balancer"}}],
                    },
                },
            },
        },
    ]


def _policy(
    name: str,
    meta: dict[str, Any],
    selected: dict[str, Any],
    *,
    ingress: list[dict[str, Any]] | None = None,
    egress: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"podSelector": selected, "policyTypes": []}
    if ingress is not None:
        spec["policyTypes"].append("Ingress")
        spec["ingress"] = ingress
    if egress is not None:
        spec["policyTypes"].append("Egress")
        spec["egress"] = egress
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, **meta},
        "spec": spec,
    }


def _tcp(*ports: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": port} for port in ports]


def stack_pods(name: str) -> dict[str, str]:
    """Every pod of the stack, of any group (the LeaderWorkerSet's and the balancer's)."""
    return {"app.kubernetes.io/name": "llama-rpc-cluster", "app.kubernetes.io/instance": name}


def workers_of(name: str, group: int | None = None) -> dict[str, Any]:
    """A group's workers (every group's with None): the LeaderWorkerSet's pods but its leaders."""
    labels = {LWS_NAME_LABEL: name}
    if group is not None:
        labels[GROUP_INDEX_LABEL] = str(group)
    not_leaders = {"key": WORKER_INDEX_LABEL, "operator": "NotIn", "values": ["0"]}
    return {"matchLabels": labels, "matchExpressions": [not_leaders]}


def leaders_of(name: str, group: int | None = None) -> dict[str, Any]:
    labels = {LWS_NAME_LABEL: name, WORKER_INDEX_LABEL: "0"}
    if group is not None:
        labels[GROUP_INDEX_LABEL] = str(group)
    return {"matchLabels": labels}


def network_policies(
    config: ClusterConfig, *, name: str, namespace: str, labels: dict[str, str]
) -> list[dict[str, Any]]:
    """Nothing reaches or leaves a pod of the stack, of any group, but what a policy admits
    (the default deny); then the leaders (and with replicas the balancer) take the API from the
    namespace's pods and apiAllowedCidrs only; each group's workers take RPC and node metrics
    from their own group's leader only, and start no connection; a leader reaches the cluster's
    DNS, workers' RPC and metrics ports and the internet's HTTPS (the model), the balancer the
    DNS and the leaders' API."""
    meta = {"namespace": namespace, "labels": labels}
    api_from: list[dict[str, Any]] = [{"podSelector": {}}]
    api_from += [{"ipBlock": {"cidr": cidr}} for cidr in config.api_allowed_cidrs]
    api_ingress = [{"from": api_from, "ports": _tcp(config.server_port)}]
    dns: dict[str, Any] = {"to": [DNS_PEER], "ports": DNS_PORTS}
    outside = {"ipBlock": {"cidr": "0.0.0.0/0", "except": list(NOT_OUTSIDE)}}
    leader_egress: list[dict[str, Any]] = [dns, {"to": [outside], "ports": _tcp(HTTPS_PORT)}]
    if config.worker_count:
        leader_egress.append(
            {
                # Any group's workers: each admits its own group's leader alone (below).
                "to": [{"podSelector": workers_of(name)}],
                "ports": _tcp(config.rpc_port, METRICS_PORT),
            }
        )
    policies = [
        # Selected by any policy of either type, a pod takes and starts only what one admits.
        _policy(f"{name}-default-deny", meta, {"matchLabels": stack_pods(name)}, ingress=[],
                egress=[]),
        _policy(f"{name}-leaders", meta, leaders_of(name), ingress=api_ingress,
                egress=leader_egress),
    ]  # fmt: skip
    if config.balancer_boot is not None:
        to_leaders = {"to": [{"podSelector": leaders_of(name)}], "ports": _tcp(config.server_port)}
        policies.append(
            _policy(f"{name}-balancer", meta, {"matchLabels": balancer_labels(name)},
                    ingress=api_ingress, egress=[dns, to_leaders])
        )  # fmt: skip
    if config.worker_count == 0:
        return policies
    # A policy cannot say "my own group": one per group. A group the LeaderWorkerSet gains
    # outside the stack (`kubectl scale`, an autoscaler) has none, and the default deny leaves
    # its workers unreachable: safe, and idle, as HAProxy does not know its leader either (add
    # groups with replicas, and render again).
    for group in range(config.replicas):
        from_leader = {"from": [{"podSelector": leaders_of(name, group)}]}
        policies.append(
            _policy(f"{name}-group-{group}-workers", meta, workers_of(name, group),
                    ingress=[{**from_leader, "ports": _tcp(config.rpc_port, METRICS_PORT)}])
        )  # fmt: skip
    return policies
