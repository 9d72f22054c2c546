"""Never stall, never raise: linear time on hostile input, and the bugs fuzzing found.

The time properties assert on how time *scales* (an input k times longer must
not take 3k times longer; a quadratic reader takes k² times longer), never on
a wall-clock number, so they hold on a loaded machine: each size is timed in
process CPU time (not wall time) as the best of three runs, and a large input
read in under a few milliseconds passes whatever its ratio.
"""

from __future__ import annotations

import importlib
import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rateloop.classify import classify, classify_exception, classify_text
from rateloop.classify._core import read_response
from rateloop.classify._evidence import MAX_BODY_CHARS
from rateloop.classify._far import far_wait_threshold
from rateloop.classify.text import MAX_TEXT_CHARS
from rateloop.policy import Policy
from rateloop.policy._schema import SCHEMA
from rateloop.signal import DEFAULT_PAUSE_LIMIT_SECS, Kind

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
MARGIN = 3.0  # a linear reader's ratio is about the size ratio; allow three times that
NOISE_FLOOR = 0.004  # seconds: below this at the large size, the ratio is noise

UNITS = [
    "\x1b]", "\x1b[", "\x1b[1;", "rate limit ", "429 ", "reset in ", "try again in 5", "resets ",
    "3:30am ", "(asia/calcutta) ", " · ", "usage limit reached|", "9" * 12, "limit reached ",
    "api error (", " · retrying in 5 seconds… (attempt 1/10)", "limit 30000, requested 9 ",
    "reached your daily ", "exceeded your current quota ", "gemini ", "requests per day ",
    "\"resets_in_seconds\": 5 ", "try again at jul 5th, 2026 8:19 pm ", "wait 5 hours ", "İ",
    "{\"error\": ", "[", "quota exceeded for quota metric '", "x", " ", "\n", "s ", "1h",
]
UNIT = st.lists(st.sampled_from(UNITS), min_size=1, max_size=4).map("".join) | st.text(
    min_size=1, max_size=6
)


def _best(run: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        run()
        best = min(best, time.process_time() - started)
    return best


def _fill(unit: str, size: int) -> str:
    return (unit * (size // len(unit) + 1))[:size]


def _assert_linear(make: Callable[[int], Callable[[], object]], small: int, large: int) -> None:
    t_small = _best(make(small))
    t_large = _best(make(large))
    if t_large < NOISE_FLOOR:
        return
    ratio = t_large / max(t_small, 1e-6)
    assert ratio < MARGIN * large / small, (
        f"{large} chars took {t_large * 1000:.1f} ms, {ratio:.0f}x the time of {small} chars"
    )


_SETTINGS = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@_SETTINGS
@given(unit=UNIT)
@example(unit="\x1b]")  # the quadratic OSC pattern: 200k chars took ~15 s
@example(unit="resets ")
def test_text_reader_is_linear(unit: str) -> None:
    def make(size: int) -> Callable[[], object]:
        text = _fill(unit, size)
        return lambda: classify_text(text, exit_code=1, now=NOW)

    # Both sizes past the 4 000-character tail searched first, the large one at the cap.
    _assert_linear(make, MAX_TEXT_CHARS // 6, MAX_TEXT_CHARS)


@_SETTINGS
@given(unit=UNIT, wrap=st.sampled_from(["raw", "message", "sse"]))
@example(unit="try again in 5", wrap="message")
def test_http_reader_is_linear(unit: str, wrap: str) -> None:
    def make(size: int) -> Callable[[], object]:
        filler = _fill(unit, size)
        if wrap == "message":
            body = json.dumps({"error": {"message": filler, "type": "rate_limit_error"}})
        elif wrap == "sse":
            body = "event: error\ndata: " + json.dumps({"error": {"message": filler}}) + "\n\n"
        else:
            body = filler
        headers = {"retry-after": filler[:8192], "x-ratelimit-remaining": "0"}
        return lambda: read_response(429, headers, body, provider=None, now=NOW)

    _assert_linear(make, MAX_BODY_CHARS // 64, MAX_BODY_CHARS // 8)


class _SDKError(Exception):
    pass


_SDKError.__module__ = "openai"


@_SETTINGS
@given(unit=UNIT)
def test_exception_reader_is_linear(unit: str) -> None:
    def make(size: int) -> Callable[[], object]:
        exc = _SDKError("boom")
        response = type("Response", (), {})()
        response.status_code = 429  # type: ignore[attr-defined]
        response.headers = {"retry-after": "1"}  # type: ignore[attr-defined]
        response.content = _fill(unit, size)  # type: ignore[attr-defined]
        exc.response = response  # type: ignore[attr-defined]
        return lambda: classify_exception(exc, now=NOW)

    _assert_linear(make, MAX_BODY_CHARS // 64, MAX_BODY_CHARS // 8)


# --- the bugs fuzzing found ---------------------------------------------------------


@pytest.mark.parametrize("value", [[104, 2], {"errno": 104}, "ECONNRESET", 2**70, None, True])
def test_oserror_with_any_errno_never_raises(value: object) -> None:
    exc = OSError("boom")
    exc.errno = value  # type: ignore[assignment]
    signal = classify_exception(exc, now=NOW)
    assert signal.kind is Kind.UNKNOWN  # not an int errno: not evidence of a network error


def test_oserror_with_a_network_errno_is_network() -> None:
    assert classify_exception(ConnectionResetError(104, "reset"), now=NOW).kind is Kind.NETWORK


def _gemini(violations: object, message: str) -> str:
    return json.dumps({"error": {
        "code": 429, "status": "RESOURCE_EXHAUSTED", "message": message,
        "details": [{"@type": "type.googleapis.com/google.rpc.QuotaFailure",
                     "violations": violations}],
    }})


@pytest.mark.parametrize(
    ("violations", "kind"),
    [
        ({"quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier"}, Kind.PERIOD_QUOTA),
        (7, Kind.TEMPORARY),
        ("GenerateRequestsPerDay", Kind.TEMPORARY),
        (None, Kind.TEMPORARY),
    ],
)
def test_gemini_violations_that_are_not_a_list(violations: object, kind: Kind) -> None:
    body = _gemini(violations, "Resource has been exhausted (e.g. check quota).")
    # The reader itself, without classify's safety net: it must not raise.
    signal = read_response(429, {}, body, provider=None, now=NOW)
    assert (signal.kind, signal.provider) == (kind, "google")


def test_a_reader_bug_falls_back_to_the_body_text_not_the_status_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    core = importlib.import_module("rateloop.classify._core")

    def broken(ev: object) -> None:
        raise RuntimeError("reader bug")

    monkeypatch.setattr(core, "_RULES", (("google", broken),))
    body = _gemini([], "Quota exceeded for quota metric 'Requests' and limit 'Requests per day'")
    signal = classify(429, {}, body, now=NOW)
    # A status-only fallback would call this daily quota a short throttle.
    assert (signal.kind, signal.retryable) == (Kind.PERIOD_QUOTA, False)


# --- the far-wait rule ------------------------------------------------------------------


def test_the_default_threshold_is_the_policys_pause_limit() -> None:
    # One default, in signal.py: Read's threshold and the policy's pause limit.
    assert DEFAULT_PAUSE_LIMIT_SECS == Policy().pause_limit_secs == far_wait_threshold(None)
    assert SCHEMA[""]["pause_limit_secs"].default == DEFAULT_PAUSE_LIMIT_SECS


@pytest.mark.parametrize(
    ("wait", "pause_limit", "kind"),
    [
        (600, 600, Kind.TEMPORARY),  # exactly the threshold still fits
        (600.5, 600, Kind.PERIOD_QUOTA),
        (599, 600, Kind.TEMPORARY),
        (1, 0, Kind.PERIOD_QUOTA),  # a pause limit of 0: any stated wait is far
        (0, 0, Kind.TEMPORARY),
        (3600, None, Kind.TEMPORARY),  # the default, 3600 s
        (3601, None, Kind.PERIOD_QUOTA),
        (12702, None, Kind.PERIOD_QUOTA),  # "please wait a moment and try again in 12702s"
    ],
)
def test_far_wait_edges_http_and_text(wait: float, pause_limit: float | None, kind: Kind) -> None:
    http = classify(429, {"retry-after": f"{wait:g}"}, None, now=NOW, pause_limit=pause_limit)
    text = classify_text(
        f"Rate limit exceeded. Please wait a moment and try again in {wait:g}s.",
        exit_code=1, now=NOW, pause_limit=pause_limit,
    )
    assert (http.kind, text.kind) == (kind, kind)
    if kind is Kind.PERIOD_QUOTA:
        assert http.reset_at == text.reset_at == NOW + timedelta(seconds=wait)
    assert http.retry_after == text.retry_after == wait


def test_a_far_wait_beyond_the_one_day_clamp_keeps_its_real_reset() -> None:
    signal = classify_text(
        "Sorry, your request was rate-limited. Please wait 587 hours 33 minutes before "
        "trying again.", exit_code=1, now=NOW,
    )
    assert (signal.kind, signal.retry_after) == (Kind.PERIOD_QUOTA, 86_400.0)
    assert signal.reset_at == NOW + timedelta(hours=587, minutes=33)


def test_a_day_named_limit_with_a_short_wait_is_a_short_throttle() -> None:
    body = {"error": {"code": "rate_limit_exceeded", "type": "requests", "message":
            "Rate limit reached for gpt-4o on requests per day (RPD): Limit 10000, Used 10000, "
            "Requested 1. Please try again in 8.64s."}}
    signal = classify(429, {}, json.dumps(body), provider="openai", now=NOW)
    assert (signal.kind, signal.retry_after, signal.dimension.value if signal.dimension else None
            ) == (Kind.TEMPORARY, 8.64, "requests_per_day")
    # A slot back only after more than a minute, or no wait at all: the day named decides.
    body["error"]["message"] = "Rate limit reached on requests per day (RPD). Try again in 61s."
    assert classify(429, {}, json.dumps(body), now=NOW).kind is Kind.PERIOD_QUOTA
    body["error"]["message"] = "Rate limit reached on requests per day (RPD). Try again in 60s."
    assert classify(429, {}, json.dumps(body), now=NOW).kind is Kind.TEMPORARY
    body["error"]["message"] = "Rate limit reached for gpt-4o on requests per day (RPD)."
    assert classify(429, {}, json.dumps(body), now=NOW).kind is Kind.PERIOD_QUOTA


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf")])
def test_a_bad_pause_limit_is_a_clear_error(bad: float) -> None:
    with pytest.raises(ValueError, match="pause_limit must be finite and >= 0"):
        classify(429, {}, None, now=NOW, pause_limit=bad)
    with pytest.raises(ValueError, match=str(bad)):
        classify_text("429", exit_code=1, now=NOW, pause_limit=bad)


def test_a_pause_limit_that_is_not_a_number_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="pause_limit must be a number of seconds"):
        classify(429, {}, None, now=NOW, pause_limit="60")  # type: ignore[arg-type]


# --- Retry-After -------------------------------------------------------------------------


def test_a_malformed_retry_after_is_logged_cut_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    value = "soon" + "x" * 200
    with caplog.at_level(logging.DEBUG, logger="rateloop"):
        signal = classify(429, {"Retry-After": value}, None, now=NOW)
    assert signal.malformed == ("retry-after",)
    assert signal.retry_after is None
    (record,) = [r for r in caplog.records if "retry-after" in r.getMessage()]
    assert record.levelno == logging.DEBUG
    assert repr(value[:64]) in record.getMessage()
    assert value[:65] not in record.getMessage()


def test_an_http_date_beyond_the_clamp_keeps_its_real_date() -> None:
    later = NOW + timedelta(days=3)
    header = later.strftime("%a, %d %b %Y %H:%M:%S GMT")
    signal = classify(429, {"Retry-After": header}, None, now=NOW)
    assert signal.retry_after == 86_400.0
    assert signal.reset_at == later
    assert signal.kind is Kind.PERIOD_QUOTA


@pytest.mark.parametrize(
    ("headers", "wait"),
    [
        ({"retry-after": "2", "retry-after-ms": "1250"}, 1.25),
        ({"retry-after": "1", "retry-after-ms": "1800"}, 1.8),
        ([("Retry-After", "30"), ("Retry-After", "30")], 30.0),
        ({"retry-after": "30, 30"}, 30.0),
        ({"retry-after": "Wed, 01 Jan 2026 12:00:30 GMT"}, 30.0),
    ],
)
def test_retry_after_forms(headers: object, wait: float) -> None:
    signal = classify(429, headers, None, now=NOW)  # type: ignore[arg-type]
    assert signal.retry_after == wait
    assert signal.malformed == ()


def test_every_reader_takes_the_pause_limit() -> None:
    import httpx

    request = httpx.Request("POST", "https://api.openai.com/v1/chat/completions")
    response = httpx.Response(429, headers={"retry-after": "120"}, request=request)
    error = httpx.HTTPStatusError("429", request=request, response=response)
    assert classify_exception(error, now=NOW).kind is Kind.TEMPORARY
    assert classify_exception(error, now=NOW, pause_limit=60).kind is Kind.PERIOD_QUOTA
    from rateloop.classify import classify_response

    assert classify_response(response, now=NOW, pause_limit=60).kind is Kind.PERIOD_QUOTA
    assert classify_response(response, now=NOW, pause_limit=120).kind is Kind.TEMPORARY
