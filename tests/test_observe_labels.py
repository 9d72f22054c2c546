"""Label cardinality and privacy, read through the real exporters.

Prometheus through ``generate_latest`` (the sink's exposition) and
OpenTelemetry through the SDK's ``InMemoryMetricReader``: a prompt passed as
``operation=`` never becomes a label, the tenant is left out unless asked
for, and distinct values beyond a label's bound fold into ``other``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from rateloop.errors import ConfigError
from rateloop.loop import RateLoop
from rateloop.observe._labels import LABEL_LIMITS, OTHER, LabelBounds
from rateloop.observe.otel import OTelSink
from rateloop.observe.prometheus import PrometheusSink
from rateloop.policy import Policy
from rateloop.route import Route
from rateloop.testing import FakeClock, FaultScript

URL = "https://api.openai.com/v1/chat/completions"
ROUTE = Route(provider="openai", model="gpt-5", project="proj-1", tenant="acme-corp-42")
PROMPT = "Summarise the attached merger memo for the board"


def ok() -> httpx.Response:
    return httpx.Response(200, request=httpx.Request("POST", URL))


def throttled() -> httpx.HTTPStatusError:
    request = httpx.Request("POST", URL)
    response = httpx.Response(429, headers={"retry-after": "1"}, request=request)
    return httpx.HTTPStatusError("429", request=request, response=response)


def run(sinks: list[Any], clock: FakeClock, *operations: str, route: Route = ROUTE) -> None:
    loop = RateLoop(Policy.from_dict({"backoff": {"jitter": "none"}}), clock=clock, sinks=sinks)
    for op in operations:
        assert loop.call(FaultScript([throttled(), ok()]), route=route, operation=op).ok


def prom_labels(sink: PrometheusSink) -> list[dict[str, str]]:
    text = sink.exposition().decode()
    return [
        sample.labels
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("provider")
    ]


@pytest.fixture
def otel() -> Iterator[tuple[OTelSink, InMemoryMetricReader, InMemorySpanExporter, FakeClock]]:
    clock = FakeClock()
    reader, spans = InMemoryMetricReader(), InMemorySpanExporter()
    meters = MeterProvider(metric_readers=[reader])
    tracers = TracerProvider()
    tracers.add_span_processor(SimpleSpanProcessor(spans))
    yield (
        OTelSink(meter_provider=meters, tracer_provider=tracers, clock=clock),
        reader,
        spans,
        clock,
    )
    meters.shutdown()
    tracers.shutdown()


def otel_attributes(reader: InMemoryMetricReader) -> list[dict[str, Any]]:
    data = reader.get_metrics_data()
    assert data is not None
    return [
        dict(point.attributes or {})
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        for point in metric.data.data_points
    ]


# --- a prompt passed as operation= ------------------------------------------------------------


def test_a_prompt_as_operation_never_reaches_the_prometheus_exposition() -> None:
    clock = FakeClock()
    sink = PrometheusSink(clock=clock)
    run([sink], clock, PROMPT, "model.generate")
    text = sink.exposition().decode()
    assert "merger" not in text and "Summarise" not in text
    ops = {labels["operation"] for labels in prom_labels(sink)}
    assert ops == {OTHER, "model.generate"}


def test_a_prompt_as_operation_never_reaches_otel_metrics_or_spans(otel: Any) -> None:
    sink, reader, spans, clock = otel
    run([sink], clock, PROMPT)
    points = otel_attributes(reader)
    assert points and {p["rateloop.operation"] for p in points} == {OTHER}
    dumped = repr(points) + "".join(s.to_json() for s in spans.get_finished_spans())
    assert spans.get_finished_spans() and "merger" not in dumped


@pytest.mark.parametrize(
    ("operation", "kept"),
    [
        ("model.generate", True),
        ("chat.completions", True),
        ("agent-step_2", True),
        ("v1/embeddings", True),
        (PROMPT, False),
        ("x" * 65, False),  # longer than an operation name
        ("tool\nname", False),
        ("sk-proj-" + "Q" * 40, False),  # a key: redacted, never a label
        ("$(rm -rf)", False),
    ],
)
def test_only_a_safe_token_is_an_operation(operation: str, kept: bool) -> None:
    labels = LabelBounds().apply({"operation": operation})
    assert labels["operation"] == (operation if kept else OTHER)


# --- tenant: opt-in --------------------------------------------------------------------------


def test_the_tenant_is_absent_by_default_from_labels_and_scope() -> None:
    clock = FakeClock()
    sink = PrometheusSink(clock=clock)
    run([sink], clock, "model.generate")
    text = sink.exposition().decode()
    assert "tenant" not in text and "acme-corp-42" not in text
    scopes = {labels["scope"] for labels in prom_labels(sink)}
    assert scopes == {"openai:gpt-5:proj-1"}  # the scope cut before its tenant part


def test_the_tenant_is_absent_by_default_from_otel(otel: Any) -> None:
    sink, reader, spans, clock = otel
    run([sink], clock, "model.generate")
    dumped = repr(otel_attributes(reader)) + "".join(
        s.to_json() for s in spans.get_finished_spans()
    )
    assert "acme-corp-42" not in dumped and "rateloop.tenant" not in dumped


def test_tenant_labels_are_opt_in() -> None:
    clock = FakeClock()
    sink = PrometheusSink(clock=clock, tenant_labels=True)
    run([sink], clock, "model.generate")
    samples = prom_labels(sink)
    assert {s["tenant"] for s in samples} == {"acme-corp-42"}
    assert {s["scope"] for s in samples} == {ROUTE.scope}


def test_tenant_labels_opt_in_on_otel() -> None:
    clock, reader = FakeClock(), InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    sink = OTelSink(meter_provider=meters, clock=clock, tenant_labels=True)
    run([sink], clock, "model.generate")
    assert {p["rateloop.tenant"] for p in otel_attributes(reader)} == {"acme-corp-42"}
    meters.shutdown()


# --- bounded values -------------------------------------------------------------------------------


def test_more_distinct_operations_than_the_bound_fold_into_other() -> None:
    bound = LABEL_LIMITS["operation"]
    clock = FakeClock()
    sink = PrometheusSink(clock=clock)
    run([sink], clock, *(f"op-{i}" for i in range(bound + 10)))
    ops = {labels["operation"] for labels in prom_labels(sink)}
    assert ops == {f"op-{i}" for i in range(bound)} | {OTHER}


def test_more_distinct_tenants_than_the_bound_fold_into_other(otel: Any) -> None:
    clock, reader = FakeClock(), InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    sink = OTelSink(
        meter_provider=meters, clock=clock, tenant_labels=True, label_limits={"tenant": 3}
    )
    for i in range(6):
        run(
            [sink],
            clock,
            "model.generate",
            route=Route(provider="openai", model="gpt-5", project="p", tenant=f"t{i}"),
        )
    points = otel_attributes(reader)
    assert {p["rateloop.tenant"] for p in points} == {"t0", "t1", "t2", OTHER}
    meters.shutdown()


def test_a_bad_label_limit_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"label_limits.*'operation'.*0"):
        PrometheusSink(label_limits={"operation": 0})
    with pytest.raises(ConfigError, match=r"label_limits.*'prompt'.*allowed"):
        PrometheusSink(label_limits={"prompt": 5})


# --- the shared event stream (the dashboard's timeline) ----------------------------------------


@pytest.mark.redis
def test_a_prompt_as_operation_never_reaches_the_redis_event_stream(
    redis_url: str, redis_prefix: str
) -> None:
    import redis

    from rateloop.observe.redis_events import RedisEventSink, events_key

    sink = RedisEventSink(redis_url, prefix=redis_prefix)
    try:
        run([sink], FakeClock(), PROMPT, "model.generate")
    finally:
        sink.close()
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    rows = client.xrange(events_key(redis_prefix))
    client.close()
    assert rows and "merger" not in repr(rows)
    assert {fields.get("operation") for _, fields in rows} == {OTHER, "model.generate"}
