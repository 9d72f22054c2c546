"""Read under hostile input: structured fields, header lists and streams that stalled it.

The slow inputs fuzzing found: a ``RateLimit-Policy`` of ``"a;" * 2048`` took
~0.3 s (the member pattern backtracked, quadratically), a ``RateLimit`` of
twenty ``;w="60"`` parameters and a stray word took seconds (exponentially:
each quoted value could also be read as a token), and a header repeated 20 000
times took ~8 s of CPU (each repeat copied the joined value).  The time tests time
process CPU (best of three) against bounds ten to a hundred times what the
fixed reader needs, and far below what the old one took; the header-count test
counts the pairs read, not time.  A stream of 100 000 small SSE events took
~0.2 s (each event was decoded in Python); the fast reader is checked against
that event-by-event reading.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rateloop.classify import _evidence as evidence
from rateloop.classify import classify, classify_exception, detect_provider
from rateloop.classify._evidence import (
    MAX_BODY_CHARS,
    MAX_HEADER_CHARS,
    MAX_HEADER_FIELDS,
    body_text,
    normalize_headers,
)
from rateloop.classify._http import observe
from rateloop.classify._sse import decode_json, sse_error
from rateloop.classify._structured import MAX_FIELD_CHARS, parse_list
from rateloop.signal import Dimension, Kind, Observed

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
BOUND = 0.5  # seconds of CPU; the fixed readers take a few milliseconds


def _best(run: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        run()
        best = min(best, time.process_time() - started)
    return best


# --- structured fields (RateLimit, RateLimit-Policy) -------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "a;" * 2048,  # quadratic before: ~0.3 s per field
        "a" + ';a="x"' * 20 + " junk",  # exponential before: ~7 s per field
        '"p";q=1' + ';w="60"' * 40 + " x",  # exponential before: hours
        " ;" * 2048,
        '"' + '\\"' * 2047,  # an unterminated quoted string
        ('"p";q=5;' + '"' * 7) * 200,
    ],
    ids=["a-semicolons", "quoted-params-20", "quoted-params-40", "blank-params",
         "unterminated", "stray-quotes"],
)
def test_a_hostile_structured_field_is_read_quickly(value: str) -> None:
    headers = {"RateLimit": value, "RateLimit-Policy": value, "retry-after": "5"}
    seconds = _best(lambda: classify(429, headers, None, now=NOW))
    assert seconds < BOUND / 2, f"{value[:40]!r}... took {seconds:.2f} s"


@pytest.mark.parametrize("unit", ["a;", ";a=", '"', ", ", 'a;b="', ';a="x"', " ;"])
def test_a_structured_field_is_read_in_linear_time(unit: str) -> None:
    def make(size: int) -> Callable[[], object]:
        value = (unit * (size // len(unit) + 1))[:size]
        return lambda: classify(429, {"RateLimit": value}, None, now=NOW)

    small, large = MAX_FIELD_CHARS // 16, MAX_FIELD_CHARS
    t_small, t_large = _best(make(small)), _best(make(large))
    if t_large < 0.004:  # below a few milliseconds the ratio is noise
        return
    assert t_large / max(t_small, 1e-6) < 3 * large / small, (t_small, t_large)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('"default";q=100;w=60', {"default": {"q": "100", "w": "60"}}),
        (
            '"burst";q=100;w=60, "daily";q=1000;w=86400',
            {"burst": {"q": "100", "w": "60"}, "daily": {"q": "1000", "w": "86400"}},
        ),
        ('  "a" ; q=1 ;  w=2 ,b;r=0', {"a": {"q": "1", "w": "2"}, "b": {"r": "0"}}),
        ("tok;R=5;T=30", {"tok": {"r": "5", "t": "30"}}),
        ('"a,b\\"c";q=5', {'a,b\\"c': {"q": "5"}}),
        ('"p";q="10";flag;w=60', {"p": {"q": "10", "flag": "", "w": "60"}}),
        ('"p";q=1;q=2', {"p": {"q": "2"}}),  # the last parameter of a name wins
        ('"p";q=1, "p";q=2', {"p": {"q": "1"}}),  # the first member of a name wins
        ('"p";w=', {"p": {"w": ""}}),
        ("*;q=1", {"*": {"q": "1"}}),
        ("a;x.y-z*=1", {"a": {"x.y-z*": "1"}}),
        ("", {}),
        (",,,", {}),
        ('"p";q=1 junk, "ok";r=3', {"ok": {"r": "3"}}),  # a broken member is skipped
        ('"p";1=2, "ok";r=3', {"ok": {"r": "3"}}),
    ],
)
def test_structured_field_members(value: str, expected: dict[str, dict[str, str]]) -> None:
    assert parse_list(value) == expected


def test_ietf_headers_still_read() -> None:
    headers = {
        "ratelimit-policy": '"burst";q=100;w=60, "daily";q=1000;w=86400;qu="tokens"',
        "ratelimit": '"burst";r=0;t=30, "daily";r=12;t=3600',
    }
    assert observe(headers, NOW, provider="openai") == (
        Observed(dimension=Dimension.REQUESTS, limit=100.0, remaining=0.0, reset_after=30.0,
                 window=60.0),
        Observed(dimension=Dimension.TOKENS, limit=1000.0, remaining=12.0, reset_after=3600.0,
                 window=86400.0),
    )


# --- many header fields -------------------------------------------------------------


def test_a_header_repeated_fifty_thousand_times_is_read_quickly() -> None:
    headers = [("Retry-After", "x" * 100)] * 50_000 + [("retry-after", "5")]
    seconds = _best(lambda: classify(429, headers, None, now=NOW))
    assert seconds < BOUND, f"took {seconds:.2f} s"


def test_repeated_headers_are_joined_in_order_up_to_the_value_cap() -> None:
    norm = normalize_headers([("Retry-After", "30"), ("X-A", "1"), ("retry-after", " 30 ")])
    assert norm == {"retry-after": "30, 30", "x-a": "1"}
    long = normalize_headers([("x-a", "v" * 5000)] * 10)
    assert long["x-a"] == (", ".join(["v" * 5000] * 2))[:8192]
    assert classify(429, [("Retry-After", "30"), ("retry-after", "45")], None,
                    now=NOW).retry_after == 45.0


def test_at_most_max_header_fields_pairs_are_read() -> None:
    taken = 0

    def pairs() -> Iterator[tuple[str, str]]:
        nonlocal taken
        for index in range(1_000_000):
            taken += 1
            yield (f"x-h{index}", "v")

    started = time.process_time()
    signal = classify(429, pairs(), None, now=NOW)
    seconds = time.process_time() - started
    assert signal.kind is Kind.TEMPORARY
    assert taken <= MAX_HEADER_FIELDS + 1
    assert seconds < BOUND, f"took {seconds:.2f} s"


def test_at_most_max_header_chars_are_read() -> None:
    taken = 0

    def pairs() -> Iterator[tuple[str, str]]:
        nonlocal taken
        for index in range(MAX_HEADER_FIELDS):
            taken += 1
            yield (f"x-h{index}", "\u2028" * 8192)  # whitespace: slow to strip

    norm = normalize_headers(pairs())
    assert taken <= MAX_HEADER_CHARS // 8192 + 1
    assert len(norm) == MAX_HEADER_CHARS // (len("x-h0") + 8192)
    assert set(norm.values()) == {""}


def test_provider_marks_keep_their_order_among_many_headers() -> None:
    filler = [(f"x-h{index}", "v") for index in range(MAX_HEADER_FIELDS - 3)]
    # "anthropic-" is tried before "openai-": the order of the marks decides, not of the headers.
    assert detect_provider([*filler, ("openai-version", "1"), ("anthropic-x", "1")], None) == (
        "anthropic"
    )
    assert detect_provider([*filler, ("x-groq-region", "us")], None) == "groq"
    assert detect_provider([*filler, ("x-groq", "us")], None) is None  # a prefix of a mark
    assert detect_provider([("x-ratelimit-limit-requests-day", "1")], None) == "cerebras"
    assert detect_provider([("x-ratelimit-limit-requests", "1")], None) is None


def test_many_distinct_headers_are_read_quickly() -> None:
    headers = {f"x-header-{index}": "v" for index in range(110_000)}
    headers["retry-after"] = "7"
    seconds = _best(lambda: classify(429, headers, None, now=NOW))
    assert seconds < 0.2, f"took {seconds:.3f} s"  # ~0.45 s before


# --- SSE streams --------------------------------------------------------------------


def _sse_reference(text: str) -> object:
    """The event-by-event reading the fast reader must agree with (the old code)."""
    if "data:" not in text:
        return None
    event, data = "", list[str]()
    for line in [*text.splitlines(), ""]:
        if not line:
            if data:
                payload = decode_json("\n".join(data))
                shaped = isinstance(payload, Mapping) and (
                    payload.get("type") == "error" or isinstance(payload.get("error"), Mapping)
                )
                if event == "error" or shaped:
                    return payload if payload is not None else {"error": "\n".join(data)}
            event, data = "", []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
    return None


SSE_PIECES = [
    "data: ", "data:", "event: ", "event:", "error", "ping", "\n", "\n", "\r\n", "\r", "\u2028",
    "\x85", " ", "\t", "\u00a0", '{"error": {"message": "x"}}', '{"type": "error"}', "{}",
    '{"type": "ping"}', '"error"', '{"\\u0065rror": {}}', '{"type": "\\u0065rror"}', '{"error": 1}',
    "{", "}", '"', ":", "x", "[1]",
]


@settings(max_examples=2_000, deadline=None)
@given(st.lists(st.sampled_from(SSE_PIECES), max_size=40).map("".join))
def test_the_sse_reader_agrees_with_reading_every_event(text: str) -> None:
    assert sse_error(text) == _sse_reference(text)


@pytest.mark.parametrize(
    "event", ["data: {}\n\n", "data: [1]\n\n", 'event: ping\ndata: {"type": "x"}\n\n']
)
def test_a_stream_of_a_hundred_thousand_events_is_read_quickly(event: str) -> None:
    body = event * (MAX_BODY_CHARS // len(event)) + 'event: error\ndata: {"error": {}}\n\n'
    seconds = _best(lambda: classify(200, None, body, now=NOW))
    assert seconds < BOUND / 5, f"took {seconds:.3f} s"  # ~0.2 s before, event by event


@pytest.mark.parametrize("unit", [b"\xff", b"\xe2\x82\xac", b"\xf0\x9f\x99", b"a\xc3"])
@pytest.mark.parametrize("extra", [-1, 0, 1, 2, 3, 4, 3 * MAX_BODY_CHARS])
def test_bytes_are_decoded_as_one_decoding_would(unit: bytes, extra: int) -> None:
    body = (unit * (MAX_BODY_CHARS // len(unit) + 1))[: MAX_BODY_CHARS + extra]
    body += unit[:1] * (extra % 5)  # and an end cut inside a character
    expected = body[: MAX_BODY_CHARS * 4].decode("utf-8", "replace")[:MAX_BODY_CHARS]
    assert body_text(body) == expected


def test_an_exception_body_is_decoded_once_for_detection_and_classification(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    real = evidence.body_text
    monkeypatch.setattr(evidence, "body_text", lambda body: calls.append(1) or real(body))
    body = json.dumps({"error": {"message": "rate limit", "details": list(range(1000))}})
    request = httpx.Request("POST", "https://example.test/v1")
    response = httpx.Response(429, content=body.encode(), request=request)
    error = httpx.HTTPStatusError("429", request=request, response=response)
    calls.clear()
    signal = classify_exception(error, now=NOW)
    assert signal.kind is Kind.TEMPORARY
    assert len(calls) == 1
