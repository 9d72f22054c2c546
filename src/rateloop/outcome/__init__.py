"""EXIT, the record: how every call ends, what it says on the way, and who is told.

- :mod:`~rateloop.outcome.record` — :class:`Status`, :class:`Outcome` and the attempt ledger.
- :mod:`~rateloop.outcome.events` — :class:`CapacityEvent` (one per decision) and the
  plain sinks (:class:`LoggingSink`, :class:`RecordingSink`).
- :mod:`~rateloop.outcome.console` — :class:`ConsoleSink`, a few lines for a person at a
  terminal.
"""

from __future__ import annotations

from rateloop.outcome.console import ConsoleSink
from rateloop.outcome.events import (
    CapacityEvent,
    DecisionKind,
    EventSink,
    LoggingSink,
    RecordingSink,
)
from rateloop.outcome.record import AttemptLedger, Attempts, Outcome, Status

__all__ = [
    "AttemptLedger",
    "Attempts",
    "CapacityEvent",
    "ConsoleSink",
    "DecisionKind",
    "EventSink",
    "LoggingSink",
    "Outcome",
    "RecordingSink",
    "Status",
]
