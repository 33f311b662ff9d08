"""Replicas or one bigger group: for a plan's target, the best set of several serving groups
against the best single group on each provider, which costs less per hour and per million
tokens, and why, in one line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from infra import catalog
from infra.core import sizing
from infra.planner import search
from infra.planner.base import Option, Plan, Target
from infra.planner.target import ranked_first

REPLICAS, ONE_GROUP, SAME, UNKNOWN = "replicas", "one group", "the same", "unknown"


@dataclass(frozen=True)
class Verdict:
    """Replicas against one bigger group, for one provider, both meeting the target."""

    provider: str
    replicas: Option | None  # the best set of more than one group
    one_group: Option | None  # the best single group
    per_hour: str  # REPLICAS, ONE_GROUP, SAME or UNKNOWN
    per_mtok: str
    why: str

    def line(self) -> str:
        def said(option: Option | None) -> str:
            if option is None:
                return "none meets the target"
            price = "unknown" if option.hourly_usd is None else f"${option.hourly_usd:,.2f}"
            price += "+" if option.price_is_partial else ""
            per_mtok = option.usd_per_million_tokens
            tps = f"{option.tps:,.1f} tok/s" if option.tps is not None else "speed unknown"
            slots = f"{option.slots} slot{'s' if option.slots > 1 else ''}"
            return (
                f"{option.shape}, {slots}{' each' if option.replicas > 1 else ''}, "
                f"{price}/h, " + ("n/a" if per_mtok is None else f"{per_mtok:,.2f}")
                + f" $/Mtok, {tps}"
            )  # fmt: skip

        return (
            f"replicas: {said(self.replicas)}; one group: {said(self.one_group)}. "
            f"Cheaper per hour: {self.per_hour}; per Mtok: {self.per_mtok}. Why: {self.why}"
        )


def _cheaper(replicas: float | None, one: float | None) -> str:
    if replicas is None or one is None:
        return UNKNOWN
    if math.isclose(replicas, one, rel_tol=1e-9):
        return SAME
    return REPLICAS if replicas < one else ONE_GROUP


def verdict(plan: Plan, provider: str) -> Verdict | None:
    """Whether replicas or one bigger group meets the plan's target for less on ``provider``,
    and why; None without a target or without an option there."""
    target = plan.target
    if target is None:
        return None
    pool = [o for o in (*plan.options, *plan.alternatives) if o.provider == provider]
    if not pool:
        return None
    replicas = ranked_first([o for o in pool if o.replicas > 1], plan.sort)
    one = ranked_first([o for o in pool if o.replicas == 1], plan.sort)
    if replicas is None or one is None:  # only one kind meets the target: it is the cheaper
        per_hour = per_mtok = REPLICAS if one is None else ONE_GROUP
    else:
        per_hour = _cheaper(replicas.hourly_usd, one.hourly_usd)
        per_mtok = _cheaper(replicas.usd_per_million_tokens, one.usd_per_million_tokens)
    why = _why(plan, target, replicas, one, (per_hour, per_mtok))
    return Verdict(provider, replicas, one, per_hour, per_mtok, why)


def _why(
    plan: Plan,
    target: Target,
    replicas: Option | None,
    one: Option | None,
    cheaper: tuple[str, str],
) -> str:
    per_hour, per_mtok = cheaper
    if one is None:
        if target.streams is not None and target.min_stream_tps is None:
            return (
                f"one group cannot serve {target.streams} streams at once: its slots are capped "
                f"by --slots or the stack file, at {sizing.MAX_SLOTS}, and by the KV cache each "
                "takes on every node"
            )
        return (
            "no single group is fast enough: its nodes decode one after another, so more nodes "
            "add memory, not speed; replicas decode side by side"
        )
    if replicas is None:
        return f"one group of {one.group_shape} meets it, and no set of replicas does"
    if per_hour == UNKNOWN:
        return "a price is unknown, so the two cannot be compared per hour"
    ours, theirs = replicas.cost.instances or 0.0, one.cost.instances or 0.0
    spend = f"${ours:,.2f}/h of instances against ${theirs:,.2f}"
    if per_hour == REPLICAS:
        held = search.fewest_nodes(plan.model, plan.context, 1, one.instance)
        if held is not None and one.count > held:
            cause = (
                f"one group needs {one.count} nodes for the KV cache of its {one.slots} slots "
                f"where the model alone needs {held}"
            )
        else:
            cause = (
                f"one group must be {one.group_shape} to be fast enough (its nodes decode one "
                "after another, and a node's compute grows slower than its cores)"
            )
        text = (
            f"{cause}; {replicas.replicas} groups of {replicas.group_shape} decode side by side "
            f"on {spend}, and cost less even with the balancer"
        )
    elif ours > theirs:
        text = (
            f"one group's {one.slots} slots share each read of the weights: ${theirs:,.2f}/h of "
            f"instances serve what the replicas need ${ours:,.2f}/h for, and they also pay the "
            "balancer"
        )
    else:
        text = (
            f"the replicas' instances cost no more ({spend}), but every group adds a disk with "
            "the model on it, and the set a balancer"
        )
    if per_mtok not in (per_hour, SAME, UNKNOWN) and replicas.tps and one.tps:
        faster, slower = (replicas, one) if per_mtok == REPLICAS else (one, replicas)
        who = "the replicas generate" if faster is replicas else "one group generates"
        text += (
            f"; per token the other way: {who} {faster.tps:,.1f} tok/s against {slower.tps:,.1f}"
        )
    return text


def verdicts(plan: Plan) -> list[Verdict]:
    """Each provider's verdict, in provider order."""
    found = (verdict(plan, provider) for provider in catalog.providers())
    return [v for v in found if v is not None]


def to_json(option: Option | None) -> dict[str, Any] | None:
    """An option of a verdict, in brief."""
    if option is None:
        return None
    return {
        "shape": option.shape,
        "instanceType": option.instance.name,
        "replicas": option.replicas,
        "nodesPerGroup": option.count,
        "slots": option.slots,
        "hourlyUsd": option.hourly_usd,
        "pricePartial": option.price_is_partial,
        "usdPerMillionTokens": option.usd_per_million_tokens,
        "aggregateTps": None if option.tps is None else round(option.tps, 3),
        "streamTps": None if option.stream_tps is None else round(option.stream_tps, 3),
    }


def verdict_json(found: Verdict) -> dict[str, Any]:
    return {
        "replicas": to_json(found.replicas),
        "oneGroup": to_json(found.one_group),
        "cheaperPerHour": found.per_hour,
        "cheaperPerMtok": found.per_mtok,
        "why": found.why,
    }
