"""TIME: how long to wait, whether the wait fits, and what to do next.

- :mod:`~rateloop.timing.backoff` — :class:`Backoff` (strategies, jitter, the server's
  minimum) and :func:`plan_wait` (a wait against the pause limit and the budget).
- :mod:`~rateloop.timing.budget` — :class:`CallBudget` and :class:`RunBudget`.
- :mod:`~rateloop.timing.decide` — the sans-IO decider, its rules in order: ``decide``,
  ``decide_admission``, ``decide_write``; it reads a small ``LoopSettings`` protocol.
- :mod:`~rateloop.timing.decision` — its answers: ``Proceed``, ``Wait``, ``FallBack``, ``Stop``.
- :mod:`~rateloop.timing.state` — ``LoopState`` and every change made to it and to the
  budgets (h11's "Rule 1": the flow only asks and performs).
- :mod:`~rateloop.timing.waits` — the wait before the next attempt (rules 5–7).
- :mod:`~rateloop.timing.exits` — the terminal ``Stop`` for a signal.
- :mod:`~rateloop.timing.moves` — the next eligible route on the chain.
- :mod:`~rateloop.timing.fallback` — the fallback chain and the checks a route must pass.
- :mod:`~rateloop.timing.writes` — writes whose outcome is unknown.
"""

from __future__ import annotations

from rateloop.timing.backoff import Backoff, BackoffSettings, WaitPlan, plan_wait
from rateloop.timing.budget import CallBudget, RunBudget

__all__ = ["Backoff", "BackoffSettings", "CallBudget", "RunBudget", "WaitPlan", "plan_wait"]
