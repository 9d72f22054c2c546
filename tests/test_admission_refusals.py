"""Stray 429s under a paced schedule: what kept admission a rounding error from the provider.

Two causes, found with ``bench/fleet_vtime.py`` (the fleet workload on virtual time with
the jitter of a real machine):

* a burst learned from a *token* reading was one token short, not one request short, when
  the requests bucket itself reported ``remaining: 0`` (the usual state of a saturated
  schedule) -- the requests bucket then had no margin, and a request landing a few ms
  late was refused, and with it every booked start after it;
* a wait for capacity (a denial's ``retry_after``) was reached on the exact instant the
  model frees a unit, where the provider's own refill is a rounding error short.
"""

from __future__ import annotations

import random

import pytest

from _vfleet import run_fleet
from rateloop import Route
from rateloop.admission import Limiter, LimitSpec
from rateloop.loop import RateLoop
from rateloop.policy import Policy
from rateloop.signal import Dimension, Kind, LimitSignal, Observed
from rateloop.testing import FakeClock, FaultScript
from rateloop.timing.decide import ARRIVAL_SLACK_SECS

MODEL = "openai:fake-model"
ROUTE = Route(provider="openai", model="fake-model")


def observed(dimension: Dimension, limit: int, remaining: int, reset: float) -> Observed:
    return Observed(
        dimension=dimension, limit=limit, remaining=remaining, reset_after=reset, window=60.0
    )


def test_a_burst_read_from_tokens_keeps_a_whole_request_of_margin() -> None:
    limiter = Limiter(clock=FakeClock())
    # The FakeProvider's headers on a saturated schedule (1,200 RPM, 1.2M TPM, 2 s burst):
    # the requests bucket has nothing left, so only the tokens bucket tells the burst.
    signal = LimitSignal.of(
        Kind.OK,
        observed=(
            observed(Dimension.REQUESTS, 1_200, 0, 1.98),
            observed(Dimension.TOKENS, 1_200_000, 15_000, 1.25),  # 15k + 1.25 s × 20k = 40k
        ),
    )
    limiter.observe(MODEL, signal)
    spec = limiter.limits_for(MODEL)
    assert spec is not None and spec.burst is not None
    # 2 s of the rate is 40 requests; planned one *request* short (not one token: 39.999).
    assert spec.burst * 1_200 == pytest.approx(39.0)
    assert spec.burst * 1_200_000 == pytest.approx(39_000.0)


class _NoSpread(random.Random):
    def random(self) -> float:
        return 0.0


def test_a_wait_for_capacity_is_reached_a_millisecond_late() -> None:
    clock = FakeClock()
    limiter = Limiter(
        limits={MODEL: LimitSpec(requests_per_minute=1_200)}, clock=clock, rng=_NoSpread()
    )
    loop = RateLoop(Policy.from_dict({"backoff": {"jitter": "none"}}), limiter=limiter, clock=clock)
    limiter.pause(MODEL, 2.0, "told to wait")  # a denial, not a booking
    out = loop.call(FaultScript([None]), route=ROUTE)
    assert out.ok
    # On the exact instant the model frees capacity the provider's refill (on its own
    # clock) can be a rounding error short: the loop arrives a millisecond after it.
    assert clock.sleeps == [pytest.approx(2.0 + ARRIVAL_SLACK_SECS)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_zero_config_fleet_with_late_requests_draws_no_429(seed: int) -> None:
    """30 tasks × 4 calls, limits learned from the headers, each request 0-30 ms in transit.

    Before: a burst learned from a token reading left the requests bucket a rounding
    error from the provider's, the first late request was refused, and the booked
    starts after it were refused in a cascade (0.07-0.11 429s per success).
    """
    provider = run_fleet(ROUTE, seed=seed, transit=0.03)
    assert provider.stats.served == 120
    assert provider.stats.refused == 0
