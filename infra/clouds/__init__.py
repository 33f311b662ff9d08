"""Each cloud's facts: limits, naming rules, capabilities. No provider SDK here. (The clouds'
API input rules, a test oracle, are in ``infra.conformance``, which this package never loads.)"""

from __future__ import annotations

from infra.clouds import aws, azure, gcp
from infra.clouds.base import CloudFacts, UserDataChannel

FACTS: dict[str, CloudFacts] = {facts.name: facts for facts in (aws.FACTS, gcp.FACTS, azure.FACTS)}

__all__ = ["FACTS", "CloudFacts", "UserDataChannel"]
