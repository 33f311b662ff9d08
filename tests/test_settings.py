"""Bad settings, on every cloud, are refused before anything is created: the error names the
setting (the provider's own key for the region) and says how to fix it. One row per way a
setting can be wrong, checked against the config check itself; one deployment per cloud shows
that the program stops there, with no resource registered.
"""

from __future__ import annotations

import random
from typing import Any

import pulumi
import pytest

from infra import network_rules
from infra.clouds import FACTS
from infra.clouds.base import OPTIONAL_SETTINGS
from tests.pulumi_mocks import RecordingMocks, deploy, refusal, refused, stack_config

P = "llama-rpc-cluster:"
KMS_KEY = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
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


# (cloud, the setting the error names, overrides, what the error says)
BAD: list[tuple[str, str, dict[str, Any], str]] = [
    # Boot data the renderer refuses, caught in the config step.
    ("aws", "model.urls", with_urls("aws", ["https://h.example.com/it's.gguf"]), "MODEL_URLS="),
    ("gcp", "model.urls", with_urls("gcp", ["https://h.example.com/a\\b.gguf"]), "MODEL_URLS="),
    ("aws", "model.urls", with_urls("aws", many_urls(400)), "the aws user data is"),
    ("azure", "model.urls", with_urls("azure", many_urls(1500)), "the azure user data is"),
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
            ("aws", "https://[fd00:ec2::254]/m.gguf"),
            ("aws", "https://127.0.0.1:8000/m.gguf"),
            ("aws", "https://localhost/m.gguf"),
            ("aws", "https://[::1]/m.gguf"),
            ("aws", "https://2852039166/m.gguf"),  # 169.254.169.254
            ("aws", "https://0x7f000001/m.gguf"),  # 127.0.0.1
            ("aws", "https://[::ffff:169.254.169.254]/m.gguf"),
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
    ("aws", "diskThroughputMibps", {f"{P}diskThroughputMibps": 2000}, "2000 is outside aws's"),
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
    ("aws", "image", {f"{P}image": "ubuntu-24.04"}, "'ubuntu-24.04' is not an arm64 Ubuntu"),
    ("gcp", "image", {f"{P}image": "ubuntu-2404-lts-arm64"}, "'ubuntu-2404-lts-arm64' is not"),
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
