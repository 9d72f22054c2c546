"""Fallback chains and the checks a route must pass before the loop switches to it.

The chain is ``[primary, *fallbacks]``, walked once and in order.  Before
switching to a fallback route, :func:`check_route` checks it; a route that
fails is skipped and the skip is recorded as an event.  The checks:

- the route's provider is on the allowlist (``FallbackPolicy.allowed_providers``);
- the route's context window holds the estimated input (``Cost.input_tokens``);
- the call's data class is allowed on the route (the route carries it in ``tags``);
- the worst-case price of the call is within the cost ceiling.

A period quota or a spend limit belongs to the provider account, so after
one of those only a route on *another provider* is eligible.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from rateloop.route import Cost, Route
from rateloop.timing.decision import FallBack, Skips
from rateloop.timing.state import LoopSettings, LoopState

__all__ = ["build_chain", "check_route", "fall_back_now", "next_route"]


def build_chain(primary: Route, fallbacks: Sequence[Route] | None) -> tuple[Route, ...]:
    """``(primary, *fallbacks)`` without repeats, in order."""
    chain: list[Route] = [primary]
    for route in fallbacks or ():
        if not isinstance(route, Route):
            raise TypeError(f"fallbacks must be Route values, got {route!r}")
        if route not in chain:
            chain.append(route)
    return tuple(chain)


def check_route(
    route: Route,
    *,
    cost: Cost,
    allowed_providers: Collection[str] | None = None,
    data_class: str | None = None,
    max_cost_usd: float | None = None,
    exclude_providers: Collection[str] = (),
) -> str | None:
    """Why ``route`` may not take this call, or ``None`` when it may."""
    if route.provider in exclude_providers:
        return f"provider {route.provider!r} is the one whose quota or spend limit was hit"
    if allowed_providers is not None and route.provider not in allowed_providers:
        allowed = ", ".join(sorted(allowed_providers)) or "none"
        return f"provider {route.provider!r} is not on the allowlist ({allowed})"
    if route.context_window is not None and cost.input_tokens > route.context_window:
        return (
            f"context window {route.context_window} is smaller than the estimated input "
            f"of {cost.input_tokens} tokens"
        )
    if data_class is not None and data_class not in route.tags:
        return f"data class {data_class!r} is not allowed on this route"
    if max_cost_usd is not None:
        price = route.estimated_cost_usd(cost)
        if price is not None and price > max_cost_usd:
            return f"estimated cost ${price:.4f} is above the ceiling ${max_cost_usd:.4f}"
    return None


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
