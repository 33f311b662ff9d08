"""The planner's chart (``lrc plan --chart``): each provider's pick, its $/h, $/Mtok and
predicted tok/s side by side."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from infra.clouds import FACTS
from infra.planner.base import Option, Plan


@dataclass(frozen=True)
class Panel:
    """One panel of the chart: a value per provider's pick (None: unknown)."""

    title: str
    unit: str
    values: list[float | None]
    marks: list[str]
    fmt: str


def panels(plan: Plan) -> tuple[list[Option], list[Panel]]:
    """Each provider's pick and what the chart draws for it: $/h, $/Mtok and tok/s."""
    picks = sorted(plan.picks(), key=lambda o: o.provider)
    # A "+" marks a total that leaves out an unpriced part (the table names it).
    partial = ["+" if o.price_is_partial else "" for o in picks]
    streams = "one stream" if plan.target is None else "all streams"
    per_mtok = [o.usd_per_million_tokens for o in picks]
    return picks, [
        Panel("Cost", "$ per hour", [o.hourly_usd for o in picks], partial, "{:.2f}"),
        Panel("Cost per output", "$ per million generated tokens", per_mtok, partial,
              "{:,.0f}" if all(v is None or v >= 10 for v in per_mtok) else "{:,.2f}"),
        Panel("Predicted decode", f"tokens per second ({streams})",
              [o.tps for o in picks], [""] * len(picks), "{:.2f}"),
    ]  # fmt: skip


LEGEND = (
    "unknown: no catalog price, or no published memory bandwidth for the CPU (no speed). "
    "+: the price leaves out a part the catalog cannot price. Axion speeds above 16 vCPUs are "
    "extrapolated from one 16-vCPU run."
)


def draw(plan: Plan, path: Path) -> Path:
    """Each provider's pick: $/h, $/Mtok and predicted tok/s side by side; an unknown is drawn
    as an empty bar labelled "unknown", and the figure says what that means."""
    import matplotlib  # noqa: PLC0415 (only --chart needs it: `uv sync --extra plan`)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    picks, drawn = panels(plan)
    labels = [f"{o.provider}\n{o.shape.replace(' x ', ' x' + chr(10), 1)}" for o in picks]
    colours = [FACTS[o.provider].chart_colour for o in picks]
    figure, axes = plt.subplots(1, len(drawn), figsize=(13, 4.6))
    for axis, panel in zip(axes, drawn, strict=True):
        bars = axis.bar(labels, [v or 0.0 for v in panel.values], color=colours)
        for bar, value, mark in zip(bars, panel.values, panel.marks, strict=True):
            text = "unknown" if value is None else panel.fmt.format(value) + mark
            axis.annotate(
                text,
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=9,
            )
        axis.set_title(panel.title)
        axis.set_ylabel(panel.unit)
        axis.tick_params(axis="x", labelsize=8)
        axis.margins(y=0.15)
    figure.suptitle(
        f"Each provider's pick for {plan.model.name}, context {plan.context} (sorted {plan.sort})"
    )
    figure.text(0.5, 0.01, LEGEND, ha="center", fontsize=8)
    figure.tight_layout(rect=(0, 0.05, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
