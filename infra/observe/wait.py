"""Until a deployed stack serves: each serving group's main node read through its command
channel, every few seconds, its phase reported as it changes (``booted``, ``building``,
``downloading``, ``waiting-for-workers``, ``loading``, ``serving``), and the download's and the
load's percentages as they grow."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from infra.live import Channel, ChannelError
from infra.observe.status import STATUS_COMMAND, StatusError, parse_status, progress

READ_TIMEOUT_SECONDS = 120.0


class WaitError(RuntimeError):
    """A group failed, or did not serve in time; the message says which and why."""


@dataclass(frozen=True)
class GroupState:
    group: int  # 1-based, as the README and `top` number them
    phase: str
    detail: str = ""  # the node's last error, or why it could not be read
    percent: int | None = None  # of the phase's work, where the node counts it
    # What the node counted, in words (``41% (94.0 of 229.0 GB)``); not compared, so that a
    # report comes with each new percent, not with each byte.
    progress: str = field(default="", compare=False)

    def line(self) -> str:
        shown = f"{self.phase} {self.progress}" if self.progress else self.phase
        return f"group {self.group}: {shown}" + (f" ({self.detail})" if self.detail else "")


DETAIL_CHARS = 400  # of a reason a group could not be read


def brief(text: str, limit: int = DETAIL_CHARS) -> str:
    """``text`` on one line, cut at a word to ``limit`` characters, with a mark where it was."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    return flat[: limit - 1].rsplit(" ", 1)[0] + " …"


def read_group(number: int, channel: Channel) -> GroupState:
    """The group's state, read from its main node; ``unreachable`` (with why) when the node does
    not answer. A reason on this machine's side (no credentials, no CLI, no network:
    ``AccessError``) is raised: no node would answer, and the message names the fix."""
    try:
        status: dict[str, Any] = parse_status(channel.run(STATUS_COMMAND, READ_TIMEOUT_SECONDS))
    except (ChannelError, StatusError) as error:  # not up yet, stopped, or its agent not ready
        return GroupState(number, "unreachable", brief(str(error)))
    phase = str(status.get("phase") or "starting")
    counted = progress(status)
    return GroupState(
        number,
        phase,
        str(status.get("last_error") or "") if phase == "failed" else "",
        percent=counted.percent if counted else None,
        progress=counted.describe() if counted else "",
    )


def wait_until_serving(
    channels: Sequence[Channel],
    *,
    timeout: float,
    interval: float = 15.0,
    report: Callable[[GroupState], None] = lambda _state: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    explain: Callable[[list[GroupState]], list[GroupState]] = lambda states: states,
) -> list[GroupState]:
    """Every group's state once all serve; ``WaitError`` when one fails, is ``stopped`` or
    ``timeout`` passes. ``report`` hears each group's state when it changes; ``explain`` may
    say more of the states read (an unreachable node the cloud reports stopped)."""
    deadline = clock() + timeout
    last: dict[int, GroupState] = {}
    while True:
        states = [read_group(number, channel) for number, channel in enumerate(channels, 1)]
        states = explain(states)
        for state in states:
            if last.get(state.group) != state:
                report(state)
                last[state.group] = state
        failed = [s for s in states if s.phase in ("failed", "stopped")]
        if failed:
            raise WaitError("; ".join(s.line() for s in failed))
        if all(s.phase == "serving" for s in states):
            return states
        if clock() >= deadline:
            waiting = ", ".join(s.line() for s in states if s.phase != "serving")
            raise WaitError(f"not serving after {timeout:g} s: {waiting}")
        sleep(interval)
