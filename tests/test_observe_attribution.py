"""Every figure and span names the route that produced it (a 429, then a fallback)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client.parser import text_string_to_metric_families

from rateloop.loop import AsyncRateLoop, RateLoop
from rateloop.observe.otel import OTelSink
from rateloop.observe.prometheus import PrometheusSink
from rateloop.outcome import Status
from rateloop.outcome.events import DecisionKind, RecordingSink
from rateloop.policy import Policy
from rateloop.route import Route
from rateloop.testing import FakeClock, FaultScript

OPENAI = Route(provider="openai", model="gpt-x", project="proj")
ANTHROPIC = Route(provider="anthropic", model="claude-y", project="proj")


def throttle(code: str) -> httpx.HTTPStatusError:
    """OpenAI's 429: ``rate_limit_exceeded`` (waits, then falls back) or
    ``insufficient_quota`` (falls back to the other provider at once)."""
    request = httpx.Request("POST", "https://api.openai.com/v1/chat/completions")
    body = {"error": {"message": "refused", "type": code, "code": code}}
    resp = httpx.Response(429, json=body, request=request)
    return httpx.HTTPStatusError("429", request=request, response=resp)


REFUSALS = ["rate_limit_exceeded", "insufficient_quota"]


def ok() -> httpx.Response:
    return httpx.Response(200, request=httpx.Request("POST", "https://api.anthropic.com/v1"))


def run(twin: str, sinks: list[Any], clock: FakeClock, code: str) -> Any:
    """openai refuses once (429), the loop falls back to anthropic, which answers."""
    fn = FaultScript({"gpt-x": [throttle(code)], "claude-y": [ok()]})
    policy = Policy.from_dict({"backoff": {"jitter": "none"}, "attempts_per_route": 1})
    if twin == "sync":
        out = RateLoop(policy, clock=clock, sinks=sinks).call(
            fn, route=OPENAI, fallbacks=[ANTHROPIC]
        )
    else:
        loop = AsyncRateLoop(policy, clock=clock, sinks=sinks)
        out = asyncio.run(loop.call(fn, route=OPENAI, fallbacks=[ANTHROPIC]))
    assert out.status is Status.DEGRADED and out.route == ANTHROPIC
    return out


def samples(sink: PrometheusSink, name: str) -> list[dict[str, str]]:
    """The label sets of the non-zero samples of ``name``, from the real exposition."""
    out = []
    for family in text_string_to_metric_families(sink.exposition().decode()):
        for s in family.samples:
            if s.name == name and s.value:
                out.append({**s.labels, "value": str(s.value)})
    return out


@pytest.mark.parametrize("code", REFUSALS)
@pytest.mark.parametrize("twin", ["sync", "async"])
def test_prometheus_blames_the_provider_that_refused_not_the_fallback(twin: str, code: str) -> None:
    clock = FakeClock()
    sink = PrometheusSink(clock=clock)
    run(twin, [sink], clock, code)
    (rejected,) = [
        s for s in samples(sink, "rateloop_capacity_total") if s["result"] == "rejected_remote"
    ]
    assert (rejected["provider"], rejected["model"]) == ("openai", "gpt-x")
    assert rejected["scope"] == OPENAI.scope and rejected["value"] == "1.0"
    # The fallback itself is counted under the route fallen back to, as documented.
    (fallback,) = samples(sink, "rateloop_fallbacks_total")
    assert (fallback["provider"], fallback["model"]) == ("anthropic", "claude-y")
    # Any provider wait before the fallback was openai's.
    for waited in samples(sink, "rateloop_wait_scheduled_seconds_count"):
        assert waited["provider"] == "openai"
    # The refusal's decision is counted where it happened too.
    for decision in samples(sink, "rateloop_decisions_total"):
        if decision["signal_kind"] not in ("", "ok"):
            assert decision["provider"] == "openai", decision


@pytest.mark.parametrize("code", REFUSALS)
def test_the_fallback_event_names_the_route_it_left(code: str) -> None:
    clock = FakeClock()
    recorder = RecordingSink()
    run("sync", [recorder], clock, code)
    (fallback,) = [e for e in recorder.events if e.decision is DecisionKind.FALLBACK]
    assert (fallback.provider, fallback.model, fallback.scope) == (
        "anthropic",
        "claude-y",
        ANTHROPIC.scope,
    )
    assert (fallback.from_provider, fallback.from_model, fallback.from_scope) == (
        "openai",
        "gpt-x",
        OPENAI.scope,
    )
    assert fallback.to_dict()["from_provider"] == "openai"


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def attempts(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    found = [s for s in exporter.get_finished_spans() if s.name == "rateloop.attempt"]
    return sorted(found, key=lambda s: int((s.attributes or {})["rateloop.attempt"]))  # type: ignore[arg-type]


@pytest.mark.parametrize("code", REFUSALS)
@pytest.mark.parametrize("twin", ["sync", "async"])
def test_otel_the_refused_attempt_span_names_openai(twin: str, code: str, spans: Any) -> None:
    provider, exporter = spans
    clock = FakeClock()
    run(twin, [OTelSink(tracer_provider=provider, clock=clock)], clock, code)
    refused, answered = attempts(exporter)
    assert refused.attributes is not None and answered.attributes is not None
    assert refused.attributes["rateloop.provider"] == "openai"
    assert refused.attributes["rateloop.model"] == "gpt-x"
    assert refused.attributes["rateloop.scope"] == OPENAI.scope
    assert refused.attributes["http.response.status_code"] == 429
    assert refused.status.status_code is StatusCode.ERROR
    assert answered.attributes["rateloop.provider"] == "anthropic"
    assert answered.attributes["rateloop.model"] == "claude-y"
    assert answered.status.status_code is StatusCode.OK
