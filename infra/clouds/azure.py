"""Azure facts: Cobalt 100 naming, managed-disk limits, tag rules, regions."""

from __future__ import annotations

import re
from collections.abc import Mapping

from infra.clouds.base import (
    CloudFacts,
    DiskModel,
    NatModel,
    Range,
    UserDataChannel,
    reserved_tag_problem,
)

# https://learn.microsoft.com/azure/azure-resource-manager/management/tag-resources#limitations
# 50 tags per resource; names at most 512 characters (128 on storage accounts, which the flow
# logs use), values at most 256; names hold none of < > % & \ ? /; the prefixes microsoft,
# azure and windows are reserved.
MAX_TAGS = 50
MAX_TAG_NAME = 128
_FORBIDDEN = set("<>%&\\?/")
_RESERVED_PREFIXES = ("microsoft", "azure", "windows")


def tag_problem(tags: Mapping[str, str]) -> str | None:
    """Why these tags break Azure's rules, or None."""
    reserved = reserved_tag_problem(tags)
    if reserved:
        return reserved
    if len(tags) > MAX_TAGS - 3:
        return f"{len(tags)} tags; Azure allows {MAX_TAGS} per resource and the program sets 3"
    for key, value in tags.items():
        if key.lower().startswith(_RESERVED_PREFIXES):
            return f"tag {key!r}: names starting with {', '.join(_RESERVED_PREFIXES)} are reserved"
        if not 1 <= len(key) <= MAX_TAG_NAME or len(value) > 256 or set(key) & _FORBIDDEN:
            return (
                f"tag {key!r}: Azure tag names hold 1-{MAX_TAG_NAME} characters and none of "
                "< > % & \\ ? /, and values at most 256 characters"
            )
    return None


FACTS = CloudFacts(
    name="azure",
    region_key="azure-native:location",
    # eastus, westeurope, eastus2, southcentralus (the names, not "East US")
    region_pattern=re.compile(r"[a-z]+[a-z0-9]*"),
    region_example="eastus",
    # Cobalt 100 sizes carry a "p" among the feature letters: Standard_D64ps_v6.
    arm_pattern=re.compile(r"Standard_[A-Z]+\d+[a-z]*p[a-z]*_v\d+"),
    arm_examples="Cobalt 100: Standard_D64ps_v6, Standard_E64ps_v6, Standard_D64pls_v6",
    # OS disks hold at most 4,095 GiB:
    # https://learn.microsoft.com/azure/virtual-machines/managed-disks-overview#os-disk
    boot_disk_gb=Range(30, 4_095),
    disk_throughput_mibps=None,  # Premium SSD throughput follows the disk size
    vpc_widest_prefix=8,
    tag_problem=tag_problem,
    tag_word="tag",
    image_pattern=re.compile(r"\d+\.\d+\.\d{6,12}"),
    image_example="24.04.202510010",
    # https://learn.microsoft.com/azure/virtual-machines/custom-data: at most 64 KB of base64;
    # cloud-init unpacks gzip inside it.
    # Run Command (az vm run-command invoke) returns the last 4,096 bytes of the output.
    command_output_chars=4_096,
    user_data=UserDataChannel("custom_data", 65_535, base64=True, gzip_field="custom_data"),
    # Premium SSD throughput by size tier (GiB, MB/s): Azure's managed disk sizes table.
    disk=DiskModel(
        "Premium SSD",
        size_tiers_mbps=(
            (128, 100),
            (256, 125),
            (512, 150),
            (1024, 200),
            (2048, 250),
            (4096, 250),
            (8192, 500),
            (16384, 750),
            (32767, 900),
        ),
    ),
    nat=NatModel("NAT gateway"),
    balancer_name="internal Standard Load Balancer",
    # 168.63.129.16: the platform's wire server (DNS, health probes, the VM agent).
    metadata_hosts=frozenset({"metadata.azure.com"}),
    metadata_addresses=frozenset({"168.63.129.16"}),
    chart_colour="#0078d4",
    # Blob Storage as az://ACCOUNT/CONTAINER/KEY (infra.network_rules), read with the main node's
    # managed identity through the subnet's service endpoint.
    model_store_scheme="az://",
    image_meaning="a version of Canonical:ubuntu-24_04-lts:server-arm64",
    refuses={"diskThroughputMibps": "Premium SSD throughput follows the disk's size"},
    limitations={
        "prices": "no Cobalt 100 list price was found in any checked source; hourlyCostUsd is "
        "null until the catalog has one",
        "encryption at host": "off unless encryptionAtHost is set: Microsoft does not list it "
        "for Cobalt 100 sizes, and it needs the subscription's EncryptionAtHost feature",
    },
)
