"""Separate bounds for 429s and for network errors / 5xx / overloads (issue 14).

``max_error_attempts`` set: a refusal of an error kind counts against it alone,
any other refusal against ``max_attempts`` alone.  Unset: one shared count (the
plain loop's behaviour before the split).  Sans-IO budget first, then both twins
of the loop on a fake clock.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from rateloop.errors import ConfigError
from rateloop.loop import AsyncRateLoop, RateLoop
from rateloop.outcome import Outcome, Status
from rateloop.policy import Policy
from rateloop.route import Route
from rateloop.signal import Kind
from rateloop.testing import FakeClock, FaultScript
from rateloop.timing.budget import ERROR_KINDS, CallBudget, RunBudget

A = Route(provider="openai", model="a")
URL = "https://api.openai.com/v1/chat/completions"


def _error(status: int, body: Any = None) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", URL)
    resp = httpx.Response(status, json=body or {"error": {"message": "x"}}, request=request)
    return httpx.HTTPStatusError(f"HTTP {status}", request=request, response=resp)


def _429() -> httpx.HTTPStatusError:
    return _error(429, {"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}})


OK = httpx.Response(200, json={"id": "x"}, request=httpx.Request("POST", URL))


def _policy(**keys: Any) -> Policy:
    return Policy.from_dict({"backoff": {"jitter": "none"}, **keys})


# --- sans-IO -----------------------------------------------------------------------------


def _spend(budget: CallBudget, kind: Kind, now: float = 0.0) -> None:
    assert budget.record_attempt()
    budget.record_refusal(now, kind)


def test_error_kinds_are_network_5xx_and_overload() -> None:
    assert {Kind.NETWORK, Kind.SERVER_ERROR, Kind.OVERLOAD} == ERROR_KINDS


def test_errors_do_not_spend_the_429_count_when_separate() -> None:
    budget = CallBudget(max_attempts=2, recovery_budget_secs=600, started_at=0,
                        max_error_attempts=3)
    for _ in range(2):
        _spend(budget, Kind.SERVER_ERROR)
        assert budget.can_retry(Kind.SERVER_ERROR) and budget.can_attempt()
    _spend(budget, Kind.NETWORK)
    assert not budget.can_retry(Kind.NETWORK)  # 3 of 3 errors
    assert budget.can_attempt()  # the 429 count is untouched
    _spend(budget, Kind.TEMPORARY)
    assert budget.can_retry(Kind.TEMPORARY)  # 1 of 2
    _spend(budget, Kind.TEMPORARY)
    assert not budget.can_retry(Kind.TEMPORARY) and not budget.can_attempt()
    assert (budget.attempts, budget.error_attempts) == (5, 3)
    assert "error_attempts=3/3" in repr(budget)


def test_unset_keeps_one_shared_count() -> None:
    budget = CallBudget(max_attempts=3, recovery_budget_secs=600, started_at=0)
    _spend(budget, Kind.SERVER_ERROR)
    _spend(budget, Kind.SERVER_ERROR)
    assert budget.can_retry(Kind.TEMPORARY)
    _spend(budget, Kind.TEMPORARY)
    assert not budget.can_retry(Kind.SERVER_ERROR) and not budget.can_attempt()


def test_the_run_budget_bounds_errors_too() -> None:
    run = RunBudget(2)
    budget = CallBudget(max_attempts=5, recovery_budget_secs=600, started_at=0, run=run,
                        max_error_attempts=5)
    _spend(budget, Kind.NETWORK)
    _spend(budget, Kind.NETWORK)
    assert not budget.can_retry(Kind.NETWORK)


def test_reset_step_clears_the_error_count() -> None:
    budget = CallBudget(max_attempts=5, recovery_budget_secs=600, started_at=0,
                        max_error_attempts=1)
    _spend(budget, Kind.OVERLOAD)
    budget.reset_step()
    assert budget.error_attempts == 0 and budget.can_retry(Kind.OVERLOAD)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3"])
def test_call_budget_rejects_a_bad_error_bound(bad: object) -> None:
    with pytest.raises(ValueError, match="max_error_attempts must be an int >= 1"):
        CallBudget(max_attempts=1, recovery_budget_secs=1, started_at=0,
                   max_error_attempts=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, 1001, "five", True])
def test_the_policy_key_is_validated_at_load(bad: object) -> None:
    with pytest.raises(ConfigError) as caught:
        Policy.from_dict({"max_error_attempts": bad})
    text = str(caught.value)
    assert "max_error_attempts" in text and "1 to 1000" in text


def test_enabled_is_a_boolean_key() -> None:
    assert Policy().enabled is True
    assert Policy.from_dict({"enabled": False}).enabled is False
    with pytest.raises(ConfigError, match="enabled"):
        Policy.from_dict({"enabled": "nope"})
    assert Policy.from_dict({"max_error_attempts": 4}).budget(started_at=0).max_error_attempts == 4


# --- both twins ---------------------------------------------------------------------------


@pytest.fixture(params=["sync", "async"])
def twin(request: pytest.FixtureRequest) -> Any:
    def runner(fn: Any, policy: Policy) -> tuple[Outcome, FakeClock]:
        clock = FakeClock()
        if request.param == "sync":
            return RateLoop(policy, clock=clock, rng=lambda: 0.5).call(fn, route=A), clock
        loop = AsyncRateLoop(policy, clock=clock, rng=lambda: 0.5)
        return asyncio.run(loop.call(fn, route=A)), clock

    return runner


def test_503s_do_not_spend_the_429_budget(twin: Any) -> None:
    # 4 errors and 3 throttles before the success: 8 attempts under max_attempts=4.
    script = [_error(503)] * 4 + [_429()] * 3 + [OK]
    fn = FaultScript(script)
    out, _ = twin(fn, _policy(max_attempts=4, max_error_attempts=5))
    assert out.status is Status.COMPLETED
    assert len(fn.calls) == 8


def test_the_shared_count_still_stops_that_call_when_unset(twin: Any) -> None:
    fn = FaultScript([_error(503)] * 4 + [_429()] * 3 + [OK])
    out, _ = twin(fn, _policy(max_attempts=4))
    assert out.status is Status.FAILED_RETRY_EXHAUSTED
    assert len(fn.calls) == 4


def test_errors_stop_at_their_own_bound(twin: Any) -> None:
    fn = FaultScript([_error(500)] * 10 + [OK])
    out, _ = twin(fn, _policy(max_error_attempts=3))
    assert out.status is Status.FAILED_RETRY_EXHAUSTED
    assert len(fn.calls) == 3
    assert "max_error_attempts 3" in out.reason


def test_max_attempts_1_turns_off_only_429_retries(twin: Any) -> None:
    fn = FaultScript([_error(503), _error(503), OK])
    out, _ = twin(fn, _policy(max_attempts=1, max_error_attempts=5))
    assert out.status is Status.COMPLETED and len(fn.calls) == 3
    fn = FaultScript([_429(), OK])
    out, _ = twin(fn, _policy(max_attempts=1, max_error_attempts=5))
    assert out.status is Status.FAILED_RETRY_EXHAUSTED and len(fn.calls) == 1


# --- enabled = false: the loop steps aside ---------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("first", ["429", "503"])
def test_enabled_false_runs_the_call_exactly_once(mode: str, first: str) -> None:
    from rateloop.admission import Limiter, LimitSpec

    clock = FakeClock()
    limiter = Limiter(limits={A.scope: LimitSpec(requests_per_minute=60)}, clock=clock)
    limiter.pause(A.provider_scope, 600.0, "another worker")  # admission would wait 10 min
    fn = FaultScript([_429() if first == "429" else _error(503), OK])
    off = _policy(enabled=False, max_error_attempts=5)
    if mode == "sync":
        out = RateLoop(off, limiter=limiter, clock=clock).call(fn, route=A)
    else:
        aloop = AsyncRateLoop(off, limiter=limiter, clock=clock)
        out = asyncio.run(aloop.call(fn, route=A))
    assert len(fn.calls) == 1 and clock.sleeps == []
    assert out.status is Status.FAILED_RETRY_EXHAUSTED and out.attempts.loop == 1
    ok = FaultScript([OK])
    assert RateLoop(off, limiter=limiter, clock=clock).call(ok, route=A).ok
    assert len(ok.calls) == 1
