"""The texts of ``rateloop run`` and the live countdown (pinned exactly: recipes grep for them)."""

from __future__ import annotations

import io
from datetime import UTC, datetime

from rateloop.agents.banner import (
    exhausted_message,
    period_quota_message,
    rate_limit_banner,
    wait_visibly,
)
from rateloop.signal import Kind
from rateloop.testing import FakeClock

BANNER = """\
================================================================================
⏳ RATE LIMIT detected (signal: "hit your rate limit")
   Agent step throttled by the provider. This is transient — backing off.
   Waiting 60s before retry 1/5 (attempt 2 of 6) ...
================================================================================"""

EXHAUSTED = """\
Error: amplihack copilot rate limit persisted after 3 retries (4 attempts total).
The provider kept throttling this step. Increase RATELOOP_MAX_RETRIES
or RATELOOP_BASE_DELAY_SECS, or retry later."""


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_banner_shape_is_exact() -> None:
    text = rate_limit_banner(
        signal="hit your rate limit", wait=60.0, retry=1, max_retries=5, attempt=2, total=6
    )
    assert text == BANNER


def test_banner_prints_fractional_waits() -> None:
    text = rate_limit_banner(signal="429", wait=2.5, retry=2, max_retries=3, attempt=3, total=4)
    assert "   Waiting 2.5s before retry 2/3 (attempt 3 of 4) ..." in text.splitlines()


def test_exhausted_message_is_exact() -> None:
    assert exhausted_message("amplihack copilot", 3) == EXHAUSTED


def test_period_quota_message_names_the_reset() -> None:
    now = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)
    reset = datetime(2026, 1, 1, 15, 30, tzinfo=UTC)
    text = period_quota_message("claude", signal="usage limit reached", reset_at=reset, now=now)
    assert text.startswith('Error: claude hit a usage limit (signal: "usage limit reached")')
    assert "resets at 2026-01-01T15:30:00+00:00 (in 5h 30m)" in text
    unknown = period_quota_message("claude", signal="x", reset_at=None, now=now)
    assert "did not say when it resets" in unknown


def test_countdown_on_a_terminal_sleeps_in_one_second_steps() -> None:
    clock, stream = FakeClock(), _Terminal()
    wait_visibly(clock, 3.5, stream)
    assert clock.sleeps == [1.0, 1.0, 1.0, 0.5]
    out = stream.getvalue()
    assert [part.strip() for part in out.split("\r") if part.strip()] == [
        "retrying in 4s ...",
        "retrying in 3s ...",
        "retrying in 2s ...",
        "retrying in 1s ...",
    ]
    assert out.endswith("\r")


def test_no_countdown_off_a_terminal() -> None:
    clock, stream = FakeClock(), io.StringIO()
    wait_visibly(clock, 60.0, stream)
    assert clock.sleeps == [60.0]
    assert stream.getvalue() == ""


def test_no_wait_no_sleep() -> None:
    clock = FakeClock()
    wait_visibly(clock, 0.0, _Terminal())
    assert clock.sleeps == []


OVERLOADED = """\
================================================================================
⏳ OVERLOADED detected (signal: "overloaded")
   The provider is over capacity (not your limit). This is transient — backing off.
   Waiting 120s before retry 2/5 (attempt 3 of 6) ...
================================================================================"""


def test_the_banner_names_an_overload() -> None:
    text = rate_limit_banner(
        signal="overloaded",
        wait=120.0,
        retry=2,
        max_retries=5,
        attempt=3,
        total=6,
        kind=Kind.OVERLOAD,
    )
    assert text == OVERLOADED
    throttle = rate_limit_banner(
        signal="429", wait=1, retry=1, max_retries=1, attempt=2, total=2, kind=Kind.TEMPORARY
    )
    assert "⏳ RATE LIMIT detected" in throttle and "OVERLOADED" not in throttle
