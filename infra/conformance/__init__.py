"""The input rules each cloud's API (and the random and Kubernetes providers) enforce on every
resource the program creates, by type: the oracle the conformance tests hold the program's
registered resources to, since Pulumi's mocks accept any input. The product never loads it; it
reads the clouds' facts, and no provider SDK."""

from __future__ import annotations

from infra.conformance import aws, azure, eks, gcp, kubernetes, random_provider
from infra.conformance.rules import ResourceRules

# Every resource type the program may create, on any cloud, with its rules.
RESOURCE_RULES: dict[str, ResourceRules] = {
    **aws.RULES,
    **gcp.RULES,
    **azure.RULES,
    **random_provider.RULES,
    **eks.RULES,
    **kubernetes.RULES,
}

__all__ = ["RESOURCE_RULES", "ResourceRules"]
