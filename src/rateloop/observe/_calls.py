"""What a metric sink remembers about one call between its events.

A call's events all come from the thread (sync) or asyncio task (async) that
runs it, so :func:`call_key` (thread and task) names the call; see
:mod:`rateloop.observe._metrics` for the rules that fill these records.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

from rateloop.outcome.events import DecisionKind
from rateloop.outcome.record import Outcome

__all__ = ["Attempt", "Call", "CallEnd", "call_key"]


@dataclass(slots=True)
class Attempt:
    """The span being built for one attempt of one call."""

    number: int
    start_ns: int
    start_known: bool
    labels: dict[str, str]
    events: list[tuple[str, dict[str, Any], int]] = field(default_factory=list)
    signal_kind: str | None = None
    http_status: int | None = None


@dataclass(slots=True)
class Call:
    """One call in flight: its open attempt, its span, and what counting needs."""

    attempt: Attempt | None = None
    # The backend's handle on the call's own span (the attempts' parent), once opened.
    span: Any = None
    # When and how its last event ended it, for a call whose call_finished never comes.
    ended: tuple[int, CallEnd] | None = None
    refused: set[int] = field(default_factory=set)
    # The attempt count of the last retry/fallback/admission wait: a stop with the same
    # count came before the next attempt was made, from admission.
    admitting_at: int | None = None
    wait: tuple[DecisionKind, float, float, dict[str, str]] | None = None
    # From call_started: what a first-try success (no event) is labelled with.
    operation: str = ""
    priority: str = ""


@dataclass(frozen=True, slots=True)
class CallEnd:
    """How a call ended, for its span: its route's labels, status and attempts."""

    labels: dict[str, str]
    status: str
    attempts: int
    ok: bool
    # With the loop's call_finished hook: the outcome (its value holds any usage).
    outcome: Outcome | None = None


def call_key() -> tuple[int, int]:
    try:
        task = id(asyncio.current_task())
    except RuntimeError:  # no running event loop: a sync call
        task = 0
    return (threading.get_ident(), task)
