"""Admission inside the RATE loop: reserve before each attempt, settle, pause, observe."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from _http_faults import throttle
from rateloop.admission import LimitSpec
from rateloop.admission.limiter import Limiter
from rateloop.admission.reservation import Denied
from rateloop.loop import AsyncRateLoop, RateLoop
from rateloop.outcome import Status
from rateloop.policy import Policy
from rateloop.route import Cost, Route
from rateloop.testing import FakeClock, FaultScript
from rateloop.timing.decide import ARRIVAL_SLACK_SECS, BOOK_HORIZON_SECS

OPENAI = "https://api.openai.com/v1/chat/completions"
ROUTE = Route(provider="openai", model="gpt-5", project="p1")


def ok(prompt_tokens: int = 10, completion_tokens: int = 5) -> httpx.Response:
    return httpx.Response(
        200,
        json={"usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}},
        request=httpx.Request("POST", OPENAI),
    )


def policy() -> Policy:
    return Policy.from_dict({"backoff": {"jitter": "none"}})


def make(clock: FakeClock, **spec: Any) -> tuple[Limiter, RateLoop]:
    # A whole minute's burst: these tests count what fits at once, not the default pacing.
    limiter = Limiter(limits={ROUTE.scope: LimitSpec(**{"burst": 1.0, **spec})}, clock=clock)
    return limiter, RateLoop(policy(), limiter=limiter, clock=clock)


def test_admission_paces_calls_instead_of_collecting_429s(clock: FakeClock) -> None:
    _, loop = make(clock, requests_per_minute=2)
    fn = FaultScript([ok()])
    outcomes = [loop.call(fn, route=ROUTE) for _ in range(4)]
    assert all(o.status is Status.COMPLETED for o in outcomes)
    assert len(fn.calls) == 4
    # Two fit the burst; each later one waits for the bucket to refill (30 s per request).
    assert len(clock.sleeps) == 2
    assert all(s == pytest.approx(30.0, abs=1.0) for s in clock.sleeps)
    waits = [e for o in outcomes for e in o.events if e.decision == "admission_wait"]
    assert len(waits) == 2


def test_a_cost_that_can_never_fit_is_rejected(clock: FakeClock) -> None:
    _, loop = make(clock, input_tokens_per_minute=1000)
    fn = FaultScript([ok()])
    out = loop.call(fn, route=ROUTE, cost=Cost(input_tokens=5000))
    assert out.status is Status.REJECTED
    assert fn.calls == [] and clock.sleeps == []


def test_admission_wait_beyond_the_deadline_waits_for_capacity(clock: FakeClock) -> None:
    _, loop = make(clock, requests_per_minute=1)
    fn = FaultScript([ok()])
    assert loop.call(fn, route=ROUTE).ok
    out = loop.call(fn, route=ROUTE, deadline=10)
    assert out.status is Status.WAITING_FOR_CAPACITY
    assert out.retry_at is not None
    assert len(fn.calls) == 1 and clock.sleeps == []


def test_a_throttle_pauses_the_scope_for_every_caller() -> None:
    probes: list[object] = []

    class Probe(FakeClock):
        """While the loop sleeps, another caller asks for the same scope."""

        def sleep(self, seconds: float) -> None:
            probes.append(limiter.try_reserve(ROUTE, Cost()))
            super().sleep(seconds)

    clock = Probe()
    limiter = Limiter(limits={ROUTE.scope: LimitSpec(requests_per_minute=600)}, clock=clock)
    loop = RateLoop(policy(), limiter=limiter, clock=clock)
    out = loop.call(FaultScript([throttle("20"), ok()]), route=ROUTE)
    assert out.ok
    assert clock.sleeps[0] >= 20.0
    other = probes[0]
    assert isinstance(other, Denied)
    assert other.retry_after >= 20.0


def test_settle_refunds_unused_output_tokens(clock: FakeClock) -> None:
    # A provider that corrects max_tokens to the output produced (OpenAI keeps it).
    _, loop = make(clock, output_tokens_per_minute=1000, profile="generic")
    fn = FaultScript([ok(completion_tokens=100)])
    for _ in range(3):
        out = loop.call(fn, route=ROUTE, cost=Cost(output_tokens=800))
        assert out.ok
    # 800 reserved, 100 used: the refund lets the next call in at once, three times over.
    assert clock.sleeps == []


def test_the_loop_settles_usage_as_the_providers_profile_reads_it(clock: FakeClock) -> None:
    # Anthropic counts cache writes toward input limits and leaves cache reads out: a call
    # that reports 20 input, 100 cache-written and 9,000 cache-read tokens spends 120.
    route = Route(provider="anthropic", model="claude", project="p1")
    limiter = Limiter(
        limits={route.scope: LimitSpec(input_tokens_per_minute=1_000, burst=1.0)}, clock=clock
    )
    loop = RateLoop(policy(), limiter=limiter, clock=clock)
    usage = {"input_tokens": 20, "output_tokens": 5, "cache_read_input_tokens": 9_000,
             "cache_creation_input_tokens": 100}
    fn = FaultScript([{"usage": usage}])
    for _ in range(8):  # 8 × 120 = 960 of 1,000: every call fits without a wait
        assert loop.call(fn, route=route, cost=Cost(input_tokens=120)).ok
    assert clock.sleeps == []
    # Settled by the raw input_tokens (20 each), a 9th and 10th would fit too; by the
    # profile (120 each), the 9th waits for the bucket to refill.
    assert loop.call(fn, route=route, cost=Cost(input_tokens=120)).ok
    assert len(clock.sleeps) == 1 and clock.sleeps[0] > 0


def test_without_usage_the_reservation_is_kept(clock: FakeClock) -> None:
    _, loop = make(clock, output_tokens_per_minute=1000)
    fn = FaultScript(["no usage reported"])
    assert loop.call(fn, route=ROUTE, cost=Cost(output_tokens=800)).ok
    assert loop.call(fn, route=ROUTE, cost=Cost(output_tokens=800)).ok
    assert len(clock.sleeps) == 1 and clock.sleeps[0] > 0


def test_async_loop_admits_through_the_same_limiter(clock: FakeClock) -> None:
    limiter = Limiter(
        limits={ROUTE.scope: LimitSpec(requests_per_minute=2, burst=1.0)}, clock=clock
    )
    loop = AsyncRateLoop(policy(), limiter=limiter, clock=clock)
    fn = FaultScript([ok()])

    async def main() -> list[Status]:
        return [(await loop.call(fn, route=ROUTE)).status for _ in range(3)]

    assert asyncio.run(main()) == [Status.COMPLETED] * 3
    assert len(clock.sleeps) == 1


def test_loop_with_redis_limiter_shares_capacity_across_loops(
    redis_url: str, redis_prefix: str
) -> None:
    spec = {ROUTE.scope: LimitSpec(requests_per_minute=3, burst=1.0)}
    clocks = [FakeClock(), FakeClock()]
    loops = [
        RateLoop(
            policy(),
            limiter=Limiter.from_url(redis_url, prefix=redis_prefix, limits=spec, clock=c),
            clock=c,
        )
        for c in clocks
    ]
    fn = FaultScript([ok()])
    results = [loops[i % 2].call(fn, route=ROUTE, deadline=5) for i in range(4)]
    statuses = [r.status for r in results]
    # Three fit the shared burst, whichever loop asks; the fourth must wait ~20 s of Redis time,
    # which does not fit its 5 s deadline.
    assert statuses[:3] == [Status.COMPLETED] * 3
    assert statuses[3] is Status.WAITING_FOR_CAPACITY
    assert len(fn.calls) == 3


def test_an_interrupted_attempt_gives_its_capacity_back(clock: FakeClock) -> None:
    limiter, loop = make(clock, requests_per_minute=60, output_tokens_per_minute=1000)

    def interrupted(route: Route) -> Any:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        loop.call(interrupted, route=ROUTE, cost=Cost(output_tokens=900))
    # The 900 reserved output tokens came back: another 900 fits at once.
    assert limiter.try_reserve(ROUTE, Cost(output_tokens=900))


def test_a_cancelled_async_attempt_gives_its_capacity_back(clock: FakeClock) -> None:
    limiter = Limiter(limits={ROUTE.scope: LimitSpec(output_tokens_per_minute=1000)}, clock=clock)
    loop = AsyncRateLoop(policy(), limiter=limiter, clock=clock)

    async def main() -> None:
        started = asyncio.Event()

        async def slow(route: Route) -> Any:
            started.set()
            await asyncio.sleep(3600)

        task = asyncio.create_task(loop.call(slow, route=ROUTE, cost=Cost(output_tokens=900)))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert limiter.try_reserve(ROUTE, Cost(output_tokens=900))


def test_limiter_from_policy_reads_admission_and_limits(
    redis_url: str, redis_prefix: str, clock: FakeClock
) -> None:
    pol = Policy.from_dict(
        {
            "admission": {"backend": redis_url, "on_unreachable": "local", "local_share": 0.5},
            "limits": {ROUTE.scope: {"requests_per_minute": 2, "burst": 1.0}},
        }
    )
    limiter = Limiter.from_policy(pol, prefix=redis_prefix, clock=clock)
    assert limiter.limits_for(ROUTE.scope) == LimitSpec(requests_per_minute=2, burst=1.0)
    assert "redis://" in repr(limiter)
    grants = [bool(limiter.try_reserve(ROUTE, Cost())) for _ in range(3)]
    assert grants == [True, True, False]


TENANT_A = Route(provider="openai", model="gpt-5", project="p1", tenant="a")
TENANT_B = Route(provider="openai", model="gpt-5", project="p1", tenant="b")


def test_a_throttle_on_one_tenant_pauses_the_whole_project() -> None:
    probes: list[object] = []

    class Probe(FakeClock):
        def sleep(self, seconds: float) -> None:
            probes.append(limiter.try_reserve(TENANT_B, Cost()))
            super().sleep(seconds)

    clock = Probe()
    limiter = Limiter(limits={"openai:gpt-5:p1": LimitSpec(requests_per_minute=600)}, clock=clock)
    loop = RateLoop(policy(), limiter=limiter, clock=clock)
    assert loop.call(FaultScript([throttle("20"), ok()]), route=TENANT_A).ok
    # The provider limited the project: tenant b is held too, not only tenant a.
    assert isinstance(probes[0], Denied) and probes[0].retry_after >= 20.0


def test_a_period_quota_pauses_the_scope_until_its_reset(clock: FakeClock) -> None:
    limiter, loop = make(clock, requests_per_minute=600)
    request = httpx.Request("POST", OPENAI)
    body = {
        "error": {
            "message": "Rate limit reached on requests per day (RPD): Limit 200, Used 200. "
            "Please try again in 6m0s.",
            "code": "rate_limit_exceeded",
        }
    }
    resp = httpx.Response(429, json=body, request=request)
    out = loop.call(
        FaultScript([httpx.HTTPStatusError("429", request=request, response=resp)]), route=ROUTE
    )
    assert out.status is Status.WAITING_FOR_RESET
    held = limiter.try_reserve(ROUTE, Cost())
    assert isinstance(held, Denied) and held.retry_after >= 359.0


def test_provider_headers_reach_the_limiter(clock: FakeClock) -> None:
    limiter = Limiter(clock=clock)  # zero-config: nothing configured for the scope
    loop = RateLoop(policy(), limiter=limiter, clock=clock)
    headers = {
        "x-ratelimit-limit-requests": "2",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "30s",
    }
    resp = httpx.Response(
        200, headers=headers, json={"usage": {}}, request=httpx.Request("POST", OPENAI)
    )
    assert loop.call(FaultScript([resp]), route=ROUTE).ok
    # The headers said the minute's requests are spent for 30 s: the next call must wait.
    held = limiter.try_reserve(ROUTE, Cost())
    assert isinstance(held, Denied)
    assert 0 < held.retry_after <= 31.0


def test_gemini_usage_settles_the_reservation(clock: FakeClock) -> None:
    _, loop = make(clock, output_tokens_per_minute=1000, profile="gemini")
    gemini = httpx.Response(
        200,
        json={"usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 50}},
        request=httpx.Request("POST", "https://generativelanguage.googleapis.com/v1beta/x"),
    )
    for _ in range(3):
        assert loop.call(FaultScript([gemini]), route=ROUTE, cost=Cost(output_tokens=800)).ok
    assert clock.sleeps == []  # 800 reserved, 50 used: the refunds keep every call immediate


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_an_admission_wait_that_cannot_fit_falls_back_at_once(
    clock: FakeClock, twin: str
) -> None:
    backup = Route(provider="anthropic", model="claude")
    limiter = Limiter(limits={ROUTE.scope: LimitSpec(requests_per_minute=1)}, clock=clock)
    fn = FaultScript({"gpt-5": [ok()], "claude": ["from the backup"]})
    if twin == "sync":
        loop = RateLoop(policy(), limiter=limiter, clock=clock, sinks=[])
        first = loop.call(fn, route=ROUTE, fallbacks=[backup])
        out = loop.call(fn, route=ROUTE, fallbacks=[backup], deadline=10)
    else:
        aloop = AsyncRateLoop(policy(), limiter=limiter, clock=clock, sinks=[])

        async def both() -> Any:
            one = await aloop.call(fn, route=ROUTE, fallbacks=[backup])
            return one, await aloop.call(fn, route=ROUTE, fallbacks=[backup], deadline=10)

        first, out = asyncio.run(both())
    assert first.status is Status.COMPLETED
    # The primary's bucket refills in 60 s, past the 10 s deadline: the backup serves now.
    assert out.status is Status.DEGRADED and out.value == "from the backup"
    assert fn.models == ["gpt-5", "claude"] and clock.sleeps == []
    assert [e.decision for e in out.events][:1] == ["fallback"]


class StillClock(FakeClock):
    """Time that does not move while callers sleep: 30 callers admitted at one instant.

    Records each sleep (as FakeClock does) without advancing, and lets other
    tasks run on an async sleep, so callers on it are concurrent at ``t = 0``.
    """

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        # Callers that poll (deny, sleep, ask again) would spin here forever: fail instead.
        assert len(self.sleeps) <= 60, "callers polled instead of booking their start"

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)
        await asyncio.sleep(0)


def booked(outcome: Any) -> list[float]:
    return [e.wait_seconds for e in outcome.events if e.decision == "admission_wait"]


def test_thirty_callers_on_one_bucket_are_served_in_booking_order() -> None:
    clock = StillClock()
    # 20 requests a second, one second of burst: 20 go now, then one every 50 ms.
    limiter = Limiter(limits={ROUTE.scope: LimitSpec(requests_per_minute=1200)}, clock=clock)
    loop = RateLoop(policy(), limiter=limiter, clock=clock)
    order: list[int] = []

    def caller(i: int) -> Any:
        def fn(route: Route) -> httpx.Response:
            order.append(i)
            return ok()

        return fn

    outcomes = [loop.call(caller(i), route=ROUTE) for i in range(30)]
    assert all(o.ok for o in outcomes) and order == list(range(30))
    expected = [0.05 * k + ARRIVAL_SLACK_SECS for k in range(1, 11)]
    assert [w for o in outcomes for w in booked(o)] == pytest.approx(expected)
    assert clock.sleeps == pytest.approx(expected)  # each sleeps its booking, once
    # No caller was denied and asked again: one admission wait each, all booked.
    reasons = [e.reason for o in outcomes for e in o.events if e.decision == "admission_wait"]
    assert all(r.startswith("booked capacity") for r in reasons)


def test_thirty_async_callers_on_one_bucket_are_served_in_booking_order() -> None:
    clock = StillClock()
    limiter = Limiter(limits={ROUTE.scope: LimitSpec(requests_per_minute=1200)}, clock=clock)
    loop = AsyncRateLoop(policy(), limiter=limiter, clock=clock)
    order: list[int] = []

    async def one(i: int) -> Any:
        async def fn(route: Route) -> httpx.Response:
            order.append(i)
            return ok()

        return await loop.call(fn, route=ROUTE)

    async def main() -> list[Any]:
        return await asyncio.gather(*(one(i) for i in range(30)))

    outcomes = asyncio.run(main())
    assert all(o.ok for o in outcomes)
    waits = [booked(o) for o in outcomes]
    # Booked in task order: the first 20 go now, then 50 ms apart, and each task
    # slept exactly its booking (one wait, no denial).
    assert waits[:20] == [[]] * 20
    assert [w[0] for w in waits[20:]] == pytest.approx(
        [0.05 * k + ARRIVAL_SLACK_SECS for k in range(1, 11)]
    )
    assert sorted(clock.sleeps) == pytest.approx(
        [0.05 * k + ARRIVAL_SLACK_SECS for k in range(1, 11)]
    )
    assert order[:20] == list(range(20)) and sorted(order[20:]) == list(range(20, 30))


def test_a_booking_beyond_the_deadline_is_not_taken(clock: FakeClock) -> None:
    _, loop = make(clock, requests_per_minute=60, burst=1 / 60)  # one a second
    fn = FaultScript([ok()])
    assert loop.call(fn, route=ROUTE).ok
    assert loop.call(fn, route=ROUTE, deadline=2).ok  # booked 1 s ahead
    assert clock.sleeps == [pytest.approx(1.0 + ARRIVAL_SLACK_SECS)]
    # The next start is 1 s ahead of now again; a 0.5 s deadline cannot afford it.
    out = loop.call(fn, route=ROUTE, deadline=0.5)
    assert out.status is Status.WAITING_FOR_CAPACITY
    assert len(fn.calls) == 2


def test_the_loop_books_no_further_ahead_than_its_horizon(clock: FakeClock) -> None:
    # One request every 10 s: the second caller's start is 10 s ahead, beyond the 5 s the
    # loop books (a booked call would not see a pause set meanwhile), so it is denied and
    # waits by polling instead; the first caller's start, 0 s ahead, is taken at once.
    limiter = Limiter(
        limits={ROUTE.scope: LimitSpec(requests_per_minute=6, burst=1 / 6)}, clock=clock
    )
    loop = RateLoop(policy(), limiter=limiter, clock=clock)
    assert BOOK_HORIZON_SECS == 5.0
    assert loop.call(FaultScript([ok()]), route=ROUTE).ok
    out = loop.call(FaultScript([ok()]), route=ROUTE, deadline=60)
    reasons = [e.reason for e in out.events if e.decision == "admission_wait"]
    assert out.ok and reasons and not any(r.startswith("booked capacity") for r in reasons)
    assert clock.sleeps == [pytest.approx(10.0 + ARRIVAL_SLACK_SECS)]  # reached 1 ms late too
