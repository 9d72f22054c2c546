"""An OpenTelemetry event sink: metrics and a span per attempt (``rateloop[otel]``).

The sink uses the OpenTelemetry *API* only; which SDK, readers and exporters
run is the application's choice (``MeterProvider`` / ``TracerProvider``,
passed in or set globally).  Metric names are ``rateloop.<name>``; spans are
named ``rateloop.attempt`` and carry the wait as a ``rateloop.wait`` event.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rateloop._clock import Clock
from rateloop.observe._labels import LabelBounds
from rateloop.observe._metrics import METRICS, Metric, MetricSink, _Attempt

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

    def _span(self, attempt: _Attempt, end_ns: int, *, ok: bool, unfinished: bool) -> None:
        attrs: dict[str, Any] = _attributes(self._bounds.apply(attempt.labels))
        attrs["rateloop.attempt"] = attempt.number
        attrs["rateloop.start_known"] = attempt.start_known
        if attempt.signal_kind is not None:
            attrs["rateloop.signal_kind"] = attempt.signal_kind
        if attempt.http_status is not None:
            attrs["http.response.status_code"] = attempt.http_status
        if unfinished:
            attrs["rateloop.unfinished"] = True
        span = self._tracer.start_span(
            "rateloop.attempt", attributes=attrs, start_time=attempt.start_ns
        )
        for name, event_attrs, at in attempt.events:
            span.add_event(name, attributes=event_attrs, timestamp=at)
        if ok:
            span.set_status(trace.StatusCode.OK)
        elif attempt.signal_kind is not None:
            span.set_status(trace.Status(trace.StatusCode.ERROR, attempt.signal_kind))
        span.end(end_time=end_ns)


_UNITS = {"seconds": "s"}
