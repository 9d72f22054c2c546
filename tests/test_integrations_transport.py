"""The RATE-loop transports through the real OpenAI SDK, over real HTTP on 127.0.0.1.

The failure matrix: every row is one scripted provider behaviour, checked by
what the SDK raised or returned, the outcome the transport attached, and the
requests the server really saw (no stacked retries).  Waits run on a
FakeClock; sockets, the SDK and the transport are real.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import httpx2
import openai
import pytest

import rateloop
from rateloop import Kind, Limiter, LimitSpec, Policy, RecordingSink, Status
from rateloop.integrations import httpx as rl_httpx
from rateloop.integrations import httpx2 as rl_httpx2
from rateloop.integrations._transport import OUTCOME_KEY, AdmissionRefused
from rateloop.testing import FakeClock
from transport_server import ScriptedProvider, Step

MESSAGES = [{"role": "user", "content": "say hello"}]
RATE_LIMITED = {"error": {"type": "rate_limit_error", "message": "Rate limit reached"}}




@pytest.fixture
def server() -> Iterator[ScriptedProvider]:
    with ScriptedProvider() as provider:  # closes the clients it keeps
        yield provider


def _client(
    server: ScriptedProvider, clock: FakeClock, api_key: str = "sk-test-key", **ours: Any
) -> Any:
    client = rateloop.openai_client(
        base_url=server.url + "/v1", api_key=api_key, clock=clock, timeout=10.0, **ours
    )
    server.keep(client)
    return client


def _call(client: Any, **extra: Any) -> Any:
    return client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=MESSAGES, max_tokens=50, **extra
    )


def _outcome(response: Any) -> rateloop.Outcome:
    outcome = response.extensions[OUTCOME_KEY]
    assert isinstance(outcome, rateloop.Outcome)
    return outcome


# --- the matrix: retried, then completed --------------------------------------------------


@pytest.mark.parametrize(
    ("step", "kind"),
    [
        (Step(429, {"retry-after": "7"}, RATE_LIMITED), "temporary"),
        (Step(429, {"x-ratelimit-reset-requests": "3s"}, RATE_LIMITED), "temporary"),
        (Step(500, body={"error": {"message": "boom"}}), "server_error"),
        (Step(503, body={"error": {"message": "unavailable"}}), "server_error"),
        (Step(529, body={"type": "error", "error": {"type": "overloaded_error"}}), "overload"),
        (Step(drop=True), "network"),
        (Step(200, body={"error": {"type": "overloaded_error", "message": "Overloaded"}}),
         "overload"),
    ],
    ids=["429-retry-after", "429-reset-header", "500", "503", "529", "dropped", "200-envelope"],
)
def test_a_retryable_refusal_is_retried_once_at_the_server(
    server: ScriptedProvider, step: Step, kind: str
) -> None:
    clock, sink = FakeClock(), RecordingSink()
    server.add(step)
    raw = _call(_client(server, clock, sinks=[sink]))
    outcome = _outcome(raw.http_response)
    assert raw.parse().choices[0].message.content == "hello"
    assert outcome.status is Status.COMPLETED
    assert server.count() == 2  # one refusal, one success: nobody else retried
    assert outcome.attempts.loop == 2
    waits = [e for e in sink.events if e.decision.value == "wait"]
    assert len(waits) == 1 and waits[0].signal_kind == kind
    assert all(s.headers.get("x-stainless-retry-count", "0") == "0" for s in server.seen)


def test_a_server_minimum_is_a_floor_and_the_local_backoff_starts_at_5s(
    server: ScriptedProvider,
) -> None:
    clock, sink = FakeClock(), RecordingSink()
    server.add(Step(429, {"retry-after": "20"}, RATE_LIMITED), Step(429, body=RATE_LIMITED))
    _call(_client(server, clock, sinks=[sink]))
    waits = [e.wait_seconds for e in sink.events if e.decision.value == "wait"]
    assert waits[0] is not None and 20 <= waits[0] <= 20 + 2.5  # max(local, 20) + U(0, 5/2)
    assert waits[1] is not None and 5 <= waits[1] <= 10  # 10 s with equal jitter, no minimum
    assert server.count() == 3


# --- the matrix: stopped, with the SDK's own exception -----------------------------------


@pytest.mark.parametrize(
    ("step", "error", "status"),
    [
        (Step(400, body={"error": {"message": "bad request"}}), openai.BadRequestError,
         Status.INVALID),
        (Step(401, body={"error": {"message": "bad key"}}), openai.AuthenticationError,
         Status.NEEDS_OPERATOR),
        (Step(404, body={"error": {"message": "no such model"}}), openai.NotFoundError,
         Status.INVALID),
        (Step(429, body={"error": {"type": "insufficient_quota", "code": "insufficient_quota",
                                   "message": "You exceeded your current quota"}}),
         openai.RateLimitError, Status.NEEDS_OPERATOR),
        (Step(429, {"retry-after": "1800"}, RATE_LIMITED), openai.RateLimitError,
         Status.WAITING_FOR_CAPACITY),
    ],
    ids=["400", "401", "404", "spend", "minimum-beyond-the-budget"],
)
def test_a_final_refusal_reaches_the_caller_as_the_sdk_error_at_once(
    server: ScriptedProvider, step: Step, error: type[Exception], status: Status
) -> None:
    clock = FakeClock()
    server.add(step)
    with pytest.raises(error) as caught:
        _call(_client(server, clock))
    outcome = _outcome(caught.value.response)  # type: ignore[attr-defined]
    assert outcome.status is status
    assert server.count() == 1
    assert clock.monotonic() == 0.0  # nothing was waited for


def test_a_minimum_beyond_the_budget_comes_back_with_the_minimum_as_advice(
    server: ScriptedProvider,
) -> None:
    clock = FakeClock()
    server.add(Step(429, {"retry-after": "1800"}, RATE_LIMITED))
    with pytest.raises(openai.RateLimitError) as caught:
        _call(_client(server, clock))
    outcome = _outcome(caught.value.response)
    assert outcome.retry_at is not None
    assert (outcome.retry_at - clock.now()).total_seconds() >= 1800
    assert outcome.signal is not None and outcome.signal.retry_after == 1800


def test_persistent_429s_stop_at_max_attempts_counting_the_first(
    server: ScriptedProvider,
) -> None:
    server.default = Step(429, body=RATE_LIMITED)
    with pytest.raises(openai.RateLimitError) as caught:
        _call(_client(server, FakeClock(), policy=Policy(max_attempts=3)))
    assert _outcome(caught.value.response).status is Status.FAILED_RETRY_EXHAUSTED
    assert server.count() == 3


def test_persistent_429s_stop_within_the_recovery_budget(server: ScriptedProvider) -> None:
    clock = FakeClock()
    server.default = Step(429, {"retry-after": "30"}, RATE_LIMITED)
    with pytest.raises(openai.RateLimitError) as caught:
        _call(_client(server, clock))
    outcome = _outcome(caught.value.response)
    assert outcome.status is Status.WAITING_FOR_CAPACITY
    assert clock.monotonic() <= 600  # never waited past the budget from the first refusal
    assert 10 <= server.count() <= 20


def test_max_attempts_1_makes_one_request(server: ScriptedProvider) -> None:
    server.default = Step(429, body=RATE_LIMITED)
    with pytest.raises(openai.RateLimitError):
        _call(_client(server, FakeClock(), policy=Policy(max_attempts=1)))
    assert server.count() == 1


def test_enabled_false_sends_the_request_exactly_once(server: ScriptedProvider) -> None:
    server.add(Step(429, {"retry-after": "1"}, RATE_LIMITED))
    with pytest.raises(openai.RateLimitError) as caught:
        _call(_client(server, FakeClock(), enabled=False))
    assert OUTCOME_KEY not in caught.value.response.extensions
    assert server.count() == 1


def test_a_connection_that_never_answers_raises_the_sdk_connection_error(
    server: ScriptedProvider,
) -> None:
    server.default = Step(drop=True)
    with pytest.raises(openai.APIConnectionError) as caught:
        _call(_client(server, FakeClock(), policy=Policy(max_error_attempts=3)))
    cause = caught.value.__cause__
    outcome = cause.rateloop_outcome  # type: ignore[union-attr]
    assert outcome.status is Status.FAILED_RETRY_EXHAUSTED
    assert outcome.signal.kind is Kind.NETWORK
    assert server.count() == 3


def test_a_stalled_body_is_a_network_failure_not_a_hang(server: ScriptedProvider) -> None:
    server.add(Step(200, stall=2.0))
    raw = _call(_client(server, FakeClock(), first_byte_timeout=0.3, idle_timeout=0.3))
    outcome = _outcome(raw.http_response)
    assert outcome.status is Status.COMPLETED
    assert outcome.attempts.loop == 2
    assert server.count() == 2


def test_a_body_past_the_cap_is_not_buffered(server: ScriptedProvider) -> None:
    server.default = Step(200, body={"choices": [], "padding": "x" * 5000})
    with pytest.raises(openai.APIConnectionError) as caught:
        _call(_client(server, FakeClock(), max_body_bytes=1000, policy=Policy(max_attempts=2)))
    assert "1000 bytes" in str(caught.value.__cause__)


# --- admission: learn, settle, refuse --------------------------------------------------


def test_success_headers_teach_a_zero_config_limiter(server: ScriptedProvider) -> None:
    clock = FakeClock()
    limiter = Limiter.from_url("memory://", clock=clock)
    server.add(
        Step(
            200,
            {
                "x-ratelimit-limit-requests": "60",
                "x-ratelimit-remaining-requests": "59",
                "x-ratelimit-reset-requests": "1s",
                "x-ratelimit-limit-tokens": "10000",
                "x-ratelimit-remaining-tokens": "9900",
                "x-ratelimit-reset-tokens": "1s",
            },
        )
    )
    raw = _call(_client(server, clock, limiter=limiter))
    scope = _outcome(raw.http_response).route.provider_scope
    learned = limiter.limits_for(scope)
    assert learned is not None and learned.requests_per_minute == 60


def test_usage_from_the_body_settles_the_reservation(server: ScriptedProvider) -> None:
    # 100 tokens a minute; each call reserves its prompt + 50 output tokens,
    # and really spends 11 + 7 (the scripted usage).  Without settlement the
    # second call would have to wait for the bucket to refill.
    clock = FakeClock()
    limiter = Limiter.from_url("memory://", clock=clock)
    client = _client(server, clock, limiter=limiter)
    first = _outcome(_call(client).http_response)
    # profile="generic": output settles to the tokens produced (OpenAI keeps max_tokens).
    limiter.set_limits(
        first.route.scope, LimitSpec(tokens_per_minute=100, burst=1.0, profile="generic")
    )
    for _ in range(3):
        assert _outcome(_call(client).http_response).status is Status.COMPLETED
    assert clock.monotonic() == 0.0


def test_openai_accounting_keeps_the_unused_output_tokens(server: ScriptedProvider) -> None:
    # The same calls under OpenAI's own profile: max_tokens is charged and kept, so the
    # bucket of 100 tokens a minute cannot take the next calls without waiting.
    clock = FakeClock()
    limiter = Limiter.from_url("memory://", clock=clock)
    client = _client(server, clock, limiter=limiter)
    first = _outcome(_call(client).http_response)
    limiter.set_limits(first.route.scope, LimitSpec(tokens_per_minute=100, burst=1.0))
    for _ in range(3):
        assert _outcome(_call(client).http_response).status is Status.COMPLETED
    assert clock.monotonic() > 0.0


def test_a_cost_that_never_fits_is_refused_locally_and_nothing_is_sent(
    server: ScriptedProvider,
) -> None:
    clock = FakeClock()
    limiter = Limiter.from_url("memory://", clock=clock)
    client = _client(server, clock, limiter=limiter)
    scope = _outcome(_call(client).http_response).route.scope
    limiter.set_limits(scope, LimitSpec(tokens_per_minute=20, burst=1.0))
    # The SDK translates only HTTP errors: our own refusal reaches the caller as itself.
    with pytest.raises(AdmissionRefused) as caught:
        _call(client)
    refused = caught.value
    assert refused.outcome.status is Status.REJECTED
    assert server.count() == 1  # only the first, unlimited call reached the server


def test_the_scope_names_the_key_by_fingerprint_only(server: ScriptedProvider) -> None:
    raw = _call(_client(server, FakeClock()))
    route = _outcome(raw.http_response).route
    assert route.provider == "openai" and route.model == "gpt-4o-mini"
    assert "sk-test-key" not in route.scope and "test" not in route.scope
    other = _client(server, FakeClock(), api_key="sk-other")
    assert _outcome(_call(other).http_response).route.scope != route.scope


def test_a_non_model_post_that_may_have_applied_is_not_retried(
    server: ScriptedProvider,
) -> None:
    server.default = Step(drop=True)
    client = httpx2.Client(
        transport=rl_httpx2.RateLoopTransport(clock=FakeClock()), base_url=server.url
    )
    server.keep(client)
    with pytest.raises(httpx2.TransportError) as caught:
        client.post("/v1/files", json={"purpose": "batch"})
    outcome = caught.value.rateloop_outcome  # type: ignore[attr-defined]
    assert outcome.status is Status.NEEDS_OPERATOR
    assert server.count() == 1


# --- both transport packages, both flavours ---------------------------------------------


@pytest.mark.parametrize("hx", [httpx, httpx2], ids=["httpx", "httpx2"])
def test_each_package_transport_retries_and_settles(
    server: ScriptedProvider, hx: Any
) -> None:
    module = rl_httpx if hx is httpx else rl_httpx2
    server.add(Step(429, {"retry-after": "1"}, RATE_LIMITED))
    client = hx.Client(transport=module.RateLoopTransport(clock=FakeClock()), base_url=server.url)
    server.keep(client)
    response = client.post(
        "/v1/chat/completions", json={"model": "m", "messages": MESSAGES},
        headers={"authorization": "Bearer k"},
    )
    assert response.status_code == 200 and response.json()["usage"]["prompt_tokens"] == 11
    assert response.extensions[OUTCOME_KEY].attempts.loop == 2
    assert server.count() == 2


async def _async_roundtrip(server: ScriptedProvider, hx: Any) -> Any:
    module = rl_httpx if hx is httpx else rl_httpx2
    async with hx.AsyncClient(
        transport=module.AsyncRateLoopTransport(clock=FakeClock()), base_url=server.url
    ) as client:
        return await client.post("/v1/chat/completions", json={"model": "m"})


@pytest.mark.parametrize("hx", [httpx, httpx2], ids=["httpx", "httpx2"])
def test_each_package_async_transport_retries(server: ScriptedProvider, hx: Any) -> None:
    import asyncio

    server.add(Step(503))
    response = asyncio.run(_async_roundtrip(server, hx))
    assert response.status_code == 200
    assert response.extensions[OUTCOME_KEY].attempts.loop == 2
    assert server.count() == 2


def test_bad_transport_options_are_refused_with_the_allowed_values() -> None:
    with pytest.raises(ValueError, match="first_byte_timeout must be a number of seconds > 0"):
        rl_httpx2.RateLoopTransport(first_byte_timeout=0)
    with pytest.raises(ValueError, match="max_body_bytes must be an int >= 1"):
        rl_httpx2.RateLoopTransport(max_body_bytes=0)
    with pytest.raises(TypeError, match="max_retries= is set by the rateloop client helpers"):
        rateloop.openai_client(api_key="k", max_retries=2)


# --- the cold start (the limiter's, on every door) -------------------------------------

LIMIT_HEADERS = {
    "x-ratelimit-limit-requests": "600",
    "x-ratelimit-remaining-requests": "599",
    "x-ratelimit-reset-requests": "100ms",
}


def _started_before_first_answer(server: ScriptedProvider) -> int:
    return [kind for kind, _ in server.log].index("answer")


def test_on_an_unknown_scope_a_few_requests_go_first(server: ScriptedProvider) -> None:
    """The door's default limiter lets ``cold_start`` (8) requests of a scope it knows
    nothing about go before the first answer; the rest wait for what it teaches.  Real
    clock: the waiting requests poll their cold-start slot until an answer frees it."""
    from concurrent.futures import ThreadPoolExecutor

    server.default = Step(200, LIMIT_HEADERS, stall=0.2)
    client = rateloop.openai_client(base_url=server.url + "/v1", api_key="sk-test-key",
                                    timeout=10.0)
    server.keep(client)
    with ThreadPoolExecutor(12) as pool:
        replies = list(pool.map(lambda _: _call(client), range(12)))
    assert len(replies) == 12 and server.count() == 12
    assert _started_before_first_answer(server) == 8


def test_the_async_transport_keeps_the_cold_start_too(server: ScriptedProvider) -> None:
    import asyncio

    server.add(Step(200, LIMIT_HEADERS, stall=0.3))
    server.default = Step(200, LIMIT_HEADERS)

    async def main() -> None:
        client = rateloop.async_openai_client(
            base_url=server.url + "/v1", api_key="sk-test-key", timeout=10.0,
            limiter=Limiter(cold_start=1),
        )
        try:
            await asyncio.gather(*(
                client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
                for _ in range(6)
            ))
        finally:
            await client.close()

    asyncio.run(main())
    assert server.count() == 6
    assert server.log[:2] == [("start", 0), ("answer", 0)]


def test_a_scope_with_configured_limits_is_not_gated(server: ScriptedProvider) -> None:
    from concurrent.futures import ThreadPoolExecutor

    server.default = Step(200, stall=0.3)
    limiter = Limiter.from_url(
        "memory://", limits={"openai:gpt-4o-mini": LimitSpec(requests_per_minute=6000)}
    )
    client = _client(server, FakeClock(), limiter=limiter)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: _call(client), range(4)))
    assert server.max_in_flight > 1


def test_the_body_deadline_does_not_shorten_the_next_attempts_wait_for_headers(
    server: ScriptedProvider,
) -> None:
    seen: list[object] = []
    transport = rl_httpx2.RateLoopTransport(clock=FakeClock(), first_byte_timeout=0.5)
    inner = transport.inner

    class Spy:  # records the read timeout each attempt is sent with
        def handle_request(self, request: httpx2.Request) -> httpx2.Response:
            seen.append(request.extensions["timeout"]["read"])
            return inner.handle_request(request)

        def close(self) -> None:
            inner.close()

    transport.inner = Spy()
    server.add(Step(503))
    client = httpx2.Client(transport=transport, base_url=server.url, timeout=30.0)
    server.keep(client)
    assert client.post("/v1/chat/completions", json={"model": "m"}).status_code == 200
    assert seen == [30.0, 30.0]


def test_the_async_transport_times_a_stalled_body_too(server: ScriptedProvider) -> None:
    import asyncio

    server.add(Step(200, stall=2.0))

    async def main() -> rateloop.Outcome:
        client = rateloop.async_openai_client(
            base_url=server.url + "/v1", api_key="sk-test-key", clock=FakeClock(),
            timeout=10.0, first_byte_timeout=0.3, idle_timeout=0.3,
        )
        try:
            raw = await client.chat.completions.with_raw_response.create(
                model="gpt-4o-mini", messages=MESSAGES
            )
            return _outcome(raw.http_response)
        finally:
            await client.close()

    outcome = asyncio.run(main())
    assert outcome.status is Status.COMPLETED and outcome.attempts.loop == 2
    assert server.count() == 2


def test_a_ready_client_takes_a_loop_for_its_policy_clock_and_sinks(
    server: ScriptedProvider,
) -> None:
    sink = RecordingSink()
    loop = rateloop.RateLoop(rateloop.Policy(max_attempts=2), clock=FakeClock(), sinks=[sink])
    server.default = Step(429, body=RATE_LIMITED)
    client = rateloop.openai_client(base_url=server.url + "/v1", api_key="k", loop=loop)
    server.keep(client)
    with pytest.raises(openai.RateLimitError):
        _call(client)
    assert server.count() == 2
    assert sink.decisions.count("wait") == 1
    with pytest.raises(TypeError, match="either loop= or policy="):
        rl_httpx2.RateLoopTransport(loop=loop, policy=rateloop.Policy())
