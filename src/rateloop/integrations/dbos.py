"""DBOS: a durable step that runs a model or tool call through the RATE loop, and a queue
whose rate limit is fed from the limits rateloop knows or learns.

How it works.  :func:`call_step` (:func:`call_step_async` for async workflows) runs inside a
DBOS workflow, in rounds:

1. A round is one DBOS step, checkpointed in the system database.  The RATE loop makes the
   call in it, sleeping the short waits (those within the policy's ``pause_limit_secs``) inside
   the step, and the step records the loop's verdict (:mod:`rateloop.integrations._engine`).
   It never raises a refusal, so DBOS's own step retries never run on top of the loop.
2. ``completed`` / ``degraded``: the workflow gets a :class:`StepResult` (``degraded`` marked).
3. ``waiting_for_reset`` / ``waiting_for_capacity``: a durable ``DBOS.sleep`` until the
   outcome's ``retry_at``, then the next round.  The provider requests of earlier rounds count
   against the policy's ``max_attempts`` (:func:`engine_run_budget`), so rounds and the loop's
   retries never multiply each other.
4. ``needs_operator``, ``invalid``, ``rejected``, ``failed_retry_exhausted``: the workflow
   raises :class:`StepGaveUp` with the outcome's status and reason; DBOS records the workflow
   as failed and never retries it.

After a crash DBOS replays the recorded rounds and sleeps (a finished round is never run
again) and sleeps only what is left of an interrupted ``DBOS.sleep``.  DBOS runs a workflow
in a thread (a sync one) or a task (an async one): a durable sleep holds that thread or task
and the workflow's place in its queue's concurrency, but no step is running and the wait
survives a restart.

The queue.  :func:`queue_limits` turns the limits rateloop knows for a route (a
:class:`~rateloop.Policy`'s configured ``[limits]``) or learns (a
:class:`~rateloop.admission.Limiter`'s ``limits_for``: configured, else learned from the
provider's headers) into DBOS's ``limiter={"limit": N, "period": S}`` and
``global_concurrency``; :func:`register_queue` registers a queue with them and
:func:`refresh_queue` writes newer ones to the queue's row.  DBOS (3.x) keeps a registered
queue's configuration in the system database and every worker re-reads it on each poll, so a
refresh reaches every process at its next poll.  DBOS's limiter counts workflow starts in one
rolling window; token and day limits stay with rateloop's admission (Redis), which is exact.

Install with ``pip install 'rateloop[dbos]'``.
"""

from __future__ import annotations

try:
    import dbos as _dbos  # noqa: F401  (the extra: say what to install before anything else)
    import psycopg as _psycopg  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "rateloop.integrations.dbos needs DBOS: pip install 'rateloop[dbos]'"
    ) from exc

from rateloop.integrations._dbos.launch import check_system_database, launch
from rateloop.integrations._dbos.queue import (
    QueueLimits,
    QueueRateLimit,
    queue_limits,
    refresh_queue,
    refresh_queue_async,
    register_queue,
)
from rateloop.integrations._dbos.step import (
    DEFAULT_STEP_NAME,
    StepGaveUp,
    StepResult,
    call_step,
    call_step_async,
)

__all__ = [
    "DEFAULT_STEP_NAME",
    "QueueLimits",
    "QueueRateLimit",
    "StepGaveUp",
    "StepResult",
    "call_step",
    "call_step_async",
    "check_system_database",
    "launch",
    "queue_limits",
    "refresh_queue",
    "refresh_queue_async",
    "register_queue",
]
