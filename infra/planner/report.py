"""How a plan is shown: a table, JSON, and the settings and header of a stack file for the chosen
option (the chart: ``infra.planner.chart``)."""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence
from typing import Any

from infra.core import perf
from infra.core.units import duration, money
from infra.models import PRESETS, Model
from infra.planner import local_load, serve, target, timelines, verdict
from infra.planner.base import Option, Plan
from infra.planner.engines import EngineLine, engine_lines
from infra.planner.search import fewest_nodes
from infra.stack.settings import DEFAULT_MAX_HOURLY_USD

GIB = 1024**3

SORT_MEANINGS = {
    "usd-per-mtok": "by $ per million generated tokens; rows without a predicted speed or a "
    "price cannot be ranked so and follow, by $/h; a partial price follows a full one",
    "usd-per-hour": "by $ per hour; a partial price follows a full one, an unknown price "
    "follows both",
    "tps": "by predicted decode tokens/s; rows without a predicted speed follow",
}
TARGET_SORT_MEANINGS = {
    "usd-per-mtok": "by $ per million tokens at the target's load",
    "usd-per-hour": "by $ per hour: the cheapest set that meets the target first",
    "tps": "by tokens/s at the target's load, all streams together",
}

REGION_WIDTH = 11  # us-central1: the home regions' longest


def model_json(model: Model) -> dict[str, Any]:
    return {
        "name": model.name,
        "source": model.source,
        "sizeGb": round(model.size_gb, 3),
        "layers": model.layers,
        "kvBytesPerToken": model.kv_bytes_per_token,
        "contextLength": model.context_length,
        "activeGb": round(model.active_bytes / 1e9, 3) if model.active_bytes else None,
        "parameters": model.parameters,
        "activeParameters": model.active_parameters,
    }


def option_json(option: Option) -> dict[str, Any]:
    instance = option.instance
    return {
        "provider": option.provider,
        "region": instance.region,
        "instanceType": instance.name,
        "mainInstanceType": option.main_instance.name,
        "cpu": instance.cpu_family,
        "count": option.count,
        "workers": option.workers,
        "rpcNeeded": option.needs_rpc,
        # Serving groups of ``count`` nodes each, behind a private balancer when more than one;
        # every figure of money and speed below is the whole set's.
        "replicas": option.replicas,
        "nodes": option.nodes,
        "slots": option.slots,
        "vcpus": instance.vcpus,
        "memoryGib": instance.memory_gib,
        "perNodeNeedGib": round(option.need_bytes / GIB, 2),
        "perNodeUsableGib": round(option.usable_bytes / GIB, 2),
        "fits": option.fits,
        "placement": option.placement.to_json(),
        "hourlyUsd": option.hourly_usd,
        "hourlyUsdParts": {
            "instances": option.cost.instances,
            "nat": option.cost.nat,
            "disks": option.cost.disks,
            "balancer": option.cost.balancer,
            "controlPlane": option.cost.control_plane,
        },
        "platform": option.platform,
        # With every instance stopped, the balancer node's too: the disks and the NAT go on.
        "stoppedHourlyUsd": option.cost.stopped,
        "groupHourlyUsd": option.group_cost.total,
        "unpriced": list(option.cost.unpriced),
        "pricePartial": option.price_is_partial,
        "downloadUsd": option.download_usd,
        # Spot: the instances alone at their spot price, its own dated figure, never in hourlyUsd.
        "spotInstancesHourlyUsd": option.spot_instances_usd,
        "spotPriceDate": option.spot_price_date or None,
        "predictedDecodeTps": None if option.decode_tps is None else round(option.decode_tps, 3),
        # One group computing a prompt of promptTokens: its rate and the time to the first token
        # (null where a compute rate is unknown); workersRepack: the build's workers repack.
        **prompt_json(option),
        **load_json(option),
        "usdPerMillionTokens": option.usd_per_million_tokens,
        "speedUnknownReason": option.speed_unknown_reason(),
        "speedNote": perf.extrapolation_note(option.instance) if option.decode_tps else None,
        # The internet path: what a stack with https model URLs does.
        "predictedSecondsToServe": round(option.serve["internet"].total_seconds),
        "timeToServe": {path: timeline.to_json() for path, timeline in option.serve.items()},
        # After a lost worker's RPC server, by how the group loads again (none on one node).
        "timeToHeal": {path: timeline.to_json() for path, timeline in option.heal.items()},
        # The worker-local timelines against the design's goals (which phase binds, by how much).
        "serveGoals": timelines.goals_json(option),
        "priceSource": instance.price_source,
        "priceDate": instance.price_date or None,
        "costSources": list(option.cost.sources),
    }


def prompt_json(option: Option) -> dict[str, Any]:
    found = option.prompt
    return {
        "promptTokens": None if found is None else found.tokens,
        "predictedPromptTps": None if found is None else round(found.tps, 2),
        "predictedFirstTokenSeconds": None if found is None else round(found.seconds, 2),
        "workersRepack": option.workers_repack,
    }


def first_token(seconds: float) -> str:
    """Tenths of a second below 10 s, whole seconds below a minute, then minutes."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    return duration(seconds)


def _first_token(option: Option) -> str:
    return "n/a" if option.prompt is None or not option.fits else first_token(option.prompt.seconds)


def load_json(option: Option) -> dict[str, Any]:
    """The set at its target's load (every stream of every group): None without a target or a
    speed. ``predictedDecodeTps`` stays one stream alone on one group."""
    load = option.load
    return {
        "streams": None if load is None else load.streams,
        "streamsPerGroup": None if load is None else [g.streams for g in load.groups],
        "aggregateTps": None if load is None else round(load.aggregate_tps, 3),
        "streamTps": None if load is None else round(load.stream_tps, 3),
        "batchBound": None if load is None else load.bound,
    }


def assumptions(plan: Plan) -> dict[str, Any]:
    cal = perf.calibration()
    slots = f"{plan.slots} slot(s)" if plan.target is None else "each group's slots"
    found: dict[str, Any] = {
        "memory": (
            f"{slots} of {plan.context} tokens: every node holds the KV cache of "
            "its layers for every slot, its compute buffers and OS headroom; the layers are "
            "shared in proportion to each node's free memory, the main node included"
        ),
        "decode": (
            f"single stream at {int(plan.context * perf.KV_FILL_FRACTION)} tokens of context; "
            f"eta {cal.eta:.3f} and {cal.layer_overhead_seconds * 1e3:.3f} ms per layer "
            f"solved from the anchors, {cal.hop_seconds * 1e3:.2f} ms per RPC worker"
        ),
        "anchors": [f"{a.label}: {a.decode_tps} tok/s ({a.source})" for a in perf.ANCHORS],
        "memoryBandwidth": (
            "Graviton from its DDR5/DDR4 channels; Axion's is not published, so its effective "
            f"bandwidth is derived from one published run ({perf.AXION_ANCHOR.label}, "
            f"{perf.AXION_ANCHOR.decode_tps} tok/s); Cobalt 100's is not published either, so "
            "a measured STREAM figure stands for it (cpus.csv names its source): its speeds "
            "are conservative beside the others' peaks"
        ),
        "prompt": prompt_basis(plan),
        "sort": SORT_MEANINGS[plan.sort],
        "serve": (
            f"{serve.BOOT_SECONDS:.0f} s boot, then the llama.cpp build beside the download "
            f"(internet: a {plan.download_gbps:g} Gbit/s model host; staged: the provider's "
            "object store in the region), the sha256 check, and the load with the llama.cpp "
            "patch set: the main node's layers repacked on every core while every worker is "
            "sent its own at once; the main disk at its throughput, up to what the node "
            "reaches its disks at (catalog disks.csv); each phase in timeToServe names its basis"
        ),
        "serveLocal": (
            "staged-local: each node fetches a prebuilt llama.cpp and only its own layers' byte "
            "ranges from the object store onto its own disk, and loads them from there (the main "
            "node sends the workers keys, no weights); timeToHeal: after a lost worker's RPC "
            "server, the measured restart, then the main node sending every weight again "
            "(main-sends) or each node reloading its own slice (worker-local); serveGoals: "
            f"each against {local_load.SERVE_GOAL_SECONDS:.0f} s to serve and "
            f"{local_load.HEAL_GOAL_SECONDS:.0f} s to heal, naming the phase that binds"
        ),
        "cost": "on-demand instances, NAT for egress and disks, and with replicas every "
        "group's nodes behind one NAT and the private balancer's hourly price; a price the "
        "catalog lacks is named in `unpriced` and left out of hourlyUsd",
    }
    if any(o.kubernetes for o in plan.options):
        found["platform"] = (
            "kubernetes: the nodes as an EKS cluster's node groups, its control plane's hourly "
            "price added, no balancer node (HAProxy runs as pods), the model on each node's one "
            "disk (workers of the main node's type get its disk)"
        )
    if plan.target is not None:
        found["target"] = (
            f"{plan.target.describe()}: each option is the fewest replicas of a group that meet "
            "it (the group's slots chosen unless --slots or the stack says); tok/s and $/Mtok at "
            "the target's load (--streams: those streams; --aggregate-tps: every slot busy)"
        )
        found["throughput"] = target.batching_basis()
    return found


def prompt_basis(plan: Plan) -> str:
    """How the prompt rate and the time to first token (TTFT) are predicted, with sources."""
    tokens = next((o.prompt.tokens for o in plan.options if o.prompt), perf.PROMPT_TOKENS)
    repack = any(o.workers_repack for o in plan.options)
    return (
        f"TTFT: one group computing a {tokens:,}-token prompt (--prompt-tokens) in steps of "
        f"{perf.UBATCH_TOKENS}: each reads the weights once and adds every token's arithmetic "
        f"beyond the first at the node's compute rate, {perf.overlap():.0%} of the shorter of the "
        "two hidden under the other (perf.step); the rate repacked from "
        f"{perf.AXION_PROMPT.label} ({perf.AXION_PROMPT.source}), on "
        + ("RPC workers too (patch 0005)" if repack else "the main node only: RPC workers run "
           f"the plain kernels at 1/{perf.plain_slowdown():.1f} of it, solved from "
           f"{perf.RPC_PROMPT.label} ({perf.RPC_PROMPT.source})")
        + "; held to "
        + "; ".join(r.label for r in perf.PROMPT_RUNS if r.role == "asserted")
        + " and "
        + "; ".join(r.label for r in perf.BATCHED_RUNS)
        + f" ({perf.BATCHED_RUNS[0].source})"
    )  # fmt: skip


def to_json(plan: Plan) -> dict[str, Any]:
    return {
        "model": model_json(plan.model),
        "context": plan.context,
        "slots": plan.slots,
        "sort": plan.sort,
        "picks": {o.provider: plan.options.index(o) for o in plan.picks()},
        "options": [option_json(o) for o in plan.options],
        "target": None if plan.target is None else plan.target.to_json(),
        # Per provider: the best set of replicas against the best single group, both meeting
        # the target, which is cheaper per hour and per Mtok, and why.
        "replicasVerdict": {v.provider: verdict.verdict_json(v) for v in verdict.verdicts(plan)},
        "rejected": [
            {"provider": r.instance.provider, "instanceType": r.instance.name, "reason": r.reason}
            for r in plan.rejected
        ],
        "assumptions": assumptions(plan),
    }


def _serve_times(option: Option) -> str:
    return " / ".join(duration(option.serve[path].total_seconds) for path in serve.PATHS)


def _per_mtok(value: float) -> str:
    """Whole dollars, or cents below $10 (a shared set of streams can cost that little)."""
    return f"{value:,.0f}" if value >= 10 else f"{value:.2f}"


def _price(option: Option) -> str:
    # "+": the total leaves out a part the catalog cannot price (named in the notes).
    return money(option.hourly_usd) + ("+" if option.price_is_partial else "")


def _spot(option: Option) -> str:
    # The instances alone at spot prices, dated: never mixed into the on-demand $/h.
    if option.spot_instances_usd is None:
        return "-"
    return f"${option.spot_instances_usd:,.2f} ({option.spot_price_date})"


def notes(option: Option) -> list[str]:
    """What a reader must know to compare this row with the others."""
    found = []
    if option.price_is_partial:
        found.append(f"+ {', '.join(option.cost.unpriced)}: price unknown")
    elif option.hourly_usd is None:
        found.append("price unknown")
    reason = option.speed_unknown_reason()
    if reason:
        found.append(reason)
    elif extrapolated := perf.extrapolation_note(option.instance):
        found.append(extrapolated)
    if not option.fits:
        found.append("DOES NOT FIT")
    return found


def _unranked(plan: Plan, option: Option) -> str | None:
    """Why a row sits below rows it may beat: it cannot be ranked on the plan's sort."""
    if plan.sort == "usd-per-mtok" and option.usd_per_million_tokens is None:
        return "unranked: no $/Mtok"
    if plan.sort == "tps" and option.decode_tps is None:
        return "unranked: no speed"
    return None


def table(plan: Plan, verbose: bool = False) -> str:
    """A readable table in the plan's order; ``*`` marks each provider's pick."""
    model = plan.model
    lines = [
        f"{model.name}: {model.size_gb:.1f} GB, {model.layers} layers, context {plan.context}"
        + (f" x {plan.slots} slots" if plan.slots > 1 else "")
        + (f", {model.active_bytes / 1e9:.1f} GB active per token" if model.active_bytes else "")
    ]
    goal = plan.target
    # The longest region's name sets the column (asia-southeast1, ap-northeast-1, ...).
    wide = max([REGION_WIDTH, *(len(o.instance.region) for o in plan.options)])
    region = f"{'region':<{wide}}"
    if goal is None:
        sort, sets = f"sorted {SORT_MEANINGS[plan.sort]}", ""
        header = f"  provider  {region}  instance type      nodes  mem GiB      $/h  tok/s     TTFT"
    else:
        sort = f"for {goal.describe()}; sorted {TARGET_SORT_MEANINGS[plan.sort]}"
        sets = "groups x nodes, slots; $/h, tok/s and $/Mtok of the whole set"
        header = (
            f"  provider  {region}  instance type      groups x nodes  slots  mem GiB      $/h"
            "    tok/s  each     TTFT"
        )
    header += (
        "  $/Mtok  to serve (internet/staged)  price date  spot $/h (date)        layers (main + "
        "workers)"
    )
    lines += ["", sort, *([sets] if sets else []), "", header]
    picked = set(map(id, plan.picks()))
    for option in plan.options:
        # A cluster that does not hold the model has no speed, cost per token or serve time.
        tps = "n/a" if option.tps is None or not option.fits else f"{option.tps:,.2f}"
        per_mtok = option.usd_per_million_tokens if option.fits else None
        partial = "+" if option.price_is_partial else ""
        mark = "*" if id(option) in picked else " "
        extra = [*notes(option), *filter(None, [_unranked(plan, option)])]
        tail = f"  ({'; '.join(extra)})" if extra else ""
        if goal is None:
            size = f"{option.count:>5}  {option.instance.memory_gib:>7g}  {_price(option):>8}  "
            size += f"{tps:>5}  {_first_token(option):>7}"
        else:
            each = "n/a" if option.stream_tps is None else f"{option.stream_tps:.2f}"
            groups = f"{option.replicas} x {option.count}"
            size = f"{groups:>14}  {option.slots:>5}  {option.instance.memory_gib:>7g}  "
            size += f"{_price(option):>8}  {tps:>7}  {each:>5}  {_first_token(option):>7}"
        lines.append(
            f"{mark} {option.provider:<8}  {option.instance.region:<{wide}}  "
            f"{option.name:<17}  {size}  "
            f"{'n/a' if per_mtok is None else _per_mtok(per_mtok) + partial:>6}  "
            f"{_serve_times(option) if option.fits else 'n/a':>26}  "
            f"{option.instance.price_date or '-':<10}"
            f"  {_spot(option):<21}  {option.placement.describe()}{tail}"
        )
    lines.append("")
    for best in sorted(plan.picks(), key=lambda o: o.provider):
        lines.append(f"* {best.provider}: {summary(plan, best)}")
    if goal is not None:
        lines += ["", "replicas or one bigger group (each the best that meets the target):"]
        lines += [f"  {found.provider}: {found.line()}" for found in verdict.verdicts(plan)]
    if verbose and plan.rejected:
        lines += ["", "rejected:"]
        lines += [
            f"  {r.instance.provider:<8}  {r.instance.name:<17}  {r.reason}" for r in plan.rejected
        ]
    if len(plan.options) == 1 and plan.options[0].fits:
        lines.append(timelines.text(plan.options[0]))
    lines += ["", "assumptions:"] + [
        f"  {k}: {v}" for k, v in assumptions(plan).items() if k not in ("anchors", "sort")
    ]
    return "\n".join(lines)


def summary(plan: Plan, best: Option) -> str:
    """One provider's pick in a sentence: what it is, what it costs, and why it was picked."""
    how = (
        f"one node, no RPC needed (the model fits on one {best.instance.name})"
        if not best.needs_rpc
        else f"a main node and {best.workers} RPC worker{'s' if best.workers > 1 else ''}"
    )
    if best.replicas > 1:
        how = f"each {how}, behind a private balancer"
    if best.kubernetes:
        how += ", as EKS node groups"
    if best.load is not None:
        load = best.load
        how += (
            f"; {best.slots} slot{'s' if best.slots > 1 else ''}"
            + (" each" if best.replicas > 1 else "")
            + f", {load.streams} streams "
            f"at {load.stream_tps:.2f} tok/s each ({load.bound})"
        )
    if best.hourly_usd is None:
        price = (
            "price unknown: run `lrc catalog refresh --cloud "
            f"{best.provider}` (chosen as the smallest that fits)"
        )
        return f"{best.shape}, {how}; {price}"
    price = f"{_price(best)}/h"
    if best.usd_per_million_tokens is not None and best.tps is not None:
        price += f", {_per_mtok(best.usd_per_million_tokens)} $/Mtok at {best.tps:,.2f} tok/s"
        price += " in all" if best.load is not None else ""
    rivals = sum(o.provider == best.provider for o in plan.options)
    if rivals > 1:  # one cluster evaluated (--instance-type, --stack) won nothing
        why = {"usd-per-mtok": "the lowest $/Mtok", "usd-per-hour": "the lowest $/h",
               "tps": "the fastest"}[plan.sort]  # fmt: skip
        if _unranked(plan, best):
            why = "the lowest $/h: no speed is predicted on this provider"
        if best.price_is_partial:
            why += f"; without {', '.join(best.cost.unpriced)}, which the catalog cannot price"
        price += f" ({why})"
    return f"{best.shape}, {how}; {price}"


def nothing_shown(plan: Plan, min_tps: float | None) -> str:
    """Why no row is shown, and what would show one."""
    fitting = [o for o in plan.options if o.fits]
    if not fitting:
        return "no cluster in the catalog holds this model (-v lists each type and why)"
    if min_tps is None:
        return "no cluster is shown"
    known = [o for o in fitting if o.decode_tps is not None]
    unknown = len(fitting) - len(known)
    text = f"{len(fitting)} cluster(s) hold the model, none predicted at {min_tps:g} tok/s"
    if known:
        fastest = max(known, key=lambda o: o.decode_tps or 0.0)
        text += (
            f"; the fastest is {fastest.shape} ({fastest.provider}) at "
            f"{fastest.decode_tps:.2f} tok/s"
        )
    if unknown:
        text += f"; {unknown} have no predicted speed (their CPU's memory bandwidth is unknown)"
    return text


def does_not_fit(plan: Plan, option: Option) -> str:
    """Why a cluster the user named cannot hold the model, and what would."""
    text = (
        f"{option.shape} does not hold {plan.model.name} at context "
        f"{plan.context}: the busiest node needs {option.need_bytes / GIB:.1f} GiB and has "
        f"{option.usable_bytes / GIB:.1f} GiB usable"
    )
    fewest = fewest_nodes(plan.model, plan.context, plan.slots, option.instance)
    if fewest is None:
        return text + f"; no cluster of {option.instance.name} does: choose a larger type"
    return text + f"; {fewest} nodes of {option.instance.name} do (--count {fewest})"


def stack_settings(
    option: Option, plan: Plan, urls: Sequence[str], sha256: Sequence[str]
) -> dict[str, Any]:
    """The project's config for this option, as ``config.from_settings`` reads it."""
    model = plan.model
    described: dict[str, Any] = {
        "sizeGb": round(model.size_bytes / 1e9, 3),
        "layers": model.layers,
        "kvBytesPerToken": model.kv_bytes_per_token,
        "urls": list(urls),
    }
    if model.name in PRESETS and model.source == "preset":
        described = {"preset": model.name, **described}
    if sha256:
        described["sha256"] = list(sha256)
    return {
        "cloud": option.provider,
        "instanceType": option.instance.name,
        "workerCount": option.workers,
        "contextSize": plan.context,
        "slots": option.slots,
        "model": described,
        # With a target, the set it was sized to (one group without: the key is left out).
        **({"replicas": option.replicas} if plan.target is not None else {}),
        # A plan that costs more than the default ceiling was chosen for it: the stack says so.
        **(
            {"maxHourlyUsd": math.ceil(option.hourly_usd) + 1}
            if option.hourly_usd is not None and option.hourly_usd > DEFAULT_MAX_HOURLY_USD
            else {}
        ),
    }


def stack_header(option: Option, plan: Plan, command: str) -> list[str]:
    """What a written stack file says of itself: the cluster, when and how it was planned, its
    price and predicted speed."""
    tps = "unknown" if option.tps is None else f"{option.tps:.2f}"
    groups = f"{option.replicas} groups of " if option.replicas > 1 else ""
    load = option.load
    return [
        f"{plan.model.name} on {groups}{option.count} x {option.instance.name} "
        f"({'one node, no RPC' if not option.needs_rpc else f'{option.workers} RPC workers'}"
        + (" each, behind a private balancer" if option.replicas > 1 else "")
        + (f"; {option.slots} slots each" if plan.target is not None else "")
        + ").",
        f"Planned {datetime.date.today().isoformat()} by `{command}`:",
        f"{money(option.hourly_usd)}/h ({option.instance.price_source}, "
        f"{option.instance.price_date or 'no date'}), predicted {tps} tok/s"
        + (f" in all for {load.streams} streams" if load is not None else "")
        + ".",
    ]


# --- engines (--engines) ---


def engines(plan: Plan, acceptance: float | None) -> list[tuple[Option, list[EngineLine]]]:
    """Each provider's pick, with every engine's line for its first serving group."""
    found = []
    for option in sorted(plan.picks(), key=lambda o: o.provider):
        nodes = [option.main_instance] + [option.instance] * (option.count - 1)
        kv_tokens = int(plan.context * perf.KV_FILL_FRACTION)
        lines = engine_lines(plan.model, nodes, option.placement, kv_tokens, acceptance=acceptance,
                             workers_repack=option.workers_repack)  # fmt: skip
        found.append((option, lines))
    return found


def engines_text(found: list[tuple[Option, list[EngineLine]]]) -> str:
    out = ["", "one stream under each engine (--engines):"]
    for option, lines in found:
        out.append(f"  {option.provider}: {option.count} x {option.name}")
        for line in lines:
            speed = "n/a" if line.tps is None else f"{line.tps:.2f} tok/s"
            state = "runs here" if line.offered else "not offered"
            out.append(f"    {line.engine}: {speed} ({state})")
            out.append(f"      basis: {line.basis}")
            if line.why_not:
                out.append(f"      why not: {line.why_not}")
            if line.sources:
                out.append(f"      sources: {'; '.join(line.sources)}")
    return "\n".join(out)


def engines_json(found: list[tuple[Option, list[EngineLine]]]) -> dict[str, Any]:
    return {
        "engines": {option.provider: [line.to_json() for line in lines] for option, lines in found}
    }
