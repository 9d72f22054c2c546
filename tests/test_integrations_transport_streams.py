"""Streams through the RATE-loop transports: decided before the body, never replayed, never leaked.

A concurrency limit of 1 makes a leaked slot visible: the next call would
have to wait for capacity (an ``admission_wait`` event and virtual time
passing on the FakeClock) instead of going straight through.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

import rateloop
from rateloop import Limiter, LimitSpec, RecordingSink, Status
from rateloop.integrations._transport import OUTCOME_KEY, StreamInterrupted
from rateloop.testing import FakeClock
from transport_server import ANTHROPIC_OVERLOADED, ScriptedProvider, Step, anthropic_stream_events

MESSAGES = [{"role": "user", "content": "say hello"}]


@pytest.fixture
def server() -> Iterator[ScriptedProvider]:
    with ScriptedProvider() as provider:  # closes the clients it keeps
        yield provider


def _one_at_a_time(clock: FakeClock, model: str) -> Limiter:
    return Limiter.from_url(
        "memory://", clock=clock, limits={f"{'anthropic' if 'claude' in model else 'openai'}:"
                                          f"{model}": LimitSpec(concurrency=1)}
    )


def _openai(server: ScriptedProvider, clock: FakeClock, **ours: Any) -> Any:
    client = rateloop.openai_client(
        base_url=server.url + "/v1", api_key="sk-test", clock=clock, timeout=10.0, **ours
    )
    server.keep(client)
    return client


def _async_openai(server: ScriptedProvider, clock: FakeClock, **ours: Any) -> Any:
    return rateloop.async_openai_client(
        base_url=server.url + "/v1", api_key="sk-test", clock=clock, timeout=10.0, **ours
    )


async def _cancel_then_call_again(task: asyncio.Task[Any], client: Any) -> None:
    """Cancel ``task`` mid-request, then make one more call (whose wait the test checks)."""
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    await client.close()


def _anthropic(server: ScriptedProvider, clock: FakeClock, **ours: Any) -> Any:
    client = rateloop.anthropic_client(
        base_url=server.url, api_key="sk-ant-test", clock=clock, timeout=10.0, **ours
    )
    server.keep(client)
    return client


def _no_admission_wait(sink: RecordingSink, clock: FakeClock) -> None:
    assert "admission_wait" not in sink.decisions
    assert clock.monotonic() == 0.0


def test_a_finished_stream_settles_from_its_usage_and_frees_its_slot(
    server: ScriptedProvider,
) -> None:
    clock, sink = FakeClock(), RecordingSink()
    limiter = _one_at_a_time(clock, "gpt-4o-mini")
    # 100 tokens a minute: each stream reserves ~47 tokens and reports 11 + 7 used;
    # without settlement the third would wait.
    # profile="generic": output settles to the tokens produced (OpenAI keeps max_tokens).
    limiter.set_limits(
        "openai:gpt-4o-mini",
        LimitSpec(concurrency=1, tokens_per_minute=100, burst=1.0, profile="generic"),
    )
    client = _openai(server, clock, limiter=limiter, sinks=[sink])
    for _ in range(3):
        stream = client.chat.completions.create(
            model="gpt-4o-mini", messages=MESSAGES, max_tokens=40, stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 7
    _no_admission_wait(sink, clock)
    assert server.count() == 3


def test_a_refused_stream_is_decided_from_status_and_headers_and_retried(
    server: ScriptedProvider,
) -> None:
    clock = FakeClock()
    server.add(Step(429, {"retry-after": "3"}, {"error": {"type": "rate_limit_error"}}))
    client = _openai(server, clock)
    with client.chat.completions.with_streaming_response.create(
        model="gpt-4o-mini", messages=MESSAGES, stream=True
    ) as raw:
        outcome = raw.http_response.extensions[OUTCOME_KEY]
        assert outcome.status is Status.COMPLETED and outcome.attempts.loop == 2
        assert [c.choices[0].delta.content for c in raw.parse() if c.choices] == ["hel", "lo"]
    assert server.count() == 2
    assert clock.monotonic() >= 3


def test_a_mid_stream_error_is_classified_and_never_replayed(server: ScriptedProvider) -> None:
    clock, sink = FakeClock(), RecordingSink()
    limiter = _one_at_a_time(clock, "claude-x")
    events = [*anthropic_stream_events("claude-x")[:3], ANTHROPIC_OVERLOADED]
    server.add(Step(200, events=events))
    client = _anthropic(server, clock, limiter=limiter, sinks=[sink])
    seen: list[str] = []
    # anthropic before 2.17 lets the body's StreamInterrupted through; 2.17 and later wrap
    # any error read from a stream's body in its APIConnectionError, with ours as the cause.
    with (
        pytest.raises((StreamInterrupted, anthropic.APIConnectionError)) as caught,
        client.messages.stream(model="claude-x", max_tokens=20, messages=MESSAGES) as s,
    ):
        for text in s.text_stream:
            seen.append(text)
    ours = caught.value
    if isinstance(ours, anthropic.APIConnectionError):
        ours = ours.__cause__  # type: ignore[assignment]
    assert isinstance(ours, StreamInterrupted)
    assert ours.signal.kind is rateloop.Kind.OVERLOAD
    assert seen == ["hello"]
    assert server.count() == 1  # bytes reached the caller: no replay
    # The failed stream gave its slot back.
    client.messages.create(model="claude-x", max_tokens=20, messages=MESSAGES)
    _no_admission_wait(sink, clock)


def test_a_stream_closed_early_frees_its_slot(server: ScriptedProvider) -> None:
    clock, sink = FakeClock(), RecordingSink()
    client = _openai(server, clock, limiter=_one_at_a_time(clock, "gpt-4o-mini"), sinks=[sink])
    stream = client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True)
    next(iter(stream))
    stream.close()
    client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    _no_admission_wait(sink, clock)


def test_an_abandoned_stream_frees_its_slot_when_collected(server: ScriptedProvider) -> None:
    clock, sink = FakeClock(), RecordingSink()
    client = _openai(server, clock, limiter=_one_at_a_time(clock, "gpt-4o-mini"), sinks=[sink])
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=MESSAGES, stream=True
    )
    # Dropped without reading or closing: the garbage collector gives the slot back.
    # (The socket underneath is kept and closed at the end, so that the test
    # sees the slot and not the HTTP client's ResourceWarning.)
    response = raw.http_response
    socket_stream = response.stream._stream._inner
    response.stream = None
    del raw, response
    gc.collect()
    client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    _no_admission_wait(sink, clock)
    socket_stream.close()


def test_a_cancelled_task_frees_its_streams_slot(server: ScriptedProvider) -> None:
    clock, sink = FakeClock(), RecordingSink()
    limiter = _one_at_a_time(clock, "gpt-4o-mini")
    server.add(Step(200, events=None, chunk_pause=0.5))

    async def main() -> None:
        client = _async_openai(server, clock, limiter=limiter, sinks=[sink])
        first = asyncio.Event()

        async def consume() -> None:
            stream = await client.chat.completions.create(
                model="gpt-4o-mini", messages=MESSAGES, stream=True
            )
            async for _ in stream:
                first.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(first.wait(), 10)
        await _cancel_then_call_again(task, client)

    asyncio.run(main())
    _no_admission_wait(sink, clock)


def test_cancelling_a_request_in_flight_releases_its_reservation(
    server: ScriptedProvider,
) -> None:
    clock, sink = FakeClock(), RecordingSink()
    limiter = _one_at_a_time(clock, "gpt-4o-mini")
    server.add(Step(200, stall=3.0))

    async def main() -> None:
        client = _async_openai(server, clock, limiter=limiter, sinks=[sink])
        task = asyncio.create_task(
            client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
        )
        while server.count() == 0:  # the request reached the server
            await asyncio.sleep(0.01)
        await _cancel_then_call_again(task, client)

    asyncio.run(main())
    _no_admission_wait(sink, clock)
    assert server.count() == 2


def test_a_gemini_stream_settles_and_frees_its_slot(server: ScriptedProvider) -> None:
    import json

    from transport_server import gemini_success

    clock, sink = FakeClock(), RecordingSink()
    limiter = Limiter.from_url(
        "memory://", clock=clock,
        limits={"google:gemini-2.5-flash": LimitSpec(concurrency=1)},
    )
    chunk = gemini_success()
    server.default = Step(200, events=[f"data: {json.dumps(chunk)}"])
    client = rateloop.genai_client(
        api_key="g-test", http_options={"base_url": server.url}, clock=clock, limiter=limiter,
        sinks=[sink],
    )
    try:
        for _ in range(2):
            pieces = list(client.models.generate_content_stream(
                model="gemini-2.5-flash", contents="say hello"
            ))
            assert pieces[-1].usage_metadata.candidates_token_count == 7
    finally:
        client._api_client._httpx_client.close()
    assert server.count() == 2
    assert ":streamGenerateContent" in server.seen[0].path
    _no_admission_wait(sink, clock)
