"""The resources every shipped stack registers, by type, name and parent, as recorded: a deployed
stack's next ``pulumi up`` finds each of its resources under the same URN, so moving code
replaces nothing. Every case of the conformance matrix is checked.

An intended change of what a stack registers rewrites the record:
``LRC_RECORD_URNS=1 uv run pytest tests/stack/test_urns.py``; the diff shows what changed.
"""

from __future__ import annotations

import json
import os

from tests.conftest import REPO
from tests.pulumi_mocks import Deployment
from tests.stack.test_conformance import CASES, LARGEST_CASES, run

RECORD = REPO / "tests" / "fixtures" / "urns.json"


def registered(d: Deployment) -> list[str]:
    """``type name < parent type parent name`` of each resource, in order of name."""
    found = []
    for r in d.resources:
        parent = d.options[r.typ, r.name].parent
        under = f" < {parent.pulumi_resource_type} {parent.pulumi_resource_name}" if parent else ""
        found.append(f"{r.typ} {r.name}{under}")
    return sorted(found)


def all_cases() -> dict[str, list[str]]:
    return {
        case.id: registered(run(*case.values))  # type: ignore[misc]
        for case in [*CASES, *LARGEST_CASES]
    }


def test_every_stack_registers_what_it_did() -> None:
    found = all_cases()
    if os.environ.get("LRC_RECORD_URNS"):
        RECORD.write_text(json.dumps(found, indent=0, sort_keys=True) + "\n")
    recorded = json.loads(RECORD.read_text())
    assert sorted(found) == sorted(recorded), "the matrix changed: record it again"
    for case, names in found.items():
        missing = sorted(set(recorded[case]) - set(names))
        added = sorted(set(names) - set(recorded[case]))
        assert not missing and not added, (case, missing, added)
