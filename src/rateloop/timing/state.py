"""One call's loop state, and every change made to it (h11's "Rule 1").

How it works: :class:`LoopState` is everything the decider knows about one
call in flight -- the chain and where the call is on it, the budget, the
backoff, the waits so far, which route was limited first.  The decider
(:mod:`rateloop.timing.decide`) only reads it.  **Everything that changes it
lives in this module**, one function per event the loop reports, so the
whole state machine can be read in one place; the loop's flow
(:mod:`rateloop.loop.flow`) never assigns a field or calls a budget's
``record_*`` itself:

============================  ===============================================
event (function)              change
============================  ===============================================
:func:`start_attempt`         one attempt from the budgets (the run's too) and
                              from the route's share; False when none is left
:func:`count_sdk_retries`     retries an SDK took inside the attempt reached the
                              provider: they spend attempts too
:func:`record_refusal`        the first refusal starts the recovery clock; an
                              error kind moves the attempt to the error count
:func:`take` (``Wait``)       one more wait served (the backoff's next step)
:func:`take` (``FallBack``)   move along the chain: the route's attempts restart,
                              the first limited route is kept for the outcome,
                              a provider whose quota or bill ran out is excluded
:func:`use_controlled_retry`  the one retry of an ambiguous write is spent
:func:`record_answer`         the provider answered (any status): the route's
                              endpoint has answered in this process
============================  ===============================================

One piece of state outlives a call: :class:`Answered`, the endpoints that have
answered in this process (:data:`ANSWERED`, shared by every loop and door).  A
connection that never opened is retried only to an endpoint in it (rule 3a of
the decider): to any other it is most likely a wrong URL or a server that is
not running, and a minute of backoff would only hide that.

The settings the decider reads are the small :class:`LoopSettings` protocol
(a :class:`~rateloop.policy.Policy` has them), never the whole policy: the
policy is built on this layer, not the other way round.
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from rateloop.route import Cost, Route
from rateloop.signal import Kind, LimitSignal
from rateloop.timing.backoff import Backoff
from rateloop.timing.budget import CallBudget
from rateloop.timing.decision import FallBack, Wait
from rateloop.timing.ladder import Ladder

__all__ = [
    "ANSWERED",
    "Answered",
    "FallbackSettings",
    "LoopSettings",
    "LoopState",
    "count_sdk_retries",
    "record_answer",
    "record_refusal",
    "start_attempt",
    "take",
    "use_controlled_retry",
]


class FallbackSettings(Protocol):
    """The checks a fallback route must pass (a ``FallbackPolicy`` has them)."""

    @property
    def allowed_providers(self) -> Collection[str] | None: ...
    @property
    def data_class(self) -> str | None: ...
    @property
    def max_cost_usd(self) -> float | None: ...


class LoopSettings(Protocol):
    """What the decider reads of the configuration (a :class:`~rateloop.policy.Policy`)."""

    @property
    def trigger_scope(self) -> str: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def attempts_per_route(self) -> int | None: ...
    @property
    def pause_limit_secs(self) -> float: ...
    @property
    def fallback(self) -> FallbackSettings: ...


class Answered:
    """The endpoints that have answered in this process: a route's provider and project.

    An endpoint is where a route's calls go: the transport's project names the
    host and a fingerprint of the base URL and key, so for the ready clients it
    is the server itself; a hand-written route's is its provider and project.
    Any answer counts (a 200, a 429, a 500): the server is there.  The oldest
    entries are forgotten past ``capacity`` (a forgotten endpoint's refused
    connection fails fast once more, and its next answer brings it back).

    >>> answered = Answered()
    >>> route = Route(provider="openai", model="gpt-5", project="p1")
    >>> route in answered, answered.add(route), route in answered
    (False, None, True)
    """

    __slots__ = ("_capacity", "_endpoints", "_lock")

    def __init__(self, capacity: int = 4096) -> None:
        self._capacity = capacity
        self._endpoints: dict[str, None] = {}  # insertion-ordered: the oldest go first
        self._lock = threading.Lock()  # loops on many threads share the process's registry

    @staticmethod
    def endpoint(route: Route) -> str:
        return route.provider if route.project is None else f"{route.provider}:{route.project}"

    def __contains__(self, route: object) -> bool:
        return isinstance(route, Route) and self.endpoint(route) in self._endpoints

    def add(self, route: Route) -> None:
        key = self.endpoint(route)
        if key in self._endpoints:
            return
        with self._lock:
            self._endpoints[key] = None
            while len(self._endpoints) > self._capacity:
                self._endpoints.pop(next(iter(self._endpoints)))

    def __repr__(self) -> str:
        return f"Answered({len(self._endpoints)} endpoints)"


#: The endpoints that have answered in this process, shared by every loop.
ANSWERED = Answered()


def _process_answered() -> Answered:
    return ANSWERED


@dataclass(slots=True, kw_only=True)
class LoopState:
    """Everything the decider needs to know about one call in flight.

    ``epoch`` pairs a monotonic reading with the wall-clock time at that
    reading, so the decider can turn monotonic instants into datetimes without
    reading a clock.
    """

    chain: tuple[Route, ...]
    budget: CallBudget
    backoff: Backoff
    epoch: tuple[float, datetime]
    cost: Cost = field(default_factory=Cost)
    data_class: str | None = None
    index: int = 0
    route_attempts: int = 0
    waits: int = 0
    previous_wait: float | None = None
    limited_route: Route | None = None
    limited_kind: Kind | None = None
    spent_providers: set[str] = field(default_factory=set)
    controlled_retry_used: bool = False
    answered: Answered = field(default_factory=_process_answered)
    #: The rung of each route of the chain, and the ladder (None: the class has none).
    rungs: tuple[str, ...] = ()
    ladder: Ladder | None = None

    @property
    def route(self) -> Route:
        return self.chain[self.index]

    @property
    def rung(self) -> str:
        """The rung the call is on: ``standard``, ``flex``, ``batch`` or ``fallback``."""
        if self.rungs:
            return self.rungs[self.index]
        return self.route.tier if self.index == 0 else "fallback"

    def wall(self, now: float) -> datetime:
        mono0, wall0 = self.epoch
        return wall0 + timedelta(seconds=now - mono0)


def start_attempt(state: LoopState) -> bool:
    """Count an attempt on the current route; False when the budget (or the run's) has none."""
    if not state.budget.record_attempt():
        return False
    state.route_attempts += 1
    return True


def count_sdk_retries(state: LoopState, retries: int) -> None:
    """Charge retries an SDK took inside the last attempt (they reached the provider)."""
    state.budget.record_sdk_retries(retries)


def record_answer(state: LoopState, signal: LimitSignal) -> None:
    """After an attempt on the current route: mark its endpoint when the provider answered.

    A ``network`` signal is no answer, nor an ``unknown`` one (an exception
    nobody recognised, most likely a bug of ours).
    """
    if signal.kind not in (Kind.NETWORK, Kind.UNKNOWN):
        state.answered.add(state.route)


def record_refusal(state: LoopState, now: float, kind: Kind | None = None) -> None:
    """Note a refusal of ``kind`` at ``now``; None is admission's (nothing was sent)."""
    state.budget.record_refusal(now, kind)


def take(state: LoopState, decision: Wait | FallBack, kind: Kind | None) -> None:
    """Apply a decision the loop has carried out (its wait, if any, served).

    ``kind`` is what the route refused with; None when admission found no
    capacity in time (nothing was sent: the move is no retry, and the route
    counts as rate-limited for the outcome).
    """
    if isinstance(decision, Wait):
        state.waits += 1
        state.previous_wait = decision.seconds
        return
    if state.limited_route is None:
        state.limited_route = state.route
        state.limited_kind = Kind.TEMPORARY if kind is None else kind
    if kind is not None:
        if kind in (Kind.PERIOD_QUOTA, Kind.SPEND):
            state.spent_providers.add(state.route.provider)
        state.waits += 1
        state.previous_wait = decision.wait
    state.index = decision.index
    state.route_attempts = 0


def use_controlled_retry(state: LoopState) -> None:
    """Spend the one retry an ambiguous write gets after ``outcome_check`` said not applied."""
    state.controlled_retry_used = True
