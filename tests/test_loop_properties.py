"""Property tests: whatever the providers answer, the loop stays inside its bounds."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rateloop.loop import RateLoop
from rateloop.outcome import Status
from rateloop.policy import Policy
from rateloop.route import Route
from rateloop.signal import Kind, LimitSignal
from rateloop.testing import FakeClock

ROUTES = [Route(provider=p, model=m) for p, m in (("openai", "a"), ("openai", "b"), ("x", "c"))]


class TimedClock(FakeClock):
    """A FakeClock that records the monotonic time at which each sleep ends."""

    def __init__(self) -> None:
        super().__init__()
        self.sleep_ends: list[float] = []

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        self.sleep_ends.append(self.monotonic())


signals = st.builds(
    lambda kind, retry_after: LimitSignal.of(kind, retry_after=retry_after),
    st.sampled_from([k for k in Kind if k is not Kind.UNKNOWN]),
    st.none() | st.floats(min_value=0, max_value=5000, allow_nan=False),
)


class Refused(Exception):
    def __init__(self, signal: LimitSignal) -> None:
        self.signal = signal


@settings(max_examples=300, deadline=None)
@given(
    script=st.lists(st.tuples(signals, st.floats(min_value=0, max_value=50)), min_size=1),
    max_attempts=st.integers(min_value=1, max_value=12),
    max_wait=st.none() | st.floats(min_value=1, max_value=300),
    recovery=st.floats(min_value=1, max_value=600),
    deadline=st.none() | st.floats(min_value=0, max_value=400),
    per_route=st.none() | st.integers(min_value=1, max_value=4),
    scope=st.sampled_from(["rate-limit", "transient", "all"]),
    pause=st.floats(min_value=1, max_value=120),
)
def test_loop_never_exceeds_attempts_wait_budget_or_deadline(
    script: list[tuple[LimitSignal, float]],
    max_attempts: int,
    max_wait: float | None,
    recovery: float,
    deadline: float | None,
    per_route: int | None,
    scope: str,
    pause: float,
) -> None:
    policy = Policy.from_dict(
        {
            "max_attempts": max_attempts,
            "recovery_budget_secs": recovery,
            "max_wait_secs": max_wait,
            "attempts_per_route": None if per_route is None else min(per_route, max_attempts),
            "trigger_scope": scope,
            "pause_limit_secs": pause,
            "backoff": {"initial_delay_secs": 1, "max_delay_secs": 60},
        }
    )
    clock = TimedClock()
    calls: list[LimitSignal] = []
    first_refusal: list[float] = []

    def fn(route: Route) -> Any:
        signal, duration = script[min(len(calls), len(script) - 1)]
        calls.append(signal)
        clock.advance(duration)
        if signal.kind is Kind.OK:
            return "ok"
        if not first_refusal:
            first_refusal.append(clock.monotonic())
        raise Refused(signal)

    def classify(exc: BaseException) -> LimitSignal:
        assert isinstance(exc, Refused)
        return exc.signal

    loop = RateLoop(policy, clock=clock, classify=classify, rng=lambda: 0.999, sinks=[])
    outcome = loop.call(fn, route=ROUTES[0], fallbacks=ROUTES[1:], deadline=deadline)

    if not calls:
        # Only a deadline that has (all but) passed before the first attempt prevents one.
        assert deadline is not None and deadline < 1e-3
        assert outcome.status is Status.WAITING_FOR_CAPACITY
        return
    assert 1 <= len(calls) <= max_attempts
    assert outcome.attempts.loop == len(calls)
    eps = 1e-6
    assert all(s <= pause + eps for s in clock.sleeps)  # the pause limit bounds every sleep
    assert outcome.waited_secs == sum(clock.sleeps)
    for end in clock.sleep_ends:
        if max_wait is not None:
            assert end <= max_wait + eps
        if deadline is not None:
            assert end <= deadline + eps
        assert end <= first_refusal[0] + recovery + eps
    if outcome.ok:
        assert calls[-1].kind is Kind.OK
    else:
        assert calls[-1].kind is not Kind.OK
    assert isinstance(outcome.status, Status)
    assert outcome.reason
