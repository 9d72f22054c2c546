"""Agent text read as it reaches us: wrapped by a terminal, with notices around the refusal.

The messages are the agents' own (the sources are in the fixtures of
``tests/fixtures/classify/agents_*.yaml``); these tests wrap them at every
terminal width and put fallback notices next to them.
"""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime

import pytest

from rateloop.classify import classify_text
from rateloop.classify._allowance import ALLOWANCES
from rateloop.classify._when import date_reset
from rateloop.signal import Kind

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

# codex-rs/core/src/error.rs, UsageLimitReachedError (Plus), reset on another day.
CODEX_PLUS = (
    "You've hit your usage limit. Upgrade to Pro (https://openai.com/chatgpt/pricing), visit "
    "https://chatgpt.com/codex/settings/usage to purchase more credits or try again at "
    "Jul 5th, 2026 8:19 PM."
)
# github/copilot-cli#2828.
COPILOT_WEEKLY = (
    "You've reached your weekly rate limit. Please wait for your limit to reset on April 20, "
    "2026 at 2:00 AM or switch to auto model to continue."
)


@pytest.mark.parametrize("width", range(20, 121))
def test_codex_usage_limit_keeps_its_reset_at_any_terminal_width(width: int) -> None:
    wrapped = textwrap.fill(CODEX_PLUS, width=width, break_long_words=False)
    signal = classify_text(wrapped, exit_code=1, now=NOW, tz=UTC)
    assert (signal.kind, signal.provider) == (Kind.PERIOD_QUOTA, "openai")
    assert signal.reset_at == datetime(2026, 7, 5, 20, 19, tzinfo=UTC), wrapped


@pytest.mark.parametrize("width", range(20, 121))
def test_copilot_weekly_limit_keeps_its_reset_at_any_terminal_width(width: int) -> None:
    wrapped = textwrap.fill(COPILOT_WEEKLY, width=width, break_long_words=False)
    signal = classify_text(wrapped, exit_code=1, now=NOW, tz=UTC)
    assert (signal.kind, signal.code) == (Kind.PERIOD_QUOTA, "weekly_limit")
    assert signal.reset_at == datetime(2026, 4, 20, 2, 0, tzinfo=UTC), wrapped


def test_the_copilot_wait_in_minutes_is_not_the_weekly_reset() -> None:
    text = (
        "Sorry, you have been rate-limited. Please wait 2 minutes before trying again.\n"
        "Server Error: Sorry, you've exceeded your weekly rate limit.\n"
        "Error Code: user_weekly_rate_limited"
    )
    signal = classify_text(text, exit_code=1, now=NOW, tz=UTC)
    # Never "reset in 2 minutes": the week's allowance returns when Copilot says, and here
    # it said nothing.
    assert (signal.kind, signal.retry_after, signal.reset_at) == (Kind.PERIOD_QUOTA, None, None)


@pytest.mark.parametrize(
    "refusal",
    [
        "You've hit your session limit · resets 3pm (America/Bogota)",
        "Usage limit reached for all Pro models.",
        "You have exhausted your capacity on this model. Your quota will reset after 53s.",
    ],
)
def test_a_fallback_notice_before_a_refusal_does_not_hide_it(refusal: str) -> None:
    notice = (
        "ℹ ⚡ Slow response times detected. Automatically switching from gemini-2.5-pro to "
        "gemini-2.5-flash for faster responses for the remainder of this session.\n"
    )
    alone = classify_text(refusal, exit_code=1, now=NOW, tz=UTC)
    assert classify_text(notice + refusal, exit_code=1, now=NOW, tz=UTC) == alone


def test_every_code_read_from_agent_text_is_in_the_vocabulary() -> None:
    texts = [
        "You've hit your weekly limit · resets 4am (Europe/Madrid)",
        "Opus weekly limit reached ∙ resets Oct 31, 9am",
        "You're out of extra usage · resets 9pm",
        "You've hit your monthly spend limit.",
        "AmazonQUsageLimitError: Monthly limit reached.",
        "you (user) have reached your hourly usage limit, upgrade for higher limits: "
        "https://ollama.com/upgrade",
        "You've reached your daily usage limit. Please return tomorrow to continue building.",
    ]
    codes = {classify_text(t, exit_code=1, now=NOW, tz=UTC).code for t in texts}
    assert codes <= set(ALLOWANCES)
    assert len(codes) == len(texts)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("reset on april 20, 2026 at 2:00 am", datetime(2026, 4, 20, 2, 0, tzinfo=UTC)),
        ("wait until january 17, 2025 for your", datetime(2025, 1, 17, tzinfo=UTC)),
        ("monthly cycle ends on 11/17/2025.", datetime(2025, 11, 17, tzinfo=UTC)),
        ("the limits reset on 08/01", datetime(2026, 8, 1, tzinfo=UTC)),
        ("the limits reset on 13/01", None),  # no thirteenth month: not a date
        ("preset on 08/01", None),  # a word boundary before "reset"
        ("reset on april 31", None),  # no such day
    ],
)
def test_date_reset(text: str, expected: datetime | None) -> None:
    assert date_reset(text, NOW, UTC) == expected
