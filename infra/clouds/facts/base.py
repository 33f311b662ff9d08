"""What every cloud's facts module provides: the limits and rules the config check enforces.

Facts modules import no provider SDK, so settings are checked (and refused) before a program
touches a cloud, and the planner and the tests can read them cheaply.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

# Tag keys the program sets on every resource; a user tag of the same name would be overwritten.
PROGRAM_TAGS = ("project", "stack", "role")
# Settings that only some clouds honour (see CloudFacts.refuses).
OPTIONAL_SETTINGS = ("sshPublicKey", "bastion", "encryptionAtHost", "diskThroughputMibps")


@dataclass(frozen=True)
class Range:
    low: int
    high: int

    def __contains__(self, value: object) -> bool:
        return isinstance(value, int) and self.low <= value <= self.high

    def __str__(self) -> str:
        return f"{self.low:,}-{self.high:,}"


@dataclass(frozen=True)
class CloudFacts:
    name: str
    region_key: str  # the provider's own config key for the region
    region_pattern: re.Pattern[str]
    region_example: str
    arm_pattern: re.Pattern[str]
    arm_examples: str  # for the error a user sees when they give an x86 type
    boot_disk_gb: Range
    # Provisioned boot-disk throughput, or None when the disk type has no such knob.
    disk_throughput_mibps: Range | None
    vpc_widest_prefix: int  # the widest network the provider takes for the cluster's range
    tag_problem: Callable[[Mapping[str, str]], str | None]
    tag_word: str  # "tag" or "label"
    image_pattern: re.Pattern[str]
    image_example: str
    image_meaning: str
    # Settings of OPTIONAL_SETTINGS this cloud cannot honour, each with what it does instead;
    # the config check refuses them rather than dropping them.
    refuses: Mapping[str, str] = field(default_factory=dict)
    # What this cloud cannot do, in words (capability -> what happens instead).
    limitations: Mapping[str, str] = field(default_factory=dict)

    def is_arm(self, instance_type: str) -> bool:
        """Whether a type name is an Arm type, from the provider's naming rules."""
        return self.arm_pattern.fullmatch(instance_type) is not None


def reserved_tag_problem(tags: Mapping[str, str], extra: tuple[str, ...] = ()) -> str | None:
    """A user tag that the program sets itself."""
    for key in tags:
        if key in PROGRAM_TAGS + extra:
            names = ", ".join(PROGRAM_TAGS + extra)
            return f"{key!r} is set by the program on every resource ({names}); choose another name"
    return None


# How long flow logs are kept, on every cloud.
FLOW_LOG_RETENTION_DAYS = 30
