"""The degrade ladder: which rungs a call may take, in order, and where it ends.

How it works.  A call's priority class names its ladder (the policy's
``[ladder]`` table): rungs from :data:`RUNGS`, in the order the call walks
them.  :func:`ladder_chain` turns the ladder into the loop's chain of routes,
each with its rung, before the first attempt; from then on the decider's own
rules walk that chain (:mod:`rateloop.timing.decide`), so a rung is left for
the next one exactly when a fallback would be taken:

1. No ladder for the class (the default): the chain is today's, the route
   and then its fallbacks (rungs: the route's tier, then ``fallback``).
2. ``standard`` is the route at the standard tier, ``flex`` the same route at
   the flex tier (:meth:`~rateloop.route.Route.with_tier`), ``fallback`` each
   of the call's fallback routes (every one still passes the fallback checks
   of :mod:`rateloop.timing.fallback` before the loop moves to it), ``batch``
   the route at the batch tier: a rung the loop never calls.
3. A deferrable class (``ladder.deferrable``, ``background`` by default) starts
   on its cheapest rung when it is cheaper than the rungs above it (the
   tier's discount > 0): the rungs it skipped follow it, in their order.  So
   ``standard, flex, batch`` runs ``flex, standard, batch`` for bulk work, and
   a flex refusal that cannot wait before the deadline goes back to standard.
4. A rung is left, as any route of a chain, when its wait would miss the
   deadline or pass the pause limit (rules 5, 7 and 8 of the decider), or
   when its attempts are spent (rule 4): a flex refusal (``flex_unavailable``,
   no wait named) is retried on flex after the backoff while the deadline
   allows, and moves down when it does not.
5. Reaching ``batch`` ends the call ``waiting_for_capacity`` with
   ``next_rung="batch"`` and the batch-tier route: the task layer submits it
   to the provider's batch API.  Work is never lost there.
6. A ladder that ends in ``park`` parks what no rung could serve: the stop
   is ``waiting_for_capacity`` (the task layer checkpoints it until
   ``retry_at``), marked ``next_rung="park"``.  A ladder without ``park``
   does not wait: such a stop becomes ``failed_retry_exhausted``, so an
   interactive caller answers its user at once.

Interactive and safety work never goes to batch (the policy refuses such a
ladder at load).  Sans-IO: values in, values out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from rateloop.outcome.record import Status
from rateloop.route import Route
from rateloop.timing.decision import Stop
from rateloop.timing.fallback import build_chain

__all__ = [
    "NO_BATCH_CLASSES",
    "RUNGS",
    "Ladder",
    "LadderSettings",
    "ladder_chain",
    "ladder_end",
    "tier_discount",
]

#: Every rung a ladder may name, in the order a ladder is usually walked.
RUNGS: tuple[str, ...] = ("standard", "flex", "batch", "fallback", "park")
#: Priority classes whose ladder may not name ``batch``: someone waits for them now.
NO_BATCH_CLASSES: frozenset[str] = frozenset({"safety", "interactive"})
_TIER_RUNGS = ("standard", "flex", "batch")


class LadderSettings(Protocol):
    """What the ladder reads of the policy (a ``LadderPolicy`` has it)."""

    @property
    def deferrable(self) -> Sequence[str]: ...
    @property
    def flex_discount(self) -> float: ...
    @property
    def batch_discount(self) -> float: ...

    def rungs_for(self, priority: str) -> tuple[str, ...] | None: ...


@dataclass(frozen=True, slots=True)
class Ladder:
    """The ladder one call walks: its class, its rungs in order, whether it parks."""

    priority: str
    rungs: tuple[str, ...]

    @property
    def parks(self) -> bool:
        return "park" in self.rungs


def tier_discount(settings: LadderSettings | None, tier: str) -> float:
    """The price discount of a service tier (``flex``, ``batch``: the policy's), else 0."""
    if settings is None:
        return 0.0
    if tier == "flex":
        return settings.flex_discount
    if tier == "batch":
        return settings.batch_discount
    return 0.0


def _ordered(rungs: tuple[str, ...], settings: LadderSettings, priority: str) -> tuple[str, ...]:
    """Rule 3: a deferrable class starts on its cheapest rung, the skipped ones after it."""
    if priority not in settings.deferrable:
        return rungs
    tiers = [r for r in rungs if r in _TIER_RUNGS]
    if not tiers:
        return rungs
    cheapest = min(tiers, key=lambda r: (-tier_discount(settings, r), rungs.index(r)))
    at = rungs.index(cheapest)
    if tier_discount(settings, cheapest) <= max(
        (tier_discount(settings, r) for r in rungs[:at] if r in _TIER_RUNGS), default=0.0
    ):
        return rungs
    return (cheapest, *rungs[:at], *rungs[at + 1 :])


def ladder_chain(
    route: Route,
    fallbacks: Sequence[Route] | None,
    settings: LadderSettings | None,
    priority: str,
) -> tuple[tuple[Route, ...], tuple[str, ...], Ladder | None]:
    """The chain of routes for a call, the rung of each, and its ladder (None: none).

    >>> from rateloop.policy import LadderPolicy
    >>> route = Route(provider="openai", model="gpt-5", project="p")
    >>> policy = LadderPolicy(background=("standard", "flex", "batch"))
    >>> chain, rungs, _ = ladder_chain(route, (), policy, "background")
    >>> rungs
    ('flex', 'standard', 'batch')
    >>> [r.scope for r in chain]
    ['openai:gpt-5~flex:p', 'openai:gpt-5:p', 'openai:gpt-5~batch:p']
    """
    rungs = settings.rungs_for(priority) if settings is not None else None
    if settings is None or rungs is None:
        chain = build_chain(route, fallbacks)
        return chain, (route.tier, *("fallback",) * (len(chain) - 1)), None
    routes: list[Route] = []
    labels: list[str] = []
    for rung in _ordered(rungs, settings, priority):
        if rung == "park":
            continue
        if rung == "fallback":
            candidates = build_chain(route, fallbacks)[1:]
        else:
            candidates = (route.with_tier(rung),)
        for candidate in candidates:
            if candidate not in routes:
                routes.append(candidate)
                labels.append(rung)
    if not routes:  # a ladder of park alone: the call is still tried on its route
        routes, labels = [route], ["standard"]
    return tuple(routes), tuple(labels), Ladder(priority, rungs)


def ladder_end(stop: Stop, ladder: Ladder | None) -> Stop:
    """Rule 6: a wait for capacity parks only on a ladder with ``park``; else it fails now."""
    if ladder is None or stop.status is not Status.WAITING_FOR_CAPACITY or stop.next_rung:
        return stop
    if ladder.parks:
        return replace(stop, next_rung="park")
    return Stop(
        Status.FAILED_RETRY_EXHAUSTED,
        f"{stop.reason}; the {ladder.priority} ladder ({', '.join(ladder.rungs)}) has no park rung",
        skipped=stop.skipped,
    )
