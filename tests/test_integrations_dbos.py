"""rateloop inside DBOS, against the real PostgreSQL on 127.0.0.1 and real DBOS workflows.

One DBOS app runs in this process for the module, on a system database of its own
(``rateloop_dbos_<hex>``, dropped at the end).  The crash test runs its app in subprocesses on
another system database: one is killed with SIGKILL during a durable sleep, the next recovers
the workflow.  The calls are scripted functions that raise ``httpx.HTTPStatusError`` like a
provider's SDK; the loop's own sleeps run on a FakeClock, DBOS's durable sleeps are real
(a few seconds in all).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from rateloop import AsyncRateLoop, Policy, RateLoop, Route
from rateloop.admission import Limiter
from rateloop.errors import BackendError
from rateloop.testing import FakeClock

# The skip names PostgreSQL, so .ci/check_services.py counts it as a skipped service test:
# CI installs the dbos extra ('.[dev]') and fails when these tests do not run.
dbos = pytest.importorskip("dbos", reason="the DBOS tests on PostgreSQL need the dbos extra")
from dbos import DBOS, DBOSClient  # noqa: E402

from rateloop.integrations.dbos import (  # noqa: E402
    QueueLimits,
    StepGaveUp,
    StepResult,
    call_step,
    call_step_async,
    check_system_database,
    launch,
    queue_limits,
    refresh_queue,
    refresh_queue_async,
    register_queue,
)

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parent.parent
ROUTE = Route(provider="openai", model="gpt-4o-mini")


def _refusal(status: int, headers: dict[str, str] | None = None) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "https://api.openai.com/v1/chat/completions")
    response = httpx.Response(status, headers=headers or {}, json={"error": {"message": "no"}},
                              request=request)
    return httpx.HTTPStatusError(f"{status}", request=request, response=response)


@dataclass
class Script:
    """A provider call: each attempt takes the next answer (None: a 200); then 200s."""

    answers: list[tuple[int, dict[str, str]] | None]
    models: list[str] = field(default_factory=list)
    refuse_models: frozenset[str] = frozenset()

    def __call__(self, route: Route, **_: Any) -> str:
        self.models.append(route.model)
        if route.model in self.refuse_models:
            raise _refusal(429, {"retry-after": "3600"})
        answer = self.answers.pop(0) if self.answers else None
        if answer is not None:
            raise _refusal(*answer)
        return f"ok:{route.model}"

    async def acall(self, route: Route, **kw: Any) -> str:
        return self(route, **kw)


@dataclass
class Case:
    script: Script
    loop: Any
    options: dict[str, Any] = field(default_factory=dict)


CASES: dict[str, Case] = {}


@DBOS.workflow(name="rateloop_test_call")
def call_workflow(key: str) -> StepResult:
    case = CASES[key]
    return call_step(case.script, loop=case.loop, route=ROUTE, name="chat", **case.options)


@DBOS.workflow(name="rateloop_test_call_async")
async def call_workflow_async(key: str) -> StepResult:
    case = CASES[key]
    return await call_step_async(case.script.acall, loop=case.loop, route=ROUTE, name="chat",
                                 **case.options)


@DBOS.workflow(name="rateloop_test_noted")
def noted_workflow(i: int) -> int:
    return i


def _policy(**top: Any) -> Policy:
    return Policy.from_dict({"pause_limit_secs": 1, **top})


def _loop(policy: Policy | None = None) -> RateLoop:
    return RateLoop(policy or _policy(), clock=FakeClock(), sinks=())


def _sysdb_url(base_dsn: str, name: str) -> str:
    return base_dsn.rsplit("/", 1)[0] + "/" + name


def _drop(base_dsn: str, name: str) -> None:
    import psycopg

    with psycopg.connect(base_dsn, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def dbos_app() -> Iterator[str]:
    """This process's DBOS app on a system database of its own; the database's URL."""
    from conftest import POSTGRES_DSN, _unavailable

    try:
        check_system_database(POSTGRES_DSN, connect_timeout=3)
    except BackendError as exc:
        _unavailable(f"PostgreSQL at {POSTGRES_DSN}", exc)
    name = f"rateloop_dbos_{uuid.uuid4().hex[:10]}"
    url = _sysdb_url(POSTGRES_DSN, name)
    launch({"name": "rateloop-test", "system_database_url": url, "sys_db_pool_size": 5,
            "application_version": "rateloop-test", "log_level": "WARNING"})
    try:
        yield url
    finally:
        DBOS.destroy()
        _drop(POSTGRES_DSN, name)


def _run(workflow: Any, case: Case) -> tuple[str, Any]:
    """Run ``workflow`` on a new case; (workflow id, its handle)."""
    key = uuid.uuid4().hex
    CASES[key] = case
    handle = DBOS.start_workflow(workflow, key)
    return handle.get_workflow_id(), handle


def _steps(workflow_id: str) -> list[str]:
    return [s["function_name"] for s in DBOS.list_workflow_steps(workflow_id)]


# --- the step ------------------------------------------------------------------------------


def test_a_call_that_completes_is_one_recorded_step(dbos_app: str) -> None:
    wid, handle = _run(call_workflow, Case(Script([None]), _loop()))
    result = handle.get_result()
    assert (result.value, result.status, result.degraded) == ("ok:gpt-4o-mini", "completed", False)
    assert (result.requests, result.rounds, result.durable_sleep_secs) == (1, 1, 0.0)
    assert _steps(wid) == ["chat"]


def test_a_short_wait_is_slept_inside_the_step_and_counted(dbos_app: str) -> None:
    script = Script([(429, {"retry-after": "1"}), None])
    loop = _loop(_policy(pause_limit_secs=5))
    before = loop.clock.monotonic()
    wid, handle = _run(call_workflow, Case(script, loop))
    result = handle.get_result()
    assert (result.status, result.requests, result.rounds) == ("completed", 2, 1)
    slept = loop.clock.monotonic() - before  # the loop's FakeClock: its backoff, >= 1 s
    assert result.asleep_secs == slept and 1.0 <= slept <= 5.0
    assert result.durable_sleep_secs == 0.0
    assert _steps(wid) == ["chat"]


def test_a_wait_beyond_the_pause_limit_is_a_durable_sleep_between_rounds(dbos_app: str) -> None:
    script = Script([(429, {"retry-after": "2"}), None])
    started = time.monotonic()
    wid, handle = _run(call_workflow, Case(script, _loop()))
    result = handle.get_result()
    assert time.monotonic() - started >= 1.9  # DBOS slept it, not the loop's FakeClock
    assert (result.status, result.requests, result.rounds) == ("completed", 2, 2)
    assert (result.asleep_secs, result.durable_sleep_secs) == (0.0, 2.0)
    assert _steps(wid) == ["chat", "DBOS.sleep", "chat"]


def test_earlier_rounds_count_against_max_attempts(dbos_app: str) -> None:
    # Round 1 spends 1 of 2 attempts and waits; round 2 has one attempt left, refused: the
    # call is exhausted.  (Counted afresh, round 2 would wait once more and then complete.)
    script = Script([(429, {"retry-after": "2"}), (429, {"retry-after": "2"}), None])
    wid, handle = _run(call_workflow, Case(script, _loop(_policy(max_attempts=2))))
    with pytest.raises(StepGaveUp) as caught:
        handle.get_result()
    assert caught.value.status == "failed_retry_exhausted"
    assert len(script.models) == 2
    assert _steps(wid) == ["chat", "DBOS.sleep", "chat"]


def test_a_terminal_outcome_fails_the_workflow_with_its_reason_and_is_not_retried(
    dbos_app: str,
) -> None:
    script = Script([(400, {})])
    wid, handle = _run(call_workflow, Case(script, _loop()))
    with pytest.raises(StepGaveUp) as caught:
        handle.get_result()
    assert caught.value.status == "invalid"
    assert "invalid" in str(caught.value) and "400" in caught.value.reason
    assert DBOS.get_workflow_status(wid).status == "ERROR"
    assert len(script.models) == 1 and _steps(wid) == ["chat"]


def test_a_degraded_result_is_marked(dbos_app: str) -> None:
    script = Script([], refuse_models=frozenset({"gpt-4o-mini"}))
    fallback = Route(provider="openai", model="gpt-4o")
    _, handle = _run(call_workflow, Case(script, _loop(), {"fallbacks": [fallback]}))
    result = handle.get_result()
    assert (result.value, result.status, result.degraded) == ("ok:gpt-4o", "degraded", True)
    assert result.route == "openai:gpt-4o"
    assert script.models == ["gpt-4o-mini", "gpt-4o"]


def test_the_async_twin_runs_the_same_rounds(dbos_app: str) -> None:
    script = Script([(429, {"retry-after": "2"}), None])
    loop = AsyncRateLoop(_policy(), clock=FakeClock(), sinks=())
    wid, handle = _run(call_workflow_async, Case(script, loop))
    result = handle.get_result()
    assert (result.status, result.requests, result.rounds) == ("completed", 2, 2)
    assert result.durable_sleep_secs == 2.0
    assert _steps(wid) == ["chat", "DBOS.sleep", "chat"]


def test_call_step_outside_a_workflow_is_refused(dbos_app: str) -> None:
    with pytest.raises(RuntimeError, match=r"@DBOS\.workflow\(\)"):
        call_step(Script([]), loop=_loop(), route=ROUTE)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"loop": AsyncRateLoop()}, TypeError, "takes loop= a RateLoop, got AsyncRateLoop"),
        ({"route": "openai:gpt-4o-mini"}, TypeError, "takes route= a rateloop.Route"),
        ({"name": ""}, ValueError, "non-empty step name"),
        ({"priority": "urgent"}, ValueError, "urgent"),
    ],
)
def test_bad_arguments_are_refused_before_any_step(kwargs: dict[str, Any], error: type,
                                                   match: str) -> None:
    arguments: dict[str, Any] = {"loop": _loop(), "route": ROUTE} | kwargs
    with pytest.raises(error, match=match):
        call_step(Script([]), **arguments)


# --- the queue -----------------------------------------------------------------------------

MINI = "openai:gpt-4o-mini"


@pytest.mark.parametrize(
    ("limits", "kwargs", "expected"),
    [
        # About a second of the rate, whatever the provider's bucket holds.
        ({MINI: {"requests_per_minute": 600, "burst": 5 / 60}}, {},
         ({"limit": 10, "period": 1.0}, None)),
        # 1.5 a second: 2 starts every 1.334 s (the period rounded up, never faster).
        ({MINI: {"requests_per_minute": 90}}, {}, ({"limit": 2, "period": 1.334}, None)),
        # Under one a second: one start every 1/rate seconds.
        ({MINI: {"requests_per_minute": 30}}, {}, ({"limit": 1, "period": 2.0}, None)),
        # Two calls a workflow, half the route's capacity (2.5 a second), concurrency halved.
        ({MINI: {"requests_per_minute": 600, "concurrency": 8}},
         {"calls_per_workflow": 2, "share": 0.5}, ({"limit": 3, "period": 1.2}, 4)),
        # Only a day quota: a rolling day.
        ({MINI: {"requests_per_day": 1000}}, {}, ({"limit": 1000, "period": 86400.0}, None)),
        # Every scope counts; the tightest binds.
        ({MINI: {"requests_per_minute": 600, "concurrency": 8},
          f"{MINI}:proj": {"requests_per_minute": 120, "concurrency": 16}},
         {}, ({"limit": 2, "period": 1.0}, 8)),
        ({"openai:gpt-4o": {"requests_per_minute": 600}}, {}, (None, None)),
    ],
)
def test_queue_limits_from_the_policys_configured_limits(
    limits: dict[str, Any], kwargs: dict[str, Any], expected: tuple[Any, int | None]
) -> None:
    route = Route(provider="openai", model="gpt-4o-mini", project="proj")
    got = queue_limits(Policy.from_dict({"limits": limits}), route, **kwargs)
    assert (got.limiter, got.global_concurrency) == expected


def test_queue_limits_from_what_the_limiter_learned() -> None:
    limiter = Limiter(clock=FakeClock())
    assert queue_limits(limiter, ROUTE).limiter is None  # nothing known yet
    limiter.observe(MINI, {"x-ratelimit-limit-requests": "600",  # learned: 600 a minute
                           "x-ratelimit-remaining-requests": "49",
                           "x-ratelimit-reset-requests": "100ms"})
    got = queue_limits(limiter, ROUTE)
    assert got.limiter == {"limit": 10, "period": 1.0} and got.scope == MINI


@pytest.mark.parametrize(
    ("known", "kwargs", "error", "match"),
    [
        (Policy(), {"share": 0}, ValueError, "share must be a fraction 0 < share <= 1, got 0"),
        (Policy(), {"share": 1.5}, ValueError, "got 1.5"),
        (Policy(), {"share": True}, ValueError, "got True"),
        (Policy(), {"calls_per_workflow": 0}, ValueError, "calls_per_workflow must be an int"),
        ("redis://x", {}, TypeError, "known must be a rateloop.Policy or a Limiter, got 'redis"),
    ],
)
def test_queue_limits_refuse_bad_input(known: Any, kwargs: dict[str, Any], error: type,
                                      match: str) -> None:
    with pytest.raises(error, match=match):
        queue_limits(known, ROUTE, **kwargs)


def test_a_queue_is_registered_and_refreshed_with_rateloops_limits(dbos_app: str) -> None:
    name = f"rl-{uuid.uuid4().hex[:8]}"
    policy = Policy.from_dict({"limits": {MINI: {"requests_per_minute": 600, "concurrency": 6}}})
    queue = register_queue(name, queue_limits(policy, ROUTE), polling_interval_sec=0.5)
    try:
        stored = DBOS.retrieve_queue(name)
        assert stored is not None
        assert (stored.limiter, stored.global_concurrency) == ({"limit": 10, "period": 1.0}, 6)
        learned = QueueLimits({"limit": 49, "period": 4.9}, 6, MINI)
        assert refresh_queue(queue, learned) is True
        again = DBOS.retrieve_queue(name)
        assert again is not None and again.limiter == {"limit": 49, "period": 4.9}
        assert refresh_queue(queue, learned) is False  # nothing to write
        fewer = QueueLimits({"limit": 49, "period": 4.9}, 3, MINI)
        assert asyncio.run(refresh_queue_async(queue, fewer)) is True
        assert DBOS.retrieve_queue(name).global_concurrency == 3  # type: ignore[union-attr]
        with pytest.raises(TypeError, match="limiter"):
            register_queue(name, learned, limiter={"limit": 1, "period": 1.0})
    finally:
        DBOS.delete_queue(name)


def _wait_for(predicate: Any, timeout: float) -> bool:
    stop = time.monotonic() + timeout
    while time.monotonic() < stop:
        if predicate():
            return True
        threading.Event().wait(0.1)
    return predicate()


def test_running_workers_take_a_refreshed_limiter_at_their_next_poll(dbos_app: str) -> None:
    name = f"rl-{uuid.uuid4().hex[:8]}"
    queue = register_queue(name, QueueLimits({"limit": 1, "period": 60.0}, None, None),
                           polling_interval_sec=0.2)
    try:
        ids = [queue.enqueue(noted_workflow, i).get_workflow_id() for i in range(3)]

        def done() -> int:
            return sum(DBOS.get_workflow_status(w).status == "SUCCESS" for w in ids)  # type: ignore[union-attr]

        assert _wait_for(lambda: done() >= 1, 10)
        assert not _wait_for(lambda: done() > 1, 1.0)  # one start a minute: the rest wait
        assert refresh_queue(queue, QueueLimits({"limit": 100, "period": 1.0}, None, None))
        assert _wait_for(lambda: done() == 3, 10)  # without the refresh: a minute
    finally:
        DBOS.delete_queue(name)


# --- launching ---------------------------------------------------------------------------


def test_an_unreachable_system_database_is_one_clear_error_fast() -> None:
    url = "postgresql://rateloop:s3cret-pw@127.0.0.1:1/rateloop_nowhere"
    started = time.monotonic()
    with pytest.raises(BackendError) as caught:
        launch({"name": "rateloop-test", "system_database_url": url})
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert "127.0.0.1:1/rateloop_nowhere" in message and "start PostgreSQL" in message
    assert "s3cret-pw" not in message


def test_a_system_database_not_created_yet_passes_the_check(postgres_dsn: str) -> None:
    check_system_database(_sysdb_url(postgres_dsn, f"rateloop_absent_{uuid.uuid4().hex[:8]}"))


def test_launch_needs_a_system_database_url() -> None:
    with pytest.raises(ValueError, match="system_database_url"):
        launch({"name": "rateloop-test"})  # type: ignore[typeddict-item]


# --- a process killed mid-workflow -------------------------------------------------------


@pytest.mark.redis
def test_a_workflow_killed_during_its_durable_sleep_recovers_without_repeating_a_step(
    postgres_dsn: str, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    import redis

    name = f"rateloop_dbos_crash_{uuid.uuid4().hex[:8]}"
    sysdb = _sysdb_url(postgres_dsn, name)
    wid = f"crash-{uuid.uuid4().hex[:8]}"
    app = [sys.executable, str(ROOT / "tests" / "_dbos_crash_app.py")]
    args = [sysdb, redis_url, redis_prefix, wid]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    counts = redis.Redis.from_url(redis_url)
    log = tmp_path / "start.log"
    with log.open("wb") as out:
        child = subprocess.Popen([*app, "start", *args], env=env, start_new_session=True,
                                 stdout=out, stderr=subprocess.STDOUT)
    client: DBOSClient | None = None
    try:
        def sleeping() -> bool:
            nonlocal client
            if counts.get(f"{redis_prefix}:b") is None:
                return False
            client = client or DBOSClient(system_database_url=sysdb)
            return "DBOS.sleep" in [s["function_name"] for s in client.list_workflow_steps(wid)]

        assert _wait_for(sleeping, 30), log.read_text()[-3000:]
        os.killpg(child.pid, 9)
        child.wait(timeout=10)
        assert counts.get(f"{redis_prefix}:a") == b"1"
        assert counts.get(f"{redis_prefix}:b") == b"1"
        recovered = subprocess.run([*app, "recover", *args], env=env, capture_output=True,
                                   text=True, timeout=60, check=False)
        assert recovered.returncode == 0, recovered.stderr[-3000:]
        assert "result: a:gpt-4o-mini,b:gpt-4o-mini" in recovered.stdout
        # ``a`` finished before the kill and was not run again; ``b``'s refused round was
        # replayed from its record, its second round ran once.
        assert counts.get(f"{redis_prefix}:a") == b"1"
        assert counts.get(f"{redis_prefix}:b") == b"2"
    finally:
        if child.poll() is None:
            os.killpg(child.pid, 9)
            child.wait(timeout=10)
        if client is not None:
            client.destroy()
        _drop(postgres_dsn, name)
