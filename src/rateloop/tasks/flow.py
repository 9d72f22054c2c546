"""The algorithm of one delivery of a task, as a generator of effects (sans-IO).

How it works: a worker has claimed a task.  :func:`task_flow` checks that it
may run it, then runs the remaining steps one by one.  It never does I/O: it
yields :class:`RunStep` (run step *i* through the RATE loop) and
:class:`Save` (write the record, fenced), and receives what happened.
:class:`~rateloop.tasks.TaskRunner` performs the effects with blocking
calls, :class:`~rateloop.tasks.AsyncTaskRunner` with ``await`` — the pattern
of :mod:`rateloop.loop` (``flow`` + ``effects``).

The rules, in order:

1. No definition of the task's name here, a checkpoint of another
   ``workflow_version``, or steps that differ from the checkpoint's →
   ``needs_operator`` (never a misread of an old checkpoint).
2. The deadline has passed → ``expired``, listing the remaining steps.
3. The retry budget is spent (wakes and redeliveries) → ``failed_retry_exhausted``
   (``partial`` when some steps are done).
4. Each step: the outcome ``completed``/``degraded`` is checkpointed before the
   next step starts; ``waiting_for_reset``/``waiting_for_capacity`` parks the
   task until ``retry_at`` and releases it (``expired`` when that is past the
   deadline); ``needs_operator``/``invalid``/``rejected`` → ``needs_operator``;
   ``failed_retry_exhausted`` → that, or ``partial`` when some steps are done.
   A step that raises ends the task ``needs_operator`` (a bug, not a refusal); the
   reason names the exception's type, never its message.
5. After a checkpoint, a worker asked to stop (SIGTERM) releases the task
   (``queued``, due now) instead of starting the next step.
6. A write (``idempotent=False``) is marked in flight by a checkpoint before it
   runs (``pending_operation.started_delivery``); its answer clears the mark.
   A later delivery that finds the mark (the worker died, or lost its lease,
   with the write unanswered) asks ``outcome_check(ctx, route)`` on the step's
   route and each explicit fallback before anything else, as the loop does for
   an ambiguous answer: ``applied`` records the step done (result ``None``)
   without running it; ``not_applied`` on every route runs it; no check, a check
   that cannot tell, or one that raises → ``needs_operator``
   (``unknown_outcome``), and an operator's ``retry`` then runs it.
7. A step may checkpoint its own progress while it runs (``ctx.save_progress``,
   performed by the runner on the record of its :class:`RunStep`, fenced); the
   next delivery of the step reads it in ``ctx.progress``; completing the step
   clears it.  A long operation (a provider's batch) records what it started
   there before it can be lost, and parks with a waiting outcome between polls.
8. A step whose call the degrade ladder hands to the batch rung (an outcome
   ``waiting_for_capacity`` with ``next_rung == "batch"``) and that has
   ``batch=`` goes to the provider's batch API instead of parking: the
   checkpoint records the batch-tier route (``batch_route``), and this and
   every later delivery of the step runs :class:`RunBatch` (submit, poll
   once, or collect: :mod:`rateloop.tasks.batch_rung`) instead of the loop,
   its waits parking as in rule 4, until the step ends; a step that ends
   unsuccessfully there drops the route, so an operator's retry walks the
   ladder again.  Without ``batch=``, and for ``next_rung == "park"``, the
   step parks as in rule 4.

Every checkpoint of a running task is also a lease check: a refused save (the
fence moved: the lease was taken, or an operator cancelled) ends the delivery
before another step starts.
"""

from __future__ import annotations

import json
from collections.abc import Generator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from rateloop.outcome.record import Outcome, Status
from rateloop.route import Priority, Route
from rateloop.tasks.definition import Step, StepContext, Task
from rateloop.tasks.model import CompletedStep, PendingOperation, TaskRecord
from rateloop.tasks.states import TaskState
from rateloop.timing.writes import WriteOutcome, normalize_write_outcome

__all__ = [
    "CheckReply",
    "CheckWrite",
    "RunBatch",
    "RunStep",
    "Save",
    "SaveAck",
    "StepResult",
    "earlier_write",
    "task_flow",
]

#: Where a waiting outcome carries no retry_at (it should), try again after this long.
DEFAULT_PARK_SECS = 60.0


@dataclass(frozen=True, slots=True)
class RunStep:
    step: Step
    context: StepContext
    deadline: datetime | None
    priority: Priority
    #: The record as it stands: a progress save (``ctx.save_progress``) writes it, fenced.
    record: TaskRecord | None = None


@dataclass(frozen=True, slots=True)
class RunBatch:
    """Run one delivery of step *i*'s call on the batch rung (``step.batch``) at ``route``.

    The reply is a :class:`StepResult`, as for :class:`RunStep`."""

    step: Step
    context: StepContext
    route: Route
    priority: Priority
    record: TaskRecord | None = None


@dataclass(frozen=True, slots=True)
class StepResult:
    outcome: Outcome | None
    error: BaseException | None
    now: datetime
    #: ``(value,)``: the last progress the step saved while it ran; ``None``: it saved none.
    progress: tuple[Any] | None = None


@dataclass(frozen=True, slots=True)
class Save:
    record: TaskRecord


@dataclass(frozen=True, slots=True)
class SaveAck:
    ok: bool  # False: the lease was lost (expired and retaken, or cancelled)
    stop: bool  # the worker is asked to stop
    now: datetime


@dataclass(frozen=True, slots=True)
class CheckWrite:
    """Ask ``step.outcome_check(context, route)`` whether an earlier delivery's write landed."""

    step: Step
    context: StepContext
    route: Route


@dataclass(frozen=True, slots=True)
class CheckReply:
    verdict: Any  # what the check returned, not yet normalized
    error: BaseException | None


Effect = RunStep | RunBatch | Save | CheckWrite
Flow = Generator[Effect, Any, TaskRecord | None]

_FAILED_TO_STATE = {
    Status.NEEDS_OPERATOR: TaskState.NEEDS_OPERATOR,
    Status.INVALID: TaskState.NEEDS_OPERATOR,
    Status.REJECTED: TaskState.NEEDS_OPERATOR,
    Status.FAILED_RETRY_EXHAUSTED: TaskState.FAILED_RETRY_EXHAUSTED,
}


def _listing(names: tuple[str, ...]) -> str:
    return ", ".join(names) if names else "none"


def _json_value(value: Any) -> Any:
    json.dumps(value)  # a TypeError names the type
    return value


def earlier_write(step: Step, context: StepContext) -> Generator[Effect, Any, Outcome | None]:
    """Rule 6: the outcome of an earlier delivery's unanswered write; None to run it now.

    Shared with the Celery integration (:mod:`rateloop.integrations.celery`), whose
    redelivered writes are settled by the same rule."""
    routes = (step.route, *(step.fallbacks or ())) if step.route is not None else ()
    unknown = (f"unknown_outcome: step {step.name} (a write) may have taken effect in an "
               "earlier delivery")
    if step.outcome_check is None or not routes:
        missing = "there is no outcome_check" if routes else "it has no route to check it on"
        return Outcome(status=Status.NEEDS_OPERATOR, reason=f"{unknown} and {missing}")
    verdicts = []
    for route in routes:
        reply = yield CheckWrite(step, context, route)
        if reply.error is not None:  # its type only: the message may quote a secret
            raised = type(reply.error).__name__
            return Outcome(status=Status.NEEDS_OPERATOR,
                           reason=f"{unknown}; its outcome_check raised {raised}")
        try:
            verdict = normalize_write_outcome(reply.verdict)
        except ValueError as exc:
            return Outcome(status=Status.NEEDS_OPERATOR, reason=f"{unknown}; {exc}")
        if verdict is WriteOutcome.APPLIED:
            return Outcome(status=Status.COMPLETED,
                           reason="the write took effect (confirmed by outcome_check)")
        verdicts.append(verdict)
    if all(v is WriteOutcome.NOT_APPLIED for v in verdicts):
        return None
    return Outcome(status=Status.NEEDS_OPERATOR,
                   reason=f"{unknown}; outcome_check could not tell whether it did")


def _on_batch_rung(
    rec: TaskRecord, step: Step, context: StepContext, route: Route
) -> Generator[Effect, Any, tuple[TaskRecord, StepResult]]:
    """Rule 8: one delivery of the step's call on the batch rung, the record marked first.

    The mark (``batch_route``) reaches the store with the batch's own first
    progress save, before anything is submitted."""
    pending = PendingOperation.of(step.name, step.operation, route, step.cost)
    rec = rec.with_checkpoint(batch_route=route, pending_operation=pending)
    result = yield RunBatch(step, context, route, rec.priority, rec)
    if result.progress is not None:  # already saved; later saves must keep it
        rec = rec.with_checkpoint(step_progress=result.progress[0])
    return rec, result


def _handed_to_batch(step: Step, result: StepResult) -> Route | None:
    """The batch-tier route the loop handed the step's call to, when it has ``batch=``."""
    out = result.outcome
    if step.batch is None or out is None or out.next_rung != "batch" or out.route is None:
        return None
    return out.route


def _counted(rec: TaskRecord, out: Outcome) -> TaskRecord:
    """The record with the outcome's attempts in its ledger and its refusal, if any."""
    ledger = rec.checkpoint.attempts_used
    return rec.with_checkpoint(
        attempts_used=replace(
            ledger, loop=ledger.loop + out.attempts.loop, sdk=ledger.sdk + out.attempts.sdk
        ),
        signal=out.signal if out.signal is not None and not out.signal.ok
        else rec.checkpoint.signal,
    )


def task_flow(rec: TaskRecord, definition: Task | None, now: datetime) -> Flow:
    """Run one delivery of ``rec`` (already claimed); return the record as last saved."""
    def finish(state: TaskState, reason: str, record: TaskRecord | None = None) -> Flow:
        record = record if record is not None else rec
        done, left = record.completed, record.remaining
        if state in (TaskState.COMPLETED, TaskState.DEGRADED):
            visible = f"{state.value}: all {len(done)} steps done"
        else:
            visible = f"{state.value}: {reason}; done: {_listing(done)}; not done: {_listing(left)}"
        final = replace(
            record, state=state, lease_owner=None, lease_expires_at=None
        ).with_checkpoint(
            reason=reason, user_visible_status=visible,
            pending_operation=None if state in (TaskState.COMPLETED, TaskState.DEGRADED)
            else record.checkpoint.pending_operation,
        )
        ack = yield Save(final)
        return final if ack.ok else None

    if definition is None:
        return (yield from finish(
            TaskState.NEEDS_OPERATOR, f"this worker has no task named {rec.name!r}"))
    if rec.checkpoint.workflow_version != definition.version:
        return (yield from finish(
            TaskState.NEEDS_OPERATOR,
            f"workflow_version changed: the checkpoint is {rec.checkpoint.workflow_version!r}, "
            f"the worker runs {definition.version!r}",
        ))
    if definition.step_names != rec.steps:
        return (yield from finish(
            TaskState.NEEDS_OPERATOR,
            f"the steps changed without a version bump: checkpoint {list(rec.steps)}, "
            f"worker {list(definition.step_names)}",
        ))
    if rec.deadline is not None and now >= rec.deadline:
        return (yield from finish(TaskState.EXPIRED, "the deadline passed while the task waited"))

    def unsuccessful(reason: str) -> TaskState:
        return TaskState.PARTIAL if rec.checkpoint.completed_steps else TaskState(reason)

    if rec.checkpoint.retry_budget_remaining < 0:
        return (yield from finish(
            unsuccessful("failed_retry_exhausted"),
            "the task's retry budget (wakes and redeliveries) is spent",
        ))

    degraded = any(s.status == Status.DEGRADED.value for s in rec.checkpoint.completed_steps)
    steps = definition.steps
    while rec.checkpoint.current_step < len(steps):
        index = rec.checkpoint.current_step
        step = steps[index]
        ck = rec.checkpoint
        pending = PendingOperation.of(step.name, step.operation, step.route, step.cost)
        rec = rec.with_checkpoint(
            pending_operation=pending,
            outcome_check=step.outcome_check_ref,
            user_visible_status=f"running step {step.name} ({index + 1} of {len(steps)})",
        )
        context = StepContext(
            task_id=rec.task_id,
            step=step.name,
            index=index,
            args=rec.args,
            results={s.name: s.result for s in ck.completed_steps},
            idempotency_key=f"{ck.idempotency_key}:{step.name}",
            delivery=rec.deliveries,
            progress=ck.step_progress,
        )
        batch_route = ck.batch_route if step.batch is not None else None
        if batch_route is not None:  # rule 8: on the batch rung since an earlier delivery
            rec, result = yield from _on_batch_rung(rec, step, context, batch_route)
        else:
            earlier: Outcome | None = None
            in_flight = ck.pending_operation
            if (not step.idempotent and in_flight is not None and in_flight.step == step.name
                    and in_flight.started_delivery is not None):
                earlier = yield from earlier_write(step, context)
                if earlier is not None and not earlier.status.succeeded:
                    # The operator decides; a retry of theirs runs the write again.
                    rec = rec.with_checkpoint(pending_operation=pending)
                    return (yield from finish(TaskState.NEEDS_OPERATOR, earlier.reason))
            if earlier is not None:
                result = StepResult(earlier, None, now)
            else:
                if not step.idempotent:
                    rec = rec.with_checkpoint(
                        pending_operation=replace(pending, started_delivery=rec.deliveries))
                    ack = yield Save(rec)
                    if not ack.ok:
                        return None
                    now = ack.now
                result = yield RunStep(step, context, rec.deadline, rec.priority, rec)
                rec = rec.with_checkpoint(pending_operation=pending)  # the write answered
                if result.progress is not None:  # already saved; later saves must keep it
                    rec = rec.with_checkpoint(step_progress=result.progress[0])
        now = result.now
        if batch_route is None and (handed := _handed_to_batch(step, result)) is not None:
            assert result.outcome is not None
            rec = _counted(rec, result.outcome)  # the attempts on the rungs above
            # Rule 8: submit it now; the step's own progress (if any) is not the batch's.
            rec, result = yield from _on_batch_rung(
                rec, step, replace(context, progress=None), handed)
            now = result.now
        if result.error is not None:
            # The exception's type only: its message may quote a prompt or a secret.
            return (yield from finish(
                TaskState.NEEDS_OPERATOR,
                f"step {step.name} raised {type(result.error).__name__} (a bug, not a refusal)",
            ))
        out = result.outcome
        assert out is not None
        rec = _counted(rec, out)
        if out.status.succeeded:
            try:
                value = _json_value(out.value)
            except (TypeError, ValueError) as exc:
                return (yield from finish(
                    TaskState.NEEDS_OPERATOR,
                    f"step {step.name} returned a value that cannot be checkpointed as JSON "
                    f"({type(out.value).__name__}: {exc})",
                ))
            degraded = degraded or out.status is Status.DEGRADED
            rec = rec.with_checkpoint(
                current_step=index + 1,
                completed_steps=(*rec.checkpoint.completed_steps, CompletedStep(
                    index=index, name=step.name, status=out.status.value, result=value,
                    attempts=out.attempts.loop, rung=out.rung, cost_usd=out.cost_usd)),
                pending_operation=None,
                step_progress=None,
                batch_route=None,
            )
            if index + 1 == len(steps):
                break
            rec = rec.with_checkpoint(
                user_visible_status=f"step {step.name} done ({index + 1} of {len(steps)})"
            )
            ack = yield Save(rec)
            if not ack.ok:
                return None
            if ack.stop:
                released = replace(
                    rec, state=TaskState.QUEUED, next_attempt_at=ack.now,
                    lease_owner=None, lease_expires_at=None,
                ).with_checkpoint(next_attempt_at=ack.now,
                                  user_visible_status="queued: the worker stopped between steps")
                ack = yield Save(released)
                return released if ack.ok else None
            continue
        if out.status in (Status.WAITING_FOR_RESET, Status.WAITING_FOR_CAPACITY):
            retry_at = out.retry_at or now + timedelta(seconds=DEFAULT_PARK_SECS)
            if rec.deadline is not None and retry_at >= rec.deadline:
                return (yield from finish(
                    TaskState.EXPIRED,
                    f"step {step.name} can run again at {retry_at.isoformat()}, past the "
                    f"deadline {rec.deadline.isoformat()}",
                ))
            if rec.checkpoint.retry_budget_remaining <= 0:
                return (yield from finish(
                    unsuccessful("failed_retry_exhausted"),
                    f"step {step.name} must wait and the task's retry budget is spent",
                ))
            state = TaskState(out.status.value)
            parked = replace(
                rec, state=state, next_attempt_at=retry_at, lease_owner=None, lease_expires_at=None
            ).with_checkpoint(
                next_attempt_at=retry_at,
                reason=out.reason,
                user_visible_status=(
                    f"{state.value}: step {step.name} waits until {retry_at.isoformat()} "
                    f"({out.reason}); done: {_listing(rec.completed)}; "
                    f"not done: {_listing(rec.remaining)}"
                ),
            )
            ack = yield Save(parked)
            return parked if ack.ok else None
        if rec.checkpoint.batch_route is not None:  # rule 8: a retry walks the ladder again
            rec = rec.with_checkpoint(batch_route=None, step_progress=None)
        failed = _FAILED_TO_STATE.get(out.status, TaskState.NEEDS_OPERATOR)
        if failed is TaskState.FAILED_RETRY_EXHAUSTED:
            failed = unsuccessful(failed.value)
        return (yield from finish(failed, f"step {step.name}: {out.status.value}: {out.reason}"))

    return (yield from finish(
        TaskState.DEGRADED if degraded else TaskState.COMPLETED,
        "a fallback route did part of the work" if degraded else "all steps done",
        rec,
    ))
