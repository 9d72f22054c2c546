"""The dashboard: its timeline (sans-IO), its read-only server, and the page in real Chromium.

The browser test drives Debian's ``chromium`` through Playwright (no browser
download): it is skipped when either is missing, and fails instead under
``RATELOOP_REQUIRE_SERVICES=1`` (CI installs both, see ``.ci/run``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from rateloop.admission import LimitSpec
from rateloop.admission.limiter import Limiter
from rateloop.loop import RateLoop
from rateloop.observe.dashboard import Dashboard, timeline_entries
from rateloop.observe.redis_state import RedisStateReader
from rateloop.observe.state import DimensionState, ScopeState, Snapshot
from rateloop.outcome import Status
from rateloop.policy import Policy
from rateloop.route import Route

SCOPE = "openai:gpt-5:proj"
ROUTE = Route(provider="openai", model="gpt-5", project="proj")
OPENAI = "https://api.openai.com/v1/chat/completions"
SRC = str(Path(__file__).resolve().parents[1] / "src")
CHROMIUM = os.environ.get("RATELOOP_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
HOSTILE = "evil:<b>bold</b>"


# --- the timeline, sans-IO ------------------------------------------------------------------


def scope(
    *, paused: float | None = None, used: float = 0.0, factor: float = 1.0, day: float | None = None
) -> ScopeState:
    dims = [
        DimensionState(
            dimension="requests", kind="bucket", configured=60, effective=60.0 * factor,
            capacity=60.0, used=used, headroom=max(0.0, 60.0 - used),
        )
    ]  # fmt: skip
    if day is not None:
        dims.append(
            DimensionState(
                dimension="requests_per_day", kind="day", configured=1000, effective=1000.0,
                capacity=1000.0, used=day, headroom=1000.0 - day,
                resets_at=T0 + timedelta(hours=12),
            )
        )  # fmt: skip
    return ScopeState(
        scope=SCOPE, configured=True, factor=factor, leases=0, dimensions=tuple(dims),
        paused_until=T0 + timedelta(seconds=paused) if paused is not None else None,
        pause_reason="temporary" if paused is not None else None,
    )  # fmt: skip


def snap(at: float, state: ScopeState) -> Snapshot:
    return Snapshot(at=T0 + timedelta(seconds=at), prefix="p:", scopes=(state,))


def kinds(entries: list[dict[str, Any]]) -> list[str]:
    return [e["kind"] for e in entries]


def test_timeline_pause_then_resume() -> None:
    assert kinds(timeline_entries(snap(0, scope()), snap(1, scope(paused=30)))) == ["pause"]
    (entry,) = timeline_entries(snap(1, scope(paused=30)), snap(2, scope()))
    assert (entry["kind"], entry["scope"]) == ("resume", SCOPE)
    assert timeline_entries(snap(1, scope(paused=30)), snap(2, scope(paused=30))) == []
    # A longer pause over a shorter one is a new pause.
    assert kinds(timeline_entries(snap(1, scope(paused=30)), snap(2, scope(paused=90)))) == [
        "pause"
    ]
    # The first read shows a pause already in force.
    assert kinds(timeline_entries(None, snap(0, scope(paused=5)))) == ["pause"]


def test_timeline_admissions_net_of_the_drain_and_exact_from_a_day_count() -> None:
    # 10 used, 2 s at 1/s drains 2: 8 would remain; 13 now means ~5 admitted.
    (entry,) = timeline_entries(snap(0, scope(used=10)), snap(2, scope(used=13)))
    assert (entry["kind"], entry["count"]) == ("admit", 5)
    (entry,) = timeline_entries(snap(0, scope(used=10, day=40)), snap(2, scope(used=9, day=47)))
    assert entry["count"] == 7
    assert timeline_entries(snap(0, scope(used=10)), snap(2, scope(used=8))) == []


def test_timeline_exhaustion_and_a_lowered_factor() -> None:
    entries = timeline_entries(
        snap(0, scope(used=50, day=990)), snap(0.1, scope(used=60, day=1000, factor=0.8))
    )
    assert kinds(entries) == ["admit", "exhausted", "lowered"]
    assert entries[1]["text"] == "no headroom on requests_per_day"
    assert entries[2]["text"] == "AIMD factor lowered to 0.80"
    # A full paced bucket is pacing, not news; a bucket the provider blocked is.
    assert kinds(timeline_entries(snap(0, scope(used=50)), snap(0.1, scope(used=60)))) == ["admit"]
    blocked = replace(scope(used=60), dimensions=(
        replace(scope(used=60).dimensions[0], headroom=0.0, blocked_until=T0),
    ))  # fmt: skip
    assert kinds(timeline_entries(snap(0, scope(used=60)), snap(0.1, blocked))) == ["exhausted"]


# --- the server --------------------------------------------------------------------------------


class FixedReader:
    """A reader returning prepared snapshots (the server's tests need no Redis)."""

    def __init__(self, *snaps: Snapshot) -> None:
        self.snaps = list(snaps)

    def read(self) -> Snapshot:
        return self.snaps.pop(0) if len(self.snaps) > 1 else self.snaps[0]


def get(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, dict(err.headers), err.read()


def test_the_server_serves_the_page_and_the_state_read_only() -> None:
    reader = FixedReader(snap(0, scope()), snap(1, scope(paused=30)))
    with Dashboard(reader, port=0, interval=60) as board:
        base = f"http://127.0.0.1:{board.port}"
        status, headers, body = get(base + "/")
        assert status == 200 and b'<script src="/app.js"' in body
        assert headers["Content-Security-Policy"] == "default-src 'self'"
        for path in ("/app.js", "/style.css"):
            assert get(base + path)[0] == 200
        assert get(base + "/../pyproject.toml")[0] == 404
        board.poll_once()
        status, headers, body = get(base + "/api/state")
        state = json.loads(body)
        assert headers["Content-Type"] == "application/json"
        assert state["snapshot"]["scopes"][0]["paused"] is True
        assert kinds(state["timeline"]) == ["pause"]
        request = urllib.request.Request(base + "/api/state", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=5)
        assert info.value.code == 405
        info.value.close()


def test_the_server_refuses_a_non_loopback_bind_unless_allowed() -> None:
    with pytest.raises(ValueError, match=r"'0\.0\.0\.0'.*allow_remote"):
        Dashboard(FixedReader(snap(0, scope())), host="0.0.0.0")
    Dashboard(FixedReader(snap(0, scope())), host="0.0.0.0", allow_remote=True)  # not started


def test_the_server_listens_on_ipv6_loopback() -> None:
    with Dashboard(FixedReader(snap(0, scope())), host="::1", port=0, interval=60) as board:
        status, _, body = get(f"http://[::1]:{board.port}/api/state")
    assert status == 200 and json.loads(body)["snapshot"]["scopes"][0]["scope"] == SCOPE


def test_the_command_refuses_a_non_loopback_bind() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rateloop", "dashboard", "--host", "0.0.0.0"],
        capture_output=True, text=True, timeout=30, check=False,
        env={**os.environ, "PYTHONPATH": SRC},
    )  # fmt: skip
    assert out.returncode == 2
    assert "0.0.0.0" in out.stderr and "--allow-remote" in out.stderr


@pytest.mark.redis
def test_the_command_serves_the_live_state(redis_url: str, redis_prefix: str) -> None:
    limiter = Limiter.from_url(redis_url, prefix=redis_prefix)
    limiter.pause(SCOPE, 30.0, "temporary")
    limiter.close()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rateloop", "dashboard", "--redis", redis_url, "--prefix",
         redis_prefix, "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": SRC},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("rateloop dashboard on http://127.0.0.1:"), line
        url = line.split()[3]
        state = json.loads(get(url + "api/state")[2])
        assert state["snapshot"]["scopes"][0]["scope"] == SCOPE
        assert state["snapshot"]["scopes"][0]["paused"] is True
        status, headers, body = get(url + "metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert f'rateloop_scope_paused{{scope="{SCOPE}"}} 1.0' in body.decode()
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


# --- the page in real Chromium ------------------------------------------------------------


@pytest.fixture
def browser_page() -> Iterator[Any]:
    """A page of the Debian chromium, headless, with a fresh profile, driven by Playwright."""
    from conftest import _unavailable

    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        _unavailable(
            "chromium", FileNotFoundError(f"{CHROMIUM} (apt-get install chromium; .ci/run does)")
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        _unavailable("playwright (pip install 'rateloop[dev]')", exc)
    with (
        tempfile.TemporaryDirectory(prefix="rateloop-chromium-") as profile,
        sync_playwright() as p,
    ):
        context = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield context.new_page()
        finally:
            context.close()


class Workload:
    """Calls through a real RateLoop and Limiter on the real Redis, until told to throttle.

    The limiter paces the calls (5 per second); on :meth:`throttle` the next call
    gets a 429 with ``retry-after: 30``, which makes the loop pause the scope.
    """

    def __init__(self, limiter: Limiter, sinks: list[Any]) -> None:
        policy = Policy.from_dict({"backoff": {"jitter": "none"}})
        self.loop = RateLoop(policy, limiter=limiter, sinks=sinks)
        self.stop = threading.Event()
        self._throttle = threading.Event()
        self.throttled_at: float | None = None
        self.paused = threading.Event()
        self.calls = 0
        self.outcomes: list[Status] = []
        self.thread = threading.Thread(target=self._run, name="workload", daemon=True)

    def throttle(self) -> None:
        self._throttle.set()

    def _call(self, route: Route) -> httpx.Response:
        self.calls += 1
        request = httpx.Request("POST", OPENAI)
        if self._throttle.is_set() and self.throttled_at is None:
            # The loop pauses the scope right after this returns: time it from here.
            self.throttled_at = time.monotonic()
            return httpx.Response(
                429, headers={"retry-after": "30"}, json={"error": {"code": "rl"}}, request=request
            )
        return httpx.Response(200, json={"usage": {"prompt_tokens": 5}}, request=request)

    def _run(self) -> None:
        while not self.stop.is_set():
            # deadline: never hold the thread for the 30 s pause; stop with the outcome.
            out = self.loop.call(self._call, route=ROUTE, deadline=2.0)
            self.outcomes.append(out.status)
            if self.throttled_at is not None:
                self.paused.set()
                return


@pytest.mark.browser
@pytest.mark.redis
def test_the_page_shows_a_pause_within_2_seconds(
    browser_page: Any, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    from rateloop._clock import system_clock
    from rateloop.tasks import open_store
    from rateloop.testing import FakeClock
    from test_observe_queue import fill

    page = browser_page
    # A task store with one task parked on a daily quota after its first step.
    task_clock = FakeClock(start=system_clock.now())
    store = open_store(f"sqlite:///{tmp_path}/tasks.db", clock=task_clock)
    parked, _ = fill(store, task_clock)
    limits = {SCOPE: LimitSpec(requests_per_minute=300, requests_per_day=10_000)}
    limiter = Limiter.from_url(redis_url, prefix=redis_prefix, limits=limits)
    reader = RedisStateReader(redis_url, prefix=redis_prefix, limits=limits)
    from rateloop.observe.redis_events import RedisEventSink

    sink = RedisEventSink(redis_url, prefix=redis_prefix)
    workload = Workload(limiter, [sink])
    # The default interval, as `rateloop dashboard` runs.
    board = Dashboard(reader, store=store, port=0)
    board.start()
    try:
        # A scope whose name is markup: the page must show it as text, never run it.
        limiter.pause(HOSTILE, 60.0, "<i>why</i>")
        methods: list[str] = []
        page.on("request", lambda request: methods.append(request.method))
        workload.thread.start()
        page.goto(f"http://127.0.0.1:{board.port}/")
        card = f'section.scope[data-scope="{SCOPE}"]'
        page.wait_for_selector(f'{card}[data-paused="false"] .gauge[data-dimension="requests"]')
        # The workload's admissions reach the page's timeline.
        page.wait_for_selector(f'#timeline li[data-kind="admit"][data-scope="{SCOPE}"]')
        assert workload.calls >= 1 and not workload.paused.is_set()

        workload.throttle()
        assert workload.paused.wait(timeout=10), "the workload never got its 429"
        page.wait_for_selector(f'{card}[data-paused="true"]', timeout=5000)
        assert workload.throttled_at is not None
        elapsed = time.monotonic() - workload.throttled_at
        assert elapsed < 2.0, f"the page showed the pause {elapsed:.2f} s after it happened"

        badge = page.inner_text(f"{card} .badge")
        assert badge.startswith("paused until") and "temporary" in badge
        page.wait_for_selector(f'#timeline li[data-kind="pause"][data-scope="{SCOPE}"]')
        # The refusal itself, shared by the workload's RedisEventSink.
        page.wait_for_selector(f'#timeline li[data-kind="rejected_remote"][data-scope="{SCOPE}"]')
        assert workload.outcomes[-1] is Status.WAITING_FOR_CAPACITY
        assert all(s is Status.COMPLETED for s in workload.outcomes[:-1])
        assert page.locator(f"{card} .gauge").count() == 2
        hostile = page.locator("section.scope", has_text="<b>bold</b>")
        assert hostile.count() == 1 and "<i>why</i>" in hostile.inner_text()
        assert page.locator("section.scope b, section.scope i").count() == 0
        # Read-only: the page asked for nothing but GETs.
        assert methods and set(methods) == {"GET"}
        # The parked task, with its wake-up and the steps it has left.
        row = f'#tasks tr[data-task-id="{parked}"][data-state="waiting_for_reset"]'
        assert page.inner_text(f"{row} .remaining") == "draft, publish"
        assert page.inner_text(f"{row} .retry-at") != "-"
        assert page.inner_text("#queue-summary").startswith("depth 2")
    finally:
        workload.stop.set()
        workload.thread.join(timeout=10)
        board.stop()
        reader.close()
        sink.close()
        limiter.close()
        store.close()


# --- the workers' events, shared through Redis ------------------------------------------------


@pytest.mark.redis
def test_events_shared_through_redis_reach_the_timeline_without_secrets(
    redis_url: str, redis_prefix: str
) -> None:
    from rateloop.observe.redis_events import RedisEventSink

    key = "sk-proj-" + "Z" * 40
    sink = RedisEventSink(redis_url, prefix=redis_prefix, maxlen=50)
    limiter = Limiter.from_url(
        redis_url, prefix=redis_prefix, limits={SCOPE: LimitSpec(requests_per_minute=60)}
    )
    loop = RateLoop(
        Policy.from_dict({"backoff": {"jitter": "none"}}), limiter=limiter, sinks=[sink]
    )

    def refused(route: Route) -> httpx.Response:
        request = httpx.Request("POST", OPENAI, headers={"authorization": f"Bearer {key}"})
        body = {"error": {"message": f"slow down {key}", "code": "rl"}}
        return httpx.Response(429, headers={"retry-after": "30"}, json=body, request=request)

    reader = RedisStateReader(redis_url, prefix=redis_prefix)
    try:
        last, before = reader.read_events()
        assert (last, before) == (None, [])
        out = loop.call(refused, route=ROUTE, deadline=2.0, operation=f"chat {key}")
        assert out.status is Status.WAITING_FOR_CAPACITY
        last, entries = reader.read_events()
        # The loop paused the scope for the server's 30 s (a pause event), then stopped.
        assert [e["kind"] for e in entries] == ["pause", "rejected_remote"]
        entries = entries[1:]
        assert entries[0]["scope"] == SCOPE
        assert "temporary" in entries[0]["text"] and "HTTP 429" in entries[0]["text"]
        assert reader.read_events(last) == (last, [])  # nothing new after the last id
        import redis

        client = redis.Redis.from_url(redis_url)
        raw = repr(client.xrange(f"{redis_prefix}events"))
        client.close()
        assert "Z" * 20 not in raw and "slow down" not in raw
    finally:
        reader.close()
        sink.close()
        limiter.close()


def test_an_unreachable_redis_drops_events_and_never_breaks_the_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from rateloop.observe.redis_events import RedisEventSink

    sink = RedisEventSink("redis://127.0.0.1:1/0", socket_timeout=0.5)
    loop = RateLoop(Policy.from_dict({"backoff": {"jitter": "none"}}), sinks=[sink])
    request = httpx.Request("POST", OPENAI)
    refused = httpx.Response(400, json={"error": {"code": "bad"}}, request=request)
    with caplog.at_level("WARNING", logger="rateloop.observe"):
        for _ in range(2):
            out = loop.call(lambda route: refused, route=ROUTE)
            assert out.status is Status.INVALID
    assert [r.getMessage().startswith("rateloop: dropping events") for r in caplog.records] == [
        True
    ]
    sink.close()


class HeldClock:
    """A fake clock per call whose sleeps hold the calling thread until the gate opens."""

    def __init__(self, gate: threading.Event) -> None:
        from rateloop.testing import FakeClock

        self.fake, self.gate = FakeClock(), gate
        self.slept = threading.Event()

    def monotonic(self) -> float:
        return self.fake.monotonic()

    def now(self) -> datetime:
        return self.fake.now()

    def sleep(self, seconds: float) -> None:
        self.fake.sleep(seconds)
        self.slept.set()
        assert self.gate.wait(timeout=30), "the test never opened the gate"

    async def asleep(self, seconds: float) -> None:  # pragma: no cover - sync calls only
        raise AssertionError("sync calls only")


@pytest.mark.browser
@pytest.mark.redis
def test_the_page_shows_the_calls_waiting_by_priority(
    browser_page: Any, redis_url: str, redis_prefix: str
) -> None:
    from rateloop.admission.reservation import Reservation
    from rateloop.observe.redis_events import RedisEventSink
    from rateloop.route import Cost

    page = browser_page
    limits = {SCOPE: LimitSpec(requests_per_minute=6, burst=1.0)}
    limiter = Limiter.from_url(redis_url, prefix=redis_prefix, limits=limits)
    assert all(isinstance(limiter.try_reserve(ROUTE, Cost()), Reservation) for _ in range(6))
    reader = RedisStateReader(redis_url, prefix=redis_prefix, limits=limits)
    sink = RedisEventSink(redis_url, prefix=redis_prefix)
    gate = threading.Event()
    outcomes: list[Status] = []

    def never_called(route: Route) -> Any:
        raise AssertionError("the scope is full: no attempt may start")

    def call(clock: HeldClock, priority: str) -> None:
        loop = RateLoop(Policy.from_dict({}), limiter=limiter, clock=clock, sinks=[sink])
        out = loop.call(never_called, route=ROUTE, priority=priority, deadline=60.0)
        outcomes.append(out.status)

    priorities = ["interactive", "background", "background"]
    clocks = [HeldClock(gate) for _ in priorities]
    threads = [
        threading.Thread(target=call, args=(c, p), daemon=True)
        for c, p in zip(clocks, priorities, strict=True)
    ]
    board = Dashboard(reader, port=0)
    board.start()
    try:
        for t in threads:
            t.start()
        assert all(c.slept.wait(timeout=10) for c in clocks), "a call never waited"
        page.goto(f"http://127.0.0.1:{board.port}/")
        card = f'section.scope[data-scope="{SCOPE}"]'
        page.wait_for_selector(f'{card} .waiters[data-waiting="3"]', timeout=5000)
        assert page.inner_text(f'{card} .waiter[data-priority="interactive"]') == "interactive 1"
        assert page.inner_text(f'{card} .waiter[data-priority="background"]') == "background 2"
        # Released, each call asks again, waits again and stops at its deadline: none waits.
        gate.set()
        for t in threads:
            t.join(timeout=10)
        assert outcomes == [Status.WAITING_FOR_CAPACITY] * 3
        page.wait_for_selector(f'{card} .waiters[data-waiting="0"]', timeout=5000)
        assert page.inner_text(f"{card} .waiters") == "waiting: none"
    finally:
        gate.set()
        board.stop()
        reader.close()
        sink.close()
        limiter.close()


# --- notable events kept apart from routine ones ----------------------------------------------


def _event(decision: str, **fields: Any) -> Any:
    from rateloop.outcome.events import CapacityEvent, DecisionKind

    return CapacityEvent(decision=DecisionKind(decision), operation="chat", **fields)


@pytest.mark.redis
def test_a_pause_and_a_fallback_outlive_two_thousand_admissions_on_the_timeline(
    redis_url: str, redis_prefix: str
) -> None:
    from rateloop.observe.redis_events import RedisEventSink

    to_scope = "anthropic:claude-x:proj"
    sink = RedisEventSink(redis_url, prefix=redis_prefix)
    reader = RedisStateReader(redis_url, prefix=redis_prefix)
    board = Dashboard(reader, port=0)
    try:
        board.poll_once()  # the dashboard is up before the events arrive, as in production
        sink(_event("pause", scope=SCOPE, wait_seconds=30.0, reason="temporary"))
        sink(
            _event(
                "fallback", provider="anthropic", model="claude-x", scope=to_scope,
                from_provider="openai", from_model="gpt-5", from_scope=SCOPE,
                signal_kind="temporary", http_status=429, reason="rate limited",
            )
        )  # fmt: skip
        for _ in range(2000):
            sink(_event("admission_wait", scope=SCOPE, wait_seconds=0.01, priority="normal"))
        for _ in range(40):  # each read takes at most 200 events: catch up, bounded
            board.poll_once()
        timeline = board.state()["timeline"]
        kinds_seen = [e["kind"] for e in timeline]
        assert "pause" in kinds_seen, kinds_seen[:5]
        (fallback,) = [e for e in timeline if e["decision"] == "fallback"]
        assert fallback["scope"] == to_scope
        text = "fallback openai:gpt-5 → anthropic:claude-x (temporary, HTTP 429)"
        assert fallback["text"] == text
        assert (fallback["from"], fallback["to"]) == (SCOPE, to_scope)
        # The routine events are still served, newest first, each once.
        assert [e["decision"] for e in timeline].count("admission_wait") == 200
        assert timeline[0]["decision"] == "admission_wait"
        ats = [datetime.fromisoformat(e["at"]) for e in timeline]
        assert ats == sorted(ats, reverse=True)
    finally:
        board.stop()
        reader.close()
        sink.close()


@pytest.mark.redis
def test_only_notable_decisions_reach_the_notable_stream_with_the_route_fallen_from(
    redis_url: str, redis_prefix: str
) -> None:
    import redis

    from rateloop.admission.backends.keys import events_key, notable_events_key
    from rateloop.observe.redis_events import NOTABLE_DECISIONS, RedisEventSink

    assert {"pause", "fallback", "skip", "stop"} == NOTABLE_DECISIONS
    sink = RedisEventSink(redis_url, prefix=redis_prefix, notable_maxlen=5)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        sink(_event("wait", scope=SCOPE, wait_seconds=1.0))
        sink(
            _event(
                "skip", provider="openai", model="gpt-5", scope=SCOPE, from_provider="openai",
                from_model="gpt-5", from_scope=SCOPE, signal_kind="quota", http_status=429,
            )
        )  # fmt: skip
        sink(_event("stop", scope=SCOPE, status="waiting_for_capacity"))
        assert client.xlen(events_key(redis_prefix)) == 3  # every event, as before
        notable = client.xrange(notable_events_key(redis_prefix))
        assert [f["decision"] for _, f in notable] == ["skip", "stop"]
        assert notable[0][1]["from_scope"] == SCOPE and notable[0][1]["from_model"] == "gpt-5"
        for _ in range(300):  # the notable stream is capped by its own maxlen
            sink(_event("pause", scope=SCOPE, wait_seconds=5.0))
        assert client.xlen(notable_events_key(redis_prefix)) < 300
    finally:
        client.close()
        sink.close()
    with pytest.raises(ValueError, match="notable_maxlen must be an int >= 1, got 0"):
        RedisEventSink(redis_url, prefix=redis_prefix, notable_maxlen=0)


@pytest.mark.redis
def test_a_real_fallback_reads_back_naming_the_route_it_left_and_why(
    redis_url: str, redis_prefix: str
) -> None:
    from rateloop.observe.redis_events import RedisEventSink
    from rateloop.testing import FakeClock, FaultScript

    openai = Route(provider="openai", model="gpt-x", project="proj")
    anthropic = Route(provider="anthropic", model="claude-y", project="proj")
    request = httpx.Request("POST", OPENAI)
    body = {"error": {"message": "refused", "type": "insufficient_quota"}}
    refused = httpx.Response(429, json=body, request=request)
    answered = httpx.Response(200, request=httpx.Request("POST", "https://api.anthropic.com/v1"))
    fn = FaultScript(
        {"gpt-x": [httpx.HTTPStatusError("429", request=request, response=refused)],
         "claude-y": [answered]}
    )  # fmt: skip
    sink = RedisEventSink(redis_url, prefix=redis_prefix)
    reader = RedisStateReader(redis_url, prefix=redis_prefix)
    policy = Policy.from_dict({"backoff": {"jitter": "none"}, "attempts_per_route": 1})
    try:
        out = RateLoop(policy, clock=FakeClock(), sinks=[sink]).call(
            fn, route=openai, fallbacks=[anthropic]
        )
        assert out.status is Status.DEGRADED
        _, notable = reader.read_notable_events()
        (entry,) = [e for e in notable if e["decision"] == "fallback"]
        assert entry["text"].startswith("fallback openai:gpt-x → anthropic:claude-y (")
        assert entry["text"].endswith(", HTTP 429)"), entry["text"]
        assert (entry["from"], entry["to"], entry["scope"]) == (
            openai.scope, anthropic.scope, anthropic.scope,
        )  # fmt: skip
    finally:
        reader.close()
        sink.close()
