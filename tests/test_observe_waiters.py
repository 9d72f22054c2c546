"""Waiters by priority: the calls sleeping on each scope, read from the shared event stream."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from rateloop.admission import LimitSpec
from rateloop.admission.limiter import Limiter
from rateloop.admission.reservation import Reservation
from rateloop.loop import AsyncRateLoop, RateLoop
from rateloop.observe.redis_events import RedisEventSink
from rateloop.observe.redis_state import RedisStateReader
from rateloop.observe.waiters import waiters
from rateloop.outcome import Status
from rateloop.policy import Policy
from rateloop.route import Cost, Route
from rateloop.testing import FakeClock

SCOPE = "openai:gpt-5:waiters"
ROUTE = Route(provider="openai", model="gpt-5", project="waiters")
# Six requests a minute, all at once: the test fills the scope, then every call waits ~10 s.
SPEC = LimitSpec(requests_per_minute=6, burst=1.0)


def row(ms: int, seq: int = 0, **fields: str) -> tuple[str, dict[str, str]]:
    return f"{ms}-{seq}", fields


# --- the counting, sans-IO ------------------------------------------------------------------


def test_a_live_wait_counts_by_priority_until_it_ends() -> None:
    rows = [
        row(
            1_000_000,
            decision="admission_wait",
            scope="s",
            priority="interactive",
            wait_seconds="10",
            call="a",
        ),
        row(
            1_000_000,
            1,
            decision="admission_wait",
            scope="s",
            priority="interactive",
            wait_seconds="4",
            call="b",
        ),
        row(
            1_001_000,
            decision="wait",
            scope="s",
            priority="background",
            wait_seconds="30",
            call="c",
        ),
        row(
            1_001_000,
            1,
            decision="admission_wait",
            scope="t",
            priority="interactive",
            wait_seconds="2",
            call="d",
        ),
    ]
    assert waiters(rows, now=1_000.5) == {
        "s": {"background": 1, "interactive": 2},
        "t": {"interactive": 1},
    }
    # b's 4 s and d's 2 s are over at 1004.5; a's 10 s and c's 30 s are not.
    assert waiters(rows, now=1_004.5) == {"s": {"background": 1, "interactive": 1}}
    assert waiters(rows, now=1_031.0) == {}


def test_the_latest_event_of_a_call_supersedes_its_earlier_waits() -> None:
    rows = [
        row(
            1_000_000,
            decision="admission_wait",
            scope="s",
            priority="interactive",
            wait_seconds="60",
            call="a",
        ),
        row(
            1_000_000,
            1,
            decision="admission_wait",
            scope="s",
            priority="interactive",
            wait_seconds="60",
            call="a",
        ),
        row(
            1_000_000,
            2,
            decision="admission_wait",
            scope="s",
            priority="scheduled",
            wait_seconds="60",
            call="b",
        ),
        # b moved on: its stop supersedes its wait.
        row(1_000_500, decision="stop", scope="s", priority="scheduled", call="b"),
    ]
    assert waiters(rows, now=1_001.0) == {"s": {"interactive": 1}}


def test_untagged_waits_count_one_each_and_other_decisions_never() -> None:
    rows = [
        row(
            1_000_000,
            decision="admission_wait",
            scope="s",
            priority="interactive",
            wait_seconds="60",
        ),
        row(1_000_000, 1, decision="admission_wait", scope="s", wait_seconds="60"),
        row(1_000_000, 2, decision="pause", scope="s", wait_seconds="60"),
        row(1_000_000, 3, decision="retry", scope="s", wait_seconds="60"),
        row(1_000_000, 4, decision="admission_wait", scope="s", wait_seconds="bad"),
        row(1_000_000, 5, decision="admission_wait", wait_seconds="60"),
    ]
    assert waiters(rows, now=1_001.0) == {"s": {"interactive": 1, "unknown": 1}}


# --- a real loop on a real limiter, on Redis --------------------------------------------------


class GatedClock(FakeClock):
    """A fake clock whose sleeps hold the sleeping call until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)
        await self.gate.wait()


@pytest.fixture
def limiter(redis_url: str, redis_prefix: str) -> Iterator[Limiter]:
    lim = Limiter.from_url(redis_url, prefix=redis_prefix, limits={SCOPE: SPEC})
    # The minute's six requests, all taken (no concurrency limit: nothing to hold or release).
    held = [lim.try_reserve(ROUTE, Cost()) for _ in range(6)]
    assert all(isinstance(r, Reservation) for r in held)
    yield lim
    lim.close()


def never_called(route: Route) -> Any:
    raise AssertionError("the scope is full: no attempt may start")


@pytest.mark.redis
def test_calls_waiting_on_a_full_scope_show_by_priority_and_leave_when_done(
    limiter: Limiter, redis_url: str, redis_prefix: str
) -> None:
    sink = RedisEventSink(redis_url, prefix=redis_prefix)
    reader = RedisStateReader(redis_url, prefix=redis_prefix, limits={SCOPE: SPEC})
    clock = GatedClock()
    loop = AsyncRateLoop(Policy.from_dict({}), limiter=limiter, clock=clock, sinks=[sink])
    priorities = ["interactive", "interactive", "scheduled", "background"]

    async def scenario() -> list[Status]:
        calls = [
            asyncio.create_task(loop.call(never_called, route=ROUTE, priority=p, deadline=300.0))
            for p in priorities
        ]
        async with asyncio.timeout(10):
            while len(clock.sleeps) < len(priorities):  # every call is asleep on its wait
                await asyncio.sleep(0.01)
        snap = reader.read()
        state = snap.scope(SCOPE)
        assert state is not None
        assert state.waiters == {"background": 1, "interactive": 2, "scheduled": 1}
        assert snap.to_dict()["scopes"][0]["waiters"] == dict(state.waiters)
        # Once their waits have passed (on the server's clock), none is waiting.
        now = snap.at.timestamp()
        assert reader.read_waiters(now) == {SCOPE: dict(state.waiters)}
        assert reader.read_waiters(now + max(clock.sleeps) + 1) == {}
        # Let them go: each asks again, is denied, waits again... until its deadline (the
        # calls share the fake clock: each wait of one moves every call's time on).
        clock.gate.set()
        try:
            return [o.status for o in await asyncio.gather(*calls)]
        finally:
            await limiter.aclose()

    try:
        statuses = asyncio.run(scenario())
        assert statuses == [Status.WAITING_FOR_CAPACITY] * len(priorities)
        assert len(clock.sleeps) > 2 * len(priorities)  # several waits per call...
        state = reader.read().scope(SCOPE)
        assert state is not None and state.waiters == {}  # ...and each call stopped
    finally:
        reader.close()
        sink.close()


@pytest.mark.redis
def test_a_sync_loop_on_a_fake_clock_counts_each_call_once(
    limiter: Limiter, redis_url: str, redis_prefix: str
) -> None:
    """Its fake waits take no real time: all of one call's waits are live at once, yet the
    call counts once, and only until its stop event."""
    sink = RedisEventSink(redis_url, prefix=redis_prefix)
    reader = RedisStateReader(redis_url, prefix=redis_prefix, limits={SCOPE: SPEC})
    clock = FakeClock()
    seen: list[dict[str, dict[str, int]]] = []

    class Peek:
        """Reads the waiters from Redis at each of the call's waits, as another process would."""

        def __call__(self, event: Any) -> None:
            if event.decision == "admission_wait":
                seen.append(reader.read_waiters())

    loop = RateLoop(Policy.from_dict({}), limiter=limiter, clock=clock, sinks=[sink, Peek()])
    try:
        out = loop.call(never_called, route=ROUTE, priority="scheduled", deadline=60.0)
        assert out.status is Status.WAITING_FOR_CAPACITY
        assert len(seen) >= 3
        assert all(s == {SCOPE: {"scheduled": 1}} for s in seen)
        assert reader.read_waiters() == {}
    finally:
        reader.close()
        sink.close()
