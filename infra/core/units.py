"""How figures read wherever a person sees them: the planner's table, the cost run's lines."""

from __future__ import annotations


def money(value: float | None, digits: int = 2) -> str:
    """``$7.80``; ``unknown`` where the catalog has no price."""
    return "unknown" if value is None else f"${value:,.{digits}f}"


def duration(seconds: float) -> str:
    """Whole minutes from a minute on (``35 min``), seconds below it (``40 s``)."""
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes >= 1 else f"{seconds:.0f} s"
