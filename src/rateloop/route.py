"""Where a call goes (:class:`Route`) and what it will spend (:class:`Cost`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

__all__ = ["TIERS", "TIER_MARK", "Cost", "Priority", "Route"]

#: The service tiers a route can be called at: ``standard`` (the default), ``flex``
#: (OpenAI's ``service_tier="flex"``: cheaper, slower, capacity of its own) and
#: ``batch`` (a provider's batch API: no synchronous call, the task layer submits it).
TIERS: tuple[str, ...] = ("standard", "flex", "batch")
#: Joins a model and a tier other than ``standard`` in a scope key: a flex route's
#: scopes are ``openai:gpt-5~flex[:project[:tenant]]``, apart from the standard tier's.
TIER_MARK = "~"


class Priority(StrEnum):
    """How urgent a call or a task is, most urgent first: the one priority vocabulary.

    The task queue orders by it (with aging, so later classes get through); admission
    keeps ``reserve`` of each capacity free per class above (:attr:`rank`): ``safety``
    (safety and recovery work) is admitted like ``interactive``, ``scheduled`` must
    leave ``reserve``, ``background`` ``2 × reserve``.
    """

    SAFETY = "safety"
    INTERACTIVE = "interactive"
    SCHEDULED = "scheduled"
    BACKGROUND = "background"

    @property
    def rank(self) -> int:
        """The admission class: 0 for ``safety`` and ``interactive``, then 1 and 2."""
        return _RANKS[self]

    @classmethod
    def parse(cls, value: str) -> Priority:
        """``value`` as a :class:`Priority`, or a ``ValueError`` naming what is allowed."""
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(p.value for p in cls)
            raise ValueError(f"unknown priority {value!r} (allowed: {allowed})") from None


_RANKS = {
    Priority.SAFETY: 0,
    Priority.INTERACTIVE: 0,
    Priority.SCHEDULED: 1,
    Priority.BACKGROUND: 2,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """A provider, a model, and the scope the provider really limits.

    The scope key is ``provider:model[:project[:tenant]]``.  A call on a route
    is admitted only when every scope in :attr:`scopes` admits it.

    ``context_window``, ``tags`` (data classes the route may carry, e.g.
    ``"pii"``) and the per-million-token prices feed the checks a fallback
    must pass.

    ``tier`` is the service tier the call is made at (:data:`TIERS`).  A tier
    other than ``standard`` has capacity of its own, so its scopes are its own:
    the model segment carries the tier (``openai:gpt-5~flex:proj``), and a
    flex refusal binds only them.  The prices stay the standard tier's; the
    tier's discount is the policy's (``[ladder]``).
    """

    provider: str
    model: str
    project: str | None = None
    tenant: str | None = None
    context_window: int | None = None
    tags: frozenset[str] = field(default=frozenset())
    input_price_per_mtok: float | None = None
    output_price_per_mtok: float | None = None
    tier: str = "standard"

    def __post_init__(self) -> None:
        for name in ("provider", "model"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or ":" in value:
                raise ValueError(
                    f"Route.{name} must be a non-empty string without ':', got {value!r}"
                )
        if self.tier not in TIERS:
            raise ValueError(
                f"Route.tier must be one of {', '.join(TIERS)}, got {self.tier!r}"
            )
        if not isinstance(self.tags, frozenset):
            object.__setattr__(self, "tags", frozenset(self.tags))

    @property
    def scope(self) -> str:
        """The most specific scope key of this route."""
        return self.scopes[-1]

    @property
    def scopes(self) -> tuple[str, ...]:
        """Every scope this route belongs to, broadest first.

        ``Route("openai", "gpt-5", project="proj-1", tenant="tenant-7").scopes``
        is ``("openai:gpt-5", "openai:gpt-5:proj-1", "openai:gpt-5:proj-1:tenant-7")``.
        """
        model = self.model if self.tier == "standard" else f"{self.model}{TIER_MARK}{self.tier}"
        keys = [f"{self.provider}:{model}"]
        if self.project is not None:
            keys.append(f"{keys[-1]}:{self.project}")
            if self.tenant is not None:
                keys.append(f"{keys[-1]}:{self.tenant}")
        return tuple(keys)

    @property
    def provider_scope(self) -> str:
        """The scope the provider itself limits: ``provider:model[:project]``.

        A tenant is rateloop's own subdivision, so a provider's 429 or its
        rate-limit headers speak for the project, every tenant included.
        """
        keys = self.scopes
        return keys[1] if len(keys) == 3 else keys[-1]

    def with_model(self, model: str) -> Route:
        """The same route, on another model."""
        return replace(self, model=model)

    def with_tier(self, tier: str) -> Route:
        """The same route, at another service tier (its scopes follow the tier)."""
        return self if tier == self.tier else replace(self, tier=tier)

    def estimated_cost_usd(self, cost: Cost) -> float | None:
        """The worst-case price of ``cost`` on this route, if prices are known."""
        return self.price_usd(cost.input_tokens, cost.output_tokens)

    def price_usd(
        self, input_tokens: int, output_tokens: int, *, discount: float = 0.0
    ) -> float | None:
        """What these tokens cost on this route with ``discount`` (0.5: half off); None
        without prices.

        >>> Route(provider="openai", model="m", input_price_per_mtok=2.0,
        ...       output_price_per_mtok=8.0).price_usd(1_000_000, 500_000, discount=0.5)
        3.0
        """
        if self.input_price_per_mtok is None and self.output_price_per_mtok is None:
            return None
        full = (
            input_tokens * (self.input_price_per_mtok or 0.0)
            + output_tokens * (self.output_price_per_mtok or 0.0)
        ) / 1_000_000
        return full * (1.0 - discount)

    def __str__(self) -> str:
        return self.scope


@dataclass(frozen=True, slots=True, kw_only=True)
class Cost:
    """What a call will spend: requests, estimated input tokens, max output tokens."""

    requests: int = 1
    input_tokens: int = 0
    output_tokens: int = 0

    def __post_init__(self) -> None:
        for name in ("requests", "input_tokens", "output_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"Cost.{name} must be an int >= 0, got {value!r}")

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens
