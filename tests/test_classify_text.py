"""classify_text: CLI agent output (Claude Code, Copilot CLI, Codex, Gemini CLI)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from rateloop.classify import classify_text
from rateloop.signal import Dimension, Kind

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

RATE_LIMITS = [
    # (text, canonical matched phrase)
    (
        "You've hit your rate limit. Please wait for your limit to reset in under a minute "
        "or switch to auto model to continue.",
        "hit your rate limit",
    ),
    ("Error: HTTP 429 Too Many Requests", "too many requests"),
    ("Rate Limit exceeded", "rate limit"),
    ("RATE LIMIT EXCEEDED", "rate limit"),
    ("error: rate-limit hit, backing off", "rate limit"),
    ("openai.RateLimitError: Error code: 429", "rate limit"),
    ("request was ratelimited by upstream", "rate limit"),
    ("too many requests", "too many requests"),
    ("status 429", "429"),
    ("(429)", "429"),
    ("Your quota will reset in 30 seconds", "reset in"),
    (
        'API Error: 429 {"type":"error","error":{"type":"rate_limit_error","message":'
        '"This request would exceed the rate limit for your organization"}}',
        "rate limit",
    ),
    ("exceeded retry limit, last status: 429 Too Many Requests", "too many requests"),
    ("\x1b[31m✕ hit your rate limit\x1b[0m", "hit your rate limit"),
]

NOT_RATE_LIMITS = [
    ("error: authentication failed (401 Unauthorized)", Kind.PERMISSION),
    ("panic: index out of bounds", Kind.UNKNOWN),
    ("command not found: amplihack", Kind.UNKNOWN),
    ("compilation error: expected `;`", Kind.UNKNOWN),
    ("permission denied", Kind.UNKNOWN),
    ("", Kind.UNKNOWN),
    ("preset installed", Kind.UNKNOWN),
    ("processed 14290 files", Kind.UNKNOWN),
    ("File \"agent.py\", line 429, in run", Kind.UNKNOWN),
    ("agent.py:429:7: E501 line too long", Kind.UNKNOWN),
    ("the accurate limits were computed", Kind.UNKNOWN),
    ("API Error: 529 Overloaded", Kind.OVERLOAD),
    ("Error: connect ECONNRESET 104.18.0.1:443", Kind.NETWORK),
    ("API Error: 500 Internal server error", Kind.SERVER_ERROR),
]


@pytest.mark.parametrize(("text", "phrase"), RATE_LIMITS)
@pytest.mark.parametrize("exit_code", [1, None])
def test_rate_limits_are_temporary(text: str, phrase: str, exit_code: int | None) -> None:
    signal = classify_text(text, exit_code=exit_code, now=NOW)
    assert (signal.kind, signal.retryable, signal.matched) == (Kind.TEMPORARY, True, phrase)


@pytest.mark.parametrize(("text", "kind"), NOT_RATE_LIMITS)
def test_not_rate_limits(text: str, kind: Kind) -> None:
    signal = classify_text(text, exit_code=1, now=NOW)
    assert signal.kind is kind
    assert signal.kind not in (Kind.TEMPORARY, Kind.PERIOD_QUOTA)


@pytest.mark.parametrize("text", [t for t, _ in RATE_LIMITS] + ["Claude AI usage limit reached|1"])
def test_exit_code_zero_is_always_ok(text: str) -> None:
    signal = classify_text(text, exit_code=0, now=NOW)
    assert (signal.kind, signal.retryable, signal.matched) == (Kind.OK, False, None)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("Rate limit reached. Please try again in 20s.", 20.0),
        ("rate limit: try again in 1.5s", 1.5),
        ("429 Too Many Requests; reset in 30 seconds", 30.0),
        ("Rate limit reached ... Please try again in 6m0s.", 360.0),
        ("rate limited, please retry after 6 seconds", 6.0),
    ],
)
def test_stated_wait_is_retry_after(text: str, seconds: float) -> None:
    signal = classify_text(text, exit_code=1, now=NOW)
    assert (signal.kind, signal.retry_after) == (Kind.TEMPORARY, seconds)


def test_claude_usage_limit_epoch_is_period_quota() -> None:
    signal = classify_text("Claude AI usage limit reached|1767225600", exit_code=1,
                           now=datetime(2025, 12, 31, 20, 0, tzinfo=UTC))
    assert signal.kind is Kind.PERIOD_QUOTA
    assert not signal.retryable
    assert signal.reset_at == datetime(2026, 1, 1, tzinfo=UTC)
    assert signal.matched == "usage limit reached"
    assert signal.retry_after is None


@pytest.mark.parametrize(
    ("text", "now", "reset_at"),
    [
        # Before 15:00 UTC: today.
        ("5-hour limit reached ∙ resets 3pm", NOW, datetime(2026, 1, 1, 15, 0, tzinfo=UTC)),
        # After 15:00 UTC: tomorrow.
        ("5-hour limit reached ∙ resets 3pm", datetime(2026, 1, 1, 16, 0, tzinfo=UTC),
         datetime(2026, 1, 2, 15, 0, tzinfo=UTC)),
        # A named zone: 3pm in New York (EST, UTC-5) is 20:00 UTC.
        ("5-hour limit reached ∙ resets 3pm (America/New_York)", NOW,
         datetime(2026, 1, 1, 20, 0, tzinfo=UTC)),
        # Summer time in New York (EDT, UTC-4).
        ("Weekly limit reached ∙ resets 9:30am (America/New_York)",
         datetime(2026, 7, 1, 12, 0, tzinfo=UTC), datetime(2026, 7, 1, 13, 30, tzinfo=UTC)),
        ("Claude usage limit reached. Your limit will reset at 11pm (Europe/Paris).", NOW,
         datetime(2026, 1, 1, 22, 0, tzinfo=UTC)),
    ],
)
def test_hour_limit_resolves_clock_time(text: str, now: datetime, reset_at: datetime) -> None:
    signal = classify_text(text, exit_code=1, now=now)
    assert (signal.kind, signal.retryable, signal.reset_at) == (Kind.PERIOD_QUOTA, False, reset_at)


def test_codex_usage_limit_is_period_quota_days_away() -> None:
    text = (
        "■ You've hit your usage limit. Upgrade to Pro (https://openai.com/chatgpt/pricing) "
        "or try again in 4 days 1 hour."
    )
    signal = classify_text(text, exit_code=1, now=NOW)
    assert signal.kind is Kind.PERIOD_QUOTA
    assert signal.reset_at == datetime(2026, 1, 5, 13, 0, tzinfo=UTC)
    assert signal.matched == "hit your usage limit"


def test_codex_usage_limit_at_a_date() -> None:
    text = (
        "You've hit your usage limit. Upgrade to Plus to continue using Codex, "
        "or try again at Jul 5th, 2026 8:19 PM."
    )
    signal = classify_text(text, exit_code=1, now=NOW)
    assert (signal.kind, signal.reset_at) == (
        Kind.PERIOD_QUOTA, datetime(2026, 7, 5, 20, 19, tzinfo=UTC)
    )


def test_gemini_cli_daily_quota_is_period_quota() -> None:
    text = (
        "Quota exceeded for quota metric 'Gemini 2.5 Pro Requests' and limit "
        "'Gemini 2.5 Pro Requests per day per user per tier' of service "
        "'cloudcode-pa.googleapis.com' for consumer 'project_number:681255809395'."
    )
    signal = classify_text(text, exit_code=1, now=NOW)
    assert signal.kind is Kind.PERIOD_QUOTA
    assert signal.dimension is Dimension.REQUESTS_PER_DAY
    assert signal.reset_at == datetime(2026, 1, 2, 8, 0, tzinfo=UTC)  # midnight Pacific


def test_gemini_cli_per_minute_quota_is_temporary() -> None:
    text = (
        "Quota exceeded for quota metric 'Gemini 2.5 Pro Requests' and limit "
        "'Gemini 2.5 Pro Requests per minute per user per tier'"
    )
    signal = classify_text(text, exit_code=1, now=NOW)
    assert (signal.kind, signal.retryable) == (Kind.TEMPORARY, True)


def test_rate_limit_naming_a_day_window_is_period_quota() -> None:
    text = ("openai.RateLimitError: Rate limit reached for gpt-4 on requests per day (RPD): "
            "Limit 200, Used 200")
    signal = classify_text(text, exit_code=1, now=NOW)
    assert (signal.kind, signal.dimension) == (Kind.PERIOD_QUOTA, Dimension.REQUESTS_PER_DAY)


@pytest.mark.parametrize(
    "text",
    [
        "Error: 429 You exceeded your current quota, please check your plan and billing details.",
        "API Error: 400 Your credit balance is too low to access the Anthropic API.",
        "insufficient_quota",
    ],
)
def test_spend_in_text(text: str) -> None:
    signal = classify_text(text, exit_code=1, now=NOW)
    assert (signal.kind, signal.retryable) == (Kind.SPEND, False)


def test_huge_text_is_bounded_and_finds_the_tail() -> None:
    text = "ok line\n" * 100_000 + "You've hit your rate limit."
    signal = classify_text(text, exit_code=1, now=NOW)
    assert signal.matched == "hit your rate limit"


def test_bad_arguments_are_told_apart() -> None:
    with pytest.raises(TypeError, match="text must be str"):
        classify_text(b"429", exit_code=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timezone-aware"):
        classify_text("429", now=datetime(2026, 1, 1))


def test_a_time_without_a_zone_is_read_in_tz() -> None:
    from zoneinfo import ZoneInfo

    text = "You've hit your limit · resets 3:30am"
    kolkata = classify_text(text, exit_code=1, now=NOW, tz=ZoneInfo("Asia/Kolkata"))
    utc = classify_text(text, exit_code=1, now=NOW, tz=UTC)
    assert kolkata.reset_at == datetime(2026, 1, 1, 22, 0, tzinfo=UTC)  # 3:30 IST
    assert utc.reset_at == datetime(2026, 1, 2, 3, 30, tzinfo=UTC)


@pytest.mark.parametrize("zone", ["(Asia/Calcutta)", "(asia/calcutta)", "(ASIA/CALCUTTA)"])
def test_zone_names_are_read_in_any_case(zone: str) -> None:
    signal = classify_text(f"You've hit your limit · resets 3:30am {zone}", exit_code=1, now=NOW)
    assert signal.reset_at == datetime(2026, 1, 1, 22, 0, tzinfo=UTC)


def test_an_unknown_zone_falls_back_to_tz() -> None:
    signal = classify_text(
        "You've hit your limit · resets 3:30am (Mars/Olympus_Mons)", exit_code=1, now=NOW, tz=UTC
    )
    assert signal.reset_at == datetime(2026, 1, 2, 3, 30, tzinfo=UTC)


def test_terminal_hyperlinks_and_colours_are_removed() -> None:
    text = (
        "\x1b]8;;https://docs.github.com\x07Learn more\x1b]8;;\x07 \x1b[1;31m"
        "You've hit your rate limit.\x1b[0m \x1b]0;title\x1b\\"
    )
    signal = classify_text(text, exit_code=1, now=NOW)
    assert (signal.kind, signal.matched) == (Kind.TEMPORARY, "hit your rate limit")


def test_tz_must_be_a_tzinfo() -> None:
    with pytest.raises(TypeError, match=r"tz must be a datetime\.tzinfo"):
        classify_text("429", exit_code=1, now=NOW, tz="UTC")  # type: ignore[arg-type]


def test_an_unterminated_osc_does_not_swallow_the_refusal_after_it() -> None:
    signal = classify_text("\x1b]0;title\nRate limit exceeded", exit_code=1, now=NOW)
    assert signal.matched == "rate limit"


@pytest.mark.parametrize(
    ("text", "now", "reset_at"),
    [
        ("You've hit your limit · resets 12am", NOW, datetime(2026, 1, 2, 0, 0, tzinfo=UTC)),
        ("You've hit your limit · resets 12pm", datetime(2026, 1, 1, 11, 0, tzinfo=UTC),
         datetime(2026, 1, 1, 12, 0, tzinfo=UTC)),
        # A date without a year that has passed is next year's.
        ("Opus weekly limit reached ∙ resets Jan 1, 9am", datetime(2026, 12, 30, tzinfo=UTC),
         datetime(2027, 1, 1, 9, 0, tzinfo=UTC)),
        ("Opus weekly limit reached ∙ resets Dec 31", NOW, datetime(2026, 12, 31, tzinfo=UTC)),
        # "resets 3" is not a time; the wait decides nothing here.
        ("5-hour limit reached ∙ resets 3", NOW, None),
        ("You've hit your limit · resets 13pm", NOW, None),
    ],
)
def test_reset_clock_edges(text: str, now: datetime, reset_at: datetime | None) -> None:
    signal = classify_text(text, exit_code=1, now=now, tz=UTC)
    assert (signal.kind, signal.reset_at) == (Kind.PERIOD_QUOTA, reset_at)


def test_codex_time_already_passed_today_is_tomorrow() -> None:
    text = "You've hit your usage limit. Try again at 9:15 AM."
    signal = classify_text(text, exit_code=1, now=NOW, tz=UTC)
    assert signal.reset_at == datetime(2026, 1, 2, 9, 15, tzinfo=UTC)
