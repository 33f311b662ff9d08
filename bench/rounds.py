"""How the benchmarks repeat their arms and report them: every arm once a round, each round in
the reverse order of the one before (ABBA), so a machine that slows down or speeds up during a
run weighs on every arm alike; and every value kept, with its median, min and max."""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from typing import TypeVar

Arm = TypeVar("Arm")


def interleaved(arms: Sequence[Arm], repetitions: int) -> Iterator[tuple[int, Arm]]:
    """(round, arm) in the order to run them."""
    for repetition in range(repetitions):
        for arm in arms if repetition % 2 == 0 else arms[::-1]:
            yield repetition, arm


def spread(values: Sequence[float], digits: int = 4) -> dict[str, object]:
    """Every value, and their median, min and max."""
    return {
        "values": [round(v, digits) for v in values],
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }
