"""Each cloud's facts (limits, naming rules, capabilities), by name. No provider SDK here."""

from __future__ import annotations

from infra.clouds.facts import aws, azure, gcp
from infra.clouds.facts.base import CloudFacts

FACTS: dict[str, CloudFacts] = {facts.name: facts for facts in (aws.FACTS, gcp.FACTS, azure.FACTS)}

__all__ = ["FACTS", "CloudFacts"]
