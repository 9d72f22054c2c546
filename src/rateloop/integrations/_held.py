"""Reservations held on one route and handed back first in, first out.

The LangChain rate limiter and the pydantic-ai concurrency limiter both take
reservations of one :class:`~rateloop.Cost` on one :class:`~rateloop.Route`
and learn only later, without being told which, that *a* call has ended.
Tokens and slots are interchangeable inside a scope, so the oldest open
reservation is the one settled or released; this base keeps that queue.
"""

from __future__ import annotations

import threading
from collections import deque

from rateloop.admission import Limiter, Reservation
from rateloop.route import Cost, Route

__all__ = ["HeldReservations"]


class HeldReservations:
    """The route, cost and wait bounds of a framework limiter, and its open reservations."""

    def __init__(
        self,
        limiter: Limiter,
        *,
        route: Route,
        cost: Cost | None = None,
        priority: str = "interactive",
        deadline: float | None = None,
    ) -> None:
        if not isinstance(route, Route):
            raise TypeError(f"route must be a rateloop.Route, got {route!r}")
        self.limiter = limiter
        self.route = route
        self.cost = cost if cost is not None else Cost()
        self.priority = priority
        self.deadline = deadline
        self._held: deque[Reservation] = deque()
        self._lock = threading.Lock()

    def _hold(self, reservation: Reservation) -> None:
        with self._lock:
            self._held.append(reservation)

    def _oldest(self) -> Reservation | None:
        with self._lock:
            return self._held.popleft() if self._held else None

    def _count(self) -> int:
        with self._lock:
            return len(self._held)
