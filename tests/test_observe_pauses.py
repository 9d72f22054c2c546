"""Issue 13 gaps: pause events, and operation / priority on every metric label.

Read through the real exporters: Prometheus text parsed by prometheus_client's
parser, OpenTelemetry through the SDK's in-memory reader and span exporter.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from rateloop.admission import LimitSpec
from rateloop.admission.limiter import Limiter
from rateloop.loop import AsyncRateLoop, RateLoop
from rateloop.observe.prometheus import PrometheusSink
from rateloop.outcome.events import DecisionKind, LoggingSink, RecordingSink
from rateloop.testing import FakeClock, FaultScript
from test_observe_sinks import (
    KEY,
    PROMPT,
    A,
    ok,
    otel,  # noqa: F401  (the fixture)
    otel_points,
    policy,
    samples,
    throttle,
    value,
)


def _limiter(clock: FakeClock) -> Limiter:
    return Limiter(limits={A.scope: LimitSpec(requests_per_minute=600)}, clock=clock)


def test_a_pause_is_an_event_with_scope_until_seconds_and_reason() -> None:
    clock, rec = FakeClock(), RecordingSink()
    loop = RateLoop(policy(), limiter=_limiter(clock), clock=clock, sinks=[rec])
    start = clock.now()
    out = loop.call(FaultScript([throttle("7"), ok()]), route=A, priority="background")
    assert out.ok
    (pause,) = [e for e in rec.events if e.decision is DecisionKind.PAUSE]
    assert pause.scope == A.provider_scope  # the provider's scope: every tenant of it
    assert pause.wait_seconds == 7.0
    assert pause.paused_until == start + timedelta(seconds=7)
    assert pause.reason == f"temporary on {A.provider_scope}"
    assert pause.signal_kind == "temporary" and pause.http_status == 429
    assert pause.priority == "background" and pause.operation == "model.generate"
    text = pause.to_json()
    assert PROMPT not in text and KEY not in text and "Q" * 20 not in text


def test_no_limiter_means_no_pause() -> None:
    rec = RecordingSink()
    RateLoop(policy(), clock=FakeClock(), sinks=[rec]).call(
        FaultScript([throttle("7"), ok()]), route=A
    )
    assert "pause" not in rec.decisions


def test_prometheus_counts_pauses_and_their_length_on_both_twins() -> None:
    for twin in ("sync", "async"):
        clock = FakeClock()
        sink = PrometheusSink(clock=clock)
        script = FaultScript([throttle("7"), throttle("30"), ok()])
        if twin == "sync":
            RateLoop(policy(), limiter=_limiter(clock), clock=clock, sinks=[sink]).call(
                script, route=A, priority="background"
            )
        else:
            loop = AsyncRateLoop(policy(), limiter=_limiter(clock), clock=clock, sinks=[sink])
            asyncio.run(loop.call(script, route=A, priority="background"))
        labels = {"scope": A.provider_scope, "priority": "background"}
        assert value(sink, "rateloop_pauses_total", **labels) == 2, twin
        assert value(sink, "rateloop_pause_length_seconds_count", **labels) == 2
        assert value(sink, "rateloop_pause_length_seconds_sum", **labels) == 37.0
        assert value(sink, "rateloop_pause_length_seconds_bucket", le="10.0", **labels) == 1
        # A pause is not a wait: the wait histograms see the two waits only.
        assert value(sink, "rateloop_wait_scheduled_seconds_count") == 2
        text = sink.exposition().decode()
        assert PROMPT not in text and "Q" * 20 not in text


def test_otel_pauses_are_metrics_and_a_span_event(otel: Any) -> None:  # noqa: F811
    sink, reader, exporter, clock = otel
    RateLoop(policy(), limiter=_limiter(clock), clock=clock, sinks=[sink]).call(
        FaultScript([throttle("4"), ok()]), route=A, operation="chat", priority="interactive"
    )
    points = otel_points(reader)
    (count,) = points["rateloop.pauses"]
    assert count.value == 1
    assert count.attributes["rateloop.scope"] == A.provider_scope
    assert count.attributes["rateloop.priority"] == "interactive"
    assert count.attributes["rateloop.operation"] == "chat"
    (length,) = points["rateloop.pause_length"]
    assert (length.count, length.sum) == (1, 4.0)
    first = exporter.get_finished_spans()[0]
    (event,) = [e for e in first.events if e.name == "rateloop.pause"]
    assert event.attributes["rateloop.pause.seconds"] == 4.0


def test_every_event_carries_operation_and_priority_into_the_labels() -> None:
    clock = FakeClock()
    sink = PrometheusSink(clock=clock)
    RateLoop(policy(), clock=clock, sinks=[sink]).call(
        FaultScript([throttle("2"), ok()]), route=A, operation="embed", priority="scheduled"
    )
    waits = [
        v for (n, ls), v in samples(sink).items()
        if n == "rateloop_decisions_total" and ("decision", "wait") in ls
    ]
    assert waits == [1.0]
    assert value(sink, "rateloop_decisions_total", operation="embed", priority="scheduled") == 3
    assert value(sink, "rateloop_retries_total", priority="scheduled", operation="embed") == 1


def test_a_first_try_success_is_labelled_through_call_started(otel: Any) -> None:  # noqa: F811
    sink, reader, exporter, clock = otel
    prom = PrometheusSink(clock=clock)
    out = RateLoop(policy(), clock=clock, sinks=[sink, prom]).call(
        FaultScript([ok()]), route=A, operation="embed", priority="scheduled"
    )
    assert out.events == ()  # no event: only call_started can name the labels
    assert value(prom, "rateloop_calls_total", status="completed", operation="embed",
                 priority="scheduled") == 1
    (calls,) = otel_points(reader)["rateloop.calls"]
    assert calls.attributes["rateloop.operation"] == "embed"
    assert calls.attributes["rateloop.priority"] == "scheduled"
    # One trace: the call's span and its one attempt, both labelled.
    call, attempt = sorted(exporter.get_finished_spans(), key=lambda s: s.name != "rateloop.call")
    assert attempt.parent is not None and attempt.parent.span_id == call.context.span_id
    for span in (call, attempt):
        assert span.attributes is not None and span.attributes["rateloop.priority"] == "scheduled"


def test_a_sink_with_the_old_call_started_still_works() -> None:
    seen: list[tuple[Any, ...]] = []

    class Old:
        def __call__(self, event: Any) -> None:
            pass

        def call_started(self, scope: str) -> None:
            seen.append((scope,))

        def call_finished(self, outcome: Any) -> None:
            pass

    class New(Old):
        def call_started(self, scope: str, **labels: str) -> None:  # type: ignore[override]
            seen.append((scope, labels))

    RateLoop(policy(), clock=FakeClock(), sinks=[Old(), New()]).call(
        FaultScript([ok()]), route=A, priority="background"
    )
    assert seen == [
        (A.scope,),
        (A.scope, {"operation": "model.generate", "priority": "background"}),
    ]


def test_logged_pause_events_carry_no_prompt_or_key(caplog: Any) -> None:
    clock = FakeClock()
    loop = RateLoop(policy(), limiter=_limiter(clock), clock=clock, sinks=[LoggingSink()])
    with caplog.at_level("INFO", logger="rateloop.events"):
        loop.call(FaultScript([throttle("3"), ok()]), route=A, operation=f"chat {KEY}")
    assert any('"decision":"pause"' in r.getMessage() for r in caplog.records)
    assert all(PROMPT not in r.getMessage() and "Q" * 20 not in r.getMessage()
               for r in caplog.records)
