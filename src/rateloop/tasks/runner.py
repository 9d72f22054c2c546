"""Submit tasks and run them: :class:`TaskRunner` (sync) and :class:`AsyncTaskRunner`.

Both perform the effects of :func:`rateloop.tasks.flow.task_flow`; the
algorithm exists once.  A runner holds one store and one RATE loop; while a
step runs, a heartbeat extends the task's lease every ``lease_secs / 3``, and
every checkpoint of a running task renews it (``now + lease_secs``; the store
never lets a checkpoint shorten it), so only a dead worker loses its lease.
A worker whose checkpoint is refused (the fence moved) stops before its next
step.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from rateloop._clock import Clock, system_clock
from rateloop.loop.drivers import AsyncRateLoop, CallOptions, RateLoop
from rateloop.outcome.record import Outcome, Status
from rateloop.policy import Policy
from rateloop.route import Route
from rateloop.tasks.batch_rung import batch_rung_outcome
from rateloop.tasks.definition import LeaseLost, StepContext, Task, TaskRegistry, registry
from rateloop.tasks.flow import (
    CheckReply,
    CheckWrite,
    RunBatch,
    RunStep,
    Save,
    SaveAck,
    StepResult,
    task_flow,
)
from rateloop.tasks.model import Checkpoint, TaskRecord
from rateloop.tasks.queue import QueuePolicy
from rateloop.tasks.states import PriorityClass, TaskState
from rateloop.tasks.store import TaskStore

__all__ = ["AsyncTaskRunner", "TaskRunner", "check_write"]

_log = logging.getLogger("rateloop.tasks")


def _when(value: datetime | float | None, now: datetime, what: str) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return now + timedelta(seconds=float(value))
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value
    raise ValueError(f"{what} must be an aware datetime or seconds from now, got {value!r}")


def _check_of(effect: RunStep) -> Callable[[Route], Any] | None:
    check, ctx = effect.step.outcome_check, effect.context
    if check is None:
        return None
    return lambda route: check(ctx, route)


def _call_options(effect: RunStep) -> CallOptions:
    """The RATE loop's options for a routed step, the same for both runners."""
    step = effect.step
    return CallOptions(
        cost=step.cost,
        operation=step.operation,
        idempotent=step.idempotent,
        deadline=effect.deadline,
        fallbacks=step.fallbacks,
        priority=effect.priority,
        task_id=effect.context.task_id,
        outcome_check=_check_of(effect),
    )


class _BaseRunner:
    def __init__(
        self,
        store: TaskStore,
        *,
        tasks: TaskRegistry | Iterable[Task] | None = None,
        policy: QueuePolicy | None = None,
        clock: Clock | None = None,
        worker_id: str | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.store = store
        if tasks is None:
            tasks = registry
        self.tasks = tasks if isinstance(tasks, TaskRegistry) else TaskRegistry(tasks)
        self.policy = policy if policy is not None else QueuePolicy()
        self.clock = clock if clock is not None else system_clock
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.stop = stop if stop is not None else threading.Event()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.store!r}, worker_id={self.worker_id!r})"

    def new_record(
        self,
        t: Task | str,
        args: Mapping[str, Any] | None,
        *,
        task_id: str | None,
        priority: PriorityClass | str,
        deadline: datetime | float | None,
        not_before: datetime | float | None,
        idempotency_key: str | None,
    ) -> TaskRecord:
        """A checked, unsaved record of ``t`` with ``args``: what ``submit`` saves."""
        definition = self.tasks.get(t) if isinstance(t, str) else t
        if definition is None:
            known = ", ".join(self.tasks.names()) or "none"
            raise ValueError(f"no task named {t!r}; known: {known}")
        if not definition.steps:
            raise ValueError(f"task {definition.name!r} has no steps")
        try:
            cls = PriorityClass(priority)
        except ValueError:
            raise ValueError(
                f"priority must be one of {', '.join(p.value for p in PriorityClass)}, "
                f"got {priority!r}"
            ) from None
        data = dict(args or {})
        try:
            json.dumps(data)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"task arguments must be JSON-able: {exc}") from exc
        now = self.clock.now()
        due = _when(deadline, now, "deadline")
        start = _when(not_before, now, "not_before") or now
        tid = task_id or uuid.uuid4().hex
        return TaskRecord(
            task_id=tid,
            name=definition.name,
            state=TaskState.QUEUED,
            priority=cls,
            args=data,
            steps=definition.step_names,
            checkpoint=Checkpoint(
                task_id=tid,
                run_id=uuid.uuid4().hex,
                workflow_version=definition.version,
                retry_budget_remaining=self.policy.max_deliveries,
                next_attempt_at=start,
                task_deadline=due,
                idempotency_key=idempotency_key or tid,
                user_visible_status="queued",
            ),
            created_at=now,
            updated_at=now,
            next_attempt_at=start,
            deadline=due,
        )

    def claim(self) -> TaskRecord | None:
        """Lease the most urgent ready task this runner has a definition for, or None.

        Blocking (the async runner calls it in a thread).  The others stay queued
        for a runner that knows them.
        """
        return self.store.claim(
            self.worker_id, lease_secs=self.policy.lease_secs, names=self.tasks.names()
        )

    def _log_delivery(self, claimed: TaskRecord, last: TaskRecord | None) -> None:
        # Ids, states and the loop's reasons only: never the task's arguments or results.
        if last is None:
            # The store refused the write: the fence moved on.  Who has it now is in
            # `rateloop tasks show` (the next delivery names this worker).
            _log.warning(
                "task %s (%s): worker %s lost its lease (fence %d): it expired and another "
                "worker took the task, or an operator cancelled it; the work since the last "
                "checkpoint is not saved", claimed.task_id, claimed.name, self.worker_id,
                claimed.fence,
            )
            return
        _log.info("task %s (%s): %s at step %d/%d: %s", last.task_id, last.name,
                  last.state.value, last.checkpoint.current_step, len(last.steps),
                  last.checkpoint.reason)

    def _ack(self, ok: bool) -> SaveAck:
        return SaveAck(ok=ok, stop=self.stop.is_set(), now=self.clock.now())

    def _renewed(self, record: TaskRecord) -> TaskRecord:
        """A running record's checkpoint renews its lease: it is proof that its worker lives."""
        if record.state is not TaskState.RUNNING:
            return record
        expires = self.clock.now() + timedelta(seconds=self.policy.lease_secs)
        return replace(record, lease_expires_at=expires)


    def _progress_saver(self, effect: RunStep | RunBatch) -> tuple[StepContext, list[Any]]:
        """The step's context with a ``save_progress`` that checkpoints now, fenced.

        The list receives each saved value, so the flow keeps the last one in
        its record (and its later saves do not undo it).
        """
        saved: list[Any] = []
        record = effect.record
        if record is None:
            return effect.context, saved

        def save(progress: Any) -> None:
            json.dumps(progress)  # a TypeError names the type; nothing is written
            nonlocal record
            assert record is not None
            updated = record.with_checkpoint(step_progress=progress)
            if not self.store.save(self._renewed(updated), fence=updated.fence):
                raise LeaseLost(f"task {updated.task_id}: the store refused the progress of "
                                f"step {effect.step.name}: the lease is lost")
            record = updated
            saved.append(progress)

        return replace(effect.context, saver=save), saved

    def _on_batch_rung(self, effect: RunBatch, policy: Policy, limiter: Any) -> StepResult:
        """Perform :class:`RunBatch` (blocking): the step's ``batch=`` on the runner's terms."""
        ctx, saved = self._progress_saver(effect)
        try:
            out = batch_rung_outcome(effect, ctx, policy=policy, limiter=limiter, clock=self.clock)
        except Exception as exc:
            return self._result(None, exc, self.clock.now(), saved)
        return self._result(out, None, self.clock.now(), saved)

    @staticmethod
    def _result(out: Outcome | None, error: BaseException | None, now: datetime,
                saved: list[Any]) -> StepResult:
        return StepResult(out, error, now, (saved[-1],) if saved else None)

    @staticmethod
    def _local(value: Any) -> Outcome:
        if isinstance(value, Outcome):
            return value
        return Outcome(status=Status.COMPLETED, reason="local step", value=value)


class TaskRunner(_BaseRunner):
    """Submit tasks to a store and run them, blocking.

    ``loop`` is the :class:`~rateloop.RateLoop` steps with a route go through
    (its policy, limiter and event sinks apply to them).
    """

    def __init__(self, store: TaskStore, *, loop: RateLoop | None = None, **kw: Any) -> None:
        super().__init__(store, **kw)
        self.loop = loop if loop is not None else RateLoop(clock=self.clock)

    def submit(
        self,
        t: Task | str,
        args: Mapping[str, Any] | None = None,
        *,
        task_id: str | None = None,
        priority: PriorityClass | str = PriorityClass.INTERACTIVE,
        deadline: datetime | float | None = None,
        not_before: datetime | float | None = None,
        idempotency_key: str | None = None,
    ) -> TaskRecord:
        """Queue a task; the record comes back ``queued`` or ``rejected`` (with the reason)."""
        rec = self.new_record(
            t, args, task_id=task_id, priority=priority, deadline=deadline,
            not_before=not_before, idempotency_key=idempotency_key,
        )
        return self.store.submit(rec, self.policy)

    def run_next(self) -> TaskRecord | None:
        """Claim the most urgent ready task and run it; None when nothing is ready."""
        rec = self.claim()
        if rec is None:
            return None
        return self.run_claimed(rec)

    def run_until_idle(self, *, limit: int | None = None) -> list[TaskRecord]:
        """Run ready tasks until none is ready (or ``limit`` deliveries); the records run."""
        done: list[TaskRecord] = []
        while limit is None or len(done) < limit:
            if self.stop.is_set():
                break
            rec = self.claim()
            if rec is None:
                break
            last = self.run_claimed(rec)
            done.append(last if last is not None else rec)
        return done

    def run_claimed(self, rec: TaskRecord) -> TaskRecord | None:
        """Run one claimed task; the record as last saved, None when its lease was lost."""
        flow = task_flow(rec, self.tasks.get(rec.name), self.clock.now())
        beat = _Heartbeat(self.store, rec, self.policy)
        beat.start()
        try:
            result: Any = None
            while True:
                try:
                    effect = flow.send(result)
                except StopIteration as stop:
                    self._log_delivery(rec, stop.value)
                    return stop.value  # type: ignore[no-any-return]
                if isinstance(effect, Save):
                    saved = self.store.save(self._renewed(effect.record), fence=rec.fence)
                    result = self._ack(saved)
                elif isinstance(effect, CheckWrite):
                    result = check_write(effect)
                elif isinstance(effect, RunBatch):
                    result = self._on_batch_rung(effect, self.loop.policy, self.loop.limiter)
                else:
                    result = self._run_step(effect)
        finally:
            beat.finish()

    def _run_step(self, effect: RunStep) -> StepResult:
        step = effect.step
        ctx, saved = self._progress_saver(effect)
        try:
            if step.route is not None:
                out = self.loop.call(
                    lambda route: step.fn(ctx, route), route=step.route, **_call_options(effect)
                )
            else:
                out = self._local(_not_awaitable(step.fn(ctx), f"step {step.name}"))
        except Exception as exc:
            return self._result(None, exc, self.clock.now(), saved)
        return self._result(out, None, self.clock.now(), saved)


def _ask(effect: CheckWrite) -> Any:
    check = effect.step.outcome_check
    assert check is not None  # the flow asks only a step that has one
    return check(effect.context, effect.route)


def check_write(effect: CheckWrite) -> CheckReply:
    """Answer the flow's ``CheckWrite`` with a blocking ``outcome_check``: its verdict, or the
    exception it raised (a coroutine is refused: a blocking runner cannot await it)."""
    try:
        verdict = _not_awaitable(_ask(effect), f"the outcome_check of step {effect.step.name}")
    except Exception as exc:
        return CheckReply(None, exc)
    return CheckReply(verdict, None)


def _not_awaitable(value: Any, what: str) -> Any:
    """``value``, from a function the sync runner called; a coroutine is closed and refused."""
    if inspect.isawaitable(value):
        close = getattr(value, "close", None)
        if close is not None:
            close()
        raise TypeError(f"{what} is a coroutine function; use AsyncTaskRunner")
    return value


class _Heartbeat:
    """Extend a claimed task's lease from a thread while its step runs (real time: liveness)."""

    def __init__(self, store: TaskStore, rec: TaskRecord, policy: QueuePolicy) -> None:
        self._store, self._rec, self._policy = store, rec, policy
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rateloop-heartbeat", daemon=True)
        self.lost = False

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(self._policy.heartbeat_secs):
            try:
                ok = self._store.heartbeat(
                    self._rec.task_id, self._rec.fence, lease_secs=self._policy.lease_secs
                )
            except Exception:  # the store is unreachable now; the save will say so
                continue
            if not ok:
                self.lost = True
                return

    def finish(self) -> None:
        self._done.set()
        self._thread.join()


class AsyncTaskRunner(_BaseRunner):
    """The asyncio twin of :class:`TaskRunner`; store calls run in a worker thread."""

    def __init__(self, store: TaskStore, *, loop: AsyncRateLoop | None = None, **kw: Any) -> None:
        super().__init__(store, **kw)
        self.loop = loop if loop is not None else AsyncRateLoop(clock=self.clock)

    async def submit(
        self,
        t: Task | str,
        args: Mapping[str, Any] | None = None,
        *,
        task_id: str | None = None,
        priority: PriorityClass | str = PriorityClass.INTERACTIVE,
        deadline: datetime | float | None = None,
        not_before: datetime | float | None = None,
        idempotency_key: str | None = None,
    ) -> TaskRecord:
        """Queue a task; see :meth:`TaskRunner.submit`."""
        rec = self.new_record(
            t, args, task_id=task_id, priority=priority, deadline=deadline,
            not_before=not_before, idempotency_key=idempotency_key,
        )
        return await asyncio.to_thread(self.store.submit, rec, self.policy)

    async def run_next(self) -> TaskRecord | None:
        rec = await asyncio.to_thread(self.claim)
        if rec is None:
            return None
        return await self.run_claimed(rec)

    async def run_until_idle(self, *, limit: int | None = None) -> list[TaskRecord]:
        done: list[TaskRecord] = []
        while limit is None or len(done) < limit:
            if self.stop.is_set():
                break
            rec = await asyncio.to_thread(self.claim)
            if rec is None:
                break
            last = await self.run_claimed(rec)
            done.append(last if last is not None else rec)
        return done

    async def run_claimed(self, rec: TaskRecord) -> TaskRecord | None:
        flow = task_flow(rec, self.tasks.get(rec.name), self.clock.now())
        beat = asyncio.create_task(self._heartbeat(rec))
        try:
            result: Any = None
            while True:
                try:
                    effect = flow.send(result)
                except StopIteration as stop:
                    self._log_delivery(rec, stop.value)
                    return stop.value  # type: ignore[no-any-return]
                if isinstance(effect, Save):
                    ok = await asyncio.to_thread(
                        self.store.save, self._renewed(effect.record), fence=rec.fence
                    )
                    result = self._ack(ok)
                elif isinstance(effect, CheckWrite):
                    result = await self._check_write(effect)
                elif isinstance(effect, RunBatch):  # the batch API's client blocks
                    result = await asyncio.to_thread(
                        self._on_batch_rung, effect, self.loop.policy, self.loop.limiter)
                else:
                    result = await self._run_step(effect)
        finally:
            beat.cancel()
            await asyncio.gather(beat, return_exceptions=True)

    async def _heartbeat(self, rec: TaskRecord) -> None:
        while True:
            await asyncio.sleep(self.policy.heartbeat_secs)  # real time: this is liveness
            ok = await asyncio.to_thread(
                self.store.heartbeat, rec.task_id, rec.fence, lease_secs=self.policy.lease_secs
            )
            if not ok:
                return

    async def _check_write(self, effect: CheckWrite) -> CheckReply:
        try:
            verdict = _ask(effect)
            if inspect.isawaitable(verdict):
                verdict = await verdict
        except Exception as exc:
            return CheckReply(None, exc)
        return CheckReply(verdict, None)

    async def _run_step(self, effect: RunStep) -> StepResult:
        # A progress save blocks the event loop for one store write: rare (a batch's
        # submission), and it must land before the step goes on.
        step = effect.step
        ctx, saved = self._progress_saver(effect)
        try:
            if step.route is not None:
                out = await self.loop.call(
                    lambda route: step.fn(ctx, route), route=step.route, **_call_options(effect)
                )
            else:
                value = step.fn(ctx)
                if inspect.isawaitable(value):
                    value = await value
                out = self._local(value)
        except Exception as exc:
            return self._result(None, exc, self.clock.now(), saved)
        return self._result(out, None, self.clock.now(), saved)


