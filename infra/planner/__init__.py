"""The planner: the cheapest homogeneous cluster that holds a model, on every provider, with its
predicted decode speed (``perf``), time to serve and cost (``infra.core.costs``), as a table or
JSON (``report``), a chart (``chart``) or a stack file (``request``, through
``infra.stack.files``); ``lrc plan --help``."""

from infra.planner.base import Option, Plan, PlanError, Rejection
from infra.planner.search import evaluate, fewest_nodes, plan

__all__ = ["Option", "Plan", "PlanError", "Rejection", "evaluate", "fewest_nodes", "plan"]
