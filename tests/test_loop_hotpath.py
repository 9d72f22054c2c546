"""The hot path: what a loop prepares once and every call shares, and that nothing leaks.

A loop checks its policy's bounds, builds its backoff and each route's chain
once (``_Prepared``); each call then takes a fresh budget and a cached spec.
These tests hold that the sharing never carries one call's state into the
next, and that a changed policy is not served from the old preparation.
"""

from __future__ import annotations

import httpx
import pytest

from rateloop.admission.limiter import MAX_BOOK_SECONDS, Limiter, _book_seconds
from rateloop.admission.reservation import Reservation
from rateloop.admission.spec import LimitSpec
from rateloop.loop import RateLoop
from rateloop.loop.base import _CACHED_ROUTES
from rateloop.outcome.record import AttemptLedger, Attempts, Status
from rateloop.policy import Policy
from rateloop.route import Cost, Route
from rateloop.testing import FakeClock
from rateloop.timing.budget import CallBudget, RunBudget

A = Route(provider="openai", model="a")
B = Route(provider="openai", model="b")


class Refusing:
    """Raises a rate-limit refusal ``times`` times, then answers."""

    def __init__(self, times: int) -> None:
        self.times = times
        self.calls = 0

    def __call__(self, route: Route) -> str:
        self.calls += 1
        if self.calls <= self.times:
            request = httpx.Request("POST", "https://api.openai.com/v1/chat/completions")
            response = httpx.Response(429, headers={"retry-after": "1"}, request=request)
            raise httpx.HTTPStatusError("429", request=request, response=response)
        return "ok"


def test_fresh_budget_keeps_bounds_and_starts_unspent() -> None:
    run = RunBudget(10)
    template = CallBudget(
        max_attempts=2, recovery_budget_secs=30, started_at=0, max_wait_secs=9,
        run=run, max_error_attempts=4,
    )  # fmt: skip
    assert template.record_attempt()
    template.record_refusal(1.0)
    budget = template.fresh(started_at=3, deadline=20)
    assert (budget.max_attempts, budget.max_error_attempts) == (2, 4)
    assert (budget.recovery_budget_secs, budget.max_wait_secs, budget.run) == (30.0, 9.0, run)
    assert (budget.started_at, budget.deadline) == (3.0, 20.0)
    assert (budget.attempts, budget.error_attempts, budget.first_refusal_at) == (0, 0, None)
    assert type(budget.started_at) is float


@pytest.mark.parametrize("bad", [float("nan"), "5", True])
def test_fresh_budget_checks_its_start(bad: object) -> None:
    template = CallBudget(max_attempts=2, recovery_budget_secs=30, started_at=0)
    with pytest.raises(ValueError, match="started_at must be a number of seconds"):
        template.fresh(started_at=bad)  # type: ignore[arg-type]


def test_each_call_spends_its_own_budget() -> None:
    # A shared template must hand every call an unspent budget.
    clock = FakeClock()
    loop = RateLoop(Policy(max_attempts=2), clock=clock, sinks=[])
    for _ in range(3):
        fn = Refusing(times=1)
        outcome = loop.call(fn, route=A)
        assert (outcome.status, fn.calls, outcome.attempts.loop) == (Status.COMPLETED, 2, 2)


def test_a_call_without_options_reuses_its_checked_spec() -> None:
    loop = RateLoop(Policy(), clock=FakeClock(), sinks=[])
    first = loop._spec(A, {})
    assert loop._spec(Route(provider="openai", model="a"), {}) is first  # equal routes share
    assert loop._spec(B, {}).route == B
    with_cost = loop._spec(A, {"cost": Cost(input_tokens=5)})
    assert with_cost is not first and with_cost.cost.input_tokens == 5
    assert loop._spec(A, {}).cost == Cost()  # options never leak into the shared spec


def test_the_caches_stay_bounded() -> None:
    loop = RateLoop(Policy(), clock=FakeClock(), sinks=[])
    for i in range(_CACHED_ROUTES + 10):
        assert loop.call(lambda r: r.model, route=Route(provider="p", model=f"m{i}")).ok
    prepared = loop._prepare()
    assert 0 < len(prepared.specs) <= _CACHED_ROUTES
    assert 0 < len(prepared.chains) <= _CACHED_ROUTES


def test_a_changed_policy_is_prepared_again() -> None:
    loop = RateLoop(Policy(max_attempts=1), clock=FakeClock(), sinks=[])
    fn = Refusing(times=1)
    assert loop.call(fn, route=A).status is Status.FAILED_RETRY_EXHAUSTED
    loop.policy = Policy(max_attempts=3)
    fn = Refusing(times=1)
    assert loop.call(fn, route=A).status is Status.COMPLETED
    assert fn.calls == 2


def test_a_disabled_policy_still_steps_aside() -> None:
    loop = RateLoop(Policy(enabled=False, max_attempts=5), clock=FakeClock(), sinks=[])
    fn = Refusing(times=1)
    outcome = loop.call(fn, route=A, fallbacks=[B])
    assert fn.calls == 1 and outcome.status is Status.FAILED_RETRY_EXHAUSTED


def test_alternating_routes_each_get_their_own_spec_and_chain() -> None:
    # The last-route shortcut must not hand one route's spec or chain to another.
    loop = RateLoop(Policy(), clock=FakeClock(), sinks=[])
    for _ in range(3):
        for route in (A, B, A, A, B):
            outcome = loop.call(lambda r: r.model, route=route)
            assert (outcome.value, outcome.route) == (route.model, route)
    spec = loop._spec(B, {})
    assert loop._prepare().chain(spec)[0] == (B,)


@pytest.mark.parametrize(
    ("within", "expected"),
    [(0.0, 0.0), (2.5, 2.5), (7, 7.0), (MAX_BOOK_SECONDS * 2, MAX_BOOK_SECONDS)],
)
def test_book_within_accepts_seconds_and_caps_them(within: float, expected: float) -> None:
    limiter = Limiter(limits={A.scope: LimitSpec(requests_per_minute=60)}, clock=FakeClock())
    granted = limiter.try_reserve(A, Cost(), book_within=within)
    assert isinstance(granted, Reservation)
    assert _book_seconds(within) == expected and type(_book_seconds(within)) is float


@pytest.mark.parametrize("within", [float("nan"), -0.5, -1, True, "1"])
def test_book_within_refuses_what_is_no_wait(within: object) -> None:
    limiter = Limiter(limits={A.scope: LimitSpec(requests_per_minute=60)}, clock=FakeClock())
    with pytest.raises(ValueError, match="book_within must be seconds >= 0"):
        limiter.try_reserve(A, Cost(), book_within=within)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [float("nan"), True, "3"])
def test_call_budget_checks_its_seconds(bad: object) -> None:
    with pytest.raises(ValueError, match="started_at must be a number of seconds"):
        CallBudget(max_attempts=1, recovery_budget_secs=1, started_at=bad)  # type: ignore[arg-type]


def test_a_first_try_snapshot_is_shared_and_others_are_exact() -> None:
    one = AttemptLedger(loop=1).snapshot()
    assert one is AttemptLedger(loop=1).snapshot() and one == Attempts(loop=1)
    for counts in ({"loop": 2}, {"loop": 1, "sdk": 1}, {"loop": 1, "redeliveries": 3}, {}):
        assert AttemptLedger(**counts).snapshot() == Attempts(**counts)
