"""pydantic-ai: a shared concurrency limiter and the RATE-loop transport for its models.

- :class:`RateLoopConcurrencyLimiter` implements pydantic-ai's
  ``AbstractConcurrencyLimiter`` (``async acquire(source)`` / ``release()``)
  with a concurrency lease of rateloop's :class:`~rateloop.Limiter`, so
  ``ConcurrencyLimitedModel`` (or ``Agent(max_concurrency=...)``) shares one
  pool across processes through Redis; a crashed holder's lease expires.
- :func:`openai_provider` / :func:`anthropic_provider` are pydantic-ai
  providers whose SDK client is rateloop's ready client: every model request
  goes through the transport (admission, waits, settlement), the SDK's own
  retries off.

::

    model = ConcurrencyLimitedModel(
        OpenAIChatModel("gpt-4o-mini", provider=openai_provider(limiter=limiter)),
        limiter=RateLoopConcurrencyLimiter(limiter, route=Route(provider="openai", model="pool")),
    )

pydantic-ai's ``release()`` names no slot and may run on another task, so
leases are handed back first in, first out: any lease of the pool frees one
slot.  Install with ``pip install 'rateloop[pydantic-ai]'``.
"""

from __future__ import annotations

from typing import Any

from rateloop.integrations._held import HeldReservations
from rateloop.integrations.clients import async_anthropic_client, async_openai_client

try:
    from pydantic_ai.concurrency import AbstractConcurrencyLimiter
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "rateloop.integrations.pydantic_ai needs pydantic-ai: pip install 'rateloop[pydantic-ai]'"
    ) from exc

__all__ = ["RateLoopConcurrencyLimiter", "anthropic_provider", "openai_provider"]


class RateLoopConcurrencyLimiter(HeldReservations, AbstractConcurrencyLimiter):
    """pydantic-ai's concurrency limiter over a rateloop :class:`~rateloop.Limiter`.

    ``route`` names the pool: configure ``LimitSpec(concurrency=N)`` on its
    scope (or a broader one).  ``cost`` defaults to one request and no
    tokens: token accounting is the transport's job.  ``deadline`` bounds a
    wait (seconds), after which :class:`~rateloop.AdmissionTimeout` is raised.
    """

    def __repr__(self) -> str:
        return f"RateLoopConcurrencyLimiter(route={self.route.scope!r}, held={self.held})"

    @property
    def held(self) -> int:
        """Slots acquired and not yet released by this limiter."""
        return self._count()

    async def acquire(self, source: str) -> None:
        reservation = await self.limiter.areserve(
            self.route, self.cost, priority=self.priority, deadline=self.deadline
        )
        self._hold(reservation)

    def release(self) -> None:
        reservation = self._oldest()
        if reservation is not None:
            # The request stays counted; only the lease (and unused tokens) go back.
            reservation.release()


def openai_provider(**kwargs: Any) -> Any:
    """``pydantic_ai.providers.openai.OpenAIProvider`` over :func:`rateloop.async_openai_client`.

    Takes the OpenAI SDK's arguments plus ``policy=`` / ``limiter=`` / ``loop=``.
    """
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIProvider(openai_client=async_openai_client(**kwargs))


def anthropic_provider(**kwargs: Any) -> Any:
    """``pydantic_ai.providers.anthropic.AnthropicProvider`` over the ready async client."""
    from pydantic_ai.providers.anthropic import AnthropicProvider

    return AnthropicProvider(anthropic_client=async_anthropic_client(**kwargs))
