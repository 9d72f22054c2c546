"""The loop's ``booked`` call option: a reservation granted before the call, taken once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from rateloop import Cost, Policy, RateLoop, Route
from rateloop.admission import Limiter, LimitSpec
from rateloop.testing import FakeClock

ROUTE = Route(provider="openai", model="gpt-4o-mini")
OTHER = Route(provider="openai", model="gpt-4o")


@dataclass
class Booking:
    """A start booked elsewhere: records what the loop did with it."""

    route: Route
    starts_in: float
    stale: bool = False
    done: list[str] = field(default_factory=list)

    def settle(self, input_tokens: int, output_tokens: int) -> None:
        self.done.append("settle")

    def release(self) -> None:
        self.done.append("release")


def paced(clock: FakeClock) -> tuple[RateLoop, Limiter]:
    limiter = Limiter(limits={ROUTE.scope: LimitSpec(requests_per_minute=60, burst=1 / 60),
                              OTHER.scope: LimitSpec(requests_per_minute=60, burst=1 / 60)},
                      clock=clock)
    return RateLoop(Policy.from_dict({"pause_limit_secs": 5}), limiter=limiter, clock=clock,
                    sinks=[]), limiter


def next_start(limiter: Limiter, route: Route) -> float:
    granted = limiter.try_reserve(route, Cost(), book_within=60)
    assert granted
    return granted.starts_in


def test_the_first_admission_takes_the_booked_start_without_asking_the_limiter(
        clock: FakeClock) -> None:
    loop, limiter = paced(clock)
    booking = Booking(ROUTE, starts_in=2.0)
    outcome = loop.call(lambda r: "done", route=ROUTE, booked=booking)
    assert outcome.value == "done" and booking.done == ["settle"]
    assert sum(clock.sleeps) == pytest.approx(2.0, abs=0.01)  # slept until its start
    assert next_start(limiter, ROUTE) == 0.0  # the limiter was never charged for it


def test_a_booking_on_another_route_or_a_stale_one_is_not_sent(clock: FakeClock) -> None:
    loop, limiter = paced(clock)
    elsewhere = Booking(OTHER, starts_in=2.0)
    assert loop.call(lambda r: "done", route=ROUTE, booked=elsewhere).value == "done"
    assert elsewhere.done == [] and clock.sleeps == []  # admitted on ROUTE's own limiter
    assert next_start(limiter, ROUTE) == pytest.approx(1.0)
    stale = Booking(ROUTE, starts_in=0.5, stale=True)
    calls: list[Route] = []
    assert loop.call(lambda r: calls.append(r) or "done", route=ROUTE, booked=stale).value == "done"
    assert stale.done == ["release"] and len(calls) == 1  # given back, admitted afresh


def test_booked_must_be_a_reservation(clock: FakeClock) -> None:
    loop, _ = paced(clock)
    bad: Any = "tomorrow"
    with pytest.raises(TypeError, match=r"booked must be a reservation .*'tomorrow'"):
        loop.call(lambda r: "done", route=ROUTE, booked=bad)
