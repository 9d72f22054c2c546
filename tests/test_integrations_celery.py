"""rateloop inside Celery (rateloop.integrations.celery).

The mapping, the budget and the write keys run eagerly (``task.apply()``) on a FakeClock;
the engine tests run real ``celery worker`` processes (tests/celery_app.py) against the real
Redis (broker and result backend) and RabbitMQ on 127.0.0.1:5672 (broker), including
workers SIGKILLed mid-task.
"""

from __future__ import annotations

import functools
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from celery import Celery

from _celery_workers import Workers, client_app, deliveries, free_port
from rateloop import Policy, RateLoop, Route
from rateloop.admission import Limiter
from rateloop.integrations._engine import EngineVerdict, Finish, GiveUp, RetryLater
from rateloop.integrations.celery import (
    BrokerUnreachable,
    TaskGaveUp,
    WriteKeys,
    check_engine,
    rateloop_task,
)
from rateloop.tasks import StepContext
from rateloop.testing import FakeClock, FakeProvider, FakeProviderServer

TESTS = Path(__file__).resolve().parent
SRC = str(TESTS.parent / "src")
ROUTE = Route(provider="openai", model="gpt-4o")
FALLBACK = Route(provider="openai", model="gpt-4o-mini")


def _status_error(status: int, **headers: str) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "https://api.openai.com/v1/chat/completions")
    body = ({"error": {"message": "Rate limit reached for requests", "type": "requests",
                       "code": "rate_limit_exceeded"}} if status == 429 else
            {"error": {"message": "Invalid 'messages'.", "type": "invalid_request_error",
                       "code": "empty_array"}})
    response = httpx.Response(status, headers=headers, request=request, json=body)
    return httpx.HTTPStatusError(f"{status}", request=request, response=response)


class Eager:
    """A Celery app run eagerly (``apply()``), a loop on a FakeClock, the verdicts seen."""

    def __init__(self, policy: Policy) -> None:
        self.clock = FakeClock()
        self.policy = policy
        self.app = Celery(f"eager-{uuid.uuid4().hex[:6]}", broker="memory://",
                          backend="cache+memory://")
        self.loop = RateLoop(policy, clock=self.clock,
                             limiter=Limiter.from_url("memory://", clock=self.clock))
        self.verdicts: list[tuple[int, EngineVerdict]] = []

    def seen(self, task: Any, verdict: EngineVerdict) -> None:
        self.verdicts.append((task.request.retries, verdict))

    def task(self, fn: Callable[..., Any], **options: Any) -> Any:
        return rateloop_task(self.app, route=ROUTE, loop=self.loop, on_outcome=self.seen,
                             **options)(fn)


# --- the mapping, eagerly ---------------------------------------------------------------


def test_a_short_wait_is_slept_inside_the_task_and_the_value_returned() -> None:
    eager = Eager(Policy.from_dict({"pause_limit_secs": 5}))
    answers = iter([_status_error(429, **{"retry-after": "2"}), "hello"])

    def ask(route: Route, i: int) -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return f"{answer} {i}"

    result = eager.task(ask).apply(args=(7,))
    assert (result.state, result.result) == ("SUCCESS", "hello 7")
    assert [type(v) for _, v in eager.verdicts] == [Finish]  # one delivery, no engine retry
    assert eager.clock.sleeps and 2.0 <= sum(eager.clock.sleeps) <= 5.0
    assert eager.verdicts[0][1].outcome.waited_secs == sum(eager.clock.sleeps)


def test_a_long_wait_goes_back_to_celery_and_its_retries_spend_the_loops_budget() -> None:
    eager = Eager(Policy.from_dict({"pause_limit_secs": 5, "max_attempts": 3}))
    sent: list[int] = []

    def ask(route: Route, i: int) -> str:
        sent.append(i)
        raise _status_error(429, **{"retry-after": "30"})

    task = eager.task(ask)
    assert task.max_retries == 3  # Celery's count is the policy's max_attempts
    result = task.apply(args=(1,))  # eager: each retry runs again at once, retries + 1
    assert result.state == "FAILURE"
    assert isinstance(result.result, TaskGaveUp)
    assert result.result.status == "failed_retry_exhausted"
    kinds = [(retries, type(v).__name__) for retries, v in eager.verdicts]
    assert kinds == [(0, "RetryLater"), (1, "RetryLater"), (2, "RetryLater"), (3, "GiveUp")]
    first = eager.verdicts[0][1]
    assert isinstance(first, RetryLater) and first.delay_secs == pytest.approx(30.0, abs=1.0)
    # The provider was asked once: the pause it taught holds the later deliveries back.
    assert sent == [1]
    assert eager.clock.sleeps == []  # nothing slept inside the task


@pytest.mark.parametrize(("error", "status"), [
    (_status_error(400), "invalid"),
    (_status_error(401), "needs_operator"),
])
def test_a_terminal_outcome_fails_the_task_with_its_reason_and_is_not_retried(
    error: Exception, status: str
) -> None:
    eager = Eager(Policy())

    def ask(route: Route) -> str:
        raise error

    result = eager.task(ask).apply()
    assert result.state == "FAILURE"
    assert isinstance(result.result, TaskGaveUp)
    assert result.result.status == status and result.result.reason
    assert str(result.result).startswith(f"{status}: ")
    assert [type(v) for _, v in eager.verdicts] == [GiveUp]


def test_degraded_returns_the_value_marked_degraded() -> None:
    eager = Eager(Policy.from_dict({"pause_limit_secs": 5}))

    def ask(route: Route) -> str:
        if route.model == ROUTE.model:
            raise _status_error(429, **{"retry-after": "600"})
        return f"from {route.model}"

    result = eager.task(ask, call_options={"fallbacks": [FALLBACK]}).apply()
    assert (result.state, result.result) == ("SUCCESS", "from gpt-4o-mini")
    (_, decided), = eager.verdicts
    assert isinstance(decided, Finish) and decided.degraded
    # marked=True: the caller's .get() sees the mark, not only the hook
    marked = eager.task(ask, call_options={"fallbacks": [FALLBACK]}, marked=True,
                        name="ask-marked").apply()
    assert marked.state == "SUCCESS"
    assert marked.result["value"] == "from gpt-4o-mini" and marked.result["degraded"] is True
    assert marked.result["model"] == "gpt-4o-mini" and marked.result["reason"]


def test_marked_completed_says_not_degraded() -> None:
    eager = Eager(Policy())

    def hello(route: Route) -> str:
        return "hi"

    result = eager.task(hello, marked=True).apply()
    assert result.result == {"value": "hi", "degraded": False, "model": ROUTE.model,
                             "reason": result.result["reason"]}


def test_task_gave_up_is_rebuilt_from_its_arguments() -> None:
    error = TaskGaveUp("invalid", "bad request sk-abcdefghijklmnopqrstu")
    rebuilt = TaskGaveUp(*error.args)  # what the result backend does
    assert (rebuilt.status, rebuilt.reason, str(rebuilt)) == (
        error.status, error.reason, "invalid: bad request [redacted]")


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"route": "openai:gpt-4o"}, "route must be a rateloop.Route"),
    ({"route": ROUTE, "policy": "policy.toml"}, "Policy.from_file"),
    ({"route": ROUTE, "call_options": {"prompt": "x"}}, "unknown rateloop option.*prompt"),
    ({"route": ROUTE, "call_options": {"priority": "urgent"}}, "priority must be one of"),
    ({"route": ROUTE, "on_outcome": 3}, "on_outcome must be a callable"),
    ({"route": ROUTE, "max_retries": 5}, "max_retries=.*max_attempts"),
    ({"route": ROUTE, "autoretry_for": (Exception,)}, "autoretry_for=.*on top"),
    ({"route": ROUTE, "idempotent": False}, "write_keys='redis://"),
    ({"route": ROUTE, "loop": object()}, "loop must be a rateloop.RateLoop"),
    ({"route": ROUTE, "marked": "yes"}, "marked must be True or False"),
])
def test_bad_arguments_are_refused_naming_the_value(kwargs: dict[str, Any], match: str) -> None:
    app = Celery("bad", broker="memory://")
    with pytest.raises((TypeError, ValueError), match=match):
        rateloop_task(app, **kwargs)


def test_a_missing_celery_names_the_extra() -> None:
    code = ("import sys; sys.modules['celery'] = None\n"
            "try:\n    import rateloop.integrations.celery\n"
            "except ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": SRC}, timeout=60, check=True)
    assert "pip install 'rateloop[celery]'" in out.stdout


# --- write keys, eagerly, on the real Redis -------------------------------------------------


@pytest.fixture
def write_keys(redis_url: str, redis_prefix: str) -> Iterator[WriteKeys]:
    keys = WriteKeys(redis_url, prefix=redis_prefix + "write:")
    yield keys
    keys.close()


def _writer(eager: Eager, keys: WriteKeys, effects: list[str],
            check: Callable[[StepContext, Route], Any] | None = None) -> Any:
    def post(route: Route, i: int, *, idempotency_key: str) -> str:
        effects.append(idempotency_key)
        return f"posted {i}"

    return eager.task(post, idempotent=False, write_keys=keys, outcome_check=check)


@pytest.mark.redis
def test_redis_a_finished_write_is_not_run_again_on_redelivery(write_keys: WriteKeys) -> None:
    eager, effects = Eager(Policy()), []
    task = _writer(eager, write_keys, effects)
    first = task.apply(args=(1,), task_id="order-1")
    again = task.apply(args=(1,), task_id="order-1")  # the same message, delivered again
    assert (first.result, again.result) == ("posted 1", "posted 1")
    assert effects == ["order-1"]


@pytest.mark.redis
@pytest.mark.parametrize(("landed", "state", "result", "runs"), [
    (True, "SUCCESS", None, 0),           # the check says it landed: done, not run again
    (False, "SUCCESS", "posted 2", 1),    # it did not: run once, now
    (None, "FAILURE", None, 0),           # it cannot tell: needs_operator
    ("no check", "FAILURE", None, 0),     # no check: needs_operator
])
def test_redis_an_earlier_deliverys_unanswered_write_is_settled_by_the_check(
    write_keys: WriteKeys, landed: Any, state: str, result: Any, runs: int
) -> None:
    eager, effects, checks = Eager(Policy()), [], []

    def check(ctx: StepContext, route: Route) -> Any:
        checks.append((ctx.idempotency_key, ctx.args["args"], route.model))
        return landed

    assert write_keys.begin("order-2", "a-worker-that-died").state == "fresh"
    task = _writer(eager, write_keys, effects, None if landed == "no check" else check)
    outcome = task.apply(args=(2,), task_id="order-2")
    assert outcome.state == state
    assert len(effects) == runs
    if state == "SUCCESS":
        assert outcome.result == result
        assert checks == [("order-2", [2], ROUTE.model)]
        assert write_keys.begin("order-2", "later").state == "done"
    else:
        assert isinstance(outcome.result, TaskGaveUp)
        assert outcome.result.status == "needs_operator"
        assert "unknown_outcome" in outcome.result.reason
        assert write_keys.begin("order-2", "later").state == "in_doubt"  # left for an operator


@pytest.mark.redis
def test_redis_a_refused_write_clears_its_mark(write_keys: WriteKeys) -> None:
    eager = Eager(Policy.from_dict({"pause_limit_secs": 5, "max_attempts": 2}))

    def post(route: Route, *, idempotency_key: str) -> str:
        raise _status_error(429, **{"retry-after": "60"})

    result = eager.task(post, idempotent=False, write_keys=write_keys).apply(task_id="order-3")
    assert [type(v) for _, v in eager.verdicts] == [RetryLater, RetryLater, GiveUp]
    assert result.state == "FAILURE"
    assert write_keys.begin("order-3", "next").state == "fresh"  # the provider said no


# --- an engine that is not running --------------------------------------------------------


def test_an_unreachable_broker_is_one_error_naming_what_to_start() -> None:
    port = free_port()
    for url, server in ((f"amqp://guest:secret@127.0.0.1:{port}//", "RabbitMQ"),
                        (f"redis://127.0.0.1:{port}/0", "Redis")):
        app = Celery("down", broker=url, backend="cache+memory://")

        def ask(route: Route) -> str:
            return "x"

        task = rateloop_task(app, route=ROUTE)(ask)
        for attempt in (functools.partial(check_engine, app, timeout=1.0), task.delay):
            started = time.monotonic()
            with pytest.raises(BrokerUnreachable, match=f"start {server}") as caught:
                attempt()
            assert time.monotonic() - started < 5.0
            assert f"127.0.0.1:{port}" in str(caught.value) and "secret" not in str(caught.value)


@pytest.mark.redis
def test_redis_an_unreachable_result_backend_is_named(redis_url: str) -> None:
    port = free_port()
    app = Celery("down", broker=redis_url, backend=f"redis://127.0.0.1:{port}/0")
    with pytest.raises(BrokerUnreachable, match=f"result backend .*:{port}.*start Redis"):
        check_engine(app, timeout=1.0)


# --- real workers -------------------------------------------------------------------------


@pytest.fixture
def engine_env(redis_url: str, redis_prefix: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {"RATELOOP_CELERY_PREFIX": redis_prefix, "RATELOOP_CELERY_REDIS": redis_url,
           "RATELOOP_CELERY_BACKEND": redis_url, "RATELOOP_CELERY_BROKER": redis_url,
           "RATELOOP_CELERY_QUEUE": f"rateloop-test-{uuid.uuid4().hex[:8]}"}
    yield env


@pytest.fixture
def restore_env() -> Iterator[None]:
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.redis
@pytest.mark.usefixtures("restore_env")
def test_redis_real_workers_share_admission_and_hand_long_waits_to_celery(
    engine_env: dict[str, str], tmp_path: Path, redis_url: str
) -> None:
    # One request every 2 s, a pause limit of 1 s: most calls must wait longer than the
    # pause limit, so they go back to the broker as countdowns instead of sleeping.
    fake = FakeProvider(profile="openai", rpm=30, burst_seconds=2)
    with FakeProviderServer(fake) as server:
        env = {**engine_env, "RATELOOP_CELERY_PROVIDER": server.url + "/v1"}
        capp = client_app(env)
        workers = Workers(tmp_path, env)
        try:
            workers.start()
            workers.start()
            results = [capp.ask.apply_async(args=(i,)) for i in range(4)]
            refused = capp.invalid.apply_async()
            values = [r.get(timeout=60) for r in results]
            refused.get(timeout=30, propagate=False)
        finally:
            workers.stop()
        assert values == [v for v in values if isinstance(v, str)] and len(values) == 4
        assert fake.stats.served == 4
        # Admission paced most calls (a 429 comes from a booked start at the bucket's edge).
        assert fake.stats.refused < fake.stats.served, fake.stats.as_dict()
        assert refused.state == "FAILURE" and isinstance(refused.result, TaskGaveUp)
        assert refused.result.status == "invalid"
        handed_back = 0
        for r in results:
            seen = deliveries(redis_url, env["RATELOOP_CELERY_PREFIX"], r.id)
            assert seen[-1]["verdict"] == "Finish"
            for d in seen:  # nothing slept inside a task beyond the pause limit
                assert d["waited"] <= 1.0 + 0.05, seen
            for before, after in itertools.pairwise(seen):
                assert before["verdict"] == "RetryLater" and before["delay"] > 1.0
                assert after["at"] >= before["at"] + before["delay"] - 0.1  # Celery held it
                handed_back += 1
        assert handed_back >= 2, workers.logs()


@pytest.mark.redis
@pytest.mark.rabbitmq
@pytest.mark.usefixtures("restore_env")
def test_rabbitmq_sigkilled_workers_lose_no_task_and_repeat_no_keyed_write(
    engine_env: dict[str, str], tmp_path: Path, redis_url: str, rabbitmq_url: str
) -> None:
    env = {**engine_env, "RATELOOP_CELERY_BROKER": rabbitmq_url}
    prefix = env["RATELOOP_CELERY_PREFIX"]
    capp = client_app(env)
    workers = Workers(tmp_path, env)
    die = {3: "after", 7: "before", 11: "after", 16: "after"}
    n = 24
    try:
        for _ in range(2):
            workers.start(concurrency=2)
        ids = [f"post-{uuid.uuid4().hex[:8]}-{i}" for i in range(n)]
        results = [capp.post.apply_async(args=(i, die.get(i)), task_id=ids[i])
                   for i in range(n)]
        # A supervisor: a worker that died (it killed itself) is replaced, as a real one is.
        stop = time.monotonic() + 60
        restarts = 0
        while not all(r.ready() for r in results) and time.monotonic() < stop:
            for proc in list(workers.procs):
                if proc.poll() is not None and proc.returncode == -signal.SIGKILL:
                    workers.procs.remove(proc)
                    workers.start(concurrency=2)
                    restarts += 1
            threading.Event().wait(0.2)
        states = [r.state for r in results]
        values = [r.result for r in results]
    finally:
        workers.stop()
        with capp.app.connection_for_write() as conn:  # the test's queue, gone
            conn.default_channel.queue_delete(env["RATELOOP_CELERY_QUEUE"])
            conn.default_channel.exchange_delete(env["RATELOOP_CELERY_QUEUE"])
    assert states == ["SUCCESS"] * n, workers.logs()  # no task lost
    assert restarts == len(die)
    client = redis.Redis.from_url(redis_url)
    try:
        effects = {i: client.llen(prefix + "effects:" + ids[i]) for i in range(n)}
        checks = {i: [int(x) for x in client.lrange(prefix + "checks:" + ids[i], 0, -1)]
                  for i in range(n)}
    finally:
        client.close()
    assert effects == dict.fromkeys(range(n), 1)  # every write landed exactly once
    for i in range(n):
        # A redelivery asks the outcome check: 0 (not applied: it runs the write) until the
        # write lands, then 1 (applied: done without running it).  A delivery may also die as
        # a bystander of another task's kill (two slots per worker), so a task can be checked
        # more than once; the value is the write's only when the last delivery ran it.
        seen = checks[i]
        assert seen == sorted(seen), (i, seen)  # once applied, it stays applied
        assert values[i] == (None if seen and seen[-1] == 1 else f"posted {i}"), (i, seen)
        if die.get(i) == "after":  # landed, then killed: the check said so, not run again
            assert seen and seen[0] == 1, (i, seen)
        elif die.get(i) == "before":  # killed before it landed: checked, then run once
            assert seen and seen[0] == 0, (i, seen)


def test_a_worker_whose_broker_is_down_exits_with_one_message(tmp_path: Path) -> None:
    env = {"RATELOOP_CELERY_BROKER": f"amqp://guest:guest@127.0.0.1:{free_port()}//",
           "RATELOOP_CELERY_QUEUE": "rateloop-test-down"}
    workers = Workers(tmp_path, env)
    started = time.monotonic()
    proc = workers.start()
    try:
        proc.wait(30)
    finally:
        workers.stop()
    assert time.monotonic() - started < 30
    log = workers.logs()
    assert proc.returncode != 0
    assert log.count("cannot be reached") == 1 and "start RabbitMQ" in log, log


@pytest.mark.redis
def test_redis_a_write_another_delivery_keeps_taking_over_is_not_run(
    write_keys: WriteKeys
) -> None:
    eager, effects = Eager(Policy()), []
    holder = ["a-worker-that-died"]

    def check(ctx: StepContext, route: Route) -> bool:
        # While this delivery asks, a duplicate delivery takes the mark over, every time.
        taken = f"duplicate-{len(holder)}"
        assert write_keys.take_over(ctx.idempotency_key, holder[-1], taken)
        holder.append(taken)
        return False

    write_keys.begin("order-4", holder[0])
    result = _writer(eager, write_keys, effects, check).apply(args=(4,), task_id="order-4")
    assert result.state == "FAILURE" and result.result.status == "needs_operator"
    assert "at the same time" in result.result.reason
    assert effects == []


def test_a_retry_that_cannot_be_published_is_requeued_not_dropped(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery.exceptions import Reject

    eager = Eager(Policy.from_dict({"pause_limit_secs": 5}))

    def ask(route: Route) -> str:
        raise _status_error(429, **{"retry-after": "60"})

    task = eager.task(ask)

    def unpublishable(**options: Any) -> Any:
        raise Reject("the broker is down", requeue=False)  # what Celery's retry raises then

    monkeypatch.setattr(task, "retry", unpublishable)
    result = task.apply()
    assert result.state == "REJECTED"
    assert isinstance(result.result, Reject) and result.result.requeue is True
