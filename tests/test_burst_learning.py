"""The provider's burst learned from its headers: remaining + reset × rate = its bucket.

Run against both backends; the sharing tests against the real Redis.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from rateloop.admission import LimitSpec
from rateloop.admission.learning import capacity_estimate
from rateloop.admission.limiter import Limiter
from rateloop.admission.reservation import Reservation
from rateloop.route import Cost, Route
from rateloop.signal import Dimension, Kind, LimitSignal, Observed
from rateloop.testing import FakeClock, FakeProvider, FakeRequest

MODEL = "openai:gpt-5"
ROUTE = Route(provider="openai", model="gpt-5")


@pytest.fixture(params=["memory", "redis"])
def limiter(request: pytest.FixtureRequest) -> Iterator[Limiter]:
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        prefix = request.getfixturevalue("redis_prefix")
        lim = Limiter.from_url(url, prefix=prefix, rng=random.Random(1))
    else:
        lim = Limiter(clock=FakeClock(), rng=random.Random(1))
    yield lim
    lim.close()


def success(*observed: Observed, provider: str | None = None) -> LimitSignal:
    return LimitSignal.of(Kind.OK, status=200, provider=provider, observed=observed)


def requests(limit: float, remaining: float, reset: float) -> Observed:
    return Observed(
        dimension=Dimension.REQUESTS,
        limit=limit,
        remaining=remaining,
        reset_after=reset,
        window=60.0,
    )


def fill(limiter: Limiter, route: Route = ROUTE) -> int:
    n = 0
    while isinstance(limiter.try_reserve(route, Cost()), Reservation):
        n += 1
        assert n < 1000
    return n


# 600 RPM is 10 a second: the default pacing holds 10.  20 remaining and full after
# 1 s is a bucket of 20 + 10 = 30 (3 s): 10 used, 20 left; planned one unit short (29).
SHORT = success(requests(600, 20, 1.0))


def test_the_estimate_is_remaining_plus_the_reset_at_the_rate() -> None:
    assert capacity_estimate(requests(600, 20, 1.0)) == pytest.approx(29 / 600)  # one short
    assert capacity_estimate(requests(600, 600, 0.0)) == pytest.approx(599 / 600)
    # A bucket in debt reports 0 and a reset longer than its capacity: no estimate.
    assert capacity_estimate(requests(600, 0, 5.0)) is None
    # A whole-second reset may be a second late: the slack is taken off.
    assert capacity_estimate(requests(600, 20, 2.0), slack=1.0) == pytest.approx(29 / 600)
    # Only a minute's limit has a known rate.
    hourly = Observed(
        dimension=Dimension.REQUESTS, limit=600, remaining=20, reset_after=1.0, window=3600.0
    )
    assert capacity_estimate(hourly) is None
    assert (
        capacity_estimate(
            Observed(dimension=Dimension.REQUESTS, remaining=20, reset_after=1.0, window=60.0)
        )
        is None
    )


def test_a_short_provider_bucket_becomes_the_configured_scopes_burst(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, LimitSpec(requests_per_minute=600))
    limiter.observe(MODEL, SHORT)
    assert limiter.limits_for(MODEL) == LimitSpec(requests_per_minute=600, burst=29 / 600)
    # Capacity 30, of which the provider said 10 are used: 20 go at once (the default
    # pacing would have let 10).
    assert fill(limiter) == 20


def test_raising_the_capacity_credits_the_headroom(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, LimitSpec(requests_per_minute=600))
    assert fill(limiter) == 10  # the default pacing: one second of the rate
    # The provider saw those 10 in its 30-request bucket: 20 left, full after 1 s.
    limiter.observe(MODEL, SHORT)
    # Our 10 stay used in a bucket of 29 (one short of the provider's 30): 19 more.
    assert fill(limiter) == 19


def test_a_configured_burst_always_wins(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, LimitSpec(requests_per_minute=600, burst=1 / 60))
    limiter.observe(MODEL, SHORT)
    assert limiter.limits_for(MODEL) == LimitSpec(requests_per_minute=600, burst=1 / 60)
    assert fill(limiter) == 10


def test_a_minute_bucket_keeps_the_profiles_pacing(limiter: Limiter) -> None:
    # OpenAI reports its minute (500 left, full after 10 s: 600) while it may enforce
    # per second: the default pacing stays.
    limiter.set_limits(MODEL, LimitSpec(requests_per_minute=600))
    limiter.observe(MODEL, success(requests(600, 500, 10.0)))
    assert limiter.limits_for(MODEL) == LimitSpec(requests_per_minute=600)
    assert fill(limiter) == 10


def test_a_bucket_in_debt_teaches_nothing(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, LimitSpec(requests_per_minute=600))
    limiter.observe(MODEL, success(requests(600, 0, 5.0)))
    assert limiter.limits_for(MODEL) == LimitSpec(requests_per_minute=600)


def test_the_largest_estimate_wins_and_a_smaller_one_does_not_lower_it(
    limiter: Limiter,
) -> None:
    limiter.set_limits(MODEL, LimitSpec(requests_per_minute=600))
    limiter.observe(MODEL, SHORT)  # 30
    limiter.observe(MODEL, success(requests(600, 5, 1.0)))  # 15: a lower bound, ignored
    spec = limiter.limits_for(MODEL)
    assert spec is not None and spec.burst == pytest.approx(29 / 600)
    limiter.observe(MODEL, success(requests(600, 20, 2.0)))  # 40
    spec = limiter.limits_for(MODEL)
    assert spec is not None and spec.burst == pytest.approx(39 / 600)


def test_one_burst_serves_every_dimension_the_smallest(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, LimitSpec(requests_per_minute=600, tokens_per_minute=60_000))
    tokens = Observed(
        dimension=Dimension.TOKENS, limit=60_000, remaining=1_000, reset_after=1.0, window=60.0
    )  # 1000 + 1000: 2 s
    limiter.observe(MODEL, success(requests(600, 20, 1.0), tokens))  # requests: 3 s
    spec = limiter.limits_for(MODEL)
    # 2 s of tokens, one *request* short (100 tokens at this ratio): one burst serves both.
    assert spec is not None and spec.burst == pytest.approx(1900 / 60_000)


def test_zero_config_learns_the_limit_and_the_burst(limiter: Limiter) -> None:
    limiter.observe(MODEL, SHORT)
    assert limiter.limits_for(MODEL) == LimitSpec(requests_per_minute=600, burst=29 / 600)
    assert fill(limiter) == 20


def test_anthropic_whole_second_resets_are_read_conservatively() -> None:
    clock = FakeClock(start=datetime(2026, 1, 1, tzinfo=UTC))
    limiter = Limiter(clock=clock)
    scope = "anthropic:claude"
    limiter.set_limits(scope, LimitSpec(requests_per_minute=600))
    reset = clock.now() + timedelta(seconds=2)
    limiter.observe(
        scope,
        {
            "anthropic-ratelimit-requests-limit": "600",
            "anthropic-ratelimit-requests-remaining": "20",
            "anthropic-ratelimit-requests-reset": reset.strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
    )
    # Full in 2 s by the header, perhaps only 1 s: 20 + 1 s × 10, not 20 + 2 s × 10.
    spec = limiter.limits_for(scope)
    assert spec is not None and spec.burst == pytest.approx(29 / 600)


def test_the_fake_providers_headers_tell_its_burst() -> None:
    clock = FakeClock()
    fake = FakeProvider(profile="openai", rpm=1200, tpm=1_200_000, burst_seconds=2, clock=clock)
    limiter = Limiter(clock=clock)
    limiter.set_limits(MODEL, LimitSpec(requests_per_minute=1200, tokens_per_minute=1_200_000))
    for _ in range(7):
        response = fake.respond(FakeRequest())
        assert response.status_code == 200
        clock.advance(0.013)
        limiter.observe(MODEL, dict(response.headers))
    spec = limiter.limits_for(MODEL)
    # remaining is floored: the estimate is within one request below the 40 it holds.
    assert spec is not None and 38 / 1200 <= spec.burst <= 39 / 1200 + 1e-9


def test_processes_share_the_learned_burst(redis_url: str, redis_prefix: str) -> None:
    limits = {MODEL: LimitSpec(requests_per_minute=600)}
    one = Limiter.from_url(redis_url, prefix=redis_prefix, limits=limits)
    two = Limiter.from_url(redis_url, prefix=redis_prefix, limits=limits)
    try:
        one.observe(MODEL, SHORT)
        # The other process never saw a header: it reads the burst from Redis on its
        # next admission, and the shared bucket (10 used of 30) admits 20 more.
        assert fill(two) == 20
        spec = two.limits_for(MODEL)
        assert spec is not None and spec.burst == pytest.approx(29 / 600)
    finally:
        one.close()
        two.close()


def test_zero_config_processes_share_the_learned_burst(redis_url: str, redis_prefix: str) -> None:
    one = Limiter.from_url(redis_url, prefix=redis_prefix)
    two = Limiter.from_url(redis_url, prefix=redis_prefix)
    try:
        one.observe(MODEL, SHORT)
        assert fill(two) == 20
        assert two.limits_for(MODEL) == LimitSpec(requests_per_minute=600, burst=29 / 600)
    finally:
        one.close()
        two.close()


def test_a_configured_burst_everywhere_reads_nothing(redis_url: str, redis_prefix: str) -> None:
    limits = {MODEL: LimitSpec(requests_per_minute=600, burst=1 / 60)}
    one = Limiter.from_url(redis_url, prefix=redis_prefix, limits=limits)
    two = Limiter.from_url(redis_url, prefix=redis_prefix, limits=limits)
    try:
        one.observe(MODEL, SHORT)
        assert fill(two) == 10
        assert two.limits_for(MODEL) == limits[MODEL]
        # No round trip was spent reading learned values: none are due for this route.
        assert two._admissions.refresh_op(ROUTE, "interactive") is None
    finally:
        one.close()
        two.close()


def test_an_empty_short_bucket_blocks_one_units_refill_not_the_whole_reset(
    limiter: Limiter,
) -> None:
    limiter.set_limits(MODEL, LimitSpec(requests_per_minute=600))
    limiter.observe(MODEL, SHORT)  # the provider's bucket: 30, a 3 s refill
    # Empty now, full in 3 s: it admits again after one unit's refill, not after 3 s
    # (two units, 0.2 s, as our bucket is planned one unit short of the provider's).
    limiter.observe(MODEL, success(requests(600, 0, 3.0)))
    denied = limiter.try_reserve(ROUTE, Cost())
    assert not isinstance(denied, Reservation)
    assert denied.retry_after == pytest.approx(0.2, abs=0.05)


def test_without_a_known_bucket_an_empty_one_blocks_until_its_reset(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, LimitSpec(requests_per_minute=600))
    limiter.observe(MODEL, success(requests(600, 0, 3.0)))
    denied = limiter.try_reserve(ROUTE, Cost())
    assert not isinstance(denied, Reservation)
    assert denied.retry_after == pytest.approx(3.0, abs=0.15)


def test_the_fake_providers_headers_are_refilled_to_the_response() -> None:
    from rateloop.sim.vtime import VirtualClock, run_virtual

    async def main() -> list[dict[str, str]]:
        clock = VirtualClock()
        fake = FakeProvider(profile="openai", rpm=1200, burst_seconds=2, latency=0.5, clock=clock)
        answers = await asyncio.gather(*(fake.arespond(FakeRequest()) for _ in range(30)))
        return [dict(a.headers) for a in answers]

    headers = run_virtual(main())
    # 30 of 40 taken at 0, answered at 0.5 s: 10 refilled meanwhile, so 20 remain.
    assert headers[-1]["x-ratelimit-remaining-requests"] == "20"
