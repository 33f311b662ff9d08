"""Bad settings, on every cloud, are refused before anything is created: the error names the
setting (the provider's own key for the region) and says how to fix it; no resource is
registered. One row per way a setting can be wrong.
"""

from __future__ import annotations

import random
from typing import Any

import pulumi
import pytest

from infra import network_rules
from infra.clouds import FACTS
from infra.clouds.base import OPTIONAL_SETTINGS
from tests.pulumi_mocks import RecordingMocks, deploy, stack_config

P = "llama-rpc-cluster:"
STACK = {"aws": "aws-small", "gcp": "gcp-c4a", "azure": "azure-cobalt"}


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


BAD: list[tuple[str, dict[str, Any], str]] = [
    # Boot data the renderer refuses, caught in the config step.
    ("aws", with_urls("aws", ["https://h.example.com/it's.gguf"]), "model.urls: MODEL_URLS="),
    ("gcp", with_urls("gcp", ["https://h.example.com/a\\b.gguf"]), "model.urls: MODEL_URLS="),
    ("aws", with_urls("aws", many_urls(400)), "model.urls: the aws user data is"),
    ("azure", with_urls("azure", many_urls(1500)), "model.urls: the azure user data is"),
    ("aws", with_urls("aws", ["https://h.example.com/models/"]), "model.urls:"),
    (
        "aws",
        with_urls("aws", ["https://a.example.com/m.gguf", "https://b.example.com/m.gguf"]),
        "model.urls:",
    ),
    # Model hosts a node must never fetch from, and unverified downloads.
    ("aws", with_urls("aws", ["http://169.254.169.254/latest/meta-data/m.gguf"]), "model.urls"),
    ("gcp", with_urls("gcp", ["https://metadata.google.internal/m.gguf"]), "model.urls"),
    ("azure", with_urls("azure", ["https://168.63.129.16/m.gguf"]), "model.urls"),
    ("aws", with_urls("aws", ["https://[fd00:ec2::254]/m.gguf"]), "model.urls"),
    ("aws", with_urls("aws", ["https://127.0.0.1:8000/m.gguf"]), "model.urls"),
    ("aws", with_urls("aws", ["https://localhost/m.gguf"]), "model.urls"),
    ("aws", with_urls("aws", ["https://[::1]/m.gguf"]), "model.urls"),
    ("aws", with_urls("aws", ["https://2852039166/m.gguf"]), "model.urls"),  # 169.254.169.254
    ("aws", with_urls("aws", ["https://0x7f000001/m.gguf"]), "model.urls"),  # 127.0.0.1
    ("aws", with_urls("aws", ["https://[::ffff:169.254.169.254]/m.gguf"]), "model.urls"),
    ("aws", with_urls("aws", ["https://me:secret@h.example.com/m.gguf"]), "carries credentials"),
    ("aws", with_urls("aws", ["ftp://h.example.com/m.gguf"]), "model.urls"),
    ("gcp", with_urls("gcp", ["http://h.example.com/m.gguf"]), "model.sha256: 'http://"),
    # Who may reach the API.
    ("aws", {f"{P}apiAllowedCidrs": ["0.0.0.0/0"]}, "apiAllowedCidrs: 0.0.0.0/0 opens the API"),
    (
        "aws",
        {f"{P}apiAllowedCidrs": ["0.0.0.0/1", "128.0.0.0/1"]},
        "apiAllowedCidrs: 0.0.0.0/1 opens the API to 2,147,483,648",
    ),
    ("gcp", {f"{P}apiAllowedCidrs": ["8.0.0.0/8"]}, "apiAllowedCidrs: 8.0.0.0/8 opens"),
    ("azure", {f"{P}apiAllowedCidrs": ["203.0.113.0/23"]}, "apiAllowedCidrs: 203.0.113.0/23"),
    ("aws", {f"{P}apiAllowedCidrs": ["::/0"]}, "apiAllowedCidrs: ::/0 is IPv6"),
    (
        "gcp",
        {f"{P}apiAllowedCidrs": ["198.51.100.0/24", "2001:db8::/64"]},
        "apiAllowedCidrs: 2001:db8::/64 is IPv6",
    ),
    ("aws", {f"{P}apiAllowedCidrs": ["10.0.0.0/33"]}, "apiAllowedCidrs: '10.0.0.0/33' is not"),
    (
        "aws",
        {f"{P}apiAllowedCidrs": [f"198.51.{i}.0/24" for i in range(51)]},
        "apiAllowedCidrs: 51 ranges",
    ),
    # The cluster's own range.
    ("aws", {f"{P}vpcCidr": "0.0.0.0/16"}, "vpcCidr: 0.0.0.0/16 is not private address space"),
    ("gcp", {f"{P}vpcCidr": "240.0.0.0/16"}, "vpcCidr: 240.0.0.0/16 is not private"),
    ("azure", {f"{P}vpcCidr": "8.8.0.0/16"}, "vpcCidr: 8.8.0.0/16 is not private"),
    ("aws", {f"{P}vpcCidr": "10.0.0.0/8"}, "vpcCidr: 10.0.0.0/8 is wider than this cloud takes"),
    ("aws", {f"{P}vpcCidr": "10.0.0.0/25"}, "vpcCidr: 10.0.0.0/25 is too small"),
    # Ports the unprivileged services cannot bind.
    (
        "aws",
        {f"{P}rpcPort": 22},
        "rpcPort: 22 is outside 1024-65535; the services run unprivileged",
    ),
    (
        "gcp",
        {f"{P}serverPort": 80},
        "serverPort: 80 is outside 1024-65535; the services run unprivileged",
    ),
    ("azure", {f"{P}serverPort": 70000}, "serverPort: 70000 is outside 1024-65535"),
    # Disks outside the provider's limits.
    ("aws", {f"{P}mainDiskGb": 70_000}, "mainDiskGb: 70000 GB is outside what aws takes"),
    ("gcp", {f"{P}workerDiskGb": 2}, "workerDiskGb: 2 GB is outside what gcp takes"),
    ("azure", {f"{P}mainDiskGb": 5000}, "mainDiskGb: 5000 GB is outside what azure takes"),
    ("aws", {f"{P}diskThroughputMibps": 2000}, "diskThroughputMibps: 2000 is outside aws's"),
    ("gcp", {f"{P}diskThroughputMibps": 100}, "diskThroughputMibps: 100 is outside gcp's"),
    # Settings a cloud cannot honour.
    ("aws", {f"{P}sshPublicKey": "ssh-ed25519 AAAA me"}, "sshPublicKey: aws does not take"),
    ("gcp", {f"{P}sshPublicKey": "ssh-ed25519 AAAA me"}, "sshPublicKey: gcp does not take"),
    ("azure", {f"{P}diskThroughputMibps": 500}, "diskThroughputMibps: azure does not take"),
    ("aws", {f"{P}bastion": True}, "bastion: aws does not take"),
    ("gcp", {f"{P}encryptionAtHost": True}, "encryptionAtHost: gcp does not take"),
    ("azure", {f"{P}bastion": "yes"}, "bastion: must be true or false"),
    ("aws", {f"{P}flowLogs": "off"}, "flowLogs: must be true or false"),
    # Images.
    ("aws", {f"{P}image": "ubuntu-24.04"}, "image: 'ubuntu-24.04' is not an arm64 Ubuntu"),
    ("gcp", {f"{P}image": "ubuntu-2404-lts-arm64"}, "image: 'ubuntu-2404-lts-arm64' is not"),
    ("azure", {f"{P}image": "latest"}, "image: 'latest' is not a version of Canonical"),
    # Tags and labels.
    ("aws", {f"{P}tags": {"aws:owner": "me"}}, "tags: tag 'aws:owner': the aws: prefix"),
    ("aws", {f"{P}tags": tags(47)}, "tags: 47 tags; AWS allows 50"),
    ("aws", {f"{P}tags": {"team#1": "ml"}}, "tags: tag 'team#1'='ml': AWS (IAM) tags"),
    ("aws", {f"{P}tags": {"Project": "x"}}, "tags: tag 'Project' collides"),
    ("aws", {f"{P}tags": {"Name": "x"}}, "tags: 'Name' is set by the program"),
    ("aws", {f"{P}tags": {"Team": "a", "team": "b"}}, "tags: two tag names differ only in case"),
    ("aws", {f"{P}tags": {"k" * 129: "v"}}, "names hold 1-128 characters"),
    ("gcp", {f"{P}tags": tags(62)}, "tags: 62 labels; GCP allows 64"),
    ("gcp", {f"{P}tags": {"Team": "ml"}}, "label key 'Team' must start with a lowercase"),
    ("gcp", {f"{P}tags": {"stack": "mine"}}, "tags: 'stack' is set by the program"),
    ("azure", {f"{P}tags": {"microsoftOwner": "me"}}, "tags: tag 'microsoftOwner': names"),
    ("azure", {f"{P}tags": {"Windows-team": "me"}}, "are reserved"),
    ("azure", {f"{P}tags": tags(48)}, "tags: 48 tags; Azure allows 50"),
    ("azure", {f"{P}tags": {"cost/center": "42"}}, "tag 'cost/center': Azure tag names"),
    ("azure", {f"{P}tags": {"team": 42}}, "tags: must be a map of tag names to string values"),
    # Regions that are not regions: the error names the provider's region key.
    ("aws", {"aws:region": "US East"}, "aws:region: 'US East' is not a aws region name"),
    ("aws", {"aws:region": "us-east-1a"}, "aws:region: 'us-east-1a' is not"),
    ("gcp", {"gcp:region": "us-central1-a"}, "gcp:region: 'us-central1-a' is not"),
    ("azure", {"azure-native:location": "East US"}, "azure-native:location: 'East US' is not"),
    ("aws", {"aws:region": "ap-south-2"}, "aws:region: the instance catalog has no aws types"),
]


@pytest.mark.parametrize(
    ("cloud", "overrides", "message"), BAD, ids=[f"{c}-{m[:40]}" for c, _, m in BAD]
)
def test_a_bad_setting_is_refused_before_anything_is_created(
    cloud: str, overrides: dict[str, Any], message: str
) -> None:
    mocks = RecordingMocks()
    with pytest.raises(pulumi.RunError) as error:
        deploy(STACK[cloud], overrides, mocks=mocks)
    text = str(error.value)
    assert message in text
    assert "Traceback" not in text
    assert mocks.resources == [], "nothing may be created"


GOOD: list[tuple[str, dict[str, Any]]] = [
    ("aws", {f"{P}apiAllowedCidrs": ["10.0.0.0/8", "100.64.0.0/10", "198.51.100.0/24"]}),
    ("gcp", {f"{P}apiAllowedCidrs": ["203.0.113.7/32"]}),
    ("aws", with_urls("aws", ["http://h.example.com/m.gguf"], ["0" * 64])),
    ("aws", with_urls("aws", ["https://10.1.2.3:8443/m.gguf"])),  # a mirror inside the network
    ("aws", {f"{P}rpcPort": 1024, f"{P}serverPort": 65535}),
    ("azure", {f"{P}tags": {"cost-center": "42", "Owner": "ml team"}}),
    ("aws", {f"{P}tags": {"cost-center": "42", "owner": "ml team@corp"}}),
    ("azure", {f"{P}vpcCidr": "172.16.0.0/12"}),
]


@pytest.mark.parametrize(("cloud", "overrides"), GOOD)
def test_settings_near_the_limits_are_accepted(cloud: str, overrides: dict[str, Any]) -> None:
    d = deploy(STACK[cloud], overrides)
    assert d.resources


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
