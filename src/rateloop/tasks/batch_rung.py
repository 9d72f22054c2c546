"""A task step's call on the degrade ladder's batch rung: :class:`BatchRung`.

How it works.  When a routed step's call reaches the ``batch`` rung
(:mod:`rateloop.timing.ladder`: the loop ends it ``waiting_for_capacity``
with ``next_rung="batch"``, nothing sent), the task flow hands the step to
its ``batch=`` instead of parking it (rule 8 of :mod:`rateloop.tasks.flow`),
and every later delivery of the step runs here until it ends:

1. The call becomes a one-item batch: ``request(ctx, route)`` is the body the
   step would have sent on ``route`` (the batch-tier route, its scope
   ``openai:gpt-5~batch:proj``), and the item's id is the step's name.  A
   :class:`~rateloop.tasks.batch.BatchStep` runs it: it holds the item's
   input tokens in the batch-tier scope (the ``enqueued_tokens`` limit
   configured there; on the runner's limiter unless ``queue=`` names
   another), submits once whatever crashes, and retries what the provider
   failed transiently.
2. A delivery does one thing (submit, poll once, collect) and returns; its
   wait parks the task like any wait.
3. When the item ends, a success is the step's value (``result(body)``, the
   provider's response body by default), on the rung ``batch``, its cost the
   usage the provider reported at the route's prices less the policy's
   ``ladder.batch_discount``; ``degraded`` unless batch was the call's first
   rung.  An item the provider rejected (a 400, over the model's limits) is
   ``invalid`` with the provider's reason; one still failing after
   ``max_rounds`` is ``failed_retry_exhausted``.

One step is one item: steps of several tasks do not share a batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from rateloop._clock import Clock
from rateloop.admission.holds import HeldCapacity
from rateloop.admission.limiter import Limiter
from rateloop.loop.effects import Returned, served_cost_usd, usage_of
from rateloop.outcome.record import Outcome, Status
from rateloop.policy import Policy
from rateloop.route import Cost, Route
from rateloop.tasks._batch_wire import BatchProvider
from rateloop.tasks.batch import BatchSettings, BatchStep, estimate_tokens
from rateloop.tasks.definition import StepContext
from rateloop.tasks.flow import RunBatch
from rateloop.timing.ladder import ladder_chain, tier_discount

__all__ = ["BatchRung", "batch_rung_outcome"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchRung:
    """How a routed step's call runs on the batch rung: pass it as ``t.step(..., batch=)``.

    ``provider`` is the batch API (:class:`~rateloop.tasks.batch.OpenAIBatches`,
    :class:`~rateloop.tasks.batch.AnthropicBatches`); ``request(ctx, route)``
    the body of the step's call on ``route`` (a chat completion's body for
    OpenAI, a message's ``params`` for Anthropic), the same on every
    delivery; ``result(body)`` the step's value from the provider's response
    body (default: the body).  ``queue`` holds the enqueued tokens (default:
    a :class:`~rateloop.admission.HeldCapacity` on the runner's limiter).
    """

    provider: BatchProvider
    request: Callable[[StepContext, Route], Any]
    result: Callable[[Any], Any] | None = None
    queue: HeldCapacity | None = None
    settings: BatchSettings = field(default_factory=BatchSettings)
    tokens: Callable[[Any], int] = estimate_tokens

    def __post_init__(self) -> None:
        for name in ("request", "tokens"):
            if not callable(getattr(self, name)):
                raise TypeError(f"BatchRung.{name} must be callable, got "
                                f"{type(getattr(self, name)).__name__}")
        if self.result is not None and not callable(self.result):
            raise TypeError(f"BatchRung.result must be callable or None, got "
                            f"{type(self.result).__name__}")
        if not isinstance(self.settings, BatchSettings):
            raise TypeError(f"BatchRung.settings must be a BatchSettings, got "
                            f"{type(self.settings).__name__}")

    def run(self, ctx: StepContext, route: Route, *, cost: Cost | None, discount: float,
            degraded: bool, clock: Clock, limiter: Limiter | None) -> Outcome:
        """One delivery of the step on the batch rung: its outcome, on the rung ``batch``."""
        body = self.request(ctx, route)
        step = BatchStep(provider=self.provider, route=route, items=lambda _: {ctx.step: body},
                         queue=self._queue(limiter), settings=self.settings,
                         tokens=self.tokens, clock=clock)
        out = step(ctx)
        if out.status is not Status.COMPLETED:  # a wait between polls, or a refused batch
            return replace(out, route=route, rung="batch")
        ended = out.value
        if ended["status"][ctx.step] != "succeeded":
            reason = ended["errors"].get(ctx.step, "no reason given")
            exhausted = ctx.step in ended["exhausted"]
            return Outcome(
                status=Status.FAILED_RETRY_EXHAUSTED if exhausted else Status.INVALID,
                reason=f"on the batch rung ({route.scope}): {reason}", route=route,
                rung="batch")
        answer = ended["results"][ctx.step]
        batches = ", ".join(ended["batches"])
        return Outcome(
            status=Status.DEGRADED if degraded else Status.COMPLETED,
            reason=f"served on the batch rung ({route.scope}) by batch {batches}",
            value=answer if self.result is None else self.result(answer),
            route=route,
            rung="batch",
            cost_usd=served_cost_usd(route, usage_of(Returned(answer)), cost or Cost(),
                                     discount),
        )

    def _queue(self, limiter: Limiter | None) -> HeldCapacity | None:
        if self.queue is not None:
            return self.queue
        return HeldCapacity(limiter) if limiter is not None else None


def batch_rung_outcome(effect: RunBatch, ctx: StepContext, *, policy: Policy, limiter: Any,
                       clock: Clock) -> Outcome:
    """Perform :class:`~rateloop.tasks.flow.RunBatch` (blocking), for both task runners.

    ``ctx`` is the step's context with its progress saver.  The price is the
    policy's batch discount; the step is ``degraded`` unless batch is the
    first rung of its call's ladder.
    """
    step, route = effect.step, effect.route
    assert step.batch is not None and step.route is not None  # the flow checked
    first = ladder_chain(step.route, step.fallbacks, policy.ladder, effect.priority)[0][0]
    return step.batch.run(
        ctx, route, cost=step.cost, discount=tier_discount(policy.ladder, "batch"),
        degraded=first != route, clock=clock,
        limiter=limiter if isinstance(limiter, Limiter) else None)
