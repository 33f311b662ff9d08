"""The name a command's help and errors give it: ``lrc plan`` when run as ``lrc plan``, its
``python -m`` name when run that way."""

from __future__ import annotations

from contextvars import ContextVar

# Set by ``lrc`` for the command it runs.
RUNNING_AS: ContextVar[str | None] = ContextVar("running_as", default=None)


def prog(module: str) -> str:
    """``module``: the command's ``python -m`` name (``infra.planner``)."""
    return RUNNING_AS.get() or f"python -m {module}"
