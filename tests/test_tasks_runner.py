"""The task flow through both runners (sync and async) on a fake clock and a real SQLite file."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from rateloop import Outcome, Policy, Priority, RateLoop, Route, Status
from rateloop.loop import AsyncRateLoop
from rateloop.tasks import (
    AsyncTaskRunner,
    QueuePolicy,
    StepContext,
    Task,
    TaskRecord,
    TaskRegistry,
    TaskRunner,
    TaskState,
    open_store,
    runtime_summary,
    task,
)
from rateloop.tasks.store import TaskStore
from rateloop.testing import FakeClock, FaultScript

ROUTE = Route(provider="openai", model="m")


def limited(retry_after: str) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "https://api.openai.com/v1/chat/completions")
    body = {"error": {"message": "Rate limit reached", "type": "requests",
                      "code": "rate_limit_exceeded"}}
    resp = httpx.Response(429, headers={"retry-after": retry_after}, json=body, request=request)
    return httpx.HTTPStatusError("429", request=request, response=resp)


class Harness:
    """Runs the same scenario through TaskRunner or AsyncTaskRunner."""

    def __init__(self, mode: str, store: TaskStore, clock: FakeClock, reg: TaskRegistry,
                 policy: QueuePolicy | None = None, stop: threading.Event | None = None) -> None:
        self.mode = mode
        self.store = store
        loop_policy = Policy.from_dict({"pause_limit_secs": 60, "backoff": {"jitter": "none"}})
        kw: dict[str, Any] = {"tasks": reg, "clock": clock, "policy": policy, "stop": stop}
        if mode == "sync":
            self.sync = TaskRunner(store, loop=RateLoop(loop_policy, clock=clock), **kw)
        else:
            self.asyn = AsyncTaskRunner(store, loop=AsyncRateLoop(loop_policy, clock=clock), **kw)

    def submit(self, t: Task | str, args: dict[str, Any] | None = None, **kw: Any) -> TaskRecord:
        if self.mode == "sync":
            return self.sync.submit(t, args, **kw)
        return asyncio.run(self.asyn.submit(t, args, **kw))

    def run(self) -> list[TaskRecord]:
        if self.mode == "sync":
            return self.sync.run_until_idle()
        return asyncio.run(self.asyn.run_until_idle())

    def get(self, task_id: str) -> TaskRecord:
        rec = self.store.get(task_id)
        assert rec is not None
        return rec


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> TaskStore:
    s = open_store(f"sqlite:///{tmp_path}/tasks.db", clock=clock)
    yield s  # type: ignore[misc]
    s.close()


def two_step(reg: TaskRegistry, calls: list[str], second: Callable[..., Any],
             *, route: Route | None = ROUTE, version: str = "1") -> Task:
    t = task("report", version=version, into=reg)

    @t.step()
    def fetch(ctx: StepContext) -> dict[str, Any]:
        calls.append("fetch")
        return {"rows": ctx.args["rows"]}

    def draft(ctx: StepContext, *rest: Any) -> Any:
        calls.append("draft")
        return second(ctx, *rest)

    t.step("draft", route=route)(draft)
    return t


def test_steps_run_in_order_and_each_result_is_checkpointed(
    mode: str, store: TaskStore, clock: FakeClock
) -> None:
    reg, calls = TaskRegistry(), []
    seen: list[Any] = []

    def second(ctx: StepContext, route: Route) -> dict[str, Any]:
        seen.append((ctx.results, ctx.idempotency_key, route.model))
        return {"text_ref": "blob:1"}

    t = two_step(reg, calls, second)
    h = Harness(mode, store, clock, reg)
    rec = h.submit(t, {"rows": 3}, idempotency_key="job-7")
    assert rec.state is TaskState.QUEUED
    h.run()
    done = h.get(rec.task_id)
    assert done.state is TaskState.COMPLETED
    assert calls == ["fetch", "draft"]
    assert seen == [({"fetch": {"rows": 3}}, "job-7:draft", "m")]
    assert done.result == {"text_ref": "blob:1"}
    assert [s.name for s in done.checkpoint.completed_steps] == ["fetch", "draft"]
    assert done.checkpoint.attempts_used.loop == 1
    assert done.lease_owner is None and done.checkpoint.pending_operation is None
    summary = runtime_summary(done)
    assert summary["done"] and summary["remaining_steps"] == []
    json.dumps(summary)


def test_a_rate_limited_step_parks_the_task_and_resumes_it_at_the_reset(
    mode: str, store: TaskStore, clock: FakeClock
) -> None:
    reg, calls = TaskRegistry(), []
    fn = FaultScript([limited("7200"), {"ok": True}])
    t = two_step(reg, calls, lambda ctx, route: fn(route))
    h = Harness(mode, store, clock, reg)
    rec = h.submit(t, {"rows": 1})
    h.run()
    parked = h.get(rec.task_id)
    assert parked.state.waiting  # capacity or reset: how far a wait counts as a reset is Read's
    assert parked.lease_owner is None  # released: no process holds it
    assert parked.next_attempt_at == clock.now() + timedelta(seconds=7200)
    assert parked.checkpoint.current_step == 1
    assert parked.checkpoint.signal is not None and parked.checkpoint.signal.status == 429
    assert parked.checkpoint.pending_operation is not None
    assert parked.checkpoint.pending_operation.to_dict() == {
        "step": "draft", "operation": "model.generate", "scope": "openai:m",
        "cost": {"requests": 1, "input_tokens": 0, "output_tokens": 0}}
    summary = runtime_summary(parked)
    assert summary["status"] == parked.state.value and not summary["done"]
    assert summary["completed_steps"] == ["fetch"] and summary["remaining_steps"] == ["draft"]
    assert summary["retry_at"] == parked.next_attempt_at.isoformat()
    assert summary["user_message_policy"] == "explain the delay without claiming completion"
    assert "completed" not in summary["user_visible_status"]

    assert h.run() == []  # nothing is due before the reset
    clock.advance(7200)
    h.run()
    done = h.get(rec.task_id)
    assert done.state is TaskState.COMPLETED
    assert calls == ["fetch", "draft", "draft"]  # the finished step did not run again
    assert done.checkpoint.attempts_used.wakes == 1
    assert done.checkpoint.attempts_used.loop == 2
    assert len(fn.calls) == 2


def test_deadline_passing_while_waiting_expires_with_the_remaining_steps(
    mode: str, store: TaskStore, clock: FakeClock
) -> None:
    reg, calls = TaskRegistry(), []
    t = two_step(reg, calls, lambda ctx: Outcome(
        status=Status.WAITING_FOR_RESET, reason="daily quota",
        retry_at=clock.now() + timedelta(seconds=300)), route=None)
    h = Harness(mode, store, clock, reg)
    rec = h.submit(t, {"rows": 1}, deadline=600)
    h.run()
    assert h.get(rec.task_id).state is TaskState.WAITING_FOR_RESET
    clock.advance(700)
    h.run()
    gone = h.get(rec.task_id)
    assert gone.state is TaskState.EXPIRED
    assert gone.remaining == ("draft",) and gone.completed == ("fetch",)
    assert "not done: draft" in gone.checkpoint.user_visible_status


def test_a_reset_past_the_deadline_expires_at_once(
    mode: str, store: TaskStore, clock: FakeClock
) -> None:
    reg, calls = TaskRegistry(), []
    t = two_step(reg, calls, lambda ctx: Outcome(
        status=Status.WAITING_FOR_RESET, reason="daily quota",
        retry_at=clock.now() + timedelta(hours=5)), route=None)
    h = Harness(mode, store, clock, reg)
    rec = h.submit(t, {"rows": 1}, deadline=3600)
    h.run()
    gone = h.get(rec.task_id)
    assert gone.state is TaskState.EXPIRED and "past the deadline" in gone.checkpoint.reason


def test_workflow_version_change_needs_an_operator(
    mode: str, store: TaskStore, clock: FakeClock
) -> None:
    reg, calls = TaskRegistry(), []
    old = two_step(reg, calls, lambda ctx, route: {"ok": 1}, version="1")
    rec = Harness(mode, store, clock, reg).submit(old, {"rows": 1})
    new_reg = TaskRegistry()
    two_step(new_reg, calls, lambda ctx, route: {"ok": 1}, version="2")
    h = Harness(mode, store, clock, new_reg)
    h.run()
    held = h.get(rec.task_id)
    assert held.state is TaskState.NEEDS_OPERATOR
    assert "workflow_version changed" in held.checkpoint.reason
    assert calls == []  # nothing ran against a checkpoint of another version
    store.retry(rec.task_id, accept_version="2")
    h.run()
    assert h.get(rec.task_id).state is TaskState.COMPLETED


def test_queue_full_is_rejected_at_submit(mode: str, store: TaskStore, clock: FakeClock) -> None:
    reg, calls = TaskRegistry(), []
    t = two_step(reg, calls, lambda ctx, route: {})
    h = Harness(mode, store, clock, reg, policy=QueuePolicy(max_depth=1))
    assert h.submit(t, {"rows": 1}).state is TaskState.QUEUED
    full = h.submit(t, {"rows": 1})
    assert full.state is TaskState.REJECTED and "queue full" in full.checkpoint.reason
    late = Harness(mode, store, clock, reg).submit(t, {"rows": 1}, not_before=120, deadline=60)
    assert late.state is TaskState.REJECTED


def test_a_step_that_fails_after_useful_work_is_partial(
    mode: str, store: TaskStore, clock: FakeClock
) -> None:
    reg, calls = TaskRegistry(), []
    t = two_step(reg, calls, lambda ctx: Outcome(
        status=Status.FAILED_RETRY_EXHAUSTED, reason="5 attempts"), route=None)
    h = Harness(mode, store, clock, reg)
    rec = h.submit(t, {"rows": 1})
    h.run()
    got = h.get(rec.task_id)
    assert got.state is TaskState.PARTIAL
    assert got.completed == ("fetch",) and got.remaining == ("draft",)


def test_a_degraded_step_makes_the_task_degraded(
    mode: str, store: TaskStore, clock: FakeClock
) -> None:
    reg, calls = TaskRegistry(), []
    t = two_step(reg, calls, lambda ctx: Outcome(status=Status.DEGRADED, reason="fallback",
                                                 value=1), route=None)
    h = Harness(mode, store, clock, reg)
    rec = h.submit(t, {"rows": 1})
    h.run()
    assert h.get(rec.task_id).state is TaskState.DEGRADED


def test_a_step_that_raises_needs_an_operator_without_leaking_secrets(
    mode: str, store: TaskStore, clock: FakeClock
) -> None:
    reg, calls = TaskRegistry(), []

    def boom(ctx: StepContext) -> None:
        raise RuntimeError("bad key sk-abcdefghijklmnop1234")

    t = two_step(reg, calls, boom, route=None)
    h = Harness(mode, store, clock, reg)
    rec = h.submit(t, {"rows": 1})
    h.run()
    got = h.get(rec.task_id)
    assert got.state is TaskState.NEEDS_OPERATOR
    assert "RuntimeError" in got.checkpoint.reason
    assert "sk-abc" not in got.checkpoint.to_json()


def test_a_result_that_is_not_json_needs_an_operator(
    mode: str, store: TaskStore, clock: FakeClock
) -> None:
    reg, calls = TaskRegistry(), []
    t = two_step(reg, calls, lambda ctx: object(), route=None)
    h = Harness(mode, store, clock, reg)
    rec = h.submit(t, {"rows": 1})
    h.run()
    got = h.get(rec.task_id)
    assert got.state is TaskState.NEEDS_OPERATOR and "JSON" in got.checkpoint.reason


def test_the_retry_budget_bounds_wakes(mode: str, store: TaskStore, clock: FakeClock) -> None:
    reg, calls = TaskRegistry(), []
    t = two_step(reg, calls, lambda ctx: Outcome(
        status=Status.WAITING_FOR_CAPACITY, reason="busy",
        retry_at=clock.now() + timedelta(seconds=10)), route=None)
    h = Harness(mode, store, clock, reg, policy=QueuePolicy(max_deliveries=2))
    rec = h.submit(t, {"rows": 1})
    states = []
    for _ in range(4):
        h.run()
        states.append(h.get(rec.task_id).state)
        clock.advance(10)
    assert states == [TaskState.WAITING_FOR_CAPACITY, TaskState.WAITING_FOR_CAPACITY,
                      TaskState.PARTIAL, TaskState.PARTIAL]


def test_stopping_between_steps_releases_the_task(
    mode: str, store: TaskStore, clock: FakeClock
) -> None:
    reg, calls = TaskRegistry(), []
    stop = threading.Event()
    t = task("report", into=reg)

    @t.step()
    def fetch(ctx: StepContext) -> int:
        calls.append("fetch")
        stop.set()  # SIGTERM arrives while this step runs
        return 1

    @t.step()
    def draft(ctx: StepContext) -> int:
        calls.append("draft")
        return 2

    h = Harness(mode, store, clock, reg, stop=stop)
    rec = h.submit(t, {})
    h.run()
    released = h.get(rec.task_id)
    assert released.state is TaskState.QUEUED and released.lease_owner is None
    assert released.checkpoint.current_step == 1
    stop.clear()
    h.run()
    done = h.get(rec.task_id)
    assert done.state is TaskState.COMPLETED and calls == ["fetch", "draft"]
    assert done.checkpoint.attempts_used.redeliveries == 0


def test_a_redelivered_task_keeps_its_counters_and_key(
    mode: str, store: TaskStore, clock: FakeClock
) -> None:
    reg, calls = TaskRegistry(), []
    keys: list[str] = []
    t = two_step(reg, calls, lambda ctx, route: keys.append(ctx.idempotency_key) or {"k": 1})
    h = Harness(mode, store, clock, reg, policy=QueuePolicy(lease_secs=30))
    rec = h.submit(t, {"rows": 1})
    crashed = store.claim("dead-worker", lease_secs=30)  # a worker that dies holding it
    assert crashed is not None
    assert h.run() == []
    clock.advance(31)
    h.run()
    done = h.get(rec.task_id)
    assert done.state is TaskState.COMPLETED
    assert done.checkpoint.attempts_used.redeliveries == 1
    assert done.checkpoint.retry_budget_remaining == crashed.checkpoint.retry_budget_remaining - 1
    assert keys == [f"{rec.task_id}:draft"]


def test_unknown_task_and_bad_arguments_are_clear(store: TaskStore, clock: FakeClock) -> None:
    reg = TaskRegistry()
    runner = TaskRunner(store, tasks=reg, clock=clock)
    with pytest.raises(ValueError, match="no task named 'nope'"):
        runner.submit("nope")
    t = task("empty", into=reg)
    with pytest.raises(ValueError, match="has no steps"):
        runner.submit(t)

    @t.step()
    def only(ctx: StepContext) -> None:
        return None

    with pytest.raises(ValueError, match="priority must be one of"):
        runner.submit(t, priority="urgent")
    with pytest.raises(TypeError, match="JSON-able"):
        runner.submit(t, {"x": object()})
    with pytest.raises(ValueError, match="deadline must be"):
        runner.submit(t, deadline="tomorrow")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="already has a step"):
        t.step("only")(lambda ctx: None)


def test_a_runner_without_the_definition_leaves_the_task_for_one_that_has_it(
    mode: str, store: TaskStore, clock: FakeClock
) -> None:
    reg, calls = TaskRegistry(), []
    t = two_step(reg, calls, lambda ctx, route: {"ok": 1})
    rec = TaskRunner(store, tasks=reg, clock=clock).submit(t, {"rows": 1})
    other = TaskRegistry()
    task("unrelated", into=other).step()(lambda ctx: None)
    assert Harness(mode, store, clock, other).run() == []
    kept = store.get(rec.task_id)
    assert kept is not None and kept.state is TaskState.QUEUED
    assert (kept.deliveries, kept.fence, calls) == (0, 0, [])
    assert [r.task_id for r in Harness(mode, store, clock, reg).run()] == [rec.task_id]
    assert store.get(rec.task_id).state is TaskState.COMPLETED  # type: ignore[union-attr]


def test_the_top_level_names() -> None:
    import rateloop
    import rateloop.tasks

    assert rateloop.task is rateloop.tasks.task
    assert rateloop.TaskRunner is TaskRunner and rateloop.AsyncTaskRunner is AsyncTaskRunner
    assert rateloop.TaskState is TaskState


@pytest.mark.parametrize("cls", ["background", "safety"])
def test_admission_is_checked_when_a_task_is_taken_with_its_class(
    mode: str, store: TaskStore, clock: FakeClock, cls: str
) -> None:
    from rateloop.admission import LimitSpec
    from rateloop.admission.limiter import Limiter

    asked: list[str] = []

    class Recording(Limiter):
        def try_reserve(self, route: Route, cost: Any, *, priority: Any = "interactive") -> Any:
            asked.append(str(priority))
            return super().try_reserve(route, cost, priority=priority)

        async def atry_reserve(
            self, route: Route, cost: Any, *, priority: Any = "interactive"
        ) -> Any:
            asked.append(str(priority))
            return await super().atry_reserve(route, cost, priority=priority)

    limiter = Recording(limits={ROUTE.scope: LimitSpec(requests_per_minute=1)}, clock=clock)
    loop_policy = Policy.from_dict({"pause_limit_secs": 30, "backoff": {"jitter": "none"}})
    reg, calls = TaskRegistry(), []
    t = two_step(reg, calls, lambda ctx, route: {"ok": True})
    if mode == "sync":
        sync = TaskRunner(store, tasks=reg, clock=clock,
                          loop=RateLoop(loop_policy, limiter=limiter, clock=clock))
        submit, run = sync.submit, sync.run_until_idle
    else:
        arun = AsyncTaskRunner(store, tasks=reg, clock=clock,
                               loop=AsyncRateLoop(loop_policy, limiter=limiter, clock=clock))

        def submit(*a: Any, **kw: Any) -> TaskRecord:
            return asyncio.run(arun.submit(*a, **kw))

        def run() -> list[TaskRecord]:
            return asyncio.run(arun.run_until_idle())

    first = submit(t, {"rows": 1}, priority=cls)
    second = submit(t, {"rows": 2}, priority=cls)
    run()
    a, b = store.get(first.task_id), store.get(second.task_id)
    assert a is not None and b is not None
    assert a.state is TaskState.COMPLETED
    assert b.state is TaskState.WAITING_FOR_CAPACITY  # no capacity: parked, not slept on
    assert b.lease_owner is None and b.next_attempt_at > clock.now()
    assert clock.sleeps == []
    clock.advance((b.next_attempt_at - clock.now()).total_seconds())
    run()
    b = store.get(second.task_id)
    assert b is not None and b.state is TaskState.COMPLETED
    assert set(asked) == {cls}  # the one Priority: safety is admitted at interactive's rank
    assert Priority.SAFETY.rank == Priority.INTERACTIVE.rank


def test_logs_name_the_task_never_its_arguments(
    store: TaskStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    reg, calls = TaskRegistry(), []
    t = two_step(reg, calls, lambda ctx: Outcome(
        status=Status.WAITING_FOR_RESET, reason="daily quota",
        retry_at=clock.now() + timedelta(seconds=60)), route=None)
    runner = TaskRunner(store, tasks=reg, clock=clock)
    rec = runner.submit(t, {"rows": 1, "prompt": "summarize the secret merger memo"})
    with caplog.at_level(logging.INFO, logger="rateloop.tasks"):
        runner.run_until_idle()
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert rec.task_id in text and "waiting_for_reset at step 1/2: daily quota" in text
    assert "merger" not in text
    parked = store.get(rec.task_id)
    assert parked is not None
    assert parked.checkpoint.attempts_used.attempts == rateloop_attempts(loop=0)


def rateloop_attempts(**kw: int) -> Any:
    from rateloop import Attempts

    return Attempts(**kw)


@pytest.mark.parametrize(("verdict", "state"), [(True, TaskState.COMPLETED),
                                                (None, TaskState.NEEDS_OPERATOR)])
def test_a_write_that_failed_ambiguously_asks_its_outcome_check(
    mode: str, store: TaskStore, clock: FakeClock, verdict: Any, state: TaskState
) -> None:
    reg, calls = TaskRegistry(), []
    asked: list[tuple[str, str]] = []
    t = task("post", into=reg)

    def applied(ctx: StepContext, route: Route) -> Any:
        asked.append((ctx.idempotency_key, route.model))
        return verdict

    @t.step(route=ROUTE, idempotent=False, outcome_check=applied, operation="tool.post")
    def post(ctx: StepContext, route: Route) -> Any:
        calls.append("post")
        raise httpx.ReadTimeout("no answer after the request was sent")

    h = Harness(mode, store, clock, reg)
    rec = h.submit(t, {})
    h.run()
    got = h.get(rec.task_id)
    assert got.state is state
    assert calls == ["post"]  # never retried blindly
    assert asked == [(f"{rec.task_id}:post", "m")]
    assert got.checkpoint.outcome_check is not None
    assert got.checkpoint.outcome_check.endswith("applied")
