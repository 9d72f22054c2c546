"""One project's refusal does not starve its siblings (issue 22, item 6).

A 1.5 h pause on ``openai:gpt-4.1:proj-tasks`` was also recorded (as a refusal that
voids booked starts) against ``openai:gpt-4.1``: an admission on the paused project
reported the pause's end, and the limiter noted it for every scope of the route.  From
then on every booked call on the model's other projects was "stale" at its start, given
back, booked again, stale again ... until its deadline, never sent.

A refusal binds the scope the provider says it limits: the observed (project) scope,
unless the signal names a broader scope on its path (``LimitSignal.scope``); siblings
keep their own capacity, on the memory backend and on Redis.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator

import httpx
import pytest

from rateloop.admission import Limiter, LimitSpec
from rateloop.loop import AsyncRateLoop, RateLoop
from rateloop.outcome import Status
from rateloop.policy import Policy
from rateloop.route import Cost, Route
from rateloop.signal import Dimension, Kind, LimitSignal, Observed
from rateloop.testing import FakeClock, FaultScript

MODEL = "openai:gpt-4.1"
OPENAI = "https://api.openai.com/v1/chat/completions"
TASKS = Route(provider="openai", model="gpt-4.1", project="proj-tasks")
SIBLINGS = [Route(provider="openai", model="gpt-4.1", project=f"proj-{n}") for n in "abc"]
#: The model's shared limit, one request a second: calls queue (are booked) behind each other.
PACED = {MODEL: LimitSpec(requests_per_minute=60, burst=1 / 60)}
LONG = 5_400.0  # 1.5 h


def ok() -> httpx.Response:
    return httpx.Response(
        200,
        json={"usage": {"prompt_tokens": 10, "completion_tokens": 5}},
        request=httpx.Request("POST", OPENAI),
    )


def long_refusal(headers: bool = True) -> httpx.HTTPStatusError:
    """OpenAI's 429 for one project: retry after 1.5 h (with ``headers``: its requests
    bucket says it is empty till then)."""
    request = httpx.Request("POST", OPENAI)
    stated = {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1h30m",
    }
    resp = httpx.Response(
        429,
        headers={"retry-after": str(int(LONG)), **(stated if headers else {})},
        json={"error": {"message": "Rate limit reached for gpt-4.1 in project proj-tasks",
                        "code": "rate_limit_exceeded"}},
        request=request,
    )
    return httpx.HTTPStatusError("429", request=request, response=resp)


def policy() -> Policy:
    return Policy.from_dict({"backoff": {"jitter": "none"}})


def _refuse_tasks(loop: RateLoop, headers: bool = True) -> None:
    refused = loop.call(FaultScript([long_refusal(headers)]), route=TASKS, deadline=10)
    assert not refused.ok  # 1.5 h is past its deadline: it ends waiting for the reset
    # Another worker's call on the paused project is denied; the denial's reply carries
    # the pause's end (which the limiter then noted for the model too).
    again = loop.call(FaultScript([ok()]), route=TASKS, deadline=10)
    assert again.status is Status.WAITING_FOR_CAPACITY


@pytest.mark.parametrize("headers", [True, False], ids=["stated-block", "retry-after-only"])
def test_a_long_refusal_on_one_project_leaves_the_others_their_capacity(headers: bool) -> None:
    clock = FakeClock()
    limiter = Limiter(limits=PACED, clock=clock)
    loop = RateLoop(policy(), limiter=limiter, clock=clock)
    _refuse_tasks(loop, headers)
    fn = FaultScript([ok()])
    outcomes = [loop.call(fn, route=r, deadline=30) for r in SIBLINGS]
    # Before the fix: with the headers none completed (the model's bucket was blocked
    # for 1.5 h); with retry-after only, the calls that had to queue were booked, found
    # "stale" at their start, booked again ... until their deadline.
    assert [o.status for o in outcomes] == [Status.COMPLETED] * 3
    assert len(fn.calls) == 3
    # The refused project itself stays paused, for the whole 1.5 h.
    denied = limiter.try_reserve(TASKS, Cost())
    assert not denied
    assert denied.retry_after >= LONG - 60


def test_async_a_long_refusal_on_one_project_leaves_the_others_their_capacity() -> None:
    clock = FakeClock()
    limiter = Limiter(limits=PACED, clock=clock)
    loop = AsyncRateLoop(policy(), limiter=limiter, clock=clock)

    async def main() -> list[Status]:
        refused = await loop.call(FaultScript([long_refusal()]), route=TASKS, deadline=10)
        assert not refused.ok
        fn = FaultScript([ok()])
        return [(await loop.call(fn, route=r, deadline=30)).status for r in SIBLINGS]

    assert asyncio.run(main()) == [Status.COMPLETED] * 3


def test_siblings_queued_before_the_refusal_keep_their_booked_starts() -> None:
    limiter = Limiter(limits=PACED, clock=FakeClock())
    booked = [limiter.try_reserve(r, Cost(), book_within=5) for r in SIBLINGS]
    assert [r.starts_in for r in booked] == pytest.approx([0.0, 1.0, 2.0])
    limiter.pause(TASKS.provider_scope, LONG, "429")
    assert not limiter.try_reserve(TASKS, Cost())  # the paused project is denied ...
    assert not any(r.stale for r in booked)  # ... and its pause voids no sibling's start


def test_a_refusal_the_signal_says_is_model_wide_binds_the_model() -> None:
    """Only a signal that names the wider scope (``scope="openai:gpt-4.1"``) binds it."""
    limiter = Limiter(limits=PACED, clock=FakeClock())
    booked = [limiter.try_reserve(r, Cost(), book_within=5) for r in SIBLINGS]
    wide = LimitSignal.of(
        Kind.TEMPORARY,
        retry_after=1.5,
        scope=MODEL,
        observed=(Observed(dimension=Dimension.REQUESTS, limit=60, remaining=0,
                           reset_after=1.5, window=60.0),),
    )
    limiter.observe(TASKS.provider_scope, wide)
    assert [r.stale for r in booked] == [False, True, False]
    # A project's own refusal with the same headers leaves the siblings alone.
    other = Limiter(limits=PACED, clock=FakeClock())
    kept = [other.try_reserve(r, Cost(), book_within=5) for r in SIBLINGS]
    other.observe(TASKS.provider_scope, LimitSignal.of(
        Kind.TEMPORARY, retry_after=LONG, observed=wide.observed))
    assert not any(r.stale for r in kept)
    assert other.try_reserve(SIBLINGS[0], Cost(), book_within=5)  # the model is not blocked
    assert not other.try_reserve(TASKS, Cost(), book_within=5)  # the project is


@pytest.mark.parametrize("named", ["openai", MODEL])
def test_a_provider_wide_refusal_binds_the_widest_scope_a_route_has(named: str) -> None:
    limiter = Limiter(limits=PACED, clock=FakeClock())
    limiter.observe(TASKS.provider_scope,
                    LimitSignal.of(Kind.TEMPORARY, retry_after=30, scope=named))
    denied = limiter.try_reserve(SIBLINGS[0], Cost())
    assert not denied and denied.scope == MODEL and denied.retry_after >= 30
    # A scope off the observed scope's path is not the provider's word about this call.
    elsewhere = Limiter(limits=PACED, clock=FakeClock())
    elsewhere.observe(TASKS.provider_scope,
                      LimitSignal.of(Kind.TEMPORARY, retry_after=30, scope="openai:gpt-5"))
    assert elsewhere.try_reserve(SIBLINGS[0], Cost())


# -- on a real Redis: two processes ---------------------------------------------------------


@pytest.fixture
def redis_pair(redis_url: str, redis_prefix: str) -> Iterator[tuple[Limiter, Limiter]]:
    a = Limiter.from_url(redis_url, prefix=redis_prefix, limits=PACED, rng=random.Random(1))
    b = Limiter.from_url(redis_url, prefix=redis_prefix, limits=PACED, rng=random.Random(2))
    yield a, b
    a.close()
    b.close()


def test_redis_a_long_refusal_on_one_project_leaves_the_others_their_capacity(
    redis_pair: tuple[Limiter, Limiter],
) -> None:
    a, b = redis_pair
    loop_b = RateLoop(policy(), limiter=b, clock=FakeClock())
    _refuse_tasks(loop_b)  # process B is refused on proj-tasks, pauses it in Redis
    # Process A learns of the pause with an admission on the paused project ...
    assert not a.try_reserve(TASKS, Cost())
    loop_a = RateLoop(policy(), limiter=a)
    fn = FaultScript([ok()])
    # ... and its calls on the other projects still go (booked a second apart: real time).
    outcomes = [loop_a.call(fn, route=r, deadline=10) for r in SIBLINGS]
    assert [o.status for o in outcomes] == [Status.COMPLETED] * 3


def test_redis_siblings_booked_keep_their_starts_after_another_process_pauses(
    redis_pair: tuple[Limiter, Limiter],
) -> None:
    a, b = redis_pair
    booked = [a.try_reserve(r, Cost(), book_within=5) for r in SIBLINGS]
    assert [r.starts_in > 0 for r in booked] == [False, True, True]
    b.pause(TASKS.provider_scope, LONG, "429")
    assert not a.try_reserve(TASKS, Cost())  # brings B's pause with its reply
    assert not any(r.stale for r in booked)
    booked[0].settle(1, 1)  # a settle's reply neither
    assert not any(r.stale for r in booked)
    # A refusal B's signal says is the model's own (org-wide) still reaches A's bookings:
    # the model is paused 1.5 s, which voids the booking 1 s ahead, not the one 2 s ahead.
    b.observe(TASKS.provider_scope, LimitSignal.of(Kind.TEMPORARY, retry_after=1.5, scope=MODEL))
    assert not a.try_reserve(SIBLINGS[0], Cost())  # the model is paused; the reply says so
    assert [r.stale for r in booked] == [False, True, False]
