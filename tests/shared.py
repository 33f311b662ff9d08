"""Clusters that the slow tier's tests share, as kind shares one cluster per CI job: each is
brought up by the first test that asks for it and taken down after the last one, so that no two
are up at once on a small machine. ``keep_users_together`` orders the tests so that each
cluster's users run one after another; a test that changes a cluster puts it back."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import pytest

# The fixtures whose clusters are shared (tests/conftest.py, tests/local/conftest.py).
SHARED_FIXTURES = ("cluster_1p2", "machines_2x2", "gemma_1p2")

_up: dict[str, tuple[Any, Generator[Any, None, None]]] = {}
# A cluster that failed to come up fails (or skips) each of its users alike, as a fixture would,
# without trying again.
_failed: dict[str, BaseException] = {}
# The shared clusters each test file uses (any of its tests, directly or through its fixtures).
_used_by: dict[str, set[str]] = {}


def shared(name: str, make: Callable[[], Generator[Any, None, None]]) -> Any:
    """The cluster ``name``, brought up by ``make`` (a generator that yields it, and takes it
    down when resumed) unless it is up already."""
    assert name in SHARED_FIXTURES, name
    if name in _failed:
        raise _failed[name]
    if name not in _up:
        steps = make()
        try:
            _up[name] = (next(steps), steps)
        except BaseException as error:
            _failed[name] = error
            raise
    return _up[name][0]


def take_down(name: str) -> None:
    _value, steps = _up.pop(name)
    try:
        next(steps)  # its teardown
    except StopIteration:
        return
    raise AssertionError(f"{name}: its generator yields more than once")


def release_unused(nextitem: pytest.Item | None) -> None:
    """Take down each cluster that the next test's file does not use."""
    needed = _used_by.get(str(nextitem.path), set()) if nextitem is not None else set()
    for name in [*_up, *_failed]:
        if name not in needed:
            _failed.pop(name, None)
            if name in _up:
                take_down(name)


def keep_users_together(items: list[pytest.Item]) -> None:
    """Move each file that uses a shared cluster up to the first such file, in their order (a
    file's own clusters stay up for its tests alone); the rest keep their places."""
    for item in items:
        names = set(getattr(item, "fixturenames", ())) & set(SHARED_FIXTURES)
        _used_by.setdefault(str(item.path), set()).update(names)
    first: dict[str, int] = {}

    def key(position: int, item: pytest.Item) -> tuple[int, int]:
        used = sorted(_used_by[str(item.path)], key=SHARED_FIXTURES.index)
        if not used:
            return position, position
        return first.setdefault(used[0], position), position

    keyed = [(key(position, item), item) for position, item in enumerate(items)]
    items[:] = [item for _, item in sorted(keyed, key=lambda pair: pair[0])]
