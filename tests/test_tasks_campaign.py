"""Real worker processes on SQLite and PostgreSQL: a live worker keeps its task; kill -9 loses none.

The first test has no crash at all: two ``rateloop worker`` processes, a 1 s
lease and steps of 1.3 s.  Only a dead worker may lose its lease, so the idle
worker never takes the task and every step runs exactly once.  The campaign
kills workers at random (``tests/_tasks_campaign.py``) and checks that no task
is lost, no keyed side effect is performed twice by a live worker, the
non-idempotent write never lands twice and is never run again without its
outcome check saying it did not land.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import tasks_campaign_app as app
from _tasks_campaign import Fleet, run_campaign, wait_booted
from _worker_procs import task_store_url
from rateloop.tasks import TaskRunner, TaskState, open_store


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest) -> str:
    if request.param == "postgres":
        request.getfixturevalue("postgres_dsn")  # skip (or fail in CI) without a server
    return str(request.param)


@pytest.fixture
def url(engine: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    dsn = request.getfixturevalue("postgres_dsn") if engine == "postgres" else None
    with task_store_url(tmp_path, dsn) as url:
        yield url


def test_two_live_workers_a_step_longer_than_the_lease_runs_once(
    url: str, tmp_path: Path
) -> None:
    fleet = Fleet(url, tmp_path, lease=1.0, poll=0.02)
    store = open_store(url)
    try:
        for _ in range(2):
            fleet.start()
        wait_booted(fleet, 2, 60)  # both poll before the task exists: one stays idle
        slow = {"fetch": 1.3, "draft": 1.3, "post": 1.3, "review": 0.0, "notify": 0.0}
        rec = TaskRunner(store, tasks=[app.campaign]).submit(app.campaign, {"sleep": slow})
        end = time.monotonic() + 45
        while not (got := store.get(rec.task_id)) or not got.state.terminal:
            assert time.monotonic() < end, fleet.logs(tail=3000)
            time.sleep(0.05)
        assert got.state is TaskState.COMPLETED, fleet.logs(tail=3000)
        conn = sqlite3.connect(fleet.effects)
        try:
            runs = dict(conn.execute("SELECT step, COUNT(*) FROM executions GROUP BY step"))
            pids = {pid for (pid,) in conn.execute("SELECT DISTINCT pid FROM executions")}
            checks = conn.execute("SELECT COUNT(*) FROM checks").fetchone()[0]
        finally:
            conn.close()
        assert runs == dict.fromkeys(app.campaign.step_names, 1), fleet.logs(tail=3000)
        assert len(pids) == 1  # one worker ran the whole task: the other never took it
        assert checks == 0
        assert got.checkpoint.attempts_used.redeliveries == 0  # no false redelivery
        assert got.deliveries == 1
    finally:
        fleet.stop_all()
        store.close()


@pytest.mark.slow
def test_kill_9_campaign_loses_nothing_and_never_writes_twice(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    dsn = request.getfixturevalue("postgres_dsn") if engine == "postgres" else ""
    fig, logs = run_campaign(
        engine, tasks=40, workers=3, kill_every=(0.5, 1.0), max_kills=20, lease=1.0,
        step_secs=0.04, timeout=60, postgres_dsn=dsn or "postgresql://unused", tmp=tmp_path,
    )
    table = fig.table()
    print(table)
    assert fig.kills >= 4, table
    assert fig.lost == 0, f"{table}\n{logs}"
    assert fig.dup_effects_live == 0 and fig.dup_executions_live == 0, table
    assert fig.double_posts == 0 and fig.unchecked_reposts == 0, table
    assert fig.checks_landed >= fig.dying_posts == 2, table  # the check settled them
    assert fig.false_redeliveries == 0, table
    assert fig.executions >= 5 * fig.tasks, table
