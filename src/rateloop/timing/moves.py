"""Where a call moves next on its chain: the next eligible route, or the skips that left none.

The chain and the checks a route must pass are :mod:`rateloop.timing.fallback`'s;
this module walks the chain from the call's current position for the decider
(rules 2, 4, 5 and 8 of :mod:`rateloop.timing.decide`).
"""

from __future__ import annotations

from collections.abc import Collection

from rateloop.route import Route
from rateloop.timing.decision import FallBack, Skips
from rateloop.timing.fallback import check_route
from rateloop.timing.state import LoopSettings, LoopState

__all__ = ["fall_back_now", "next_route"]


def next_route(
    state: LoopState, settings: LoopSettings, *, exclude_providers: Collection[str]
) -> FallBack | Skips:
    """The next eligible route after the current one, or the skips that left none."""
    fb = settings.fallback
    skipped: list[tuple[Route, str]] = []
    for index in range(state.index + 1, len(state.chain)):
        candidate = state.chain[index]
        why = check_route(
            candidate,
            cost=state.cost,
            allowed_providers=fb.allowed_providers,
            data_class=state.data_class if state.data_class is not None else fb.data_class,
            max_cost_usd=fb.max_cost_usd,
            exclude_providers=exclude_providers,
        )
        if why is None:
            return FallBack(candidate, 0.0, "", index, tuple(skipped))
        skipped.append((candidate, why))
    return tuple(skipped)


def fall_back_now(state: LoopState, settings: LoopSettings, why: str) -> FallBack | Skips:
    """The next eligible route to move to at once (no wait) because ``why``, or the skips.

    Used when the current route's own wait cannot fit (rule 5 of the decider),
    for a server minimum and for an admission wait alike.
    """
    found = next_route(state, settings, exclude_providers=state.spent_providers)
    if not isinstance(found, FallBack):
        return found
    reason = f"{why}; falling back to {found.route.scope} at once"
    return FallBack(found.route, 0.0, reason, found.index, found.skipped)
