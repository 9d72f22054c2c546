"""One trace per call: a CLIENT call span with its attempts (and their waits) as children."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from rateloop.loop import AsyncRateLoop, RateLoop
from rateloop.observe.otel import OTelSink
from rateloop.policy import Policy
from rateloop.route import Route
from rateloop.testing import FakeClock, FaultScript

ROUTE = Route(provider="openai", model="gpt-x", project="proj")
URL = "https://api.openai.com/v1/chat/completions"


def throttle() -> httpx.HTTPStatusError:
    request = httpx.Request("POST", URL)
    resp = httpx.Response(429, headers={"retry-after": "2"}, request=request)
    return httpx.HTTPStatusError("429", request=request, response=resp)


def ok() -> httpx.Response:
    usage = {"prompt_tokens": 11, "completion_tokens": 7}
    return httpx.Response(200, json={"usage": usage}, request=httpx.Request("POST", URL))


@pytest.fixture
def exporter() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    yield provider, spans
    provider.shutdown()


def run(twin: str, sink: OTelSink, clock: FakeClock, script: list[Any]) -> Any:
    policy = Policy.from_dict({"backoff": {"jitter": "none"}})
    if twin == "sync":
        return RateLoop(policy, clock=clock, sinks=[sink]).call(FaultScript(script), route=ROUTE)
    loop = AsyncRateLoop(policy, clock=clock, sinks=[sink])
    return asyncio.run(loop.call(FaultScript(script), route=ROUTE))


def split(spans: list[ReadableSpan]) -> tuple[ReadableSpan, list[ReadableSpan]]:
    (root,) = [s for s in spans if s.parent is None]
    children = sorted(
        (s for s in spans if s.parent is not None),
        key=lambda s: int((s.attributes or {})["rateloop.attempt"]),  # type: ignore[arg-type]
    )
    return root, children


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_a_call_of_three_attempts_is_one_trace(twin: str, exporter: Any) -> None:
    provider, spans = exporter
    clock = FakeClock()
    out = run(
        twin, OTelSink(tracer_provider=provider, clock=clock), clock, [throttle(), throttle(), ok()]
    )
    assert out.ok and out.attempts.loop == 3
    finished = list(spans.get_finished_spans())
    assert len({s.context.trace_id for s in finished}) == 1  # type: ignore[union-attr]
    root, attempts = split(finished)
    assert root.name == "rateloop.call" and root.kind is SpanKind.CLIENT
    assert [a.name for a in attempts] == ["rateloop.attempt"] * 3
    for a in attempts:
        assert a.kind is SpanKind.CLIENT
        assert a.parent is not None and a.parent.span_id == root.context.span_id  # type: ignore[union-attr]
    # The call lasts from its start to its end, the attempts and their waits inside it.
    assert root.start_time == attempts[0].start_time
    assert root.end_time == attempts[-1].end_time
    assert root.end_time - root.start_time == pytest.approx(sum(clock.sleeps) * 1e9, abs=1e3)  # type: ignore[operator]
    # GenAI semantic conventions where they apply, rateloop's own under rateloop.*.
    attrs = dict(root.attributes or {})
    assert attrs["gen_ai.system"] == "openai"
    assert attrs["gen_ai.request.model"] == "gpt-x"
    assert attrs["gen_ai.usage.input_tokens"] == 11
    assert attrs["gen_ai.usage.output_tokens"] == 7
    assert attrs["rateloop.scope"] == ROUTE.scope
    assert attrs["rateloop.status"] == "completed"
    assert attrs["rateloop.attempts"] == 3
    assert "error.type" not in attrs
    assert root.status.status_code is StatusCode.OK
    for refused in attempts[:2]:
        a_attrs = dict(refused.attributes or {})
        assert a_attrs["error.type"] == "temporary"
        assert a_attrs["gen_ai.system"] == "openai"
        assert a_attrs["gen_ai.request.model"] == "gpt-x"
        assert a_attrs["http.response.status_code"] == 429
        (wait,) = [e for e in refused.events if e.name == "rateloop.wait"]
        assert wait.attributes is not None and wait.attributes["rateloop.decision"] == "wait"
    assert "error.type" not in (attempts[2].attributes or {})


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_a_failed_call_says_why_on_its_span(twin: str, exporter: Any) -> None:
    provider, spans = exporter
    clock = FakeClock()
    policy_attempts = [throttle()] * 30
    out = run(twin, OTelSink(tracer_provider=provider, clock=clock), clock, policy_attempts)
    assert not out.ok
    root, attempts = split(list(spans.get_finished_spans()))
    assert len(attempts) == out.attempts.loop
    assert root.status.status_code is StatusCode.ERROR
    assert (root.attributes or {})["error.type"] == out.status.value


def test_two_calls_are_two_traces(exporter: Any) -> None:
    provider, spans = exporter
    clock = FakeClock()
    sink = OTelSink(tracer_provider=provider, clock=clock)
    run("sync", sink, clock, [throttle(), ok()])
    run("sync", sink, clock, [ok()])
    finished = list(spans.get_finished_spans())
    roots = [s for s in finished if s.parent is None]
    assert [r.name for r in roots] == ["rateloop.call"] * 2
    assert len({s.context.trace_id for s in finished}) == 2  # type: ignore[union-attr]
    assert len(finished) == 2 + 3


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_without_the_loop_hooks_the_events_alone_make_one_trace(twin: str, exporter: Any) -> None:
    provider, spans = exporter
    clock = FakeClock()
    sink = OTelSink(tracer_provider=provider, clock=clock)
    policy = Policy.from_dict({"backoff": {"jitter": "none"}})

    def events_only_sink(event: Any) -> None:  # a plain callable: no call_started hook
        sink(event)

    events_only = [events_only_sink]
    script = FaultScript([throttle(), throttle(), ok()])
    if twin == "sync":
        out = RateLoop(policy, clock=clock, sinks=events_only).call(script, route=ROUTE)
    else:
        out = asyncio.run(
            AsyncRateLoop(policy, clock=clock, sinks=events_only).call(script, route=ROUTE)
        )
    assert out.attempts.loop == 3
    finished = list(spans.get_finished_spans())
    assert len({s.context.trace_id for s in finished}) == 1  # type: ignore[union-attr]
    root, attempts = split(finished)
    assert root.kind is SpanKind.CLIENT and len(attempts) == 3
    assert (root.attributes or {})["rateloop.status"] == "completed"
    assert (root.attributes or {})["gen_ai.system"] == "openai"
    assert root.end_time == attempts[-1].end_time


def test_a_call_that_raised_ends_its_span_at_its_last_event(exporter: Any) -> None:
    provider, spans = exporter
    clock = FakeClock()
    sink = OTelSink(tracer_provider=provider, clock=clock)
    loop = RateLoop(Policy(), clock=clock, sinks=[sink])

    def boom(route: Route) -> Any:
        raise ValueError("not a capacity problem")

    with pytest.raises(ValueError):
        loop.call(boom, route=ROUTE)
    clock.advance(30.0)
    loop.call(lambda route: "ok", route=ROUTE)  # the next call on this thread
    calls = [s for s in spans.get_finished_spans() if s.name == "rateloop.call"]
    raised, completed = calls
    assert (raised.attributes or {})["rateloop.status"] == "raised"
    assert (raised.attributes or {})["error.type"] == "raised"
    assert raised.status.status_code is StatusCode.ERROR
    assert raised.end_time is not None and raised.end_time < completed.start_time  # type: ignore[operator]
    assert raised.context.trace_id != completed.context.trace_id  # type: ignore[union-attr]
