"""What a stack needs from the cloud account, asked read-only before anything is created.

A stack can be valid and still fail half-way through ``pulumi up``: a vCPU quota too small for
its nodes, an instance type the chosen zone (or, on Azure, the subscription) does not offer, an
Azure subscription whose region has no Network Watcher or has not registered
``Microsoft.Insights`` for the flow log. Each cloud's reader (``infra.live``) reads those facts
into an ``Account``, then ``problems`` says what is missing and how to fix it. The Pulumi program
runs it before it registers any resource, and ``lrc check --stack S`` runs it on its own. It also
chooses the zone a new stack is created in: the first, by name, that offers every type.
"""

from __future__ import annotations

from infra.preflight.account import Account, QuotaReading, Unread
from infra.preflight.checks import Problem, problems, zone_for
from infra.preflight.needs import Needs

__all__ = [
    "Account",
    "Needs",
    "Problem",
    "QuotaReading",
    "Unread",
    "problems",
    "zone_for",
]
