"""What ``rateloop status`` and the dashboard say (issue 24 items 9 and 10).

Sans-IO: a scope's verdict (a spent day quota refuses; a tenant is held by its
project), durations in words, moments with their date, and the status table at
80, 120 and 250 columns.  The same on a real Redis, through the command, at the end.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rateloop.admission import LimitSpec
from rateloop.admission.limiter import Limiter
from rateloop.observe.present import human_duration, moment, verdict
from rateloop.observe.queue_state import QueueState
from rateloop.observe.state import DimensionState, ScopeState, Snapshot
from rateloop.observe.table import render_queue, render_table
from rateloop.route import Route
from test_observe_dashboard import browser_page  # noqa: F401 - a fixture

T0 = datetime(2026, 3, 1, 22, 0, tzinfo=UTC)
PROJECT = "openai:gpt-5:proj"
TENANT = "openai:gpt-5:proj:t-7"
SRC = str(Path(__file__).resolve().parents[1] / "src")


def day(used: float, limit: int = 400) -> DimensionState:
    return DimensionState(
        dimension="requests_per_day", kind="day", configured=limit, effective=float(limit),
        capacity=float(limit), used=used, headroom=max(0.0, limit - used),
        resets_at=datetime(2026, 3, 2, tzinfo=UTC),
    )  # fmt: skip


def bucket(used: float = 0.0) -> DimensionState:
    return DimensionState(
        dimension="requests", kind="bucket", configured=600, effective=600.0,
        capacity=10.0, used=used, headroom=max(0.0, 10.0 - used),
    )  # fmt: skip


def scope(name: str, *dims: DimensionState, paused: float | None = None) -> ScopeState:
    return ScopeState(
        scope=name, configured=bool(dims), factor=1.0, leases=0, dimensions=dims,
        paused_until=T0 + timedelta(seconds=paused) if paused is not None else None,
        pause_reason="period_quota" if paused is not None else None,
        governed_by="configured" if dims else None,
    )  # fmt: skip


def snap(*scopes: ScopeState) -> Snapshot:
    return Snapshot(at=T0, prefix="p:", scopes=scopes)


# --- 9d: durations in words, one helper ----------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        (0.0, "0 s"),
        (29.9, "29 s"),
        (60, "1 min"),
        (61, "1 min 1 s"),
        (3599, "59 min 59 s"),
        (3600, "1 h"),
        (5286.9, "1 h 28 min"),
        (86_399, "23 h 59 min"),
        (90_000, "1 d 1 h"),
        (-5, "0 s"),
    ],
)
def test_human_duration(seconds: float, said: str) -> None:
    assert human_duration(seconds) == said


def test_a_moment_has_its_date_unless_it_is_today() -> None:
    assert moment(T0 + timedelta(minutes=30), T0) == "22:30:00"
    assert moment(T0 + timedelta(hours=3), T0) == "2026-03-02 01:00:00"
    assert moment(T0 - timedelta(days=1), T0) == "2026-02-28 22:00:00"


# --- 9a, 9b: the verdict --------------------------------------------------------------------


def test_a_spent_day_quota_refuses_until_the_day_resets() -> None:
    spent = scope(PROJECT, bucket(), day(400))
    v = verdict(spent, snap(spent))
    assert v.state == "refusing" and v.until == datetime(2026, 3, 2, tzinfo=UTC)
    assert v.text(T0) == (
        "refusing until 2026-03-02 00:00:00, 2 h left (requests_per_day 400/400 spent)"
    )
    # One request left: it admits.  An empty per-minute bucket refills: it admits too.
    left = scope(PROJECT, bucket(10), day(399))
    assert verdict(left, snap(left)).state == "admitting"


def test_a_pause_says_how_long_in_words() -> None:
    paused = scope(PROJECT, bucket(), paused=5286.9)
    v = verdict(paused, snap(paused))
    assert v.text(T0) == "paused until 23:28:06, 1 h 28 min left (period_quota)"
    assert v.text(T0, short=True) == "paused, 1 h 28 min left (period_quota)"
    assert v.to_dict(T0)["left"] == "1 h 28 min"


def test_a_tenant_is_held_by_its_projects_pause_and_spent_quota() -> None:
    tenant = scope(TENANT)
    spent = scope(PROJECT, bucket(), day(400))
    v = verdict(tenant, snap(spent, tenant))
    assert (v.state, v.why) == ("refusing", f"{PROJECT}: requests_per_day 400/400 spent")
    paused = scope(PROJECT, bucket(), paused=30)
    v = verdict(tenant, snap(paused, tenant))
    assert (v.state, v.why) == ("paused", f"{PROJECT}: period_quota")
    # Another project's state is not the tenant's.
    other = scope("openai:gpt-5:other", day(400), paused=30)
    assert verdict(tenant, snap(other, tenant)).state == "admitting"


def test_a_tenant_row_names_the_limits_it_is_within_not_a_missing_config() -> None:
    text = render_table(
        snap(scope(PROJECT, bucket(), day(12)), scope(TENANT)), source="r", width=200
    )
    (row,) = [line for line in text.splitlines() if line.startswith(TENANT)]
    assert f"within the limits of {PROJECT}" in row and "--config" not in text
    alone = render_table(snap(scope(TENANT)), source="r", width=200)
    assert "no limits known (pass --config)" in alone


# --- 10: the table fits the terminal --------------------------------------------------------


def busy() -> Snapshot:
    long = "anthropic:claude-sonnet-4-5-20250929:research-project-with-a-long-name"
    return snap(
        scope(PROJECT, bucket(3), day(400), paused=5286.9),
        scope(TENANT),
        scope(long, bucket(), day(12, 10_000)),
    )


@pytest.mark.parametrize("width", [80, 120, 250])
def test_the_status_table_fits_the_width_and_keeps_its_key_columns(width: int) -> None:
    text = render_table(busy(), source="redis://127.0.0.1:6379/0", width=width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    header = lines[lines.index(next(x for x in lines if x.startswith("SCOPE")))].split()
    for key in ("SCOPE", "STATE", "DIMENSION", "USED/CAPACITY", "NOTE"):
        assert key in header
    assert ("EFFECTIVE" in header) is (width >= 250)  # the first dropped
    assert "400/400" in text and "requests_per_day" in text
    assert "anthropic" in text  # a long scope folds, never vanishes


def test_the_queue_says_the_date_of_a_wake_up_not_today_and_the_reason() -> None:
    tomorrow = T0 + timedelta(hours=5)
    queue = QueueState(
        at=T0, depth=1, by_state={"waiting_for_reset": 1},
        oldest_created_at=T0 - timedelta(minutes=3), oldest_exact=True,
        waiting=({"task_id": "a" * 32, "task": "report", "state": "waiting_for_reset",
                  "priority": "scheduled", "retry_at": tomorrow.isoformat(),
                  "remaining_steps": ["draft"], "deadline": None,
                  "reason": "daily quota spent"},),
    )  # fmt: skip
    narrow = render_queue(queue, source="sqlite:///t.db", width=80)
    assert max(len(line) for line in narrow.splitlines()) <= 80 and "REASON" in narrow
    text = render_queue(queue, source="sqlite:///t.db", width=200)
    (row,) = [line for line in text.splitlines() if line.startswith("a" * 32)]
    assert row.split("  ")[-1] == "daily quota spent"
    assert "2026-03-02 03:00:00 (in 5 h)" in row and "oldest 3 min" in text


# --- on a real Redis, through the command ---------------------------------------------------


@pytest.fixture
def spent(redis_url: str, redis_prefix: str) -> Iterator[Limiter]:
    """A project whose day quota (5) a tenant's calls spent through a real loop.

    The workers share their events (a RedisEventSink), so the tenant's refused
    call is in its history: the tenant is listed, as an operator sees it.
    """
    import httpx

    from rateloop.loop import RateLoop
    from rateloop.observe.redis_events import RedisEventSink
    from rateloop.policy import Policy
    from rateloop.testing import FaultScript

    # One request at a time (burst 1.2 of 1200/min): the calls after the first wait
    # ~50 ms in admission, and those waits are written under the tenant's scope.
    limits = {
        PROJECT: LimitSpec(requests_per_minute=1200, burst=0.001, requests_per_day=5, concurrency=8)
    }
    limiter = Limiter.from_url(redis_url, prefix=redis_prefix, limits=limits)
    sink = RedisEventSink(redis_url, prefix=redis_prefix)
    loop = RateLoop(Policy(), limiter=limiter, sinks=[sink])
    route = Route(provider="openai", model="gpt-5", project="proj", tenant="t-7")
    request = httpx.Request("POST", "https://api.openai.com/v1/chat/completions")
    ok = httpx.Response(200, json={"usage": {"prompt_tokens": 3}}, request=request)
    statuses = [loop.call(FaultScript([ok]), route=route, deadline=1.0).status for _ in range(6)]
    assert [s.value for s in statuses] == ["completed"] * 5 + ["waiting_for_capacity"]
    sink.close()
    yield limiter
    limiter.close()


def status(redis_url: str, prefix: str, *args: str, columns: int) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "rateloop", "status", "--redis", redis_url, "--prefix", prefix,
         *args],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PYTHONPATH": SRC, "COLUMNS": str(columns)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.redis
def test_without_config_a_spent_day_quota_shows_what_redis_recorded(
    spent: Limiter, redis_url: str, redis_prefix: str
) -> None:
    text = status(redis_url, redis_prefix, columns=300)  # wide: no cell wraps
    (row,) = [line for line in text.splitlines() if line.startswith(PROJECT + " ")]
    assert "requests_per_day" in row and "5/day recorded" in row and "5/5" in row
    # Until the day resets at midnight UTC: under an hour before it, minutes and seconds.
    assert (
        "refusing, 23 h" in row
        or "refusing, 1 d" in row
        or " min left" in row
        or re.search(r"refusing, (\d+ min )?\d+ s left", row)
    ), row
    assert "(requests_per_day 5/5 spent)" in row
    data = json.loads(status(redis_url, redis_prefix, "--json", columns=200))
    project = next(s for s in data["scopes"] if s["scope"] == PROJECT)
    assert project["governed_by"] == "recorded"
    assert {d["dimension"]: d["used"] for d in project["dimensions"]} == {
        "requests_per_day": 5,
        "concurrency": 0,
    }


@pytest.mark.redis
def test_the_status_command_fits_80_and_120_columns_and_json_ignores_the_width(
    spent: Limiter, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    spent.pause(PROJECT, 5286.9, "period_quota")
    policy = tmp_path / "policy.toml"
    policy.write_text(
        f'[limits."{PROJECT}"]\nrequests_per_minute = 1200\nburst = 0.001\n'
        "requests_per_day = 5\nconcurrency = 8\n"
    )
    for columns in (80, 120, 300):
        text = status(redis_url, redis_prefix, "-c", str(policy), columns=columns)
        lines = text.splitlines()
        assert max(len(line) for line in lines) <= columns
        header = next(line for line in lines if line.startswith("SCOPE")).split()
        assert {"SCOPE", "STATE", "DIMENSION", "USED/CAPACITY", "NOTE"} <= set(header)
        assert "requests_per_day" in text and "5/5" in text and "--config" not in text
    (row,) = [line for line in lines if line.startswith(PROJECT + " ")]
    assert "paused, 1 h 28 min left (period_quota)" in row or "1 h 27 min left" in row
    (row,) = [line for line in lines if line.startswith(TENANT)]
    assert f"within the limits of {PROJECT}" in row and f"({PROJECT}: period_quota)" in row
    narrow, wide = (
        json.loads(status(redis_url, redis_prefix, "-c", str(policy), "--json", columns=c))
        for c in (80, 300)
    )
    for data in (narrow, wide):
        del data["at"]
        for s in data["scopes"]:
            s.pop("paused_until")  # the same pause, read a moment apart
    assert narrow == wide


@pytest.mark.browser
@pytest.mark.redis
def test_the_page_says_refusing_in_words_with_dates_and_reasons(
    browser_page: Any,  # noqa: F811 - the fixture imported above
    spent: Limiter,
    redis_url: str,
    redis_prefix: str,
    tmp_path: Path,
) -> None:
    """9a, 9b, 9d, 9e on the dashboard, in the real Chromium, over the real Redis."""
    from rateloop._clock import system_clock
    from rateloop.observe.dashboard import Dashboard
    from rateloop.observe.redis_state import RedisStateReader
    from rateloop.outcome import Outcome, Status
    from rateloop.tasks import StepContext, TaskRegistry, TaskRunner, open_store, task
    from rateloop.testing import FakeClock

    clock = FakeClock(start=system_clock.now())
    store = open_store(f"sqlite:///{tmp_path}/tasks.db", clock=clock)
    tasks = TaskRegistry()
    report = task("report", version="1", into=tasks)

    @report.step()
    def draft(ctx: StepContext) -> object:  # parked until tomorrow, or later
        return Outcome(
            status=Status.WAITING_FOR_RESET,
            reason="daily quota spent",
            retry_at=clock.now() + timedelta(hours=30),
        )

    runner = TaskRunner(store, tasks=tasks, clock=clock)
    parked = runner.submit(report, {}).task_id
    runner.run_until_idle()
    spent.pause("anthropic:claude:proj", 5286.9, "period_quota")
    limits = {PROJECT: LimitSpec(requests_per_minute=1200, burst=0.001, requests_per_day=5)}
    reader = RedisStateReader(redis_url, prefix=redis_prefix, limits=limits)
    board = Dashboard(reader, store=store, port=0)
    board.start()
    try:
        page = browser_page
        page.goto(f"http://127.0.0.1:{board.port}/")
        project = f'section.scope[data-scope="{PROJECT}"]'
        page.wait_for_selector(f'{project}[data-state="refusing"]', timeout=10_000)
        badge = page.inner_text(f"{project} .badge")
        assert badge.startswith("refusing until ") and " left (requests_per_day 5/5 spent)" in badge
        tenant = f'section.scope[data-scope="{TENANT}"]'
        assert page.get_attribute(tenant, "data-state") == "refusing"
        assert f"({PROJECT}: requests_per_day 5/5 spent)" in page.inner_text(f"{tenant} .badge")
        assert f"within the limits of {PROJECT}" in page.inner_text(tenant)
        assert "--config" not in page.inner_text(tenant) + page.inner_text(project)
        paused = page.inner_text('section.scope[data-scope="anthropic:claude:proj"] .badge')
        # The date is shown when the pause ends on another day (a run late in the evening).
        assert re.fullmatch(
            r"paused until (\d{4}-\d\d-\d\d )?[\d:]+, 1 h 2[78] min left \(period_quota\)",
            paused,
        ), paused
        row = f'#tasks tr[data-task-id="{parked}"]'
        assert page.inner_text(f"{row} .reason") == "daily quota spent"
        wakes = page.inner_text(f"{row} .retry-at")
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(in 1 d [56] h\)", wakes), wakes
    finally:
        board.stop()
        reader.close()
        store.close()
