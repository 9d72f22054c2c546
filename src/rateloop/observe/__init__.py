"""See rateloop at work: metric sinks, the live scope state, ``status`` and ``dashboard``.

- :class:`~rateloop.observe.otel.OTelSink` and
  :class:`~rateloop.observe.prometheus.PrometheusSink`: event sinks for the
  loop (extras ``otel`` and ``prometheus``, imported lazily from here);
  :class:`~rateloop.observe.redis_events.RedisEventSink` shares the events
  with the dashboard through Redis.
- :class:`~rateloop.observe.redis_state.RedisStateReader`: every scope's headroom,
  pause and AIMD factor, read from the limiter's Redis (``rateloop status``).
- :mod:`rateloop.observe.dashboard`: the read-only local status page
  (``rateloop dashboard``).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["OTelSink", "PrometheusSink", "RedisEventSink"]

_LAZY = {
    "OTelSink": "rateloop.observe.otel",
    "PrometheusSink": "rateloop.observe.prometheus",
    "RedisEventSink": "rateloop.observe.redis_events",
}


def __getattr__(name: str) -> Any:
    # The sinks need optional extras: import them only when asked for.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rateloop.observe' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
