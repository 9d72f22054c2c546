"""The task store conformance suite: every test runs against SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from rateloop.errors import ConfigError
from rateloop.signal import Kind, LimitSignal
from rateloop.tasks import (
    Checkpoint,
    CompletedStep,
    Ledger,
    PendingOperation,
    PriorityClass,
    QueuePolicy,
    TaskRecord,
    TaskState,
    TaskStore,
    open_store,
)
from rateloop.tasks.deliveries import delivery_summary
from rateloop.testing import FakeClock

POLICY = QueuePolicy(lease_secs=30)


def make_store(kind: str, tmp_path: Path, clock: FakeClock | None, request: pytest.FixtureRequest
               ) -> tuple[TaskStore, str]:
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path}/tasks.db"
        return open_store(url, clock=clock), url
    dsn = request.getfixturevalue("postgres_dsn")
    schema = f"rateloop_test_{uuid.uuid4().hex[:10]}"
    url = f"{dsn}?schema={schema}"
    store = open_store(url, clock=clock)

    def drop() -> None:
        from rateloop.tasks.postgres_store import PostgresTaskStore

        cleaner = PostgresTaskStore(dsn, schema=schema)
        cleaner.drop()
        cleaner.close()

    request.addfinalizer(drop)
    return store, url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_url(engine: str, tmp_path: Path, clock: FakeClock, request: pytest.FixtureRequest
              ) -> Iterator[tuple[TaskStore, str]]:
    store, url = make_store(engine, tmp_path, clock, request)
    yield store, url
    store.close()


@pytest.fixture
def store(store_url: tuple[TaskStore, str]) -> TaskStore:
    return store_url[0]


def record(clock: FakeClock, task_id: str | None = None, *, priority: str = "interactive",
           deadline: float | None = None, not_before: float = 0.0) -> TaskRecord:
    now = clock.now()
    tid = task_id or uuid.uuid4().hex
    start = now + timedelta(seconds=not_before)
    due = now + timedelta(seconds=deadline) if deadline is not None else None
    return TaskRecord(
        task_id=tid, name="t", state=TaskState.QUEUED, priority=PriorityClass(priority),
        args={"n": 1}, steps=("a", "b"),
        checkpoint=Checkpoint(task_id=tid, run_id="run", workflow_version="1",
                              idempotency_key=f"key-{tid}", next_attempt_at=start,
                              task_deadline=due),
        created_at=now, updated_at=now, next_attempt_at=start, deadline=due,
    )


def test_checkpoint_round_trips_every_field(store: TaskStore, clock: FakeClock) -> None:
    rec = record(clock, deadline=600)
    store.submit(rec, POLICY)
    got = store.claim("w1", lease_secs=30)
    assert got is not None
    signal = LimitSignal.of(Kind.PERIOD_QUOTA, retry_after=60.0, reset_at=clock.now(),
                            status=429, provider="openai", scope="openai:m")
    ck = replace(
        got.checkpoint,
        current_step=1,
        completed_steps=(CompletedStep(index=0, name="a", status="completed",
                                       result={"x": [1, "y"]}, attempts=2),),
        pending_operation=PendingOperation(step="b", operation="model.generate",
                                           scope="openai:m", cost={"requests": 1,
                                                                   "input_tokens": 5,
                                                                   "output_tokens": 7}),
        signal=signal,
        attempts_used=Ledger(loop=3, sdk=1, redeliveries=0, wakes=0),
        user_visible_status="step a done",
    )
    assert store.save(replace(got, checkpoint=ck), fence=got.fence)
    back = store.get(rec.task_id)
    assert back is not None
    assert back.checkpoint == ck
    assert back.args == {"n": 1} and back.steps == ("a", "b")
    assert back.deadline == rec.deadline and back.state is TaskState.RUNNING


def test_submit_is_idempotent_by_task_id(store: TaskStore, clock: FakeClock) -> None:
    rec = record(clock, "same")
    first = store.submit(rec, POLICY)
    second = store.submit(replace(rec, args={"n": 2}), POLICY)
    assert second.args == first.args == {"n": 1}
    assert store.counts() == {TaskState.QUEUED: 1}


def test_queue_full_rejects_at_submit(store: TaskStore, clock: FakeClock) -> None:
    small = QueuePolicy(max_depth=2)
    assert store.submit(record(clock), small).state is TaskState.QUEUED
    assert store.submit(record(clock), small).state is TaskState.QUEUED
    third = store.submit(record(clock, "third"), small)
    assert third.state is TaskState.REJECTED
    assert "queue full" in third.checkpoint.reason
    stored = store.get("third")
    assert stored is not None and stored.state is TaskState.REJECTED
    # Rejected and finished tasks do not count toward the depth.
    got = store.claim("w", lease_secs=30)
    assert got is not None
    store.save(replace(got, state=TaskState.COMPLETED, lease_owner=None), fence=got.fence)
    assert store.submit(record(clock), small).state is TaskState.QUEUED


def test_earliest_start_past_the_deadline_is_rejected(store: TaskStore, clock: FakeClock) -> None:
    late = store.submit(record(clock, deadline=60, not_before=120), POLICY)
    assert late.state is TaskState.REJECTED
    assert "past the deadline" in late.checkpoint.reason
    # With a service estimate, the work queued ahead counts too.
    busy = QueuePolicy(service_secs=10, workers=1)
    for _ in range(5):
        store.submit(record(clock), busy)
    assert store.submit(record(clock, deadline=30), busy).state is TaskState.REJECTED
    assert store.submit(record(clock, deadline=120), busy).state is TaskState.QUEUED


def test_priority_classes_and_aging(store: TaskStore, clock: FakeClock) -> None:
    bg_old = record(clock, "bg-old", priority="background")
    store.submit(bg_old, POLICY)
    clock.advance(1790)  # aged past an interactive task submitted now (30 s offset), not safety
    for tid, cls in [("bg", "background"), ("sched", "scheduled"), ("inter", "interactive"),
                     ("safety", "safety")]:
        store.submit(record(clock, tid, priority=cls), POLICY)
    order = []
    while (got := store.claim("w", lease_secs=30)) is not None:
        order.append(got.task_id)
    assert order == ["safety", "bg-old", "inter", "sched", "bg"]


def test_waiting_tasks_are_taken_at_their_time_and_count_a_wake(
    store: TaskStore, clock: FakeClock
) -> None:
    store.submit(record(clock, "w"), POLICY)
    got = store.claim("w1", lease_secs=30)
    assert got is not None
    later = clock.now() + timedelta(seconds=100)
    parked = replace(got, state=TaskState.WAITING_FOR_RESET, next_attempt_at=later,
                     lease_owner=None, lease_expires_at=None)
    assert store.save(parked, fence=got.fence)
    assert store.claim("w2", lease_secs=30) is None
    clock.advance(100)
    again = store.claim("w2", lease_secs=30)
    assert again is not None and again.task_id == "w"
    assert again.checkpoint.attempts_used.wakes == 1
    assert again.checkpoint.attempts_used.redeliveries == 0
    assert again.checkpoint.retry_budget_remaining == got.checkpoint.retry_budget_remaining - 1
    assert again.fence == got.fence + 1 and again.deliveries == 2


def test_expired_lease_is_redelivered_and_fences_the_old_owner(
    store: TaskStore, clock: FakeClock
) -> None:
    store.submit(record(clock, "r"), POLICY)
    first = store.claim("dead", lease_secs=30)
    assert first is not None
    clock.advance(29)
    assert store.claim("other", lease_secs=30) is None
    clock.advance(2)
    second = store.claim("other", lease_secs=30)
    assert second is not None and second.lease_owner == "other"
    assert second.checkpoint.attempts_used.redeliveries == 1
    assert second.checkpoint.idempotency_key == first.checkpoint.idempotency_key
    # The old owner wakes up: every write of its is refused.
    assert not store.heartbeat("r", first.fence, lease_secs=30)
    assert not store.save(replace(first, state=TaskState.COMPLETED), fence=first.fence)
    current = store.get("r")
    assert current is not None and current.state is TaskState.RUNNING
    assert current.lease_owner == "other"


def test_heartbeat_keeps_the_lease(store: TaskStore, clock: FakeClock) -> None:
    store.submit(record(clock, "h"), POLICY)
    got = store.claim("w", lease_secs=10)
    assert got is not None
    for _ in range(5):
        clock.advance(8)
        assert store.heartbeat("h", got.fence, lease_secs=10)
    assert store.claim("thief", lease_secs=10) is None


def test_cancel_and_retry(store: TaskStore, clock: FakeClock) -> None:
    store.submit(record(clock, "c"), POLICY)
    got = store.claim("w", lease_secs=30)
    assert got is not None
    cancelled = store.cancel("c")
    assert cancelled.state is TaskState.CANCELLED
    assert not store.save(got, fence=got.fence)  # the worker holding it cannot write again
    with pytest.raises(ValueError, match="already cancelled"):
        store.cancel("c")
    retried = store.retry("c", accept_version="2")
    assert retried.state is TaskState.QUEUED
    assert retried.checkpoint.workflow_version == "2"
    again = store.claim("w", lease_secs=30)
    assert again is not None and again.task_id == "c"
    store.save(replace(again, state=TaskState.COMPLETED, lease_owner=None), fence=again.fence)
    with pytest.raises(ValueError, match="retry is allowed from"):
        store.retry("c")
    with pytest.raises(KeyError):
        store.retry("missing")


def test_list_and_counts(store: TaskStore, clock: FakeClock) -> None:
    store.submit(record(clock, "a", priority="background"), POLICY)
    store.submit(record(clock, "b", priority="safety"), POLICY)
    store.submit(record(clock, "z", deadline=1, not_before=5), POLICY)
    assert [r.task_id for r in store.list_tasks(states=[TaskState.QUEUED])] == ["b", "a"]
    assert store.counts() == {TaskState.QUEUED: 2, TaskState.REJECTED: 1}
    assert len(store.list_tasks(limit=1)) == 1


def test_migrations_are_versioned_and_run_once(
    store_url: tuple[TaskStore, str], clock: FakeClock
) -> None:
    store, url = store_url
    store.submit(record(clock, "kept"), POLICY)
    reopened = open_store(url, clock=clock)
    try:
        assert reopened.get("kept") is not None
    finally:
        reopened.close()


def test_concurrent_claimers_never_share_a_task(
    store_url: tuple[TaskStore, str], clock: FakeClock
) -> None:
    store, url = store_url
    for i in range(120):
        store.submit(record(clock, f"t{i:03}"), POLICY)
    taken: list[str] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def claimer(n: int) -> None:
        try:
            own = open_store(url, clock=clock)
            try:
                while (got := own.claim(f"w{n}", lease_secs=30)) is not None:
                    with lock:
                        taken.append(got.task_id)
            finally:
                own.close()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert sorted(taken) == [f"t{i:03}" for i in range(120)]


def test_claim_takes_only_the_tasks_the_worker_has_definitions_for(
    store: TaskStore, clock: FakeClock
) -> None:
    store.submit(record(clock, "known"), POLICY)
    store.submit(replace(record(clock, "orphan"), name="other"), POLICY)
    clock.advance(1)
    store.submit(record(clock, "later"), POLICY)
    assert store.claim("w", lease_secs=30, names=[]) is None
    got = store.claim("w", lease_secs=30, names=["t", "x"])
    assert got is not None and got.task_id == "known"
    got = store.claim("w", lease_secs=30, names=["t"])
    assert got is not None and got.task_id == "later"  # the older "other" task is skipped
    assert store.claim("w", lease_secs=30, names=["t"]) is None
    orphan = store.get("orphan")
    assert orphan is not None and orphan.state is TaskState.QUEUED
    assert (orphan.deliveries, orphan.fence, orphan.lease_owner) == (0, 0, None)
    budget = record(clock).checkpoint.retry_budget_remaining
    assert orphan.checkpoint.retry_budget_remaining == budget
    # An expired lease is retaken only by a worker that knows the task, too.
    clock.advance(31)
    assert store.claim("w2", lease_secs=30, names=["other"]) is not None  # the orphan
    assert store.claim("w2", lease_secs=30, names=["other"]) is None
    again = store.claim("w2", lease_secs=30, names=None)  # None: any task
    assert again is not None and again.task_id == "known"


def test_each_delivery_records_why_it_happened(store: TaskStore, clock: FakeClock) -> None:
    store.submit(record(clock, "d"), POLICY)
    clock.advance(1)
    store.submit(record(clock, "untouched"), POLICY)  # ranks after "d"
    first = store.claim("w1", lease_secs=30)
    assert first is not None and first.task_id == "d"
    clock.advance(31)  # w1 died holding it
    second = store.claim("w2", lease_secs=30)
    assert second is not None and second.task_id == "d"
    later = clock.now() + timedelta(seconds=100)
    assert store.save(replace(second, state=TaskState.WAITING_FOR_RESET, next_attempt_at=later,
                              lease_owner=None, lease_expires_at=None), fence=second.fence)
    clock.advance(100)
    third = store.claim("w3", lease_secs=30, names=["t"])
    assert third is not None and third.task_id == "d"
    released = replace(third, state=TaskState.QUEUED, next_attempt_at=clock.now(),
                       lease_owner=None, lease_expires_at=None).with_checkpoint(
        user_visible_status="queued: the worker stopped between steps")
    assert store.save(released, fence=third.fence)
    fourth = store.claim("w4", lease_secs=30)
    assert fourth is not None and fourth.task_id == "d"
    history = store.deliveries("d")
    assert [(d.delivery, d.worker_id, d.reason.value) for d in history] == [
        (1, "w1", "first"), (2, "w2", "lease_expired"), (3, "w3", "wake"), (4, "w4", "requeued"),
    ]
    assert history[0].at == first.updated_at and history[3].at == fourth.updated_at
    assert history[1].previous_owner == "w1" and history[0].previous_owner is None
    assert history[2].detail == "waiting_for_reset"
    assert history[3].detail == "queued: the worker stopped between steps"
    assert delivery_summary(fourth.deliveries, history) == (
        "4 deliveries: 1 first claim, 1 lease expired (worker w1), "
        "1 retry after a wait (waiting_for_reset), "
        "1 requeued (queued: the worker stopped between steps)"
    )
    assert store.deliveries("untouched") == [] and store.deliveries("missing") == []


def test_a_store_from_before_delivery_reasons_is_migrated_and_says_what_it_lacks(
    tmp_path: Path, clock: FakeClock
) -> None:
    url = f"sqlite:///{tmp_path}/old.db"
    store = open_store(url, clock=clock)
    store.submit(record(clock, "old"), POLICY)
    store.claim("w1", lease_secs=30)
    store.close()
    # Back to schema version 1, as a store written by the previous release is.
    conn = sqlite3.connect(f"{tmp_path}/old.db")
    conn.executescript("DROP TABLE rateloop_task_deliveries; DROP TABLE rateloop_workers; "
                       "DELETE FROM rateloop_tasks_schema WHERE version > 1;")
    conn.close()
    store = open_store(url, clock=clock)
    try:
        clock.advance(31)
        again = store.claim("w2", lease_secs=30)
        assert again is not None and again.deliveries == 2
        history = store.deliveries("old")
        assert [(d.delivery, d.previous_owner) for d in history] == [(2, "w1")]
        assert delivery_summary(again.deliveries, history) == (
            "2 deliveries: 1 lease expired (worker w1), "
            "1 not recorded (before this store kept delivery reasons)"
        )
        assert delivery_summary(0, []) == "0 deliveries"
        assert delivery_summary(1, history[:0]).startswith("1 delivery: 1 not recorded")
    finally:
        store.close()


def test_workers_announce_the_tasks_they_know_until_they_go_silent(
    store: TaskStore, clock: FakeClock
) -> None:
    assert store.live_workers() == []
    store.announce_worker("host:1", ["t", "x"], ttl_secs=30)
    store.announce_worker("host:2", ["y"], ttl_secs=30)
    assert {w.worker_id: w.tasks for w in store.live_workers()} == {
        "host:1": ("t", "x"), "host:2": ("y",),
    }
    clock.advance(20)
    store.announce_worker("host:1", ["t", "x", "z"], ttl_secs=30)  # a refresh
    clock.advance(15)  # host:2 was killed: it stopped announcing
    (alive,) = store.live_workers()
    assert alive.worker_id == "host:1" and alive.tasks == ("t", "x", "z")
    assert alive.seen_at == clock.now() - timedelta(seconds=15)
    store.retire_worker("host:1")  # a worker that stops says so
    assert store.live_workers() == []


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("redis://127.0.0.1:6379/0", "unsupported scheme 'redis'"),
        ("tasks.db", "is not a URL"),
        ("sqlite://host/tasks.db", "names a host"),
        ("sqlite:///", "names no file"),
        ("sqlite:///x.db?journal=off", "unknown option"),
        ("sqlite:///x.db?synchronous=off", "synchronous='off'"),
        ("postgresql://u:secret@127.0.0.1:1/db?schema=Bad-Name", "lower-case SQL identifier"),
    ],
)
def test_bad_store_urls_are_clear_errors(url: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        open_store(url)
    text = str(err.value)
    assert needle in text
    assert "sqlite:///" in text and "postgresql://" in text  # what is allowed
    assert "secret" not in text


def test_sqlite_errors_are_backend_errors(tmp_path: Path, clock: FakeClock) -> None:
    import sqlite3

    from rateloop.errors import BackendError
    from rateloop.tasks import SQLiteTaskStore

    store = SQLiteTaskStore(tmp_path / "t.db", clock=clock, timeout_secs=0.1)
    other = sqlite3.connect(tmp_path / "t.db", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        with pytest.raises(BackendError, match="locked"):
            store.submit(record(clock), POLICY)
        other.execute("ROLLBACK")
        other.execute("DROP TABLE rateloop_tasks")
        with pytest.raises(BackendError, match="no such table"):
            store.get("x")
    finally:
        other.close()
        store.close()
