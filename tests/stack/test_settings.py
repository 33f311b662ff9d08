"""Bad settings, on every cloud, are refused before anything is created: the error names the
setting (the provider's own key for the region) and says how to fix it. One row per way a
setting can be wrong, checked against the config check itself; one deployment per cloud shows
that the program stops there, with no resource registered.
"""

from __future__ import annotations

import base64
import importlib
import ipaddress
import random
import socket
import urllib.parse
from typing import Any

import pulumi
import pytest
from hypothesis import given
from hypothesis import settings as settings_
from hypothesis import strategies as st

from infra.boot import NodeBoot
from infra.clouds import FACTS
from infra.clouds.base import OPTIONAL_SETTINGS
from infra.core import network_rules, outputs
from infra.stack.settings import BY_KEY
from tests.pulumi_mocks import (
    CLOUD_STACKS,
    KMS_KEY,
    KUBERNETES_STACKS,
    LARGEST,
    RecordingMocks,
    deploy,
    deployed,
    deployment,
    env_of,
    overrides_of,
    parsed_config,
    program_settings,
    refusal,
    refused,
    stack_config,
    user_data_text,
)

P = "llama-rpc-cluster:"
# An RSA public key of 1,032 bits (exponent 3): Azure takes 2,048 or more.
SHORT_RSA_KEY = (
    "ssh-rsa "
    + base64.b64encode(
        b"\x00\x00\x00\x07ssh-rsa\x00\x00\x00\x01\x03\x00\x00\x00\x81" + b"\xff" * 129
    ).decode()
)
# The form of an Ed25519 public key (32 arbitrary bytes: no one holds its private half).
ED25519_KEY = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGg4hEbHzZ+1Qe2TT2P0d6PMdDbaa1TuJz0hbz8uCMbG test"
)
STACK = {"aws": "aws-small", "gcp": "gcp-c4a", "azure": "azure-cobalt"}
NODE_TYPES = {
    "aws": "aws:ec2/instance:Instance",
    "gcp": "gcp:compute/instance:Instance",
    "azure": "azure-native:compute:VirtualMachine",
}


def with_urls(cloud: str, urls: list[str], sha256: list[str] | None = None) -> dict[str, Any]:
    model = dict(stack_config(STACK[cloud])[f"{P}model"])
    model["urls"] = urls
    model["sha256"] = sha256 if sha256 is not None else []
    return {f"{P}model": model}


def many_urls(count: int) -> list[str]:
    rng = random.Random(7)  # incompressible paths, so gzip cannot save the delivery
    return [f"https://models.example.com/{rng.getrandbits(256):064x}.gguf" for _ in range(count)]


def tags(count: int, prefix: str = "t") -> dict[str, str]:
    return {f"{prefix}{i}": "v" for i in range(count)}


# (cloud, the setting the error names, overrides, what the error says)
BAD: list[tuple[str, str, dict[str, Any], str]] = [
    # A split GGUF: every part, part 1 first (llama-server opens the first URL).
    *[
        (cloud, "model.urls", with_urls(cloud, urls), says)
        for cloud in ("aws", "gcp", "azure")
        for urls, says in (
            (
                [
                    "https://huggingface.co/o/m/resolve/0123456789abcdef0123456789abcdef01234567/M-00001-of-00005.gguf"
                ],
                "list 1 of the 5 parts of the split GGUF M: missing M-00002",
            ),
            (
                [
                    "https://huggingface.co/o/m/resolve/0123456789abcdef0123456789abcdef01234567/M-00002-of-00002.gguf",
                    "https://huggingface.co/o/m/resolve/0123456789abcdef0123456789abcdef01234567/M-00001-of-00002.gguf",
                ],
                "is not part 1 of a split GGUF",
            ),
            (
                [
                    "https://huggingface.co/o/m/resolve/0123456789abcdef0123456789abcdef01234567/M-00001-of-00002.gguf",
                    "https://huggingface.co/o/m/resolve/0123456789abcdef0123456789abcdef01234567/M-00002-of-00003.gguf",
                ],
                "not its parts: M-00002-of-00003.gguf",
            ),
        )
    ],
    # What each cloud's types, regions and tags allow.
    ("aws", "instanceType", {f"{P}instanceType": "c7i.16xlarge"}, "c7i.16xlarge is not an Arm"),
    (
        "aws",
        "instanceType",
        {f"{P}instanceType": "c8g.48xlarge"},
        "c8g.48xlarge is not in the instance catalog",
    ),
    ("aws", "mainInstanceType", {f"{P}mainInstanceType": "m7i.large"}, "m7i.large is not an Arm"),
    ("aws", "workerCount", {f"{P}workerCount": -1}, "-1 is outside 0-15"),
    ("aws", "workerCount", {f"{P}workerCount": 16}, "16 is outside 0-15"),
    ("aws", "slots", {f"{P}slots": 0}, "0 is outside 1-64"),
    ("aws", "serverArgs", {f"{P}serverArgs": ["--port", "9000"]}, "--port: the product binds"),
    ("gcp", "serverArgs", {f"{P}serverArgs": ["--rpc", "x"]}, "--rpc: the placement is planned"),
    ("azure", "serverArgs", {f"{P}serverArgs": ["--api-key", "k"]}, "the stack's apiKey"),
    ("aws", "serverArgs", {f"{P}serverArgs": ["--temp", "9"]}, "--temp '9': give a temperature"),
    ("aws", "serverArgs", {f"{P}serverArgs": ["--grammar", "x"]}, "'--grammar' is not a flag"),
    ("gcp", "llamaCppPatchesOff", {f"{P}llamaCppPatchesOff": ["0009"]}, "no patch '0009'"),
    ("aws", "llamaCppPatchesOff", {f"{P}llamaCppPatchesOff": [2]}, "a list of patch numbers"),
    ("aws", "serverArgs", {f"{P}serverArgs": "--temp 0.7"}, "serverArgs"),
    ("aws", "serverArgs", {f"{P}serverArgs": [["--temp"]]}, "give a list of words"),
    ("aws", "modelAlias", {f"{P}modelAlias": "my model"}, "1-128 letters, digits"),
    ("aws", "apiKey", {f"{P}apiKey": "short"}, "`none`, or 16-256 letters"),
    ("aws", "apiKey", {f"{P}apiKey": "a key with spaces in it"}, "`none`, or 16-256 letters"),
    (
        "aws",
        "apiKey",
        {f"{P}apiKey": "none", f"{P}apiAllowedCidrs": ["10.9.0.0/16"]},
        "`none` with apiAllowedCidrs would let those ranges use the API without a key",
    ),
    ("gcp", "apiKey", {f"{P}apiKey": "short-key"}, "the value given is not `none`, or 16-256"),
    (
        "gcp",
        "apiKey",
        {f"{P}apiKey": "none"},
        "`none` lets any web page open in your browser use the API through the tunnel",
    ),
    (
        "aws",
        "serverArgs",
        {f"{P}apiKey": "none", f"{P}serverArgs": ["--cors-origins", "*"]},
        "--cors-origins '*': '*' lets other web pages use the API",
    ),
    (
        "azure",
        "apiKey",
        {f"{P}apiKey": "none", f"{P}apiAllowedCidrs": ["10.9.0.0/16"]},
        "`none` with apiAllowedCidrs would let those ranges use the API without a key",
    ),
    ("aws", "slots", {f"{P}slots": "two"}, "must be a whole number"),
    ("aws", "vpcCidr", {f"{P}vpcCidr": "8.8.0.0/16"}, "8.8.0.0/16 is not private address"),
    ("aws", "vpcCidr", {f"{P}vpcCidr": "10.0.0.0/33"}, "'10.0.0.0/33' is not a valid IPv4 CIDR"),
    ("aws", "vpcCidr", {f"{P}vpcCidr": "10.0.0.0/25"}, "10.0.0.0/25 is too small"),
    ("aws", "rpcPort", {f"{P}rpcPort": 70000}, "70000 is outside 1024-65535"),
    ("aws", "serverPort", {f"{P}serverPort": 0}, "0 is outside 1024-65535"),
    ("aws", "serverPort", {f"{P}serverPort": 50052}, "equals rpcPort"),
    ("aws", "llamaCppCommit", {f"{P}llamaCppCommit": "master"}, "'master' is not a full"),
    ("aws", "apiAllowedCidrs", {f"{P}apiAllowedCidrs": ["0.0.0.0/0"]}, "0.0.0.0/0 opens the API"),
    ("aws", "workerCont", {f"{P}workerCont": 2}, "unknown key"),
    ("aws", "aws:region", {"aws:region": None}, "no region"),
    ("aws", "aws:region", {"aws:region": "eu-west-1"}, "the instance catalog has no aws types"),
    (
        "gcp",
        "instanceType",
        {"llama-rpc-cluster:instanceType": "n2-standard-64"},
        "n2-standard-64 is not an Arm instance type",
    ),
    (
        "gcp",
        "instanceType",
        {"llama-rpc-cluster:instanceType": "c4a-standard-4"},
        "not in the instance catalog for gcp us-central1",
    ),
    ("gcp", "gcp:region", {"gcp:region": "europe-west4"}, "the instance catalog has no gcp types"),
    (
        "gcp",
        "tags",
        {"llama-rpc-cluster:tags": {"Team": "ml"}},
        "label key 'Team' must start with a lowercase letter",
    ),
    ("gcp", "tags", {"llama-rpc-cluster:tags": {"team": "ML Infra"}}, "label value 'ML Infra'"),
    (
        "azure",
        "instanceType",
        {"llama-rpc-cluster:instanceType": "Standard_D64s_v6"},
        "Standard_D64s_v6 is not an Arm instance type",
    ),
    (
        "azure",
        "instanceType",
        {"llama-rpc-cluster:instanceType": "Standard_D2ps_v6"},
        "not in the instance catalog for azure eastus",
    ),
    (
        "azure",
        "azure-native:location",
        {"azure-native:location": "westeurope"},
        "the instance catalog has no azure types in westeurope",
    ),
    (
        "azure",
        "sshPublicKey",
        {"llama-rpc-cluster:sshPublicKey": "hunter2"},
        "not an OpenSSH public key",
    ),
    (
        "azure",
        "tags",
        {"llama-rpc-cluster:tags": {"cost/center": "42"}},
        "tag 'cost/center': Azure tag names",
    ),
    # Characters a URL may not hold: quotes, backslashes, controls, spaces, non-ASCII, globs.
    *[
        (cloud, "model.urls", with_urls(cloud, [url]), "holds characters a model URL may not")
        for cloud, url in [
            ("aws", "https://h.example.com/it's.gguf"),
            ("gcp", "https://h.example.com/a\\b.gguf"),
            ("aws", "https://h.example.com/m.gguf\x00.txt"),
            ("azure", "https://h.example.com/m\r\n.gguf"),
            ("aws", "https://h.example.com/part-[1-5].gguf"),
            ("gcp", "https://h.example.com/{a,b}.gguf"),
            ("aws", "https://h.example.com/m%zz.gguf"),
            ("aws", "https://h.example.com/m odel.gguf"),
            ("aws", "https://xn--h-example.com/\u00e9.gguf"),
            ("aws", "https://\uff11\uff12\uff17.\uff10.\uff10.\uff11/m.gguf"),  # full-width
            ("aws", "https://[::1]/m.gguf"),
            ("aws", "https://[fd00:ec2::254]/m.gguf"),
            ("aws", "https://[::ffff:169.254.169.254]/m.gguf"),
            ("aws", "s3://models/${aws:username}/m.gguf"),  # an IAM policy variable
        ]
    ],
    # Hosts that are an address by another spelling.
    *[
        (cloud, "model.urls", with_urls(cloud, [url]), "the host must be a DNS name")
        for cloud, url in [
            ("aws", "https://%31%32%37.0.0.1/m.gguf"),
            ("aws", "https://2852039166/m.gguf"),  # 169.254.169.254
            ("aws", "https://0x7f000001/m.gguf"),  # 127.0.0.1
            ("gcp", "https://0177.0.0.1/m.gguf"),  # octal
            ("aws", "https://127.1/m.gguf"),
            ("azure", "https://h_example.com/m.gguf"),
        ]
    ],
    # Credentials in the query, ports that open the internet, a fragment.
    *[
        ("aws", "model.urls", with_urls("aws", [url]), "carries a credential in its query")
        for url in [
            "https://b.s3.amazonaws.com/m.gguf?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=ab",
            "https://storage.googleapis.com/b/m.gguf?X-Goog-Signature=ab&X-Goog-Expires=60",
            "https://a.blob.core.windows.net/c/m.gguf?sv=2022-11-02&se=2026-12-01&sig=ab%3D",
            "https://h.example.com/m.gguf?AWSAccessKeyId=AKID&Signature=ab&Expires=1",
            "https://h.example.com/m.gguf?access_token=ab",
        ]
    ],
    ("aws", "model.urls", with_urls("aws", ["https://h.example.com:8443/m.gguf"]), "port 8443"),
    ("aws", "model.urls", with_urls("aws", ["https://10.1.2.3:99999/m.gguf"]), "port 99999"),
    ("aws", "model.urls", with_urls("aws", ["https://h.example.com/m.gguf#x"]), "a fragment"),
    # Object keys that would widen the read grant.
    *[
        (cloud, "model.urls", with_urls(cloud, [url]), "would widen the node's read grant")
        for cloud, url in [
            ("aws", "s3://models/llama/*.gguf"),
            ("aws", "s3://models/llama/part-?.gguf"),
            ("aws", "s3://models/llama//m.gguf"),
            ("gcp", "gs://models/llama/../other/m.gguf"),
            ("azure", "az://mymodels/models/llama/*.gguf"),
        ]
    ],
    # Numbers a node cannot take.
    (
        "aws",
        "model.sizeGb",
        {
            f"{P}model": {
                "sizeGb": float("nan"),
                "layers": 28,
                "kvBytesPerToken": 28672,
                "urls": ["https://h.example.com/m.gguf"],
            }
        },
        "give the model's size in GB",
    ),
    (
        "aws",
        "model.sizeGb",
        {
            f"{P}model": {
                "sizeGb": float("inf"),
                "layers": 28,
                "kvBytesPerToken": 28672,
                "urls": ["https://h.example.com/m.gguf"],
            }
        },
        "more than 0 and at most 100,000",
    ),
    (
        "aws",
        "model.layers",
        {
            f"{P}model": {
                "sizeGb": 1.1,
                "layers": 10**9,
                "kvBytesPerToken": 28672,
                "urls": ["https://h.example.com/m.gguf"],
            }
        },
        "from 1 to 4096",
    ),
    ("aws", "contextSize", {f"{P}contextSize": 2**31}, "is outside 1-16777216"),
    (
        "aws",
        "maxHourlyUsd",
        {f"{P}replicas": 10, f"{P}workerCount": 15, f"{P}instanceType": "c8g.16xlarge"},
        "more than maxHourlyUsd ($100/h)",
    ),
    ("aws", "maxHourlyUsd", {f"{P}maxHourlyUsd": 0}, "0 is outside at least 1"),
    # Spend guards: a few minutes would stop a cluster between one person's requests.
    ("aws", "stopAfterIdleMinutes", {f"{P}stopAfterIdleMinutes": 4}, "4 is outside 5-10080"),
    ("gcp", "stopAfterIdleMinutes", {f"{P}stopAfterIdleMinutes": "soon"}, "a whole number"),
    ("azure", "stopAfterHours", {f"{P}stopAfterHours": 0}, "0 is outside 1-720"),
    ("aws", "stopAfterHours", {f"{P}stopAfterHours": 1.5}, "a whole number"),
    ("aws", "workerDiskGb", {f"{P}workerDiskGb": 12}, "cannot hold the OS, the build tools"),
    # Ports that collide with the node metrics'.
    ("aws", "rpcPort", {f"{P}rpcPort": 9100}, "9100 is the node metrics' port"),
    ("gcp", "serverPort", {f"{P}serverPort": 9100}, "9100 is the node metrics' port"),
    # SSH keys Azure does not take.
    *[
        ("azure", "sshPublicKey", {f"{P}sshPublicKey": key}, "is not an OpenSSH public key Azure")
        for key in [
            "ssh-ed25519 AAAA me",
            SHORT_RSA_KEY,
            "ssh-dss AAAAB3NzaC1kc3MAAACBAP",
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIN" + "A" * 10,
        ]
    ],
    # Boot data the renderer refuses, caught in the config step.
    ("aws", "model.urls", with_urls("aws", many_urls(400)), "the aws user data is"),
    ("azure", "model.urls", with_urls("azure", many_urls(1500)), "the azure user data is"),
    (
        "azure",
        "draftModel.urls",
        {
            f"{P}draftModel": {
                "sizeGb": 0.5,
                "layers": 24,
                "kvBytesPerToken": 100,
                "urls": many_urls(1500),
            }
        },
        "the azure user data is",
    ),
    ("aws", "serverArgs", {f"{P}serverArgs": ["--jinja"] * 65}, "65 words; at most 64"),
    # A misspelt preset is named, not the URLs that would have come with it.
    ("aws", "draftModel.preset", {f"{P}draftModel": {"preset": "nope"}}, "nope"),
    ("gcp", "model.preset", {f"{P}model": {"preset": "nope"}}, "nope"),
    (
        "aws",
        "model.urls",
        with_urls("aws", ["https://h.example.com/models/"]),
        "does not end in a file name",
    ),
    (
        "aws",
        "model.urls",
        with_urls("aws", ["https://a.example.com/m.gguf", "https://b.example.com/m.gguf"]),
        "both save as 'm.gguf'",
    ),
    # Model hosts a node must never fetch from, and unverified downloads.
    *[
        (cloud, "model.urls", with_urls(cloud, [url]), "points at the node itself or at the cloud")
        for cloud, url in [
            ("aws", "http://169.254.169.254/latest/meta-data/m.gguf"),
            ("gcp", "https://metadata.google.internal/m.gguf"),
            ("azure", "https://168.63.129.16/m.gguf"),
            ("aws", "https://127.0.0.1:8000/m.gguf"),
            ("aws", "https://localhost/m.gguf"),
        ]
    ],
    (
        "aws",
        "model.urls",
        with_urls("aws", ["https://me:secret@h.example.com/m.gguf"]),
        "carries credentials",
    ),
    (
        "aws",
        "model.urls",
        with_urls("aws", ["ftp://h.example.com/m.gguf"]),
        "is not an http(s) URL",
    ),
    ("gcp", "model.sha256", with_urls("gcp", ["http://h.example.com/m.gguf"]), "'http://"),
    # Who may reach the API.
    ("aws", "apiAllowedCidrs", {f"{P}apiAllowedCidrs": ["0.0.0.0/0"]}, "0.0.0.0/0 opens the API"),
    (
        "aws",
        "apiAllowedCidrs",
        {f"{P}apiAllowedCidrs": ["0.0.0.0/1", "128.0.0.0/1"]},
        "0.0.0.0/1 opens the API to 2,147,483,648",
    ),
    ("gcp", "apiAllowedCidrs", {f"{P}apiAllowedCidrs": ["8.0.0.0/8"]}, "8.0.0.0/8 opens"),
    ("azure", "apiAllowedCidrs", {f"{P}apiAllowedCidrs": ["203.0.113.0/23"]}, "203.0.113.0/23"),
    ("aws", "apiAllowedCidrs", {f"{P}apiAllowedCidrs": ["::/0"]}, "::/0 is IPv6"),
    (
        "gcp",
        "apiAllowedCidrs",
        {f"{P}apiAllowedCidrs": ["198.51.100.0/24", "2001:db8::/64"]},
        "2001:db8::/64 is IPv6",
    ),
    ("aws", "apiAllowedCidrs", {f"{P}apiAllowedCidrs": ["10.0.0.0/33"]}, "'10.0.0.0/33' is not"),
    (
        "aws",
        "apiAllowedCidrs",
        {f"{P}apiAllowedCidrs": [f"198.51.{i}.0/24" for i in range(51)]},
        "51 ranges",
    ),
    # The cluster's own range.
    ("aws", "vpcCidr", {f"{P}vpcCidr": "0.0.0.0/16"}, "0.0.0.0/16 is not private address space"),
    ("gcp", "vpcCidr", {f"{P}vpcCidr": "240.0.0.0/16"}, "240.0.0.0/16 is not private"),
    ("azure", "vpcCidr", {f"{P}vpcCidr": "8.8.0.0/16"}, "8.8.0.0/16 is not private"),
    ("aws", "vpcCidr", {f"{P}vpcCidr": "10.0.0.0/8"}, "10.0.0.0/8 is wider than this cloud takes"),
    ("aws", "vpcCidr", {f"{P}vpcCidr": "10.0.0.0/25"}, "10.0.0.0/25 is too small"),
    # Ports the unprivileged services cannot bind.
    (
        "aws",
        "rpcPort",
        {f"{P}rpcPort": 22},
        "22 is outside 1024-65535; the services run unprivileged",
    ),
    (
        "gcp",
        "serverPort",
        {f"{P}serverPort": 80},
        "80 is outside 1024-65535; the services run unprivileged",
    ),
    ("azure", "serverPort", {f"{P}serverPort": 70000}, "70000 is outside 1024-65535"),
    # Disks outside the provider's limits.
    ("aws", "mainDiskGb", {f"{P}mainDiskGb": 70_000}, "70000 GB is outside what aws takes"),
    ("gcp", "workerDiskGb", {f"{P}workerDiskGb": 2}, "2 GB is outside what gcp takes"),
    ("azure", "mainDiskGb", {f"{P}mainDiskGb": 5000}, "5000 GB is outside what azure takes"),
    ("aws", "diskThroughputMibps", {f"{P}diskThroughputMibps": 2001}, "2001 is outside aws's"),
    ("gcp", "diskThroughputMibps", {f"{P}diskThroughputMibps": 100}, "100 is outside gcp's"),
    # Settings a cloud cannot honour.
    ("aws", "sshPublicKey", {f"{P}sshPublicKey": "ssh-ed25519 AAAA me"}, "aws does not take"),
    ("gcp", "sshPublicKey", {f"{P}sshPublicKey": "ssh-ed25519 AAAA me"}, "gcp does not take"),
    ("azure", "diskThroughputMibps", {f"{P}diskThroughputMibps": 500}, "azure does not take"),
    ("aws", "bastion", {f"{P}bastion": True}, "aws does not take"),
    ("gcp", "encryptionAtHost", {f"{P}encryptionAtHost": True}, "gcp does not take"),
    ("azure", "bastion", {f"{P}bastion": "yes"}, "must be true or false"),
    ("aws", "flowLogs", {f"{P}flowLogs": "off"}, "must be true or false"),
    # Images.
    ("aws", "image", {f"{P}image": "ubuntu-24.04"}, "'ubuntu-24.04' is not the name of one"),
    ("aws", "image", {f"{P}image": "ami-0123456789abcdef0"}, "of Canonical's arm64 Ubuntu"),
    (
        "aws",
        "image",
        {f"{P}image": "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20251001"},
        "is not the name of one of Canonical's arm64",
    ),
    ("gcp", "image", {f"{P}image": "ubuntu-2404-lts-arm64"}, "'ubuntu-2404-lts-arm64' is not"),
    (
        "gcp",
        "image",
        {f"{P}image": "projects/stranger/global/images/family/ubuntu-2404-lts-arm64"},
        "of the ubuntu-os-cloud project",
    ),
    (
        "gcp",
        "image",
        {f"{P}image": "projects/windows-cloud/global/images/family/windows-2022"},
        "of the ubuntu-os-cloud project",
    ),
    (
        "gcp",
        "image",
        {f"{P}image": "projects/ubuntu-os-cloud/global/images/ubuntu-2404-noble-amd64-v20251001"},
        "is not an arm64 Ubuntu 24.04 image",
    ),
    ("azure", "image", {f"{P}image": "latest"}, "'latest' is not a version of Canonical"),
    # Tags and labels.
    ("aws", "tags", {f"{P}tags": {"aws:owner": "me"}}, "tag 'aws:owner': the aws: prefix"),
    ("aws", "tags", {f"{P}tags": tags(47)}, "47 tags; AWS allows 50"),
    ("aws", "tags", {f"{P}tags": {"team#1": "ml"}}, "tag 'team#1'='ml': AWS (IAM) tags"),
    ("aws", "tags", {f"{P}tags": {"Project": "x"}}, "tag 'Project' collides"),
    ("aws", "tags", {f"{P}tags": {"Name": "x"}}, "'Name' is set by the program"),
    ("aws", "tags", {f"{P}tags": {"Team": "a", "team": "b"}}, "two tag names differ only in case"),
    ("aws", "tags", {f"{P}tags": {"k" * 129: "v"}}, "names hold 1-128 characters"),
    ("gcp", "tags", {f"{P}tags": tags(62)}, "62 labels; GCP allows 64"),
    ("gcp", "tags", {f"{P}tags": {"Team": "ml"}}, "label key 'Team' must start with a lowercase"),
    ("gcp", "tags", {f"{P}tags": {"stack": "mine"}}, "'stack' is set by the program"),
    ("azure", "tags", {f"{P}tags": {"microsoftOwner": "me"}}, "tag 'microsoftOwner': names"),
    ("azure", "tags", {f"{P}tags": {"Windows-team": "me"}}, "are reserved"),
    ("azure", "tags", {f"{P}tags": tags(47)}, "47 tags; Azure allows 50 per resource and"),
    ("azure", "tags", {f"{P}tags": {"vm": "x"}}, "'vm' is set by the program"),
    ("azure", "tags", {f"{P}tags": {"Stack": "x"}}, "tag 'Stack' collides"),
    ("azure", "tags", {f"{P}tags": {"cost/center": "42"}}, "tag 'cost/center': Azure tag names"),
    ("azure", "tags", {f"{P}tags": {"team": 42}}, "must be a map of tag names to string values"),
    # Zones, Network Watchers and boot disks the image does not fit.
    ("aws", "zone", {f"{P}zone": "us-east-1-bos-1a"}, "not a zone of us-east-1"),
    ("aws", "zone", {f"{P}zone": "us-west-2a"}, "not a zone of us-east-1 (like us-east-1a)"),
    ("gcp", "zone", {f"{P}zone": "us-central1a"}, "not a zone of us-central1 (like us-central1-a)"),
    ("azure", "zone", {f"{P}zone": "1"}, "azure does not take this setting"),
    ("aws", "networkWatcher", {f"{P}networkWatcher": "rg/nw"}, "aws does not take"),
    ("azure", "networkWatcher", {f"{P}networkWatcher": "NetworkWatcher_eastus"}, "is not"),
    (
        "azure",
        "networkWatcher",
        {f"{P}networkWatcher": "rg/nw", f"{P}flowLogs": False},
        "only the flow log uses it",
    ),
    ("aws", "workerDiskGb", {f"{P}workerDiskGb": 7}, "7 GB is outside what aws takes"),
    ("gcp", "workerDiskGb", {f"{P}workerDiskGb": 9}, "9 GB is outside what gcp takes"),
    # A context so long that generating it outlasts HAProxy's longest timeout (~24.8 days).
    (
        "aws",
        "contextSize",
        {
            f"{P}replicas": 2,
            f"{P}workerCount": 14,
            f"{P}contextSize": 16_000_000,
            f"{P}model": {
                "sizeGb": 20,
                "layers": 28,
                "kvBytesPerToken": 8,
                "urls": ["https://example.com/custom.gguf"],
            },
        },
        "longer than the balancer's longest timeout (HAProxy's, 2,147,483 s)",
    ),
    # The KMS key of an SSE-KMS bucket.
    ("aws", "modelStoreKmsKey", {f"{P}modelStoreKmsKey": "alias/models"}, "is not a KMS key ARN"),
    ("aws", "modelStoreKmsKey", {f"{P}modelStoreKmsKey": KMS_KEY}, "only s3:// model URLs"),
    ("gcp", "modelStoreKmsKey", {f"{P}modelStoreKmsKey": KMS_KEY}, "gcp does not take"),
    (
        "aws",
        "modelStoreKmsKey",
        {
            f"{P}modelStoreKmsKey": KMS_KEY.replace("us-east-1", "eu-west-1"),
            f"{P}model": {
                "sizeGb": 1.12,
                "layers": 28,
                "kvBytesPerToken": 28672,
                "urls": ["s3://models/qwen.gguf"],
            },
        },
        "the key is in eu-west-1, the stack in us-east-1",
    ),
    # Regions that are not regions: the error names the provider's region key.
    ("aws", "aws:region", {"aws:region": "US East"}, "'US East' is not a aws region name"),
    ("aws", "aws:region", {"aws:region": "us-east-1a"}, "'us-east-1a' is not"),
    ("gcp", "gcp:region", {"gcp:region": "us-central1-a"}, "'us-central1-a' is not"),
    ("azure", "azure-native:location", {"azure-native:location": "East US"}, "'East US' is not"),
    ("aws", "aws:region", {"aws:region": "ap-south-2"}, "the instance catalog has no aws types"),
]


@pytest.mark.parametrize(
    ("cloud", "key", "overrides", "says"), BAD, ids=[f"{c}-{k}-{m[:30]}" for c, k, _, m in BAD]
)
def test_a_bad_setting_is_refused_with_an_error_that_names_it(
    cloud: str, key: str, overrides: dict[str, Any], says: str
) -> None:
    assert says in refused(STACK[cloud], overrides, key)


# The program reads its settings before it creates anything: one refusal per cloud through a
# whole deployment shows that nothing is registered and the error reaches the user as it is.
PROGRAM_REFUSALS: list[tuple[str, dict[str, Any]]] = [
    ("aws", {f"{P}apiAllowedCidrs": ["0.0.0.0/0"]}),
    ("gcp", {"gcp:region": "us-central1-a"}),
    ("azure", {f"{P}tags": {"cost/center": "42"}}),
]


@pytest.mark.parametrize(("cloud", "overrides"), PROGRAM_REFUSALS)
def test_the_program_registers_nothing_when_a_setting_is_refused(
    cloud: str, overrides: dict[str, Any]
) -> None:
    mocks = RecordingMocks()
    with pytest.raises(pulumi.RunError) as error:
        deploy(STACK[cloud], overrides, mocks=mocks)
    assert str(error.value) == str(refusal(STACK[cloud], overrides))
    assert "Traceback" not in str(error.value)
    assert mocks.resources == [], "nothing may be created"


GOOD: list[tuple[str, dict[str, Any]]] = [
    ("aws", {f"{P}apiAllowedCidrs": ["10.0.0.0/8", "100.64.0.0/10", "198.51.100.0/24"]}),
    ("gcp", {f"{P}apiAllowedCidrs": ["203.0.113.7/32"]}),
    ("aws", with_urls("aws", ["http://h.example.com/m.gguf"], ["0" * 64])),
    ("aws", with_urls("aws", ["https://10.1.2.3:8443/m.gguf"])),  # a mirror inside the network
    ("aws", with_urls("aws", ["https://h.example.com:443/m.gguf?download=true"])),
    ("aws", with_urls("aws", ["s3://models/llama-3.1/part_1(of 2).gguf".replace(" ", "-")])),
    ("azure", {f"{P}sshPublicKey": ED25519_KEY}),
    ("azure", {f"{P}tags": tags(46)}),
    (
        "aws",
        {
            f"{P}maxHourlyUsd": 1000,
            f"{P}replicas": 10,
            f"{P}workerCount": 15,
            f"{P}instanceType": "c8g.16xlarge",
        },
    ),
    ("aws", {f"{P}rpcPort": 1024, f"{P}serverPort": 65535}),
    ("aws", {f"{P}stopAfterIdleMinutes": 5, f"{P}stopAfterHours": 720}),
    ("azure", {f"{P}tags": {"cost-center": "42", "Owner": "ml team"}}),
    ("aws", {f"{P}tags": {"cost-center": "42", "owner": "ml team@corp"}}),
    ("azure", {f"{P}vpcCidr": "172.16.0.0/12"}),
]


@pytest.mark.parametrize(("cloud", "overrides"), GOOD)
def test_settings_near_the_limits_are_accepted(cloud: str, overrides: dict[str, Any]) -> None:
    """The config check accepts them: what ``pulumi up`` runs before it registers anything,
    every node's user data rendered and delivered."""
    config = parsed_config(STACK[cloud], overrides)
    assert len(config.user_data) == config.replicas
    assert [len(group) for group in config.user_data] == [config.worker_count + 1] * config.replicas


@pytest.mark.parametrize("cloud", sorted(CLOUD_STACKS))
def test_the_program_runs_on_an_accepted_large_stack(cloud: str) -> None:
    """Three groups of the most nodes each: every node, the balancer node and the outputs."""
    d = deployment(CLOUD_STACKS[cloud], **LARGEST)
    config = parsed_config(CLOUD_STACKS[cloud], overrides_of(LARGEST))
    nodes = d.of_type(NODE_TYPES[cloud])
    assert len(nodes) == config.replicas * (config.worker_count + 1) + 1  # and the balancer
    assert d.outputs[outputs.REPLICAS] == config.replicas == 3
    assert len(d.outputs[outputs.GROUPS]) == 3


def test_every_optional_setting_is_honoured_somewhere_and_refused_elsewhere() -> None:
    for setting in OPTIONAL_SETTINGS:
        refusing = [name for name, facts in FACTS.items() if setting in facts.refuses]
        assert 0 < len(refusing) < len(FACTS), setting
    for facts in FACTS.values():
        assert set(facts.refuses) <= set(OPTIONAL_SETTINGS)


@pytest.mark.parametrize(
    ("cidr", "allowed"),
    [
        ("203.0.113.0/24", True),
        ("203.0.113.0/23", False),
        ("0.0.0.0/1", False),
        ("128.0.0.0/1", False),
        ("10.0.0.0/8", True),
        ("100.64.0.0/10", True),
        ("172.0.0.0/8", False),  # wider than 172.16.0.0/12: mostly internet
    ],
)
def test_the_api_rule(cidr: str, allowed: bool) -> None:
    assert (network_rules.api_cidr_problem(cidr) is None) is allowed


def test_the_longest_context_in_every_slot_fits_llama_servers_ctx_size() -> None:
    """llama-server parses --ctx-size (contextSize x slots) as a 32-bit signed number."""
    assert BY_KEY["contextSize"].high * BY_KEY["slots"].high < 2**31


FORBIDDEN = ["127.0.0.1", "169.254.169.254", "168.63.129.16", "0.0.0.0", "224.0.0.1"]


def spellings(address: str) -> list[str]:
    """Ways to write an IPv4 address that resolvers or curl may turn back into it."""
    number = int(ipaddress.IPv4Address(address))
    octets = address.split(".")
    return [
        address,
        str(number),
        hex(number),
        ".".join(f"0{int(o):o}" for o in octets),
        ".".join(f"0x{int(o):x}" for o in octets),
        ".".join(o.zfill(3) for o in octets),
        f"{octets[0]}.{int(''.join(f'{int(o):08b}' for o in octets[1:]), 2)}",
        "".join(f"%{ord(c):02x}" for c in address),
        # Full-width digits and full stop (U+FF10-FF19, U+FF0E), which IDNA maps to ASCII.
        address.translate({ord(c): 0xFF10 + int(c) for c in "0123456789"} | {ord("."): 0xFF0E}),
        f"[::ffff:{address}]",
        f"[::{address}]",
        f"{address}.",
        f"{address}\x00.example.com",
    ]


@settings_(max_examples=400, deadline=None)
@given(
    address=st.sampled_from(FORBIDDEN),
    form=st.integers(0, 12),
    scheme=st.sampled_from(["http", "https"]),
    port=st.sampled_from(["", ":80", ":443", ":8080"]),
    junk=st.text(max_size=4),
)
def test_no_spelling_of_a_forbidden_address_passes(
    address: str, form: int, scheme: str, port: str, junk: str
) -> None:
    """The class, not the examples: whatever spelling or junk around it, an accepted URL names
    a host that no resolver turns into loopback, link-local, the metadata services or
    multicast, and holds only printable ASCII without quotes, spaces or curl's globs."""
    url = f"{scheme}://{spellings(address)[form]}{port}/m{junk}.gguf"
    if network_rules.model_url_problem(url) is not None:
        return
    assert url.isascii() and url.isprintable() and not set(url) & set(" '\"\\[]{}<>^`|")
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        resolved = ipaddress.IPv4Address(socket.inet_aton(host.rstrip(".")))
    except OSError:
        return  # a name, not an address
    assert str(resolved) not in FORBIDDEN, url


def test_a_bad_api_key_is_named_but_never_repeated() -> None:
    said = refused(STACK["aws"], {f"{P}apiKey": "short secret"}, "apiKey")
    assert "short secret" not in said and "the value given is not" in said


def test_the_model_alias_and_server_args_reach_the_main_node_only() -> None:
    """modelAlias and serverArgs are the main node's (llama-server's); the workers get neither.
    Without modelAlias the id is the preset's name."""
    given = {f"{P}modelAlias": "team/qwen", f"{P}serverArgs": ["--temp", "0.2", "--jinja"]}
    d = deploy("aws-small", given)
    main = env_of(user_data_text(d.named("llama-rpc-cluster-main").inputs))
    worker = env_of(user_data_text(d.named("llama-rpc-cluster-worker-1").inputs))
    assert (main["MODEL_ALIAS"], main["LLAMA_SERVER_ARGS"]) == ("team/qwen", "--temp 0.2 --jinja")
    assert "MODEL_ALIAS" not in worker and "LLAMA_SERVER_ARGS" not in worker
    default = env_of(user_data_text(deployed("aws-c8g").named("llama-rpc-cluster-main").inputs))
    assert default["MODEL_ALIAS"] == "llama-3.1-405b-q4_k_m"
    assert "LLAMA_SERVER_ARGS" not in default


def test_the_program_deploys_the_user_data_the_config_check_rendered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The config check renders and delivers every node's user data to check it; the program
    deploys those and renders no node again (a render is most of a large stack's ``up``)."""
    # The module (in infra.boot, its name is also its function's).
    render = importlib.import_module("infra.boot.render")
    real = render.cloud_config
    rendered: list[str] = []

    def counted(boot: NodeBoot) -> dict[str, Any]:
        rendered.append(boot.node_ip)
        return real(boot)

    monkeypatch.setattr(render, "cloud_config", counted)
    d = deploy("aws-small", {f"{P}replicas": 2})
    nodes = [r for r in d.of_type("aws:ec2/instance:Instance") if "balancer" not in r.name]
    assert len(nodes) == 6
    assert sorted(rendered) == sorted(r.inputs["privateIp"] for r in nodes)


def test_pods_get_a_config_maps_limit_not_a_vms_user_data_limit() -> None:
    """On Kubernetes the settings travel in a ConfigMap (1 MiB), not in user data (AWS: 16 KB):
    a list of parts a VM stack refuses is the pods' to take, and a longer one is refused by
    the ConfigMap's limit, naming the setting that fills it."""
    from infra.stack import config as cluster_config

    [eks] = KUBERNETES_STACKS
    parts = with_urls("aws", many_urls(400))
    assert "the aws user data is" in refused(STACK["aws"], parts, "model.urls")
    settings, region = program_settings(eks, parts)
    assert cluster_config.from_settings(settings, region=region).kubernetes
    many = with_urls("aws", many_urls(12_000))
    assert "over a ConfigMap's" in refused(eks, many, "model.urls")


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_a_bad_model_url_with_a_guarded_balancer_is_refused_naming_it(cloud: str) -> None:
    """With replicas and a spend guard the stack's cost reads the groups' boots (the balancer
    node's guard is theirs) before the boot data is checked: a bad URL is still a refusal that
    names ``model.urls``, not a crash."""
    overrides = {
        "llama-rpc-cluster:replicas": 2,
        "llama-rpc-cluster:stopAfterIdleMinutes": 30,
        "llama-rpc-cluster:model": {"preset": "llama-3.1-8b-q4_0",
                                    "urls": ["https://h.example.com/models/"]},
    }  # fmt: skip
    stack = {"aws": "aws-c8g", "gcp": "gcp-c4a", "azure": "azure-cobalt"}[cloud]
    text = refused(stack, overrides, "model.urls")
    assert "does not end in a file name" in text
