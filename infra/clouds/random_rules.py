"""The input rules of the one resource the program creates outside a cloud: the random
provider's password, which generates a stack's API key (and keeps it in the state)."""

from __future__ import annotations

from infra.clouds.rules import Requires, ResourceRules

RANDOM_DOCS = "https://registry.terraform.io/providers/hashicorp/random/latest/docs/resources/"
PASSWORD_DOCS = RANDOM_DOCS + "password"


def _length_problem(inputs: dict[str, object]) -> str | None:
    length = inputs.get("length")
    least = sum(int(str(inputs.get(k, 0) or 0)) for k in ("minUpper", "minLower", "minNumeric"))
    # Numbers reach a provider as JSON numbers (48.0): a whole one is a length.
    if not isinstance(length, int | float) or length != int(length) or length < max(1, least):
        return f"length {length!r}: at least 1, and at least the minimums it asks for"
    return None


RULES = {
    rules.type: rules
    for rules in (
        ResourceRules(
            "random:index/randomPassword:RandomPassword",
            (Requires(lambda r, _: _length_problem(dict(r.inputs)), PASSWORD_DOCS),),
            # Every input of a random resource makes a new value: a new key.
            replaced_on=(
                "length",
                "special",
                "upper",
                "lower",
                "numeric",
                "minUpper",
                "minLower",
                "minNumeric",
                "minSpecial",
                "overrideSpecial",
                "keepers",
            ),
            source=PASSWORD_DOCS,
        ),
    )
}
