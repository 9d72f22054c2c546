"""The metric sinks, read through the real exporters: Prometheus text and OTel in-memory."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client.parser import text_string_to_metric_families

from rateloop.admission import LimitSpec
from rateloop.admission.limiter import Limiter
from rateloop.loop import AsyncRateLoop, RateLoop
from rateloop.observe.otel import OTelSink
from rateloop.observe.prometheus import PrometheusSink
from rateloop.outcome import Status
from rateloop.outcome.events import RecordingSink
from rateloop.policy import Policy
from rateloop.route import Cost, Route
from rateloop.testing import FakeClock, FaultScript

OPENAI = "https://api.openai.com/v1/chat/completions"
A = Route(provider="openai", model="a", project="proj", tenant="t7")
B = Route(provider="openai", model="b", project="proj", tenant="t7")

PROMPT = "PLEASE-SUMMARISE-THE-MERGER-MEMO"
KEY = "sk-proj-" + "Q" * 40


def throttle(retry_after: str = "2") -> httpx.HTTPStatusError:
    # The prompt and a key ride in the request body, the message and a header.
    request = httpx.Request(
        "POST", OPENAI, json={"prompt": PROMPT}, headers={"authorization": f"Bearer {KEY}"}
    )
    resp = httpx.Response(
        429,
        headers={"retry-after": retry_after},
        json={"error": {"message": f"Rate limit reached for {PROMPT} {KEY}", "code": "rl"}},
        request=request,
    )
    return httpx.HTTPStatusError(f"429 {PROMPT} {KEY}", request=request, response=resp)


def ok() -> httpx.Response:
    return httpx.Response(200, json={"echo": PROMPT}, request=httpx.Request("POST", OPENAI))


def policy(**extra: Any) -> Policy:
    return Policy.from_dict({"backoff": {"jitter": "none"}, **extra})


def samples(sink: PrometheusSink) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the sink's exposition, parsed by prometheus_client's own parser."""
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(sink.exposition().decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(sink: PrometheusSink, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples(sink).items() if n == name and want <= ls)


@pytest.fixture
def otel() -> Iterator[tuple[OTelSink, InMemoryMetricReader, InMemorySpanExporter, FakeClock]]:
    clock = FakeClock()
    reader = InMemoryMetricReader()
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter_provider = MeterProvider(metric_readers=[reader])
    sink = OTelSink(
        meter_provider=meter_provider,
        tracer_provider=tracer_provider,
        clock=clock,
        tenant_labels=True,
    )
    yield sink, reader, exporter, clock
    meter_provider.shutdown()
    tracer_provider.shutdown()


def otel_points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    assert data is not None
    out: dict[str, list[Any]] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out


def _loop_calls_hooks() -> bool:
    """Whether this version of the loop calls the optional ``call_started`` sink hook."""

    class Probe:
        started = False

        def __call__(self, event: Any) -> None:
            pass

        def call_started(self, scope: str) -> None:
            self.started = True

        def call_finished(self, outcome: Any) -> None:
            pass

    probe = Probe()
    RateLoop(policy(), clock=FakeClock(), sinks=[probe]).call(lambda route: "ok", route=A)
    return probe.started


LOOP_CALLS_HOOKS = _loop_calls_hooks()


# --- Prometheus ----------------------------------------------------------------------


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_prometheus_counts_a_throttled_call_and_its_wait(twin: str) -> None:
    clock = FakeClock()
    sink = PrometheusSink(clock=clock, tenant_labels=True)
    fn = FaultScript([throttle("2"), ok()])
    if twin == "sync":
        out = RateLoop(policy(), clock=clock, sinks=[sink]).call(fn, route=A)
    else:
        loop = AsyncRateLoop(policy(), clock=clock, sinks=[sink])
        out = asyncio.run(loop.call(fn, route=A))
    assert out.status is Status.COMPLETED
    base = {"provider": "openai", "model": "a", "scope": A.scope, "tenant": "t7"}
    assert value(sink, "rateloop_decisions_total", decision="wait", **base) == 1
    assert value(sink, "rateloop_decisions_total", signal_kind="temporary", decision="wait") == 1
    assert value(sink, "rateloop_retries_total", **base) == 1
    assert value(sink, "rateloop_capacity_total", result="rejected_remote", **base) == 1
    (slept,) = clock.sleeps
    assert slept >= 2.0  # the server's minimum
    assert value(sink, "rateloop_wait_scheduled_seconds_sum", wait_kind="provider") == slept
    assert value(sink, "rateloop_wait_scheduled_seconds_count", wait_kind="provider") == 1
    # The fake clock slept exactly the scheduled wait; the sink measured it on that clock.
    assert value(sink, "rateloop_wait_actual_seconds_sum", wait_kind="provider") == slept
    assert value(sink, "rateloop_calls_total", status="completed", **base) == 1
    assert value(sink, "rateloop_call_attempts_sum", layer="loop") == 2
    assert value(sink, "rateloop_operation_total") == 0  # no such metric: the helper sums none


def test_prometheus_counts_one_remote_rejection_per_attempt_and_the_fallback() -> None:
    clock = FakeClock()
    sink = PrometheusSink(clock=clock)
    fn = FaultScript({"a": [throttle("1")], "b": [ok()]})
    out = RateLoop(policy(attempts_per_route=1), clock=clock, sinks=[sink]).call(
        fn, route=A, fallbacks=[B]
    )
    assert out.status is Status.DEGRADED
    # The refused attempt yields a wait *and* a fallback event, but one rejection.
    assert value(sink, "rateloop_capacity_total", result="rejected_remote") == 1
    assert value(sink, "rateloop_fallbacks_total", model="b") == 1
    assert value(sink, "rateloop_calls_total", status="degraded", model="b") == 1


def test_prometheus_counts_fallback_rejections() -> None:
    clock = FakeClock()
    sink = PrometheusSink(clock=clock)
    small = Route(provider="openai", model="small", context_window=1000)
    fn = FaultScript({"a": [throttle("1")]})
    RateLoop(policy(attempts_per_route=1), clock=clock, sinks=[sink]).call(
        fn, route=A, fallbacks=[small], cost=Cost(input_tokens=5000)
    )
    assert value(sink, "rateloop_fallback_rejections_total", model="small") == 1
    assert value(sink, "rateloop_calls_total", status="failed_retry_exhausted") == 1


def test_prometheus_counts_unknown_outcomes() -> None:
    clock = FakeClock()
    sink = PrometheusSink(clock=clock)
    timeout = httpx.ReadTimeout("read timed out", request=httpx.Request("POST", OPENAI))
    out = RateLoop(policy(), clock=clock, sinks=[sink]).call(
        FaultScript([timeout]), route=A, idempotent=False
    )
    assert out.status is Status.NEEDS_OPERATOR
    assert value(sink, "rateloop_unknown_outcomes_total") == 1


def test_prometheus_counts_admission_waits_and_a_capacity_deadline_miss() -> None:
    clock = FakeClock()
    sink = PrometheusSink(clock=clock, tenant_labels=True)
    limiter = Limiter(limits={A.scope: LimitSpec(requests_per_minute=2, burst=1.0)}, clock=clock)
    loop = RateLoop(policy(), limiter=limiter, clock=clock, sinks=[sink])
    fn = FaultScript([ok()])
    for _ in range(3):
        assert loop.call(fn, route=A).ok
    # The third call waited ~30 s for the bucket; a fourth with a 5 s deadline cannot.
    assert value(sink, "rateloop_capacity_total", result="waited") == 1
    assert value(sink, "rateloop_wait_scheduled_seconds_sum", wait_kind="admission") == (
        pytest.approx(30.0, abs=1.0)
    )
    out = loop.call(fn, route=A, deadline=5.0)
    assert out.status is Status.WAITING_FOR_CAPACITY
    assert value(sink, "rateloop_capacity_deadline_misses_total", scope=A.scope) == 1
    assert value(sink, "rateloop_capacity_total", result="rejected_local") == 1


def _metered_loop() -> tuple[PrometheusSink, Limiter, RateLoop]:
    """A loop admitting 60 requests a minute on ``A``, counted by a PrometheusSink."""
    clock = FakeClock()
    sink = PrometheusSink(clock=clock)
    limiter = Limiter(limits={A.scope: LimitSpec(requests_per_minute=60)}, clock=clock)
    return sink, limiter, RateLoop(policy(), limiter=limiter, clock=clock, sinks=[sink])


def test_prometheus_tells_a_remote_deadline_miss_from_an_admission_refusal() -> None:
    sink, _, loop = _metered_loop()
    # The server asks for 30 s, the deadline is 5 s away: the provider refused (remote).
    out = loop.call(FaultScript([throttle("30")]), route=A, deadline=5.0)
    assert out.status is Status.WAITING_FOR_CAPACITY
    assert value(sink, "rateloop_capacity_total", result="rejected_remote") == 1
    assert value(sink, "rateloop_capacity_total", result="rejected_local") == 0
    assert value(sink, "rateloop_capacity_deadline_misses_total") == 1


def test_prometheus_counts_a_retry_refused_by_admission_as_local() -> None:
    sink, limiter, loop = _metered_loop()

    def throttled_while_another_worker_pauses(route: Route) -> Any:
        limiter.pause(A.provider_scope, 600.0, "another worker")
        raise throttle("1")

    # The 429 asks for 1 s; the retry then finds the scope paused for 10 minutes.
    out = loop.call(FaultScript([throttled_while_another_worker_pauses]), route=A, deadline=30.0)
    assert out.status is Status.WAITING_FOR_CAPACITY
    # The 429's 1 s minimum pauses the scope (a pause event) before the wait.
    assert [e.decision.value for e in out.events] == ["pause", "wait", "retry", "stop"]
    assert value(sink, "rateloop_pauses_total", scope=A.provider_scope) == 1
    assert value(sink, "rateloop_capacity_total", result="rejected_remote") == 1
    assert value(sink, "rateloop_capacity_total", result="rejected_local") == 1
    assert value(sink, "rateloop_capacity_deadline_misses_total") == 1


def test_prometheus_observe_outcome_counts_first_try_successes_with_priority() -> None:
    clock = FakeClock()
    sink = PrometheusSink(clock=clock)
    out = RateLoop(policy(), clock=clock, sinks=[sink]).call(FaultScript([ok()]), route=A)
    assert out.events == ()  # a first-try success emits no event ...
    sink.observe_outcome(out, operation="model.generate", priority="background")
    # ... observe_outcome counts it (a loop with the sink hooks counts it as well).
    assert value(sink, "rateloop_calls_total", status="completed", priority="background") == 1
    assert value(sink, "rateloop_call_attempts_count", layer="loop", priority="background") == 1


def test_no_prompt_key_or_body_reaches_any_label_or_span() -> None:
    clock = FakeClock()
    prom = PrometheusSink(clock=clock)
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    otel = OTelSink(meter_provider=meter_provider, tracer_provider=tracer_provider, clock=clock)
    fn = FaultScript([throttle("1"), throttle("1"), ok()])
    loop = RateLoop(policy(), clock=clock, sinks=[prom, otel])
    out = loop.call(fn, route=A, operation=f"chat {KEY}")
    assert out.ok
    prom.observe_outcome(out, operation=f"chat {KEY}")
    text = prom.exposition().decode()
    assert "rateloop_decisions_total" in text
    dumped = (
        text
        + repr(reader.get_metrics_data())
        + "".join(s.to_json() for s in exporter.get_finished_spans())
    )
    names = sorted(s.name for s in exporter.get_finished_spans())
    assert names == ["rateloop.attempt"] * 3 + ["rateloop.call"]
    for secret in (PROMPT, KEY, "Q" * 20, "Bearer"):
        assert secret not in dumped
    meter_provider.shutdown()
    tracer_provider.shutdown()


def test_prometheus_serves_metrics_on_loopback_only() -> None:
    sink = PrometheusSink()
    with pytest.raises(ValueError, match=r"'0\.0\.0\.0'.*loopback"):
        sink.serve(0, host="0.0.0.0")
    port = sink.serve(0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            body = resp.read().decode()
        assert "# TYPE rateloop_decisions_total counter" in body
    finally:
        sink.close()


# --- OpenTelemetry -------------------------------------------------------------------------


def attempt_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    spans = [s for s in exporter.get_finished_spans() if s.name == "rateloop.attempt"]
    return sorted(spans, key=lambda s: int((s.attributes or {})["rateloop.attempt"]))  # type: ignore[arg-type]


def test_otel_a_span_per_attempt_with_the_wait_as_a_span_event(otel: Any) -> None:
    sink, _, exporter, clock = otel
    fn = FaultScript([throttle("2"), throttle("3"), ok()])
    out = RateLoop(policy(), clock=clock, sinks=[sink]).call(fn, route=A)
    assert out.ok and out.attempts.loop == 3
    first, second, third = attempt_spans(exporter)
    for span in (first, second):
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes is not None
        assert span.attributes["rateloop.signal_kind"] == "temporary"
        assert span.attributes["http.response.status_code"] == 429
        waits = [e for e in span.events if e.name == "rateloop.wait"]
        assert len(waits) == 1
    wait1, wait2 = clock.sleeps
    assert wait1 >= 2.0 and wait2 >= 3.0
    assert first.events[0].attributes["rateloop.wait.scheduled_seconds"] == wait1  # type: ignore[index]
    assert second.events[0].attributes["rateloop.wait.scheduled_seconds"] == wait2  # type: ignore[index]
    # The wait belongs to the attempt it followed: the span lasts until the retry.
    assert second.start_time == first.end_time and third.start_time == second.end_time
    assert second.end_time - second.start_time == pytest.approx(wait2 * 1e9, abs=1e3)  # type: ignore[operator]
    assert third.status.status_code is StatusCode.OK
    assert third.attributes is not None and third.attributes["rateloop.scope"] == A.scope
    # Without the loop's call_started hook the first attempt's start is not known.
    assert first.attributes is not None
    assert first.attributes["rateloop.start_known"] is LOOP_CALLS_HOOKS
    assert second.attributes is not None and second.attributes["rateloop.start_known"] is True


def test_otel_metrics_reach_the_in_memory_reader(otel: Any) -> None:
    sink, reader, _, clock = otel
    fn = FaultScript([throttle("2"), ok()])
    RateLoop(policy(), clock=clock, sinks=[sink]).call(fn, route=A)
    points = otel_points(reader)
    (wait,) = [
        p for p in points["rateloop.decisions"] if p.attributes["rateloop.decision"] == "wait"
    ]
    assert wait.value == 1
    assert wait.attributes["rateloop.tenant"] == "t7"
    assert wait.attributes["rateloop.signal_kind"] == "temporary"
    (slept,) = clock.sleeps
    (scheduled,) = points["rateloop.wait_scheduled"]
    assert (scheduled.count, scheduled.sum) == (1, slept)
    (actual,) = points["rateloop.wait_actual"]
    assert actual.sum == slept
    assert [p.value for p in points["rateloop.retries"]] == [1]


def test_otel_spans_of_interleaved_async_calls_stay_apart(otel: Any) -> None:
    sink, _, exporter, clock = otel
    fa = FaultScript([throttle("1"), ok()])
    fb = FaultScript([throttle("4"), ok()])
    order = RecordingSink()
    loop = AsyncRateLoop(policy(), clock=clock, sinks=[sink, order])

    def yielding(script: FaultScript) -> Any:
        async def fn(route: Route) -> Any:
            await asyncio.sleep(0)  # let the other call run: their events interleave
            return script(route)

        return fn

    async def both() -> None:
        await asyncio.gather(loop.call(yielding(fa), route=A), loop.call(yielding(fb), route=B))

    asyncio.run(both())
    models = [e.model for e in order.events]
    assert models != sorted(models)  # the two calls' events did interleave
    spans = attempt_spans(exporter)
    assert len(spans) == 4
    calls = [s for s in exporter.get_finished_spans() if s.name == "rateloop.call"]
    assert len(calls) == 2
    for model in ("a", "b"):
        mine = [s for s in spans if (s.attributes or {}).get("rateloop.model") == model]
        assert len(mine) == 2
        # Each call is its own trace: both attempts are children of that call's span.
        (call,) = [c for c in calls if (c.attributes or {}).get("rateloop.model") == model]
        assert {s.parent.span_id for s in mine if s.parent} == {call.context.span_id}  # type: ignore[union-attr]
        assert [(s.attributes or {})["rateloop.attempt"] for s in mine] == [1, 2]
        (wait,) = [e for s in mine for e in s.events if e.name == "rateloop.wait"]
        assert wait.attributes is not None
        waited = float(wait.attributes["rateloop.wait.scheduled_seconds"])  # type: ignore[arg-type]
        assert waited >= (1.0 if model == "a" else 4.0)
        # The first span of each call ends exactly where its second starts.
        assert mine[0].end_time == mine[1].start_time


# --- the loop's optional hooks: call_started / call_finished --------------------------------


def hooked_call(loop: RateLoop, fn: Any, *, route: Route, **options: Any) -> Any:
    """A call whose sinks see ``call_started`` / ``call_finished`` around it.

    A loop that has the hooks calls them itself; for one that does not yet,
    this calls them as it would: before the call's first event, after its last.
    """
    hooked = [s for s in loop.sinks if hasattr(s, "call_finished")]
    if not LOOP_CALLS_HOOKS:
        for s in hooked:
            s.call_started(route.scope)
    out = loop.call(fn, route=route, **options)
    if not LOOP_CALLS_HOOKS:
        for s in hooked:
            s.call_finished(out)
    return out


def takes(clock: FakeClock, seconds: float, then: Any) -> Any:
    """A FaultScript item: the attempt takes ``seconds``, then returns or raises ``then``."""

    def attempt(route: Route) -> Any:
        clock.advance(seconds)
        if isinstance(then, BaseException):
            raise then
        return then

    return attempt


def test_hooks_give_a_first_try_success_its_span_and_its_count(otel: Any) -> None:
    sink, _, exporter, clock = otel
    prom = PrometheusSink(clock=clock, tenant_labels=True)
    loop = RateLoop(policy(), clock=clock, sinks=[sink, prom])
    hooked_call(loop, FaultScript([takes(clock, 0.25, ok())]), route=A)
    (span,) = attempt_spans(exporter)
    assert span.status.status_code is StatusCode.OK
    assert span.attributes is not None and span.attributes["rateloop.start_known"] is True
    assert span.attributes["rateloop.scope"] == A.scope
    assert span.end_time - span.start_time == 250_000_000  # type: ignore[operator]
    assert value(prom, "rateloop_calls_total", status="completed", tenant="t7") == 1
    assert value(prom, "rateloop_call_attempts_sum", layer="loop") == 1


def test_hooks_count_a_retried_call_once_and_start_its_first_span_at_the_call(otel: Any) -> None:
    sink, _, exporter, clock = otel
    prom = PrometheusSink(clock=clock)
    loop = RateLoop(policy(), clock=clock, sinks=[sink, prom])
    hooked_call(loop, FaultScript([takes(clock, 0.5, throttle("1")), ok()]), route=A)
    first, second = attempt_spans(exporter)
    assert first.attributes is not None and first.attributes["rateloop.start_known"] is True
    (slept,) = clock.sleeps
    assert first.end_time - first.start_time == pytest.approx((0.5 + slept) * 1e9)  # type: ignore[operator]
    assert second.status.status_code is StatusCode.OK
    assert value(prom, "rateloop_calls_total") == 1  # from call_finished only
    assert value(prom, "rateloop_retries_total") == 1


def test_hooks_end_the_span_of_a_call_that_waited_for_admission_then_succeeded(
    otel: Any,
) -> None:
    sink, _, exporter, clock = otel
    limiter = Limiter(limits={A.scope: LimitSpec(requests_per_minute=1, burst=1.0)}, clock=clock)
    loop = RateLoop(policy(), limiter=limiter, clock=clock, sinks=[sink])
    hooked_call(loop, FaultScript([ok()]), route=A)
    out = hooked_call(loop, FaultScript([ok()]), route=A)
    # The second call waited for the bucket, then succeeded at once: no terminal event.
    assert [e.decision.value for e in out.events] == ["admission_wait"]
    spans = attempt_spans(exporter)
    assert len(spans) == 2 and all(s.status.status_code is StatusCode.OK for s in spans)
    waited = spans[-1]
    assert [e.name for e in waited.events] == ["rateloop.wait"]
    assert "rateloop.unfinished" not in (waited.attributes or {})


def test_the_observe_package_imports_its_sinks_lazily() -> None:
    from rateloop import observe

    assert observe.__all__ == sorted(observe.__all__)
    for name in observe.__all__:
        assert getattr(observe, name).__name__ == name
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = observe.Nope
