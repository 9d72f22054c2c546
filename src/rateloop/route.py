"""Where a call goes (:class:`Route`) and what it will spend (:class:`Cost`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

__all__ = ["Cost", "Priority", "Route"]


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
    """

    provider: str
    model: str
    project: str | None = None
    tenant: str | None = None
    context_window: int | None = None
    tags: frozenset[str] = field(default=frozenset())
    input_price_per_mtok: float | None = None
    output_price_per_mtok: float | None = None

    def __post_init__(self) -> None:
        for name in ("provider", "model"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or ":" in value:
                raise ValueError(
                    f"Route.{name} must be a non-empty string without ':', got {value!r}"
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
        keys = [f"{self.provider}:{self.model}"]
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

    def estimated_cost_usd(self, cost: Cost) -> float | None:
        """The worst-case price of ``cost`` on this route, if prices are known."""
        if self.input_price_per_mtok is None and self.output_price_per_mtok is None:
            return None
        return (
            cost.input_tokens * (self.input_price_per_mtok or 0.0)
            + cost.output_tokens * (self.output_price_per_mtok or 0.0)
        ) / 1_000_000

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
