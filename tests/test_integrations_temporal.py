"""rateloop inside a Temporal activity, on virtual time: the mapping, the budget, the waits.

These run the activity helpers in ``temporalio.testing.ActivityEnvironment`` (a real activity
context: heartbeats, info, cancellation, no server) on a ``FakeClock``; the same paths against
a real dev server are in test_integrations_temporal_server.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest

pytest.importorskip("temporalio")

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory, CancelledError
from temporalio.testing import ActivityEnvironment

from rateloop import AsyncRateLoop, Cost, Policy, RateLoop, Route
from rateloop.admission import Limiter, LimitSpec
from rateloop.integrations._engine import RetryLater
from rateloop.integrations.temporal import (
    ERROR_TYPES,
    ActivityReport,
    HeartbeatClock,
    Marked,
    RateLoopInterceptor,
    TemporalUnavailable,
    aactivity_call,
    activity_call,
    connect,
    error_type,
    rate_limited,
    retry_policy,
)
from rateloop.testing import FakeClock
from rateloop.testing.temporal import free_port

ROUTE = Route(provider="openai", model="gpt-4o-mini")
FALLBACK = Route(provider="openai", model="gpt-4o")


def refusal(status: int, headers: dict[str, str] | None = None, body: Any = None
            ) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "https://api.openai.com/v1/chat/completions")
    response = httpx.Response(status, headers=headers or {}, json=body or {}, request=request)
    return httpx.HTTPStatusError(f"status {status}", request=request, response=response)


THROTTLE = {"retry-after": "2"}
FAR = {"retry-after": "30"}


class Script:
    """The provider's answers in order: an exception is raised, anything else returned."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.calls: list[Route] = []

    def __call__(self, route: Route, **_: Any) -> Any:
        self.calls.append(route)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer


@pytest.fixture
def env(clock: FakeClock) -> Iterator[ActivityEnvironment]:
    e = ActivityEnvironment()
    # The activity started now on the fake clock and may run 10 minutes.
    e.info = dataclasses.replace(
        e.info, started_time=clock.now(), scheduled_time=clock.now(),
        current_attempt_scheduled_time=clock.now(),
        start_to_close_timeout=timedelta(minutes=10), schedule_to_close_timeout=None,
    )
    e.beats: list[Any] = []  # type: ignore[attr-defined]
    e.on_heartbeat = lambda *details: e.beats.append(details)  # type: ignore[attr-defined]
    yield e


def sync_loop(clock: FakeClock, **policy: Any) -> RateLoop:
    return RateLoop(Policy.from_dict({"pause_limit_secs": 5, **policy}), clock=clock, sinks=[])


def run(env: ActivityEnvironment, fn: Callable[..., Any], *args: Any) -> Any:
    result = env.run(fn, *args)
    return asyncio.run(result) if inspect.isawaitable(result) else result


# --- the mapping -------------------------------------------------------------------------


def test_a_wait_beyond_the_pause_limit_goes_back_to_the_server(
        env: ActivityEnvironment, clock: FakeClock) -> None:
    provider = Script(refusal(429, FAR))
    reports: list[ActivityReport] = []
    with pytest.raises(ApplicationError) as caught:
        run(env, lambda: activity_call(sync_loop(clock), provider, route=ROUTE,
                                       on_report=reports.append))
    err = caught.value
    assert not err.non_retryable
    assert err.type == "rateloop.waiting_for_capacity"
    assert err.next_retry_delay == timedelta(seconds=30)
    assert err.category is ApplicationErrorCategory.BENIGN  # an expected wait, not logged loud
    assert err.details[0]["status"] == "waiting_for_capacity"
    assert err.details[0]["scope"] == ROUTE.scope
    assert clock.sleeps == [] and len(provider.calls) == 1  # nothing slept inside
    assert isinstance(reports[0].verdict, RetryLater) and reports[0].asleep_secs == 0.0


def test_a_short_wait_is_slept_inside_with_heartbeats(
        env: ActivityEnvironment, clock: FakeClock) -> None:
    provider = Script(refusal(429, THROTTLE), "hello")
    reports: list[ActivityReport] = []
    value = run(env, lambda: activity_call(sync_loop(clock), provider, route=ROUTE,
                                           on_report=reports.append))
    assert value == "hello" and len(provider.calls) == 2
    assert sum(clock.sleeps) >= 2.0
    assert reports[0].asleep_secs == pytest.approx(sum(clock.sleeps))
    # A heartbeat before each slept chunk carries the attempts spent so far, and one at the end.
    assert env.beats[0] == ({"rateloop_attempts": 1},)  # type: ignore[attr-defined]
    assert env.beats[-1] == ({"rateloop_attempts": 2},)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (refusal(400, body={"error": {"message": "bad", "type": "invalid_request_error"}}),
         "invalid"),
        (refusal(429, body={"error": {"message": "You exceeded your current quota",
                                      "type": "insufficient_quota",
                                      "code": "insufficient_quota"}}), "needs_operator"),
    ],
)
def test_terminal_outcomes_are_non_retryable_with_the_reason_and_the_cause(
        env: ActivityEnvironment, clock: FakeClock, error: Exception, status: str) -> None:
    with pytest.raises(ApplicationError) as caught:
        run(env, lambda: activity_call(sync_loop(clock), Script(error), route=ROUTE))
    err = caught.value
    assert err.non_retryable and err.type == error_type(status) == f"rateloop.{status}"
    assert err.__cause__ is error
    assert err.message and "bad" not in err.message  # the reason is rateloop's, no echo


def test_the_engine_attempts_and_the_heartbeated_count_spend_the_budget(
        env: ActivityEnvironment, clock: FakeClock) -> None:
    loop = sync_loop(clock, max_attempts=4)
    # Attempt 3, but the previous attempts heartbeated 3 provider requests: one is left.
    env.info = dataclasses.replace(env.info, attempt=3, heartbeat_details=[
        {"rateloop_attempts": 3}])
    provider = Script(refusal(429, THROTTLE))
    with pytest.raises(ApplicationError) as caught:
        run(env, lambda: activity_call(loop, provider, route=ROUTE))
    assert len(provider.calls) == 1
    assert caught.value.type == "rateloop.failed_retry_exhausted"
    assert caught.value.non_retryable
    # Without a heartbeated count, attempt 5 alone spends 4: no call at all.
    env.info = dataclasses.replace(env.info, attempt=5, heartbeat_details=[])
    with pytest.raises(ApplicationError) as again:
        run(env, lambda: activity_call(loop, provider, route=ROUTE))
    assert len(provider.calls) == 1 and again.value.non_retryable


def test_a_wait_that_would_outlive_the_activity_goes_back_to_the_server(
        env: ActivityEnvironment, clock: FakeClock) -> None:
    env.info = dataclasses.replace(env.info, start_to_close_timeout=timedelta(seconds=20))
    provider = Script(refusal(429, {"retry-after": "25"}), "late")
    loop = sync_loop(clock, pause_limit_secs=60)  # the pause limit alone would sleep 25 s
    with pytest.raises(ApplicationError) as caught:
        run(env, lambda: activity_call(loop, provider, route=ROUTE))
    assert clock.sleeps == [] and not caught.value.non_retryable
    assert caught.value.next_retry_delay == timedelta(seconds=25)


def test_degraded_is_the_result_marked(env: ActivityEnvironment, clock: FakeClock) -> None:
    provider = Script(refusal(429, {"retry-after": "3600"}), "from the fallback")
    reports: list[ActivityReport] = []
    marked = run(env, lambda: activity_call(
        sync_loop(clock), provider, route=ROUTE, fallbacks=[FALLBACK], marked=True,
        on_report=reports.append))
    assert isinstance(marked, Marked)
    assert (marked.value, marked.degraded, marked.model) == ("from the fallback", True, "gpt-4o")
    assert provider.calls == [ROUTE, FALLBACK]
    plain = run(env, lambda: activity_call(sync_loop(clock), Script("direct"), route=ROUTE,
                                           marked=True))
    assert (plain.value, plain.degraded) == ("direct", False)


def test_the_async_twin_maps_the_same(env: ActivityEnvironment, clock: FakeClock) -> None:
    loop = AsyncRateLoop(Policy.from_dict({"pause_limit_secs": 5}), clock=clock, sinks=[])

    async def body() -> Any:
        return await aactivity_call(loop, Script(refusal(429, THROTTLE), "ok"), route=ROUTE)

    assert run(env, body) == "ok" and sum(clock.sleeps) >= 2.0

    async def far() -> Any:
        return await aactivity_call(loop, Script(refusal(429, FAR)), route=ROUTE)

    with pytest.raises(ApplicationError) as caught:
        run(env, far)
    assert caught.value.next_retry_delay == timedelta(seconds=30)


def test_the_helpers_refuse_the_wrong_loop(clock: FakeClock) -> None:
    with pytest.raises(TypeError, match="activity_call takes a RateLoop"):
        activity_call(AsyncRateLoop(sinks=[]), Script("x"), route=ROUTE)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="aactivity_call takes an AsyncRateLoop"):
        asyncio.run(aactivity_call(RateLoop(sinks=[]), Script("x"),  # type: ignore[arg-type]
                                   route=ROUTE))


# --- the heartbeating clock ---------------------------------------------------------------


def test_the_clock_heartbeats_every_chunk_and_counts_the_sleep(
        env: ActivityEnvironment, clock: FakeClock) -> None:
    hb = HeartbeatClock(clock, every=3, details=lambda: {"n": 1})
    run(env, lambda: hb.sleep(10))
    assert clock.sleeps == [3, 3, 3, 1] and hb.asleep_secs == 10
    assert len(env.beats) == 4  # type: ignore[attr-defined]

    async def asleep() -> None:
        await hb.asleep(4)

    run(env, asleep)
    assert hb.asleep_secs == 14 and len(env.beats) == 6  # type: ignore[attr-defined]


def test_a_cancelled_sync_activity_stops_waiting(
        env: ActivityEnvironment, clock: FakeClock) -> None:
    hb = HeartbeatClock(clock, every=1, details=dict)

    def body() -> None:
        env.cancel()
        hb.sleep(5)

    with pytest.raises(CancelledError):
        run(env, body)
    assert clock.sleeps == []


def test_the_clock_needs_a_positive_interval(clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="every must be > 0 seconds, got 0"):
        HeartbeatClock(clock, every=0, details=dict)


# --- the decorator and the interceptor ----------------------------------------------------


def test_the_decorated_activity_is_seen_without_its_route(
        env: ActivityEnvironment, clock: FakeClock) -> None:
    @activity.defn
    @rate_limited(sync_loop(clock), route=ROUTE)
    def summarize(route: Route, text: str, n: int = 1) -> str:
        """Summarize."""
        return f"{route.model}:{text}:{n}"

    assert list(inspect.signature(summarize).parameters) == ["text", "n"]
    assert summarize.__annotations__ == {"text": "str", "n": "int", "return": "str"}
    assert summarize.__name__ == "summarize" and summarize.__doc__ == "Summarize."
    assert activity._Definition.from_callable(summarize).name == "summarize"  # type: ignore[union-attr]
    assert run(env, summarize, "doc", 2) == "gpt-4o-mini:doc:2"


def test_the_decorator_refuses_what_cannot_work(clock: FakeClock) -> None:
    with pytest.raises(TypeError, match="needs an AsyncRateLoop"):
        @rate_limited(sync_loop(clock), route=ROUTE)
        async def a(route: Route) -> None: ...
    with pytest.raises(TypeError, match="needs a RateLoop"):
        @rate_limited(AsyncRateLoop(sinks=[]), route=ROUTE)
        def b(route: Route) -> None: ...
    with pytest.raises(TypeError, match=r"needs fn\(route, \.\.\.\)"):
        @rate_limited(sync_loop(clock), route=ROUTE)
        def c(*, text: str) -> None: ...


def test_the_interceptor_refuses_bad_arguments() -> None:
    loop = AsyncRateLoop(sinks=[])
    with pytest.raises(TypeError, match="takes an AsyncRateLoop"):
        RateLoopInterceptor(RateLoop(sinks=[]), route_for=lambda t, a: None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="route_for must be"):
        RateLoopInterceptor(loop, route_for="gpt-4o")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="takes no fallbacks"):
        RateLoopInterceptor(loop, route_for=lambda t, a: None, fallbacks=[FALLBACK])


# --- the engine around it -----------------------------------------------------------------


def test_the_retry_policy_lets_rateloops_budget_end_first() -> None:
    rp = retry_policy(Policy.from_dict({"max_attempts": 7, "pause_limit_secs": 30}))
    assert rp.maximum_attempts == 7
    assert rp.maximum_interval == timedelta(seconds=30)
    assert retry_policy(maximum_attempts=0).maximum_attempts == 0
    assert set(ERROR_TYPES) == {
        "rateloop.waiting_for_reset", "rateloop.waiting_for_capacity", "rateloop.invalid",
        "rateloop.needs_operator", "rateloop.rejected", "rateloop.failed_retry_exhausted"}


def test_no_server_is_one_fast_error_naming_what_to_start() -> None:
    target = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(TemporalUnavailable, match="temporal server start-dev") as caught:
        asyncio.run(connect(target))
    assert time.monotonic() - start < 5
    assert target in str(caught.value)



def test_connect_names_a_bad_address() -> None:
    with pytest.raises(ValueError, match=r"target_host must be 'host:port'.*'localhost'"):
        asyncio.run(connect("localhost"))


# --- handing back to a booked start ------------------------------------------------------


def paced_loop(clock: FakeClock, **spec: Any) -> tuple[RateLoop, Limiter]:
    """A loop on a limiter of one request a second (no burst), pause limit 5 s."""
    limiter = Limiter(limits={ROUTE.scope: LimitSpec(requests_per_minute=60, burst=1 / 60,
                                                     **spec)}, clock=clock)
    return RateLoop(Policy.from_dict({"pause_limit_secs": 5}), limiter=limiter, clock=clock,
                    sinks=[]), limiter


def queue_others(limiter: Limiter, n: int) -> list[float]:
    """Other workers book ``n`` starts on the scope: the queue grows by n seconds."""
    return [limiter.try_reserve(ROUTE, Cost(), book_within=3600).starts_in  # type: ignore[union-attr]
            for _ in range(n)]


def test_a_call_queued_past_the_pause_limit_returns_to_its_booked_start(
        env: ActivityEnvironment, clock: FakeClock) -> None:
    loop, limiter = paced_loop(clock)
    queue_others(limiter, 10)  # starts 0..9 s are taken: 10 s of queue ahead
    provider = Script("hello")
    reports: list[ActivityReport] = []
    with pytest.raises(ApplicationError) as caught:
        run(env, lambda: activity_call(loop, provider, route=ROUTE, on_report=reports.append))
    # Booked the next free start (10 s) and handed back to 1 s before it, sleeping nothing.
    assert reports[0].booked_in == pytest.approx(10.0)
    assert caught.value.next_retry_delay == timedelta(seconds=9)
    assert clock.sleeps == [] and provider.calls == []
    beat = env.beats[-1][0]  # type: ignore[attr-defined]
    assert beat["rateloop_booking"]["scope"] == ROUTE.scope
    # Meanwhile the other workers queue 20 more calls behind it.
    assert queue_others(limiter, 20)[0] == pytest.approx(11.0)
    clock.advance(9.0)
    env.info = dataclasses.replace(env.info, attempt=2, heartbeat_details=[beat])
    reports.clear()
    assert run(env, lambda: activity_call(loop, provider, route=ROUTE,
                                          on_report=reports.append)) == "hello"
    # The returning attempt took its start: it slept the 1 s lead, not the 20 s queue.
    assert reports[0].took_booking and len(provider.calls) == 1
    assert sum(clock.sleeps) == pytest.approx(1.0, abs=0.01)
    # And its start stayed its own: the next free one is still after the 30 queued.
    assert queue_others(limiter, 1) == [pytest.approx(31.0 - 10.0, abs=0.01)]


def test_the_async_twin_books_and_takes_the_start_the_same(
        env: ActivityEnvironment, clock: FakeClock) -> None:
    limiter = paced_loop(clock)[1]
    loop = AsyncRateLoop(Policy.from_dict({"pause_limit_secs": 5}), limiter=limiter,
                         clock=clock, sinks=[])
    queue_others(limiter, 10)
    reports: list[ActivityReport] = []

    async def hello(route: Route) -> str:
        return "hello"

    async def body() -> Any:
        return await aactivity_call(loop, hello, route=ROUTE, on_report=reports.append)

    with pytest.raises(ApplicationError) as caught:
        run(env, body)
    assert caught.value.next_retry_delay == timedelta(seconds=9)
    queue_others(limiter, 20)
    clock.advance(9.0)
    env.info = dataclasses.replace(env.info, attempt=2,
                                   heartbeat_details=list(env.beats[-1]))  # type: ignore[attr-defined]
    assert run(env, body) == "hello"
    assert reports[-1].took_booking and sum(clock.sleeps) == pytest.approx(1.0, abs=0.01)


def test_a_start_too_late_or_too_early_is_not_taken(
        env: ActivityEnvironment, clock: FakeClock) -> None:
    loop, limiter = paced_loop(clock)
    queue_others(limiter, 10)
    with pytest.raises(ApplicationError):
        run(env, lambda: activity_call(loop, Script("hello"), route=ROUTE))
    beat = env.beats[-1][0]  # type: ignore[attr-defined]
    reports: list[ActivityReport] = []
    env.info = dataclasses.replace(env.info, attempt=2, heartbeat_details=[beat])
    # Back 7 s after the start (late by more than the pause limit): later starts are due,
    # so the attempt admits afresh (and queues behind them).
    clock.advance(17.0)
    queue_others(limiter, 10)
    with pytest.raises(ApplicationError):
        run(env, lambda: activity_call(loop, Script("hello"), route=ROUTE,
                                       on_report=reports.append))
    assert not reports[-1].took_booking
    # A start on another scope is another call's: not taken either.
    other = {"rateloop_booking": {**beat["rateloop_booking"], "scope": "openai:gpt-4o"}}
    env.info = dataclasses.replace(env.info, heartbeat_details=[other])
    with pytest.raises(ApplicationError):
        run(env, lambda: activity_call(loop, Script("hello"), route=ROUTE,
                                       on_report=reports.append))
    assert not reports[-1].took_booking


def test_a_scope_with_a_concurrency_limit_is_not_booked_ahead(
        env: ActivityEnvironment, clock: FakeClock) -> None:
    loop, limiter = paced_loop(clock, concurrency=50)
    queue_others(limiter, 10)
    reports: list[ActivityReport] = []
    with pytest.raises(ApplicationError) as caught:
        run(env, lambda: activity_call(loop, Script("hello"), route=ROUTE,
                                       on_report=reports.append))
    # A booking would hold its lease across the hand-back: plain hand-back, nothing carried.
    assert reports[0].booked_in is None
    assert "rateloop_booking" not in env.beats[-1][0]  # type: ignore[attr-defined]
    assert not caught.value.non_retryable


def test_a_refusal_since_the_booking_voids_the_carried_start(
        env: ActivityEnvironment, clock: FakeClock) -> None:
    loop, limiter = paced_loop(clock)
    queue_others(limiter, 10)
    provider = Script("hello")
    with pytest.raises(ApplicationError):
        run(env, lambda: activity_call(loop, provider, route=ROUTE))
    beat = env.beats[-1][0]  # type: ignore[attr-defined]
    clock.advance(9.0)
    # The provider refused a call meanwhile and asked for 30 s: the start at 10 s would be
    # refused too (and spend a slot there), so the returning attempt admits afresh.
    limiter.pause(ROUTE.scope, 30.0, "temporary")
    env.info = dataclasses.replace(env.info, attempt=2, heartbeat_details=[beat])
    reports: list[ActivityReport] = []
    with pytest.raises(ApplicationError) as caught:
        run(env, lambda: activity_call(loop, provider, route=ROUTE, on_report=reports.append))
    assert reports[0].took_booking and provider.calls == []
    assert caught.value.type == "rateloop.waiting_for_capacity"
