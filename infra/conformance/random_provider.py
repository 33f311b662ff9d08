"""The input rules of the resources the program creates outside a cloud: the random provider's
password, which generates a stack's API key, and its string, which makes an Azure Key Vault's
globally unique name (both kept in the state)."""

from __future__ import annotations

from infra.conformance.rules import Requires, ResourceRules

RANDOM_DOCS = "https://registry.terraform.io/providers/hashicorp/random/latest/docs/resources/"
PASSWORD_DOCS = RANDOM_DOCS + "password"
STRING_DOCS = RANDOM_DOCS + "string"
# Every input of a random resource makes a new value.
REPLACED_ON = (
    "length", "special", "upper", "lower", "numeric", "minUpper", "minLower", "minNumeric",
    "minSpecial", "overrideSpecial", "keepers",
)  # fmt: skip


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
            replaced_on=REPLACED_ON,
            source=PASSWORD_DOCS,
        ),
        ResourceRules(
            "random:index/randomString:RandomString",
            (Requires(lambda r, _: _length_problem(dict(r.inputs)), STRING_DOCS),),
            replaced_on=REPLACED_ON,
            source=STRING_DOCS,
        ),
    )
}
