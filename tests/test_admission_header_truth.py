"""Header truth over guesswork: resync from headers, AIMD only where no header explains a 429.

Run against both backends (the same fixture as the conformance suite).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from rateloop.admission import LimitSpec
from rateloop.admission.limiter import Limiter
from rateloop.admission.reservation import Denied, Reservation
from rateloop.admission.subscription import subscription_block
from rateloop.route import Cost, Route
from rateloop.signal import Dimension, Kind, LimitSignal, Observed
from rateloop.testing import FakeClock

MODEL = "openai:gpt-5"
ROUTE = Route(provider="openai", model="gpt-5")
TOL = 0.15


@pytest.fixture(params=["memory", "redis"])
def limiter(request: pytest.FixtureRequest) -> Iterator[Limiter]:
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        prefix = request.getfixturevalue("redis_prefix")
        lim = Limiter.from_url(url, prefix=prefix)
    else:
        lim = Limiter(clock=FakeClock())
    yield lim
    lim.close()


def wait_of(limiter: Limiter) -> float:
    d = limiter.try_reserve(ROUTE, Cost())
    assert isinstance(d, Denied), d
    return d.retry_after


def fill(limiter: Limiter) -> int:
    n = 0
    while isinstance(limiter.try_reserve(ROUTE, Cost()), Reservation):
        n += 1
    return n


def test_a_429_the_headers_explain_resyncs_instead_of_cutting(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, LimitSpec(requests_per_minute=60, burst=1.0))
    assert fill(limiter) == 60
    explained = LimitSignal.of(
        Kind.TEMPORARY,
        status=429,
        retry_after=1.0,
        observed=(Observed(dimension=Dimension.REQUESTS, remaining=0, reset_after=1.0),),
    )
    limiter.observe(MODEL, explained)
    # The state now says what the provider said (blocked 1 s); the rate is not cut:
    # the next request waits 1 s, not 1 / 0.8 s.
    assert wait_of(limiter) == pytest.approx(1.0, abs=TOL)


def test_an_unexplained_429_still_lowers_the_rate(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, LimitSpec(requests_per_minute=60, burst=1.0))
    assert fill(limiter) == 60
    limiter.observe(MODEL, LimitSignal.of(Kind.TEMPORARY, status=429))
    assert wait_of(limiter) == pytest.approx(1.25, abs=TOL)  # rate × 0.8


def test_the_429_that_taught_a_limit_does_not_cut_it(limiter: Limiter) -> None:
    taught = LimitSignal.of(
        Kind.TEMPORARY,
        status=429,
        observed=(Observed(dimension=Dimension.REQUESTS, limit=60, window=60.0),),
    )
    limiter.observe(MODEL, taught)
    assert limiter.limits_for(MODEL) == LimitSpec(requests_per_minute=60)
    assert fill(limiter) == 1  # paced: one a second
    assert wait_of(limiter) == pytest.approx(1.0, abs=TOL)  # at the full learned rate


def test_the_rate_recovers_within_seconds() -> None:
    clock = FakeClock()
    limiter = Limiter(limits={MODEL: LimitSpec(requests_per_minute=60, burst=1.0)}, clock=clock)
    assert fill(limiter) == 60
    limiter.observe(MODEL, LimitSignal.of(Kind.TEMPORARY, status=429))
    assert wait_of(limiter) == pytest.approx(1.25)
    clock.advance(4.0)  # 0.8 + 4 s × 0.05/s = 1.0
    while isinstance(limiter.try_reserve(ROUTE, Cost()), Reservation):
        pass
    assert wait_of(limiter) == pytest.approx(1.0)


def test_remaining_headers_resync_on_every_response(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, LimitSpec(requests_per_minute=600))  # paced: 10 at once
    # Another client of the same key used most of it: the provider says 3 remain.
    limiter.observe(
        MODEL, {"x-ratelimit-limit-requests": "600", "x-ratelimit-remaining-requests": "3"}
    )
    assert fill(limiter) == 3


def test_precise_server_minimum_pauses_for_what_it_says(limiter: Limiter) -> None:
    limiter.pause(ROUTE.scope, 0.055, "retry-after-ms: 55")
    d = limiter.try_reserve(ROUTE, Cost())
    assert isinstance(d, Denied)
    # 55 ms (plus a spread of at most 10 %), never rounded up to a second.
    assert 0.0 < d.retry_after <= 0.055 * 1.1 + 0.002


@pytest.mark.parametrize(
    ("headers", "block"),
    [
        ({"anthropic-ratelimit-unified-status": "allowed"}, None),
        (
            {
                "anthropic-ratelimit-unified-5h-utilization": "0.97",
                "anthropic-ratelimit-unified-5h-reset": "+600",
            },
            None,
        ),
        (
            {
                "anthropic-ratelimit-unified-5h-status": "rejected",
                "anthropic-ratelimit-unified-5h-reset": "+600",
            },
            600.0,
        ),
        (
            {
                "anthropic-ratelimit-unified-7d-utilization": "1.0",
                "anthropic-ratelimit-unified-7d-reset": "+86400",
                "anthropic-ratelimit-unified-5h-status": "allowed",
            },
            86_400.0,
        ),
        (
            {
                "Anthropic-Ratelimit-Unified-Status": "rejected",
                "Anthropic-Ratelimit-Unified-Reset": "+30",
            },
            30.0,
        ),
        ({"anthropic-ratelimit-unified-status": "rejected"}, None),  # no reset: no guess
        (
            {
                "anthropic-ratelimit-unified-5h-status": "rejected",
                "anthropic-ratelimit-unified-5h-reset": "x",
            },
            None,
        ),
    ],
)
def test_subscription_windows_block_until_their_reset(
    headers: dict[str, str], block: float | None
) -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    resolved = {
        k: (str(now.timestamp() + float(v[1:])) if v.startswith("+") else v)
        for k, v in headers.items()
    }
    assert subscription_block(resolved, now) == block


def test_an_exhausted_subscription_window_pauses_the_scope() -> None:
    clock = FakeClock()
    limiter = Limiter(clock=clock)
    route = Route(provider="anthropic", model="claude-sonnet-4")
    reset = clock.now().timestamp() + 1_800
    limiter.observe(
        route.scope,
        {
            "anthropic-ratelimit-unified-status": "rejected",
            "anthropic-ratelimit-unified-5h-status": "rejected",
            "anthropic-ratelimit-unified-5h-reset": str(reset),
        },
    )
    d = limiter.try_reserve(route, Cost())
    assert isinstance(d, Denied) and d.reason.startswith("scope paused")
    assert 1_800 <= d.retry_after <= 1_801


# -- learned limits live in the backend -------------------------------------------------


LEARN_HEADERS = {
    "x-ratelimit-limit-requests": "120",
    "x-ratelimit-remaining-requests": "120",
    "x-ratelimit-limit-tokens": "60000",
    "x-ratelimit-remaining-tokens": "60000",
}


def test_one_process_learns_and_every_process_uses_it(redis_url: str, redis_prefix: str) -> None:
    clocks = [FakeClock(), FakeClock()]
    learner, other = (Limiter.from_url(redis_url, prefix=redis_prefix, clock=c) for c in clocks)
    try:
        assert other.try_reserve(ROUTE, Cost())  # nothing known yet: unlimited
        learner.observe(MODEL, LEARN_HEADERS)
        expected = LimitSpec(requests_per_minute=120, tokens_per_minute=60_000)
        assert learner.limits_for(MODEL) == expected
        assert other.limits_for(MODEL) is None  # not read yet: at most once a second
        clocks[1].advance(1.0)
        other.try_reserve(ROUTE, Cost())  # the refresh is due: it reads, then admits
        assert other.limits_for(MODEL) == expected
        # Both now admit against the same shared, paced bucket: 2 a second in all.
        granted = [bool(lim.try_reserve(ROUTE, Cost())) for lim in (learner, other) * 3]
        assert sum(granted) <= 2
    finally:
        learner.close()
        other.close()


def test_configured_limits_are_never_replaced_by_learned_ones(
    redis_url: str, redis_prefix: str
) -> None:
    configured = Limiter.from_url(
        redis_url,
        prefix=redis_prefix,
        limits={MODEL: LimitSpec(requests_per_minute=10)},
        clock=FakeClock(),
    )
    learner = Limiter.from_url(redis_url, prefix=redis_prefix, clock=FakeClock())
    try:
        learner.observe(MODEL, LEARN_HEADERS)
        configured.try_reserve(ROUTE, Cost())
        assert configured.limits_for(MODEL) == LimitSpec(requests_per_minute=10)
    finally:
        configured.close()
        learner.close()


def test_learned_limits_are_shared_through_one_memory_backend_too() -> None:
    """In one process the limiter itself holds them: no backend read on the hot path."""
    clock = FakeClock()
    limiter = Limiter(clock=clock)
    limiter.observe(MODEL, LEARN_HEADERS)
    assert limiter.limits_for(MODEL) == LimitSpec(requests_per_minute=120, tokens_per_minute=60_000)


# -- refused again after waiting: the block stretches -----------------------------------


def _refusal(reset: float) -> LimitSignal:
    return LimitSignal.of(
        Kind.TEMPORARY,
        status=429,
        retry_after=reset,
        observed=(Observed(dimension=Dimension.REQUESTS, remaining=0, reset_after=reset),),
    )


def _zero_config(clock: FakeClock) -> Limiter:
    lim = Limiter(clock=clock, rng=random.Random(7))
    lim.observe(MODEL, {"x-ratelimit-limit-requests": "60"})  # learned: 60 RPM, paced
    assert lim.limits_for(MODEL) == LimitSpec(requests_per_minute=60)
    return lim


def test_refused_again_after_waiting_stretches_the_block() -> None:
    """Zero-config processes share no limiter: they wait out the same blocks and return
    together; each refused request spends a slot, so nobody is served.  A 429 after the
    block was waited out doubles it (×2, ×4 ... ×16, up to half again at random)."""
    clock = FakeClock()
    lim = _zero_config(clock)
    lim.observe(MODEL, _refusal(1.0))
    assert wait_of(lim) == pytest.approx(1.0, abs=0.01)  # the first: as stated
    clock.advance(0.5)
    lim.observe(MODEL, _refusal(1.0))  # in flight before the block began: no new evidence
    assert wait_of(lim) == pytest.approx(1.0, abs=0.01)  # the new statement, not stretched
    clock.advance(1.1)
    # A 429 that states no block is no evidence of waiting one out: it does not count
    # (if it did, the next stretch would be ×4, not ×2).
    lim.observe(MODEL, LimitSignal.of(Kind.TEMPORARY, status=429))
    clock.advance(2.0)  # waited out; refused again
    lim.observe(MODEL, _refusal(1.0))
    second = wait_of(lim)
    assert 2.0 - 0.01 <= second <= 3.0 + 0.01
    clock.advance(second + 0.1)
    lim.observe(MODEL, _refusal(1.0))
    assert 4.0 - 0.01 <= wait_of(lim) <= 6.0 + 0.01
    # An answer ends the streak: the next refusal is taken as stated again.
    clock.advance(10.0)
    lim.observe(MODEL, LimitSignal.of(Kind.OK, status=200))
    lim.observe(MODEL, _refusal(1.0))
    assert wait_of(lim) == pytest.approx(1.0, abs=0.01)
    lim.close()


def test_configured_scopes_are_not_stretched() -> None:
    clock = FakeClock()
    lim = Limiter(clock=clock, rng=random.Random(7))
    lim.set_limits(MODEL, LimitSpec(requests_per_minute=60, burst=1.0))
    for _ in range(4):
        lim.observe(MODEL, _refusal(1.0))
        assert wait_of(lim) == pytest.approx(1.0, abs=0.01)
        clock.advance(1.1)
    lim.close()


def test_a_long_block_is_stretched_by_a_minute_at_most() -> None:
    clock = FakeClock()
    lim = _zero_config(clock)
    lim.observe(MODEL, _refusal(30.0))
    clock.advance(30.1)
    lim.observe(MODEL, _refusal(30.0))
    assert 60.0 - 0.01 <= wait_of(lim) <= 90.0 + 0.01  # ×2..×3, never 30 s + more than 60 s
    lim.close()


def test_the_stretch_is_capped_and_forgotten_after_a_quiet_minute() -> None:
    from rateloop.admission.learning import STREAK_CAP, Streaks

    streaks = Streaks()
    now, factors = 0.0, []
    for _ in range(8):
        factor = streaks.observe("s", ok=False, refused=True, wait=1.0, now=now,
                                 draw=lambda: 1.0)
        factors.append(factor)
        now += factor + 0.01  # waited out each time
    assert factors == [1.0, 3.0, 6.0, 12.0, 24.0, 24.0, 24.0, 24.0]  # ×2^(n-1), cap 16, ×1.5
    assert STREAK_CAP == 16.0
    # Not a refusal (an overload, a server error): no change.
    assert streaks.observe("s", ok=False, refused=False, wait=1.0, now=now, draw=lambda: 0.0) == 1
    # A minute after the last block ended the streak starts again.
    assert streaks.observe("s", ok=False, refused=True, wait=1.0, now=now + 61,
                           draw=lambda: 0.0) == 1.0
