"""A Prometheus event sink (``pip install 'rateloop[prometheus]'``).

>>> from rateloop.observe.prometheus import PrometheusSink
>>> sink = PrometheusSink(namespace="demo")
>>> b"demo_decisions_total" in sink.exposition()
True

Metrics live in the sink's own ``CollectorRegistry`` unless one is passed
(several sinks then never collide).  :meth:`PrometheusSink.serve` starts the
``/metrics`` endpoint, on 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from rateloop._clock import Clock
from rateloop.observe._bind import check_bind
from rateloop.observe._labels import LabelBounds
from rateloop.observe._metrics import METRICS, Metric, MetricSink

try:
    import prometheus_client
    from prometheus_client import CollectorRegistry, Counter, Histogram
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "the Prometheus sink needs prometheus_client: pip install 'rateloop[prometheus]'"
    ) from exc

__all__ = ["PrometheusSink"]


class PrometheusSink(MetricSink):
    """Count the loop's capacity decisions in Prometheus metrics (``rateloop_*``).

    ``tenant_labels=True`` adds the ``tenant`` label (and the tenant part of
    ``scope``); ``label_limits`` changes how many distinct values a label keeps
    before new ones fold into ``other`` (:mod:`rateloop.observe._labels`).
    """

    def __init__(
        self,
        *,
        registry: CollectorRegistry | None = None,
        namespace: str = "rateloop",
        clock: Clock | None = None,
        tenant_labels: bool = False,
        label_limits: Mapping[str, int] | None = None,
    ) -> None:
        super().__init__(clock=clock)
        self._bounds = LabelBounds(tenant_labels=tenant_labels, label_limits=label_limits)
        self.registry = registry if registry is not None else CollectorRegistry()
        self.namespace = namespace
        self._metrics: dict[str, Counter | Histogram] = {}
        for m in METRICS.values():
            self._metrics[m.name] = self._build(m)
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def _build(self, m: Metric) -> Counter | Histogram:
        if m.kind == "counter":
            return Counter(
                m.name,
                m.description,
                self._bounds.names(m.label_names),
                namespace=self.namespace,
                unit=m.unit,
                registry=self.registry,
            )
        return Histogram(
            m.name,
            m.description,
            self._bounds.names(m.label_names),
            namespace=self.namespace,
            unit=m.unit,
            registry=self.registry,
            buckets=m.buckets,
        )

    def __repr__(self) -> str:
        return f"PrometheusSink(namespace={self.namespace!r})"

    def _add(self, metric: Metric, labels: dict[str, str], n: float = 1.0) -> None:
        counter = self._metrics[metric.name]
        assert isinstance(counter, Counter)
        counter.labels(**self._bounds.apply(labels)).inc(n)

    def _record(self, metric: Metric, labels: dict[str, str], value: float) -> None:
        histogram = self._metrics[metric.name]
        assert isinstance(histogram, Histogram)
        histogram.labels(**self._bounds.apply(labels)).observe(value)

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format (what ``/metrics`` serves)."""
        return prometheus_client.generate_latest(self.registry)

    def serve(
        self, port: int = 9464, *, host: str = "127.0.0.1", allow_remote: bool = False
    ) -> int:
        """Serve ``/metrics`` on ``host:port`` in a daemon thread; returns the bound port.

        ``port=0`` picks a free port.  A host other than a loopback address is
        refused unless ``allow_remote=True``: the metrics name scopes and models.
        """
        check_bind(host, allow_remote=allow_remote)
        if self._server is not None:
            raise RuntimeError("this sink already serves /metrics; call close() first")
        server, thread = prometheus_client.start_http_server(
            port, addr=host, registry=self.registry
        )
        self._server, self._thread = server, thread
        return int(server.server_address[1])

    def close(self) -> None:
        """Stop the ``/metrics`` server, if :meth:`serve` started one."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            if self._thread is not None:
                self._thread.join(timeout=5)
            self._server = self._thread = None
