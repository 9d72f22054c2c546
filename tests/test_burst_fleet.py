"""The provider's whole burst without refusals, and the minute-wide buckets still paced.

Fleets on virtual time against the FakeProvider (``_vfleet.py``): 30 tasks at once,
each call ~1,450 tokens, so the first wave (43.5k tokens) is larger than the
provider's 2 s bucket (40k) -- a client that sends it whole is refused; one that
paces at a second of the rate leaves the other second of the burst unused.
"""

from __future__ import annotations

import random

import pytest

from _vfleet import Call, FleetRun, run_fleet_timed
from rateloop.admission import Limiter, LimitSpec
from rateloop.admission.reservation import Denied, Reservation
from rateloop.errors import ConfigError
from rateloop.policy import Policy
from rateloop.route import Cost, Route
from rateloop.signal import LimitSignal
from rateloop.testing import FakeClock

OPENAI = Route(provider="openai", model="gpt-5")
ANTHROPIC = Route(provider="anthropic", model="claude-x")
HEAVY = Call(input_tokens=1_000, max_tokens=450, output_tokens=270)
# 120 calls × 1,450 tokens at 20k tokens/s beyond the 40k burst, plus one answer (0.5 s).
IDEAL = (120 * 1_450 - 40_000) / 20_000 + 0.5


def heavy_fleet(route: Route = OPENAI, **options: object) -> FleetRun:
    return run_fleet_timed(route, seed=3, call=HEAVY, **options)  # type: ignore[arg-type]


def test_zero_config_first_wave_waits_for_the_first_answer_and_is_not_refused() -> None:
    run = heavy_fleet()
    assert run.provider.stats.served == 120
    assert run.provider.stats.refused == 0
    assert IDEAL / run.seconds >= 0.97, run.seconds
    # The first answer taught the limits and the provider's 2 s bucket.
    spec = run.limiter.limits_for(OPENAI.provider_scope)
    assert spec is not None and spec.requests_per_minute == 1_200
    assert spec.burst is not None and spec.burst == pytest.approx(2 / 60, rel=0.05)


def test_without_the_cold_start_the_first_wave_is_refused() -> None:
    """The counterfactual the cold start exists for (and the test above relies on)."""
    run = heavy_fleet(limiter_options={"cold_start": 0})
    assert run.provider.stats.served == 120
    assert run.provider.stats.refused >= 2


def test_configured_limits_use_the_burst_the_headers_show() -> None:
    limits = {OPENAI.provider_scope: LimitSpec(requests_per_minute=1_200,
                                              tokens_per_minute=1_200_000)}
    run = heavy_fleet(limits=limits)
    assert run.provider.stats.refused == 0
    assert IDEAL / run.seconds >= 0.97, run.seconds


def _most_calls_in(starts: list[float], window: float) -> int:
    """The most calls that reached the provider within any ``window`` seconds."""
    starts = sorted(starts)
    most, j = 0, 0
    for i, t in enumerate(starts):
        while starts[j] < t - window:
            j += 1
        most = max(most, i - j + 1)
    return most


@pytest.mark.parametrize(
    ("route", "provider_options", "paced"),
    [
        # tokens, input and max_tokens counted together: 20k/s ÷ 1,450 = 13.8 calls a second
        (OPENAI, {"profile": "openai", "rpm": 1_200, "tpm": 1_200_000, "burst_seconds": 60},
         15),
        # input tokens and requests apart: 20k/s ÷ 1,000 = 20 calls a second
        (ANTHROPIC, {"profile": "anthropic", "rpm": 1_200, "itpm": 1_200_000, "otpm": 600_000,
                     "tpm": None, "burst_seconds": 60}, 21),
    ],
    ids=["openai", "anthropic"],
)
def test_a_minute_wide_bucket_keeps_the_profiles_pacing(
    route: Route, provider_options: dict[str, object], paced: int
) -> None:
    """OpenAI and Anthropic state a minute's allowance and enforce it over shorter
    periods: a bucket the headers show a minute wide is not a licence to send it at once."""
    run = heavy_fleet(route, provider_options=provider_options)
    assert run.provider.stats.refused == 0
    spec = run.limiter.limits_for(route.provider_scope)
    assert spec is not None and spec.requests_per_minute == 1_200
    assert spec.burst is None  # the profile's pacing, not the provider's minute
    # Paced at a second of the rate, where the minute-wide bucket would take all 30 at once.
    assert _most_calls_in(run.starts, 0.05) <= paced


def test_the_cold_start_ends_at_the_first_answer_even_without_headers() -> None:
    limiter = Limiter(clock=FakeClock(), rng=random.Random(1), cold_start=3)
    held = [limiter.try_reserve(OPENAI, Cost()) for _ in range(3)]
    assert all(isinstance(r, Reservation) for r in held)
    denied = limiter.try_reserve(OPENAI, Cost())
    assert isinstance(denied, Denied) and denied.dimension is not None
    held[0].settle(0, 0)  # type: ignore[union-attr]
    # A provider that states no limits: nothing to learn, nothing limits after its answer.
    assert all(isinstance(limiter.try_reserve(OPENAI, Cost()), Reservation) for _ in range(50))
    for r in held[1:]:
        r.settle(0, 0)  # type: ignore[union-attr]


def test_the_cold_start_ends_after_thirty_seconds_without_an_answer() -> None:
    """A first answer that takes longer (an agent's long step) is not waited for."""
    clock = FakeClock()
    limiter = Limiter(clock=clock, cold_start=2)
    held = [limiter.try_reserve(OPENAI, Cost()) for _ in range(2)]
    assert isinstance(limiter.try_reserve(OPENAI, Cost()), Denied)
    clock.advance(29.0)
    assert isinstance(limiter.try_reserve(OPENAI, Cost()), Denied)
    clock.advance(1.0)
    assert all(isinstance(limiter.try_reserve(OPENAI, Cost()), Reservation) for _ in range(20))
    for r in held:
        r.settle(0, 0)  # type: ignore[union-attr]


def test_no_cold_start_where_limits_are_configured() -> None:
    limiter = Limiter(limits={"openai:gpt-5": LimitSpec(requests_per_minute=6_000, burst=1.0)},
                      clock=FakeClock(), cold_start=2)
    assert all(isinstance(limiter.try_reserve(OPENAI, Cost()), Reservation) for _ in range(20))


def test_cold_start_is_validated() -> None:
    with pytest.raises(ValueError, match=r"cold_start .* got -1"):
        Limiter(cold_start=-1)
    with pytest.raises(ConfigError, match=r"admission\.cold_start"):
        Policy.from_dict({"admission": {"cold_start": "many"}})
    assert Policy.from_dict({"admission": {"cold_start": 0}}).admission.cold_start == 0


def test_a_process_in_its_cold_start_reads_what_another_learned_at_once(
    redis_url: str, redis_prefix: str
) -> None:
    """Across processes the cold start ends for all as soon as one process learns:
    otherwise the others' cold calls would go uncounted beside its paced ones."""
    first = Limiter.from_url(redis_url, prefix=redis_prefix, rng=random.Random(1))
    second = Limiter.from_url(redis_url, prefix=redis_prefix, rng=random.Random(2))
    try:
        r1 = second.try_reserve(OPENAI, Cost())  # second starts cold: it knows nothing
        assert isinstance(r1, Reservation)
        held = first.try_reserve(OPENAI, Cost())
        assert isinstance(held, Reservation)
        first.observe(OPENAI.provider_scope, {
            "x-ratelimit-limit-requests": "600", "x-ratelimit-remaining-requests": "9",
            "x-ratelimit-reset-requests": "100ms"})
        held.settle(0, 0)
        assert first.limits_for(OPENAI.provider_scope) is not None
        # Well within the second's usual read interval (1 s): its next admission reads.
        r2 = second.try_reserve(OPENAI, Cost())
        spec = second.limits_for(OPENAI.provider_scope)
        assert spec is not None and spec.requests_per_minute == 600
        for r in (r1, r2):
            if isinstance(r, Reservation):
                r.settle(0, 0)
    finally:
        first.close()
        second.close()


class _Recording:
    """A limiter that records, in order, what the loop tells it and its reservations."""

    def __init__(self, inner: Limiter, log: list[str]) -> None:
        self._inner, self._log = inner, log

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def observe(self, scope: str, signal: LimitSignal) -> None:
        self._log.append("observe")
        self._inner.observe(scope, signal)

    def _wrapped(self, got: object) -> object:
        return _RecordingReservation(got, self._log) if isinstance(got, Reservation) else got

    def try_reserve(self, *args: object, **kwargs: object) -> object:
        return self._wrapped(self._inner.try_reserve(*args, **kwargs))  # type: ignore[arg-type]

    def try_book(self, *args: object, **kwargs: object) -> object:
        return self._wrapped(self._inner.try_book(*args, **kwargs))  # type: ignore[arg-type]


class _RecordingReservation:
    def __init__(self, inner: Reservation, log: list[str]) -> None:
        self._inner, self._log = inner, log

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def settle(self, *args: object) -> None:
        self._log.append("settle")
        self._inner.settle(*args)  # type: ignore[arg-type]

    def settle_usage(self, usage: object) -> None:
        self._log.append("settle")
        self._inner.settle_usage(usage)


def test_the_loop_learns_before_the_cold_start_ends() -> None:
    """The first answer's headers are observed before its settle ends the cold start (no
    admission in between may find a route without limits); later answers settle first."""
    from rateloop import RateLoop
    from rateloop.testing import FakeProvider, FakeRequest

    clock = FakeClock()
    provider = FakeProvider(profile="openai", rpm=600, tpm=600_000, burst_seconds=1,
                            clock=clock)
    log: list[str] = []
    limiter = Limiter(clock=clock, rng=random.Random(1))
    loop = RateLoop(Policy(), limiter=_Recording(limiter, log), clock=clock)

    def attempt(_route: Route) -> object:
        return provider.respond(FakeRequest(input_tokens=10, max_tokens=10))

    cost = Cost(input_tokens=10, output_tokens=10)
    assert loop.call(attempt, route=OPENAI, cost=cost).ok
    assert log == ["observe", "settle"]
    spec = limiter.limits_for(OPENAI.provider_scope)
    assert spec is not None and spec.requests_per_minute == 600
    log.clear()
    assert loop.call(attempt, route=OPENAI, cost=cost).ok
    assert log == ["settle", "observe"]
