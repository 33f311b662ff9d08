"""Each cloud's facts (limits, naming rules, capabilities) and its API's input rules for every
resource the program creates, by name. No provider SDK here."""

from __future__ import annotations

from infra.clouds import (
    aws,
    aws_rules,
    azure,
    azure_rules,
    eks_rules,
    gcp,
    gcp_rules,
    kubernetes_rules,
    random_rules,
)
from infra.clouds.base import CloudFacts, UserDataChannel
from infra.clouds.rules import ResourceRules

FACTS: dict[str, CloudFacts] = {facts.name: facts for facts in (aws.FACTS, gcp.FACTS, azure.FACTS)}
# Every resource type the program may create, on any cloud, with its rules.
RESOURCE_RULES: dict[str, ResourceRules] = {
    **aws_rules.RULES,
    **gcp_rules.RULES,
    **azure_rules.RULES,
    **random_rules.RULES,
    **eks_rules.RULES,
    **kubernetes_rules.RULES,
}

__all__ = ["FACTS", "RESOURCE_RULES", "CloudFacts", "ResourceRules", "UserDataChannel"]
