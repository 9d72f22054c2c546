"""Real ``rateloop worker`` processes killed while a batch is in flight: submitted exactly once.

Both a :class:`BatchStep` and a model call the ladder handed to the batch rung.

The first worker kills itself (SIGKILL) after the fake accepted its batch and
before the batch id was checkpointed; the next one finds the batch at the
provider instead of submitting again, and is itself killed (SIGKILL, by the
test) while the task is parked on the running batch; a third finishes it.  The
fake runs on a FakeClock that starts at the real time: the batch's hour passes
when the test says so.  Every wait is bounded; every worker is stopped.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from _worker_procs import WorkerProcs
from rateloop.tasks import TaskRegistry, TaskRunner, open_store, task
from rateloop.tasks.model import TaskRecord
from rateloop.tasks.store import TaskStore
from rateloop.testing import FakeBatch, FakeClock, FakeProvider, FakeProviderServer


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    give_up = time.monotonic() + timeout
    while not check():
        if time.monotonic() > give_up:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _workers(tmp: Path, url: str, fake_url: str, mark: Path, flavor: str,
             policy: Path | None = None) -> WorkerProcs:
    """Workers of ``_batch_app.py`` on the fake at ``fake_url``; the first one to submit a
    batch kills itself (SIGKILL) before checkpointing its id, leaving ``mark``."""
    return WorkerProcs(tmp, url, [str(Path(__file__).parent / "_batch_app.py")],
                       lease=1.0, poll=0.1, policy=policy,
                       env={"RATELOOP_BATCH_FAKE_URL": fake_url,
                            "RATELOOP_BATCH_CRASH_MARK": str(mark),
                            "RATELOOP_BATCH_FLAVOR": flavor})


def _task(store: TaskStore) -> TaskRecord:
    """Task ``t1`` as the store holds it now."""
    rec = store.get("t1")
    assert rec is not None
    return rec


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
def test_a_worker_killed_mid_batch_never_submits_it_twice(tmp_path: Path, flavor: str) -> None:
    clock = FakeClock(datetime.now(UTC))
    fake = FakeProvider(batch=FakeBatch(delay=3600), clock=clock)
    server = FakeProviderServer(fake).start()
    url = f"sqlite:///{tmp_path}/tasks.db"
    store = open_store(url)
    mark = tmp_path / "killed"
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    # Submitting needs only the definition's name and steps, not the app's provider.
    local = TaskRegistry()
    task("batch_digest", into=local).step("batch")(lambda ctx: None)
    TaskRunner(store, tasks=local).submit(
        "batch_digest", {"items": {"a": body, "b": body}}, task_id="t1")
    workers = _workers(tmp_path, url, server.url, mark, flavor)
    record = functools.partial(_task, store)

    try:
        first = workers.start()
        wait_for("the first worker to kill itself", lambda: first.poll() is not None)
        assert first.returncode == -9 and mark.exists() and fake.stats.batches == 1
        progress = record().checkpoint.step_progress
        assert progress["pending"]["batch_id"] is None  # it died before saving the id

        second = workers.start()
        def parked(rec: TaskRecord) -> bool:
            if rec.state.value != "waiting_for_capacity":
                return False
            if flavor == "openai":  # found by its metadata, then parked on it
                pending = (rec.checkpoint.step_progress or {}).get("pending") or {}
                return bool(pending.get("batch_id") == mark.read_text())
            # a running message batch cannot be told apart: parked, looking
            return "may be it" in rec.checkpoint.reason

        wait_for("the second worker to park on the batch", lambda: parked(record()))
        workers.kill(second)  # killed while the batch is in flight

        third = workers.start()
        clock.advance(3600 + 60)  # the batch ends on the provider's clock
        wait_for("the task to complete", lambda: record().state.value == "completed")
        result = record().result
        assert result["status"] == {"a": "succeeded", "b": "succeeded"}
        assert result["batches"] == [mark.read_text()]
        assert fake.stats.batches == 1, workers.logs(tail=3000)  # exactly once
        assert third.poll() is None
        assert "sk-fake" not in workers.logs()
    finally:
        workers.stop_all()
        store.close()
        server.stop()


POLICY = """\
attempts_per_route = 1

[ladder]
background = ["standard", "batch", "park"]
deferrable = []
"""


def test_a_worker_killed_on_the_batch_rung_never_submits_twice(tmp_path: Path) -> None:
    clock = FakeClock(datetime.now(UTC))
    fake = FakeProvider(rpm=1, batch=FakeBatch(delay=3600), clock=clock)
    server = FakeProviderServer(fake).start()
    url = f"sqlite:///{tmp_path}/tasks.db"
    store = open_store(url)
    mark = tmp_path / "killed"
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(base_url=server.url, timeout=10) as http:  # the minute's one request
        assert http.post("/v1/chat/completions", json=body).status_code == 200
    local = TaskRegistry()
    task("rung_digest", into=local).step("summarise")(lambda ctx: None)
    TaskRunner(store, tasks=local).submit("rung_digest", {"body": body}, task_id="t1",
                                          priority="background", deadline=3600.0)
    workers = _workers(tmp_path, url, server.url, mark, "openai", policy=policy)
    record = functools.partial(_task, store)

    try:
        first = workers.start()
        wait_for("the first worker to kill itself", lambda: first.poll() is not None)
        assert first.returncode == -9 and fake.stats.batches == 1, workers.logs(tail=3000)
        assert fake.stats.attempts == 2  # the request above, and the step's refused call
        ck = record().checkpoint
        assert ck.batch_route is not None and ck.batch_route.tier == "batch"
        assert ck.step_progress["pending"]["batch_id"] is None  # it died before saving the id

        second = workers.start()

        def parked(rec: TaskRecord) -> bool:
            pending = (rec.checkpoint.step_progress or {}).get("pending") or {}
            return bool(rec.state.value == "waiting_for_capacity"
                        and pending.get("batch_id") == mark.read_text())

        wait_for("the second worker to find the batch and park on it", lambda: parked(record()))
        workers.kill(second)  # killed while the batch is in flight
        assert fake.stats.attempts == 2  # resumed on the batch rung: no synchronous call

        third = workers.start()
        clock.advance(3600 + 60)  # the batch ends on the provider's clock
        wait_for("the task to finish", lambda: not record().state.waiting
                 and record().state.value != "running")
        done = record()
        assert done.state.value == "degraded", done.checkpoint.reason
        step = done.checkpoint.completed_steps[0]
        assert (step.rung, step.result["object"]) == ("batch", "chat.completion")
        assert fake.stats.batches == 1, workers.logs(tail=3000)  # exactly once
        assert fake.stats.attempts == 2
        assert third.poll() is None
        assert "sk-fake" not in workers.logs()
    finally:
        workers.stop_all()
        store.close()
        server.stop()
