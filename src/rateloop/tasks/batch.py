"""A provider's batch API as one durable task step: :class:`BatchStep`.

How it works.  The step is called once per delivery of its task, and each
call does one thing and returns: submit, poll once, or collect.  Between
calls the task is parked (a ``waiting_for_capacity`` outcome with
``retry_at``), so no worker is held while a batch runs.  Its state is the
step's progress in the task's checkpoint (``ctx.save_progress``):

1. **Submit** the items not yet settled (the first ``max_items`` that fit the
   scope's enqueued-token limit).  First hold their input tokens in the
   batch queue's scope (``{route.scope}:batch``, or the route's own scope
   when it is at the batch tier: ``openai:gpt-5~batch:proj``; a :class:`HeldCapacity`
   keyed by the submission): denied, the step waits; then checkpoint the
   submission *mark* — its key (``<step idempotency key>:r<round>``), the
   items, the time — and only then call the provider; then checkpoint the
   batch id and park until the first poll.
2. A delivery that finds a mark without a batch id (the worker died between
   the submit and its checkpoint) **looks the key up** at the provider
   (OpenAI: the batch's ``metadata``; Anthropic: the tag in the
   ``custom_id`` s of the batches created since the mark) and adopts what it
   finds; it submits only when the provider has none.  So a batch is
   submitted once per round, whatever crashes.
3. **Poll** once per wake, backing off (``first_poll_secs`` doubling up to
   ``max_poll_secs``).  Once the batch ended: release the held tokens, keep
   each success, fail each item the provider rejected (a 400, over the
   model's limits, a bad line) with its reason, and retry the others (5xx,
   expired, cancelled, held back by another line) in the next round, at most
   ``max_rounds`` rounds.  A batch the provider refused for its own
   enqueued-token limit counts no round: it waits and resubmits.
4. When every item is settled the step completes with per-item results and
   status, and the batch price: ``discount`` 0.5 at OpenAI and Anthropic.

Adapters: :class:`OpenAIBatches`, :class:`AnthropicBatches` (httpx).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from rateloop._clock import Clock, system_clock
from rateloop.admission.holds import HeldCapacity
from rateloop.outcome.record import Outcome, Status
from rateloop.route import Route
from rateloop.tasks._batch_anthropic import AnthropicBatches
from rateloop.tasks._batch_openai import OpenAIBatches
from rateloop.tasks._batch_wire import (
    BatchProvider,
    BatchRejected,
    Ended,
    Transient,
    submission_tag,
)
from rateloop.tasks.definition import StepContext

__all__ = ["BATCH_PRICING", "AnthropicBatches", "BatchSettings", "BatchStep", "OpenAIBatches"]

#: The batch tier's price, by provider: a fraction off the standard price, and where it is
#: stated.  OpenAI: "a 50% cost discount compared to synchronous APIs"; Anthropic:
#: "reducing costs by 50%".
BATCH_PRICING: Mapping[str, Mapping[str, Any]] = {
    "openai": {"tier": "batch", "discount": 0.5,
               "source": "https://platform.openai.com/docs/guides/batch"},
    "anthropic": {"tier": "batch", "discount": 0.5,
                  "source": "https://platform.claude.com/docs/en/build-with-claude/"
                            "batch-processing"},
}

#: A hold outlives the provider's 24 h completion window by this much (finalizing, polls).
_HOLD_SLACK_SECS = 3600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchSettings:
    """How a batch step polls and retries."""

    first_poll_secs: float = 60.0
    max_poll_secs: float = 1800.0
    max_rounds: int = 3
    max_items: int = 50_000
    window_secs: float = 86_400.0

    def __post_init__(self) -> None:
        for name in ("first_poll_secs", "max_poll_secs", "window_secs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"BatchSettings.{name} must be a number of seconds > 0, "
                                 f"got {value!r}")
        for name in ("max_rounds", "max_items"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"BatchSettings.{name} must be an integer >= 1, got {value!r}")


def estimate_tokens(body: Any) -> int:
    """A cautious input-token estimate of one request: a token per 4 characters of JSON."""
    text = body if isinstance(body, str) else json.dumps(body)
    return len(text) // 4 + 1


class BatchStep:
    """A step function that runs ``items(ctx)`` as provider batches; add it with ``t.step(name)``.

    ``items(ctx)`` returns ``{item_id: request}``, the same on every delivery
    (derive it from ``ctx.args`` or earlier results); a request is the body
    of one chat completion (OpenAI) or the ``params`` of one message
    (Anthropic), or its JSON text as is.  ``route`` names the provider, model
    and project: the held tokens go to ``{route.scope}:batch`` (a batch-tier route's
    own scope, ``openai:gpt-5~batch:proj``, when ``route.tier == "batch"``).
    """

    def __init__(
        self,
        *,
        provider: BatchProvider,
        route: Route,
        items: Callable[[StepContext], Mapping[str, Any]],
        queue: HeldCapacity | None = None,
        settings: BatchSettings | None = None,
        tokens: Callable[[Any], int] = estimate_tokens,
        clock: Clock | None = None,
    ) -> None:
        self.provider, self.route, self.items, self.queue = provider, route, items, queue
        self.settings = settings if settings is not None else BatchSettings()
        self.tokens = tokens
        self.clock = clock if clock is not None else system_clock
        self.__name__ = "batch"  # a step function's name, when t.step() is given none

    def __repr__(self) -> str:
        return f"BatchStep({self.provider!r}, scope={self.queue_scope!r})"

    @property
    def queue_scope(self) -> str:
        """Where the enqueued tokens are held: a batch-tier route's own scope
        (``openai:gpt-5~batch:proj``), else the route's scope plus ``:batch``."""
        return self.route.scope if self.route.tier == "batch" else f"{self.route.scope}:batch"

    # -- one delivery -----------------------------------------------------------------

    def __call__(self, ctx: StepContext) -> Outcome:
        items = _checked_items(self.items(ctx))
        state = _State.load(ctx.progress)
        now = self.clock.now()
        pending = state.pending
        try:
            if pending is not None and pending.get("batch_id") is None:
                found = self.provider.find(pending["key"], pending["tag"],
                                           datetime.fromisoformat(pending["marked_at"]))
                if found.batch_id is not None:  # it reached the provider: adopt it
                    pending["batch_id"] = found.batch_id
                    state.batches.append(found.batch_id)
                    ctx.save_progress(state.dump())
                elif found.unknown:
                    return self._wait(ctx, state, now, f"looking for the batch submitted "
                                      f"before a crash: {found.unknown} batches may be it")
                else:
                    state.pending = pending = None  # never reached the provider
            if pending is not None:
                ended = self.provider.poll(pending["batch_id"], pending["tag"],
                                           len(pending["ids"]))
                if ended is None:
                    return self._wait(ctx, state, now, f"batch {pending['batch_id']} is running")
                self._collect(state, pending, ended)
                ctx.save_progress(state.dump())
                if ended.queue_full:
                    return self._wait(ctx, state, now, "the provider's enqueued-token limit "
                                      "is reached")
            return self._submit(ctx, state, items, now)
        except Transient as exc:
            return self._wait(ctx, state, now, f"the provider could not answer: {exc}")
        except BatchRejected as exc:
            return Outcome(status=Status.INVALID, reason=f"the provider refused: {exc}")

    def _submit(self, ctx: StepContext, state: _State, items: Mapping[str, Any],
                now: datetime) -> Outcome:
        remaining = [i for i in items if i not in state.done and i not in state.failed]
        if remaining and state.rounds >= self.settings.max_rounds:
            for item in remaining:
                state.failed[item] = (f"not done after {state.rounds} rounds: "
                                      f"{state.retry.get(item, 'no reason given')}")
            remaining = []
        if not remaining:
            return self._finish(items, state)
        chosen, tokens = self._fit(remaining, items, state)
        if not chosen:  # every remaining item alone was over the limit: failed now
            return self._submit(ctx, state, items, now)
        key = f"{ctx.idempotency_key}:r{state.rounds + state.refusals}"
        if self.queue is not None:
            held = self.queue.hold(self.queue_scope, key, tokens,
                                   ttl=self.settings.window_secs + _HOLD_SLACK_SECS)
            if not held:
                return self._wait(ctx, state, now, f"{self.queue_scope} holds {held.held:,} "
                                  f"of {held.limit:,} enqueued tokens; {tokens:,} more "
                                  "must wait")
        tag = submission_tag(key)
        state.pending = {"key": key, "tag": tag, "ids": chosen, "tokens": tokens,
                         "marked_at": now.isoformat(), "batch_id": None}
        state.polls = 0
        ctx.save_progress(state.dump())  # the mark: before the provider can have the batch
        batch_id = self.provider.submit(key, tag, [items[i] for i in chosen], self.route.model)
        state.pending["batch_id"] = batch_id
        state.batches.append(batch_id)
        return self._wait(ctx, state, now, f"batch {batch_id} submitted ({len(chosen)} items)")

    def _fit(self, remaining: list[str], items: Mapping[str, Any],
             state: _State) -> tuple[list[str], int]:
        """The next items to submit: in order, within ``max_items`` and the scope's limit."""
        limit = self.queue.limit(self.queue_scope) if self.queue is not None else None
        chosen: list[str] = []
        total = 0
        for item in remaining:
            need = self.tokens(items[item])
            if limit is not None and need > limit:
                state.failed[item] = (f"its ~{need:,} input tokens are over the enqueued-token "
                                      f"limit {limit:,} of {self.queue_scope}")
                continue
            if len(chosen) >= self.settings.max_items or (
                    limit is not None and total + need > limit):
                break
            chosen.append(item)
            total += need
        return chosen, total

    def _collect(self, state: _State, pending: dict[str, Any], ended: Ended) -> None:
        if self.queue is not None:
            self.queue.release(self.queue_scope, pending["key"])
        for position, item in enumerate(pending["ids"]):
            end = ended.items[position]
            if end.kind == "succeeded":
                state.done[item] = end.value
                state.retry.pop(item, None)
            elif end.kind == "failed":
                state.failed[item] = end.reason
                state.retry.pop(item, None)
            else:
                state.retry[item] = end.reason
        if ended.queue_full:
            state.refusals += 1
        else:
            state.rounds += 1
        state.pending = None

    def _wait(self, ctx: StepContext, state: _State, now: datetime, why: str) -> Outcome:
        s = self.settings
        delay = min(s.first_poll_secs * 2 ** min(state.polls, 30), s.max_poll_secs)
        state.polls += 1
        ctx.save_progress(state.dump())  # the batch id, when just submitted
        return Outcome(status=Status.WAITING_FOR_CAPACITY, reason=why,
                       retry_at=now + timedelta(seconds=delay))

    def _finish(self, items: Mapping[str, Any], state: _State) -> Outcome:
        status = {i: "succeeded" if i in state.done else "failed" for i in items}
        ok = sum(1 for v in status.values() if v == "succeeded")
        value = {
            "results": {i: state.done[i] for i in items if i in state.done},
            "status": status,
            "errors": {i: state.failed[i] for i in items if i in state.failed},
            # Still to retry when the rounds ran out (a rejected item leaves the retry list).
            "exhausted": [i for i in items if i in state.failed and i in state.retry],
            "provider": self.provider.name,
            "batches": list(state.batches),
            "rounds": state.rounds,
            "pricing": dict(BATCH_PRICING.get(self.provider.name, {"tier": "batch",
                                                                   "discount": None})),
        }
        return Outcome(status=Status.COMPLETED, value=value,
                       reason=f"{ok} of {len(items)} items succeeded in {state.rounds} rounds")


def _checked_items(items: Any) -> Mapping[str, Any]:
    if not isinstance(items, Mapping) or not items:
        raise ValueError(f"a batch step's items must be a non-empty mapping of item id to "
                         f"request, got {type(items).__name__}")
    for item, body in items.items():
        if not isinstance(item, str) or not item:
            raise ValueError(f"a batch item id must be a non-empty string, got {item!r}")
        if isinstance(body, str) and "\n" in body:
            raise ValueError(f"item {item!r}: a request given as JSON text must be one line")
        if not isinstance(body, str | Mapping):
            raise ValueError(f"item {item!r}: a request must be a mapping or its JSON text, "
                             f"got {type(body).__name__}")
    return items


@dataclass(slots=True)
class _State:
    """The step's progress, as checkpointed (JSON)."""

    done: dict[str, Any]
    failed: dict[str, str]
    retry: dict[str, str]
    batches: list[str]
    rounds: int = 0
    refusals: int = 0
    polls: int = 0
    pending: dict[str, Any] | None = None

    @classmethod
    def load(cls, data: Any) -> _State:
        data = data if isinstance(data, Mapping) else {}
        return cls(done=dict(data.get("done", {})), failed=dict(data.get("failed", {})),
                   retry=dict(data.get("retry", {})), batches=list(data.get("batches", [])),
                   rounds=int(data.get("rounds", 0)), refusals=int(data.get("refusals", 0)),
                   polls=int(data.get("polls", 0)), pending=data.get("pending"))

    def dump(self) -> dict[str, Any]:
        return {"done": self.done, "failed": self.failed, "retry": self.retry,
                "batches": self.batches, "rounds": self.rounds, "refusals": self.refusals,
                "polls": self.polls, "pending": self.pending}
