"""The machines' node image: what goes into it, chosen by pure functions (nothing is built here;
the machine tier boots it)."""

from __future__ import annotations

import base64
import gzip

import pytest

from infra.boot import NodeBoot, cloud_config, deliver, render
from infra.boot.deliver import for_cloud
from infra.local import image


@pytest.mark.parametrize("role", ["main", "worker", "main, staged"])
def test_the_image_holds_every_package_the_cloud_config_lists(role: str) -> None:
    """So that `packages` succeeds offline, inside a machine that has no way out."""
    boot = NodeBoot(role="worker", node_ip="10.0.0.11", rpc_allowed_sources=("10.0.0.10/32",))
    if role == "main":
        boot = NodeBoot(role="main", node_ip="10.0.0.10", model_urls=("https://h/m.gguf",))
    if role == "main, staged":
        boot = NodeBoot(
            role="main", node_ip="10.0.0.10", model_urls=("s3://b/m.gguf",),
            model_store_region="us-east-1",
        )  # fmt: skip
    assert set(cloud_config(boot)["packages"]) <= set(image.packages())
    assert {"systemd", "cloud-init"} <= set(image.packages())


def test_the_image_is_named_by_its_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    before = image.image_key()
    monkeypatch.setattr(image, "BASE_PACKAGES", (*image.BASE_PACKAGES, "htop"))
    assert image.image_key() != before


def test_apt_in_the_image_reads_only_its_own_repository() -> None:
    sources = image.IMAGE_FILES["etc/apt/sources.list"]
    assert sources == f"deb [trusted=yes] file:{image.OFFLINE_REPOSITORY} ./\n"


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_each_delivery_is_received_as_its_datasource_hands_it_on(cloud: str) -> None:
    """AWS: the gzip bytes (cloud-init unpacks them); GCP: the text; Azure: base64 decoded,
    gzip bytes only when the text's base64 would be over its limit."""
    boot = NodeBoot(role="main", node_ip="10.0.0.10", model_urls=("https://h/m.gguf",))
    user_data = render(for_cloud(boot, cloud, "local", "/llama-rpc-cluster/t/boot/main"))
    delivery = deliver(user_data, cloud)
    received = delivery.received()
    if delivery.gzipped:
        assert received[:2] == b"\x1f\x8b"
        received = gzip.decompress(received)
    assert received.decode() == user_data
    over_azures_limit = len(base64.b64encode(user_data.encode())) > 65_535
    assert delivery.gzipped == {"aws": True, "gcp": False, "azure": over_azures_limit}[cloud]
