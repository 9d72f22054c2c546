"""Waiters by priority: the calls sleeping on each scope, read from the shared event stream."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
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
SRC = str(Path(__file__).resolve().parents[1] / "src")


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


POLICY = f"""
[limits."{SCOPE}"]
requests_per_minute = 6
burst = 1.0
"""


def look_from_outside(redis_url: str, prefix: str) -> dict[str, Any]:
    """The waiters as `rateloop status`, its --json, the dashboard's /api/state and the
    Prometheus and OpenTelemetry gauges show them, read from Redis now."""
    import tempfile
    import urllib.request

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from rateloop.observe.dashboard import Dashboard
    from rateloop.observe.state_metrics import ScopeStateCollector, observe_scope_state

    views: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        policy = Path(tmp) / "policy.toml"
        policy.write_text(POLICY)
        args = ["status", "--redis", redis_url, "--prefix", prefix, "-c", str(policy)]
        table = rateloop(*args)
        assert table.returncode == 0, table.stderr
        header, row = table.stdout.splitlines()[1:3]
        assert row.startswith(SCOPE)
        start = header.index("WAITING")
        end = start + len("WAITING") + len(header[start + len("WAITING"):]) - len(
            header[start + len("WAITING"):].lstrip())  # where the next column's name begins
        views["status"] = row[start:end].strip()
        out = rateloop(*args, "--json")
        assert out.returncode == 0, out.stderr
        views["json"] = json.loads(out.stdout)["scopes"][0]["waiters"]
    reader = RedisStateReader(redis_url, prefix=prefix, limits={SCOPE: SPEC})
    try:
        with Dashboard(reader, port=0, interval=60) as board:
            url = f"http://127.0.0.1:{board.port}/api/state"
            with urllib.request.urlopen(url, timeout=5) as resp:
                views["api_state"] = json.loads(resp.read())["snapshot"]["scopes"][0]["waiters"]
        registry = CollectorRegistry()
        registry.register(ScopeStateCollector(reader))
        text = generate_latest(registry).decode()
        views["prometheus"] = {
            s.labels["priority"]: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "rateloop_scope_waiters" and s.labels["scope"] == SCOPE
        }
        metric_reader = InMemoryMetricReader()
        provider = MeterProvider(metric_readers=[metric_reader])
        try:
            observe_scope_state(reader, meter_provider=provider)
            data = metric_reader.get_metrics_data()
        finally:
            provider.shutdown()
        assert data is not None
        views["otel"] = {
            p.attributes["rateloop.priority"]: p.value
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == "rateloop.scope.waiters"
            for p in m.data.data_points
        }
    finally:
        reader.close()
    return views


def rateloop(*args: str) -> subprocess.CompletedProcess[str]:
    # Wide enough that no column is dropped to fit (the table fits the terminal's width).
    env = {**os.environ, "PYTHONPATH": SRC, "COLUMNS": "300"}
    return subprocess.run(
        [sys.executable, "-m", "rateloop", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )


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
        async with asyncio.timeout(20):
            while len(clock.sleeps) < len(priorities):  # every call is asleep on its wait
                await asyncio.sleep(0.01)
        snap = reader.read()
        state = snap.scope(SCOPE)
        assert state is not None
        assert state.waiters == {"background": 1, "interactive": 2, "scheduled": 1}
        assert list(state.waiters) == ["interactive", "scheduled", "background"]  # by urgency
        assert snap.to_dict()["scopes"][0]["waiters"] == dict(state.waiters)
        # Every view of the live state shows them: another process's, a page's, a scraper's.
        views = await asyncio.to_thread(look_from_outside, redis_url, redis_prefix)
        assert views["status"] == "interactive 2, scheduled 1, background 1"
        for name in ("json", "api_state", "prometheus", "otel"):
            assert views[name] == dict(state.waiters), name
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
