"""TIME: how long to wait, whether the wait fits, and what to do next.

- :mod:`~rateloop.timing.backoff` — :class:`Backoff` (strategies, jitter, the server's
  minimum) and :func:`plan_wait` (a wait against the pause limit and the budget).
- :mod:`~rateloop.timing.budget` — :class:`CallBudget` and :class:`RunBudget`.
- :mod:`~rateloop.timing.decide` — the sans-IO decider: every loop-state transition.
- :mod:`~rateloop.timing.fallback` — the fallback chain and the checks a route must pass.
- :mod:`~rateloop.timing.writes` — writes whose outcome is unknown.
"""

from __future__ import annotations

from rateloop.timing.backoff import Backoff, BackoffSettings, WaitPlan, plan_wait
from rateloop.timing.budget import CallBudget, RunBudget

__all__ = ["Backoff", "BackoffSettings", "CallBudget", "RunBudget", "WaitPlan", "plan_wait"]
