"""Replicas send each request to an idle group: two one-slot serving groups on machines, behind
the local balancer (the shared ``machines_2x2``; keyed, so every request carries the key).

While one long generation runs on one group, short requests sent one after another are each
answered by the other group, none waiting behind the long one. With both groups busy, a third
request waits in the balancer's queue and is answered by the first group to free its slot, not
dropped, and not queued inside the group that is still generating. A request whose client gives
up frees its group's slot at once: llama-server stops generating what nobody will read.

Every request goes from a namespace of the test's own on the VPC bridge to the balancer (or, to
see a group's slot free, to that group's main node).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest

from infra.core import outputs
from infra.local.netns import exec_prefix
from tests.conftest import completion_client

pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.machines]

# Each request is one completion through the balancer (greedy, generating all it is asked for):
# when it started and ended (CLOCK_MONOTONIC, the test's clock too), its status, the group that
# answered (the balancer's header) and its tokens.
BODY = {"prompt": "Once upon a time", "temperature": 0, "ignore_eos": True, "cache_prompt": False}
SHORT = 8
# Long enough for several short requests, each a fraction of a second, to run meanwhile (about
# 10 s at the shared cluster's 60 tokens a second).
LONG = 600
LONGER = 1200
# A generation its client gives up: it would run to the end of the slot's context (half a
# minute at the shared cluster's speed), were it not stopped.
ABANDONED = 6000


@pytest.fixture
def up(machines_2x2: dict[str, Any]) -> dict[str, Any]:
    return machines_2x2


def send(up: dict[str, Any], n_predict: int, url: str | None = None) -> subprocess.Popen[str]:
    """A completion through the balancer (or straight to a group's ``url``)."""
    client = completion_client(
        url or up["contract"][outputs.BALANCER_URL], {**BODY, "n_predict": n_predict},
        timeout=600, key_file=up["spec"].api_key_file,
    )  # fmt: skip
    return subprocess.Popen(
        [*exec_prefix(up["client"]), *client], stdout=subprocess.PIPE, text=True
    )


def answer(request: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = request.communicate(timeout=600)
    row: dict[str, Any] = json.loads(out)
    return row


def wait_until(what: Callable[[], bool], says: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, says
        time.sleep(0.05)


def busy_groups(up: dict[str, Any]) -> set[str]:
    return {row["svname"] for row in up["balancer"].stats() if int(row["scur"] or 0) > 0}


def test_short_requests_go_to_the_idle_group_while_one_generates(up) -> None:
    """Then the long request's client gives up: the balancer closes it to its group, whose
    llama-server stops generating and answers the next request at once (not after the half
    minute the rest of the generation would take)."""
    long = send(up, ABANDONED)
    wait_until(lambda: len(busy_groups(up)) == 1, "the long request never reached a group")
    (generating,) = busy_groups(up)
    shorts = []
    while long.poll() is None and len(shorts) < 5:
        shorts.append(answer(send(up, SHORT)))
    assert long.poll() is None, "the long generation ended before five short ones were answered"
    took = ", ".join(f"{r['end'] - r['start']:.2f} s on {r['group']}" for r in shorts)
    print(f"short: {took}")
    for row in shorts:
        assert row["status"] == 200 and row["tokens"] == SHORT, row
        assert row["group"] != generating, row  # the other group answered
    long.kill()
    long.wait()
    # At once: the rest of the generation (to the end of the slot's context) takes far longer.
    wait_until(lambda: not busy_groups(up), "the balancer kept the request open", timeout=5)
    group = up["contract"][outputs.GROUPS][int(generating.removeprefix("group")) - 1]
    row = answer(send(up, SHORT, url=group[outputs.LLAMA_SERVER_URL]))
    print(f"then {row['end'] - row['start']:.2f} s straight from {generating}")
    assert row["status"] == 200 and row["tokens"] == SHORT, row
    assert row["end"] - row["start"] < 5, row  # its one slot was free


def test_with_both_groups_busy_a_request_waits_for_the_first_to_free(up) -> None:
    first = send(up, LONG)
    wait_until(lambda: len(busy_groups(up)) == 1, "the first request never reached a group")
    (first_group,) = busy_groups(up)
    second = send(up, LONGER)
    wait_until(lambda: len(busy_groups(up)) == 2, "the second request did not take the other")
    third = send(up, SHORT)
    wait_until(lambda: up["balancer"].queued() == 1, "the third request was not queued")
    rows = [answer(request) for request in (first, second, third)]
    print(", ".join(f"{r['group']} {r['start']:.1f}-{r['end']:.1f}" for r in rows))
    assert all(row["status"] == 200 for row in rows), rows
    one, two, three = rows
    assert one["group"] == first_group != two["group"]
    # The third waited in HAProxy's queue (above) and went to the group that freed first, which
    # has one slot: it ran once that group's generation was done. It ended long before the second
    # group's generation did. (The clients are processes of their own: their clocks cannot order
    # two answers that reach them within a millisecond of each other.)
    assert three["group"] == first_group, rows
    assert three["end"] < two["end"], rows
