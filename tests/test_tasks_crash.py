"""Crash tests with real worker processes: kill -9 at exact points, SIGTERM, and chaos.

Workers are ``python -m rateloop worker`` processes running the tasks of
``test_tasks_app.py`` on a real SQLite file.  The steps count their own
executions and side effects in a SQLite file this test owns.
"""

from __future__ import annotations

import random
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import test_tasks_app as app
from _worker_procs import WorkerProcs, task_store_url
from rateloop.tasks import QueuePolicy, TaskRecord, TaskRunner, TaskState, open_store
from rateloop.tasks.store import TaskStore

APP = str(Path(__file__).resolve().parent / "test_tasks_app.py")
LEASE = 1.0


class Fleet(WorkerProcs):
    """Worker processes on one store, and a runner to submit and read the tasks."""

    def __init__(self, tmp: Path, url: str) -> None:
        self.effects = str(tmp / "effects.db")
        app.init_effects(self.effects)
        (tmp / "policy.toml").write_text("pause_limit_secs = 1\n")
        super().__init__(
            tmp, url, [APP], lease=LEASE, poll=0.05, policy=tmp / "policy.toml",
            env={"RATELOOP_TEST_EFFECTS": self.effects},
        )
        self.store: TaskStore = open_store(self.url)
        self.runner = TaskRunner(self.store, tasks=[app.durable],
                                 policy=QueuePolicy(max_depth=5000))

    def submit(self, mode: str, **kw: object) -> TaskRecord:
        return self.runner.submit(app.durable, {"mode": mode, **kw})

    def get(self, task_id: str) -> TaskRecord:
        rec = self.store.get(task_id)
        assert rec is not None
        return rec

    def wait_terminal(self, task_ids: list[str], timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if all(self.get(t).state.terminal for t in task_ids):
                return
            time.sleep(0.05)
        states = {t: self.get(t).state.value for t in task_ids}
        raise AssertionError(f"tasks not terminal after {timeout}s: {states}\n{self.logs()}")

    def count(self, table: str, task_id: str | None = None, step: str | None = None) -> int:
        conn = sqlite3.connect(self.effects)
        try:
            sql, args = f"SELECT COUNT(*) FROM {table} WHERE 1=1", []
            if task_id is not None:
                sql, args = sql + " AND task_id = ?", [*args, task_id]
            if step is not None:
                sql, args = sql + " AND step = ?", [*args, step]
            (n,) = conn.execute(sql, args).fetchone()
            return int(n)
        finally:
            conn.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    """Workers on a SQLite file, or on PostgreSQL in a schema of this test's own."""
    dsn = request.getfixturevalue("postgres_dsn") if request.param == "postgres" else None
    with task_store_url(tmp_path, dsn) as url:
        f = Fleet(tmp_path, url)
        yield f
        f.stop_all()
        f.store.close()


def test_kill_9_between_a_checkpoint_and_the_wait(fleet: Fleet) -> None:
    rec = fleet.submit("kill_then_limit")
    first = fleet.start()
    assert first.wait(30) == -signal.SIGKILL
    held = fleet.get(rec.task_id)
    assert held.state is TaskState.RUNNING  # its lease is held by a dead process
    assert held.completed == ("prepare",) and held.checkpoint.current_step == 1

    fleet.start()
    fleet.wait_terminal([rec.task_id], 30)
    done = fleet.get(rec.task_id)
    assert done.state is TaskState.COMPLETED, fleet.logs()
    ledger = done.checkpoint.attempts_used
    assert (ledger.redeliveries, ledger.wakes, ledger.loop) == (1, 1, 2)
    assert done.checkpoint.idempotency_key == rec.checkpoint.idempotency_key == rec.task_id
    assert fleet.count("executions", rec.task_id, "prepare") == 1  # not re-run
    assert fleet.count("executions", rec.task_id, "write") == 3  # killed, limited, done
    assert fleet.count("effects", rec.task_id, "prepare") == 1
    assert fleet.count("effects", rec.task_id, "write") == 1
    assert done.result == {"written": f"{rec.task_id}:write"}


def test_kill_9_in_the_middle_of_a_step(fleet: Fleet) -> None:
    rec = fleet.submit("kill_mid_step")
    first = fleet.start()
    assert first.wait(30) == -signal.SIGKILL
    fleet.start()
    fleet.wait_terminal([rec.task_id], 30)
    done = fleet.get(rec.task_id)
    assert done.state is TaskState.COMPLETED, fleet.logs()
    assert done.checkpoint.attempts_used.redeliveries == 1
    assert fleet.count("executions", rec.task_id, "prepare") == 1
    assert fleet.count("executions", rec.task_id, "write") == 2
    assert fleet.count("effects", rec.task_id) == 2  # one per step: the write was not duplicated


def test_sigterm_finishes_the_step_and_releases_the_task(fleet: Fleet) -> None:
    rec = fleet.submit("slow_first", sleep=1.5)
    worker = fleet.start()
    end = time.monotonic() + 30
    while fleet.count("executions", rec.task_id, "prepare") == 0:
        assert time.monotonic() < end, fleet.logs()
        time.sleep(0.05)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0, fleet.logs()
    released = fleet.get(rec.task_id)
    assert released.state is TaskState.QUEUED and released.lease_owner is None
    assert released.completed == ("prepare",)
    assert "stopped after 1 deliveries" in fleet.logs()
    fleet.start()
    fleet.wait_terminal([rec.task_id], 30)
    done = fleet.get(rec.task_id)
    assert done.state is TaskState.COMPLETED
    assert done.checkpoint.attempts_used.redeliveries == 0
    assert fleet.count("executions", rec.task_id, "prepare") == 1


@pytest.mark.slow
def test_chaos_1000_tasks_4_workers_random_kill_9(fleet: Fleet) -> None:
    rng = random.Random(12)
    ids = [
        fleet.submit("limit_once" if i % 20 == 0 else "chaos").task_id for i in range(1000)
    ]
    workers = [fleet.start() for _ in range(4)]
    kills = 0
    start = time.monotonic()
    next_kill = start + 1.5
    while time.monotonic() - start < 75:
        counts = fleet.store.counts()
        if sum(n for s, n in counts.items() if s.terminal) == len(ids):
            break
        if time.monotonic() >= next_kill and kills < 12:
            victim = rng.randrange(len(workers))
            workers[victim].send_signal(signal.SIGKILL)
            workers[victim].wait(10)
            workers[victim] = fleet.start()
            kills += 1
            next_kill = time.monotonic() + 1.5
        time.sleep(0.05)
    elapsed = time.monotonic() - start
    fleet.stop_all()
    records = [fleet.get(t) for t in ids]
    by_state: dict[str, int] = {}
    for r in records:
        by_state[r.state.value] = by_state.get(r.state.value, 0) + 1
    conn = sqlite3.connect(fleet.effects)
    duplicated = conn.execute(
        "SELECT COUNT(*) FROM (SELECT key FROM effects GROUP BY key HAVING COUNT(*) > 1)"
    ).fetchone()[0]
    effects = conn.execute("SELECT COUNT(*) FROM effects").fetchone()[0]
    executions = conn.execute("SELECT COUNT(*) FROM executions").fetchone()[0]
    conn.close()
    redeliveries = sum(r.checkpoint.attempts_used.redeliveries for r in records)
    wakes = sum(r.checkpoint.attempts_used.wakes for r in records)
    table = (
        f"\nchaos: {len(ids)} tasks, 4 workers, {kills} kill -9, {elapsed:.1f}s\n"
        f"  states: {by_state}\n  effects: {effects} (duplicated keys: {duplicated})\n"
        f"  step executions: {executions}\n"
        f"  redeliveries: {redeliveries}, wakes: {wakes}\n"
    )
    print(table)
    assert kills >= 3, table
    assert by_state == {"completed": len(ids)}, table + fleet.logs()[-3000:]
    assert duplicated == 0, table
    assert effects == 2 * len(ids), table  # 0 lost: one effect per step of every task
    # Completed steps are never re-run: beyond one execution per step, only a limited
    # attempt (a wake) or the step in flight when its worker died (a redelivery) ran again.
    assert 2 * len(ids) <= executions <= 2 * len(ids) + wakes + redeliveries, table
    # Every limit_once task parked once, unless the kill took its first attempt.
    assert wakes >= len(ids) // 20 - redeliveries, table


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_a_heartbeat_keeps_a_long_step_from_being_taken(tmp_path: Path, twin: str) -> None:
    """A step three times longer than the lease: no other worker takes the task meanwhile."""
    import asyncio

    from rateloop.tasks import AsyncTaskRunner, StepContext, TaskRegistry, task

    reg = TaskRegistry()
    t = task("long", into=reg)
    started = threading.Event()

    @t.step()
    async def slow(ctx: StepContext) -> int:
        started.set()
        await asyncio.sleep(0.9)
        return 1

    if twin == "sync":
        t.steps.clear()

        @t.step()
        def slow_sync(ctx: StepContext) -> int:
            started.set()
            time.sleep(0.9)
            return 1

    url = f"sqlite:///{tmp_path}/tasks.db"
    policy = QueuePolicy(lease_secs=0.3)
    owner_store, thief_store = open_store(url), open_store(url)
    try:
        owner = TaskRunner(owner_store, tasks=reg, policy=policy)
        rec = owner.submit(t)
        if twin == "sync":
            target = owner.run_until_idle
        else:
            aowner = AsyncTaskRunner(owner_store, tasks=reg, policy=policy)

            def target() -> list[TaskRecord]:
                return asyncio.run(aowner.run_until_idle())

        runner = threading.Thread(target=target)
        runner.start()
        assert started.wait(10)
        stolen = []
        while runner.is_alive():
            got = thief_store.claim("thief", lease_secs=0.3)
            if got is not None:
                stolen.append(got)
            time.sleep(0.05)
        runner.join()
        assert stolen == []
        done = owner_store.get(rec.task_id)
        assert done is not None and done.state is TaskState.COMPLETED
        assert done.checkpoint.attempts_used.redeliveries == 0
    finally:
        owner_store.close()
        thief_store.close()


def test_a_worker_with_several_threads_runs_every_task_once(tmp_path: Path) -> None:
    from rateloop.tasks import StepContext, TaskRegistry, task
    from rateloop.tasks.worker import WorkerStats, run_worker

    reg = TaskRegistry()
    t = task("count", into=reg)
    seen: list[str] = []
    lock = threading.Lock()

    @t.step()
    def one(ctx: StepContext) -> str:
        with lock:
            seen.append(ctx.task_id)
        time.sleep(0.01)  # long enough for the threads to overlap
        return ctx.task_id

    url = f"sqlite:///{tmp_path}/tasks.db"
    store = open_store(url)
    try:
        ids = [TaskRunner(store, tasks=reg).submit(t).task_id for _ in range(40)]
        stop = threading.Event()
        stats: list[WorkerStats] = []
        worker = threading.Thread(target=lambda: stats.append(
            run_worker(url, stop=stop, concurrency=3, tasks=reg, poll_secs=0.02)))
        worker.start()
        end = time.monotonic() + 30
        while store.counts().get(TaskState.COMPLETED, 0) < len(ids):
            assert time.monotonic() < end, store.counts()
            time.sleep(0.02)
        stop.set()
        worker.join(30)
        assert sorted(seen) == sorted(ids)
        (result,) = stats
        assert result.deliveries == 40 and result.by_state == {"completed": 40}
    finally:
        store.close()
