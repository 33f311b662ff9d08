"""The AWS program under Pulumi mocks, for every AWS stack preset: resources, security, outputs."""

from __future__ import annotations

import base64
import gzip
import ipaddress
import json
import re
import shlex
from typing import Any

import pytest
import yaml

from infra.boot import metrics_command
from infra.boot.deliver import for_cloud
from infra.boot.patches import patches_digest
from infra.boot.render import boot_files
from infra.core import outputs, sizing
from infra.core.limits import METRICS_PORT
from infra.live.aws import SsmChannel
from infra.stack.backends.aws import api_key_policy, files_policy
from tests.pulumi_mocks import (
    API_CIDRS,
    CLOUD_STACKS,
    GENERATED_KEY,
    GIVEN_KEY,
    KMS_KEY,
    NO_FLOW_LOGS,
    NO_KEY,
    ONE_GROUP,
    REPLICAS,
    STAGED_URLS,
    Deployment,
    RecordingMocks,
    deploy,
    deployed,
    deployment,
    env_of,
    is_secret_input,
    one_node,
    overrides_of,
    parsed_config,
    ready_account,
    refused,
    revealed,
    stack_config,
    staged_model,
    tag_path,
    user_data_text,
    vm_stack_names,
)
from tests.stack.test_balancer_node import BALANCER_USD

AWS_STACKS = [s for s in vm_stack_names() if stack_config(s)["llama-rpc-cluster:cloud"] == "aws"]
AWS = CLOUD_STACKS["aws"]
# Resources that AWS cannot tag (associations and attachments).
P = "llama-rpc-cluster:"
INSTANCE = "aws:ec2/instance:Instance"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"


def test_there_are_aws_presets() -> None:
    assert {"aws-c8g", "aws-small", "aws-r8g", "aws-c7g"} <= set(AWS_STACKS)


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_instances_count_type_and_placement(stack: str) -> None:
    d = deployed(stack)
    config = stack_config(stack)
    workers = config["llama-rpc-cluster:workerCount"]
    instances = d.of_type(INSTANCE)
    assert len(instances) == workers + 1
    worker_type = config["llama-rpc-cluster:instanceType"]
    main_type = config.get("llama-rpc-cluster:mainInstanceType", worker_type)
    by_name = {r.name: r.inputs for r in instances}
    assert by_name["llama-rpc-cluster-main"]["instanceType"] == main_type
    for i in range(1, workers + 1):
        assert by_name[f"llama-rpc-cluster-worker-{i}"]["instanceType"] == worker_type
    [placement] = d.of_type("aws:ec2/placementGroup:PlacementGroup")
    assert placement.inputs["strategy"] == "cluster"
    private = d.named("llama-rpc-cluster-private")
    for inputs in by_name.values():
        assert inputs["placementGroup"] == "llama-rpc-cluster-placement"
        assert inputs["subnetId"] == "llama-rpc-cluster-private-id"
        assert inputs["ami"] == "ami-0123456789abcdef0"
    assert private.inputs["availabilityZone"] == "us-east-1a"


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_only_rpc_and_metrics_from_the_main_group_are_open(stack: str) -> None:
    """The workers admit RPC and node metrics from their own main node's group, and nothing
    else; the main node admits neither (it reads its own metrics locally)."""
    d = deployed(stack)
    ingress = d.of_type(INGRESS)  # no apiAllowedCidrs in the presets
    assert len(ingress) == 2
    for rule, port in zip(
        sorted(ingress, key=lambda r: r.inputs["fromPort"]),
        sorted((50052, METRICS_PORT)),
        strict=True,
    ):
        assert rule.inputs["securityGroupId"] == "llama-rpc-cluster-worker-sg-id"
        assert rule.inputs["referencedSecurityGroupId"] == "llama-rpc-cluster-main-sg-id"
        assert (rule.inputs["ipProtocol"], rule.inputs["fromPort"], rule.inputs["toPort"]) == (
            "tcp",
            port,
            port,
        )
        assert "cidrIpv4" not in rule.inputs and "cidrIpv6" not in rule.inputs
    for group in d.of_type("aws:ec2/securityGroup:SecurityGroup"):
        assert not group.inputs.get("ingress"), "no inline rules: every rule is its own resource"
    to_workers = set()
    for egress in d.of_type(EGRESS):
        cidr = egress.inputs.get("cidrIpv4")
        if cidr == "0.0.0.0/0":
            assert egress.inputs["fromPort"] in (80, 443)
        else:
            # The main node reaches its own workers only: RPC, and their metrics for
            # llama-rpc-metrics (infra.observe.top), nowhere else in the VPC.
            assert egress.inputs["securityGroupId"] == "llama-rpc-cluster-main-sg-id"
            assert egress.inputs["referencedSecurityGroupId"] == "llama-rpc-cluster-worker-sg-id"
            to_workers.add(egress.inputs["fromPort"])
    assert to_workers == {50052, METRICS_PORT}
    workers = [r for r in d.of_type(INSTANCE) if "worker" in r.name]
    main = d.named("llama-rpc-cluster-main")
    assert all(
        w.inputs["vpcSecurityGroupIds"] == ["llama-rpc-cluster-worker-sg-id"] for w in workers
    )
    assert main.inputs["vpcSecurityGroupIds"] == ["llama-rpc-cluster-main-sg-id"]


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_no_public_addresses_imdsv2_and_encrypted_disks(stack: str) -> None:
    d = deployed(stack)
    for subnet in d.of_type("aws:ec2/subnet:Subnet"):
        assert subnet.inputs["mapPublicIpOnLaunch"] is False
    for instance in d.of_type(INSTANCE):
        inputs = instance.inputs
        assert inputs["associatePublicIpAddress"] is False
        assert inputs["metadataOptions"]["httpTokens"] == "required"
        assert inputs["metadataOptions"]["httpPutResponseHopLimit"] == 1
        disk = inputs["rootBlockDevice"]
        assert disk["encrypted"] is True and disk["volumeType"] == "gp3"
        assert "keyName" not in inputs
        assert inputs["userDataReplaceOnChange"] is True


def test_a_watcher_can_be_granted_the_metrics_reading_alone() -> None:
    """The stack keeps `top`'s one command as an SSM document: the command the channel would send
    through AWS-RunShellScript, exactly, so ``ssm:SendCommand`` on it runs that and nothing
    else."""
    d = deployed("aws-c8g")
    [document] = d.of_type("aws:ssm/document:Document")
    assert (document.inputs["documentType"], document.inputs["documentFormat"]) == (
        "Command",
        "JSON",
    )
    content = json.loads(document.inputs["content"])
    assert content["schemaVersion"] == "2.2" and "parameters" not in content
    [step] = content["mainSteps"]
    assert step["action"] == "aws:runShellScript"
    reading = metrics_command.read_command(SsmChannel.max_output)
    assert step["inputs"]["runCommand"] == [shlex.join(reading)]
    assert d.outputs[outputs.METRICS_DOCUMENT] == document.name
    assert {"project", "stack"} <= set(document.inputs["tags"])


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_only_the_main_node_has_a_role_and_it_reads_only_what_it_needs(stack: str) -> None:
    """The main node's role: Session Manager, its API key and its boot files. A worker has
    none: its user data holds every file it has."""
    d = deployed(stack)
    for instance in d.of_type(INSTANCE):
        profile = instance.inputs.get("iamInstanceProfile")
        waits = {other.pulumi_resource_name for other in d.options_of(instance).depends_on or []}
        if instance.name.endswith("-main"):
            assert profile == "llama-rpc-cluster-main-profile"
            assert "llama-rpc-cluster-main-boot-files" in waits  # its grant, and its files
            assert "llama-rpc-cluster-main-build-llama.sh" in waits
        else:
            assert profile is None, f"{instance.name}: workers need no instance role"
            assert not waits
    [role] = d.of_type("aws:iam/role:Role")
    # No managed policy (AmazonSSMManagedInstanceCore reads every SSM parameter): the agent's
    # own actions for Session Manager and Run Command, nothing that reads data.
    assert not d.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    by_name = {p.name: p for p in d.of_type("aws:iam/rolePolicy:RolePolicy")}
    assert set(by_name) == {
        "llama-rpc-cluster-main-agent",
        "llama-rpc-cluster-main-api-key",
        "llama-rpc-cluster-main-boot-files",
    }
    agent = by_name["llama-rpc-cluster-main-agent"]
    assert agent.inputs["role"] == f"{role.name}-id"
    actions = {a for s in json.loads(agent.inputs["policy"])["Statement"] for a in s["Action"]}
    assert actions == {
        "ssm:UpdateInstanceInformation",
        *(f"ssmmessages:{verb}{kind}Channel" for verb in ("Create", "Open")
          for kind in ("Control", "Data")),
        *(
            f"ec2messages:{verb}"
            for verb in ("AcknowledgeMessage", "DeleteMessage", "FailMessage", "GetEndpoint",
                         "GetMessages", "SendReply")
        ),
    }  # fmt: skip
    assert not any(a.startswith(("ssm:Get", "ssm:Describe", "s3:", "kms:")) for a in actions)
    grant = by_name["llama-rpc-cluster-main-boot-files"]
    assert grant.inputs["role"] == f"{role.name}-id"
    path = f"arn:aws:ssm:us-east-1:123456789012:parameter/llama-rpc-cluster/{stack}/boot/main"
    assert json.loads(grant.inputs["policy"]) == files_policy(path)


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_the_boot_files_beyond_the_user_data_are_parameters_of_the_stack(stack: str) -> None:
    """A main node's user data and its parameters hold every boot file exactly once, as other
    clouds' user data holds them all; the node is told where they are. A worker's user data
    holds all of its own, the patch set included."""
    d = deployed(stack)
    config = parsed_config(stack)
    prefix = f"/llama-rpc-cluster/{stack}/boot/main/"
    parameters = {
        p.inputs["name"]: p.inputs for p in d.of_type("aws:ssm/parameter:Parameter")
        if p.inputs["name"].startswith(prefix)
    }  # fmt: skip
    stored = {f"/opt/llama-rpc/{name.removeprefix(prefix)}": v for name, v in parameters.items()}
    assert "/opt/llama-rpc/bin/build-llama.sh" in stored
    assert any("/patches/" in path for path in stored)
    for instance, node in zip(
        sorted(d.of_type(INSTANCE), key=lambda i: ipaddress.ip_address(i.inputs["privateIp"])),
        sorted(config.boots(), key=lambda b: ipaddress.ip_address(b.node_ip)),
        strict=True,
    ):
        text = user_data_text(instance.inputs)
        in_user_data = {f["path"]: f for f in yaml.safe_load(text)["write_files"]}
        env = env_of(text)
        assert env["LLAMA_CPP_PATCHES"] == patches_digest(node.llama_cpp_commit)
        everything = boot_files(for_cloud(node, "aws", "us-east-1", prefix[:-1]))
        if node.role == "worker":
            assert "LLAMA_RPC_FILES_SOURCE" not in env
            assert all(in_user_data[f["path"]] == f for f in everything)
            assert any("/patches/" in f["path"] for f in everything)
            continue
        assert env["LLAMA_RPC_FILES_SOURCE"] == f"aws-ssm:us-east-1:{prefix[:-1]}"
        assert "/opt/llama-rpc/bin/node-boot.sh" in in_user_data
        assert not set(stored) & set(in_user_data)
        for file in everything:
            if file["path"] in in_user_data:
                assert in_user_data[file["path"]]["content"] == file["content"]
                continue
            inputs = stored.pop(file["path"])
            packed = revealed(inputs["value"])  # the provider keeps every value a secret
            mode, _, value = packed.partition(" ")
            assert mode == file["permissions"]
            assert gzip.decompress(base64.b64decode(value)).decode() == file["content"]
            assert inputs["type"] == "String"
            assert inputs["tier"] == ("Standard" if len(packed) <= 4096 else "Advanced")
    assert not stored  # every parameter is a file a main node has


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_the_api_key_is_a_secret_the_main_node_alone_reads(stack: str) -> None:
    """A generated key, kept as an SSM SecureString; the main role may get that parameter and
    nothing else of SSM; the node is told where it is, never what it is; the output is a
    secret."""
    d = deployed(stack)
    [parameter] = [
        p for p in d.of_type("aws:ssm/parameter:Parameter") if p.name.endswith("-api-key")
    ]
    assert parameter.inputs["type"] == "SecureString"
    assert parameter.inputs["name"] == f"/llama-rpc-cluster/{stack}/api-key"
    assert is_secret_input(parameter.inputs["value"])  # encrypted in the state as well
    key = revealed(parameter.inputs["value"])
    assert len(key) == 48 and key.isalnum() and key.startswith(GENERATED_KEY[:10])
    [policy] = [
        p for p in d.of_type("aws:iam/rolePolicy:RolePolicy") if p.name.endswith("-api-key")
    ]
    arn = f"arn:aws:ssm:us-east-1:123456789012:parameter/llama-rpc-cluster/{stack}/api-key"
    assert json.loads(policy.inputs["policy"]) == api_key_policy(arn)
    assert policy.inputs["role"] == "llama-rpc-cluster-main-role-id"
    for instance in d.of_type(INSTANCE):
        text = user_data_text(instance.inputs)
        assert key not in text
        env = env_of(text)
        if instance.name.endswith("-main"):
            assert env["API_KEY_SOURCE"] == f"aws-ssm:us-east-1:/llama-rpc-cluster/{stack}/api-key"
            assert env["API_KEY_FILE"] == "/run/credstore/llama-rpc-api-key"
        else:
            assert "API_KEY_SOURCE" not in env and "API_KEY_FILE" not in env
    assert d.outputs[outputs.API_KEY] == key
    assert outputs.API_KEY in d.secret_outputs


def test_a_given_key_is_kept_a_plain_one_refused_and_none_keeps_none() -> None:
    given = deployment(AWS, **GIVEN_KEY)
    [parameter] = [
        p for p in given.of_type("aws:ssm/parameter:Parameter") if p.name.endswith("-api-key")
    ]
    secret = GIVEN_KEY["apiKey"]
    assert revealed(parameter.inputs["value"]) == secret
    assert not given.of_type("random:index/randomPassword:RandomPassword")
    with pytest.raises(Exception, match="--secret apiKey") as plain:
        deploy("aws-small", {"llama-rpc-cluster:apiKey": secret}, secret_keys=[])
    assert secret not in str(plain.value)
    none = deployment(AWS, **NO_KEY)
    assert not [
        p for p in none.of_type("aws:ssm/parameter:Parameter") if p.name.endswith("-api-key")
    ]
    assert none.outputs[outputs.API_KEY] is None
    main = env_of(user_data_text(none.named("llama-rpc-cluster-main").inputs))
    assert "API_KEY_FILE" not in main


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_default_group_and_acl_are_locked_down_and_flow_logs_kept(stack: str) -> None:
    d = deployed(stack)
    [default_sg] = d.of_type("aws:ec2/defaultSecurityGroup:DefaultSecurityGroup")
    assert not default_sg.inputs.get("ingress") and not default_sg.inputs.get("egress")
    [acl] = d.of_type("aws:ec2/defaultNetworkAcl:DefaultNetworkAcl")
    assert len(acl.inputs["subnetIds"]) == 2
    ingress = sorted(acl.inputs["ingress"], key=lambda r: r["ruleNo"])
    denied = {(r["fromPort"], r["cidrBlock"]) for r in ingress if r["action"] == "deny"}
    assert denied == {(22, "0.0.0.0/0"), (3389, "0.0.0.0/0")}
    assert all(r["ruleNo"] < ingress[-1]["ruleNo"] for r in ingress if r["action"] == "deny")
    [flow] = d.of_type("aws:ec2/flowLog:FlowLog")
    assert flow.inputs["trafficType"] == "ALL"
    assert flow.inputs["logDestinationType"] == "s3"
    [block] = d.of_type("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")
    assert all(
        block.inputs[k] is True
        for k in (
            "blockPublicAcls",
            "blockPublicPolicy",
            "ignorePublicAcls",
            "restrictPublicBuckets",
        )
    )


def test_flow_logs_may_be_turned_off() -> None:
    off = deployment(AWS, **NO_FLOW_LOGS)
    assert not off.of_type("aws:ec2/flowLog:FlowLog") and not off.of_type("aws:s3/bucket:Bucket")


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_a_node_is_replaced_delete_first_when_its_boot_data_changes(stack: str) -> None:
    """Nodes hold fixed private addresses: create-before-delete would ask for an address still
    in use (InvalidIPAddress.InUse)."""
    d = deployed(stack)
    for instance in d.of_type(INSTANCE):
        options = d.options_of(instance)
        assert options.delete_before_replace is True
        assert instance.inputs["userDataReplaceOnChange"] is True
        # A new "current" Ubuntu AMI in SSM replaces no running node.
        assert options.ignore_changes == ["ami"]


def test_a_pinned_image_is_canonicals_arm64_ami_of_that_name_and_changing_it_replaces() -> None:
    mocks = RecordingMocks()
    name = "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-arm64-server-20251001"
    d = deploy("aws-small", {"llama-rpc-cluster:image": name}, mocks=mocks)
    for instance in d.of_type(INSTANCE):
        assert instance.inputs["ami"] == "ami-0fedcba9876543210"
        assert not d.options_of(instance).ignore_changes
    assert not [c for c in mocks.calls if c.token == "aws:ssm/getParameter:getParameter"]
    [lookup] = [c for c in mocks.calls if c.token == "aws:ec2/getAmi:getAmi"]
    assert lookup.args["owners"] == ["099720109477"]  # Canonical's, and no one else's
    assert lookup.args["filters"] == [
        {"name": "name", "values": [name]},
        {"name": "architecture", "values": ["arm64"]},
    ]


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_main_disk_is_sized_for_the_model_and_loads_fast(stack: str) -> None:
    """The model has a volume of its own (CreateVolume takes twice a launch volume's
    throughput), in the node's zone, attached to the main node alone, whose boot mounts it."""
    d = deployed(stack)
    config = stack_config(stack)
    parsed = parsed_config(stack)
    model_gb = config["llama-rpc-cluster:model"]["sizeGb"]
    main = d.named("llama-rpc-cluster-main")
    (volume,) = d.of_type("aws:ebs/volume:Volume")
    (attachment,) = d.of_type("aws:ec2/volumeAttachment:VolumeAttachment")
    model = volume.inputs
    assert model["size"] >= model_gb * 1.1 and model["type"] == "gp3" and model["encrypted"]
    expected = config.get(
        "llama-rpc-cluster:diskThroughputMibps",
        sizing.main_disk_throughput_mibps(
            "aws", parsed.model.size_bytes, parsed.main_instance_type
        ),
    )
    assert model["throughput"] == expected == parsed.disk_throughput_mibps
    assert model["iops"] >= max(3000, expected * 4)
    subnet = d.named("llama-rpc-cluster-private").inputs
    assert model["availabilityZone"] == subnet["availabilityZone"]
    assert attachment.inputs["instanceId"] == f"{main.name}-id"
    assert attachment.inputs["volumeId"] == f"{volume.name}-id"
    # Detached from a stopped node (its file system is mounted), before a replacement attaches.
    assert attachment.inputs["stopInstanceBeforeDetaching"] is True
    assert d.options_of(attachment).delete_before_replace
    env = env_of(user_data_text(main.inputs))
    assert env["MODEL_DISK_GB"] == str(int(model["size"]))
    assert env["MODEL_DISK_MODEL"] == "Amazon Elastic Block Store"
    # Its root holds the system and the build, at gp3's baseline, as a worker's does.
    root = main.inputs["rootBlockDevice"]
    assert root["volumeSize"] == sizing.WORKER_DISK_GB and root["throughput"] == 125
    # A worker keeps no tensor cache: its disk holds the OS and the build, whatever the model.
    expected_worker = config.get("llama-rpc-cluster:workerDiskGb", sizing.WORKER_DISK_GB)
    for share in parsed.placement.shares[1:]:
        worker = d.named(f"llama-rpc-cluster-{share.node}").inputs
        assert worker["rootBlockDevice"]["volumeSize"] == expected_worker
        assert "MODEL_DISK_GB" not in env_of(user_data_text(worker))


def test_a_model_the_main_node_cannot_hold_gets_the_disk_speed_the_node_can_use() -> None:
    """It is written to the disk and read back as it loads: 2,000 MiB/s on a c8g.16xlarge
    (2,500 MB/s to EBS); a model in memory, or a setting, keeps the 1,000 default or the
    setting; a type whose EBS bandwidth is below the default keeps the default."""
    big = parsed_config("aws-c8g")
    assert not sizing.fits_memory(big.model.size_bytes, big.main_instance_type)
    assert big.disk_throughput_mibps == 2000
    small = parsed_config("aws-small", {f"{P}diskThroughputMibps": None})
    assert sizing.fits_memory(small.model.size_bytes, small.main_instance_type)
    assert small.disk_throughput_mibps == sizing.DEFAULT_DISK_THROUGHPUT_MIBPS
    given = parsed_config("aws-c8g", {f"{P}diskThroughputMibps": 1500})
    assert given.disk_throughput_mibps == 1500
    volume = deploy("aws-c8g", {f"{P}diskThroughputMibps": 1500}).of_type("aws:ebs/volume:Volume")
    assert [v.inputs["throughput"] for v in volume] == [1500]
    small_nodes = {f"{P}instanceType": "c8g.8xlarge", f"{P}workerCount": 5}
    c8g_8x = parsed_config("aws-c8g", small_nodes)
    assert not sizing.fits_memory(c8g_8x.model.size_bytes, c8g_8x.main_instance_type)
    # 1,250 MB/s to EBS: 1,192 MiB/s, all it can read.
    assert c8g_8x.disk_throughput_mibps == 1192


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_every_taggable_resource_carries_the_stack_tags(stack: str) -> None:
    d = deployed(stack)
    for resource in d.resources:
        if tag_path(resource.typ) != "tags":  # the types AWS tags (its rules say which)
            continue
        tags = resource.inputs.get("tags")
        assert tags, f"{resource.typ} {resource.name} has no tags"
        assert tags["project"] == "llama-rpc-cluster"
        assert tags["stack"] == stack
        assert tags["role"] in ("network", "main", "worker")


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_user_data_wires_workers_and_main(stack: str) -> None:
    d = deployed(stack)
    config = stack_config(stack)
    main = d.named("llama-rpc-cluster-main").inputs
    worker_ips = []
    for i in range(1, config["llama-rpc-cluster:workerCount"] + 1):
        worker = d.named(f"llama-rpc-cluster-worker-{i}").inputs
        env = env_of(user_data_text(worker))
        assert env["LLAMA_ROLE"] == "worker"
        assert env["LLAMA_NODE_IP"] == worker["privateIp"] == f"10.42.0.{10 + i}"
        assert env["RPC_ALLOWED_SOURCES"] == f"{main['privateIp']}/32"
        worker_ips.append(worker["privateIp"])
    env = env_of(user_data_text(main))
    assert main["privateIp"] == env["LLAMA_NODE_IP"] == "10.42.0.10"
    assert env["RPC_WORKERS"] == ",".join(f"{ip}:50052" for ip in worker_ips)
    model = config["llama-rpc-cluster:model"]
    assert env["MODEL_URLS"].split() == model["urls"]
    assert env["MODEL_SHA256"].split() == model.get("sha256", [])


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_outputs_follow_the_contract(stack: str) -> None:
    d = deployed(stack)
    out = d.outputs
    assert set(outputs.ALL_KEYS) <= set(out)
    config = stack_config(stack)
    assert out[outputs.CLOUD] == "aws" and out[outputs.REGION] == "us-east-1"
    assert out[outputs.WORKER_COUNT] == config["llama-rpc-cluster:workerCount"]
    assert out[outputs.RPC_SERVERS] == ",".join(
        f"{ip}:50052" for ip in out[outputs.WORKER_PRIVATE_IPS]
    )
    assert out[outputs.LLAMA_SERVER_URL] == f"http://{out[outputs.MAIN_PRIVATE_IP]}:8080"
    assert out[outputs.MAIN_INSTANCE_ID] == "llama-rpc-cluster-main-id"
    assert out[outputs.WORKER_INSTANCE_IDS] == [
        f"llama-rpc-cluster-worker-{i}-id" for i in range(1, out[outputs.WORKER_COUNT] + 1)
    ]
    command = shlex.split(out[outputs.CONNECT_COMMAND])
    main_ip, port = out[outputs.MAIN_PRIVATE_IP], "8080"
    assert command[:3] == ["aws", "ssm", "start-session"]
    options = dict(zip(command[3::2], command[4::2], strict=True))
    assert options == {
        "--region": "us-east-1",
        "--target": "llama-rpc-cluster-main-id",
        # Forwards to the main node's private address, where llama-server listens (the plain
        # AWS-StartPortForwardingSession would reach the instance's loopback).
        "--document-name": "AWS-StartPortForwardingSessionToRemoteHost",
        "--parameters": options["--parameters"],
    }
    assert json.loads(options["--parameters"]) == {
        "host": [main_ip],
        "portNumber": [port],
        "localPortNumber": [port],
    }
    assert out[outputs.LLAMA_CPP_COMMIT] == "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
    assert out[outputs.HOURLY_COST_USD] > 0
    # Stopped: the NAT gateway, its address and the disks go on.
    cost = parsed_config(stack).hourly_cost
    assert out[outputs.STOPPED_HOURLY_COST_USD] == cost.stopped
    assert 0 < cost.stopped == round((cost.nat or 0) + (cost.disks or 0), 5) < cost.total
    main = parsed_config(stack).main_instance_type
    assert (
        f"{main.price_source}, {main.price_date}" in out[outputs.HOURLY_COST_BASIS]
    )  # dated prices


def test_a_smaller_main_node_costs_less() -> None:
    assert (
        deployed("aws-r8g").outputs[outputs.HOURLY_COST_USD]
        < deployed("aws-c8g").outputs[outputs.HOURLY_COST_USD]
    )


def test_zone_is_one_that_offers_every_type() -> None:
    unavailable = {"us-east-1a": {"r8g.8xlarge"}, "us-east-1b": {"r8g.4xlarge"}}
    d = deploy("aws-r8g", account=lambda needs: ready_account(needs, unavailable))
    assert d.named("llama-rpc-cluster-private").inputs["availabilityZone"] == "us-east-1c"


def test_api_cidrs_open_only_the_server_port() -> None:
    d = deployment(AWS, **API_CIDRS)
    api = [
        r
        for r in d.of_type(INGRESS)
        if r.inputs["securityGroupId"] == "llama-rpc-cluster-main-sg-id"
        and r.inputs["fromPort"] != METRICS_PORT
    ]
    assert [(r.inputs["cidrIpv4"], r.inputs["fromPort"], r.inputs["toPort"]) for r in api] == [
        (cidr, 8080, 8080) for cidr in API_CIDRS["apiAllowedCidrs"]
    ]


def test_s3_models_get_a_gateway_endpoint() -> None:
    url = "https://my-models.s3.us-east-1.amazonaws.com/qwen.gguf"
    model = {**stack_config("aws-small")["llama-rpc-cluster:model"], "urls": [url], "sha256": []}
    d = deploy("aws-small", {"llama-rpc-cluster:model": model})
    [endpoint] = d.of_type("aws:ec2/vpcEndpoint:VpcEndpoint")
    assert endpoint.inputs["serviceName"] == "com.amazonaws.us-east-1.s3"
    assert endpoint.inputs["vpcEndpointType"] == "Gateway"
    assert not deployed("aws-small").of_type("aws:ec2/vpcEndpoint:VpcEndpoint")


def test_a_staged_model_is_read_with_the_main_nodes_role_over_the_gateway_endpoint() -> None:
    urls = STAGED_URLS["aws"]
    assert urls == ["s3://my-models/llama/part-1.gguf", "s3://my-models/llama/part-2.gguf"]
    d = deployment(AWS, **staged_model("aws"))
    [endpoint] = d.of_type("aws:ec2/vpcEndpoint:VpcEndpoint")
    assert endpoint.inputs["vpcEndpointType"] == "Gateway"
    [read] = [p for p in d.of_type("aws:iam/rolePolicy:RolePolicy") if "model-read" in p.name]
    statements = json.loads(read.inputs["policy"])["Statement"]
    assert statements[0] == {
        "Effect": "Allow",
        "Action": "s3:GetObject",
        "Resource": [f"arn:aws:s3:::my-models/llama/part-{i}.gguf" for i in (1, 2)],
    }
    assert statements[1]["Action"] == "s3:ListBucket"
    assert statements[1]["Resource"] == "arn:aws:s3:::my-models"
    # The parts' directory, which rclone lists before it reads; each part as a directory,
    # which it lists when the part is missing.
    assert statements[1]["Condition"]["StringEquals"]["s3:prefix"] == [
        "llama/", "llama/part-1.gguf/", "llama/part-2.gguf/",
    ]  # fmt: skip
    assert len(statements) == 2  # nothing else, in any bucket
    main = d.named("llama-rpc-cluster-main").inputs
    env = env_of(user_data_text(main))
    assert env["MODEL_URLS"] == " ".join(urls) and env["MODEL_STORE_REGION"] == "us-east-1"
    assert "rclone" in yaml.safe_load(user_data_text(main))["packages"]
    assert not [
        p for p in deployed(AWS).of_type("aws:iam/rolePolicy:RolePolicy") if "model-read" in p.name
    ]


def test_a_staged_model_in_an_sse_kms_bucket_may_be_decrypted_through_s3_only() -> None:
    key = KMS_KEY
    d = deployment(AWS, **staged_model("aws"), modelStoreKmsKey=key)
    [read] = [p for p in d.of_type("aws:iam/rolePolicy:RolePolicy") if "model-read" in p.name]
    *_, decrypt = json.loads(read.inputs["policy"])["Statement"]
    assert decrypt == {
        "Effect": "Allow",
        "Action": "kms:Decrypt",
        "Resource": key,
        "Condition": {"StringEquals": {"kms:ViaService": "s3.us-east-1.amazonaws.com"}},
    }


def test_a_model_that_does_not_fit_names_the_fix() -> None:
    text = refused("aws-c8g", {f"{P}instanceType": "c8g.8xlarge"}, "workerCount")
    assert re.search(
        r"does not fit: with 2 workers the (main|worker-\d) node \(c8g.8xlarge\) would hold "
        r"4\d layers and need [\d.]+ GiB .* but has 58.8 GiB usable",
        text,
    )
    # 5 nodes of 64 GiB hold the 229 GiB of weights and KV cache; 4 do not.
    assert "raise workerCount to 4" in text


def test_a_model_too_big_for_one_node_needs_workers() -> None:
    text = refused("aws-c8g", {f"{P}workerCount": 0}, "workerCount")
    assert "the main node (c8g.16xlarge) would hold 126 layers" in text
    assert "raise workerCount to 1" in text


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_the_main_node_is_told_where_every_layer_goes(stack: str) -> None:
    """--n-gpu-layers and --tensor-split from the stack's placement: the main node holds layers
    too, and each worker its share (the last also the output head)."""
    config = parsed_config(stack)
    layout = config.placement
    assert layout.fits and layout.layers[0] > 0
    env = env_of(user_data_text(deployed(stack).named("llama-rpc-cluster-main").inputs))
    split = [int(n) for n in env["LLAMA_TENSOR_SPLIT"].split(",")]
    assert split[:-1] == list(layout.layers[1:-1]) and split[-1] == layout.layers[-1] + 1
    assert int(env["LLAMA_GPU_LAYERS"]) == sum(split) == config.model.layers + 1 - layout.layers[0]
    assert (env["CONTEXT_SIZE"], env["SLOTS"]) == (str(config.context_size), "1")


def test_slots_multiply_the_kv_cache_the_fit_check_counts() -> None:
    """Each slot holds contextSize tokens of KV cache on every node: enough slots no longer fit."""
    fits = parsed_config("aws-c8g", {"llama-rpc-cluster:slots": 4})
    assert fits.slots == 4
    one_slot = parsed_config("aws-c8g").placement.shares
    for one, four in zip(one_slot, fits.placement.shares, strict=True):
        assert four.kv_bytes == 4 * one.kv_bytes * four.layers // max(one.layers, 1)
    too_many = refused("aws-c8g", {f"{P}slots": 40}, "workerCount")
    assert "KV cache for contextSize 4096 x 40 slots" in too_many
    env = env_of(user_data_text(deployment(AWS, **ONE_GROUP).named(
        "llama-rpc-cluster-main").inputs))  # fmt: skip
    assert env["SLOTS"] == str(ONE_GROUP["slots"]) == "2"


def test_a_context_longer_than_the_model_supports_is_refused() -> None:
    overrides = {f"{P}model": {"preset": "llama-3.1-8b-q4_0", "urls": ["https://x.org/m.gguf"]},
                 f"{P}contextSize": 200000}  # fmt: skip
    text = refused("aws-small", overrides, "contextSize")
    assert "200000 tokens is more than llama-3.1-8b-q4_0 supports (131072)" in text


def test_a_model_that_fits_one_node_runs_without_workers() -> None:
    d = deployment(AWS, **one_node())
    instances = d.of_type("aws:ec2/instance:Instance")
    assert [i.name for i in instances] == ["llama-rpc-cluster-main"]
    assert d.outputs[outputs.WORKER_PRIVATE_IPS] == []
    assert d.outputs[outputs.RPC_SERVERS] == ""
    env = env_of(user_data_text(instances[0].inputs))
    assert env["RPC_WORKERS"] == ""
    # The RPC port stays closed to everything but the main node's group, as with workers.
    rpc = [
        r
        for r in d.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
        if r.inputs.get("fromPort") == 50052
    ]
    assert rpc and all("cidrIpv4" not in r.inputs for r in rpc)


@pytest.mark.parametrize(
    ("key", "model", "says"),
    [
        ("model.urls", {"sizeGb": 1, "kvBytesPerToken": 1}, "no model URL"),
        (
            "model.urls",
            {"urls": ["ftp://x/m.gguf"], "sizeGb": 1, "kvBytesPerToken": 1},
            "is not an http(s) URL",
        ),
        (
            "model.sizeGb",
            {"urls": ["https://x.example/m.gguf"], "kvBytesPerToken": 1},
            "model's size",
        ),
        (
            "model.layers",
            {"urls": ["https://x.example/m.gguf"], "sizeGb": 1, "kvBytesPerToken": 1},
            "give the model's number of layers",
        ),
        (
            "model.preset",
            {"urls": ["https://x.example/m.gguf"], "preset": "llama-9"},
            "unknown preset",
        ),
        (
            "model.sha256",
            {"urls": ["https://x.example/m.gguf"], "preset": "llama-3.1-8b-q4_0", "sha256": ["ab"]},
            "'ab' is not a 64-character lowercase hex sha256",
        ),
    ],
)
def test_bad_models_are_refused_naming_the_field(key: str, model: dict, says: str) -> None:
    assert says in refused("aws-small", {f"{P}model": model}, key)


@pytest.mark.parametrize("node", ["main", "worker-1"])
def test_reference_user_data_passes_cloud_init_schema(node: str, tmp_path) -> None:
    from tests.conftest import assert_valid_cloud_config

    inputs = deployed("aws-c8g").named(f"llama-rpc-cluster-{node}").inputs
    assert_valid_cloud_config(user_data_text(inputs), tmp_path)


def test_a_private_mirror_on_another_port_is_reachable_from_the_main_node_only() -> None:
    """Another port is for a mirror at a private address only, and opens that address and
    port alone (an internet host on any port would open the main node's egress to all)."""
    model = {
        **stack_config("aws-small")["llama-rpc-cluster:model"],
        "urls": ["https://10.8.0.5:8443/qwen.gguf"],
    }
    d = deploy("aws-small", {"llama-rpc-cluster:model": model})
    extra = [r for r in d.of_type(EGRESS) if r.inputs["fromPort"] == 8443]
    assert [(r.inputs["securityGroupId"], r.inputs["cidrIpv4"]) for r in extra] == [
        ("llama-rpc-cluster-main-sg-id", "10.8.0.5/32")
    ]
    assert not [r for r in deployed("aws-small").of_type(EGRESS) if r.inputs["fromPort"] == 8443]
    internet = {**model, "urls": ["https://models.example.com:8443/qwen.gguf"]}
    assert "port 8443" in refused("aws-small", {"llama-rpc-cluster:model": internet}, "model.urls")


# Replicas: serving groups behind a balancer node (HAProxy).
BALANCER = "llama-rpc-cluster-balancer"


def replicated(**settings: Any) -> Deployment:
    """The preset with two serving groups behind the balancer node (and settings)."""
    return deployment(AWS, **REPLICAS, **settings)


def replicas_config() -> Any:
    return parsed_config(AWS, overrides_of(REPLICAS))


def test_one_group_has_no_balancer_and_keeps_its_names() -> None:
    d = deployed(AWS)
    assert BALANCER not in {r.name for r in d.of_type(INSTANCE)}
    assert not [r for r in d.resources if r.typ.startswith("aws:lb/")]
    assert d.outputs[outputs.REPLICAS] == 1
    assert d.outputs[outputs.BALANCER_URL] is None
    [group] = d.outputs[outputs.GROUPS]
    assert {k: group[k] for k in outputs.GROUP_KEYS} == {
        k: d.outputs[k] for k in outputs.GROUP_KEYS
    }
    names = {r.name for r in d.resources}
    assert {
        "llama-rpc-cluster-main",
        "llama-rpc-cluster-main-sg",
        "llama-rpc-cluster-worker-sg",
        "llama-rpc-cluster-placement",
        "llama-rpc-cluster-worker-rpc-from-main",
    } <= names
    assert not any("replica" in name for name in names)


def test_replicas_are_groups_at_their_own_addresses_each_with_its_placement() -> None:
    d = replicated()
    config = replicas_config()
    workers = config.worker_count
    instances = {r.name: r.inputs for r in d.of_type(INSTANCE) if r.name != BALANCER}
    assert len(instances) == 2 * (workers + 1)
    for group, prefix in ((0, ""), (1, "replica2-")):
        main_ip, *worker_ips = config.group_ips(group)
        main = instances[f"llama-rpc-cluster-{prefix}main"]
        assert main["privateIp"] == main_ip
        assert main["placementGroup"] == f"llama-rpc-cluster-{prefix}placement"
        assert main["vpcSecurityGroupIds"] == [f"llama-rpc-cluster-{prefix}main-sg-id"]
        env = env_of(user_data_text(main))
        assert env["RPC_WORKERS"] == ",".join(f"{ip}:50052" for ip in worker_ips)
        # HAProxy connects to the main node's own address: llama-server listens there.
        assert "SERVER_LISTEN" not in env
        for i, ip in enumerate(worker_ips, start=1):
            worker = instances[f"llama-rpc-cluster-{prefix}worker-{i}"]
            assert worker["privateIp"] == ip
            assert worker["vpcSecurityGroupIds"] == [f"llama-rpc-cluster-{prefix}worker-sg-id"]
            assert env_of(user_data_text(worker))["RPC_ALLOWED_SOURCES"] == f"{main_ip}/32"
    assert config.group_ips(1)[0].endswith(".30")
    assert len(d.of_type("aws:ec2/placementGroup:PlacementGroup")) == 2


def test_each_groups_workers_take_rpc_from_their_own_main_only() -> None:
    d = replicated()
    rpc = [r for r in d.of_type(INGRESS) if r.inputs["fromPort"] == 50052]
    assert {(r.inputs["securityGroupId"], r.inputs["referencedSecurityGroupId"]) for r in rpc} == {
        ("llama-rpc-cluster-worker-sg-id", "llama-rpc-cluster-main-sg-id"),
        ("llama-rpc-cluster-replica2-worker-sg-id", "llama-rpc-cluster-replica2-main-sg-id"),
    }
    assert all("cidrIpv4" not in r.inputs for r in rpc)


def test_the_balancer_node_is_private_in_its_own_security_group() -> None:
    """The balancer node on AWS: in the private subnet, its own security group, no public
    address, no role, IMDSv2, an encrypted root. Its HAProxy, size and price, as on every
    cloud: tests/stack/test_balancer_node.py."""
    d = replicated()
    config = replicas_config()
    [node] = [r for r in d.of_type(INSTANCE) if r.name == BALANCER]
    inputs = node.inputs
    assert inputs["privateIp"] == config.balancer_boot.listen_ip
    assert inputs["subnetId"] == "llama-rpc-cluster-private-id"
    assert inputs["associatePublicIpAddress"] is False and "iamInstanceProfile" not in inputs
    assert inputs["vpcSecurityGroupIds"] == ["llama-rpc-cluster-balancer-sg-id"]
    assert inputs["metadataOptions"]["httpTokens"] == "required"
    assert inputs["rootBlockDevice"]["encrypted"] is True
    # A slot's whole context, two streams at once, at the predicted speed: minutes, not hours.
    timeout = config.generation_timeout_seconds
    assert 60 < timeout < 4 * 3600, timeout
    # The outputs: tests/stack/test_replica_outputs.py, for every cloud.


def test_the_balancer_is_reached_only_by_main_nodes_and_api_cidrs() -> None:
    d = replicated(**API_CIDRS)
    balancer_sg = "llama-rpc-cluster-balancer-sg-id"
    into = [r for r in d.of_type(INGRESS) if r.inputs["securityGroupId"] == balancer_sg]
    # The tunnel's main node (the first group's) and apiAllowedCidrs; no other main node.
    assert {r.inputs.get("referencedSecurityGroupId") or r.inputs["cidrIpv4"] for r in into} == {
        "llama-rpc-cluster-main-sg-id",
        *API_CIDRS["apiAllowedCidrs"],
    }
    assert all(r.inputs["fromPort"] == r.inputs["toPort"] == 8080 for r in into)
    out = [r for r in d.of_type(EGRESS) if r.inputs["securityGroupId"] == balancer_sg]
    # The main nodes; and its package through the NAT gateway, as every node's.
    assert {r.inputs.get("referencedSecurityGroupId") or r.inputs["cidrIpv4"] for r in out} == {
        "llama-rpc-cluster-main-sg-id",
        "llama-rpc-cluster-replica2-main-sg-id",
        "0.0.0.0/0",
    }
    internet = [r for r in out if r.inputs.get("cidrIpv4") == "0.0.0.0/0"]
    assert sorted(r.inputs["fromPort"] for r in internet) == [80, 443]
    # Each main node admits the balancer on the API port, and nothing else new.
    for prefix in ("", "replica2-"):
        from_balancer = [
            r
            for r in d.of_type(INGRESS)
            if r.inputs["securityGroupId"] == f"llama-rpc-cluster-{prefix}main-sg-id"
            and r.inputs.get("referencedSecurityGroupId") == balancer_sg
        ]
        assert [(r.inputs["fromPort"], r.inputs["toPort"]) for r in from_balancer] == [(8080, 8080)]
    # Nothing anywhere opens the RPC or metrics port to a range wider than the VPC.
    vpc = str(replicas_config().vpc_cidr)
    for r in d.of_type(INGRESS):
        if r.inputs["fromPort"] in (50052, METRICS_PORT):
            assert r.inputs.get("cidrIpv4") in (None, vpc)


def test_connect_command_forwards_to_the_balancer_through_the_first_main() -> None:
    d = replicated()
    config = replicas_config()
    argv = shlex.split(d.outputs[outputs.CONNECT_COMMAND])
    assert argv[argv.index("--target") + 1] == "llama-rpc-cluster-main-id"
    parameters = json.loads(argv[argv.index("--parameters") + 1])
    assert parameters["host"] == [config.balancer_boot.listen_ip]
    assert parameters["portNumber"] == parameters["localPortNumber"] == ["8080"]
    # The first main node may open the tunnel's connection to the balancer.
    to_balancer = [
        r
        for r in d.of_type(EGRESS)
        if r.inputs["securityGroupId"] == "llama-rpc-cluster-main-sg-id"
        and r.inputs.get("referencedSecurityGroupId") == "llama-rpc-cluster-balancer-sg-id"
    ]
    assert len(to_balancer) == 1


def test_replicas_cost_every_group_and_the_balancer() -> None:
    one = parsed_config(AWS).hourly_cost
    two = parsed_config(AWS, {f"{P}replicas": 2}).hourly_cost
    assert one.balancer is None and two.balancer is not None and two.balancer > 0
    assert two.instances == pytest.approx(2 * one.instances)
    assert two.disks == pytest.approx(2 * one.disks, abs=1e-5)  # each rounded to 5 places
    assert two.nat == one.nat  # one NAT gateway for the whole network
    # Two groups cost twice one, the NAT gateway once, and the balancer node on top.
    assert two.total == pytest.approx(2 * one.total - one.nat + two.balancer, abs=1e-5)
    assert "balancer $" in two.basis
    # The balancer node's instance and its system disk, at the fixture catalog's prices.
    assert two.balancer == pytest.approx(BALANCER_USD["aws"], abs=1e-5)
    assert any(source.startswith("balancer node: ") for source in two.sources)


@pytest.mark.parametrize("replicas", [0, 11, "two"])
def test_replicas_out_of_range_are_refused(replicas) -> None:
    text = refused("aws-small", {f"{P}replicas": replicas}, "replicas")
    assert "replicas" in text


def test_adding_replicas_leaves_the_first_groups_nodes_as_they_are() -> None:
    one = {r.name: r.inputs for r in deployment(AWS, **ONE_GROUP).of_type(INSTANCE)}
    two = {r.name: r.inputs for r in replicated().of_type(INSTANCE)}
    assert one and all(two[name] == inputs for name, inputs in one.items())


def test_a_main_node_whose_memory_holds_the_model_lets_its_download_run_ahead_of_the_disk() -> None:
    seen = set()
    for stack in AWS_STACKS:
        config = parsed_config(stack)
        main = env_of(user_data_text(deployed(stack).named("llama-rpc-cluster-main").inputs))
        fits = sizing.fits_memory(config.model.size_bytes, config.main_instance_type)
        assert main.get("WRITEBACK_BYTES") == (str(config.model.size_bytes) if fits else None)
        # Else as many parts at once as its memory holds, each checked from the page cache.
        jobs = sizing.download_jobs(
            config.model.size_bytes, len(config.model_urls), config.main_instance_type
        )
        assert main.get("DOWNLOAD_JOBS") == (None if fits else str(jobs))
        assert fits or 1 <= jobs < sizing.DOWNLOAD_JOBS
        # And its model's disk reads far ahead: the load reads the file by page faults.
        assert main.get("MODEL_READ_AHEAD_KB") == (
            None if fits else str(sizing.MODEL_READ_AHEAD_KB)
        )
        seen.add(fits)
    assert seen == {True, False}  # aws-small's main node holds its model; aws-c8g's does not


def test_patches_turned_off_on_a_stack_reach_every_node_as_their_switches() -> None:
    """llamaCppPatchesOff: each named patch's switch on every node (no rebuild: the set and its
    digest stay); the others keep theirs unset."""
    d = deploy("aws-small", {"llama-rpc-cluster:llamaCppPatchesOff": ["0002"]})
    shipped = deployed("aws-small")
    for instance in d.of_type(INSTANCE):
        env = env_of(user_data_text(instance.inputs))
        assert env["LLAMA_LOAD_PARALLEL"] == env["GGML_RPC_INFLIGHT_MB"] == "0", instance.name
        assert "GGML_RPC_SKIP_HASH" not in env and "GGML_REPACK_THREADS" not in env
        before = env_of(user_data_text(shipped.named(instance.name).inputs))
        assert env["LLAMA_CPP_PATCHES"] == before["LLAMA_CPP_PATCHES"] != "none"
        assert "LLAMA_LOAD_PARALLEL" not in before


DRAFT_8B = {
    "preset": "llama-3.1-8b-q4_0",
    "urls": ["s3://my-models/llama-3.1-8b/Llama-3.1-8B-Instruct-Q4_0.gguf"],
}


def test_a_draft_model_is_fetched_with_the_model_and_counted_on_the_main_node() -> None:
    """draftModel: the main node fetches it with the model (a staged draft with the same role,
    its object named), runs it with the stack's draft length, holds it in its own memory (fewer
    of the target's layers there) and on its model disk."""
    plain = parsed_config("aws-c8g")
    overrides = {f"{P}draftModel": DRAFT_8B, f"{P}draftMax": 6}
    config = parsed_config("aws-c8g", overrides)
    assert config.draft is not None and config.draft.name == "llama-3.1-8b-q4_0"
    assert config.placement.shares[0].layers < plain.placement.shares[0].layers
    assert config.main_disk_gb > plain.main_disk_gb
    d = deploy("aws-c8g", overrides)
    env = env_of(user_data_text(d.named("llama-rpc-cluster-main").inputs))
    assert env["DRAFT_MODEL_URLS"] == DRAFT_8B["urls"][0]
    assert (env["DRAFT_MAX"], env["DRAFT_MIN"], env["DRAFT_P_MIN"]) == ("6", "0", "0.75")
    for worker in ("llama-rpc-cluster-worker-1", "llama-rpc-cluster-worker-2"):
        assert "DRAFT_MODEL_URLS" not in env_of(user_data_text(d.named(worker).inputs))
    [read] = [p for p in d.of_type("aws:iam/rolePolicy:RolePolicy") if "model-read" in p.name]
    objects = json.loads(read.inputs["policy"])["Statement"][0]["Resource"]
    assert "arn:aws:s3:::my-models/llama-3.1-8b/Llama-3.1-8B-Instruct-Q4_0.gguf" in objects


@pytest.mark.parametrize(
    ("key", "overrides", "says"),
    [
        ("draftMax", {f"{P}draftMax": 4}, "goes with draftModel"),
        ("draftModel", {f"{P}draftModel": {**DRAFT_8B, "preset": "llama-3.1-405b-q8_0"}},
         "is not smaller than the model"),
        ("draftMin", {f"{P}draftModel": DRAFT_8B, f"{P}draftMin": 9}, "more than draftMax"),
        ("draftMax", {f"{P}draftModel": DRAFT_8B, f"{P}draftMax": 0}, "draftMax"),
        ("draftModel.urls", {f"{P}draftModel": {**DRAFT_8B, "urls": ["ftp://x/y.gguf"]}}, ""),
    ],
)  # fmt: skip
def test_a_draft_model_that_cannot_work_is_refused_naming_it(key, overrides, says) -> None:
    assert says in refused("aws-c8g", overrides, key)
