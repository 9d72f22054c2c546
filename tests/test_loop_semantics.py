"""The loop's rules as users meet them (issue 10), each on both twins, on a fake clock.

1. the pause limit bounds every sleep; 3. soft exhaustion is never a silent None;
4. fallbacks work with the default policy; 5. the original error is kept, and the
time waited; 6. honest deadlines (the jitter is clamped, the server minimum kept).
Rule 2 (SDK retries count) runs against a real HTTP server in test_integrations_sdk.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import httpx
import pytest

from rateloop.errors import RateLimitExhausted
from rateloop.loop import AsyncRateLoop, RateLoop
from rateloop.outcome import Outcome, Status
from rateloop.policy import Policy
from rateloop.route import Route
from rateloop.testing import FakeClock, FaultScript

OPENAI = "https://api.openai.com/v1/chat/completions"
A = Route(provider="openai", model="a")
B = Route(provider="anthropic", model="b")
OK = httpx.Response(200, json={"usage": {"prompt_tokens": 1}}, request=httpx.Request("GET", OPENAI))


def throttle(retry_after: str | None = None, status: int = 429) -> httpx.HTTPStatusError:
    headers = {"retry-after": retry_after} if retry_after is not None else {}
    body = {"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}}
    if status == 400:
        body = {"error": {"message": "bad request", "code": "invalid_request_error"}}
    request = httpx.Request("POST", OPENAI)
    resp = httpx.Response(status, headers=headers, json=body, request=request)
    return httpx.HTTPStatusError(f"HTTP {status}", request=request, response=resp)


def policy(**data: Any) -> Policy:
    data.setdefault("backoff", {}).setdefault("jitter", "none")
    return Policy.from_dict(data)


Runner = Callable[..., Outcome]


@pytest.fixture(params=["sync", "async"])
def twin(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def run(twin: str, clock: FakeClock) -> Runner:
    def runner(fn: Any, *, policy: Policy, rng: float = 0.5, **kw: Any) -> Outcome:
        if twin == "sync":
            return RateLoop(policy, clock=clock, sinks=[], rng=lambda: rng).call(fn, **kw)
        loop = AsyncRateLoop(policy, clock=clock, sinks=[], rng=lambda: rng)
        return asyncio.run(loop.call(fn, **kw))

    return runner


# --- 1. the pause limit bounds every sleep ------------------------------------------------


def test_no_backoff_sleep_is_longer_than_the_pause_limit(run: Runner, clock: FakeClock) -> None:
    fn = FaultScript([throttle()])
    out = run(fn, route=A, policy=policy(max_attempts=5, pause_limit_secs=10))
    assert out.status is Status.FAILED_RETRY_EXHAUSTED
    assert clock.sleeps == [5.0, 10.0, 10.0, 10.0]  # 20 and 40 capped; never 585


def test_a_huge_initial_delay_is_capped_at_the_pause_limit(run: Runner, clock: FakeClock) -> None:
    fn = FaultScript([throttle(), OK])
    big = {"initial_delay_secs": 5000, "max_delay_secs": 86400, "jitter": "none"}
    out = run(fn, route=A, policy=policy(pause_limit_secs=10, backoff=big))
    assert out.status is Status.COMPLETED
    assert clock.sleeps == [10.0]  # not one sleep of 86 400 s


# --- 3. soft exhaustion through wrap ------------------------------------------------------


def test_wrap_under_soft_exhaustion_raises_instead_of_returning_none(
    twin: str, clock: FakeClock
) -> None:
    soft = policy(max_attempts=2, on_exhausted="soft")
    fn = FaultScript([throttle()])
    if twin == "sync":
        loop = RateLoop(soft, clock=clock, sinks=[])

        @loop.wrap(route=A)
        def ask(route: Route) -> object:
            return fn(route)

        with pytest.raises(RateLimitExhausted) as info:
            ask()
        # call_or_raise keeps the documented soft behaviour: an explicit Outcome, never None.
        assert loop.call_or_raise(fn, route=A).status is Status.FAILED_RETRY_EXHAUSTED
    else:
        aloop = AsyncRateLoop(soft, clock=clock, sinks=[])

        @aloop.wrap(route=A)
        async def aask(route: Route) -> object:
            return fn(route)

        with pytest.raises(RateLimitExhausted) as info:
            asyncio.run(aask())
        out = asyncio.run(aloop.call_or_raise(fn, route=A))
        assert out.status is Status.FAILED_RETRY_EXHAUSTED
    assert info.value.outcome.status is Status.FAILED_RETRY_EXHAUSTED


# --- 4. fallbacks with the default policy -------------------------------------------------


def test_default_policy_moves_to_the_fallback_after_a_bounded_number_of_attempts(
    run: Runner,
) -> None:
    fn = FaultScript({"a": [throttle()], "b": [OK]})
    out = run(fn, route=A, fallbacks=[B], policy=Policy())  # attempts_per_route unset
    assert out.status is Status.DEGRADED
    assert fn.models == ["a"] * 5 + ["b"]  # one try and 4 retries per route (crab'd's default)


def test_a_small_budget_still_reaches_the_fallback_and_the_last_route_keeps_the_rest(
    run: Runner,
) -> None:
    c = Route(provider="mistral", model="c")
    fn = FaultScript([throttle()])
    out = run(fn, route=A, fallbacks=[B, c], policy=policy(max_attempts=8))
    assert out.status is Status.FAILED_RETRY_EXHAUSTED
    assert fn.models == ["a"] * 3 + ["b"] * 3 + ["c"] * 2  # ceil(8 / 3) per route, the rest last


def test_the_default_bound_never_gives_up_early_when_no_fallback_is_eligible(run: Runner) -> None:
    fn = FaultScript([throttle()])
    out = run(fn, route=A, fallbacks=[B], data_class="pii", policy=policy(max_attempts=8))
    assert out.status is Status.FAILED_RETRY_EXHAUSTED
    assert fn.models == ["a"] * 8  # b is skipped (no 'pii' tag): a keeps every attempt


def test_a_lone_route_still_gets_every_attempt(run: Runner) -> None:
    fn = FaultScript([throttle()])
    out = run(fn, route=A, policy=policy(max_attempts=8))
    assert out.status is Status.FAILED_RETRY_EXHAUSTED
    assert len(fn.calls) == 8


def test_a_primary_wait_beyond_the_pause_limit_falls_back_at_once(
    run: Runner, clock: FakeClock
) -> None:
    fn = FaultScript({"a": [throttle("7200")], "b": [OK]})
    out = run(fn, route=A, fallbacks=[B], policy=Policy())
    assert out.status is Status.DEGRADED
    assert fn.models == ["a", "b"]
    assert clock.sleeps == []  # no wait: the fallback has not refused anything
    assert out.limited_route == A


def test_a_primary_wait_past_the_deadline_falls_back_at_once(run: Runner) -> None:
    fn = FaultScript({"a": [throttle("60")], "b": [OK]})
    out = run(fn, route=A, fallbacks=[B], policy=policy(), deadline=30)
    assert out.status is Status.DEGRADED and fn.models == ["a", "b"]


def test_a_skipped_fallback_is_named_in_the_reason(run: Runner) -> None:
    fn = FaultScript({"a": [throttle("7200")], "b": [OK]})
    out = run(fn, route=A, fallbacks=[B], data_class="pii", policy=policy())
    assert out.status is Status.WAITING_FOR_CAPACITY
    assert "skipped anthropic:b (data class 'pii' is not allowed on this route)" in out.reason


def test_the_example_policy_falls_back_as_the_readme_says(run: Runner) -> None:
    example = Policy.from_toml("examples/policy.toml")
    primary = Route(provider="openai", model="gpt-5", project="proj-1")
    backup = Route(provider="anthropic", model="claude-sonnet-4-5")
    fn = FaultScript({"gpt-5": [throttle("7200")], "claude-sonnet-4-5": ["done"]})
    out = run(fn, route=primary, fallbacks=[backup], policy=example)
    assert out.status is Status.DEGRADED and out.value == "done"


# --- 5. the original error and the time waited ---------------------------------------------


def test_the_outcome_keeps_the_last_error_and_the_time_waited(
    run: Runner, clock: FakeClock
) -> None:
    first, last = throttle("3"), throttle("4")
    out = run(FaultScript([first, last]), route=A, policy=policy(max_attempts=2))
    assert out.status is Status.FAILED_RETRY_EXHAUSTED
    assert out.error is last
    assert out.waited_secs == sum(clock.sleeps) > 0
    done = run(FaultScript([first, OK]), route=A, policy=policy())
    assert done.ok and done.error is first  # the call recovered; the last error is still told


def test_call_or_raise_chains_the_original_error(twin: str, clock: FakeClock) -> None:
    err = throttle()
    fn = FaultScript([err])
    if twin == "sync":
        with pytest.raises(RateLimitExhausted) as info:
            RateLoop(policy(max_attempts=2), clock=clock, sinks=[]).call_or_raise(fn, route=A)
    else:
        loop = AsyncRateLoop(policy(max_attempts=2), clock=clock, sinks=[])
        with pytest.raises(RateLimitExhausted) as info:
            asyncio.run(loop.call_or_raise(fn, route=A))
    assert info.value.__cause__ is err
    assert info.value.outcome.error is err


def test_an_invalid_request_reraises_the_providers_own_exception(
    twin: str, clock: FakeClock
) -> None:
    err = throttle(status=400)
    fn = FaultScript([err])
    if twin == "sync":
        loop = RateLoop(Policy(), clock=clock, sinks=[])
        ask = loop.wrap(route=A)(fn)
        with pytest.raises(httpx.HTTPStatusError) as info:
            ask()
        with pytest.raises(httpx.HTTPStatusError):
            loop.call_or_raise(fn, route=A)
    else:
        aloop = AsyncRateLoop(Policy(), clock=clock, sinks=[])

        async def call(route: Route) -> object:
            return fn(route)

        with pytest.raises(httpx.HTTPStatusError) as info:
            asyncio.run(aloop.wrap(route=A)(call)())
    assert info.value is err


# --- 6. honest deadlines ------------------------------------------------------------------


@pytest.mark.parametrize("rng", [0.0, 0.5, 0.999])
def test_a_server_minimum_that_fits_the_deadline_is_waited_for(
    run: Runner, clock: FakeClock, rng: float
) -> None:
    fn = FaultScript([throttle("8"), OK])
    out = run(fn, route=A, policy=Policy(), deadline=9.5, rng=rng)  # equal jitter: 8..10.5
    assert out.status is Status.COMPLETED, out.reason
    (wait,) = clock.sleeps
    assert 8.0 <= wait < 9.5


def test_a_server_minimum_past_the_deadline_still_stops(run: Runner, clock: FakeClock) -> None:
    out = run(FaultScript([throttle("10")]), route=A, policy=Policy(), deadline=9.5)
    assert out.status is Status.WAITING_FOR_CAPACITY
    assert out.retry_at == clock.now() + timedelta(seconds=10)
    assert clock.sleeps == []
