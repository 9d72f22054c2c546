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

__all__ = ["build_chain", "check_route"]


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
