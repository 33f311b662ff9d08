"""``lrc k8s render``: every shipped stack as Kubernetes objects, checked as a cluster's API
server would check them without a cluster: the LeaderWorkerSet against the v0.10.0 CRD's schema
(unknown fields refused, as ``kubectl apply`` with strict field validation does), the core
objects against Kubernetes' own schemas (kubernetes-validate); the pods' flags the VMs' flags,
by running the same scripts with each one's environment; the network policies as narrow as the
VMs' firewalls."""

from __future__ import annotations

import copy
import csv
import dataclasses
import functools
import ipaddress
import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from infra import catalog
from infra.boot.balancer import haproxy_config
from infra.boot.node import API_KEY_CREDENTIAL, VM_PATHS
from infra.boot.render import ROLE_UNIT, UNITS_DIR
from infra.cli import k8s as cli
from infra.conformance.kubernetes import restricted_problems
from infra.core.limits import METRICS_PORT
from infra.stack.files import config_of, stack_config, stack_names, stack_values
from infra.stack.kube import image, objects
from tests.conftest import REPO, SCRIPTS, free_port, require_tool

CRD = REPO / "tests" / "fixtures" / "lws-v0.10.0" / "leaderworkerset.x-k8s.io_leaderworkersets.yaml"
KUBERNETES = "1.33.0"  # EKS's, GKE's and AKS's current minor (kubernetes-validate's schemas)
NAME, NAMESPACE = "llama-rpc", "inference"
IMAGE = "registry.example/llama-rpc:1@sha256:" + "1" * 64
P = "llama-rpc-cluster:"


def strict(schema: Any) -> Any:
    """The CRD's schema with unknown fields refused, as strict field validation refuses them
    (the API server would otherwise drop them silently)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if (
            out.get("type") == "object"
            and "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema


@functools.cache
def lws_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    [version] = crd["spec"]["versions"]
    assert version["name"] == "v1" and crd["spec"]["names"]["kind"] == "LeaderWorkerSet"
    return strict(version["schema"]["openAPIV3Schema"])


def lws_problems(lws: dict[str, Any]) -> list[str]:
    """Why the API server (with the CRD) or the product would refuse a LeaderWorkerSet: the
    schema's errors, and a size or replicas left to the controller's defaults."""
    validator = jsonschema.Draft7Validator(lws_schema())
    found = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(lws)]
    template = lws.get("spec", {}).get("leaderWorkerTemplate", {})
    for key, where in (("size", template), ("replicas", lws.get("spec", {}))):
        if key not in where:
            found.append(f"{key} is not set: the controller's default (1) is no stack's")
    return found


def core_problems(obj: dict[str, Any]) -> list[str]:
    try:
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [str(error)]
    return []


@functools.cache
def rendered(stack: str) -> tuple[dict[str, Any], ...]:
    return tuple(objects.render(stack_config(stack), name=NAME, namespace=NAMESPACE, image=IMAGE))


def of_kind(stack: str, kind: str) -> list[dict[str, Any]]:
    return [copy.deepcopy(o) for o in rendered(stack) if o["kind"] == kind]


# aws-small's c8g.large nodes cannot hold a pod beside the platform's (refused: below).
RENDERED = [stack for stack in stack_names() if stack != "aws-small"]


@pytest.mark.parametrize("stack", RENDERED)
def test_every_stack_renders_objects_a_cluster_accepts(stack: str) -> None:
    config = stack_config(stack)
    [lws] = of_kind(stack, "LeaderWorkerSet")
    assert lws_problems(lws) == []
    for obj in rendered(stack):
        if obj["kind"] != "LeaderWorkerSet":
            assert core_problems(obj) == [], obj["kind"]
    # ... and the pod templates as core objects too (a Pod's schema checks the containers).
    template = lws["spec"]["leaderWorkerTemplate"]
    for part in ("leaderTemplate", "workerTemplate"):
        pod = {"apiVersion": "v1", "kind": "Pod", **template[part]}
        pod["metadata"] = {**pod["metadata"], "name": "check"}
        assert core_problems(pod) == [], part
    assert lws["spec"]["replicas"] == config.replicas
    assert template["size"] == config.worker_count + 1
    assert {o["metadata"]["namespace"] for o in rendered(stack)} == {NAMESPACE}


@pytest.mark.parametrize(
    ("break_it", "says"),
    [
        (lambda lws: lws["spec"].update(replicaCount=2), "replicaCount"),
        (lambda lws: lws["spec"]["leaderWorkerTemplate"].pop("size"), "size is not set"),
        (lambda lws: lws["spec"]["leaderWorkerTemplate"].update(size="three"), "'three'"),
        (lambda lws: lws["spec"].update(startupPolicy="WhenReady"), "WhenReady"),
        (lambda lws: lws["spec"]["leaderWorkerTemplate"].pop("workerTemplate"), "workerTemplate"),
    ],
)
def test_a_broken_leaderworkerset_is_refused(break_it: Any, says: str) -> None:
    [lws] = of_kind("aws-c8g", "LeaderWorkerSet")
    break_it(lws)
    problems = lws_problems(lws)
    assert problems and any(says in problem for problem in problems), problems


@pytest.mark.parametrize(
    ("kind", "break_it"),
    [
        ("Service", lambda o: o["spec"]["ports"][0].update(port="eighty")),
        ("NetworkPolicy", lambda o: o["spec"].update(ingres=[])),
        ("ConfigMap", lambda o: o["data"].update(THREADS=4)),
    ],
)
def test_a_broken_core_object_is_refused(kind: str, break_it: Any) -> None:
    obj = of_kind("aws-c8g", kind)[0]
    assert core_problems(obj) == []
    break_it(obj)
    assert core_problems(obj)


@pytest.mark.parametrize("stack", RENDERED)
def test_the_leader_runs_on_the_main_nodes_type_and_workers_on_theirs(stack: str) -> None:
    """aws-r8g's main node is smaller than its workers: each pod asks for its own node's type,
    and for the CPUs it leaves beside what the platform runs."""
    config = stack_config(stack)
    [lws] = of_kind(stack, "LeaderWorkerSet")
    template = lws["spec"]["leaderWorkerTemplate"]
    wanted = {"leaderTemplate": config.main_instance_type, "workerTemplate": config.instance_type}
    if config.worker_count == 0:
        wanted["workerTemplate"] = config.main_instance_type  # size 1: no worker pod
    for part, instance in wanted.items():
        spec = template[part]["spec"]
        assert spec["nodeSelector"][objects.INSTANCE_TYPE_LABEL] == instance.name, part
        [container] = spec["containers"]
        cpus = int(container["resources"]["requests"]["cpu"])
        assert cpus == objects.pod_cpus(config, instance), part
        # The kubelet's reserve, the DaemonSets, the controller's two CPUs and CoreDNS.
        assert 1 <= cpus <= instance.vcpus - 3, part


def test_the_pods_run_on_the_stacks_arm_type_and_ask_for_their_placements_memory() -> None:
    config = stack_config("aws-c8g")
    [lws] = of_kind("aws-c8g", "LeaderWorkerSet")
    template = lws["spec"]["leaderWorkerTemplate"]
    shares = config.placement.shares
    for part, share in (("leaderTemplate", shares[0]), ("workerTemplate", shares[1])):
        spec = template[part]["spec"]
        assert spec["nodeSelector"] == {
            objects.ARCH_LABEL: "arm64",
            objects.INSTANCE_TYPE_LABEL: "c8g.16xlarge",
        }
        assert objects.ARM_TOLERATION in spec["tolerations"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        [container] = spec["containers"]
        memory = container["resources"]["requests"]["memory"]
        assert int(memory.removesuffix("Mi")) * 1024**2 >= share.need_bytes
        assert container["resources"]["requests"]["cpu"] == "61"  # of 64 vCPUs
    # The leader fetches the model first, with the downloader the VMs run (sha256 checked).
    [fetch] = template["leaderTemplate"]["spec"]["initContainers"]
    assert fetch["command"] == [f"{VM_PATHS.bin_dir}/fetch-model.sh"]
    [env] = of_kind("aws-c8g", "ConfigMap")[:1]
    assert env["data"]["MODEL_SHA256"] == " ".join(config.model_sha256)


# --- the network policies, read as a network plugin reads them ---------------------------------

NAMESPACE_LABEL = "kubernetes.io/metadata.name"


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector (matchLabels and matchExpressions; {} selects everything)."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values")
        if operator == "In":
            found = labels.get(key) in values
        elif operator == "NotIn":
            found = labels.get(key) not in values
        else:
            found = (key in labels) == (operator == "Exists")
        if not found:
            return False
    return True


@dataclasses.dataclass(frozen=True)
class Peer:
    """A pod (its namespace and labels) or an address outside the cluster (namespace None)."""

    name: str
    ip: str
    namespace: str | None = None
    labels: tuple[tuple[str, str], ...] = ()


def peer_matches(peer_rule: dict[str, Any], peer: Peer, policy_namespace: str) -> bool:
    if "ipBlock" in peer_rule:
        block = peer_rule["ipBlock"]
        address = ipaddress.ip_address(peer.ip)
        return address in ipaddress.ip_network(block["cidr"]) and not any(
            address in ipaddress.ip_network(e) for e in block.get("except", [])
        )
    if peer.namespace is None:
        return False
    if "namespaceSelector" in peer_rule:
        if not selects(peer_rule["namespaceSelector"], {NAMESPACE_LABEL: peer.namespace}):
            return False
    elif peer.namespace != policy_namespace:
        return False
    return selects(peer_rule.get("podSelector", {}), dict(peer.labels))


def admits(policies: list[dict[str, Any]], direction: str, pod: Peer, other: Peer, port: int,
           *, protocol: str = "TCP") -> bool:  # fmt: skip
    """Whether ``pod``'s policies let it take (Ingress) or start (Egress) a connection with
    ``other`` on the port: a pod no policy of that direction selects is open."""
    key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    selecting = [
        p for p in policies
        if p["metadata"]["namespace"] == pod.namespace
        and selects(p["spec"]["podSelector"], dict(pod.labels))
        and direction in p["spec"]["policyTypes"]
    ]  # fmt: skip
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get(key) or []:
            ports = rule.get("ports")
            if ports and not any(
                p.get("port") == port and p.get("protocol", "TCP") == protocol for p in ports
            ):
                continue
            peers = rule.get(peers_key)
            namespace = policy["metadata"]["namespace"]
            if not peers or any(peer_matches(r, other, namespace) for r in peers):
                return True
    return False


def connects(policies: list[dict[str, Any]], source: Peer, target: Peer, port: int,
             *, protocol: str = "TCP") -> bool:  # fmt: skip
    """A connection needs the source's egress (when it is a pod) and the target's ingress."""
    out = source.namespace is None or admits(
        policies, "Egress", source, target, port, protocol=protocol
    )
    return out and admits(policies, "Ingress", target, source, port, protocol=protocol)


def lws_pods(found: list[dict[str, Any]], namespace: str) -> list[Peer]:
    """The pods the (possibly scaled) LeaderWorkerSet makes, with the controller's labels."""
    [lws] = [o for o in found if o["kind"] == "LeaderWorkerSet"]
    template = lws["spec"]["leaderWorkerTemplate"]
    pods = []
    for group in range(lws["spec"]["replicas"]):
        for index in range(template["size"]):
            part = template["leaderTemplate" if index == 0 else "workerTemplate"]
            labels = {
                **part["metadata"]["labels"],
                objects.LWS_NAME_LABEL: lws["metadata"]["name"],
                objects.GROUP_INDEX_LABEL: str(group),
                objects.WORKER_INDEX_LABEL: str(index),
            }
            ip = f"10.0.1.{10 + 20 * group + index}"
            pods.append(Peer(f"{group}-{index}", ip, namespace, tuple(sorted(labels.items()))))
    return pods


def scaled(stack: str, replicas: int, **overrides: Any) -> list[dict[str, Any]]:
    """A stack's objects, its LeaderWorkerSet then scaled by hand (kubectl scale, an autoscaler)."""
    config = config_of({**stack_values(stack), **overrides})
    found = objects.render(config, name=NAME, namespace=NAMESPACE, image=IMAGE)
    for obj in found:
        if obj["kind"] == "LeaderWorkerSet":
            obj["spec"]["replicas"] = replicas
    return found


OUTSIDERS = [
    Peer("a pod of the namespace", "10.0.1.200", NAMESPACE, (("app", "other"),)),
    Peer("a pod of another namespace", "10.0.1.201", "kube-system", (("k8s-app", "kube-dns"),)),
    Peer("a VPC address", "10.0.2.7"),
    Peer("the internet", "203.0.113.9"),
]


@pytest.mark.parametrize(
    ("stack", "replicas"), [("aws-c8g", 1), ("aws-r8g", 1), ("aws-c8g", 2), ("aws-c8g", 3)]
)
def test_scaled_to_three_groups_no_worker_port_is_reachable_from_outside_its_group(
    stack: str, replicas: int
) -> None:
    """Rendered with ``replicas`` groups, scaled to three by editing replicas (kubectl scale, an
    autoscaler): each worker of a rendered group takes RPC and metrics from its own group's
    leader alone; a group the render did not know is closed to everything (it serves nothing:
    HAProxy does not know its leader either); no worker takes any other port, or starts any
    connection."""
    config = config_of({**stack_values(stack), f"{P}replicas": replicas})
    found = scaled(stack, 3, **{f"{P}replicas": replicas})
    policies = [o for o in found if o["kind"] == "NetworkPolicy"]
    pods = lws_pods(found, NAMESPACE)
    assert len(pods) == 3 * (config.worker_count + 1)
    balancers = [
        Peer("balancer", "10.0.1.99", NAMESPACE,
             tuple(sorted(o["spec"]["template"]["metadata"]["labels"].items())))
        for o in found if o["kind"] == "Deployment"
    ]  # fmt: skip
    assert len(balancers) == (replicas > 1)
    for worker in (p for p in pods if not p.name.endswith("-0")):
        group = worker.name.split("-")[0]
        for port in (config.rpc_port, METRICS_PORT, config.server_port, 22):
            reach = {
                p.name
                for p in [*pods, *OUTSIDERS, *balancers]
                if p != worker and connects(policies, p, worker, port)
            }
            rendered_group = int(group) < replicas
            served = port in (config.rpc_port, METRICS_PORT) and rendered_group
            assert reach == ({f"{group}-0"} if served else set()), (worker.name, port)
        for target in [*pods, *OUTSIDERS]:
            for port in (53, 443, config.rpc_port, config.server_port):
                assert not admits(policies, "Egress", worker, target, port), (worker.name, target)
        assert not admits(policies, "Egress", worker, OUTSIDERS[1], 53, protocol="UDP")


def test_before_the_fix_a_scaled_groups_workers_were_open() -> None:
    """The evaluator itself: per-group policies alone, without the default deny, leave a third
    group's workers open to every pod (what a render did before)."""
    found = scaled("aws-c8g", 3)
    only_groups = [
        o for o in found if o["kind"] == "NetworkPolicy"
        and o["metadata"]["name"] in (f"{NAME}-group-0-workers", f"{NAME}-leaders")
    ]  # fmt: skip
    pods = lws_pods(found, NAMESPACE)
    [worker] = [p for p in pods if p.name == "2-1"]
    assert connects(only_groups, OUTSIDERS[0], worker, stack_config("aws-c8g").rpc_port)


def test_leaders_and_the_balancer_reach_only_what_they_need() -> None:
    config = config_of({**stack_values("aws-c8g"), f"{P}replicas": 2,
                        f"{P}apiAllowedCidrs": ["10.8.0.0/16"]})  # fmt: skip
    found = objects.render(config, name=NAME, namespace=NAMESPACE, image=IMAGE)
    policies = [o for o in found if o["kind"] == "NetworkPolicy"]
    pods = lws_pods(found, NAMESPACE)
    [deployment] = [o for o in found if o["kind"] == "Deployment"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    balancer = Peer("balancer", "10.0.1.99", NAMESPACE, tuple(sorted(labels.items())))
    leader, worker, other_leader = (
        next(p for p in pods if p.name == n) for n in ("0-0", "0-1", "1-0")
    )
    dns = OUTSIDERS[1]
    assert connects(policies, leader, dns, 53, protocol="UDP") and connects(
        policies, balancer, dns, 53
    )
    assert connects(policies, leader, worker, config.rpc_port)
    assert not connects(policies, other_leader, worker, config.rpc_port)
    # The model over HTTPS from the internet; nothing of the VPC or the metadata service.
    assert admits(policies, "Egress", leader, OUTSIDERS[3], 443)
    for address in ("10.0.2.7", "169.254.169.254", "172.20.0.1"):
        assert not admits(policies, "Egress", leader, Peer("x", address), 443), address
    assert not admits(policies, "Egress", leader, OUTSIDERS[3], 80)
    # The API: leaders and the balancer from the namespace's pods and apiAllowedCidrs only.
    for target in (leader, balancer):
        assert connects(policies, Peer("vpn", "10.8.1.1"), target, config.server_port)
        assert not connects(policies, OUTSIDERS[3], target, config.server_port)
        assert not connects(policies, OUTSIDERS[0], target, config.rpc_port)
    assert connects(policies, balancer, leader, config.server_port)
    assert not admits(policies, "Egress", balancer, OUTSIDERS[3], 443)
    # Nothing public: the leaders' Service is the cluster's own, never a load balancer.
    assert {o["spec"]["type"] for o in found if o["kind"] == "Service"} == {"ClusterIP"}


# --- Pod Security: the "restricted" profile ---------------------------------------------------


def pod_specs(found: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    specs = {}
    for obj in found:
        if obj["kind"] == "LeaderWorkerSet":
            template = obj["spec"]["leaderWorkerTemplate"]
            for part in ("leaderTemplate", "workerTemplate"):
                specs[part] = template[part]["spec"]
        elif obj["kind"] == "Deployment":
            specs[obj["metadata"]["name"]] = obj["spec"]["template"]["spec"]
    return specs


@pytest.mark.parametrize("stack", RENDERED)
def test_every_pod_passes_the_restricted_pod_security_profile(stack: str) -> None:
    found = list(objects.render(config_of({**stack_values(stack), f"{P}replicas": 2}),
                                name=NAME, namespace=NAMESPACE, image=IMAGE))  # fmt: skip
    specs = pod_specs(found)
    assert f"{NAME}-balancer" in specs and "leaderTemplate" in specs
    for part, spec in specs.items():
        assert restricted_problems(spec) == [], part


@pytest.mark.parametrize(
    ("break_it", "says"),
    [
        (lambda s: s["securityContext"].pop("seccompProfile"), "seccomp"),
        (lambda s: s["securityContext"].update(seccompProfile={"type": "Unconfined"}),
         "Unconfined"),
        (lambda s: s["containers"][0]["securityContext"].update(allowPrivilegeEscalation=True),
         "privilege escalation"),
        (lambda s: s["containers"][0]["securityContext"]["capabilities"].update(drop=[]), "ALL"),
        (lambda s: s["containers"][0]["securityContext"]["capabilities"].update(add=["NET_RAW"]),
         "NET_BIND_SERVICE"),
        (lambda s: s["securityContext"].update(runAsNonRoot=False), "runAsNonRoot"),
        (lambda s: s["securityContext"].update(runAsUser=0), "runAsUser is 0"),
        (lambda s: s.update(hostNetwork=True), "hostNetwork"),
        (lambda s: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}), "hostPath"),
        (lambda s: s["containers"][0]["ports"][0].update(hostPort=50052), "host ports"),
        (lambda s: s["containers"][0]["securityContext"].update(privileged=True), "privileged"),
    ],
)  # fmt: skip
def test_a_pod_outside_the_restricted_profile_is_caught(break_it: Any, says: str) -> None:
    [lws] = of_kind("aws-c8g", "LeaderWorkerSet")
    spec = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    assert restricted_problems(spec) == []
    break_it(spec)
    problems = restricted_problems(spec)
    assert any(says in p for p in problems), problems


def test_the_leader_reads_no_configuration_file_it_could_write() -> None:
    """llama-server reads $XDG_CONFIG_HOME/llama.cpp/config.ini (else under $HOME, the pod's
    writable data volume) before its flags: the leader's is a directory its user cannot make."""
    [lws] = of_kind("aws-c8g", "LeaderWorkerSet")
    [server] = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"]
    [config_home] = [e["value"] for e in server["env"] if e["name"] == "XDG_CONFIG_HOME"]
    mounted = {m["mountPath"] for m in server["volumeMounts"]}
    assert not any(config_home.startswith(m) for m in mounted)
    assert config_home == objects.READ_ONLY_CONFIG_HOME


# --- the pods' data on claims that outlive a group ----------------------------------------------


def test_with_a_storage_class_each_pods_data_is_a_claim_kept_across_group_restarts() -> None:
    config = stack_config("aws-c8g")
    found = objects.render(
        config, name=NAME, namespace=NAMESPACE, image=IMAGE, storage_class="gp3-encrypted"
    )
    [lws] = [o for o in found if o["kind"] == "LeaderWorkerSet"]
    assert lws_problems(lws) == []
    template = lws["spec"]["leaderWorkerTemplate"]
    [claim] = template["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["storageClassName"] == "gp3-encrypted"
    assert claim["spec"]["resources"]["requests"]["storage"] == f"{config.main_disk_gb}Gi"
    # Kept when the controller deletes a group's StatefulSets to make the group again.
    assert template["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Retain"
    for part in ("leaderTemplate", "workerTemplate"):
        spec = template[part]["spec"]
        assert "data" not in {v["name"] for v in spec["volumes"]}, part
        [container] = spec["containers"]
        assert {"name": "data", "mountPath": VM_PATHS.data_dir} in container["volumeMounts"]
        # The claim a StatefulSet adds is one the restricted profile takes.
        pod = {**spec, "volumes": [*spec["volumes"], {"name": "data",
               "persistentVolumeClaim": {"claimName": "data-x"}}]}  # fmt: skip
        assert restricted_problems(pod) == []
    # Without the class, the node's own storage, as before.
    [plain] = of_kind("aws-c8g", "LeaderWorkerSet")
    assert "volumeClaimTemplates" not in plain["spec"]["leaderWorkerTemplate"]


@pytest.mark.parametrize("storage_class", ["GP3", "gp3_fast", "-gp3", ""])
def test_a_storage_class_name_kubernetes_refuses_is_a_usage_error(
    storage_class: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["render", "--stack", "aws-c8g", "--image", IMAGE, f"--storage-class={storage_class}"]
    assert cli.main(argv) == 2
    assert "--storage-class" in capsys.readouterr().err


# --- schedulability: each pod beside what the platform runs ------------------------------------


def test_a_type_too_small_for_a_pod_beside_the_platforms_is_refused_by_name() -> None:
    """aws-small's c8g.large (2 vCPUs) cannot hold the controller's CPU, CoreDNS, the
    DaemonSets and a whole CPU for the pod: refused, naming instanceType."""
    with pytest.raises(objects.RenderError) as error:
        objects.render(stack_config("aws-small"), name=NAME, namespace=NAMESPACE, image=IMAGE)
    assert error.value.setting == "instanceType"
    assert "c8g.large" in str(error.value) and "LeaderWorkerSet controller" in str(error.value)


# --- replicas: the VMs' balancer in front of the leaders ---------------------------------------


@functools.cache
def replicated() -> tuple[dict[str, Any], ...]:
    config = config_of({**stack_values("aws-c8g"), f"{P}replicas": 3, f"{P}slots": 2})
    return tuple(objects.render(config, name=NAME, namespace=NAMESPACE, image=IMAGE))


def test_replicas_sit_behind_haproxy_that_sends_each_request_to_a_free_slot() -> None:
    config = config_of({**stack_values("aws-c8g"), f"{P}replicas": 3, f"{P}slots": 2})
    found = {(o["kind"], o["metadata"]["name"]): o for o in replicated()}
    for obj in found.values():
        if obj["kind"] != "LeaderWorkerSet":
            assert core_problems(obj) == [], obj["kind"]
    cfg = found["ConfigMap", f"{NAME}-balancer"]["data"]["haproxy.cfg"]
    for group in range(3):
        leader = f"{NAME}-{group}.{NAME}.{NAMESPACE}.svc.cluster.local"
        assert f"server group{group + 1} {leader}:8080 maxconn 2" in cfg
    timeout = config.generation_timeout_seconds
    assert f"timeout server {timeout}s" in cfg and "balance leastconn" in cfg
    # The VMs' balancer node's configuration, but for where the servers are and how they are
    # found (DNS, again while it runs).
    vm = haproxy_config(config.balancer_boot) if config.balancer_boot else ""
    differs = re.compile(
        r"\s*(server |bind |resolvers |parse-resolv|hold |default-server resolvers)"
    )
    kept = [line for line in cfg.splitlines() if line and not differs.match(line)]
    assert kept == [line for line in vm.splitlines() if line and not differs.match(line)]
    # The Service sends the API to HAProxy; without replicas, to the leader.
    service = found["Service", f"{NAME}-api"]
    assert service["spec"]["selector"] == objects.balancer_labels(NAME)
    deployment = found["Deployment", f"{NAME}-balancer"]
    pod = deployment["spec"]["template"]
    assert objects.balancer_labels(NAME).items() <= pod["metadata"]["labels"].items()
    assert pod["spec"]["nodeSelector"][objects.ARCH_LABEL] == "arm64"
    [mount] = pod["spec"]["containers"][0]["volumeMounts"]
    assert mount["mountPath"] == objects.HAPROXY_CONFIG_DIR
    [alone] = of_kind("aws-c8g", "Service")
    assert alone["spec"]["selector"][objects.WORKER_INDEX_LABEL] == "0"
    assert not of_kind("aws-c8g", "Deployment")
    # The balancer takes the API from where a leader does, and nothing else.
    policy = found["NetworkPolicy", f"{NAME}-balancer"]["spec"]
    assert policy["ingress"] == found["NetworkPolicy", f"{NAME}-leaders"]["spec"]["ingress"]


def test_haproxy_accepts_the_balancers_configuration(tmp_path: Path) -> None:
    haproxy = require_tool("haproxy")
    [cfg] = [
        o["data"]["haproxy.cfg"]
        for o in replicated()
        if o["metadata"]["name"].endswith("-balancer") and o["kind"] == "ConfigMap"
    ]
    path = tmp_path / "haproxy.cfg"
    path.write_text(cfg)
    checked = subprocess.run([haproxy, "-c", "-f", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    path.write_text(cfg.replace("resolvers system init-addr", "resolvers nowhere init-addr"))
    broken = subprocess.run([haproxy, "-c", "-f", str(path)], capture_output=True, text=True)
    assert broken.returncode != 0


# --- one source of truth: the same scripts, the same flags ----------------------------------


def resolve(
    env: list[dict[str, Any]], config_map: dict[str, str], pod: dict[str, str]
) -> dict[str, str]:
    """A container's environment as the kubelet makes it: the ConfigMap, then each entry in
    order, ``$(NAME)`` expanded from those before it; ``pod`` answers the downward API."""
    out = dict(config_map)
    for entry in env:
        if "value" in entry:
            out[entry["name"]] = re.sub(r"\$\((\w+)\)", lambda m: out[m[1]], entry["value"])
        else:
            source = entry["valueFrom"]
            ref = (
                source.get("fieldRef", {}).get("fieldPath")
                or source["resourceFieldRef"]["resource"]
            )
            out[entry["name"]] = pod[ref]
    return out


def first_group(role: str, found: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, str]]:
    """A role's container in the first group, and its environment there, on this machine's
    loopback address."""
    [env] = [
        o["data"]
        for o in found
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith(f"{role}-env")
    ]
    [lws] = [o for o in found if o["kind"] == "LeaderWorkerSet"]
    template = lws["spec"]["leaderWorkerTemplate"][f"{role}Template"]
    [container] = template["spec"]["containers"]
    pod = {
        "status.podIP": "127.0.0.1",
        f"metadata.labels['{objects.GROUP_INDEX_LABEL}']": "0",
        "requests.cpu": container["resources"]["requests"]["cpu"],
    }
    return container, resolve(container["env"], env, pod)


def flags_of(script: str, env: dict[str, str], args: Path) -> list[str]:
    """Run a node script with ``fake`` standing in for its llama.cpp binary until the binary
    has recorded its arguments; return them."""
    run = subprocess.Popen(
        ["bash", str(SCRIPTS / script)], env={**env, "FAKE_ARGS": str(args)},
        start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not args.exists() or not args.read_text().endswith("\n"):
            assert run.poll() is None, run.communicate()[0]
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        os.killpg(run.pid, signal.SIGTERM)
        run.communicate(timeout=30)
    return args.read_text().splitlines()


# Stands in for llama-server and ggml-rpc-server: records its arguments, then waits.
RECORD = (
    "#!/usr/bin/env bash\n"
    'printf \'%s\\n\' "$@" >"$FAKE_ARGS.tmp"; mv "$FAKE_ARGS.tmp" "$FAKE_ARGS"\n'
    "exec sleep 600\n"
)


def machine(tmp_path: Path, run: str, binary: str) -> dict[str, str]:
    """This machine's stand-ins for a node's directories, under ``tmp_path/run``."""
    root = tmp_path / run
    prefix, data = root / "prefix", root / "data"
    fake = prefix / stack_config("aws-c8g").llama_cpp_commit / "bin" / binary
    fake.parent.mkdir(parents=True)
    fake.write_text(RECORD)
    fake.chmod(0o755)
    (data / "models").mkdir(parents=True)
    return {
        "PATH": os.environ["PATH"], "LLAMA_RPC_ENV_FILE": str(root / "absent.env"),
        "LLAMA_PREFIX": str(prefix), "LLAMA_DATA_DIR": str(data),
        "LLAMA_STATUS_FILE": str(data / "status.json"),
    }  # fmt: skip


# Settings that change llama-server's flags, beside the stacks' own.
FLAGGED = {
    f"{P}contextSize": 2048, f"{P}slots": 3, f"{P}modelAlias": "llama-405b",
    f"{P}serverArgs": ["--temp", "0.5", "--jinja"],
}  # fmt: skip


@pytest.mark.parametrize(
    ("stack", "overrides"),
    [("aws-c8g", {}), ("gcp-c4a", {}), ("azure-cobalt", {}), ("aws-c8g", FLAGGED)],
    ids=["aws-c8g", "gcp-c4a", "azure-cobalt", "aws-c8g-flagged"],
)
def test_the_leader_runs_llama_server_with_the_main_nodes_flags(
    stack: str, overrides: dict[str, Any], tmp_path: Path
) -> None:
    config = config_of({**stack_values(stack), **overrides})
    main, *_ = config.boots(0)
    found = objects.render(config, name=NAME, namespace=NAMESPACE, image=IMAGE)
    server, pod_env = first_group("leader", found)
    threads = pod_env["LLAMA_THREADS"]
    # The group's workers by name, as many as the main node's, on its RPC port.
    names = pod_env["RPC_WORKERS"].split(",")
    assert names == [
        f"{NAME}-0-{i}.{NAME}:{config.rpc_port}" for i in range(1, len(main.rpc_workers) + 1)
    ]
    # Both runs: this machine's directories, stand-in workers on loopback, the same key file
    # and CPU count (a VM's llama.cpp takes every core, a pod the CPUs it asks for).
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in main.rpc_workers]
    workers = ",".join(f"127.0.0.1:{s.getsockname()[1]}" for s in listeners)
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / API_KEY_CREDENTIAL).write_text("k" * 32)
    port = str(free_port())
    same = {
        "RPC_WORKERS": workers, "CREDENTIALS_DIRECTORY": str(credentials),
        "LLAMA_THREADS": threads, "SERVER_PORT": port, "LLAMA_NODE_IP": "127.0.0.1",
    }  # fmt: skip
    vm_env = main.env(VM_PATHS)
    model = subprocess.run(
        ["bash", "-c", f'source "{SCRIPTS}/lib.sh"; model_name "$1"', "_", main.model_urls[0]],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    try:
        flags = []
        for run, env in (("vm", vm_env), ("pod", pod_env)):
            here = machine(tmp_path, run, "llama-server")
            (Path(here["LLAMA_DATA_DIR"]) / "models" / model).write_bytes(b"GGUF")
            flags.append(
                flags_of("llama-server.sh", {**env, **here, **same}, tmp_path / f"{run}.args")
            )
    finally:
        for s in listeners:
            s.close()
    vm_flags, pod_flags = (
        [f.replace(str(tmp_path / run), "<node>") for f in found]
        for run, found in zip(("vm", "pod"), flags, strict=True)
    )
    assert vm_flags == pod_flags
    assert "--metrics" in pod_flags and pod_flags[pod_flags.index("--ctx-size") + 1] == str(
        config.context_size * config.slots
    )
    if overrides:
        assert pod_flags[pod_flags.index("--parallel") + 1] == "3"
        assert pod_flags[pod_flags.index("--alias") + 1] == "llama-405b"
        assert pod_flags[pod_flags.index("--temp") + 1] == "0.5" and "--jinja" in pod_flags
    if main.rpc_workers:
        assert pod_flags[pod_flags.index("--tensor-split") + 1] == ",".join(
            map(str, main.tensor_split)
        )
    # The key's Secret is where systemd hands the VM's server its credentials.
    if main.api_key_file:
        assert "--api-key-file" in pod_flags
        mounts = {m["name"]: m["mountPath"] for m in server["volumeMounts"]}
        assert mounts["api-key"] == objects.CREDENTIALS_DIRECTORY
        # systemd's directory for the unit's credentials is named after the unit.
        unit = UNITS_DIR / ROLE_UNIT["main"]
        assert f"/run/credentials/{unit.name}" == objects.CREDENTIALS_DIRECTORY
        assert f"ImportCredential={API_KEY_CREDENTIAL}" in unit.read_text()


def test_a_worker_runs_ggml_rpc_server_with_a_worker_nodes_flags(tmp_path: Path) -> None:
    config = stack_config("aws-c8g")
    _, worker, *_ = config.boots(0)
    rpc, pod_env = first_group("worker", list(rendered("aws-c8g")))
    threads = pod_env["LLAMA_THREADS"]
    port = str(free_port())
    same = {"LLAMA_THREADS": threads, "RPC_PORT": port, "LLAMA_NODE_IP": "127.0.0.1"}
    flags = [
        flags_of(
            "rpc-worker.sh",
            {**env, **machine(tmp_path, run, "ggml-rpc-server"), **same},
            tmp_path / f"{run}.args",
        )
        for run, env in (
            ("vm", worker.env(VM_PATHS)),
            ("pod", pod_env),
        )
    ]
    assert flags[0] == flags[1] == ["--host", "127.0.0.1", "--port", port, "--threads", threads]
    # The pod listens on its own address, never every interface, as a worker node does.
    [address] = [e for e in rpc["env"] if e["name"] == "LLAMA_NODE_IP"]
    assert address["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}


# --- what cannot be rendered, and the command -------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "setting"),
    [
        ({f"{P}stopAfterIdleMinutes": 30}, "stopAfterIdleMinutes"),
        ({f"{P}stopAfterHours": 4}, "stopAfterHours"),
        (
            {
                f"{P}model": {
                    **stack_values("aws-small")[f"{P}model"],
                    "urls": ["s3://my-models/qwen/model.gguf"],
                }
            },
            "model.urls",
        ),
    ],
)
def test_a_setting_a_pod_cannot_honour_is_refused_by_name(
    overrides: dict[str, Any], setting: str
) -> None:
    config = config_of({**stack_values("aws-small"), **overrides})
    with pytest.raises(objects.RenderError) as error:
        objects.render(config, name=NAME, namespace=NAMESPACE, image=IMAGE)
    assert error.value.setting == setting
    assert "remove the setting" in str(error.value) or "https URLs" in str(error.value)


def test_the_command_writes_the_objects_and_the_image_context(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = cli.main(["render", "--stack", "aws-c8g", "--image", IMAGE, "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    written = list(yaml.safe_load_all((out / "objects.yaml").read_text()))
    config = stack_config("aws-c8g")
    assert written == objects.render(config, name=NAME, namespace="default", image=IMAGE)
    recipe = (out / "image" / "Dockerfile").read_text()
    assert f"LLAMA_CPP_COMMIT={config.llama_cpp_commit}" in recipe and "LLAMA_ROLE=all" in recipe
    # One recipe whatever machine builds it: for the stack's CPU family, on a base by digest.
    assert "FROM --platform=linux/arm64 ubuntu:24.04@${UBUNTU_DIGEST}" in recipe
    assert "LLAMA_CPU_ARCH=armv9-a+sve2+bf16+i8mm" in recipe and "native" not in recipe
    assert " haproxy " in recipe
    # Every script a pod runs is in the context, as the VMs install it, with its mode.
    main, worker, *_ = config.boots(0)
    context = image.context_files(main, worker)
    for script in (
        "llama-server.sh",
        "rpc-worker.sh",
        "fetch-model.sh",
        "build-llama.sh",
        "wait-workers.sh",
    ):
        name = f"{image.CONTEXT_FILES}{VM_PATHS.bin_dir}/{script}"
        path = out / "image" / name
        assert (oct(path.stat().st_mode & 0o777)[2:].zfill(4), path.read_text()) == context[name]
        assert path.stat().st_mode & 0o111, script
    assert "kubectl create secret generic" in capsys.readouterr().out


def test_without_an_image_the_command_writes_the_build_context_and_the_way_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert cli.main(["render", "--stack", "gcp-c4a", "--out", str(out)]) == 0
    assert (out / "image" / "Dockerfile").exists() and not (out / "objects.yaml").exists()
    said = capsys.readouterr().out
    assert "--metadata-file meta.json" in said and "--image REGISTRY/llama-rpc:TAG@" in said
    assert "-march=armv9-a+sve2+bf16+i8mm" in said  # Axion: Neoverse V2
    # Nothing to write to: the image is needed.
    assert cli.main(["render", "--stack", "gcp-c4a"]) == 2
    assert "--image" in capsys.readouterr().err


def test_each_cpu_family_of_the_catalog_has_its_architecture() -> None:
    families = {
        row["cpu_family"] for row in csv.DictReader((REPO / "infra/catalog/cpus.csv").open())
    }
    assert families == set(image.CPU_ARCH)
    # A stack of two families builds for the older one.
    c7g, c8g = (catalog.find("aws", "us-east-1", t) for t in ("c7g.16xlarge", "c8g.16xlarge"))
    assert c7g is not None and c8g is not None
    assert image.cpu_arch(c8g, c7g) == image.CPU_ARCH["graviton3"]


def test_build_llama_builds_for_the_given_architecture(
    run_script, fake_bin, tmp_path: Path
) -> None:
    """LLAMA_CPU_ARCH replaces -march=native with the family's -march; a node (none given)
    keeps its own CPU's, and a value that is no -march is refused."""
    directory, write = fake_bin
    write("cmake", 'printf "%s\\n" "$@" >>"$CMAKE_LOG"; exit 1\n')
    source = tmp_path / "llama.cpp"
    (source / "tools" / "rpc").mkdir(parents=True)
    (source / "CMakeLists.txt").write_text("")
    commit = stack_config("aws-c8g").llama_cpp_commit
    (tmp_path / "prefix" / commit / "src").mkdir(parents=True)
    for arch, want in (
        (
            "armv9-a+sve2+bf16+i8mm",
            ["-DGGML_NATIVE=OFF", "-DGGML_CPU_ARM_ARCH=armv9-a+sve2+bf16+i8mm"],
        ),
        ("", ["-DGGML_NATIVE=ON"]),
    ):
        log = tmp_path / f"cmake-{arch or 'native'}.log"
        run_script(
            "build-llama.sh", LLAMA_ROLE="all", LLAMA_CPP_COMMIT=commit,
            LLAMA_CPP_SOURCE=str(source), LLAMA_CPP_PATCHES="none", LLAMA_CPU_ARCH=arch,
            PATH=f"{directory}:{os.environ['PATH']}", CMAKE_LOG=str(log),
        )  # fmt: skip
        args = log.read_text().split()
        assert [a for a in args if "GGML_NATIVE" in a or "ARM_ARCH" in a] == want, arch
    result, status = run_script(
        "build-llama.sh", LLAMA_ROLE="all", LLAMA_CPP_COMMIT=commit, LLAMA_CPP_SOURCE=str(source),
        LLAMA_CPU_ARCH="native; rm -rf /", PATH=f"{directory}:{os.environ['PATH']}",
        CMAKE_LOG=str(tmp_path / "never.log"),
    )  # fmt: skip
    assert result.returncode != 0 and "not an -march value" in status["last_error"]
    assert not (tmp_path / "never.log").exists()


def test_json_gives_the_objects_and_the_secret_to_make(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["render", "--stack", "aws-c8g", "--image", IMAGE, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["stack"] == "aws-c8g" and document["apiKeySecret"] == f"{NAME}-api-key"
    assert document["objects"] == objects.render(
        stack_config("aws-c8g"), name=NAME, namespace="default", image=IMAGE
    )


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--stack", "nope"], "no stacks/Pulumi.nope.yaml"),
        (["--stack", "aws-c8g", "--name", "Llama"], "--name"),
        (["--stack", "aws-c8g", "--namespace", "Bad_NS"], "--namespace"),
        (["--stack", "aws-c8g", "--image", "My Registry/llama:1"], "--image"),
        (["--stack", "aws-c8g", "--image", "llama:"], "an image reference"),
        # A tag alone: the objects would run whatever the tag names next.
        (["--stack", "aws-c8g", "--image", "registry.example/llama-rpc:1"], "by digest"),
    ],
)
def test_bad_input_is_a_usage_error_naming_it(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["render", "--image", IMAGE, *argv]) == 2
    assert says in capsys.readouterr().err
