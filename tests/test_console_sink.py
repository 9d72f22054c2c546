"""ConsoleSink: progress a person can read, never a flood (issue 10), on injected clocks."""

from __future__ import annotations

import asyncio
import heapq
import io
import itertools
import sys
from typing import Any

import httpx
import pytest

from rateloop.events import CapacityEvent, ConsoleSink, DecisionKind
from rateloop.loop import AsyncRateLoop, RateLoop
from rateloop.outcome import Outcome, Status
from rateloop.policy import Policy
from rateloop.route import Route
from rateloop.testing import FakeClock, FaultScript

OPENAI = "https://api.openai.com/v1/chat/completions"
A = Route(provider="openai", model="gpt-5")
B = Route(provider="anthropic", model="claude")


def throttle(retry_after: str) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", OPENAI)
    resp = httpx.Response(
        429,
        headers={"retry-after": retry_after},
        json={"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}},
        request=request,
    )
    return httpx.HTTPStatusError("429", request=request, response=resp)


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
