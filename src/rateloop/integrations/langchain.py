"""LangChain: a ``BaseRateLimiter`` backed by rateloop's :class:`~rateloop.Limiter`.

LangChain chat models take ``rate_limiter=`` and call ``acquire`` /
``aacquire(blocking=...)`` before each request.  :class:`RateLoopRateLimiter`
reserves the call's estimated :class:`~rateloop.Cost` on a
:class:`~rateloop.Route` there, so every process sharing the limiter's
backend (Redis) shares the capacity.  LangChain never says when the call
ended, so :meth:`RateLoopRateLimiter.usage_callback` returns the callback
handler that does: on ``on_llm_end`` it settles the oldest open reservation
with the usage the model reported (``usage_metadata`` or
``llm_output["token_usage"]``), on ``on_llm_error`` it releases it::

    limiter = RateLoopRateLimiter(Limiter.from_url("redis://..."), route=route, cost=cost)
    model = ChatOpenAI(rate_limiter=limiter, callbacks=[limiter.usage_callback()])

Reservations are paired with completions first in, first out: tokens are
interchangeable inside a scope, so the total settled is right even when
calls finish out of order.  Install with ``pip install 'rateloop[langchain]'``.
"""

from __future__ import annotations

from typing import Any

from rateloop.admission import Reservation
from rateloop.integrations._held import HeldReservations

try:
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.rate_limiters import BaseRateLimiter
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "rateloop.integrations.langchain needs langchain-core: pip install 'rateloop[langchain]'"
    ) from exc

__all__ = ["RateLoopRateLimiter", "UsageSettler"]


class RateLoopRateLimiter(HeldReservations, BaseRateLimiter):
    """LangChain's rate limiter interface over a rateloop :class:`~rateloop.Limiter`.

    ``cost`` is what one call is expected to spend (requests, prompt tokens,
    output ceiling); it is reserved before the call and corrected by the
    usage callback after it.  ``deadline`` bounds a blocking wait (seconds);
    past it :class:`~rateloop.AdmissionTimeout` is raised rather than waiting.
    """

    def __repr__(self) -> str:
        return f"RateLoopRateLimiter(route={self.route.scope!r}, cost={self.cost!r})"

    def _keep(self, reservation: Reservation) -> bool:
        self._hold(reservation)
        return True

    def take_oldest(self) -> Reservation | None:
        """The oldest reservation not yet settled (the usage callback's side)."""
        return self._oldest()

    @property
    def open_reservations(self) -> int:
        return self._count()

    def acquire(self, *, blocking: bool = True) -> bool:
        if blocking:
            reservation = self.limiter.reserve(
                self.route, self.cost, priority=self.priority, deadline=self.deadline
            )
            return self._keep(reservation)
        granted = self.limiter.try_reserve(self.route, self.cost, priority=self.priority)
        return isinstance(granted, Reservation) and self._keep(granted)

    async def aacquire(self, *, blocking: bool = True) -> bool:
        if blocking:
            reservation = await self.limiter.areserve(
                self.route, self.cost, priority=self.priority, deadline=self.deadline
            )
            return self._keep(reservation)
        granted = await self.limiter.atry_reserve(self.route, self.cost, priority=self.priority)
        return isinstance(granted, Reservation) and self._keep(granted)

    def usage_callback(self) -> UsageSettler:
        """The callback handler that settles this limiter's reservations after each call."""
        return UsageSettler(self)


def _usage_of(response: Any) -> tuple[int, int] | None:
    """(input, output) tokens from an ``LLMResult``: message usage_metadata, else llm_output."""
    inp = out = 0
    found = False
    for generations in getattr(response, "generations", None) or []:
        for generation in generations[:1]:
            meta = getattr(getattr(generation, "message", None), "usage_metadata", None)
            if isinstance(meta, dict):
                inp += int(meta.get("input_tokens") or 0)
                out += int(meta.get("output_tokens") or 0)
                found = True
    if found:
        return inp, out
    output = getattr(response, "llm_output", None)
    usage = output.get("token_usage") or output.get("usage") if isinstance(output, dict) else None
    if isinstance(usage, dict):
        inp = int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0)
        out = int(usage.get("completion_tokens") or usage.get("output_tokens") or 0)
        return inp, out
    return None


class UsageSettler(BaseCallbackHandler):
    """Settles a :class:`RateLoopRateLimiter`'s reservations from the model's reported usage."""

    def __init__(self, limiter: RateLoopRateLimiter) -> None:
        super().__init__()
        self.limiter = limiter

    def on_llm_end(self, response: Any, **kwargs: Any) -> None:
        reservation = self.limiter.take_oldest()
        if reservation is None:
            return
        usage = _usage_of(response)
        if usage is None:
            # Nothing reported: keep the estimate (the request and its tokens stay counted).
            usage = (reservation.cost.input_tokens, reservation.cost.output_tokens)
        reservation.settle(*usage)

    def on_llm_error(self, error: BaseException, **kwargs: Any) -> None:
        reservation = self.limiter.take_oldest()
        if reservation is not None:
            reservation.release()
