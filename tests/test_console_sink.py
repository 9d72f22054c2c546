"""ConsoleSink: progress a person can read, never a flood (issue 10), on injected clocks."""

from __future__ import annotations

import asyncio
import heapq
import io
import itertools
import sys
import threading
from typing import Any

import pytest

from _http_faults import throttle
from rateloop.loop import AsyncRateLoop, RateLoop
from rateloop.outcome import CapacityEvent, ConsoleSink, DecisionKind, Outcome, Status
from rateloop.policy import Policy
from rateloop.route import Route
from rateloop.testing import FakeClock, FaultScript

OPENAI = "https://api.openai.com/v1/chat/completions"
A = Route(provider="openai", model="gpt-5")
B = Route(provider="anthropic", model="claude")


class VirtualClock(FakeClock):
    """Concurrent sleepers on virtual time: time jumps to the next wake-up when all wait."""

    def __init__(self) -> None:
        super().__init__()
        self._wakers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    async def asleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(
            self._wakers, (self.monotonic() + max(seconds, 0.0), next(self._seq), future)
        )
        await future

    async def run(self, *coros: Any) -> list[Any]:
        tasks = [asyncio.ensure_future(c) for c in coros]
        while not all(t.done() for t in tasks):
            for _ in range(5):  # let every runnable task reach its next sleep
                await asyncio.sleep(0)
            if self._wakers:
                when, _, future = heapq.heappop(self._wakers)
                self.advance(max(0.0, when - self.monotonic()))
                future.set_result(None)
        return [t.result() for t in tasks]


def test_fifty_concurrent_throttled_calls_print_a_handful_of_lines() -> None:
    clock = VirtualClock()
    out = io.StringIO()
    sink = ConsoleSink(out, clock=clock, summary_every=10)
    loop = AsyncRateLoop(Policy(), clock=clock, sinks=[sink], rng=lambda: 0.5)
    scripts = [FaultScript([throttle("20"), "ok"]) for _ in range(50)]

    async def one(fn: FaultScript) -> Outcome:
        return await loop.call(fn, route=A)

    outcomes = asyncio.run(clock.run(*(one(fn) for fn in scripts)))
    sink.flush()
    assert all(o.status is Status.COMPLETED for o in outcomes)
    lines = out.getvalue().splitlines()
    assert 3 <= len(lines) <= 8, lines  # not one line per event (50 waits, 50 retries, ...)
    assert lines[0] == "rateloop: openai:gpt-5 paused 21s (temporary 429)"
    assert any("openai:gpt-5 resumed after 21s (50 calls waited)" in line for line in lines)
    assert lines[-1] == (
        "rateloop: 0 in flight, 0 waiting, 50 done (0 degraded), 0 rejected, 0 failed; paused: none"
    )


class ThreadedVirtualClock(FakeClock):
    """Virtual time for threads: it jumps to the next wake-up once every thread sleeps."""

    def __init__(self, threads: int) -> None:
        super().__init__()
        self._cond = threading.Condition()
        self._running = threads
        self._wakers: list[tuple[float, int]] = []
        self._woken: set[int] = set()
        self._seq = itertools.count()

    def sleep(self, seconds: float) -> None:
        with self._cond:
            self.sleeps.append(seconds)
            me = next(self._seq)
            heapq.heappush(self._wakers, (self.monotonic() + max(seconds, 0.0), me))
            self._running -= 1
            self._advance()
            if not self._cond.wait_for(lambda: me in self._woken, timeout=30):
                raise TimeoutError("virtual clock stalled")
            self._running += 1

    def done(self) -> None:
        with self._cond:
            self._running -= 1
            self._advance()

    def _advance(self) -> None:
        if self._running == 0 and self._wakers:
            when, who = heapq.heappop(self._wakers)
            self.advance(max(0.0, when - self.monotonic()))
            self._woken.add(who)
            self._cond.notify_all()


def test_fifty_concurrent_threads_print_a_handful_of_lines_too() -> None:
    clock = ThreadedVirtualClock(threads=50)
    out = io.StringIO()
    sink = ConsoleSink(out, clock=clock, summary_every=10)
    loop = RateLoop(Policy(), clock=clock, sinks=[sink], rng=lambda: 0.5)
    outcomes: list[Outcome] = []

    def one() -> None:
        try:
            outcomes.append(loop.call(FaultScript([throttle("20"), "ok"]), route=A))
        finally:
            clock.done()

    threads = [threading.Thread(target=one) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    sink.flush()
    assert len(outcomes) == 50 and all(o.status is Status.COMPLETED for o in outcomes)
    lines = out.getvalue().splitlines()
    assert 3 <= len(lines) <= 8, lines
    assert lines[0] == "rateloop: openai:gpt-5 paused 21s (temporary 429)"
    assert any("resumed after 21s (50 calls waited)" in line for line in lines)


def event(decision: str, scope: str = "openai:gpt-5", **kw: Any) -> CapacityEvent:
    provider, model = scope.split(":")[:2]
    return CapacityEvent(
        decision=DecisionKind(decision),
        operation="model.generate",
        provider=provider,
        model=model,
        scope=scope,
        **kw,
    )


def test_long_waits_fallbacks_and_failures_are_rate_limited_per_topic() -> None:
    clock = FakeClock()
    out = io.StringIO()
    sink = ConsoleSink(out, clock=clock, long_wait_secs=5, repeat_secs=10, summary_every=60)
    for _ in range(20):
        sink(event("wait", wait_seconds=8.0, signal_kind="server_error", http_status=503))
        sink(event("wait", wait_seconds=1.0, signal_kind="server_error"))  # short: no line
        why = "server_error on openai:gpt-5; falling back to anthropic:claude"
        sink(event("fallback", scope="anthropic:claude", reason=why))
    clock.advance(11)
    sink(event("wait", wait_seconds=8.0, signal_kind="server_error", http_status=503))
    failed = Outcome(status=Status.WAITING_FOR_CAPACITY, reason="no capacity", route=A)
    for _ in range(5):
        sink.call_finished(failed)
    assert out.getvalue().splitlines() == [
        "rateloop: waiting 8s on openai:gpt-5 (server_error 503)",
        "rateloop: fallback: server_error on openai:gpt-5; falling back to anthropic:claude",
        "rateloop: waiting 8s on openai:gpt-5 (server_error 503) (+19 more like it)",
        "rateloop: a call on openai:gpt-5 ended waiting_for_capacity: no capacity",
    ]


def test_the_summary_is_periodic_and_counts_calls() -> None:
    clock = FakeClock()
    out = io.StringIO()
    sink = ConsoleSink(out, clock=clock, summary_every=10)
    loop = RateLoop(Policy(), clock=clock, sinks=[sink])
    for _ in range(3):
        loop.call(FaultScript(["ok"]), route=A)
    assert out.getvalue() == ""  # first-try successes: nothing to say yet
    clock.advance(10)
    loop.call(FaultScript(["ok"]), route=A)
    assert out.getvalue().splitlines() == [
        "rateloop: 0 in flight, 0 waiting, 4 done (0 degraded), 0 rejected, 0 failed; paused: none"
    ]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("loop_type", [RateLoop, AsyncRateLoop])
def test_on_by_default_only_when_stderr_is_a_terminal(
    monkeypatch: pytest.MonkeyPatch, loop_type: Any
) -> None:
    monkeypatch.setattr(sys, "stderr", _Tty())
    assert [type(s) for s in loop_type().sinks] == [ConsoleSink]
    assert loop_type(sinks=[]).sinks == ()
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert loop_type().sinks == ()


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="summary_every"):
        ConsoleSink(summary_every=-1)


def test_the_summary_shows_headroom_when_told_how() -> None:
    clock = FakeClock()
    out = io.StringIO()
    sink = ConsoleSink(out, clock=clock, headroom=lambda: "openai:gpt-5 42 rpm")
    sink.call_started("openai:gpt-5")
    sink.flush()
    assert out.getvalue().rstrip().endswith("paused: none; headroom: openai:gpt-5 42 rpm")
    with pytest.raises(ValueError, match="headroom"):
        ConsoleSink(headroom="lots")  # type: ignore[arg-type]


def test_many_scopes_at_once_are_capped_and_counted() -> None:
    clock = FakeClock()
    out = io.StringIO()
    sink = ConsoleSink(out, clock=clock, max_lines=5, summary_every=60)
    for tenant in range(50):  # fifty tenant scopes throttled in the same instant
        sink(event("wait", scope=f"openai:gpt-5:proj:t{tenant}", wait_seconds=20.0,
                   retry_after_seconds=20.0, signal_kind="temporary", http_status=429))
    sink.flush()
    lines = out.getvalue().splitlines()
    assert len(lines) == 6  # five pause lines and the summary
    assert lines[-1].endswith("paused: openai:gpt-5:proj:t0, openai:gpt-5:proj:t1, "
                              "openai:gpt-5:proj:t10 and 47 more (45 lines held back)")
    with pytest.raises(ValueError, match="max_lines"):
        ConsoleSink(max_lines=0)
