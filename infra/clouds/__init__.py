"""Each cloud's facts (limits, naming rules, capabilities), by name. No provider SDK here."""

from __future__ import annotations

from infra.clouds import aws, azure, gcp
from infra.clouds.base import CloudFacts, UserDataChannel

FACTS: dict[str, CloudFacts] = {facts.name: facts for facts in (aws.FACTS, gcp.FACTS, azure.FACTS)}

__all__ = ["FACTS", "CloudFacts", "UserDataChannel"]
