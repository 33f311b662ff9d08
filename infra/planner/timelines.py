"""How one cluster's time to serve and time to heal are shown, phase by phase: the staged path
as the nodes run it (the main node fetches everything and sends the workers their weights, after
building llama.cpp) beside worker-local loading with a prebuilt binary, each against its goal."""

from __future__ import annotations

from typing import Any

from infra.planner import local_load
from infra.planner.base import Option
from infra.planner.serve import ServeTime

SERVE_TITLES = {
    "staged": "the main node fetches the whole model, builds llama.cpp and sends the workers "
    "their weights",
    local_load.PATH: "each node fetches its own slice and a prebuilt llama.cpp, and loads "
    "from its own disk",
}
HEAL_TITLES = {
    "main-sends": "the main node reads the model again and sends the workers their weights",
    "worker-local": "each node reloads its own slice from its own disk",
}


def goals_json(option: Option) -> dict[str, Any]:
    """The worker-local timelines against the design's goals: met or not, which phase binds and
    by how much."""
    found: dict[str, Any] = {
        "serve": local_load.verdict(
            option.serve[local_load.PATH], local_load.SERVE_GOAL_SECONDS
        ).to_json()
    }
    if "worker-local" in option.heal:
        found["heal"] = local_load.verdict(
            option.heal["worker-local"], local_load.HEAL_GOAL_SECONDS
        ).to_json()
    return found


def _phases(timeline: ServeTime) -> list[str]:
    return [
        f"      {p.name:<15} {p.start:>5.0f} s  +{p.seconds:>4.0f} s  {p.basis}"
        for p in timeline.phases
    ]


def _block(title: str, timeline: ServeTime, goal: float) -> list[str]:
    verdict = local_load.verdict(timeline, goal)
    return [f"    {title}: {timeline.total_seconds:.0f} s; {verdict.line()}", *_phases(timeline)]


def text(option: Option) -> str:
    """Both staged paths and, with workers, both ways to heal, each phase with its basis."""
    lines = ["", f"time to serve, staged, phase by phase ({option.count} x {option.name}):"]
    for path, title in SERVE_TITLES.items():
        lines += _block(title, option.serve[path], local_load.SERVE_GOAL_SECONDS)
    if not option.heal:
        lines.append("time to heal: no worker to lose (one node)")
        return "\n".join(lines)
    lines.append("time to heal after a worker's RPC server is lost, phase by phase:")
    for path, title in HEAL_TITLES.items():
        lines += _block(title, option.heal[path], local_load.HEAL_GOAL_SECONDS)
    return "\n".join(lines)
