"""The queue in ``rateloop status`` and the dashboard: depth, oldest task, next wake-ups."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from rateloop._clock import system_clock
from rateloop.observe.queue_state import read_queue
from rateloop.outcome import Outcome, Status
from rateloop.tasks import StepContext, TaskRegistry, TaskRunner, open_store, task
from rateloop.testing import FakeClock

SRC = str(Path(__file__).resolve().parents[1] / "src")


def fill(store: Any, clock: FakeClock) -> tuple[str, str]:
    """One task parked on a daily quota (3 h) after its first step, one still queued."""
    tasks = TaskRegistry()
    report = task("report", version="1", into=tasks)

    @report.step()
    def fetch(ctx: StepContext) -> dict[str, int]:
        return {"rows": 1}

    @report.step()
    def draft(ctx: StepContext) -> object:
        return Outcome(
            status=Status.WAITING_FOR_RESET,
            reason="daily quota spent",
            retry_at=clock.now() + timedelta(hours=3),
        )

    @report.step()
    def publish(ctx: StepContext) -> None:
        return None

    runner = TaskRunner(store, tasks=tasks, clock=clock)
    parked = runner.submit(report, {}, priority="scheduled")
    runner.run_until_idle()
    clock.advance(60)
    queued = runner.submit(report, {}, priority="background", not_before=3600)
    return parked.task_id, queued.task_id


def finish_one(store: Any, clock: FakeClock) -> int:
    """Run one one-step task to completion; returns how many completed."""
    tasks = TaskRegistry()
    quick = task("quick", version="1", into=tasks)

    @quick.step()
    def only(ctx: StepContext) -> dict[str, int]:
        return {"ok": 1}

    runner = TaskRunner(store, tasks=tasks, clock=clock)
    runner.submit(quick, {})
    runner.run_until_idle()
    return sum(n for state, n in store.counts().items() if state.value == "completed")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/tasks.db"
        return
    dsn = request.getfixturevalue("postgres_dsn")
    schema = f"rateloop_obs_{uuid.uuid4().hex[:10]}"
    yield f"{dsn}?schema={schema}"
    from rateloop.tasks.postgres_store import PostgresTaskStore

    cleaner = PostgresTaskStore(dsn, schema=schema)
    cleaner.drop()
    cleaner.close()


def test_read_queue_depth_oldest_and_wakeups(store_url: str) -> None:
    clock = FakeClock()
    store = open_store(store_url, clock=clock)
    try:
        parked, _ = fill(store, clock)
        clock.advance(120)
        q = read_queue(store, clock.now())
    finally:
        store.close()
    assert q.depth == 2 and q.oldest_exact
    assert q.by_state == {"waiting_for_reset": 1, "queued": 1}
    assert q.oldest_age_secs == pytest.approx(180.0)  # the parked one, 3 minutes ago
    (waiting,) = q.waiting
    assert waiting["task_id"] == parked and waiting["priority"] == "scheduled"
    assert waiting["remaining_steps"] == ["draft", "publish"]
    assert waiting["reason"] == "daily quota spent"
    assert (
        waiting["retry_at"]
        == (clock.now() - timedelta(seconds=180) + timedelta(hours=3)).isoformat()
    )
    data = q.to_dict()
    assert json.loads(json.dumps(data)) == data


def rateloop(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rateloop", *args],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PYTHONPATH": SRC},
    )  # fmt: skip


@pytest.mark.redis
def test_status_shows_the_queue(redis_url: str, redis_prefix: str, tmp_path: Path) -> None:
    # Starting at the real time: the command reads the queue at the system's now.
    url = f"sqlite:///{tmp_path}/tasks.db"
    clock = FakeClock(start=system_clock.now())
    store = open_store(url, clock=clock)
    try:
        fill(store, clock)
    finally:
        store.close()
    out = rateloop("status", "--redis", redis_url, "--prefix", redis_prefix, "--store", url)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert f"queue  {url}  depth 2" in text
    (row,) = [
        line for line in text.splitlines() if line.split()[1:3] == ["report", "waiting_for_reset"]
    ]
    assert "scheduled" in row and "draft,publish" in row and "daily quota spent" in row
    out = rateloop(
        "status", "--redis", redis_url, "--prefix", redis_prefix, "--store", url, "--json"
    )
    queue = json.loads(out.stdout)["queue"]
    assert queue["depth"] == 2 and queue["waiting"][0]["remaining_steps"] == ["draft", "publish"]


def test_status_never_creates_a_missing_store(tmp_path: Path) -> None:
    path = tmp_path / "typo.db"
    out = rateloop("status", "--store", f"sqlite:///{path}")
    assert out.returncode == 2
    assert "no task store" in out.stderr and str(path) in out.stderr
    assert not path.exists()


class NoScopes:
    """A state reader with no scopes: these tests are about the queue."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    def read(self) -> Any:
        from rateloop.observe.state import Snapshot

        return Snapshot(at=self.clock.now(), prefix="p:", scopes=())


def test_queue_gauges_through_prometheus_and_otel(tmp_path: Path) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from rateloop.observe.state_metrics import ScopeStateCollector, observe_scope_state

    clock = FakeClock()
    store = open_store(f"sqlite:///{tmp_path}/tasks.db", clock=clock)
    try:
        fill(store, clock)
        done = finish_one(store, clock)
        clock.advance(40)
        registry = CollectorRegistry()
        registry.register(ScopeStateCollector(NoScopes(clock), store=store))
        text = generate_latest(registry).decode()
        metric_reader = InMemoryMetricReader()
        provider = MeterProvider(metric_readers=[metric_reader])
        observe_scope_state(NoScopes(clock), store=store, meter_provider=provider)
        data = metric_reader.get_metrics_data()
        provider.shutdown()
    finally:
        store.close()
    prom = {
        (s.name, tuple(sorted(s.labels.values()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert prom[("rateloop_queue_tasks", ("waiting_for_reset",))] == 1
    assert prom[("rateloop_queue_tasks", ("queued",))] == 1
    # The depth counts only what is still to do: the completed task is apart.
    assert prom[("rateloop_queue_depth", ())] == 2
    assert ("rateloop_queue_tasks", ("completed",)) not in prom
    assert sum(v for (name, _), v in prom.items() if name == "rateloop_queue_tasks") == 2
    assert prom[("rateloop_queue_finished_tasks", ("completed",))] == done == 1
    assert prom[("rateloop_queue_oldest_age_seconds", ())] == 100  # parked 60 + 40 s ago
    assert prom[("rateloop_queue_next_wakeup_seconds", ())] == 3 * 3600 - 100
    assert prom[("rateloop_queue_parked", ("scheduled",))] == 1
    assert data is not None
    otel = {
        m.name: [p.value for p in m.data.data_points]
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert otel["rateloop.queue.oldest_age_seconds"] == [100]
    assert otel["rateloop.queue.next_wakeup_seconds"] == [3 * 3600 - 100]
    assert sorted(otel["rateloop.queue.tasks"]) == [0, 0, 1, 1]  # running, waiting_for_capacity
    assert otel["rateloop.queue.depth"] == [2]
    assert otel["rateloop.queue.finished_tasks"] == [1]
