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
calls finish out of order.

Zero-config, as every door (:mod:`rateloop.integrations._assemble`): without
a limiter it gets the self-learning limiter, and the usage callback teaches
it what the provider said -- the rate-limit headers of each answer (the
model must report them: ``ChatOpenAI(include_response_headers=True)``) and
each refusal (a 429 pauses the scope for the server's minimum).  While the
route's limits are unknown, one call goes alone and the others wait for its
answer (first contact); an answer that teaches nothing hands the turn to the
next call, so calls go one at a time until headers or a refusal state the
limits.  The model's own SDK retries are not ours to turn off: build it with
``max_retries=0``.  Install with
``pip install 'rateloop[langchain]'``.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping
from typing import Any

from rateloop._clock import Clock, system_clock
from rateloop.admission import Reservation
from rateloop.errors import LimitsWarning
from rateloop.integrations._assemble import admission, learn_from_answer, learn_from_refusal
from rateloop.integrations._held import HeldReservations
from rateloop.integrations._probe import FirstContact, Role
from rateloop.policy import Policy
from rateloop.route import Cost, Route

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

    ``limiter`` defaults to the self-learning limiter of ``policy`` (on
    ``clock``), as for every door.  ``cost`` is what one call is expected to
    spend (requests, prompt tokens, output ceiling); it is reserved before
    the call and corrected by the usage callback after it.  ``deadline``
    bounds a blocking wait (seconds); past it :class:`~rateloop.AdmissionTimeout`
    is raised rather than waiting.  ``probe_timeout`` bounds the wait for the
    first call on a route whose limits are unknown.
    """

    def __init__(
        self,
        limiter: Any = None,
        *,
        route: Route,
        cost: Cost | None = None,
        priority: str = "interactive",
        deadline: float | None = None,
        policy: Policy | None = None,
        clock: Clock | None = None,
        probe_timeout: float = 120.0,
    ) -> None:
        parts = admission(policy=policy, limiter=limiter, clock=clock)
        super().__init__(
            parts.limiter, route=route, cost=cost, priority=priority, deadline=deadline
        )
        self.clock: Clock = clock if clock is not None else system_clock
        self.probe_timeout = probe_timeout
        self._first_contact = FirstContact()
        # First contact waits for a call's end, which only the usage callback sees.
        self._told = threading.Event()
        self._warned_blind = False

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

    def _role(self) -> Role:
        if not self._told.is_set():
            return "go"
        return self._first_contact.role(self.route, self.limiter)

    def _unknown(self) -> bool:
        return all(self.limiter.limits_for(scope) is None for scope in self.route.scopes)

    def answered(self, response: Any) -> None:
        """A call ended with ``response`` (an ``LLMResult``): learn from its headers."""
        headers = _headers_of(response)
        if headers is not None:
            learn_from_answer(self.limiter, self.route, headers)
        unknown = self._unknown()
        # The gate opens (or passes to the next probe) before anything else can raise.
        self._first_contact.finish(self.route, learned=not unknown)
        if headers is None and unknown and not self._warned_blind:
            self._warned_blind = True
            warnings.warn(
                f"calls on the route {self.route.scope} go one at a time: no limits are "
                "configured for it and the model's answers carry no rate-limit headers to "
                "learn them from (ChatOpenAI: include_response_headers=True), so the "
                "rate limiter lets one call probe at a time until a refusal states them",
                LimitsWarning,
                stacklevel=2,
            )

    def refused(self, error: BaseException) -> None:
        """A call failed with ``error``: learn from it (a 429 pauses the scope)."""
        learn_from_refusal(self.limiter, self.route, error, self.clock.now())
        self._first_contact.finish(self.route, learned=not self._unknown())

    def _turn(self, blocking: bool) -> Role | None:
        """This call's first-contact role once it may go; None: it may not (non-blocking)."""
        role = self._role()
        while role == "wait":
            if not blocking:
                return None
            if not self._first_contact.wait(self.route, self.probe_timeout):
                return "go"  # a probe that hangs holds nobody forever
            role = self._role()  # the probe taught nothing: one more goes alone
        return role

    async def _aturn(self, blocking: bool) -> Role | None:
        role = self._role()
        while role == "wait":
            if not blocking:
                return None
            if not await self._first_contact.await_probe(self.route, self.probe_timeout):
                return "go"
            role = self._role()
        return role

    def acquire(self, *, blocking: bool = True) -> bool:
        role = self._turn(blocking)
        if role is None:
            return False
        try:
            if blocking:
                reservation = self.limiter.reserve(
                    self.route, self.cost, priority=self.priority, deadline=self.deadline
                )
                return self._keep(reservation)
            granted = self.limiter.try_reserve(self.route, self.cost, priority=self.priority)
            if isinstance(granted, Reservation):
                return self._keep(granted)
        except BaseException:
            self._not_sent(role)
            raise
        self._not_sent(role)
        return False

    async def aacquire(self, *, blocking: bool = True) -> bool:
        role = await self._aturn(blocking)
        if role is None:
            return False
        try:
            if blocking:
                reservation = await self.limiter.areserve(
                    self.route, self.cost, priority=self.priority, deadline=self.deadline
                )
                return self._keep(reservation)
            granted = await self.limiter.atry_reserve(
                self.route, self.cost, priority=self.priority
            )
            if isinstance(granted, Reservation):
                return self._keep(granted)
        except BaseException:
            self._not_sent(role)
            raise
        self._not_sent(role)
        return False

    def _not_sent(self, role: Role) -> None:
        # A probe that never went (no capacity, an error) lets the waiters go at once.
        if role == "probe":
            self._first_contact.finish(self.route)

    def usage_callback(self) -> UsageSettler:
        """The callback handler that settles this limiter's reservations after each call.

        It also tells the limiter what each answer and refusal said; from the
        moment it exists, the first call on a route whose limits are unknown
        goes alone (it ends the probe when that call ends).
        """
        self._told.set()
        return UsageSettler(self)


def _headers_of(response: Any) -> Mapping[str, str] | None:
    """The HTTP headers an ``LLMResult`` carries (``generation_info`` / ``response_metadata``)."""
    for generations in getattr(response, "generations", None) or []:
        for generation in generations[:1]:
            places = (
                getattr(generation, "generation_info", None),
                getattr(getattr(generation, "message", None), "response_metadata", None),
            )
            for place in places:
                headers = place.get("headers") if isinstance(place, Mapping) else None
                if isinstance(headers, Mapping) and headers:
                    return {str(k).lower(): str(v) for k, v in headers.items()}
    return None


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
        if reservation is not None:
            usage = _usage_of(response)
            if usage is None:
                # Nothing reported: keep the estimate (the request and its tokens stay counted).
                usage = (reservation.cost.input_tokens, reservation.cost.output_tokens)
            reservation.settle(*usage)
        self.limiter.answered(response)

    def on_llm_error(self, error: BaseException, **kwargs: Any) -> None:
        reservation = self.limiter.take_oldest()
        if reservation is not None:
            reservation.release()
        self.limiter.refused(error)
