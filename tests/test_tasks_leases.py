"""Leases and writes on a redelivery, on SQLite and PostgreSQL, on a fake clock.

"Only a dead worker loses its lease": a checkpoint never shortens the lease a
heartbeat extended, and it renews it, so a live worker's task is never taken.
A write (``idempotent=False``) that an earlier delivery started and never
checkpointed is not run again blindly: its ``outcome_check`` decides first, as
the loop does for an ambiguous answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from rateloop import Route, WriteOutcome
from rateloop.tasks import (
    LeaseLost,
    QueuePolicy,
    StepContext,
    Task,
    TaskRecord,
    TaskRegistry,
    TaskState,
    task,
)
from rateloop.tasks.store import TaskStore
from rateloop.testing import FakeClock
from test_tasks_runner import Harness, limited
from test_tasks_store import POLICY, make_store, record

ROUTE = Route(provider="openai", model="m")
FALLBACK = Route(provider="anthropic", model="c")
LEASE = 30.0


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> Iterator[TaskStore]:
    s, _ = make_store(str(request.param), tmp_path, clock, request)
    yield s
    s.close()


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# --- 1. a checkpoint never gives the lease away --------------------------------------


def test_a_checkpoint_keeps_the_lease_a_heartbeat_extended(
    store: TaskStore, clock: FakeClock
) -> None:
    store.submit(record(clock, "k"), POLICY)
    claimed = store.claim("w1", lease_secs=2)
    assert claimed is not None
    clock.advance(1.5)
    assert store.heartbeat("k", claimed.fence, lease_secs=2)  # the lease runs to 3.5 s
    clock.advance(1.0)  # past the claim's lease (2 s), within the heartbeat's
    # The record the worker carries still has the claim's expiry: saving it must not
    # write that back.
    assert claimed.lease_expires_at is not None and claimed.lease_expires_at < clock.now()
    assert store.save(claimed.with_checkpoint(current_step=1), fence=claimed.fence)
    clock.advance(0.1)
    assert store.claim("w2", lease_secs=2) is None
    held = store.get("k")
    assert held is not None and held.lease_owner == "w1"
    assert held.lease_expires_at is not None and held.lease_expires_at > clock.now()
    assert held.checkpoint.current_step == 1


def test_a_checkpoint_may_renew_the_lease_and_an_end_clears_it(
    store: TaskStore, clock: FakeClock
) -> None:
    store.submit(record(clock, "r"), POLICY)
    claimed = store.claim("w1", lease_secs=2)
    assert claimed is not None
    clock.advance(1.5)
    renewed = replace(claimed, lease_expires_at=clock.now() + timedelta(seconds=2))
    assert store.save(renewed, fence=claimed.fence)
    clock.advance(1.0)  # 2.5 s: the claim's lease is over, the checkpoint's is not
    assert store.claim("w2", lease_secs=2) is None
    done = replace(renewed, state=TaskState.COMPLETED, lease_owner=None, lease_expires_at=None)
    assert store.save(done, fence=claimed.fence)
    back = store.get("r")
    assert back is not None and back.state is TaskState.COMPLETED
    assert back.lease_owner is None and back.lease_expires_at is None


def steps_with_a_long_first(reg: TaskRegistry, clock: FakeClock, thief: Callable[[], Any],
                            ran: list[str]) -> Task:
    t = task("long", into=reg)

    @t.step()
    def first(ctx: StepContext) -> int:
        ran.append("first")
        clock.advance(LEASE + 10)  # longer than the lease (no real heartbeat ran meanwhile)
        return 1

    @t.step()
    def second(ctx: StepContext) -> int:
        ran.append("second")
        thief()  # an idle worker polls while this step runs
        return 2

    @t.step()
    def third(ctx: StepContext) -> int:
        ran.append("third")
        return 3

    return t


def test_a_checkpoint_renews_the_lease_of_a_live_worker(
    mode: str, store: TaskStore, clock: FakeClock
) -> None:
    reg, ran, stolen = TaskRegistry(), [], []

    def thief() -> None:
        got = store.claim("thief", lease_secs=LEASE)
        if got is not None:
            stolen.append(got)

    t = steps_with_a_long_first(reg, clock, thief, ran)
    h = Harness(mode, store, clock, reg, policy=QueuePolicy(lease_secs=LEASE))
    rec = h.submit(t)
    h.run()
    assert stolen == []
    done = h.get(rec.task_id)
    assert done.state is TaskState.COMPLETED
    assert done.checkpoint.attempts_used.redeliveries == 0
    assert ran == ["first", "second", "third"]


def test_a_worker_that_lost_its_lease_stops_before_its_next_step(
    mode: str, store: TaskStore, clock: FakeClock
) -> None:
    reg, ran = TaskRegistry(), []
    taken: list[TaskRecord] = []
    t = task("lost", into=reg)

    @t.step()
    def first(ctx: StepContext) -> int:
        ran.append("first")
        clock.advance(LEASE + 1)  # the worker stalls past its lease...
        got = store.claim("other", lease_secs=LEASE)  # ...and another worker takes the task
        assert got is not None
        taken.append(got)
        return 1

    @t.step()
    def second(ctx: StepContext) -> int:
        ran.append("second")
        return 2

    h = Harness(mode, store, clock, reg, policy=QueuePolicy(lease_secs=LEASE))
    rec = h.submit(t)
    h.run()
    assert ran == ["first"]  # the stalled worker did not start the next step
    now = h.get(rec.task_id)
    assert now.lease_owner == "other" and now.fence == taken[0].fence
    assert now.checkpoint.current_step == 0  # the old owner's checkpoint was refused


# --- 2. a write an earlier delivery started is checked before it runs again ----------


class Crash(BaseException):
    """The worker process dies here (like kill -9): nothing after it runs or is saved."""


def write_task(reg: TaskRegistry, *, calls: list[str], crash_in: str | None,
               check: Callable[[StepContext, Route], Any] | None,
               fallbacks: tuple[Route, ...] | None = None, first_refused: bool = False) -> Task:
    t = task("post", into=reg)

    @t.step()
    def prepare(ctx: StepContext) -> dict[str, str]:
        calls.append("prepare")
        if crash_in == "prepare" and calls.count("prepare") == 1:
            raise Crash
        return {"body": "ref:1"}

    @t.step(route=ROUTE, idempotent=False, outcome_check=check, operation="tool.post",
            fallbacks=fallbacks)
    def post(ctx: StepContext, route: Route) -> dict[str, str]:
        calls.append("post")
        n = calls.count("post")
        if first_refused and n == 1:
            raise limited("7200")
        if crash_in == "post" and n == 1:
            raise Crash  # the request may have reached the provider
        return {"posted": ctx.idempotency_key}

    @t.step()
    def notify(ctx: StepContext) -> str:
        calls.append("notify")
        return "sent"

    return t


def crash_then_redeliver(mode: str, store: TaskStore, clock: FakeClock, t: Task,
                         reg: TaskRegistry) -> TaskRecord:
    policy = QueuePolicy(lease_secs=LEASE)
    rec = Harness(mode, store, clock, reg, policy=policy).submit(t)
    with pytest.raises(Crash):
        Harness(mode, store, clock, reg, policy=policy).run()
    held = store.get(rec.task_id)
    assert held is not None and held.state is TaskState.RUNNING  # a dead worker's lease
    clock.advance(LEASE + 1)
    h = Harness(mode, store, clock, reg, policy=policy)
    h.run()
    done = h.get(rec.task_id)
    assert done.checkpoint.attempts_used.redeliveries == 1
    return done


@pytest.mark.parametrize("verdict", [True, WriteOutcome.APPLIED, "applied"])
def test_a_write_that_landed_before_the_crash_is_not_run_again(
    mode: str, store: TaskStore, clock: FakeClock, verdict: Any
) -> None:
    reg, calls, asked = TaskRegistry(), [], []

    def check(ctx: StepContext, route: Route) -> Any:
        asked.append((ctx.idempotency_key, route.scope))
        return verdict

    t = write_task(reg, calls=calls, crash_in="post", check=check)
    done = crash_then_redeliver(mode, store, clock, t, reg)
    assert done.state is TaskState.COMPLETED
    assert calls == ["prepare", "post", "notify"]  # the write ran once
    assert asked == [(f"{done.task_id}:post", ROUTE.scope)]
    (_, post, _) = done.checkpoint.completed_steps
    assert post.name == "post" and post.status == "completed" and post.result is None


@pytest.mark.parametrize("verdict", [False, WriteOutcome.NOT_APPLIED])
def test_a_write_that_did_not_land_runs_again(
    mode: str, store: TaskStore, clock: FakeClock, verdict: Any
) -> None:
    reg, calls, asked = TaskRegistry(), [], []

    def check(ctx: StepContext, route: Route) -> Any:
        asked.append(route.scope)
        return verdict

    t = write_task(reg, calls=calls, crash_in="post", check=check)
    done = crash_then_redeliver(mode, store, clock, t, reg)
    assert done.state is TaskState.COMPLETED
    assert calls == ["prepare", "post", "post", "notify"]
    assert asked == [ROUTE.scope]
    assert done.result == "sent"


def test_every_route_a_write_may_have_gone_to_is_asked(
    mode: str, store: TaskStore, clock: FakeClock
) -> None:
    reg, calls, asked = TaskRegistry(), [], []

    def check(ctx: StepContext, route: Route) -> Any:
        asked.append(route.scope)
        return route == FALLBACK  # it landed on the fallback

    t = write_task(reg, calls=calls, crash_in="post", check=check, fallbacks=(FALLBACK,))
    done = crash_then_redeliver(mode, store, clock, t, reg)
    assert done.state is TaskState.COMPLETED
    assert calls == ["prepare", "post", "notify"]
    assert asked == [ROUTE.scope, FALLBACK.scope]


@pytest.mark.parametrize(
    ("has_check", "needle"),
    [(False, "there is no outcome_check"), (True, "outcome_check could not tell")],
)
def test_a_write_of_unknown_outcome_needs_an_operator(
    mode: str, store: TaskStore, clock: FakeClock, has_check: bool, needle: str
) -> None:
    reg, calls = TaskRegistry(), []

    def cannot_tell(ctx: StepContext, route: Route) -> Any:
        return None

    t = write_task(reg, calls=calls, crash_in="post", check=cannot_tell if has_check else None)
    done = crash_then_redeliver(mode, store, clock, t, reg)
    assert done.state is TaskState.NEEDS_OPERATOR
    assert calls == ["prepare", "post"]  # never re-run blindly
    assert "unknown_outcome" in done.checkpoint.reason and needle in done.checkpoint.reason
    assert done.completed == ("prepare",)
    # An operator who has looked retries it: the write runs again (their decision).
    h = Harness(mode, store, clock, reg, policy=QueuePolicy(lease_secs=LEASE))
    store.retry(done.task_id)
    h.run()
    assert h.get(done.task_id).state is TaskState.COMPLETED
    assert calls == ["prepare", "post", "post", "notify"]


def test_a_check_that_raises_needs_an_operator(
    mode: str, store: TaskStore, clock: FakeClock
) -> None:
    reg, calls = TaskRegistry(), []

    def broken(ctx: StepContext, route: Route) -> Any:
        raise RuntimeError("secret-token-123")

    t = write_task(reg, calls=calls, crash_in="post", check=broken)
    done = crash_then_redeliver(mode, store, clock, t, reg)
    assert done.state is TaskState.NEEDS_OPERATOR
    assert calls == ["prepare", "post"]
    assert "RuntimeError" in done.checkpoint.reason
    assert "secret-token-123" not in done.checkpoint.to_json()


def test_a_write_that_never_started_runs_without_a_check(
    mode: str, store: TaskStore, clock: FakeClock
) -> None:
    reg, calls, asked = TaskRegistry(), [], []

    def check(ctx: StepContext, route: Route) -> Any:
        asked.append(route.scope)
        return True

    t = write_task(reg, calls=calls, crash_in="prepare", check=check)
    done = crash_then_redeliver(mode, store, clock, t, reg)
    assert done.state is TaskState.COMPLETED
    assert calls == ["prepare", "prepare", "post", "notify"]
    assert asked == []


def test_a_refused_write_wakes_without_a_check(
    mode: str, store: TaskStore, clock: FakeClock
) -> None:
    reg, calls, asked = TaskRegistry(), [], []

    def check(ctx: StepContext, route: Route) -> Any:
        asked.append(route.scope)
        return True

    t = write_task(reg, calls=calls, crash_in=None, check=check, first_refused=True)
    policy = QueuePolicy(lease_secs=LEASE)
    h = Harness(mode, store, clock, reg, policy=policy)
    rec = h.submit(t)
    h.run()
    parked = h.get(rec.task_id)
    assert parked.state.waiting  # the provider said no: not ambiguous
    clock.advance(7201)
    h.run()
    done = h.get(rec.task_id)
    assert done.state is TaskState.COMPLETED
    assert calls == ["prepare", "post", "post", "notify"] and asked == []


def test_a_local_write_that_crashed_needs_an_operator(
    mode: str, store: TaskStore, clock: FakeClock
) -> None:
    reg, calls = TaskRegistry(), []
    t = task("local", into=reg)

    @t.step(idempotent=False)
    def push(ctx: StepContext) -> str:
        calls.append("push")
        if len(calls) == 1:
            raise Crash
        return "pushed"

    done = crash_then_redeliver(mode, store, clock, t, reg)
    assert done.state is TaskState.NEEDS_OPERATOR and calls == ["push"]
    assert "unknown_outcome" in done.checkpoint.reason


def test_a_progress_save_after_the_lease_was_taken_raises_lease_lost_and_saves_nothing(
    mode: str, store: TaskStore, clock: FakeClock
) -> None:
    reg, seen = TaskRegistry(), []
    t = task("progress-lost", into=reg)

    @t.step()
    def submit(ctx: StepContext) -> int:
        seen.append(ctx.progress)
        ctx.save_progress({"mark": 1})  # saved while the lease is ours
        clock.advance(LEASE + 1)  # the worker stalls past its lease...
        assert store.claim("other", lease_secs=LEASE) is not None  # ...and loses it
        try:
            ctx.save_progress({"mark": 2})
        except LeaseLost as exc:
            seen.append(str(exc))
            raise
        seen.append("saved after the lease was lost")
        return 1

    h = Harness(mode, store, clock, reg, policy=QueuePolicy(lease_secs=LEASE))
    rec = h.submit(t)
    h.run()
    assert seen[0] is None and "refused the progress" in seen[1], seen
    assert "saved after the lease was lost" not in seen
    now = h.get(rec.task_id)
    assert now.lease_owner == "other"
    assert now.checkpoint.step_progress == {"mark": 1}  # the refused save wrote nothing
