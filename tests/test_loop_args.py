"""Wrong use of the loop is a TypeError that says what to pass instead (issue 10)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from rateloop.admission import Limiter, LimitSpec
from rateloop.errors import LimitsWarning
from rateloop.loop import AsyncRateLoop, RateLoop
from rateloop.outcome.events import LoggingSink
from rateloop.route import Cost, Route
from rateloop.testing import FakeClock, FaultScript

A = Route(provider="openai", model="gpt-5")


@pytest.fixture(params=[RateLoop, AsyncRateLoop])
def twin(request: pytest.FixtureRequest) -> Any:
    return request.param


@pytest.mark.parametrize(
    ("args", "kwargs", "says"),
    [
        (("policy.toml",), {}, "RateLoop(Policy.from_file('policy.toml'))"),
        (({"max_attempts": 3},), {}, "Policy.from_dict"),
        ((), {"limiter": "memory://"}, "limiter=Limiter.from_url('memory://')"),
        ((), {"limiter": object()}, "Limiter.from_policy(policy)"),
        ((), {"sinks": LoggingSink()}, "pass sinks=[LoggingSink(...)]"),
        ((), {"sinks": [LoggingSink(), "x"]}, "sinks[1] must be a callable"),
        ((), {"clock": "now"}, "use rateloop.testing.FakeClock"),
        ((), {"rng": 0.5}, "rng must be a callable"),
        ((), {"classify": "openai"}, "classify must be a callable"),
        ((), {"run_budget": 5}, "run_budget=RunBudget(5)"),
        ((), {"run_id": 7}, "run_id must be a string"),
    ],
)
def test_constructor_misuse_is_a_clear_type_error(
    twin: Any, args: tuple[Any, ...], kwargs: dict[str, Any], says: str
) -> None:
    with pytest.raises(TypeError, match=re.escape(says)):
        twin(*args, **kwargs)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"fallbacks": Route(provider="anthropic", model="c")}, "pass fallbacks=[Route(...)]"),
        ({"fallbacks": ["anthropic:c"]}, "fallbacks[0] must be a rateloop.Route"),
        ({"cost": 1000}, "cost=Cost(input_tokens=1000, output_tokens=500)"),
        ({"cost": {"input": 5}}, "unknown key(s) input; allowed: requests"),
    ],
)
def test_call_misuse_is_a_clear_type_error(
    twin: Any, options: dict[str, Any], says: str
) -> None:
    loop = twin(clock=FakeClock(), sinks=[])
    with pytest.raises(TypeError, match=re.escape(says)):
        result = loop.call(FaultScript(["x"]), route=A, **options)
        if asyncio.iscoroutine(result):
            asyncio.run(result)


@pytest.mark.parametrize("bad", ["urgent", ["interactive"], 1, None])
def test_a_bad_priority_names_the_value_and_what_is_allowed(twin: Any, bad: object) -> None:
    loop = twin(clock=FakeClock(), sinks=[])
    allowed = "'safety', 'interactive', 'scheduled', 'background'"
    says = f"priority must be one of {allowed}, got {bad!r}"
    with pytest.raises(ValueError, match=re.escape(says)):
        result = loop.call(FaultScript(["x"]), route=A, priority=bad)
        if asyncio.iscoroutine(result):
            asyncio.run(result)


def test_a_dict_cost_is_accepted(twin: Any) -> None:
    limiter = Limiter(limits={"openai:gpt-5": LimitSpec(input_tokens_per_minute=100)})
    loop = twin(clock=FakeClock(), sinks=[], limiter=limiter)
    result = loop.call(FaultScript(["x"]), route=A, cost={"input_tokens": 1000})
    out = asyncio.run(result) if asyncio.iscoroutine(result) else result
    assert out.status.value == "rejected"  # the dict became Cost(input_tokens=1000)


def test_a_limits_key_no_call_uses_warns_once(twin: Any) -> None:
    limiter = Limiter(limits={"openai:gpt-4o": LimitSpec(concurrency=2)}, clock=FakeClock())
    loop = twin(clock=FakeClock(), sinks=[], limiter=limiter)

    def call(route: Route) -> Any:
        result = loop.call(FaultScript(["x"]), route=route, cost=Cost())
        return asyncio.run(result) if asyncio.iscoroutine(result) else result

    with pytest.warns(LimitsWarning, match=r"openai:gpt-4o matched no call") as warned:
        call(Route(provider="openai", model="gpt-4o-mini"))
        call(Route(provider="openai", model="gpt-4o-mini"))
    assert len(warned) == 1
    quiet = twin(clock=FakeClock(), sinks=[], limiter=limiter)
    result = quiet.call(FaultScript(["x"]), route=Route(provider="openai", model="gpt-4o"))
    out = asyncio.run(result) if asyncio.iscoroutine(result) else result
    assert out.ok  # a matching route: no warning (filterwarnings = error would raise)



def test_a_key_that_limits_no_call_is_not_warned_of(twin: Any) -> None:
    # Batch queues' enqueued tokens are held by batch steps, never by a call: such keys
    # match no call's route, and are not mistyped keys.
    limiter = Limiter(limits={"openai:gpt-4o~batch:p": LimitSpec(enqueued_tokens=1_000_000),
                              "openai:gpt-4o:p:batch": LimitSpec(enqueued_tokens=1_000_000)},
                      clock=FakeClock())
    result = twin(clock=FakeClock(), sinks=[], limiter=limiter).call(FaultScript(["x"]), route=A)
    out = asyncio.run(result) if asyncio.iscoroutine(result) else result
    assert out.ok  # no LimitsWarning (filterwarnings = error would raise it)
