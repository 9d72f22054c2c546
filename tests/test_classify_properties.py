"""Property tests: the readers never raise and always return bounded waits."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, tzinfo

from hypothesis import given, settings
from hypothesis import strategies as st

from rateloop.classify import classify, classify_text
from rateloop.classify._core import read_response
from rateloop.classify._time import parse_duration, reset_value
from rateloop.signal import MAX_WAIT_SECONDS, LimitSignal

NOW = datetime(2026, 1, 1, tzinfo=UTC)

HEADER_NAMES = st.sampled_from(
    [
        "retry-after", "Retry-After", "retry-after-ms", "x-ms-retry-after-ms",
        "x-ratelimit-reset", "x-ratelimit-remaining", "x-ratelimit-limit",
        "x-ratelimit-reset-requests", "x-ratelimit-remaining-tokens",
        "anthropic-ratelimit-tokens-reset", "anthropic-ratelimit-requests-remaining",
        "RateLimit", "RateLimit-Policy", "RateLimit-Reset", "x-amzn-errortype",
        "x-github-request-id", "x-ratelimitbysize-remaining-month", "request-id",
    ]
) | st.text(max_size=20)

HOSTILE_VALUES = st.sampled_from(
    ["-5", "NaN", "nan", "inf", "-inf", "1e300", "1e-300", "0", "", " ", "9" * 400,
     "Thu, 01 Jan 1970 00:00:00 GMT", "Fri, 31 Dec 9999 23:59:59 GMT", "0001-01-01T00:00:00Z",
     "9999-12-31T23:59:59Z", "1767225600", "1767225600000", "99999999999999999999",
     "6m0s", "2m59.56s", "-3s", "1e308h", '"a";r=-1;t=1e400', '"p";q=nan;w=inf',
     "ThrottlingException:", "\x00\x01", "1h2m3s garbage"]
) | st.text(max_size=40) | st.floats(allow_nan=True, allow_infinity=True).map(str)

JSON_LEAF = (
    st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30)
)
JSON_KEYS = st.sampled_from(
    ["error", "message", "type", "code", "status", "details", "violations", "quotaId",
     "retryDelay", "@type", "retry_after", "retryAfter", "retry_after_ms", "reset_at",
     "resetAt", "reset_time", "resets_in_seconds", "retry_after_seconds", "metadata",
     "headers", "__type", "ok", "request_id", "base_resp", "status_code", "status_msg",
     "resets_at", "http_code"]
) | st.text(max_size=10)
JSON = st.recursive(
    JSON_LEAF,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(JSON_KEYS, children,
                                                                      max_size=5),
    max_leaves=25,
)

BODIES = (
    st.none()
    | st.text(max_size=300)
    | st.binary(max_size=300)
    | st.dictionaries(JSON_KEYS, JSON, max_size=5)
    | JSON.map(json.dumps)
)
NOWS = st.datetimes(
    min_value=datetime(1971, 1, 1), max_value=datetime(9000, 1, 1), timezones=st.just(UTC)
)


def _bounded(signal: LimitSignal) -> None:
    assert isinstance(signal, LimitSignal)
    if signal.retry_after is not None:
        assert 0.0 <= signal.retry_after <= MAX_WAIT_SECONDS
    if signal.reset_at is not None:
        assert signal.reset_at.tzinfo is not None
    for item in signal.observed:
        if item.reset_after is not None:
            assert 0.0 <= item.reset_after <= MAX_WAIT_SECONDS
    assert signal.retryable == (signal.kind.value in
                                {"temporary", "overload", "server_error", "network"})


@settings(max_examples=300, deadline=None)
@given(
    status=st.none() | st.integers(min_value=-1000, max_value=1000),
    headers=st.dictionaries(HEADER_NAMES, HOSTILE_VALUES, max_size=8)
    | st.lists(st.tuples(HEADER_NAMES, HOSTILE_VALUES), max_size=8),
    body=BODIES,
    provider=st.none() | st.sampled_from(["openai", "anthropic", "google", "bedrock", "github",
                                           "azure", "nobody"]),
    now=NOWS,
)
def test_classify_never_raises_and_bounds_waits(
    status: int | None, headers: object, body: object, provider: str | None, now: datetime
) -> None:
    _bounded(classify(status, headers, body, provider=provider, now=now))  # type: ignore[arg-type]
    # The same input through the reader itself, without classify's safety net: a reader bug
    # must fail here rather than hide behind the status-only fallback.
    _bounded(read_response(status, headers, body, provider=provider, now=now))  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(max_size=400)
    | st.lists(
        st.sampled_from(
            ["rate limit", "429", "reset in", "try again in", "resets", "3pm", "25:99pm",
             "(Not/A_Zone)", "(America/New_York)", "usage limit reached|", "99999999999999",
             "You've hit your usage limit", "1e308 days", "9" * 50, " seconds", "quota exceeded "
             "for quota metric 'x' and limit 'y per day'", "try again at Feb 31st, 2026 25:61 PM",
             "Claude AI usage limit reached|", "-", " ", "You've hit your limit · resets ",
             "Jan 30, ", "11:30am ", "(asia/calcutta)", " at 9pm", "API Error (429 ",
             ") · Retrying in 5 seconds… (attempt 1/10)", "try again at 3:28 PM",
             "reset after 3h12m5s", "Limit 30000, Requested 45000", "\x1b]8;;", "\x07",
             "reached your daily ", "quota limit", "\"resets_in_seconds\": ", "usage_limit_reached"]
        ),
        max_size=12,
    ).map("".join),
    exit_code=st.none() | st.integers(min_value=-300, max_value=300),
    now=NOWS,
    pause_limit=st.none() | st.floats(min_value=0, max_value=1e9),
    tz=st.none() | st.timezones(),
)
def test_classify_text_never_raises_and_bounds_waits(
    text: str, exit_code: int | None, now: datetime, pause_limit: float | None, tz: tzinfo | None
) -> None:
    signal = classify_text(text, exit_code=exit_code, now=now, pause_limit=pause_limit, tz=tz)
    _bounded(signal)
    if exit_code == 0:
        assert signal.ok


@given(st.text(max_size=60))
def test_parse_duration_never_raises(text: str) -> None:
    result = parse_duration(text)
    assert result is None or isinstance(result, float)


@given(value=HOSTILE_VALUES | JSON_LEAF, millis=st.booleans(), now=NOWS)
def test_reset_value_is_bounded(value: object, millis: bool, now: datetime) -> None:
    wait, moment = reset_value(value, now, millis=millis)
    assert wait is None or 0.0 <= wait <= MAX_WAIT_SECONDS
    assert moment is None or moment.tzinfo is not None


def test_durations_as_providers_write_them() -> None:
    table = {
        "1s": 1.0, "120ms": 0.12, "6m0s": 360.0, "2m59.56s": 179.56, "1h2m3s": 3723.0,
        "7.66s": 7.66, "35s": 35.0, "1.5s": 1.5, "4 days 1 hour": 349200.0,
        "30 seconds": 30.0, "5 days 22 hours 11 minutes": 511860.0, "20": 20.0,
        "soon": None, "6m0s!": None, "": None,
    }
    assert {text: parse_duration(text) for text in table} == table


def test_reset_value_heuristics() -> None:
    epoch = NOW + timedelta(seconds=30)
    assert reset_value(1767225630, NOW) == (30.0, epoch)
    assert reset_value("1767225630000", NOW) == (30.0, epoch)
    assert reset_value(30, NOW) == (30.0, epoch)
    assert reset_value(30_000, NOW, millis=True) == (30.0, epoch)
    assert reset_value("2026-01-01T00:00:30Z", NOW) == (30.0, epoch)
    assert reset_value("Thu, 01 Jan 2026 00:00:30 GMT", NOW) == (30.0, epoch)
    assert reset_value("garbage", NOW) == (None, None)
