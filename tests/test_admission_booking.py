"""Booking a start ahead (``try_reserve(..., book_within=...)``), on every backend.

Part of the conformance suite (its own module to keep modules small): the same
tests against memory:// (a FakeClock) and redis:// (the server's TIME, so
waits are asserted within ``TOL``).  A booked reservation is granted now with
``starts_in`` seconds to wait; the buckets are charged at once, so callers
queue first come first served instead of polling.
"""

from __future__ import annotations

import asyncio

import pytest

import _limiters
from rateloop.admission.backends.memory import MemoryBackend
from rateloop.admission.limiter import MIN_RETRY_AFTER, Limiter
from rateloop.admission.reservation import Denied, Reservation
from rateloop.admission.spec import LimitSpec
from rateloop.route import Cost, Route
from rateloop.signal import Dimension
from rateloop.testing import FakeClock

limiter = _limiters.limiter  # the memory / Redis fixture, shared by the conformance suites

MODEL = "openai:gpt-5"
ROUTE = Route(provider="openai", model="gpt-5", project="proj-1")
TOL = 0.15  # seconds: Redis time moves between two calls of one test




def spec(**fields: object) -> LimitSpec:
    return LimitSpec(**{"profile": "generic", **fields})  # type: ignore[arg-type]


def granted(result: Reservation | Denied) -> Reservation:
    assert isinstance(result, Reservation), result
    return result


def denied(result: Reservation | Denied) -> Denied:
    assert isinstance(result, Denied), result
    return result


def test_bookings_queue_first_come_first_served(limiter: Limiter) -> None:
    # 60 RPM holding one request: one now, then one a second.
    limiter.set_limits(MODEL, spec(requests_per_minute=60, burst=1 / 60))
    assert granted(limiter.try_reserve(ROUTE, Cost(), book_within=5)).starts_in == 0.0
    starts = [
        granted(limiter.try_reserve(ROUTE, Cost(), book_within=5)).starts_in for _ in range(5)
    ]
    for i, start in enumerate(starts, 1):
        assert start == pytest.approx(float(i), abs=TOL)
    assert starts == sorted(starts)
    # The sixth would start 6 s ahead: beyond book_within, so a denial saying so.
    d = denied(limiter.try_reserve(ROUTE, Cost(), book_within=5))
    assert (d.dimension, d.never_fits) == (Dimension.REQUESTS, False)
    assert d.retry_after == pytest.approx(6.0, abs=TOL)
    # Without book_within nothing is booked (today's behaviour).
    assert denied(limiter.try_reserve(ROUTE, Cost())).retry_after == pytest.approx(6.0, abs=TOL)
    if isinstance(limiter.backend, MemoryBackend):
        assert starts == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_tokens_are_booked_too_and_zero_books_nothing(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, spec(tokens_per_minute=600, burst=1 / 60))  # 10 tokens/s
    granted(limiter.try_reserve(ROUTE, Cost(input_tokens=10)))
    r = granted(limiter.try_reserve(ROUTE, Cost(input_tokens=5), book_within=1))
    assert r.starts_in == pytest.approx(0.5, abs=TOL)
    assert denied(limiter.try_reserve(ROUTE, Cost(input_tokens=5), book_within=0)).retry_after > 0


def test_concurrency_day_quota_and_pause_are_never_booked(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, spec(concurrency=1))
    held = granted(limiter.try_reserve(ROUTE, Cost(), book_within=60))
    d = denied(limiter.try_reserve(ROUTE, Cost(), book_within=60))
    assert d.dimension is Dimension.CONCURRENCY
    held.release()

    limiter.set_limits(MODEL, spec(requests_per_day=1))
    granted(limiter.try_reserve(ROUTE, Cost(), book_within=60))
    d = denied(limiter.try_reserve(ROUTE, Cost(), book_within=86_400))
    assert d.dimension is Dimension.REQUESTS_PER_DAY

    limiter.set_limits(MODEL, spec(requests_per_minute=600))
    limiter.pause(MODEL, 2.0, "test pause")
    d = denied(limiter.try_reserve(ROUTE, Cost(), book_within=60))
    assert "paused" in d.reason


def test_a_lower_class_never_books_into_a_higher_ones_reserve(limiter: Limiter) -> None:
    # 10 requests of burst; background may fill 8, interactive keeps 2 for itself.
    limiter.set_limits(MODEL, spec(requests_per_minute=60, burst=10 / 60, reserve=0.1))
    for _ in range(8):
        assert granted(limiter.try_reserve(ROUTE, Cost(), priority="background")).starts_in == 0
    d = denied(limiter.try_reserve(ROUTE, Cost(), priority="background", book_within=60))
    assert d.dimension is Dimension.REQUESTS
    # The reserve is intact: interactive goes now, twice, then books behind it.
    for _ in range(2):
        assert granted(limiter.try_reserve(ROUTE, Cost(), book_within=60)).starts_in == 0
    later = granted(limiter.try_reserve(ROUTE, Cost(), book_within=60))
    assert later.starts_in == pytest.approx(1.0, abs=TOL)


def test_release_and_settle_of_a_booking_refund_its_tokens(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, spec(input_tokens_per_minute=60, burst=10 / 60))  # 1/s, 10
    granted(limiter.try_reserve(ROUTE, Cost(input_tokens=10)))
    first = granted(limiter.try_reserve(ROUTE, Cost(input_tokens=10), book_within=60))
    assert first.starts_in == pytest.approx(10.0, abs=TOL)
    first.release()  # every token back: the next booking takes its place
    second = granted(limiter.try_reserve(ROUTE, Cost(input_tokens=10), book_within=60))
    assert second.starts_in == pytest.approx(10.0, abs=TOL)
    second.settle(4, 0)  # used 4 of 10: 6 back, so the next starts 4 s after it
    third = granted(limiter.try_reserve(ROUTE, Cost(input_tokens=10), book_within=60))
    assert third.starts_in == pytest.approx(14.0, abs=TOL)


def test_async_booking(limiter: Limiter) -> None:
    limiter.set_limits(MODEL, spec(requests_per_minute=60, burst=1 / 60))

    async def main() -> list[float]:
        out = []
        for _ in range(3):
            r = await limiter.atry_reserve(ROUTE, Cost(), book_within=10)
            out.append(granted(r).starts_in)
        await limiter.aclose()  # its async connections belong to this event loop
        return out

    starts = asyncio.run(main())
    assert starts == pytest.approx([0.0, 1.0, 2.0], abs=TOL)


def test_bad_book_within_is_refused(clock: FakeClock) -> None:
    limiter = Limiter(limits={MODEL: spec(requests_per_minute=60)}, clock=clock)
    for bad in (-1.0, float("nan"), "5", True):
        with pytest.raises(ValueError, match="book_within"):
            limiter.try_reserve(ROUTE, Cost(), book_within=bad)  # type: ignore[arg-type]


def test_denial_waits_at_least_a_millisecond(clock: FakeClock) -> None:
    limiter = Limiter(limits={MODEL: spec(requests_per_minute=60, burst=1 / 60)}, clock=clock)
    granted(limiter.try_reserve(ROUTE, Cost()))
    clock.advance(1.0 - 1e-12)  # a level a rounding error above its allowance
    assert denied(limiter.try_reserve(ROUTE, Cost())).retry_after == MIN_RETRY_AFTER


def test_reserve_books_and_sleeps_exactly_until_its_start(clock: FakeClock) -> None:
    backend = MemoryBackend(clock)
    calls: list[object] = []
    execute = backend.execute

    def counting(op: object, *, timeout: float | None = None) -> object:
        calls.append(op)
        return execute(op, timeout=timeout)

    backend.execute = counting  # type: ignore[method-assign]
    limiter = Limiter(
        backend, limits={MODEL: spec(requests_per_minute=60, burst=1 / 60)}, clock=clock
    )
    for _ in range(4):
        limiter.reserve(ROUTE, Cost(), deadline=10)
    assert clock.sleeps == [1.0, 1.0, 1.0]  # one booked sleep each, no polling
    assert len(calls) == 4  # one admission per reservation
    # A start beyond the deadline is not booked: the reserve gives up at once.
    from rateloop.admission.reservation import AdmissionTimeout

    limiter.try_reserve(ROUTE, Cost(), book_within=5)  # books the next 1 s
    with pytest.raises(AdmissionTimeout):
        limiter.reserve(ROUTE, Cost(), deadline=1.5)


def test_every_bucket_of_a_booking_is_charged_at_its_start(limiter: Limiter) -> None:
    # 1 request a second (burst 1) and 10 tokens a second (burst 10).
    limiter.set_limits(MODEL, spec(requests_per_minute=60, tokens_per_minute=600, burst=1 / 60))
    granted(limiter.try_reserve(ROUTE, Cost(input_tokens=10)))
    # Waits 1 s for the tokens (a big call goes from an idle bucket).
    big = granted(limiter.try_reserve(ROUTE, Cost(input_tokens=30), book_within=60))
    # Its request is charged at its start (1 s), not now: the next request slot is at
    # 2 s, and the tokens at 1 + (30 + 1 - 10) / 10 = 3.1 s.
    small = granted(limiter.try_reserve(ROUTE, Cost(input_tokens=1), book_within=60))
    # Then the requests bind: one second after 3.1.
    empty = granted(limiter.try_reserve(ROUTE, Cost(), book_within=60))
    starts = [big.starts_in, small.starts_in, empty.starts_in]
    assert starts == pytest.approx([1.0, 3.1, 4.1], abs=TOL)
