"""``lrc k8s render``: every shipped stack as Kubernetes objects, checked as a cluster's API
server would check them without a cluster: the LeaderWorkerSet against the v0.10.0 CRD's schema
(unknown fields refused, as ``kubectl apply`` with strict field validation does), the core
objects against Kubernetes' own schemas (kubernetes-validate); the pods' flags the VMs' flags,
by running the same scripts with each one's environment; the network policies as narrow as the
VMs' firewalls."""

from __future__ import annotations

import copy
import functools
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

from infra.boot.balancer import haproxy_config
from infra.boot.node import API_KEY_CREDENTIAL, VM_PATHS
from infra.boot.render import ROLE_UNIT, UNITS_DIR
from infra.cli import k8s as cli
from infra.core.limits import METRICS_PORT
from infra.stack.files import config_of, stack_config, stack_names, stack_values
from infra.stack.kube import image, objects
from tests.conftest import REPO, SCRIPTS, free_port, require_tool

CRD = REPO / "tests" / "fixtures" / "lws-v0.10.0" / "leaderworkerset.x-k8s.io_leaderworkersets.yaml"
KUBERNETES = "1.33.0"  # EKS's, GKE's and AKS's current minor (kubernetes-validate's schemas)
NAME, NAMESPACE, IMAGE = "llama-rpc", "inference", "registry.example/llama-rpc:1"
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


@pytest.mark.parametrize("stack", stack_names())
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


@pytest.mark.parametrize("stack", stack_names())
def test_the_leader_runs_on_the_main_nodes_type_and_workers_on_theirs(stack: str) -> None:
    """aws-r8g's main node is smaller than its workers: each pod asks for its own node's type."""
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
        assert container["resources"]["requests"]["cpu"] == str(instance.vcpus - 1), part


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
        assert container["resources"]["requests"]["cpu"] == str(config.instance_type.vcpus - 1)
    # The leader fetches the model first, with the downloader the VMs run (sha256 checked).
    [fetch] = template["leaderTemplate"]["spec"]["initContainers"]
    assert fetch["command"] == [f"{VM_PATHS.bin_dir}/fetch-model.sh"]
    [env] = of_kind("aws-c8g", "ConfigMap")[:1]
    assert env["data"]["MODEL_SHA256"] == " ".join(config.model_sha256)


def test_network_policies_admit_rpc_and_metrics_from_the_groups_own_leader_only() -> None:
    config = config_of(
        {**stack_values("aws-c8g"), f"{P}replicas": 2, f"{P}apiAllowedCidrs": ["10.8.0.0/16"]}
    )
    found = objects.render(config, name=NAME, namespace=NAMESPACE, image=IMAGE)
    policies = {o["metadata"]["name"]: o["spec"] for o in found if o["kind"] == "NetworkPolicy"}
    assert set(policies) == {
        f"{NAME}-leaders",
        f"{NAME}-balancer",
        f"{NAME}-group-0-workers",
        f"{NAME}-group-1-workers",
    }
    for group in (0, 1):
        spec = policies[f"{NAME}-group-{group}-workers"]
        selected = spec["podSelector"]
        assert selected["matchLabels"][objects.GROUP_INDEX_LABEL] == str(group)
        assert selected["matchExpressions"] == [
            {"key": objects.WORKER_INDEX_LABEL, "operator": "NotIn", "values": ["0"]}
        ]
        [rule] = spec["ingress"]
        [source] = rule["from"]
        assert source == {
            "podSelector": {
                "matchLabels": {
                    objects.LWS_NAME_LABEL: NAME,
                    objects.GROUP_INDEX_LABEL: str(group),
                    objects.WORKER_INDEX_LABEL: "0",
                }
            }
        }
        assert {p["port"] for p in rule["ports"]} == {config.rpc_port, METRICS_PORT}
    leaders = policies[f"{NAME}-leaders"]
    [rule] = leaders["ingress"]
    assert [p["port"] for p in rule["ports"]] == [config.server_port]
    assert {"ipBlock": {"cidr": "10.8.0.0/16"}} in rule["from"]
    # Nothing public: the leaders' Service is the cluster's own, never a load balancer.
    [service] = [o for o in found if o["kind"] == "Service"]
    assert service["spec"]["type"] == "ClusterIP"
    assert not [o for o in found if o["kind"] == "Service" and o["spec"]["type"] != "ClusterIP"]


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
    assert "FROM --platform=linux/arm64 ubuntu:24.04" in recipe
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
    ],
)
def test_bad_input_is_a_usage_error_naming_it(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["render", "--image", IMAGE, *argv]) == 2
    assert says in capsys.readouterr().err
