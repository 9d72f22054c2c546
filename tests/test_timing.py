"""Backoff formulas, jitter, the server minimum and plan_wait (no sleeping)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rateloop.timing.backoff import Backoff, WaitPlan, plan_wait


def fixed(*values: float) -> Callable[[], float]:
    """A random source that returns ``values`` in turn, forever."""
    cycle = itertools.cycle(values)
    return lambda: next(cycle)


# -- published schedules ---------------------------------------------------


def test_amplihack_recipe_runner_schedule() -> None:
    b = Backoff(initial=60, max_delay=600, multiplier=2, jitter="none")
    assert [b.delay(n) for n in range(1, 7)] == [60, 120, 240, 480, 600, 600]
    assert b.delay(1000) == 600
    zero = Backoff(initial=0, max_delay=600, jitter="none")
    assert [zero.delay(n) for n in (1, 2, 50, 10**9)] == [0, 0, 0, 0]


def test_crabd_schedule() -> None:
    b = Backoff(initial=2, max_delay=30, multiplier=2, jitter="none")
    assert [b.base(n) for n in (1, 2, 3)] == [2, 4, 8]
    assert b.base(6) == 30
    linear = Backoff(strategy="linear", initial=2, max_delay=30, jitter="none")
    assert linear.base(3) == 6


@pytest.mark.parametrize(("r", "expected"), [(0.0, 1.0), (1.0, 2.0), (0.5, 1.5)])
def test_crabd_equal_jitter(r: float, expected: float) -> None:
    b = Backoff(initial=2, max_delay=30, multiplier=2, jitter="equal", rng=fixed(r))
    assert b.delay(1) == expected


@pytest.mark.parametrize(("r", "expected"), [(0.0, 0.0), (1.0, 8.0), (0.25, 2.0)])
def test_full_jitter(r: float, expected: float) -> None:
    b = Backoff(initial=2, max_delay=30, jitter="full", rng=fixed(r))
    assert b.delay(3) == expected


def test_constant_and_linear_cap() -> None:
    assert Backoff(strategy="constant", initial=7, jitter="none").delay(99) == 7
    assert Backoff(strategy="constant", initial=90, max_delay=60, jitter="none").delay(1) == 60
    linear = Backoff(strategy="linear", initial=5, max_delay=60, jitter="none")
    assert [linear.base(n) for n in (1, 11, 12, 13)] == [5, 55, 60, 60]


def test_decorrelated_draws_between_initial_and_three_times_previous() -> None:
    low = Backoff(strategy="decorrelated", initial=5, max_delay=60, jitter="none", rng=fixed(0))
    high = Backoff(strategy="decorrelated", initial=5, max_delay=60, jitter="none", rng=fixed(1))
    assert low.base(1) == 5
    assert high.base(1) == 15  # previous defaults to initial
    assert high.base(2, previous=15) == 45
    assert high.base(3, previous=45) == 60  # capped
    assert low.base(3, previous=45) == 5
    assert high.bounds(1) == (5, 15)
    assert high.bounds(2) == (5, 45)
    assert high.bounds(30) == (5, 60)
    with pytest.raises(ValueError, match="previous"):
        high.base(2, previous=-1)


def test_bounds_per_jitter() -> None:
    assert Backoff(initial=4, jitter="none").bounds(2) == (8, 8)
    assert Backoff(initial=4, jitter="equal").bounds(2) == (4, 8)
    assert Backoff(initial=4, jitter="full").bounds(2) == (0, 8)


def test_formula_and_description() -> None:
    assert Backoff(initial=5, multiplier=2).formula == "5·2^(n−1)"
    assert Backoff(strategy="linear", initial=5).formula == "5·n"
    assert Backoff(strategy="constant", initial=2.5).formula == "2.5"
    assert "3·previous" in Backoff(strategy="decorrelated").formula
    assert Backoff().describe() == "exponential 5·2^(n−1) s, capped at 60 s, equal jitter"


def test_repr_hides_rng_and_eq_ignores_it() -> None:
    a = Backoff(rng=fixed(0.1))
    assert a == Backoff(rng=fixed(0.9))
    assert "rng" not in repr(a)
    assert "exponential" in repr(a)


# -- validation --------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"strategy": "fibonacci"}, "fibonacci"),
        ({"jitter": "some"}, "'some'"),
        ({"initial": -1}, "-1"),
        ({"initial": math.inf}, "inf"),
        ({"max_delay": math.nan}, "nan"),
        ({"multiplier": 0.5}, "0.5"),
        ({"initial": True}, "True"),
        ({"initial": "5"}, "'5'"),
        ({"rng": 3}, "3"),
    ],
)
def test_invalid_backoff_names_the_value(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(ValueError, match=r"allowed|must") as info:
        Backoff(**kwargs)  # type: ignore[arg-type]
    assert needle in str(info.value)


@pytest.mark.parametrize("n", [0, -1, True, 1.0])
def test_retry_index_must_be_positive_int(n: object) -> None:
    with pytest.raises(ValueError, match=">= 1"):
        Backoff().base(n)  # type: ignore[arg-type]


def test_rng_out_of_range_is_reported() -> None:
    with pytest.raises(ValueError, match=r"rng returned 1\.5"):
        Backoff(rng=lambda: 1.5).delay(1)


# -- saturation and the server minimum ------------------------------------------

backoffs = st.builds(
    Backoff,
    strategy=st.sampled_from(["exponential", "linear", "constant", "decorrelated"]),
    initial=st.floats(0, 86_400),
    max_delay=st.floats(0, 86_400),
    multiplier=st.floats(1, 1e6),
    jitter=st.sampled_from(["none", "equal", "full"]),
    rng=st.floats(0, 1, exclude_max=True).map(fixed),
)


@given(b=backoffs, n=st.integers(1, 10**9))
def test_saturates_for_any_retry_index(b: Backoff, n: int) -> None:
    d = b.delay(n)
    low, high = b.bounds(n)
    assert math.isfinite(d)
    assert 0 <= low <= d <= high <= b.max_delay


def test_subnormal_initial_never_overflows() -> None:
    b = Backoff(initial=2.225073858507203e-309, max_delay=1.0, multiplier=2.0, jitter="none")
    assert b.base(1025) == pytest.approx(2.225073858507203e-309 * 2.0**1023 * 2)
    assert b.base(10**9) == 1.0
    assert b.bounds(1025)[1] <= 1.0


def test_huge_exponent_with_tiny_multiplier_saturates() -> None:
    b = Backoff(initial=1, max_delay=86_400, multiplier=1.000001, jitter="none")
    assert b.base(10**9) == 86_400
    assert b.base(2) == pytest.approx(1.000001)


@given(
    b=backoffs,
    n=st.integers(1, 10**9),
    m=st.one_of(st.none(), st.floats(0, 86_400)),
)
def test_wait_respects_server_minimum_and_documented_bound(
    b: Backoff, n: int, m: float | None
) -> None:
    w = b.wait(n, server_minimum=m)
    low, high = b.bounds(n)
    if m:
        assert max(low, m) <= w <= max(high, m) + high / 2
    else:
        assert low <= w <= high


def test_wait_with_server_minimum_formula() -> None:
    b = Backoff(initial=10, max_delay=60, jitter="none", rng=fixed(0.5))
    assert b.wait(1, server_minimum=30) == 30 + 0.5 * 10 / 2
    assert b.wait(1, server_minimum=4) == 10 + 2.5
    assert b.wait(1, server_minimum=0) == 10
    assert b.wait(1) == 10
    with pytest.raises(ValueError, match="server minimum"):
        b.wait(1, server_minimum=math.nan)


# -- plan_wait --------------------------------------------------------------


def test_server_minimum_beyond_pause_limit_does_not_fit() -> None:
    plan = plan_wait(Backoff(), 1, server_minimum=7200, pause_limit=3600, time_left=None)
    assert plan == WaitPlan(
        seconds=7200,
        fits=False,
        reason="server asked for 7200s, beyond the pause limit of 3600s",
        retry_after=7200,
    )


def test_server_minimum_beyond_time_left_does_not_fit() -> None:
    plan = plan_wait(Backoff(), 1, server_minimum=700, pause_limit=3600, time_left=600)
    assert not plan.fits
    assert plan.retry_after == 700
    assert plan.reason == "server asked for 700s, beyond the 600s left in the budget"


def test_jitter_above_server_minimum_is_shortened_to_fit() -> None:
    b = Backoff(initial=20, max_delay=60, jitter="none", rng=fixed(1.0))
    # planned = max(20, 30) + 1.0·20/2 = 40, but only 35 s are left: 35, still >= 30.
    plan = plan_wait(b, 1, server_minimum=30, pause_limit=3600, time_left=35)
    assert plan.fits
    assert plan.seconds == 35
    assert plan.retry_after == 30
    assert plan.reason is not None
    assert "shortened" in plan.reason


def test_server_minimum_wins_over_a_long_local_backoff() -> None:
    # local backoff is 60 but the server said 10 and 15 s are left: wait 15.
    b = Backoff(initial=60, max_delay=60, jitter="none", rng=fixed(0.0))
    plan = plan_wait(b, 1, server_minimum=10, pause_limit=3600, time_left=15)
    assert (plan.fits, plan.seconds) == (True, 15)


def test_without_minimum_jitter_is_shortened_down_to_its_own_floor() -> None:
    b = Backoff(initial=40, max_delay=60, jitter="equal", rng=fixed(1.0))
    # delay(1) = 40 with r=1; equal jitter could have drawn as little as 20.
    assert plan_wait(b, 1, server_minimum=None, pause_limit=3600, time_left=25).seconds == 25
    plan = plan_wait(b, 1, server_minimum=None, pause_limit=3600, time_left=19)
    assert not plan.fits
    assert plan.reason == "a backoff of at least 20s is beyond the time left, 19s"


def test_no_jitter_is_never_shortened() -> None:
    b = Backoff(initial=40, jitter="none")
    assert not plan_wait(b, 1, server_minimum=None, pause_limit=3600, time_left=39.9).fits
    assert plan_wait(b, 1, server_minimum=None, pause_limit=3600, time_left=40).fits


def test_ordinary_wait_fits() -> None:
    b = Backoff(initial=5, jitter="none")
    plan = plan_wait(b, 2, server_minimum=None, pause_limit=3600, time_left=None)
    assert plan == WaitPlan(seconds=10, fits=True, reason=None, retry_after=10)
    assert "fits" in repr(plan)


def test_spent_budget_does_not_fit() -> None:
    b = Backoff(initial=5, jitter="full", rng=fixed(0.0))
    assert not plan_wait(b, 1, server_minimum=None, pause_limit=3600, time_left=-1).fits
    assert plan_wait(b, 1, server_minimum=None, pause_limit=3600, time_left=0).fits


def test_local_backoff_beyond_pause_limit() -> None:
    b = Backoff(initial=100, max_delay=100, jitter="none")
    plan = plan_wait(b, 1, server_minimum=None, pause_limit=50, time_left=None)
    assert not plan.fits
    assert plan.reason == "a backoff of at least 100s is beyond the pause limit of 50s"


@given(
    b=backoffs,
    n=st.integers(1, 10**9),
    m=st.one_of(st.none(), st.floats(0, 86_400)),
    pause=st.floats(0, 86_400),
    left=st.one_of(st.none(), st.floats(-10, 86_400)),
)
def test_plan_never_below_minimum_never_beyond_limits(
    b: Backoff, n: int, m: float | None, pause: float, left: float | None
) -> None:
    plan = plan_wait(b, n, server_minimum=m, pause_limit=pause, time_left=left)
    if plan.fits:
        assert plan.seconds <= pause
        assert left is None or plan.seconds <= left
        if m:
            assert plan.seconds >= m
            assert plan.retry_after == m
    else:
        assert plan.reason
        if m:
            assert plan.retry_after == m


def test_a_huge_integer_is_a_clear_value_error() -> None:
    with pytest.raises(ValueError, match="too large"):
        Backoff(initial=10**400)
