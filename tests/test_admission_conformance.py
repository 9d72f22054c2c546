"""One suite, every backend: the same behaviour from memory:// and redis://.

The memory limiter runs on a FakeClock that never moves unless told; the Redis
limiter runs on the server's TIME, so these tests assert on denials and their
``retry_after`` (with a small tolerance for the milliseconds between calls),
never on elapsed wall time.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest

import _limiters
from rateloop.admission.backends.memory import MemoryBackend
from rateloop.admission.gcra import DAY
from rateloop.admission.limiter import Limiter
from rateloop.admission.reservation import AdmissionTimeout, Denied, Reservation
from rateloop.admission.spec import LimitSpec
from rateloop.route import Cost, Route
from rateloop.signal import Dimension, Kind, LimitSignal, Observed


def minute_spec(**fields: Any) -> LimitSpec:
    """A LimitSpec holding a whole minute (``burst = 1``), refunding unused output.

    These tests check the arithmetic; the default pacing (one second of the
    rate) and the providers' accounting profiles have their own tests.
    """
    return LimitSpec(**{"burst": 1.0, "profile": "generic", **fields})


limiter = _limiters.limiter  # the memory / Redis fixture, shared by the conformance suites

MODEL = "openai:gpt-5"
ROUTE = Route(provider="openai", model="gpt-5", project="proj-1", tenant="t-7")
TOL = 0.15  # seconds: Redis time moves between two calls of one test (a loaded machine)




def peer(limiter: Limiter) -> Limiter:
    """Another worker on the same shared state (no limits of its own yet)."""
    return Limiter(limiter.backend, rng=random.Random(2))


def fill(limiter: Limiter, route: Route, cost: Cost, *, priority: str = "interactive") -> int:
    granted = 0
    while isinstance(limiter.try_reserve(route, cost, priority=priority), Reservation):
        granted += 1
        assert granted < 10_000
    return granted


def denied(result: Reservation | Denied) -> Denied:
    assert isinstance(result, Denied), result
    return result


def test_burst_then_continuous_refill_wait(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, minute_spec(requests_per_minute=120, burst=0.5))
    start = time.monotonic()
    granted = fill(limiter, ROUTE, Cost())
    # Redis time moves while 60 admissions run (2 refill a second): on a loaded
    # machine one more may fit.  The memory backend's clock is fake: exactly 60.
    assert 60 <= granted <= 60 + 2 * (time.monotonic() - start) + 1
    d = denied(limiter.try_reserve(ROUTE, Cost()))
    assert (d.scope, d.dimension, d.never_fits) == (MODEL, Dimension.REQUESTS, False)
    if isinstance(limiter.backend, MemoryBackend):
        assert granted == 60 and d.retry_after == pytest.approx(0.5)
    assert 0 < d.retry_after <= 0.5 + 1e-6


def test_all_dimensions_of_all_scopes_or_none(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, minute_spec(requests_per_minute=10, input_tokens_per_minute=1_000))
    limiter.set_limits(ROUTE.scope, minute_spec(output_tokens_per_minute=600))
    assert limiter.try_reserve(ROUTE, Cost(input_tokens=100, output_tokens=600))
    d = denied(limiter.try_reserve(ROUTE, Cost(input_tokens=900, output_tokens=600)))
    assert (d.scope, d.dimension) == (ROUTE.scope, Dimension.OUTPUT_TOKENS)
    assert d.retry_after == pytest.approx(60.0, abs=TOL)
    # The denial took nothing: 900 input tokens and 9 requests are still there.
    other = Route(provider="openai", model="gpt-5", project="proj-2")
    assert limiter.try_reserve(other, Cost(input_tokens=900))
    assert fill(limiter, other, Cost()) == 8


def test_cost_above_the_limit_never_fits(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, minute_spec(tokens_per_minute=1_000))
    d = denied(limiter.try_reserve(ROUTE, Cost(input_tokens=700, output_tokens=301)))
    assert d.never_fits
    assert d.dimension is Dimension.TOKENS
    assert "1001" in d.reason


def test_settle_refunds_and_release_keeps_the_request(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, minute_spec(requests_per_minute=2, output_tokens_per_minute=1_000))
    r = limiter.try_reserve(ROUTE, Cost(output_tokens=800))
    assert isinstance(r, Reservation)
    assert not limiter.try_reserve(ROUTE, Cost(output_tokens=800))
    r.settle(50, 100)
    r.settle(50, 100)  # idempotent
    r2 = limiter.try_reserve(ROUTE, Cost(output_tokens=800))
    assert isinstance(r2, Reservation)
    r2.release()
    r2.release()
    # Tokens are back, but both requests were spent (the denial spent none).
    d = denied(limiter.try_reserve(ROUTE, Cost(output_tokens=800)))
    assert d.dimension is Dimension.REQUESTS


def test_overuse_is_charged(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, minute_spec(output_tokens_per_minute=600))
    r = limiter.try_reserve(ROUTE, Cost(output_tokens=100))
    assert isinstance(r, Reservation)
    r.settle(0, 700)  # 100 units of debt above the 600 burst
    d = denied(limiter.try_reserve(ROUTE, Cost(output_tokens=10)))
    assert d.retry_after == pytest.approx(11.0, abs=TOL)  # (100 + 10) / 10 per second


def test_concurrency_leases(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, minute_spec(concurrency=2))
    a = limiter.try_reserve(ROUTE, Cost())
    b = limiter.try_reserve(ROUTE, Cost())
    assert isinstance(a, Reservation) and isinstance(b, Reservation)
    d = denied(limiter.try_reserve(ROUTE, Cost()))
    assert d.dimension is Dimension.CONCURRENCY
    assert 0 < d.retry_after <= 0.05 + TOL
    a.release()
    with limiter.try_reserve(ROUTE, Cost()) as c:  # type: ignore[union-attr]
        assert isinstance(c, Reservation)
        assert not limiter.try_reserve(ROUTE, Cost())
    assert limiter.try_reserve(ROUTE, Cost())


def test_pause_covers_narrower_scopes_and_adds_a_small_spread(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, minute_spec(requests_per_minute=1_000))
    other = peer(limiter)
    other.pause(MODEL, 30.0, "429 retry-after 30")
    other.pause(MODEL, 5.0, "a shorter pause never shortens")
    d = denied(limiter.try_reserve(ROUTE, Cost()))
    assert d.scope == MODEL
    assert d.dimension is None
    assert "429 retry-after 30" in d.reason
    assert 30.0 - TOL <= d.retry_after <= 31.0 + TOL
    spreads = {denied(limiter.try_reserve(ROUTE, Cost())).retry_after for _ in range(5)}
    assert len(spreads) > 1  # waiters do not all wake at the same instant
    assert limiter.try_reserve(Route(provider="openai", model="gpt-4o"), Cost())


def test_observe_remaining_zero_empties_the_dimension_until_reset(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, minute_spec(requests_per_minute=100, tokens_per_minute=10_000))
    requests_left = Observed(dimension=Dimension.REQUESTS, remaining=3, reset_after=1.0)
    limiter.observe(MODEL, LimitSignal.of(Kind.OK, observed=(requests_left,)))
    assert fill(limiter, ROUTE, Cost()) == 3  # the provider said 3 remain, not 100
    no_tokens = Observed(dimension=Dimension.TOKENS, remaining=0, reset_after=20.0)
    limiter.observe(MODEL, LimitSignal.of(Kind.OK, observed=(no_tokens,)))
    d = denied(limiter.try_reserve(ROUTE, Cost(input_tokens=1)))
    assert d.dimension is Dimension.TOKENS
    assert d.retry_after == pytest.approx(20.0, abs=TOL)


def test_zero_config_takes_limits_from_headers(limiter: Limiter) -> None:
    signal = LimitSignal.of(
        Kind.OK,
        observed=(Observed(dimension=Dimension.REQUESTS, limit=6, remaining=6, window=60.0),),
    )
    limiter.observe(MODEL, signal)
    assert limiter.limits_for(MODEL) == LimitSpec(requests_per_minute=6)
    # Paced by default: 6 a minute go one at a time, one every 10 s (not 6 at once).
    assert fill(limiter, ROUTE, Cost()) == 1
    d = denied(limiter.try_reserve(ROUTE, Cost()))
    assert d.retry_after == pytest.approx(10.0, abs=TOL)


def test_429_despite_admission_lowers_the_rate(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, minute_spec(requests_per_minute=60))
    assert fill(limiter, ROUTE, Cost()) == 60
    assert denied(limiter.try_reserve(ROUTE, Cost())).retry_after == pytest.approx(1.0, abs=TOL)
    throttled = LimitSignal.of(Kind.TEMPORARY, status=429, retry_after=1.0)
    limiter.observe(MODEL, throttled)
    limiter.observe(MODEL, throttled)  # same burst: within the cooldown, no second decrease
    slowed = denied(limiter.try_reserve(ROUTE, Cost())).retry_after
    assert slowed == pytest.approx(1.25, abs=TOL)  # rate × 0.8


def test_priority_classes_keep_a_reserve(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, minute_spec(requests_per_minute=100, reserve=0.1))
    assert fill(limiter, ROUTE, Cost(), priority="background") == 80
    assert fill(limiter, ROUTE, Cost(), priority="scheduled") == 10
    assert fill(limiter, ROUTE, Cost(), priority="interactive") == 10
    with pytest.raises(ValueError, match="urgent"):
        limiter.try_reserve(ROUTE, Cost(), priority="urgent")


def test_tenants_get_their_own_share(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, minute_spec(requests_per_minute=100))
    for tenant in ("a", "b"):
        limiter.set_limits(f"{MODEL}:proj-1:{tenant}", minute_spec(requests_per_minute=30))
    a = Route(provider="openai", model="gpt-5", project="proj-1", tenant="a")
    b = Route(provider="openai", model="gpt-5", project="proj-1", tenant="b")
    assert fill(limiter, a, Cost()) == 30
    assert fill(limiter, b, Cost()) == 30


def test_fixed_day_window_and_rolling_day(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, minute_spec(requests_per_day=2, day_window="rolling"))
    assert fill(limiter, ROUTE, Cost()) == 2
    d = denied(limiter.try_reserve(ROUTE, Cost()))
    assert d.dimension is Dimension.REQUESTS_PER_DAY
    assert d.retry_after == pytest.approx(DAY / 2, abs=TOL)
    other = Route(provider="openai", model="o3")
    limiter.set_limits("openai:o3", minute_spec(requests_per_day=2, day_window="fixed"))
    r = limiter.try_reserve(other, Cost())
    assert isinstance(r, Reservation)
    assert fill(limiter, other, Cost()) == 1
    d = denied(limiter.try_reserve(other, Cost()))
    assert d.dimension is Dimension.REQUESTS_PER_DAY
    # The window resets at 00:00 UTC: the wait is the rest of the (backend's) day.
    wall = r.granted_at if limiter.backend.url != "memory://" else None
    if wall is not None:
        assert d.retry_after == pytest.approx(DAY - wall % DAY, abs=TOL)
    else:
        assert d.retry_after == pytest.approx(DAY)  # FakeClock starts at midnight


def test_reserve_gives_up_before_the_deadline(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, minute_spec(requests_per_minute=6))
    assert fill(limiter, ROUTE, Cost()) == 6
    with pytest.raises(AdmissionTimeout) as info:
        limiter.reserve(ROUTE, Cost(), deadline=0.0)
    assert info.value.retry_after == pytest.approx(10.0, abs=TOL)


def test_async_twins(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, minute_spec(requests_per_minute=5, concurrency=3))

    async def main() -> None:
        held = [await limiter.atry_reserve(ROUTE, Cost()) for _ in range(3)]
        assert all(isinstance(h, Reservation) for h in held)
        assert denied(await limiter.atry_reserve(ROUTE, Cost())).dimension is (
            Dimension.CONCURRENCY
        )
        for h in held:
            assert isinstance(h, Reservation)
            await h.asettle(0, 0)
        async with await limiter.areserve(ROUTE, Cost()):
            pass
        await limiter.apause(MODEL, 10.0, "async pause")
        assert denied(await limiter.atry_reserve(ROUTE, Cost())).retry_after > 9
        await limiter.aobserve(MODEL, LimitSignal.of(Kind.TEMPORARY, status=429))
        await limiter.aclose()

    asyncio.run(main())


def test_zero_config_from_openai_and_anthropic_headers(limiter: Limiter) -> None:
    limiter.observe(
        MODEL,
        {
            "x-ratelimit-limit-requests": "500",
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": "20s",
            "x-ratelimit-limit-tokens": "30000",
            "x-ratelimit-remaining-tokens": "29000",
        },
    )
    assert limiter.limits_for(MODEL) == LimitSpec(requests_per_minute=500, tokens_per_minute=30_000)
    d = denied(limiter.try_reserve(ROUTE, Cost()))
    assert d.dimension is Dimension.REQUESTS
    assert d.retry_after == pytest.approx(20.0, abs=TOL)
    claude = "anthropic:claude-sonnet-4"
    limiter.observe(
        claude,
        {
            "anthropic-ratelimit-input-tokens-limit": "40000",
            "anthropic-ratelimit-input-tokens-remaining": "300",
        },
    )
    route = Route(provider="anthropic", model="claude-sonnet-4")
    assert limiter.limits_for(claude) == LimitSpec(input_tokens_per_minute=40_000)
    # Paced: the bucket holds one second (666.7 tokens), of which 300 are left (and
    # Redis time moves on: it refills 0.67 a millisecond).
    assert not limiter.try_reserve(route, Cost(input_tokens=400))
    assert limiter.try_reserve(route, Cost(input_tokens=300))


def test_configured_limits_win_over_headers(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, minute_spec(requests_per_minute=10))
    limiter.observe(MODEL, {"x-ratelimit-limit-requests": "500"})
    assert limiter.limits_for(MODEL) == minute_spec(requests_per_minute=10)


def test_a_limit_the_provider_states_below_the_configured_one_binds(
    limiter: Limiter, caplog: pytest.LogCaptureFixture
) -> None:
    """Configured 60 RPM, the provider says 30: admitting at 60 would only collect 429s."""
    configured = minute_spec(requests_per_minute=60, tokens_per_minute=10_000)
    limiter.set_limits(MODEL, configured)
    with caplog.at_level("WARNING", logger="rateloop.admission"):
        limiter.observe(MODEL, {"x-ratelimit-limit-requests": "30",
                                "x-ratelimit-limit-tokens": "50000"})
    assert limiter.limits_for(MODEL) == minute_spec(requests_per_minute=30,
                                                    tokens_per_minute=10_000)
    assert [r.getMessage() for r in caplog.records] == [
        "openai:gpt-5: the provider states requests_per_minute = 30, below the configured 60: "
        "admitting at the provider's limit"]
    # A minute's bucket of the stated 30, not of the configured 60.
    route = Route(provider="openai", model="gpt-5")
    n = 0
    while isinstance(limiter.try_reserve(route, Cost()), Reservation):
        n += 1
        assert n < 100
    assert n == 30
    # The provider raises it again (a tier upgrade): up to the configured value, no higher.
    limiter.observe(MODEL, {"x-ratelimit-limit-requests": "90"})
    assert limiter.limits_for(MODEL) == configured


def test_a_stated_limit_binds_only_on_the_scope_it_describes(limiter: Limiter) -> None:
    """The headers describe the model's limit, not a provider-wide scope the user configured."""
    limiter.set_limits("openai", minute_spec(requests_per_minute=60))
    limiter.observe(MODEL, {"x-ratelimit-limit-requests": "30"})
    assert limiter.limits_for("openai") == minute_spec(requests_per_minute=60)
    assert limiter.limits_for(MODEL) is None
    # Nor a model's total over several projects: a project's answer states the project's.
    limiter.set_limits(MODEL, minute_spec(requests_per_minute=60))
    limiter.observe(f"{MODEL}:proj-1", {"x-ratelimit-limit-requests": "30"})
    assert limiter.limits_for(MODEL) == minute_spec(requests_per_minute=60)


def test_configuring_a_scope_again_forgets_what_was_stated(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, minute_spec(requests_per_minute=60))
    limiter.observe(MODEL, {"x-ratelimit-limit-requests": "30"})
    assert limiter.limits_for(MODEL) == minute_spec(requests_per_minute=30)
    limiter.set_limits(MODEL, minute_spec(requests_per_minute=50))
    assert limiter.limits_for(MODEL) == minute_spec(requests_per_minute=50)


def test_observe_on_a_narrower_scope_acts_on_the_governing_limits(limiter: Limiter) -> None:
    """The loop observes on ``provider:model:project``; limits live on ``provider:model``."""
    limiter.set_limits(MODEL, minute_spec(requests_per_minute=60, tokens_per_minute=10_000))
    project = f"{MODEL}:proj-1"
    left = Observed(dimension=Dimension.REQUESTS, limit=500, remaining=3, reset_after=1.0)
    limiter.observe(project, LimitSignal.of(Kind.OK, observed=(left,)))
    assert limiter.limits_for(project) is None  # an ancestor is configured: nothing learned
    assert fill(limiter, ROUTE, Cost()) == 3  # the tightening reached openai:gpt-5
    assert denied(limiter.try_reserve(ROUTE, Cost())).scope == MODEL
    # A 429 despite admission lowers the governing scope's rate too.
    other = Route(provider="openai", model="gpt-5", project="proj-2")
    limiter.observe(project, LimitSignal.of(Kind.TEMPORARY, status=429))
    d = denied(limiter.try_reserve(other, Cost()))
    assert d.retry_after == pytest.approx(1.25, abs=TOL)  # one request at 1/s × 0.8


def test_observe_with_limits_on_the_scope_and_an_ancestor_uses_the_nearest(
    limiter: Limiter,
) -> None:
    project = f"{MODEL}:proj-1"
    limiter.set_limits(MODEL, minute_spec(requests_per_minute=100))
    limiter.set_limits(project, minute_spec(requests_per_minute=50))
    no_requests = Observed(dimension=Dimension.REQUESTS, remaining=0, reset_after=20.0)
    limiter.observe(f"{project}:t-7", LimitSignal.of(Kind.OK, observed=(no_requests,)))
    d = denied(limiter.try_reserve(ROUTE, Cost()))
    assert (d.scope, d.dimension) == (project, Dimension.REQUESTS)
    assert d.retry_after == pytest.approx(20.0, abs=TOL)
    # openai:gpt-5 itself was not touched: another project is admitted.
    assert limiter.try_reserve(Route(provider="openai", model="gpt-5", project="p2"), Cost())


def test_zero_config_only_without_limits_on_the_path(limiter: Limiter) -> None:
    project = f"{MODEL}:proj-1"
    learn = LimitSignal.of(
        Kind.OK,
        observed=(Observed(dimension=Dimension.REQUESTS, limit=6, remaining=6, window=60.0),),
    )
    limiter.observe(project, learn)  # nothing configured anywhere: learn for the scope
    assert limiter.limits_for(project) == LimitSpec(requests_per_minute=6)
    assert fill(limiter, ROUTE, Cost()) == 1  # paced: one every 10 s
    limiter.set_limits("openai:o3", minute_spec(concurrency=4))
    limiter.observe("openai:o3:proj-1", learn)
    assert limiter.limits_for("openai:o3:proj-1") is None


def test_pause_on_the_provider_scope_blocks_its_tenants(limiter: Limiter) -> None:
    project = f"{MODEL}:proj-1"
    peer(limiter).pause(project, 30.0, "429 on the project")
    d = denied(limiter.try_reserve(ROUTE, Cost()))  # ROUTE's own scope is ...:proj-1:t-7
    assert d.scope == project and ROUTE.scope == f"{project}:t-7"
    assert 30.0 - TOL <= d.retry_after <= 31.0 + TOL
    assert limiter.try_reserve(Route(provider="openai", model="gpt-5", project="p2"), Cost())
    assert limiter.try_reserve(Route(provider="openai", model="gpt-5"), Cost())


def test_small_limit_with_a_reserve_makes_lower_classes_wait_not_fail(limiter: Limiter) -> None:
    """rpm=5, burst=0.1: a capacity of one request, of which scheduled may use 0.9."""
    small = minute_spec(requests_per_minute=5, burst=0.1, reserve=0.1)
    for project, priority in (("p-s", "scheduled"), ("p-b", "background")):
        limiter.set_limits(f"{MODEL}:{project}", small)
        route = Route(provider="openai", model="gpt-5", project=project)
        assert isinstance(limiter.try_reserve(route, Cost(), priority=priority), Reservation)
        d = denied(limiter.try_reserve(route, Cost(), priority=priority))
        assert not d.never_fits  # it waits until the bucket is idle again
        assert d.retry_after == pytest.approx(12.0, abs=TOL)
        # A cost above the capacity waits for an idle bucket too; only a cost above the
        # limit itself (5 a minute) never fits.
        assert not denied(
            limiter.try_reserve(route, Cost(requests=2), priority=priority)
        ).never_fits
        big = denied(limiter.try_reserve(route, Cost(requests=6), priority=priority))
        assert big.never_fits and "limit of 5" in big.reason


def test_costs_that_change_every_call_share_one_plan(limiter: Limiter) -> None:
    """The plan is cached per (route, priority): each call's own amounts must be used."""
    limiter.set_limits(
        MODEL, minute_spec(input_tokens_per_minute=1_000, output_tokens_per_minute=600, reserve=0.1)
    )
    taken = 0
    for i in (100, 250, 50):  # 400 input tokens across three different costs
        r = limiter.try_reserve(ROUTE, Cost(input_tokens=i, output_tokens=10))
        assert isinstance(r, Reservation)
        taken += i
    # Scheduled may fill 900 of 1000: 500 more fit, 501 do not (the same plan again).
    d = denied(limiter.try_reserve(ROUTE, Cost(input_tokens=501), priority="scheduled"))
    assert (d.dimension, d.never_fits) == (Dimension.INPUT_TOKENS, False)
    assert d.retry_after == pytest.approx(1 / (1_000 / 60), abs=TOL)
    # A cost above the capacity never fits, whatever fitted before; the next one does.
    big = denied(limiter.try_reserve(ROUTE, Cost(input_tokens=1_001), priority="scheduled"))
    assert big.never_fits and "1001" in big.reason
    assert limiter.try_reserve(ROUTE, Cost(input_tokens=500), priority="scheduled")
    # Output: 30 of 600 in use; a cost past the scheduled share (540) but within the
    # capacity waits until the bucket is idle instead of never fitting.
    late = denied(limiter.try_reserve(ROUTE, Cost(output_tokens=600), priority="scheduled"))
    assert (late.dimension, late.never_fits) == (Dimension.OUTPUT_TOKENS, False)
    assert late.retry_after == pytest.approx(30 / 10, abs=TOL)


def test_settle_uses_each_reservations_own_estimate(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, minute_spec(output_tokens_per_minute=600, concurrency=2))
    a = limiter.try_reserve(ROUTE, Cost(output_tokens=400))
    b = limiter.try_reserve(ROUTE, Cost(output_tokens=150))
    assert isinstance(a, Reservation) and isinstance(b, Reservation)
    assert denied(limiter.try_reserve(ROUTE, Cost())).dimension is Dimension.CONCURRENCY
    a.settle(0, 100)  # refunds 300, returns a lease
    b.settle(0, 200)  # charges 50 more
    # 100 + 200 = 300 in use: 300 more fit now, 301 wait 0.1 s (10 per second).
    d = denied(limiter.try_reserve(ROUTE, Cost(output_tokens=301)))
    assert d.retry_after == pytest.approx(0.1, abs=TOL)
    c = limiter.try_reserve(ROUTE, Cost(output_tokens=300))
    assert isinstance(c, Reservation)
    c.release()
    c.settle(0, 0)  # already released: nothing happens
    assert limiter.try_reserve(ROUTE, Cost(output_tokens=300))
