"""``rateloop worker`` as an operator meets it, through the real CLI in subprocesses.

A worker logs to stderr (``--log-level``), never a task's arguments or a key;
an ``--app`` that fails to import is a one-line error; a worker leaves the
tasks it has no definition for to a worker that has one, and ``tasks list``
says so; ``tasks show`` says why each delivery happened.  On SQLite and on
PostgreSQL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import test_tasks_app as app
from _worker_procs import SRC, WorkerProcs, task_store_url
from rateloop.tasks import (
    StepContext,
    TaskRecord,
    TaskRegistry,
    TaskRunner,
    TaskState,
    open_store,
    task,
)
from rateloop.tasks.store import TaskStore

APP = str(Path(__file__).resolve().parent / "test_tasks_app.py")
SECRET = "sk-proj-SECRET-task-argument-0123456789"

OTHER_APP = '''
from rateloop.tasks import StepContext, task

other = task("other")


@other.step()
def only(ctx: StepContext) -> str:
    return "done by a worker that knows it"
'''


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    return dict(
        os.environ, PYTHONPATH=os.pathsep.join([SRC, str(tmp)]),
        RATELOOP_TEST_EFFECTS=str(tmp / "effects.db"), OPENAI_API_KEY=SECRET, **extra,
    )


def _rateloop(tmp: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rateloop", *args], env=_env(tmp), capture_output=True,
        text=True, timeout=timeout, check=False,
    )


class Workers(WorkerProcs):
    """``rateloop worker`` processes on one store, and the store to read the tasks from."""

    def __init__(self, tmp: Path, url: str) -> None:
        app.init_effects(str(tmp / "effects.db"))
        super().__init__(tmp, url, [APP], lease=1.0, poll=0.05, env=_env(tmp))
        self.store: TaskStore = open_store(url)

    def get(self, task_id: str) -> TaskRecord:
        rec = self.store.get(task_id)
        assert rec is not None
        return rec

    def wait(self, task_id: str, done: Callable[[TaskRecord], bool], timeout: float = 30) -> None:
        end = time.monotonic() + timeout
        while not done(self.get(task_id)):
            assert time.monotonic() < end, f"{self.get(task_id)!r}\n{self.logs()}"
            time.sleep(0.05)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def workers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Workers]:
    dsn = request.getfixturevalue("postgres_dsn") if request.param == "postgres" else None
    with task_store_url(tmp_path, dsn) as url:
        w = Workers(tmp_path, url)
        yield w
        w.stop_all()
        w.store.close()


def _submit(store: TaskStore, mode: str, **kw: object) -> str:
    return TaskRunner(store, tasks=[app.durable]).submit(app.durable, {"mode": mode, **kw}).task_id


# --- logging (item 3) -------------------------------------------------------------------


def test_a_worker_logs_each_delivery_to_stderr_without_arguments_or_keys(
    workers: Workers,
) -> None:
    tid = _submit(workers.store, "plain", note=SECRET)
    worker = workers.start()
    workers.wait(tid, lambda r: r.state is TaskState.COMPLETED)
    workers.stop(worker)
    log = workers.log(worker)
    assert f"task {tid} (durable): completed at step 2/2" in log, log
    assert " INFO rateloop.tasks" in log
    assert SECRET not in log


def test_log_level_is_a_flag_and_a_bad_one_is_named(workers: Workers) -> None:
    tid = _submit(workers.store, "plain")
    worker = workers.start("--log-level", "warning")
    workers.wait(tid, lambda r: r.state is TaskState.COMPLETED)
    workers.stop(worker)
    assert f"task {tid}" not in workers.log(worker)
    bad = _rateloop(workers.tmp, "worker", "--store", workers.url, "--log-level", "loud")
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.splitlines() == [
        "rateloop: --log-level 'loud': allowed: debug, info, warning, error"
    ]


def test_a_lost_lease_is_logged_and_tasks_show_says_why_each_delivery_happened(
    workers: Workers,
) -> None:
    tid = _submit(workers.store, "slow_first", sleep=2.5)
    paused = workers.start()
    workers.wait(tid, lambda r: r.state is TaskState.RUNNING)
    paused.send_signal(signal.SIGSTOP)  # paused past its lease, as a stalled VM would be
    taker = workers.start()
    workers.wait(tid, lambda r: r.deliveries == 2)
    paused.send_signal(signal.SIGCONT)
    workers.wait(tid, lambda r: r.state is TaskState.COMPLETED)
    end = time.monotonic() + 30
    while "lost its lease" not in workers.log(paused):
        assert time.monotonic() < end, workers.log(paused)
        time.sleep(0.05)
    workers.stop(paused)
    workers.stop(taker)
    log = workers.log(paused)
    assert f"task {tid} (durable): worker " in log and f":{paused.pid}:" in log
    assert " WARNING rateloop.tasks" in log and SECRET not in log

    shown = _rateloop(workers.tmp, "tasks", "show", tid, "--store", workers.url)
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["deliveries"] == 2
    summary = data["delivery_summary"]
    assert summary.startswith("2 deliveries: 1 first claim, 1 lease expired (worker "), summary
    assert f":{paused.pid}:" in summary
    history = data["delivery_history"]
    assert [d["reason"] for d in history] == ["first", "lease_expired"]
    assert f":{paused.pid}:" in history[1]["previous_owner"]
    assert f":{taker.pid}:" in history[1]["worker_id"]


# --- --app import errors (item 4) ---------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "error"),
    [
        ("raise RuntimeError('no config at import')\n", "RuntimeError: no config at import"),
        ("def broken(:\n    pass\n", "SyntaxError: "),
        ("import json\nvalue = json.loads('{')\n", "JSONDecodeError: "),
        ("import no_such_dependency_xyz\n",
         "ModuleNotFoundError: No module named 'no_such_dependency_xyz'"),
    ],
)
@pytest.mark.parametrize("as_module", [False, True])
def test_an_app_that_fails_at_import_is_a_one_line_error(
    tmp_path: Path, source: str, error: str, as_module: bool
) -> None:
    name = f"broken_app_{uuid.uuid4().hex[:6]}"
    (tmp_path / f"{name}.py").write_text(source)
    spec = name if as_module else str(tmp_path / f"{name}.py")
    out = _rateloop(tmp_path, "worker", "--store", f"sqlite:///{tmp_path}/t.db", "--app", spec)
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.splitlines()
    assert line.startswith(f"rateloop: --app {spec!r} could not be imported: "), line
    assert error in line and "Traceback" not in out.stderr


# --- a worker without a task's definition (item 5) -----------------------------------------


def test_a_task_no_worker_knows_stays_queued_and_tasks_list_says_so(workers: Workers) -> None:
    reg = TaskRegistry()
    other = task("other", into=reg)

    @other.step()
    def only(ctx: StepContext) -> str:
        return "done by a worker that knows it"

    orphan = TaskRunner(workers.store, tasks=reg).submit(other).task_id
    known = _submit(workers.store, "plain")
    worker = workers.start()
    workers.wait(known, lambda r: r.state is TaskState.COMPLETED)
    time.sleep(0.5)  # many polls: the worker never takes the task it cannot run
    rec = workers.get(orphan)
    assert rec.state is TaskState.QUEUED and rec.deliveries == 0 and rec.lease_owner is None

    listed = _rateloop(workers.tmp, "tasks", "list", "--store", workers.url)
    assert listed.returncode == 0, listed.stderr
    line = next(x for x in listed.stdout.splitlines() if x.startswith(orphan))
    assert "queued" in line and "no running worker knows task 'other'" in line, listed.stdout
    known_line = next(x for x in listed.stdout.splitlines() if x.startswith(known))
    assert "no running worker" not in known_line
    as_json = _rateloop(workers.tmp, "tasks", "list", "--store", workers.url, "--json")
    notes = {d["task_id"]: d["note"] for d in map(json.loads, as_json.stdout.splitlines())}
    assert "no running worker knows task 'other'" in notes[orphan] and notes[known] is None

    (workers.tmp / "other_app.py").write_text(OTHER_APP)
    workers.start(apps=(str(workers.tmp / "other_app.py"),))
    workers.wait(orphan, lambda r: r.state is TaskState.COMPLETED)
    assert workers.get(orphan).result == "done by a worker that knows it"
    workers.stop(worker)
