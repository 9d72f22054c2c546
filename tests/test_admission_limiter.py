"""The Limiter on the memory backend, on virtual time (FakeClock): waits, deadlines, settling."""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta
from typing import Any

import pytest

from rateloop.admission.backends.memory import MemoryBackend
from rateloop.admission.gcra import AIMD
from rateloop.admission.limiter import Limiter
from rateloop.admission.plan import Priority
from rateloop.admission.reservation import (
    AdmissionRejected,
    AdmissionTimeout,
    Denied,
    Reservation,
)
from rateloop.admission.spec import LimitSpec
from rateloop.route import Cost, Route
from rateloop.signal import Dimension
from rateloop.testing import FakeClock


def minute_spec(**fields: Any) -> LimitSpec:
    """A LimitSpec holding a whole minute (``burst = 1``), refunding unused output.

    These tests check the arithmetic; the default pacing (one second of the
    rate) and the providers' accounting profiles have their own tests.
    """
    return LimitSpec(**{"burst": 1.0, "profile": "generic", **fields})


ROUTE = Route(provider="openai", model="gpt-5", project="proj-1", tenant="t-7")


def make(clock: FakeClock, **limits: LimitSpec) -> Limiter:
    return Limiter(limits=limits, clock=clock, rng=random.Random(7))


def test_requests_per_minute_refill_continuously(clock: FakeClock) -> None:
    limiter = make(clock, **{"openai:gpt-5": minute_spec(requests_per_minute=60)})
    for _ in range(60):
        assert isinstance(limiter.try_reserve(ROUTE, Cost()), Reservation)
    denied = limiter.try_reserve(ROUTE, Cost())
    assert isinstance(denied, Denied)
    assert not denied
    assert denied.dimension is Dimension.REQUESTS
    assert denied.scope == "openai:gpt-5"
    assert denied.retry_after == pytest.approx(1.0)
    clock.advance(0.5)
    again = limiter.try_reserve(ROUTE, Cost())
    assert isinstance(again, Denied)
    assert again.retry_after == pytest.approx(0.5)
    clock.advance(0.5)
    assert isinstance(limiter.try_reserve(ROUTE, Cost()), Reservation)


def test_reserve_waits_on_the_clock_until_every_dimension_fits(clock: FakeClock) -> None:
    limiter = make(
        clock,
        **{"openai:gpt-5": minute_spec(requests_per_minute=600, input_tokens_per_minute=6_000)},
    )
    cost = Cost(input_tokens=3_000)
    limiter.reserve(ROUTE, cost)
    limiter.reserve(ROUTE, cost)
    limiter.reserve(ROUTE, cost)
    # 3000 tokens refill at 100/s: 30 s.
    assert clock.sleeps == [pytest.approx(30.0)]


def test_reserve_raises_admission_timeout_without_waiting_past_the_deadline(
    clock: FakeClock,
) -> None:
    limiter = make(clock, **{"openai:gpt-5": minute_spec(requests_per_minute=6)})
    for _ in range(6):
        limiter.reserve(ROUTE, Cost())
    with pytest.raises(AdmissionTimeout) as info:
        limiter.reserve(ROUTE, Cost(), deadline=5.0)
    err = info.value
    assert clock.sleeps == []
    assert err.retry_after == pytest.approx(10.0)
    assert err.retry_at == clock.now() + timedelta(seconds=err.retry_after)
    assert err.status == "waiting_for_capacity"


def test_cost_larger_than_the_limit_never_fits(clock: FakeClock) -> None:
    limiter = make(clock, **{"openai:gpt-5": minute_spec(input_tokens_per_minute=1_000, burst=0.5)})
    denied = limiter.try_reserve(ROUTE, Cost(input_tokens=1_001))
    assert isinstance(denied, Denied)
    assert denied.never_fits and "limit of 1000" in denied.reason
    assert denied.dimension is Dimension.INPUT_TOKENS
    with pytest.raises(AdmissionRejected):
        limiter.reserve(ROUTE, Cost(input_tokens=1_001))


def test_cost_larger_than_the_burst_waits_for_an_idle_bucket(clock: FakeClock) -> None:
    """As a provider admits a big request from a full bucket: slow, not impossible."""
    limiter = make(clock, **{"openai:gpt-5": minute_spec(input_tokens_per_minute=1_000, burst=0.5)})
    first = limiter.try_reserve(ROUTE, Cost(input_tokens=100))
    assert isinstance(first, Reservation)
    big = limiter.try_reserve(ROUTE, Cost(input_tokens=900))  # > the 500 burst
    assert isinstance(big, Denied) and not big.never_fits
    assert big.retry_after == pytest.approx(100 / (1_000 / 60))  # until the bucket is idle
    clock.advance(big.retry_after)
    assert isinstance(limiter.try_reserve(ROUTE, Cost(input_tokens=900)), Reservation)
    # It left the bucket in debt: 900 drain before even a small call fits again.
    small = limiter.try_reserve(ROUTE, Cost(input_tokens=1))
    assert isinstance(small, Denied)
    assert small.retry_after == pytest.approx((900 + 1 - 500) / (1_000 / 60))


def test_admission_is_atomic_across_scopes(clock: FakeClock) -> None:
    limiter = make(
        clock,
        **{
            "openai:gpt-5": minute_spec(requests_per_minute=100),
            "openai:gpt-5:proj-1:t-7": minute_spec(requests_per_minute=1),
        },
    )
    assert limiter.try_reserve(ROUTE, Cost())
    denied = limiter.try_reserve(ROUTE, Cost())
    assert isinstance(denied, Denied)
    assert denied.scope == "openai:gpt-5:proj-1:t-7"
    other = Route(provider="openai", model="gpt-5", project="proj-1", tenant="t-8")
    # The denied tenant took nothing from the shared model scope: 99 remain.
    for _ in range(99):
        assert limiter.try_reserve(other, Cost())
    assert not limiter.try_reserve(other, Cost())


def test_settle_refunds_unused_tokens_and_charges_overuse(clock: FakeClock) -> None:
    limiter = make(clock, **{"openai:gpt-5": minute_spec(output_tokens_per_minute=1_000)})
    first = limiter.try_reserve(ROUTE, Cost(output_tokens=800))
    assert isinstance(first, Reservation)
    assert not limiter.try_reserve(ROUTE, Cost(output_tokens=800))
    first.settle(100, 200)  # 600 of the 800 come back
    first.settle(100, 999)  # idempotent: no-op
    assert limiter.try_reserve(ROUTE, Cost(output_tokens=800))
    # now 1000 used; a call that overran its estimate by 500 puts the bucket in debt
    clock.advance(60)
    over = limiter.try_reserve(ROUTE, Cost(output_tokens=500))
    assert isinstance(over, Reservation)
    over.settle(0, 1_000)
    denied = limiter.try_reserve(ROUTE, Cost(output_tokens=100))
    assert isinstance(denied, Denied)
    assert denied.retry_after == pytest.approx(6.0)  # 100 over at 1000/60 per second


def test_release_returns_tokens_but_keeps_the_request(clock: FakeClock) -> None:
    limiter = make(
        clock,
        **{"openai:gpt-5": minute_spec(requests_per_minute=2, tokens_per_minute=1_000)},
    )
    r = limiter.try_reserve(ROUTE, Cost(input_tokens=900))
    assert isinstance(r, Reservation)
    r.release()
    r.release()
    assert limiter.try_reserve(ROUTE, Cost(input_tokens=900))
    denied = limiter.try_reserve(ROUTE, Cost())
    assert isinstance(denied, Denied)
    assert denied.dimension is Dimension.REQUESTS


def test_concurrency_leases_are_released_and_expire(clock: FakeClock) -> None:
    limiter = make(clock, **{"openai:gpt-5": minute_spec(concurrency=2, lease_ttl_secs=30)})
    a = limiter.try_reserve(ROUTE, Cost())
    b = limiter.try_reserve(ROUTE, Cost())
    assert isinstance(a, Reservation) and isinstance(b, Reservation)
    denied = limiter.try_reserve(ROUTE, Cost())
    assert isinstance(denied, Denied)
    assert denied.dimension is Dimension.CONCURRENCY
    with a:
        pass  # leaving the block settles and frees the lease
    assert a.done
    assert limiter.try_reserve(ROUTE, Cost())
    # b's holder "crashed": its lease expires after the TTL.
    clock.advance(30.001)
    assert limiter.try_reserve(ROUTE, Cost())


def test_expired_leases_are_swept_when_the_slots_fill(clock: FakeClock) -> None:
    """Memory backend: leases are scanned only when the held ones fill the slots.

    Holders that never settle (crashed) leave their leases behind; each one
    stops counting at its expiry, and the backend keeps no more of them than
    the slots plus those granted since the last sweep.
    """
    limiter = make(clock, **{"openai:gpt-5": minute_spec(concurrency=3, lease_ttl_secs=10)})
    granted = 0
    for _ in range(60):
        r = limiter.try_reserve(ROUTE, Cost())
        if isinstance(r, Reservation):
            granted += 1  # never settled: only its expiry frees the slot
        else:
            assert r.dimension is Dimension.CONCURRENCY
            assert 0 < r.retry_after <= 0.05
        clock.advance(1.0)
        backend = limiter.backend
        assert isinstance(backend, MemoryBackend)
        assert len(backend._scopes["openai:gpt-5"].leases) <= 3
    # 3 slots, each lease lives 10 s: 3 grants per 10 s (every grant at an expiry).
    assert 3 * 60 // 10 - 3 <= granted <= 3 * 60 // 10 + 3


def test_priority_given_as_str_or_enum_admits_the_same(clock: FakeClock) -> None:
    limiter = make(
        clock, **{"openai:gpt-5": minute_spec(requests_per_minute=10, burst=1.0, reserve=0.1)}
    )
    cost = Cost()
    for priority in ("background", Priority.BACKGROUND) * 4:  # the same call, twice as fast
        assert limiter.try_reserve(ROUTE, cost, priority=priority)
    # background may fill 80 % of 10: the 9th is refused, whichever spelling.
    assert not limiter.try_reserve(ROUTE, cost, priority="background")
    assert not limiter.try_reserve(ROUTE, cost, priority=Priority.BACKGROUND)
    assert limiter.try_reserve(ROUTE, cost, priority="scheduled")
    with pytest.raises(ValueError, match="urgent"):
        limiter.try_reserve(ROUTE, cost, priority="urgent")


def test_fixed_day_window_resets_at_the_configured_utc_time() -> None:
    from datetime import UTC, datetime

    clock = FakeClock(datetime(2026, 1, 1, 5, 0, tzinfo=UTC))
    limiter = make(
        clock, **{"openai:gpt-5": minute_spec(requests_per_day=2, day_resets_at="06:00")}
    )
    assert limiter.try_reserve(ROUTE, Cost())
    assert limiter.try_reserve(ROUTE, Cost())
    denied = limiter.try_reserve(ROUTE, Cost())
    assert isinstance(denied, Denied)
    assert denied.dimension is Dimension.REQUESTS_PER_DAY
    assert denied.retry_after == pytest.approx(3600.0)
    clock.advance(3600)
    assert limiter.try_reserve(ROUTE, Cost())


def test_async_twins_share_the_flow(clock: FakeClock) -> None:
    limiter = make(clock, **{"openai:gpt-5": minute_spec(requests_per_minute=60, concurrency=5)})

    async def main() -> None:
        held = [await limiter.areserve(ROUTE, Cost()) for _ in range(5)]
        denied = await limiter.atry_reserve(ROUTE, Cost())
        assert isinstance(denied, Denied)
        await held[0].asettle(0, 0)
        async with await limiter.areserve(ROUTE, Cost()):
            pass
        await held[1].arelease()

    asyncio.run(main())


def test_unlimited_route_is_admitted(clock: FakeClock) -> None:
    limiter = make(clock)
    r = limiter.try_reserve(ROUTE, Cost(input_tokens=10**9))
    assert isinstance(r, Reservation)
    r.settle(1, 1)


def test_memory_backend_is_safe_across_threads(clock: FakeClock) -> None:
    import threading

    limiter = make(clock, **{"openai:gpt-5": minute_spec(requests_per_minute=500, concurrency=300)})
    granted: list[Reservation] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(200):
            r = limiter.try_reserve(ROUTE, Cost())
            if isinstance(r, Reservation):
                with lock:
                    granted.append(r)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(granted) == 300  # concurrency binds before the 500 requests
    assert len({r.lease_id for r in granted}) == 300


def test_pause_until_a_datetime_and_reserve_wakes_with_a_spread(clock: FakeClock) -> None:
    limiter = make(clock, **{"openai:gpt-5": minute_spec(requests_per_minute=60)})
    limiter.pause("openai:gpt-5:proj-1", clock.now() + timedelta(seconds=20), "429 from provider")
    r = limiter.reserve(ROUTE, Cost())
    assert isinstance(r, Reservation)
    assert len(clock.sleeps) == 1
    assert 20.0 < clock.sleeps[0] <= 21.0  # up to 10 % (at most 1 s) later
    with pytest.raises(ValueError, match="timezone-aware"):
        limiter.pause("openai:gpt-5", clock.now().replace(tzinfo=None), "naive")
    with pytest.raises(TypeError, match="datetime or seconds"):
        limiter.pause("openai:gpt-5", "soon", "bad")  # type: ignore[arg-type]
    limiter.pause("openai:gpt-5", -5, "in the past: nothing to do")
    assert limiter.try_reserve(ROUTE, Cost())


def test_rate_lowered_by_a_429_recovers_additively(clock: FakeClock) -> None:
    limiter = Limiter(
        limits={"openai:gpt-5": minute_spec(requests_per_minute=60)},
        clock=clock,
        aimd=AIMD(recover_per_minute=0.1),  # slow, to see the additive increase
    )
    from rateloop.signal import Kind, LimitSignal

    limiter.observe("openai:gpt-5", LimitSignal.of(Kind.TEMPORARY, status=429))
    for _ in range(60):
        assert limiter.try_reserve(ROUTE, Cost())
    d = limiter.try_reserve(ROUTE, Cost())
    assert isinstance(d, Denied)
    assert d.retry_after == pytest.approx(1 / 0.8)
    clock.advance(2.5)  # past the cooldown: a second 429 lowers it again
    limiter.observe("openai:gpt-5", LimitSignal.of(Kind.TEMPORARY, status=429))
    clock.advance(60.0)  # +0.1 per minute
    while limiter.try_reserve(ROUTE, Cost()):
        pass
    d = limiter.try_reserve(ROUTE, Cost())
    assert isinstance(d, Denied)
    waited = d.retry_after
    clock.advance(waited)  # now exactly one fits, and then the bucket is full
    assert limiter.try_reserve(ROUTE, Cost())
    d = limiter.try_reserve(ROUTE, Cost())
    assert isinstance(d, Denied)
    # ×0.8 of (0.8 recovered for 2.5 s), then recovering for 60 s + waited at +0.1/min
    factor = (0.8 + 2.5 * 0.1 / 60) * 0.8 + (60.0 + waited) * 0.1 / 60
    assert d.retry_after == pytest.approx(1 / factor, rel=1e-3)


def test_settle_rejects_bad_usage(clock: FakeClock) -> None:
    limiter = make(clock, **{"openai:gpt-5": minute_spec(tokens_per_minute=100)})
    r = limiter.try_reserve(ROUTE, Cost(input_tokens=10))
    assert isinstance(r, Reservation)
    with pytest.raises(ValueError, match="input_tokens must be an int >= 0, got -1"):
        r.settle(-1, 0)
    assert not r.done
    r.settle(10, 0)
    assert r.done
    assert "done" in repr(r)


def test_set_limits_takes_effect_for_the_next_call(clock: FakeClock) -> None:
    limiter = make(clock, **{"openai:gpt-5": minute_spec(requests_per_minute=1)})
    assert limiter.try_reserve(ROUTE, Cost())
    assert not limiter.try_reserve(ROUTE, Cost())
    limiter.set_limits("openai:gpt-5", None)
    assert limiter.try_reserve(ROUTE, Cost())
    with pytest.raises(ValueError, match="non-empty"):
        limiter.set_limits("", minute_spec())
    assert "memory://" in repr(limiter)


# -- zero-config learns only limits whose window is known --------------------------------


@pytest.mark.parametrize(
    ("headers", "learned"),
    [
        # OpenAI: per minute.
        (
            {"x-ratelimit-limit-requests": "500", "x-ratelimit-limit-tokens": "30000"},
            LimitSpec(requests_per_minute=500, tokens_per_minute=30_000),
        ),
        # Groq: the same header names, but requests per DAY (tokens per minute).
        (
            {
                "x-groq-region": "us-west-1",
                "x-ratelimit-limit-requests": "14400",
                "x-ratelimit-limit-tokens": "6000",
            },
            LimitSpec(requests_per_day=14_400, tokens_per_minute=6_000),
        ),
        # GitHub: 60 per HOUR -- not a per-minute limit; nothing learned.
        ({"x-github-request-id": "A:B", "x-ratelimit-limit": "60"}, None),
        # IETF policies: w=3600 ignored, w=60 learned, w=86400 of requests per day.
        ({"ratelimit-policy": '"hourly";q=1000;w=3600'}, None),
        ({"ratelimit-policy": '"m";q=100;w=60'}, LimitSpec(requests_per_minute=100)),
        ({"ratelimit-policy": '"d";q=5000;w=86400'}, LimitSpec(requests_per_day=5_000)),
        # A single x-ratelimit-limit without a known provider: window unknown.
        ({"x-ratelimit-limit": "20"}, None),
    ],
)
def test_zero_config_learns_only_known_windows(
    clock: FakeClock, headers: dict[str, str], learned: LimitSpec | None
) -> None:
    limiter = make(clock)
    limiter.observe("p:m", headers)
    assert limiter.limits_for("p:m") == learned


def test_groq_daily_remaining_tightens_requests_per_day(clock: FakeClock) -> None:
    limiter = make(clock)
    limiter.observe(
        "groq:llama",
        {
            "x-groq-region": "us-west-1",
            "x-ratelimit-limit-requests": "14400",
            "x-ratelimit-remaining-requests": "2",
        },
    )
    route = Route(provider="groq", model="llama")
    assert isinstance(limiter.try_reserve(route, Cost()), Reservation)
    assert isinstance(limiter.try_reserve(route, Cost()), Reservation)
    denied = limiter.try_reserve(route, Cost())
    assert isinstance(denied, Denied)
    assert denied.dimension is Dimension.REQUESTS_PER_DAY


def test_reserve_takes_a_datetime_deadline_too(clock: FakeClock) -> None:
    limiter = Limiter(limits={ROUTE.scope: minute_spec(requests_per_minute=1)}, clock=clock)
    limiter.try_reserve(ROUTE, Cost())
    with pytest.raises(AdmissionTimeout):
        limiter.reserve(ROUTE, Cost(), deadline=clock.now() + timedelta(seconds=5))
    assert clock.sleeps == []
    granted = limiter.reserve(ROUTE, Cost(), deadline=clock.now() + timedelta(seconds=90))
    assert granted and clock.sleeps and clock.sleeps[0] <= 61
    with pytest.raises(ValueError, match="seconds from now"):
        limiter.reserve(ROUTE, Cost(), deadline="soon")  # type: ignore[arg-type]
