"""The decider's answers: :class:`Proceed`, :class:`Wait`, :class:`FallBack`, :class:`Stop`.

Values only (the pattern of tenacity's ``DoAttempt`` / ``DoSleep``): the
decider returns one, the loop performs it and hands it back to
:func:`rateloop.timing.state.take` for the state change it implies.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from rateloop.outcome.record import Status
from rateloop.route import Route

__all__ = ["Decision", "FallBack", "Proceed", "Skips", "Stop", "Wait"]

#: Fallback routes passed over, each with why (``check_route``'s reason).
Skips = tuple[tuple[Route, str], ...]


@dataclass(frozen=True, slots=True)
class Proceed:
    """Attempt now on ``route``."""

    route: Route
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait ``seconds``, then retry ``route`` (the same route)."""

    seconds: float
    reason: str
    route: Route


@dataclass(frozen=True, slots=True)
class FallBack:
    """Wait ``wait`` seconds, then move to ``route`` (chain position ``index``)."""

    route: Route
    wait: float
    reason: str
    index: int
    skipped: Skips = ()


@dataclass(frozen=True, slots=True)
class Stop:
    """End the call.  ``retry_at`` / ``retry_in`` say when it may be worth trying again.

    ``next_rung`` is the degrade ladder's hand-over (:mod:`rateloop.timing.ladder`):
    ``"batch"`` (submit the call to the batch API) or ``"park"`` (checkpoint it).
    """

    status: Status
    reason: str
    retry_at: datetime | None = None
    retry_in: float | None = None
    skipped: Skips = ()
    next_rung: str | None = None


Decision = Proceed | Wait | FallBack | Stop
