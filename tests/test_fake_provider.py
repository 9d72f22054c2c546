"""FakeProvider in-process: buckets, token counting profiles, shapes, faults, counters, ASGI."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import httpx
import pytest

from rateloop import Kind, classify_response
from rateloop.testing import (
    FakeClock,
    FakeLimits,
    FakeProvider,
    FakeRequest,
    FaultScript,
    Slow,
)

REQ = FakeRequest(input_tokens=100, max_tokens=100)


def make(clock: FakeClock | None = None, **options: object) -> FakeProvider:
    return FakeProvider(clock=clock or FakeClock(), **options)  # type: ignore[arg-type]


class YieldingClock(FakeClock):
    """A FakeClock whose asleep lets other tasks run first (to overlap requests)."""

    async def asleep(self, seconds: float) -> None:
        await asyncio.sleep(0)
        self.sleep(seconds)


# --- buckets -------------------------------------------------------------------------


def test_rpm_burst_then_refill_at_the_minute_rate() -> None:
    clock = FakeClock()
    fake = make(clock, rpm=60, burst_seconds=3)  # 1/s, 3 at once
    codes = [fake.respond(REQ).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    refused = fake.respond(REQ)
    assert refused.headers["retry-after"] == "3"  # 3 refused slots spent: 3 s of debt
    clock.advance(3.0)
    assert fake.respond(REQ).status_code == 200


def test_rejected_requests_spend_a_slot_unless_configured_not_to() -> None:
    for spends, expected in ((True, 429), (False, 200)):
        clock = FakeClock()
        fake = make(clock, rpm=60, burst_seconds=1, rejected_spends_request=spends)
        assert fake.respond(REQ).status_code == 200
        for _ in range(5):  # hammering while empty
            assert fake.respond(REQ).status_code == 429
        clock.advance(1.0)
        assert fake.respond(REQ).status_code == expected


def test_refused_debt_is_bounded_by_one_burst() -> None:
    clock = FakeClock()
    fake = make(clock, rpm=60, burst_seconds=2)
    for _ in range(100):
        fake.respond(REQ)
    clock.advance(3.0)  # level is at most -2; 3 s later at least 1
    assert fake.respond(REQ).status_code == 200


def test_a_request_larger_than_the_minute_limit_never_fits() -> None:
    fake = make(tpm=1000)
    response = fake.respond(FakeRequest(input_tokens=900, max_tokens=200))
    assert response.status_code == 429
    assert response.refused == "tokens"
    assert "Requested 1100" in response.text


def test_a_request_larger_than_the_burst_is_admitted_from_a_full_bucket() -> None:
    clock = FakeClock()
    fake = make(clock, tpm=6000, burst_seconds=5)  # 100/s, holds 500
    assert fake.respond(FakeRequest(input_tokens=800, max_tokens=0)).status_code == 200
    assert fake.respond(FakeRequest(input_tokens=10, max_tokens=0)).status_code == 429
    clock.advance(3.1)  # from -300 back to above 10
    assert fake.respond(FakeRequest(input_tokens=10, max_tokens=0)).status_code == 200


# --- token counting profiles -----------------------------------------------------------


def test_openai_counts_max_tokens_at_admission_and_keeps_them() -> None:
    clock = FakeClock()
    fake = make(clock, profile="openai", tpm=600, burst_seconds=60, output_ratio=0.1)
    assert fake.respond(FakeRequest(input_tokens=100, max_tokens=200)).ok
    assert fake.respond(FakeRequest(input_tokens=100, max_tokens=200)).ok
    # 600 - 2 x 300 = 0 left, though only 2 x 20 output tokens were produced.
    assert fake.respond(FakeRequest(input_tokens=1, max_tokens=0)).refused == "tokens"
    assert fake.stats.output_tokens == 40


def test_anthropic_estimates_output_from_max_tokens_then_corrects_it() -> None:
    fake = make(profile="anthropic", otpm=600, burst_seconds=60)
    assert fake.respond(FakeRequest(max_tokens=300, output_tokens=50)).ok
    assert fake.respond(FakeRequest(max_tokens=300, output_tokens=50)).ok
    # Charged 300 each at admission, corrected to 50 each: 500 left.
    assert fake.respond(FakeRequest(max_tokens=450, output_tokens=450)).ok
    assert fake.respond(FakeRequest(max_tokens=100)).refused == "output_tokens"


def test_anthropic_input_limit_excludes_cache_reads() -> None:
    fake = make(profile="anthropic", itpm=1000, burst_seconds=60)
    cached = FakeRequest(input_tokens=900, cache_read_tokens=800, max_tokens=10)
    for _ in range(10):  # 100 counted each
        assert fake.respond(cached).ok
    assert fake.respond(cached).refused == "input_tokens"
    assert fake.stats.cache_read_tokens == 8000


def test_gemini_counts_input_tokens_only() -> None:
    fake = make(profile="gemini", tpm=1000, burst_seconds=60)
    for _ in range(10):
        assert fake.respond(FakeRequest(input_tokens=100, max_tokens=5000)).ok
    assert fake.respond(FakeRequest(input_tokens=100, max_tokens=1)).refused == "tokens"


# --- day quota, concurrency, spend ------------------------------------------------------


@pytest.mark.parametrize("profile", ["openai", "anthropic", "gemini"])
def test_requests_per_day_is_a_period_quota_until_the_next_day(profile: str) -> None:
    clock = FakeClock(datetime(2026, 1, 1, 22, 0, tzinfo=UTC))
    fake = make(clock, profile=profile, rpd=2)
    assert fake.respond(REQ).ok and fake.respond(REQ).ok
    refused = fake.respond(REQ)
    assert refused.refused == "requests_per_day"
    signal = classify_response(refused, now=clock.now())
    assert signal.kind is Kind.PERIOD_QUOTA
    assert signal.dimension == "requests_per_day"
    clock.advance(timedelta(hours=24).total_seconds())
    assert fake.respond(REQ).ok


def test_exhaust_day_and_spend_are_states_a_test_sets() -> None:
    clock = FakeClock()
    fake = make(clock)
    fake.exhaust_day()
    assert fake.respond(REQ).refused == "requests_per_day"
    clock.advance(86_400)
    assert fake.respond(REQ).ok
    fake.exhaust_spend()
    spent = fake.respond(REQ)
    assert classify_response(spent, now=clock.now()).kind is Kind.SPEND
    fake.exhaust_spend(False)
    assert fake.respond(REQ).ok


def test_concurrency_limit_and_peak_are_counted() -> None:
    clock = YieldingClock()
    fake = make(clock, concurrency=2, latency=1.0)

    async def main() -> list[int]:
        answers = await asyncio.gather(*(fake.arespond(REQ) for _ in range(3)))
        return [a.status_code for a in answers]

    assert asyncio.run(main()) == [200, 200, 429]
    assert fake.stats.peak_concurrency == 2
    assert fake.stats.in_flight == 0
    assert fake.stats.refusals["concurrency"] == 1


# --- shapes read by rateloop.classify -----------------------------------------------------

LIMITS = {
    "requests": {"rpm": 1},
    "tokens": {"tpm": 10},
    "input_tokens": {"itpm": 5},
    "output_tokens": {"otpm": 5},
}


@pytest.mark.parametrize("profile", ["openai", "anthropic"])
@pytest.mark.parametrize("dimension", ["requests", "tokens", "input_tokens", "output_tokens"])
def test_throttles_classify_as_temporary_with_their_dimension(
    profile: str, dimension: str
) -> None:
    clock = FakeClock()
    fake = make(clock, profile=profile, burst_seconds=60, **LIMITS[dimension])
    # Each request fits the limit on its own (3 + 3 tokens); the second finds it spent.
    request = FakeRequest(input_tokens=3, max_tokens=3, output_tokens=3)
    assert fake.respond(request).ok
    refused = fake.respond(request)
    assert not refused.ok
    signal = classify_response(refused, now=clock.now())
    assert (signal.kind, signal.retryable) == (Kind.TEMPORARY, True)
    assert signal.dimension == dimension
    assert signal.provider == profile


def test_gemini_throttle_carries_retry_info() -> None:
    clock = FakeClock()
    fake = make(clock, profile="gemini", rpm=60, burst_seconds=1)
    fake.respond(REQ)
    refused = fake.respond(REQ)
    detail = refused.json()["error"]["details"][-1]
    assert detail == {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "2s"}
    signal = classify_response(refused, now=clock.now())
    assert (signal.kind, signal.retry_after, signal.dimension) == (Kind.TEMPORARY, 2.0, "requests")


@pytest.mark.parametrize("profile", ["openai", "anthropic", "gemini"])
@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        ("overload", Kind.OVERLOAD),
        ("server_error", Kind.SERVER_ERROR),
        ("spend", Kind.SPEND),
        ("period_quota", Kind.PERIOD_QUOTA),
        ("rate_limit", Kind.TEMPORARY),
    ],
)
def test_faults_classify_as_their_kind(profile: str, fault: str, kind: Kind) -> None:
    clock = FakeClock()
    fake = make(clock, profile=profile, faults=[fault])
    refused = fake.respond(REQ)
    assert classify_response(refused, now=clock.now()).kind is kind
    assert fake.respond(REQ).ok  # the script is over: normal answers
    assert fake.stats.refusals == {fault: 1}


@pytest.mark.parametrize("profile", ["openai", "anthropic", "gemini"])
def test_scripted_throttles_tell_their_wait_as_the_provider_would(profile: str) -> None:
    # 2026-01-01T00:00:00Z on the FakeClock: a rate-limit fault says 1 s (the requests
    # bucket has room), a day-quota fault says the hours to the provider's midnight.
    clock = FakeClock()
    fake = make(clock, profile=profile, rpm=60, faults=["rate_limit", "period_quota"])
    throttle = classify_response(fake.respond(REQ), now=clock.now())
    assert (throttle.kind, throttle.retry_after) == (Kind.TEMPORARY, 1.0)
    day = classify_response(fake.respond(REQ), now=clock.now())
    assert day.kind is Kind.PERIOD_QUOTA
    left = 24 * 3600.0
    if profile == "gemini":
        try:  # Pacific midnight is 08:00Z; without a tz database the day stays UTC's
            ZoneInfo("America/Los_Angeles")
            left = 8 * 3600.0
        except ZoneInfoNotFoundError:
            pass
    assert day.retry_after == pytest.approx(left, abs=1.0)


def test_success_headers_describe_the_buckets() -> None:
    openai_ok = make(profile="openai", rpm=600, tpm=60_000).respond(REQ)
    assert openai_ok.headers["x-ratelimit-limit-requests"] == "600"
    assert openai_ok.headers["x-ratelimit-remaining-requests"] == "49"  # 5 s of 600/min
    assert openai_ok.headers["x-ratelimit-limit-tokens"] == "60000"
    assert openai_ok.json()["usage"] == {"prompt_tokens": 100, "completion_tokens": 100,
                                         "total_tokens": 200}
    anthropic_ok = make(profile="anthropic", rpm=50, itpm=1000).respond(REQ)
    assert anthropic_ok.headers["anthropic-ratelimit-requests-limit"] == "50"
    assert anthropic_ok.headers["anthropic-ratelimit-input-tokens-remaining"] == "0"
    assert anthropic_ok.headers["anthropic-ratelimit-requests-reset"] == "2026-01-01T00:00:02Z"
    gemini_ok = make(profile="gemini", rpm=50).respond(REQ)
    assert not any(h.startswith(("x-ratelimit", "anthropic")) for h in gemini_ok.headers)
    assert gemini_ok.json()["usageMetadata"]["promptTokenCount"] == 100


# --- faults -----------------------------------------------------------------------------


def test_fault_sequence_and_fault_script() -> None:
    fake = make(faults=["overload", None, "overload"])
    assert [fake.respond(REQ).status_code for _ in range(4)] == [503, 200, 503, 200]
    forever = make(profile="anthropic", faults=FaultScript([None, "overload"]))
    assert [forever.respond(REQ).status_code for _ in range(4)] == [200, 529, 529, 529]


def test_fault_rates_are_seeded() -> None:
    def run(seed: int) -> list[int]:
        fake = make(fault_rates={"overload": 0.3}, seed=seed)
        return [fake.respond(REQ).status_code for _ in range(200)]

    assert run(7) == run(7)
    overloads = run(7).count(503)
    assert 40 <= overloads <= 80  # 0.3 of 200, within a wide margin of chance
    assert run(7) != run(8)


def test_slow_responses_take_time_on_the_clock() -> None:
    clock = FakeClock()
    fake = make(clock, latency=0.5, faults=[Slow(2.0)])
    assert fake.respond(REQ).ok
    assert fake.respond(REQ).ok
    assert clock.sleeps == [2.5, 0.5]


def test_reset_and_stream_error() -> None:
    clock = FakeClock()
    fake = make(clock, profile="anthropic", faults=["reset", "stream_error", "stream_error"])
    assert fake.respond(REQ).reset
    broken = fake.respond(FakeRequest(stream=True))
    assert broken.status_code == 200
    assert b"event: message_start" in broken.chunks[0]
    assert b"event: error" in broken.chunks[-1]
    assert classify_response(broken, now=clock.now()).kind is Kind.OVERLOAD
    # Not a stream: the same fault answers as an overload refusal.
    assert fake.respond(REQ).status_code == 529
    assert fake.stats.refusals == {"reset": 1, "stream_error": 2}
    assert fake.stats.served == 0


@pytest.mark.parametrize(("profile", "status", "kind"), [
    ("openai", 500, Kind.SERVER_ERROR),
    ("anthropic", 529, Kind.OVERLOAD),
    ("gemini", 503, Kind.OVERLOAD),
])
def test_stream_error_on_a_plain_request_answers_the_streams_error(
    profile: str, status: int, kind: Kind
) -> None:
    clock = FakeClock()
    fake = make(clock, profile=profile, faults=["stream_error"])
    refused = fake.respond(REQ)
    assert refused.status_code == status
    assert classify_response(refused, now=clock.now()).kind is kind


# --- configuration and counters -------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"rpm": 0}, "FakeLimits.rpm must be an integer >= 1 or None (unlimited), got 0"),
        ({"burst_seconds": 0}, "burst_seconds must be a number of seconds 0 < burst <= 60"),
        ({"profile": "mistral"}, "profile must be one of openai, anthropic, gemini"),
        ({"faults": ["boom"]}, "unknown fault 'boom'"),
        ({"fault_rates": {"overload": 2}}, "fault_rates['overload'] must be a probability"),
        ({"latency": -1}, "latency must be a number of seconds >= 0, got -1"),
    ],
)
def test_bad_configuration_is_named(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        make(**options)


def test_limits_object_and_reset() -> None:
    fake = make(limits=FakeLimits(rpm=60, burst_seconds=1))
    fake.respond(REQ)
    fake.respond(REQ)
    assert (fake.stats.attempts, fake.stats.served, fake.stats.refused) == (2, 1, 1)
    fake.reset()
    assert fake.stats.attempts == 0
    assert fake.respond(REQ).ok
    assert "rpm=60" in repr(fake)


# --- the ASGI app, in-process on the FakeClock ---------------------------------------------


def test_asgi_app_in_process_on_virtual_time() -> None:
    clock = FakeClock()
    fake = FakeProvider(rpm=60, burst_seconds=1, latency=0.25, clock=clock)

    async def main() -> None:
        transport = httpx.ASGITransport(app=fake)
        async with httpx.AsyncClient(transport=transport, base_url="http://fake") as client:
            body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "x" * 400}],
                    "max_tokens": 50}
            ok = await client.post("/v1/chat/completions", json=body)
            assert ok.status_code == 200
            assert ok.json()["usage"]["prompt_tokens"] == 100  # 400 characters / 4
            refused = await client.post("/v1/chat/completions", json=body,
                                        headers={"x-fake-input-tokens": "7"})
            assert refused.status_code == 429
            assert classify_response(refused, now=clock.now()).dimension == "requests"
            stats = (await client.get("/fake/stats")).json()
            assert stats["attempts"] == 2 and stats["refusals"] == {"requests": 1}
            missing = await client.post("/v2/nothing", json={})
            assert missing.status_code == 404
            bad = await client.post("/v1/messages", content=b"[1]")
            assert bad.status_code == 400

    asyncio.run(main())
    assert clock.sleeps == [0.25]  # the provider's latency, on virtual time


def test_real_sdks_in_process_through_the_httpx2_asgi_transport() -> None:
    """No socket at all: the SDKs' own httpx2 client, the app, a FakeClock."""
    import anthropic
    import httpx2
    import openai

    clock = FakeClock()
    fake = FakeProvider(rpm=60, burst_seconds=1, latency=0.25, clock=clock)
    messages = [{"role": "user", "content": "hi"}]

    async def main() -> None:
        client = openai.AsyncOpenAI(
            base_url="http://fake/v1", api_key="fake", max_retries=0,
            http_client=httpx2.AsyncClient(transport=httpx2.ASGITransport(app=fake)),
        )
        ok = await client.chat.completions.create(model="m", messages=messages,  # type: ignore[arg-type]
                                                  max_tokens=3)
        assert ok.usage is not None and ok.usage.completion_tokens == 3
        with pytest.raises(openai.RateLimitError) as limited:
            await client.chat.completions.create(model="m", messages=messages,  # type: ignore[arg-type]
                                                 max_tokens=3)
        assert limited.value.response.headers["x-ratelimit-limit-requests"] == "60"
        other = anthropic.AsyncAnthropic(
            base_url="http://fake", api_key="fake", max_retries=0,
            http_client=httpx2.AsyncClient(transport=httpx2.ASGITransport(app=fake)),
        )
        clock.advance(10)
        answer = await other.messages.create(model="m", max_tokens=3,
                                             messages=messages)  # type: ignore[arg-type]
        assert answer.usage.output_tokens == 3

    asyncio.run(main())
    assert clock.sleeps == [0.25, 0.25]
    assert (fake.stats.attempts, fake.stats.served) == (3, 2)


def test_gemini_day_quota_resets_at_pacific_midnight() -> None:
    clock = FakeClock(datetime(2026, 1, 1, 7, 0, tzinfo=UTC))  # 23:00 in Los Angeles
    fake = make(clock, profile="gemini", rpd=1)
    assert fake.respond(REQ).ok
    refused = fake.respond(REQ)
    assert classify_response(refused, now=clock.now()).reset_at == datetime(
        2026, 1, 1, 8, 0, tzinfo=UTC)
    clock.advance(3600)  # 08:00 UTC: a new day in Los Angeles, not yet in UTC
    assert fake.respond(REQ).ok


@pytest.mark.parametrize("library", ["httpx", "httpx2"])
def test_sync_mock_transport_handler(library: str) -> None:
    import importlib

    lib = importlib.import_module(library)
    clock = FakeClock()
    fake = FakeProvider(profile="anthropic", rpm=60, burst_seconds=1, latency=0.5,
                        faults=[None, None, "reset"], clock=clock)
    with lib.Client(transport=lib.MockTransport(fake.handler), base_url="http://fake") as client:
        body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
        ok = client.post("/v1/messages", json=body)
        assert ok.status_code == 200 and ok.json()["usage"]["output_tokens"] == 5
        limited = client.post("/v1/messages", json=body)
        assert limited.status_code == 429
        assert classify_response(limited, now=clock.now()).kind is Kind.TEMPORARY
        with pytest.raises(lib.ReadError):
            client.post("/v1/messages", json=body)
        assert client.get("/fake/stats").json()["attempts"] == 3
        assert client.post("/v1/messages", content=b"[]").status_code == 400
        assert client.get("/nowhere").status_code == 404
    assert clock.sleeps == [0.5]
