"""Property tests: the bucket arithmetic never admits more than its limit in any window.

The bound (see rateloop/admission/gcra.py): a bucket of ``capacity`` units
refilled at ``rate`` units/s admits at most ``capacity + rate × W`` units in
any closed window of length ``W``.
"""

from __future__ import annotations

import heapq
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from rateloop.admission.gcra import bucket_fit, bucket_wait, day_window, drained, pause_spread
from rateloop.admission.limiter import Limiter
from rateloop.admission.reservation import Denied, Reservation
from rateloop.admission.spec import LimitSpec
from rateloop.route import Cost, Route
from rateloop.testing import FakeClock

EPS = 1e-6

attempts = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=5.0, allow_nan=False),  # seconds since last attempt
        st.integers(min_value=0, max_value=40),  # units asked for
    ),
    min_size=1,
    max_size=150,
)


def worst_window_excess(grants: list[tuple[float, float]], capacity: float, rate: float) -> float:
    """max over windows [t_i, t_j] of (units granted in it) - (capacity + rate × length)."""
    worst = -float("inf")
    for i, (start, _) in enumerate(grants):
        total = 0.0
        for end, units in grants[i:]:
            total += units
            worst = max(worst, total - (capacity + rate * (end - start)))
    return worst


@settings(max_examples=300, deadline=None)
@given(
    attempts=attempts,
    capacity=st.integers(min_value=1, max_value=60),
    per_minute=st.integers(min_value=1, max_value=600),
)
def test_bucket_never_admits_more_than_its_bound(
    attempts: list[tuple[float, int]], capacity: int, per_minute: int
) -> None:
    rate = per_minute / 60.0
    level, ts, now = 0.0, 0.0, 0.0
    grants: list[tuple[float, float]] = []
    for dt, amount in attempts:
        now += dt
        current = drained(level, ts, now, rate)
        wait = bucket_wait(current, amount, capacity, rate)
        if wait == 0.0:
            level, ts = current + amount, now
            grants.append((now, amount))
        elif amount <= capacity:
            # The wait is exact: at now + wait it fits, a little earlier it does not.
            later = drained(level, ts, now + wait, rate)
            assert bucket_wait(later, amount, capacity, rate) <= EPS
            if wait > 1e-3:
                sooner = drained(level, ts, now + wait - 1e-3, rate)
                assert bucket_wait(sooner, amount, capacity, rate) > 0
    assert worst_window_excess(grants, capacity, rate) <= EPS


finite = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)


@given(
    level=finite,
    ts=finite,
    now=finite,
    rate=st.floats(min_value=1e-6, max_value=1e6, allow_nan=False),
    amount=st.floats(min_value=0.0, max_value=1e4, allow_nan=False),
    allowed=finite,
)
def test_bucket_fit_is_drained_then_bucket_wait(
    level: float, ts: float, now: float, rate: float, amount: float, allowed: float
) -> None:
    """The memory backend's fused hot-path call is exactly the two functions it replaces."""
    current = drained(level, ts, now, rate)
    assert bucket_fit(level, ts, now, rate, amount, allowed) == (
        current,
        bucket_wait(current, amount, allowed, rate),
    )


@settings(max_examples=100, deadline=None)
@given(
    attempts=attempts,
    per_minute=st.integers(min_value=1, max_value=600),
    burst=st.sampled_from([0.1, 0.5, 1.0]),
    settle_fraction=st.sampled_from([1.0, 0.5, 0.0]),
)
def test_limiter_memory_backend_respects_the_bound(
    attempts: list[tuple[float, int]], per_minute: int, burst: float, settle_fraction: float
) -> None:
    """The real Limiter path; settled usage (net of refunds) stays within the bound."""
    clock = FakeClock()
    limiter = Limiter(
        limits={"p:m": LimitSpec(tokens_per_minute=per_minute, burst=burst)}, clock=clock
    )
    route = Route(provider="p", model="m")
    capacity = max(burst * per_minute, 1.0)
    grants: list[tuple[float, float]] = []
    for dt, amount in attempts:
        clock.advance(dt)
        r = limiter.try_reserve(route, Cost(input_tokens=amount))
        if isinstance(r, Denied):
            # Only a cost above the limit itself never fits; one above the burst waits
            # for an idle bucket and then goes.
            assert r.never_fits == (amount > max(per_minute, capacity))
            continue
        used = int(amount * settle_fraction)
        # Settled at once: what counts is the usage, a refund is given back now.
        r.settle(used, 0)
        grants.append((clock.monotonic(), float(used)))
    # A call larger than the burst goes from an idle bucket and leaves it in debt, so
    # the level stays below the larger of the capacity and the largest call.
    largest = max((amount for _, amount in grants), default=0.0)
    assert worst_window_excess(grants, max(capacity, largest), per_minute / 60.0) <= EPS


@given(
    wall=st.floats(min_value=0, max_value=4e9, allow_nan=False),
    minute=st.integers(min_value=0, max_value=1439),
)
def test_day_window_contains_its_instant(wall: float, minute: int) -> None:
    index, end = day_window(wall, minute * 60.0)
    assert end - 86_400 <= wall < end
    assert day_window(end, minute * 60.0)[0] == index + 1


@given(remaining=st.floats(min_value=0, max_value=1e6, allow_nan=False))
def test_pause_spread_is_small(remaining: float) -> None:
    rng = random.Random(3)
    spread = pause_spread(remaining, rng.random())
    assert 0 <= spread <= min(1.0, 0.1 * remaining)


@settings(max_examples=150, deadline=None)
@given(
    attempts=attempts,
    per_minute=st.integers(min_value=1, max_value=600),
    burst=st.sampled_from([1 / 60, 0.1, 0.5]),
    book_within=st.sampled_from([0.0, 0.5, 5.0, 60.0]),
    settle_fraction=st.sampled_from([1.0, 0.5, 0.0]),
)
def test_booking_never_starts_more_than_the_bound(
    attempts: list[tuple[float, int]],
    per_minute: int,
    burst: float,
    book_within: float,
    settle_fraction: float,
) -> None:
    """Booked starts: the units *starting* in any window stay within the bound.

    Each booking starts ``starts_in`` after its grant and is settled when it
    starts (the call ran), as the loop does; what counts is its usage at its start.
    """
    clock = FakeClock()
    limiter = Limiter(
        limits={"p:m": LimitSpec(tokens_per_minute=per_minute, burst=burst)}, clock=clock
    )
    route = Route(provider="p", model="m")
    capacity = max(burst * per_minute, 1.0)
    pending: list[tuple[float, int, Reservation, float]] = []  # (start, seq, r, amount)
    starts: list[tuple[float, float]] = []
    seq = 0

    def settle_until(t: float) -> None:
        while pending and pending[0][0] <= t:
            start, _, r, amount = heapq.heappop(pending)
            clock.advance(max(0.0, start - clock.monotonic()))
            used = int(amount * settle_fraction)
            r.settle(used, 0)
            starts.append((start, float(used)))

    for dt, amount in attempts:
        target = clock.monotonic() + dt
        settle_until(target)
        clock.advance(target - clock.monotonic())
        r = limiter.try_reserve(route, Cost(input_tokens=amount), book_within=book_within)
        if isinstance(r, Denied):
            assert r.never_fits or r.retry_after > book_within
            continue
        assert 0.0 <= r.starts_in <= book_within
        seq += 1
        heapq.heappush(pending, (clock.monotonic() + r.starts_in, seq, r, float(amount)))
    settle_until(float("inf"))
    starts.sort()
    largest = max((amount for _, amount in starts), default=0.0)
    assert worst_window_excess(starts, max(capacity, largest), per_minute / 60.0) <= EPS


@settings(max_examples=150, deadline=None)
@given(
    attempts=attempts,
    rpm=st.integers(min_value=6, max_value=120),
    tpm=st.integers(min_value=60, max_value=1200),
    book_within=st.sampled_from([0.5, 5.0, 60.0]),
)
def test_booking_holds_every_dimension_of_a_call(
    attempts: list[tuple[float, int]], rpm: int, tpm: int, book_within: float
) -> None:
    """Requests and tokens at once: a call waiting on tokens must not use its request
    slot before it starts (each bucket is charged at the call's start, not its grant)."""
    clock = FakeClock()
    limiter = Limiter(
        limits={"p:m": LimitSpec(requests_per_minute=rpm, tokens_per_minute=tpm, burst=0.1)},
        clock=clock,
    )
    route = Route(provider="p", model="m")
    requests: list[tuple[float, float]] = []
    tokens: list[tuple[float, float]] = []
    for dt, amount in attempts:
        clock.advance(dt)
        r = limiter.try_reserve(route, Cost(input_tokens=amount), book_within=book_within)
        if isinstance(r, Reservation):
            start = clock.monotonic() + r.starts_in
            requests.append((start, 1.0))
            tokens.append((start, float(amount)))
    requests.sort()
    tokens.sort()
    r_cap, t_cap = max(0.1 * rpm, 1.0), max(0.1 * tpm, 1.0)
    largest = max((a for _, a in tokens), default=0.0)
    assert worst_window_excess(requests, r_cap, rpm / 60.0) <= EPS
    assert worst_window_excess(tokens, max(t_cap, largest), tpm / 60.0) <= EPS
