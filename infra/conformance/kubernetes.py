"""The input rules of the Kubernetes objects the program applies to a cluster (EKS), and of the
provider that applies them (``infra.conformance.rules``).

Names and labels as the API server validates them, ConfigMap and Secret keys and sizes, the
values and combinations the program's objects keep, the order the API needs (a namespace before
what lives in it, the LeaderWorkerSet controller before a LeaderWorkerSet), and the inputs whose
change makes pulumi-kubernetes replace an object rather than patch it (its forceNew list).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from infra import catalog
from infra.conformance.rules import (
    ORDER,
    TAGS,
    After,
    AutoName,
    Between,
    Name,
    OneOf,
    Registered,
    Requires,
    ResourceRules,
    Rule,
    Stack,
    by_type,
    revealed,
    values_at,
)
from infra.core import pins, scheduling

NAMES = "https://kubernetes.io/docs/concepts/overview/working-with-objects/names/"
LABELS = (
    "https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/"
    "#syntax-and-character-set"
)
CONFIGMAP = "https://kubernetes.io/docs/concepts/configuration/configmap/"
# The API server's own checks: IsConfigMapKey (keys of ConfigMaps and Secrets) and the 1 MiB
# (core.MaxSecretSize) ValidateConfigMap and ValidateSecret hold every object's data to.
KEY_CHECKS = (
    "kubernetes/apimachinery pkg/util/validation/validation.go (IsConfigMapKey); "
    "kubernetes/kubernetes pkg/apis/core/validation/validation.go (ValidateConfigMap, "
    "ValidateSecret: core.MaxSecretSize)"
)
SERVICE = "https://kubernetes.io/docs/concepts/services-networking/service/"
SERVICE_PORT = "https://kubernetes.io/docs/reference/kubernetes-api/service-resources/service-v1/"
NETWORK_POLICY = (
    "https://kubernetes.io/docs/reference/kubernetes-api/policy-resources/network-policy-v1/"
)
DEPLOYMENT = "https://kubernetes.io/docs/concepts/workloads/controllers/deployment/"
NAMESPACE_LIFECYCLE = (
    "https://kubernetes.io/docs/reference/access-authn-authz/admission-controllers/"
    "#namespacelifecycle"
)
CRD = (
    "https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/"
    "custom-resource-definitions/"
)
# What pulumi-kubernetes replaces rather than patches: .metadata.name and .metadata.namespace of
# every object, and per kind the fields Kubernetes will not change (forceNewProperties). A
# ConfigMap's data and a Secret's are in it unless the provider sets enableConfigMapMutable or
# enableSecretMutable (both off by default, and the program sets neither).
FORCE_NEW = "pulumi/pulumi-kubernetes provider/pkg/provider/diff.go @cafe8c4a (forceNewProperties)"
PROVIDER_DIFF = "pulumi/pulumi-kubernetes provider/pkg/provider/provider.go @010f5d8e"
LWS = "kubernetes-sigs/lws v0.10.0 (2161f38f)"
LWS_CRD = (
    f"{LWS} config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml "
    "(tests/fixtures/lws-v0.10.0)"
)
LWS_WEBHOOK = f"{LWS} pkg/webhooks/leaderworkerset_webhook.go"
PROGRAM = "the program's rule"
PATCH = "pulumi_kubernetes 4.34.2 apps/v1/DeploymentPatch.py (Patch resources)"

# The API server's name formats (kubernetes/apimachinery pkg/util/validation/validation.go).
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL = re.compile(_DNS1123_LABEL)
DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*")
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
LABEL_MEANING = "an RFC 1123 label: lowercase letters, digits and '-', alphanumeric at both ends"
SUBDOMAIN_MEANING = "a DNS subdomain: RFC 1123 labels joined by '.'"
DNS1035_MEANING = "an RFC 1035 label: lowercase letters, digits and '-', starting with a letter"
LABEL_MAX = 63
SUBDOMAIN_MAX = 253
# A label key's name (and a label value): alphanumeric at both ends, '-', '_' and '.' inside.
QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
CONFIG_KEY = re.compile(r"[-._a-zA-Z0-9]+")
DATA_LIMIT = 1024 * 1024  # 1 MiB: a ConfigMap's data, a Secret's
PROTOCOLS = ("TCP", "UDP", "SCTP")
# The verified copy of a pinned release's manifest (infra.stack.kube.controller): named by the
# release, the manifest's sha256 and the controller image's digest (their first 16 hex digits).
PINNED_COPY = re.compile(r"(.*/)?v\d+\.\d+\.\d+-[0-9a-f]{16}-[0-9a-f]{16}\.yaml")
INT32_MAX = 2**31 - 1
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"

PROVIDER = "pulumi:providers:kubernetes"
CONFIG_FILE = "kubernetes:yaml/v2:ConfigFile"
NAMESPACE = "kubernetes:core/v1:Namespace"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
SECRET = "kubernetes:core/v1:Secret"  # noqa: S105 (a type token, not a secret)
SERVICE_TYPE = "kubernetes:core/v1:Service"
NETWORK_POLICY_TYPE = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
DEPLOYMENT_TYPE = "kubernetes:apps/v1:Deployment"
DEPLOYMENT_PATCH = "kubernetes:apps/v1:DeploymentPatch"
LEADER_WORKER_SET = "kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet"


@dataclass(frozen=True)
class MetadataName(Name):
    """A name inside an object's metadata (``metadata.name``, ``metadata.namespace``), which
    ``Name`` cannot reach (it reads top-level inputs). The program names every object itself
    (``autoname`` None): pulumi-kubernetes would add a random suffix that the objects' DNS names,
    selectors and references cannot follow."""

    autoname: AutoName | None = None

    def problems(self, resource: Registered, stack: Stack) -> Iterator[str]:
        given = next((value for _, value in values_at(resource.inputs, self.prop)), None)
        if given is None:
            yield f"{self.prop} is not given: the program names every object itself"
            return
        yield from super().problems(replace(resource, inputs={self.prop: given}), stack)


def object_name(pattern: re.Pattern[str], max_length: int, meaning: str, source: str) -> Name:
    return MetadataName("metadata.name", pattern, 1, max_length, meaning, f"{NAMES}; {source}")


def namespace() -> Name:
    return MetadataName(
        "metadata.namespace",
        DNS1123_LABEL,
        1,
        LABEL_MAX,
        f"a namespace's name, {LABEL_MEANING}",
        f"{NAMES}; {PROGRAM}: every object names its namespace (none lands in the provider's "
        "default)",
    )


def label_problem(key: str, value: str, *, key_max: int | None = None) -> str | None:
    """Why a label breaks Kubernetes' syntax (an optional DNS-subdomain prefix and '/', a name
    of at most 63 characters; a value of at most 63), or None."""
    prefix, _, name = key.rpartition("/")
    if "/" in prefix or (key.count("/") and not prefix):
        return f"label {key!r}: one '/' at most, after a non-empty prefix"
    if prefix and not (len(prefix) <= SUBDOMAIN_MAX and DNS1123_SUBDOMAIN.fullmatch(prefix)):
        return f"label {key!r}: its prefix is not a DNS subdomain of at most 253 characters"
    if not (len(name) <= LABEL_MAX and QUALIFIED_NAME.fullmatch(name)):
        return (
            f"label {key!r}: its name holds 1-63 letters, digits, '-', '_' or '.', "
            "alphanumeric at both ends"
        )
    if key_max is not None and len(key) > key_max:
        return f"label {key!r}: {len(key)} characters; the API takes {key_max}"
    if len(value) > LABEL_MAX or (value and not QUALIFIED_NAME.fullmatch(value)):
        return (
            f"label {key}={value!r}: a value holds at most 63 letters, digits, '-', '_' or '.', "
            "alphanumeric at both ends"
        )
    return None


@dataclass(frozen=True)
class Labels(Rule):
    """The labels at a path (an object's, a pod template's, a selector's), each in Kubernetes'
    label syntax. Unlike a cloud's tags, none are required."""

    family: ClassVar[str] = TAGS
    path: str
    source: str
    key_max: int | None = None  # a tighter limit on the whole key (EKS's node labels)
    value_min: int = 0

    def problems(self, resource: Registered, _stack: Stack) -> Iterator[str]:
        for where, labels in values_at(resource.inputs, self.path):
            if not isinstance(labels, Mapping):
                yield f"{where} is not a map of labels"
                continue
            for key, value in labels.items():
                text = "" if revealed(value) is None else str(revealed(value))
                problem = label_problem(str(key), text, key_max=self.key_max)
                if problem is None and len(text) < self.value_min:
                    problem = f"label {key!r}: an empty value; the API takes 1-63 characters"
                if problem:
                    yield f"{where}: {problem}"


def metadata_labels() -> Labels:
    return Labels("metadata.labels", LABELS)


@dataclass(frozen=True)
class InItsNamespace(Rule):
    """A namespaced object is made after the stack's Namespace it lives in: the API server
    refuses an object in a namespace that does not exist (NamespaceLifecycle), and deleting the
    namespace first deletes the object under Pulumi's feet."""

    family: ClassVar[str] = ORDER
    source: str = NAMESPACE_LIFECYCLE

    def problems(self, resource: Registered, stack: Stack) -> Iterator[str]:
        wanted = next((v for _, v in values_at(resource.inputs, "metadata.namespace")), None)
        for other in stack.resources:
            if other.type != NAMESPACE:
                continue
            name = next((v for _, v in values_at(other.inputs, "metadata.name")), None)
            if name == wanted and not stack.waits_for(resource, other):
                yield (
                    f"is not made after {other.name} ({NAMESPACE}), the namespace "
                    f"{wanted!r} it lives in: the API refuses an object in a missing namespace"
                )


@dataclass(frozen=True)
class InControllerNamespace(Rule):
    """An object in the namespace the LWS controller's manifest makes (not a Namespace of the
    stack's) is made after the manifest: the API refuses an object in a missing namespace."""

    family: ClassVar[str] = ORDER
    source: str = f"{NAMESPACE_LIFECYCLE}; kubernetes-sigs/lws v0.10.0 config/default (namespace)"

    def problems(self, resource: Registered, stack: Stack) -> Iterator[str]:
        wanted = next((v for _, v in values_at(resource.inputs, "metadata.namespace")), None)
        if wanted != pins.LWS_NAMESPACE:
            return
        manifests = [r for r in stack.resources if r.type == CONFIG_FILE]
        if not manifests:
            yield f"is in {wanted!r}, which only the LWS controller's manifest makes: there is none"
        for manifest in manifests:
            if not stack.waits_for(resource, manifest):
                yield (
                    f"is not made after {manifest.name} ({CONFIG_FILE}), whose manifest makes the "
                    f"namespace {wanted!r} it lives in"
                )


def _json_object(text: Any) -> dict[str, Any] | None:
    try:
        parsed = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _kubeconfig(resource: Registered, _stack: Stack) -> str | None:
    """The provider is given the cluster's kubeconfig: without one it falls back to the
    operator's own ($KUBECONFIG, ~/.kube/config) and deploys wherever that points."""
    text = revealed(resource.inputs.get("kubeconfig"))
    if text is None:
        return "no kubeconfig: the provider would use the operator's current kubectl context"
    config = _json_object(text)
    if config is None or not config.get("clusters") or not config.get("current-context"):
        return "kubeconfig is not JSON text with clusters and a current-context"
    return None


def _pinned_manifest(resource: Registered, _stack: Stack) -> str | None:
    """The controller's manifest is the program's verified copy of a pinned release (its bytes
    checked against their sha256, the controller's image by digest: infra.stack.kube.controller),
    never a URL: a release asset can be replaced, and a tag moved, without a change to the
    program."""
    file = str(resource.inputs.get("file") or "")
    if not PINNED_COPY.fullmatch(file):
        return (
            f"file {file!r} is not the verified copy of a pinned release "
            "(<dir>/vX.Y.Z-<sha256>-<image digest>.yaml): a URL's content can change without a "
            "change to the program"
        )
    return None


def _data_keys(resource: Registered, sizes: Mapping[str, str]) -> Iterator[str]:
    """The data fields' keys (IsConfigMapKey) and their total size (1 MiB); ``sizes`` gives
    each field and how its values are held ("text" or "base64")."""
    total, seen = 0, set()
    for field_name, encoding in sizes.items():
        data = revealed(resource.inputs.get(field_name)) or {}
        if not isinstance(data, Mapping):
            yield f"{field_name} is not a map"
            continue
        for key, value in data.items():
            # '.' and '..' (and names starting '..') would be path segments of a mounted volume.
            if (
                not (len(key) <= SUBDOMAIN_MAX and CONFIG_KEY.fullmatch(key))
                or key.startswith("..")
                or key == "."
            ):
                yield (
                    f"{field_name}.{key}: a key holds at most 253 letters, digits, '-', '_' or "
                    "'.', and is not '.' nor starts with '..'"
                )
            if key in seen and field_name != "stringData":
                yield f"{field_name}.{key}: the key is given twice (data and binaryData)"
            seen.add(key)
            text = str(revealed(value) or "")
            try:
                total += len(base64.b64decode(text)) if encoding == "base64" else len(text.encode())
            except (binascii.Error, ValueError):
                yield f"{field_name}.{key} is not base64"
    if total > DATA_LIMIT:
        yield f"{total} bytes of data; the API takes {DATA_LIMIT} (1 MiB)"


def _config_map_data(resource: Registered, _stack: Stack) -> str | None:
    return next(_data_keys(resource, {"data": "text", "binaryData": "base64"}), None)


def _secret_data(resource: Registered, _stack: Stack) -> str | None:
    # stringData is merged into data by the API server, and validated with it.
    return next(_data_keys(resource, {"data": "base64", "stringData": "text"}), None)


def _selector_matches_template(resource: Registered, _stack: Stack) -> str | None:
    selector = dict(
        next((v for _, v in values_at(resource.inputs, "spec.selector.matchLabels")), {})
    )
    labels = dict(
        next((v for _, v in values_at(resource.inputs, "spec.template.metadata.labels")), {})
    )
    if not selector:
        return "spec.selector.matchLabels is empty: apps/v1 requires a selector"
    missing = {k: v for k, v in selector.items() if labels.get(k) != v}
    if missing:
        return f"spec.selector selects {missing}, which spec.template.metadata.labels lack"
    return None


def _lws_pods(resource: Registered, _stack: Stack) -> str | None:
    replicas = next((v for _, v in values_at(resource.inputs, "spec.replicas")), 1)
    size = next((v for _, v in values_at(resource.inputs, "spec.leaderWorkerTemplate.size")), 1)
    if int(replicas) * int(size) > INT32_MAX:
        return (
            f"spec.replicas {replicas} x spec.leaderWorkerTemplate.size {size} pods; the webhook "
            f"takes {INT32_MAX}"
        )
    return None


# The managed node groups a cluster's pods run on (EKS's; ``infra.conformance.eks``).
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
SCHEDULING = (
    "https://kubernetes.io/docs/concepts/scheduling-eviction/kube-scheduler/ (a pod runs on a "
    "node whose allocatable holds its requests beside the others'); "
    f"{scheduling.NODEADM} (kube-reserved, evictionHard); {scheduling.MAX_PODS_SOURCE}; "
    f"{scheduling.LWS_MANAGER}; {scheduling.COREDNS}; {scheduling.VPC_CNI}; {scheduling.KUBE_PROXY}"
)


def _node_groups(stack: Stack) -> list[scheduling.NodeGroup] | None:
    """The stack's node groups with their sizes; None when a group's size is one its API
    refuses (its own rules report that)."""
    groups = []
    for group in (r for r in stack.resources if r.type == NODE_GROUP):
        scaling = group.inputs.get("scalingConfig") or {}
        low, count, high = (int(scaling.get(k) or 0) for k in ("minSize", "desiredSize", "maxSize"))
        if high < 1 or not low <= count <= high:
            return None
        for _, name in values_at(group.inputs, "instanceTypes.*"):
            regions = catalog.regions_of("aws", str(name))
            found = catalog.find("aws", regions[0], str(name)) if regions else None
            if found is not None:
                groups.append(
                    scheduling.NodeGroup(found.name, found.vcpus, found.memory_bytes, count)
                )
    return groups


def _schedulable(resource: Registered, stack: Stack) -> str | None:
    """Every pod of the LeaderWorkerSet (and of the stack's Deployments) fits a node of the
    stack's node groups, each node keeping room for the kubelet and what the platform runs
    (``infra.core.scheduling``); a pod that fits nowhere stays Pending and its group never
    serves. Nothing to pack on a cluster the stack does not make."""
    groups = _node_groups(stack)
    if not groups:
        return None
    count, slots = scheduling.leaderworkerset_size(resource.inputs), scheduling.pod_slots(groups)
    if count > slots:
        return f"{count} pods, where the node groups' kubelets run {slots} at most (maxPods)"
    pods = scheduling.leaderworkerset_pods(resource.inputs)
    for other in stack.resources:
        if other.type == DEPLOYMENT_TYPE:
            pods += scheduling.deployment_pods(other.name, other.inputs)
    return next(iter(scheduling.unplaced(pods, groups)), None)


# The Pod Security Standards' Baseline and Restricted controls, as the PodSecurity admission of
# a namespace labelled pod-security.kubernetes.io/enforce: restricted applies them.
PSS = "https://kubernetes.io/docs/concepts/security/pod-security-standards/ (Kubernetes 1.33)"
PSS_ENFORCE = "pod-security.kubernetes.io/enforce"
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}  # fmt: skip
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}  # fmt: skip


def restricted_problems(spec: dict[str, Any]) -> list[str]:
    """Every control of the Pod Security Standards' Baseline and Restricted policies (PSS,
    Kubernetes 1.33) a pod spec breaks, as the PodSecurity admission of a namespace labelled
    ``pod-security.kubernetes.io/enforce: restricted`` would refuse it."""
    pod = spec.get("securityContext") or {}
    selinux = pod.get("seLinuxOptions") or {}
    checks = [
        *((spec.get(f), f"host namespaces: {f}") for f in ("hostNetwork", "hostPID", "hostIPC")),
        ((pod.get("windowsOptions") or {}).get("hostProcess"), "HostProcess"),
        (pod.get("runAsUser") == 0, "running as non-root user: the pod's runAsUser is 0"),
        ((pod.get("seccompProfile") or {}).get("type") == "Unconfined",
         "seccomp: the pod's profile is Unconfined"),
        ((pod.get("appArmorProfile") or {}).get("type") == "Unconfined",
         "AppArmor: the pod's profile is Unconfined"),
        (selinux.get("user") or selinux.get("role"), "SELinux: the pod sets a user or role"),
        *((s["name"] not in SAFE_SYSCTLS, f"sysctls: {s['name']}")
          for s in pod.get("sysctls") or []),
    ]  # fmt: skip
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        checks.append(("hostPath" in kinds, f"hostPath volume {volume['name']}"))
        checks.append((not kinds <= RESTRICTED_VOLUMES, f"volume types: {volume['name']}"))
    found = [message for broken, message in checks if broken]
    containers = [*spec.get("containers", []), *spec.get("initContainers", []),
                  *spec.get("ephemeralContainers", [])]  # fmt: skip
    for container in containers:
        found += container_problems(pod, container)
    return found


def container_problems(pod: dict[str, Any], container: dict[str, Any]) -> list[str]:
    name, sc = container["name"], container.get("securityContext") or {}
    capabilities = sc.get("capabilities") or {}
    added = set(capabilities.get("add") or [])
    non_root = sc.get("runAsNonRoot") or (
        pod.get("runAsNonRoot") and sc.get("runAsNonRoot") is not False
    )
    profile = (sc.get("seccompProfile") or pod.get("seccompProfile") or {}).get("type")
    selinux = sc.get("seLinuxOptions") or {}
    checks = [
        (sc.get("privileged"), f"privileged containers: {name}"),
        ((sc.get("windowsOptions") or {}).get("hostProcess"), f"HostProcess: {name}"),
        (not added <= BASELINE_CAPABILITIES, f"capabilities (baseline): {name} adds {added}"),
        (not added <= {"NET_BIND_SERVICE"}, f"capabilities: {name} adds beyond NET_BIND_SERVICE"),
        ("ALL" not in (capabilities.get("drop") or []), f"capabilities: {name} does not drop ALL"),
        (any(p.get("hostPort") for p in container.get("ports", [])), f"host ports: {name}"),
        (sc.get("procMount", "Default") != "Default", f"/proc mount type: {name}"),
        (sc.get("allowPrivilegeEscalation") is not False,
         f"privilege escalation: {name} does not set allowPrivilegeEscalation false"),
        (not non_root, f"running as non-root: neither {name} nor the pod sets runAsNonRoot"),
        (sc.get("runAsUser") == 0, f"running as non-root user: {name} runs as 0"),
        (profile not in ("RuntimeDefault", "Localhost"),
         f"seccomp: {name} runs with {profile or 'no'} profile"),
        ((sc.get("appArmorProfile") or {}).get("type") == "Unconfined", f"AppArmor: {name}"),
        (selinux.get("user") or selinux.get("role"), f"SELinux: {name} sets a user or role"),
    ]  # fmt: skip
    return [message for broken, message in checks if broken]


def _restricted_pods(resource: Registered, stack: Stack) -> str | None:
    """The pod templates of a workload in a namespace that enforces the restricted profile pass
    it: the API server refuses each pod that does not, and the workload never runs."""
    wanted = next((v for _, v in values_at(resource.inputs, "metadata.namespace")), None)
    enforced = any(
        other.type == NAMESPACE
        and next((v for _, v in values_at(other.inputs, "metadata.name")), None) == wanted
        and (revealed(other.inputs.get("metadata")) or {}).get("labels", {}).get(PSS_ENFORCE)
        == "restricted"
        for other in stack.resources
    )
    if not enforced:
        return None
    for path in (
        "spec.leaderWorkerTemplate.leaderTemplate.spec",
        "spec.leaderWorkerTemplate.workerTemplate.spec",
        "spec.template.spec",
    ):
        for where, spec in values_at(resource.inputs, path):
            problems = restricted_problems(spec)
            if problems:
                return f"{where}: {problems[0]} (its namespace enforces the restricted profile)"
    return None


def _metadata_forced(*more: str) -> tuple[str, ...]:
    return ("metadata.name", "metadata.namespace", *more)


def _namespaced(
    type_: str,
    name: Name,
    *rules: Rule,
    replaced_on: tuple[str, ...] = (),
) -> ResourceRules:
    """A namespaced object: its name, namespace, labels, and its place after its namespace."""
    return ResourceRules(
        type_,
        (name, namespace(), metadata_labels(), InItsNamespace(), InControllerNamespace(), *rules),
        replaced_on=_metadata_forced(*replaced_on),
        source=FORCE_NEW,
    )


def _subdomain_name(source: str) -> Name:
    return object_name(DNS1123_SUBDOMAIN, SUBDOMAIN_MAX, SUBDOMAIN_MEANING, source)


RULES = by_type(
    ResourceRules(
        PROVIDER,
        (Requires(_kubeconfig, f"{PROVIDER_DIFF} (Configure: no kubeconfig, client-go's own)"),),
        # The provider is replaced (and every object with it) when the active cluster of its
        # kubeconfig changes, when clusterIdentifier does, or the render directory: any change
        # of kubeconfig counts here, the rules cannot see which cluster it names.
        replaced_on=(
            "kubeconfig",
            "context",
            "cluster",
            "clusterIdentifier",
            "renderYamlToDirectory",
        ),
        source=f"{PROVIDER_DIFF} (DiffConfig)",
    ),
    ResourceRules(
        CONFIG_FILE,
        (Requires(_pinned_manifest, f"{PROGRAM}: the LWS controller of a pinned release ({LWS})"),),
    ),
    ResourceRules(
        NAMESPACE,
        (
            object_name(
                DNS1123_LABEL,
                LABEL_MAX,
                LABEL_MEANING,
                "kubernetes/apimachinery pkg/api/validation/generic.go "
                "(ValidateNamespaceName = NameIsDNSLabel)",
            ),
            metadata_labels(),
        ),
        replaced_on=_metadata_forced(),
        source=FORCE_NEW,
    ),
    _namespaced(
        CONFIG_MAP,
        _subdomain_name(CONFIGMAP),
        Requires(_config_map_data, f"{CONFIGMAP}; {KEY_CHECKS}"),
        replaced_on=("data", "binaryData"),
    ),
    _namespaced(
        SECRET,
        _subdomain_name("kubernetes/kubernetes ValidateSecretName (NameIsDNSSubdomain)"),
        Requires(
            _secret_data, f"https://kubernetes.io/docs/concepts/configuration/secret/; {KEY_CHECKS}"
        ),
        replaced_on=("type", "data", "stringData"),
    ),
    _namespaced(
        SERVICE_TYPE,
        # "The name of a Service object must be a valid RFC 1035 label name."
        object_name(DNS1035_LABEL, LABEL_MAX, DNS1035_MEANING, SERVICE),
        Labels("spec.selector", LABELS),
        # Nothing of the stack is public: a LoadBalancer or NodePort would open the API.
        OneOf("spec.type", ("ClusterIP",), f"{PROGRAM}: nothing public"),
        Between("spec.ports.*.port", 1, 65535, SERVICE_PORT),
        OneOf("spec.ports.*.protocol", PROTOCOLS, SERVICE_PORT),
        replaced_on=("spec.clusterIP",),
    ),
    _namespaced(
        NETWORK_POLICY_TYPE,
        _subdomain_name(
            "kubernetes/kubernetes pkg/apis/networking/validation "
            "(ValidateNetworkPolicyName: NameIsDNSSubdomain)"
        ),
        Labels("spec.podSelector.matchLabels", LABELS),
        OneOf("spec.policyTypes.*", ("Ingress", "Egress"), NETWORK_POLICY),
        OneOf("spec.ingress.*.ports.*.protocol", PROTOCOLS, NETWORK_POLICY),
        OneOf("spec.egress.*.ports.*.protocol", PROTOCOLS, NETWORK_POLICY),
    ),
    _namespaced(
        DEPLOYMENT_TYPE,
        _subdomain_name(DEPLOYMENT),
        Labels("spec.selector.matchLabels", LABELS),
        Labels("spec.template.metadata.labels", LABELS),
        # ".spec.selector must match .spec.template.metadata.labels, or it will be rejected".
        Requires(_selector_matches_template, DEPLOYMENT),
        Requires(_restricted_pods, PSS),
        # apps/v1 never changes a Deployment's selector: pulumi-kubernetes replaces it.
        replaced_on=("spec.selector",),
    ),
    # A patch of the controller's Deployment (server-side apply of the fields it gives), which
    # pulumi-kubernetes awaits as it does a Deployment: the LeaderWorkerSet waits for it.
    _namespaced(
        DEPLOYMENT_PATCH,
        _subdomain_name(f"{DEPLOYMENT}; {PATCH} (the name of the patched object is required)"),
        OneOf(
            "metadata.name",
            (pins.LWS_DEPLOYMENT,),
            f"{PROGRAM}: the stack patches the LWS controller's Deployment alone",
        ),
    ),
    _namespaced(
        LEADER_WORKER_SET,
        # Its name is its headless Service's: the webhook takes an RFC 1035 label only.
        object_name(DNS1035_LABEL, LABEL_MAX, DNS1035_MEANING, LWS_WEBHOOK),
        OneOf("apiVersion", (LWS_API_VERSION,), LWS_CRD),
        OneOf("kind", ("LeaderWorkerSet",), LWS_CRD),
        Labels("spec.leaderWorkerTemplate.leaderTemplate.metadata.labels", LABELS),
        Labels("spec.leaderWorkerTemplate.workerTemplate.metadata.labels", LABELS),
        Between("spec.replicas", 0, 1_000_000, LWS_CRD),
        Between("spec.leaderWorkerTemplate.size", 1, INT32_MAX, LWS_WEBHOOK),
        Requires(_lws_pods, f"{LWS_WEBHOOK} (replicas x size at most MaxInt32)"),
        Requires(_schedulable, SCHEDULING),
        Requires(_restricted_pods, PSS),
        OneOf(
            "spec.leaderWorkerTemplate.restartPolicy",
            ("Default", "RecreateGroupOnPodRestart", "RecreateGroupAfterStart", "None"),
            LWS_CRD,
        ),
        OneOf("spec.startupPolicy", ("LeaderCreated", "LeaderReady"), LWS_CRD),
        OneOf("spec.networkConfig.subdomainPolicy", ("Shared", "UniquePerReplica"), LWS_CRD),
        OneOf("spec.rolloutStrategy.type", ("RollingUpdate",), LWS_CRD),
        After(
            (CONFIG_FILE,),
            "a LeaderWorkerSet needs the controller's CRD and webhook first",
            CRD,
        ),
        After(
            (DEPLOYMENT_PATCH,),
            "the controller's webhook admits a LeaderWorkerSet once its pods are ready",
            f"{LWS_WEBHOOK}; {PATCH} (awaited as a Deployment)",
        ),
        # The CRD has no x-kubernetes-validations: the webhook refuses (rather than replaces) a
        # change of subGroupPolicy, and takes a new size as a rolling update. pulumi-kubernetes
        # replaces a custom object on its name and namespace only.
    ),
)
