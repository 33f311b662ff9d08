"""How a plan is shown: a table, JSON, a chart, and a stack file for the chosen option."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from infra.clouds import FACTS
from infra.models import PRESETS, Model
from infra.planner import perf, serve
from infra.planner.search import Option, Plan
from infra.stack.settings import PROJECT

GIB = 1024**3


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
        "cpu": instance.cpu_family,
        "count": option.count,
        "workers": option.workers,
        "rpcNeeded": option.needs_rpc,
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
        },
        "unpriced": list(option.cost.unpriced),
        "downloadUsd": option.download_usd,
        "predictedDecodeTps": None if option.decode_tps is None else round(option.decode_tps, 3),
        "usdPerMillionTokens": option.usd_per_million_tokens,
        # The internet path: what a stack with https model URLs does.
        "predictedSecondsToServe": round(option.serve["internet"].total_seconds),
        "timeToServe": {path: timeline.to_json() for path, timeline in option.serve.items()},
        "priceSource": instance.price_source,
        "priceDate": instance.price_date or None,
        "costSources": list(option.cost.sources),
    }


def assumptions(plan: Plan) -> dict[str, Any]:
    cal = perf.calibration()
    return {
        "memory": (
            f"{plan.slots} slot(s) of {plan.context} tokens: every node holds the KV cache of "
            "its layers for every slot, its compute buffers and OS headroom; the layers are "
            "shared in proportion to each node's free memory, the main node included"
        ),
        "decode": (
            f"single stream at {int(plan.context * perf.KV_FILL_FRACTION)} tokens of context; "
            f"eta {cal.eta:.3f} and {cal.layer_overhead_seconds * 1e3:.3f} ms per layer "
            f"solved from the anchors, {cal.hop_seconds * 1e3:.2f} ms per RPC worker"
        ),
        "anchors": [f"{a.label}: {a.decode_tps} tok/s ({a.source})" for a in perf.ANCHORS],
        "memoryBandwidth": "Axion and Cobalt 100 memory bandwidth is not published: "
        "no speed is predicted for them",
        "serve": (
            f"{serve.BOOT_SECONDS:.0f} s boot, then the llama.cpp build beside the download "
            f"(internet: a {plan.download_gbps:g} Gbit/s model host; staged: the provider's "
            "object store in the region), the sha256 check, and the load: the main node's "
            "layers, then each worker's sent to it in turn; each phase in timeToServe names "
            "its basis"
        ),
        "cost": "on-demand instances, NAT for egress and disks; a price the catalog lacks is "
        "named in `unpriced` and left out of hourlyUsd",
    }


def to_json(plan: Plan, options: Sequence[Option] | None = None) -> dict[str, Any]:
    return {
        "model": model_json(plan.model),
        "context": plan.context,
        "slots": plan.slots,
        "options": [option_json(o) for o in (plan.options if options is None else options)],
        "rejected": [
            {"provider": r.instance.provider, "instanceType": r.instance.name, "reason": r.reason}
            for r in plan.rejected
        ],
        "assumptions": assumptions(plan),
    }


def _money(value: float | None, digits: int = 2) -> str:
    return "unknown" if value is None else f"${value:,.{digits}f}"


def _duration(seconds: float) -> str:
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes >= 1 else f"{seconds:.0f} s"


def _serve_times(option: Option) -> str:
    return " / ".join(_duration(option.serve[path].total_seconds) for path in serve.PATHS)


def table(plan: Plan, options: Sequence[Option], verbose: bool = False) -> str:
    """A readable table, cheapest first; ``*`` marks each provider's recommendation."""
    model = plan.model
    lines = [
        f"{model.name}: {model.size_gb:.1f} GB, {model.layers} layers, context {plan.context}"
        + (f" x {plan.slots} slots" if plan.slots > 1 else "")
        + (f", {model.active_bytes / 1e9:.1f} GB active per token" if model.active_bytes else "")
    ]
    header = (
        "  provider  region       instance type      nodes  mem GiB     $/h  tok/s  $/Mtok"
        "  to serve (internet/staged)  price date  layers (main + workers)"
    )
    lines += ["", header]
    picked = {plan.recommendation(p) for p in {o.provider for o in options}}
    for option in options:
        tps = "n/a" if option.decode_tps is None else f"{option.decode_tps:.2f}"
        per_mtok = option.usd_per_million_tokens
        mark = "*" if option in picked else " "
        extra = ""
        if option.cost.unpriced and option.hourly_usd is not None:
            extra = f"  (+ {', '.join(option.cost.unpriced)}: price unknown)"
        if not option.fits:
            extra += "  DOES NOT FIT"
        lines.append(
            f"{mark} {option.provider:<8}  {option.instance.region:<11}  "
            f"{option.instance.name:<17}  {option.count:>5}  {option.instance.memory_gib:>7g}  "
            f"{_money(option.hourly_usd):>7}  {tps:>5}  "
            f"{'n/a' if per_mtok is None else f'{per_mtok:,.0f}':>6}  "
            f"{_serve_times(option):>26}  {option.instance.price_date or '-':<10}"
            f"  {option.placement.describe()}{extra}"
        )
    lines.append("")
    for provider in sorted({o.provider for o in options}):
        best = plan.recommendation(provider)
        if best is None:
            continue
        how = (
            f"one node, no RPC needed (the model fits on one {best.instance.name})"
            if not best.needs_rpc
            else f"a main node and {best.workers} RPC workers"
        )
        price = (
            f"{_money(best.hourly_usd)}/h"
            if best.hourly_usd is not None
            else "price unknown: run `python -m infra.catalog refresh --provider "
            f"{provider}` (chosen as the smallest that fits)"
        )
        lines.append(f"* {provider}: {best.count} x {best.instance.name}, {how}; {price}")
    if verbose and plan.rejected:
        lines += ["", "rejected:"]
        lines += [
            f"  {r.instance.provider:<8}  {r.instance.name:<17}  {r.reason}" for r in plan.rejected
        ]
    lines += ["", "assumptions:"] + [
        f"  {k}: {v}" for k, v in assumptions(plan).items() if k != "anchors"
    ]
    return "\n".join(lines)


def chart(plan: Plan, path: Path) -> Path:
    """$/h and predicted tok/s of each provider's recommendation, side by side."""
    import matplotlib  # noqa: PLC0415 (only --chart needs it: `uv sync --extra plan`)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    picks = [o for p in sorted({o.provider for o in plan.options}) if (o := plan.recommendation(p))]
    labels = [f"{o.provider}\n{o.count} x {o.instance.name}" for o in picks]
    figure, (cost_axis, speed_axis) = plt.subplots(1, 2, figsize=(10, 4.2))
    colours = [FACTS[o.provider].chart_colour for o in picks]
    # A "+" marks a total that leaves out an unpriced part (the table names it).
    partial = ["+" if o.cost.unpriced else "" for o in picks]
    for axis, values, marks, title, unit in (
        (cost_axis, [o.hourly_usd for o in picks], partial, "Cost", "$ per hour"),
        (speed_axis, [o.decode_tps for o in picks], [""] * len(picks), "Predicted decode",
         "tokens per second"),
    ):  # fmt: skip
        heights = [v or 0.0 for v in values]
        bars = axis.bar(labels, heights, color=colours)
        for bar, value, mark in zip(bars, values, marks, strict=True):
            text = "unknown" if value is None else f"{value:.2f}{mark}"
            axis.annotate(
                text,
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=9,
            )
        axis.set_title(title)
        axis.set_ylabel(unit)
        axis.tick_params(axis="x", labelsize=8)
        axis.margins(y=0.15)
    figure.suptitle(f"Cheapest cluster per provider for {plan.model.name}, context {plan.context}")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


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
        "slots": plan.slots,
        "model": described,
    }


def stack_yaml(option: Option, plan: Plan, settings: dict[str, Any], command: str) -> str:
    region_key = FACTS[option.provider].region_key
    config = {region_key: option.instance.region} | {
        f"{PROJECT}:{key}": value for key, value in settings.items()
    }
    tps = "unknown" if option.decode_tps is None else f"{option.decode_tps:.2f}"
    header = [
        f"# {plan.model.name} on {option.count} x {option.instance.name} "
        f"({'one node, no RPC' if not option.needs_rpc else f'{option.workers} RPC workers'}).",
        f"# Planned {datetime.date.today().isoformat()} by `{command}`:",
        f"# {_money(option.hourly_usd)}/h ({option.instance.price_source}, "
        f"{option.instance.price_date or 'no date'}), predicted {tps} tok/s.",
    ]
    body = yaml.safe_dump({"config": config}, sort_keys=False, width=200)
    return "\n".join(header) + "\n" + body
