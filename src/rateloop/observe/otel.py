"""An OpenTelemetry event sink: metrics and one trace per call (``rateloop[otel]``).

The sink uses the OpenTelemetry *API* only; which SDK, readers and exporters
run is the application's choice (``MeterProvider`` / ``TracerProvider``,
passed in or set globally).  Metric names are ``rateloop.<name>``.  A call
is one ``rateloop.call`` span, the root of its trace, with one
``rateloop.attempt`` child per attempt; an attempt carries its wait as a
``rateloop.wait`` event.  Both are ``CLIENT`` spans with the OpenTelemetry
GenAI attributes where they apply (``gen_ai.system``,
``gen_ai.request.model``, ``gen_ai.usage.*_tokens``, ``error.type``) and
rateloop's own under ``rateloop.*``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rateloop._clock import Clock
from rateloop.admission.profile import INPUT_FIELDS, OUTPUT_FIELDS
from rateloop.loop.effects import Returned, usage_of
from rateloop.observe._calls import Attempt, CallEnd
from rateloop.observe._labels import LabelBounds
from rateloop.observe._metrics import METRICS, Metric, MetricSink

try:
    from opentelemetry import metrics, trace
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "the OpenTelemetry sink needs opentelemetry-api: pip install 'rateloop[otel]'"
    ) from exc

__all__ = ["OTelSink"]

_SCOPE = "rateloop"


def _attributes(labels: dict[str, str]) -> dict[str, str]:
    # Empty labels are left out: OpenTelemetry has no "unset" value to compare with.
    return {f"rateloop.{k}": v for k, v in labels.items() if v}


def _span_attributes(labels: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = _attributes(labels)
    # The GenAI semantic conventions' names for what they cover (provider, model).
    if labels.get("provider"):
        out["gen_ai.system"] = labels["provider"]
    if labels.get("model"):
        out["gen_ai.request.model"] = labels["model"]
    return out


def _tokens(usage: Any, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = usage.get(name) if isinstance(usage, dict) else getattr(usage, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _usage_attributes(ended: CallEnd) -> dict[str, int]:
    """``gen_ai.usage.*`` from the usage the call's response reports, as the provider said it."""
    if ended.outcome is None or not ended.ok:
        return {}
    usage = usage_of(Returned(ended.outcome.value))
    if usage is None:
        return {}
    out = {}
    for key, names in (("input_tokens", INPUT_FIELDS), ("output_tokens", OUTPUT_FIELDS)):
        if (count := _tokens(usage, names)) is not None:
            out[f"gen_ai.usage.{key}"] = count
    return out


class OTelSink(MetricSink):
    """Record the loop's capacity decisions as OpenTelemetry metrics and spans.

    ``tenant_labels`` and ``label_limits`` bound the attributes of both as in
    :class:`~rateloop.observe.prometheus.PrometheusSink`.
    """

    traces = True

    def __init__(
        self,
        *,
        meter_provider: metrics.MeterProvider | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        clock: Clock | None = None,
        tenant_labels: bool = False,
        label_limits: Mapping[str, int] | None = None,
    ) -> None:
        super().__init__(clock=clock)
        self._bounds = LabelBounds(tenant_labels=tenant_labels, label_limits=label_limits)
        from rateloop._version import package_version

        meter = metrics.get_meter(_SCOPE, package_version(), meter_provider=meter_provider)
        self._tracer = trace.get_tracer(_SCOPE, package_version(), tracer_provider=tracer_provider)
        self._instruments: dict[str, Any] = {}
        for m in METRICS.values():
            name = f"rateloop.{m.name}"
            if m.kind == "counter":
                self._instruments[m.name] = meter.create_counter(
                    name, unit=m.unit or "1", description=m.description
                )
            else:
                self._instruments[m.name] = meter.create_histogram(
                    name,
                    unit=_UNITS.get(m.unit, m.unit or "1"),
                    description=m.description,
                    explicit_bucket_boundaries_advisory=m.buckets,
                )

    def __repr__(self) -> str:
        return "OTelSink()"

    def _add(self, metric: Metric, labels: dict[str, str], n: float = 1.0) -> None:
        self._instruments[metric.name].add(n, attributes=_attributes(self._bounds.apply(labels)))

    def _record(self, metric: Metric, labels: dict[str, str], value: float) -> None:
        self._instruments[metric.name].record(
            value, attributes=_attributes(self._bounds.apply(labels))
        )

    def _call_span(self, start_ns: int) -> Any:
        return self._tracer.start_span(
            "rateloop.call", kind=trace.SpanKind.CLIENT, start_time=start_ns
        )

    def _end_call_span(self, span: Any, end_ns: int, ended: CallEnd) -> None:
        # The call's route is known at its end (a fallback may have moved it).
        attrs = _span_attributes(self._bounds.apply(ended.labels))
        attrs["rateloop.status"] = ended.status
        attrs["rateloop.attempts"] = ended.attempts
        attrs.update(_usage_attributes(ended))
        if ended.ok:
            span.set_status(trace.StatusCode.OK)
        else:
            attrs["error.type"] = ended.status
            span.set_status(trace.Status(trace.StatusCode.ERROR, ended.status))
        span.set_attributes(attrs)
        span.end(end_time=end_ns)

    def _span(
        self, attempt: Attempt, end_ns: int, *, ok: bool, unfinished: bool, parent: Any
    ) -> None:
        attrs = _span_attributes(self._bounds.apply(attempt.labels))
        attrs["rateloop.attempt"] = attempt.number
        attrs["rateloop.start_known"] = attempt.start_known
        if attempt.signal_kind is not None:
            attrs["rateloop.signal_kind"] = attempt.signal_kind
            if not ok:
                attrs["error.type"] = attempt.signal_kind
        if attempt.http_status is not None:
            attrs["http.response.status_code"] = attempt.http_status
        if unfinished:
            attrs["rateloop.unfinished"] = True
        span = self._tracer.start_span(
            "rateloop.attempt",
            context=trace.set_span_in_context(parent) if parent is not None else None,
            kind=trace.SpanKind.CLIENT,
            attributes=attrs,
            start_time=attempt.start_ns,
        )
        for name, event_attrs, at in attempt.events:
            span.add_event(name, attributes=event_attrs, timestamp=at)
        if ok:
            span.set_status(trace.StatusCode.OK)
        elif attempt.signal_kind is not None:
            span.set_status(trace.Status(trace.StatusCode.ERROR, attempt.signal_kind))
        span.end(end_time=end_ns)


_UNITS = {"seconds": "s"}
