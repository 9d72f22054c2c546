"""Each scope's per-minute history: written by the limiter and the loop's events, read back.

Unit tests run on a FakeClock with the memory limiter; the Redis tests use the
real server (the admission, settle and pause scripts write the history; the
RedisEventSink adds the loop's counts); the browser test opens the dashboard's
charts in the real Chromium and writes docs/img/dashboard-charts.png.
"""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from rateloop.admission import LimitSpec
from rateloop.admission.backends.keys import history_key, history_scope_of_key, key_of
from rateloop.admission.history import (
    HISTORY_MINUTES,
    MemoryHistory,
    Usage,
    check_minutes,
    minute_of,
    scope_history,
)
from rateloop.admission.limiter import Limiter
from rateloop.loop import RateLoop
from rateloop.observe.dashboard import Dashboard
from rateloop.observe.history import HistorySink, event_counts
from rateloop.observe.redis_state import RedisStateReader
from rateloop.outcome import Status
from rateloop.outcome.events import CapacityEvent, DecisionKind
from rateloop.policy import Policy
from rateloop.route import Cost, Route
from rateloop.testing import FakeClock, FaultScript
from test_observe_dashboard import browser_page  # noqa: F401 - a fixture
from test_observe_status import rateloop

SCOPE = "openai:gpt-5:proj"
ROUTE = Route(provider="openai", model="gpt-5", project="proj")
OPENAI = "https://api.openai.com/v1/chat/completions"
T0 = datetime(2026, 3, 1, 12, 0, 5, tzinfo=UTC)
LIMITS = {
    SCOPE: LimitSpec(
        requests_per_minute=600, input_tokens_per_minute=60_000, requests_per_day=1000,
        concurrency=4,
    )
}  # fmt: skip
SCREENSHOT = Path(__file__).resolve().parents[1] / "docs" / "img" / "dashboard-charts.png"


def throttled(retry_after: str = "2") -> httpx.HTTPStatusError:
    request = httpx.Request("POST", OPENAI)
    response = httpx.Response(429, headers={"retry-after": retry_after}, request=request)
    return httpx.HTTPStatusError("429", request=request, response=response)


def ok(tokens: int = 12) -> httpx.Response:
    request = httpx.Request("POST", OPENAI)
    return httpx.Response(200, json={"usage": {"prompt_tokens": tokens}}, request=request)


# --- the memory limiter ------------------------------------------------------------------------


def test_the_memory_limiter_records_admissions_units_and_limits_per_minute() -> None:
    clock = FakeClock(start=T0)
    limiter = Limiter(limits=LIMITS, clock=clock)
    held = limiter.try_reserve(ROUTE, Cost(input_tokens=100))
    for _ in range(2):
        limiter.try_reserve(ROUTE, Cost(input_tokens=100)).settle(40, 0)  # type: ignore[union-attr]
    clock.advance(60)
    limiter.try_reserve(ROUTE, Cost(input_tokens=10))
    assert held is not None
    history = limiter.backend.history  # type: ignore[attr-defined]
    (h,) = history.read(5, now=clock.now().timestamp()).values()
    first, second = h.minutes
    start = T0.replace(second=0)
    assert (first.at, second.at) == (start, start + timedelta(minutes=1))
    assert first.admissions == 3 and second.admissions == 1
    assert first.usage["requests"].used == 3 and first.usage["requests"].limit == 600
    # Two calls settled 40 of their 100 tokens: 60 each refunded.
    assert first.usage["input_tokens"].used == 300 - 120
    assert first.usage["input_tokens"].limit == 60_000
    day = first.usage["requests_per_day"]
    assert (day.count, day.limit) == (3, 1000)
    # One lease still held (the first reservation), of 4; counted at the last admission.
    assert first.usage["concurrency"].count == 2 and first.usage["concurrency"].limit == 4
    assert second.usage["requests_per_day"].count == 4


def test_a_memory_limiter_without_history_keeps_none() -> None:
    limiter = Limiter.from_url("memory://", limits=LIMITS, clock=FakeClock(start=T0), history=False)
    assert limiter.backend.history is None  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="history must be True or False, got 'yes'"):
        Limiter.from_url("memory://", history="yes")


def test_the_memory_history_is_bounded_and_trimmed_by_its_writer() -> None:
    history = MemoryHistory(minutes=10)
    start = T0.timestamp()
    for m in range(25):
        history.add(SCOPE, start + 60 * m, {"a": 1})
    rows = history._scopes[SCOPE]
    assert len(rows) == 10
    assert rows[0][0] == minute_of(start) + 15 and rows[-1][0] == minute_of(start) + 24
    # A write later than what is kept is dropped, never put out of order.
    history.add(SCOPE, start, {"a": 5})
    assert [m for m, _ in rows] == sorted(m for m, _ in rows) and len(rows) == 10
    (h,) = history.read(10, now=start + 60 * 24).values()
    assert [m.admissions for m in h.minutes] == [1] * 10
    # Reading a window shorter than what is kept.
    assert len(history.read(3, now=start + 60 * 24)[SCOPE].minutes) == 3


@pytest.mark.parametrize("bad", [0, -1, HISTORY_MINUTES + 1, 1.5, True, "60"])
def test_a_bad_history_window_is_refused_naming_it(bad: object) -> None:
    with pytest.raises(ValueError, match=f"from 1 to {HISTORY_MINUTES}, got {bad!r}"):
        check_minutes(bad)
    with pytest.raises(ValueError, match="history_minutes must be"):
        Dashboard(object(), history_minutes=bad)  # type: ignore[arg-type]


def test_pause_bands_merge_where_they_overlap() -> None:
    m = minute_of(T0.timestamp())
    s = T0.timestamp()
    h = scope_history(SCOPE, [
        (m, {"p": "1", "ps": repr(s), "pu": repr(s + 90)}),
        (m + 1, {"p": "1", "ps": repr(s + 80), "pu": repr(s + 100)}),
        (m + 5, {"p": "1", "ps": repr(s + 300), "pu": repr(s + 310)}),
    ])  # fmt: skip
    assert [(a.timestamp() - s, b.timestamp() - s) for a, b in h.pauses] == [(0, 100), (300, 310)]
    assert sum(x.pauses for x in h.minutes) == 3


def event(decision: str, **fields: Any) -> CapacityEvent:
    return CapacityEvent(decision=DecisionKind(decision), operation="chat", **fields)


def test_event_counts_blame_the_route_that_refused_and_count_waits_and_fallbacks() -> None:
    wait = event("admission_wait", scope=SCOPE, wait_seconds=2.5)
    assert event_counts(wait, "waited") == [(SCOPE, {"w": 1.0, "ws": 2.5})]
    fallback = event("fallback", scope="anthropic:claude-x", from_scope=SCOPE)
    assert event_counts(fallback, "rejected_remote") == [(SCOPE, {"r": 1.0}), (SCOPE, {"f": 1.0})]
    assert event_counts(event("retry", scope=SCOPE), None) == []


def test_the_history_sink_adds_the_loops_refusals_waits_and_pauses() -> None:
    clock = FakeClock(start=T0)
    limiter = Limiter(limits=LIMITS, clock=clock)
    sink = HistorySink(limiter.backend.history, clock=clock)  # type: ignore[attr-defined]
    loop = RateLoop(Policy.from_dict({"backoff": {"jitter": "none"}}), limiter=limiter,
                    clock=clock, sinks=[sink])  # fmt: skip
    assert loop.call(FaultScript([throttled(), ok()]), route=ROUTE).ok
    assert loop.call(FaultScript([throttled("3"), ok()]), route=ROUTE).ok
    sink(event("fallback", scope="anthropic:claude-x", from_scope=SCOPE))
    (h,) = limiter.backend.history.read(5, now=clock.now().timestamp()).values()  # type: ignore[attr-defined]
    totals = {k: sum(getattr(m, k) for m in h.minutes)
              for k in ("admissions", "refusals", "pauses", "fallbacks", "waits")}  # fmt: skip
    assert totals == {"admissions": 4, "refusals": 2, "pauses": 2, "fallbacks": 1, "waits": 0}
    # Two pauses in one minute: one band, from the first's start to the latest end.
    ((start, end),) = h.pauses
    assert start == T0 and end > T0 + timedelta(seconds=5)
    with pytest.raises(TypeError, match="needs a MemoryHistory"):
        HistorySink(object())  # type: ignore[arg-type]


def test_the_history_sink_counts_an_admission_wait_and_its_seconds() -> None:
    clock = FakeClock(start=T0)
    limiter = Limiter(limits=LIMITS, clock=clock)
    sink = HistorySink(limiter.backend.history, clock=clock)  # type: ignore[attr-defined]
    loop = RateLoop(Policy(), limiter=limiter, clock=clock, sinks=[sink])
    limiter.pause(SCOPE, 4.0, "temporary")
    assert loop.call(FaultScript([ok()]), route=ROUTE).ok
    (h,) = limiter.backend.history.read(5, now=clock.now().timestamp()).values()  # type: ignore[attr-defined]
    assert sum(m.waits for m in h.minutes) == 1
    assert 4.0 <= sum(m.wait_seconds for m in h.minutes) <= 5.0  # the pause, and jitter


# --- Redis ----------------------------------------------------------------------------------


def test_history_keys_are_not_scopes_and_name_their_scope() -> None:
    key = history_key("p:", SCOPE, 483_333)  # an epoch hour: one hash per scope and hour
    assert key == "p:{openai:gpt-5}:h:openai:gpt-5:proj:483333"
    assert history_scope_of_key("p:", key) == SCOPE
    assert history_scope_of_key("p:", key_of("p:", "s", SCOPE)) is None
    assert history_scope_of_key("p:", "p:{openai:gpt-4}:h:openai:gpt-5:proj:1") is None


@pytest.mark.redis
def test_the_redis_scripts_and_the_event_sink_write_the_history(
    redis_url: str, redis_prefix: str
) -> None:
    import redis

    from rateloop.observe.redis_events import RedisEventSink

    limiter = Limiter.from_url(redis_url, prefix=redis_prefix, limits=LIMITS)
    sink = RedisEventSink(redis_url, prefix=redis_prefix)
    reader = RedisStateReader(redis_url, prefix=redis_prefix, limits=LIMITS)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    loop = RateLoop(Policy.from_dict({"backoff": {"jitter": "none"}}), limiter=limiter,
                    sinks=[sink])  # fmt: skip
    try:
        reserved = limiter.try_reserve(ROUTE, Cost(input_tokens=100))
        reserved.settle(30, 0)  # type: ignore[union-attr]
        # A 429 with a 1 s minimum: refused, paused, then admitted after the pause.
        out = loop.call(FaultScript([throttled("1"), ok()]), route=ROUTE, deadline=10.0)
        assert out.ok
        # A pause the next call waits for in admission: a local wait.
        limiter.pause(SCOPE, 0.5, "temporary")
        assert loop.call(FaultScript([ok()]), route=ROUTE, deadline=10.0).ok
        past = reader.read_history(5)
        h = past[SCOPE]
        total = {k: sum(getattr(m, k) for m in h.minutes)
                 for k in ("admissions", "refusals", "pauses", "waits")}  # fmt: skip
        assert total == {"admissions": 4, "refusals": 1, "pauses": 2, "waits": 1}
        assert 0.4 < sum(m.wait_seconds for m in h.minutes) < 1.0
        assert h.pauses and all(b > a for a, b in h.pauses)
        used = sum(m.usage["input_tokens"].used for m in h.minutes)
        assert used == 30 + 2 * 12  # settled 30 of 100; each loop call reported 12 tokens
        last = h.minutes[-1]
        assert last.usage["requests"].limit == 600 and last.usage["requests_per_day"].limit == 1000
        keys = list(client.scan_iter(match=f"{redis_prefix}{{*}}:h:*"))
        # One hash per scope and hour (two if the test crossed an hour), expiring a day
        # after its hour ends; in it a field per minute (the record) and the loop's counts.
        assert 1 <= len(keys) <= 2
        now = float(client.time()[0])
        for k in keys:
            ends = (int(k.rsplit(":", 1)[1]) + 1) * 3600 + 86_400
            assert abs(client.ttl(k) - (ends - now)) <= 2
            for name, value in client.hgetall(k).items():
                minute, _, count = name.partition(":")
                assert 0 <= int(minute) < 60 and count in ("", "r", "w", "ws")
                assert count or value.split()[0::2][:1] == ["a"]  # a record: "a N u:... N ..."
        # A scope whose state expired is still listed while its history is kept.
        client.delete(key_of(redis_prefix, "s", SCOPE))
        assert SCOPE in [s.scope for s in reader.read().scopes]
    finally:
        client.close()
        reader.close()
        sink.close()
        limiter.close()


HISTORY_LUA = """
local ops = cjson.decode(ARGV[2])
history(KEYS[1], tonumber(ARGV[1]), ops, 86400)
return 1
"""


@pytest.mark.redis
def test_the_scripts_history_packs_a_record_per_minute_in_a_hash_per_hour(
    redis_url: str, redis_prefix: str
) -> None:
    """_common.lua's ``history``, the one writer of every script, run at chosen times."""
    import redis

    from rateloop.admission.backends.scripts import _common
    from rateloop.observe.history import read_redis_history

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    write = client.register_script(_common() + HISTORY_LUA)
    base = key_of(redis_prefix, "h", SCOPE)
    hour = int(client.time()[0]) // 3600
    t0 = hour * 3600 + 58 * 60 + 5.25  # minute 58 of this hour; then 59, then the next's 0
    try:
        for at, ops in [
            (t0, ["+", "a", 1, "+", "u:requests", 1, "=", "L:requests", 600]),
            (t0 + 1, ["+", "a", 1, "+", "u:requests", 2.5, "=", "L:requests", 300]),
            (t0 + 2, ["+", "p", 1, "<", "ps", t0 + 2, ">", "pu", t0 + 40]),
            (t0 + 3, ["+", "p", 1, "<", "ps", t0 + 3, ">", "pu", t0 + 20]),
            (t0 + 60, ["+", "a", 1, "=", "c:concurrency", 2]),
            (t0 + 120, ["+", "a", 1, "+", "u:requests", -1]),
        ]:
            write(keys=[base], args=[repr(at), json.dumps(ops)])
        assert client.hgetall(f"{base}:{hour}") == {
            "58": f"a 2 u:requests 3.5 L:requests 300 p 2 ps {t0 + 2!r} pu {t0 + 40!r}",
            "59": "a 1 c:concurrency 2",
        }
        assert client.hgetall(f"{base}:{hour + 1}") == {"0": "a 1 u:requests -1"}
        # Each hour's hash expires a day after that hour ends.
        now = float(client.time()[0])
        for h in (hour, hour + 1):
            assert abs(client.ttl(f"{base}:{h}") - ((h + 1) * 3600 + 86_400 - now)) <= 2
        # The loop's counts in the same hash, as the event sink writes them.
        client.hincrby(f"{base}:{hour}", "59:r", 2)
        # A window across the two hours: the minutes in it, and only those.
        two = read_redis_history(client, redis_prefix, [SCOPE], 2, t0 + 120)[SCOPE]
        assert [(m.at.minute, m.admissions, m.refusals) for m in two.minutes] == [
            (59, 1, 2), (0, 1, 0)
        ]  # fmt: skip
        assert two.pauses == ()
        three = read_redis_history(client, redis_prefix, [SCOPE], 3, t0 + 120)[SCOPE]
        first = three.minutes[0]
        assert (first.admissions, first.pauses, first.usage["requests"]) == (
            2, 2, Usage(used=3.5, limit=300.0)
        )  # fmt: skip
        assert [(a.timestamp(), b.timestamp()) for a, b in three.pauses] == [(t0 + 2, t0 + 40)]
    finally:
        client.delete(f"{base}:{hour}", f"{base}:{hour + 1}")
        client.close()


@pytest.mark.redis
def test_without_history_the_redis_scripts_and_sink_write_none(
    redis_url: str, redis_prefix: str
) -> None:
    import redis

    from rateloop.observe.redis_events import RedisEventSink

    limiter = Limiter.from_url(redis_url, prefix=redis_prefix, limits=LIMITS, history=False)
    sink = RedisEventSink(redis_url, prefix=redis_prefix, history=False)
    loop = RateLoop(Policy.from_dict({"backoff": {"jitter": "none"}}), limiter=limiter,
                    sinks=[sink])  # fmt: skip
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        assert loop.call(FaultScript([throttled("0.2"), ok()]), route=ROUTE, deadline=5.0).ok
        assert list(client.scan_iter(match=f"{redis_prefix}{{*}}:h:*")) == []
        assert list(client.scan_iter(match=f"{redis_prefix}{{*}}:s:*"))  # the state is there
    finally:
        client.close()
        sink.close()
        limiter.close()


@pytest.mark.redis
def test_status_json_includes_the_history_when_asked(redis_url: str, redis_prefix: str) -> None:
    limiter = Limiter.from_url(redis_url, prefix=redis_prefix, limits=LIMITS)
    try:
        for _ in range(3):
            limiter.try_reserve(ROUTE, Cost(input_tokens=10))
    finally:
        limiter.close()
    base = ("status", "--redis", redis_url, "--prefix", redis_prefix)
    plain = json.loads(rateloop(*base, "--json").stdout)
    assert "history" not in plain
    out = rateloop(*base, "--json", "--history", "3")
    assert out.returncode == 0, out.stderr
    h = json.loads(out.stdout)["history"][SCOPE]
    assert sum(m["admissions"] for m in h["minutes"]) == 3
    assert h["minutes"][-1]["usage"]["input_tokens"]["used"] == 30
    table = rateloop(*base, "--history", "3").stdout
    assert f"{SCOPE}  admitted 3  refused 0" in table
    bad = rateloop(*base, "--history", "99999")
    assert bad.returncode == 2 and "--history" in bad.stderr


# --- the charts in the real Chromium -----------------------------------------------------------


@pytest.mark.browser
@pytest.mark.redis
def test_the_page_charts_the_history_updates_it_and_shades_a_pause(
    browser_page: Any,  # noqa: F811 - the fixture imported above
    redis_url: str,
    redis_prefix: str,
) -> None:
    from rateloop.observe.redis_events import RedisEventSink

    page = browser_page
    page.set_viewport_size({"width": 1200, "height": 900})
    limits = {SCOPE: LimitSpec(requests_per_minute=600, input_tokens_per_minute=600_000,
                               requests_per_day=500)}  # fmt: skip
    limiter = Limiter.from_url(redis_url, prefix=redis_prefix, limits=limits)
    reader = RedisStateReader(redis_url, prefix=redis_prefix, limits=limits)
    sink = RedisEventSink(redis_url, prefix=redis_prefix)
    loop = RateLoop(Policy.from_dict({"backoff": {"jitter": "none"}}), limiter=limiter,
                    sinks=[sink])  # fmt: skip
    board = Dashboard(reader, port=0, interval=0.3, history_minutes=15)
    board.start()
    block = f'.history[data-scope="{SCOPE}"]'
    try:
        for _ in range(5):
            assert loop.call(FaultScript([ok(400)]), route=ROUTE).ok
        page.goto(f"http://127.0.0.1:{board.port}/")
        page.wait_for_selector(f'{block}[data-admissions="5"]', timeout=10_000)
        # Two charts, each a uPlot canvas with its series in the legend.
        assert page.locator(f"{block} .uplot canvas").count() == 2
        labels = page.locator(f"{block} .u-legend .u-series .u-label").all_inner_texts()
        for name in ("requests", "input_tokens", "requests_per_day", "refusals", "local waits"):
            assert name in labels
        assert page.get_attribute(block, "data-pauses") == "0"
        # New calls reach the open page: the charts update without a reload.
        for _ in range(3):
            assert loop.call(FaultScript([ok(400)]), route=ROUTE).ok
        page.wait_for_selector(f'{block}[data-admissions="8"]', timeout=5_000)
        # A 429 with a server minimum pauses the scope: a shaded band, and the refusal.
        out = loop.call(FaultScript([throttled("30")]), route=ROUTE, deadline=1.0)
        assert out.status is Status.WAITING_FOR_CAPACITY
        page.wait_for_selector(f'{block}[data-pauses="1"][data-refusals="1"]', timeout=5_000)
        # The band is drawn: the plot area holds the pause's red (the canvas is painted
        # after the attributes change: wait for the paint, not just the data).
        count_red = """(sel) => {
              const c = document.querySelector(sel + ' .usage canvas');
              const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
              let n = 0;
              for (let i = 0; i < d.length; i += 4)
                if (d[i] > 200 && d[i + 1] < 235 && d[i + 2] < 235 && d[i] - d[i + 1] > 15) n++;
              return n;
            }"""
        with contextlib.suppress(Exception):  # the assertion below reports what was drawn
            page.wait_for_function(f"(sel) => ({count_red})(sel) > 50", arg=block, timeout=5_000)
        red = page.evaluate(count_red, block)
        assert red > 50, "no pause band drawn"
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT), full_page=True)
    finally:
        board.stop()
        reader.close()
        sink.close()
        limiter.close()



@pytest.mark.redis
def test_memory_and_redis_keep_the_same_history(redis_url: str, redis_prefix: str) -> None:
    """The conformance of the two stores: the same operations, the same record."""
    from rateloop._clock import system_clock

    records = []
    for url in ("memory://", redis_url):
        limiter = Limiter.from_url(url, prefix=redis_prefix, limits=LIMITS)
        try:
            held = limiter.try_reserve(ROUTE, Cost(input_tokens=100))
            limiter.try_reserve(ROUTE, Cost(input_tokens=50)).settle(20, 0)  # type: ignore[union-attr]
            limiter.pause(SCOPE, 0.2, "temporary")
            assert held is not None
            if url == "memory://":
                store = limiter.backend.history  # type: ignore[attr-defined]
                past = store.read(2, now=system_clock.now().timestamp())
            else:
                reader = RedisStateReader(redis_url, prefix=redis_prefix)
                past = reader.read_history(2, scopes=[SCOPE])
                reader.close()
        finally:
            limiter.close()
        h = past[SCOPE]
        records.append(({k: sum(getattr(m, k) for m in h.minutes)
                         for k in ("admissions", "pauses")},
                        {d: (sum(m.usage[d].used for m in h.minutes if d in m.usage),
                             h.minutes[-1].usage[d].count, h.minutes[-1].usage[d].limit)
                         for d in ("requests", "input_tokens", "requests_per_day", "concurrency")},
                        len(h.pauses)))  # fmt: skip
    memory, shared = records
    assert memory == shared
    assert memory[0] == {"admissions": 2, "pauses": 1}
    assert memory[1]["input_tokens"] == (120.0, None, 60_000.0)
