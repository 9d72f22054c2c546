"""The driver shared by the httpx and httpx2 transports, sync and async.

How it works: a transport is one more performer of the RATE loop's effect
generator (:mod:`rateloop.loop`), not a second copy of it.  For each
request it reads the loop's view of the call (:func:`read_request`: route,
cost, model call or not), then runs the loop with an *attempt* — a callable
that sends the request through the inner transport — as the loop's ``fn``:

1. **Admit**: the loop reserves the cost on the route's scopes before each
   attempt and waits for capacity as the policy allows (on a scope the
   limiter knows nothing about, a few requests go first and the others wait
   for an answer, which teaches the limits: the limiter's cold start).
2. **Attempt**: the inner transport sends the request.  A ``2xx`` event
   stream is handed over after its status and headers (its body belongs to
   the caller and is never replayed); every other body is read in full,
   within :class:`~rateloop.integrations._body.BodyBudget`'s cap and
   deadlines, so a ``200`` carrying an error envelope is a refusal and the
   usage can be settled.
3. **Read, settle, time**: the loop classifies the response (success
   headers feed ``observe``), settles the reservation from the body's
   ``usage`` and decides: done, wait and retry, or stop.  A stream's
   reservation is not settled there: the loop's public ``keep_reservation``
   hook (:func:`_keeps_stream`) hands it to the stream, which settles it from the
   usage it saw when it closes, or releases it when it is abandoned or its
   task is cancelled (:mod:`rateloop.integrations._stream`).
4. **Exit**: a ``completed`` outcome returns the response; any other returns
   the provider's last response (so the SDK raises its own exception) with
   the outcome in ``response.extensions["rateloop_outcome"]``; with no
   response, the last network error is raised again (outcome on its
   ``rateloop_outcome`` attribute), and when nothing was sent at all,
   :class:`AdmissionRefused`.

The sync and async classes differ only in how they send, read and sleep.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rateloop._clock import Clock, system_clock
from rateloop.classify import classify_exception
from rateloop.errors import RateLimitExhausted
from rateloop.integrations._assemble import admission
from rateloop.integrations._body import (
    DEFAULT_MAX_BODY_BYTES,
    BodyBudget,
    BodyTooLarge,
    envelope_error,
    signal_of_error_text,
)
from rateloop.integrations._request import RequestPlan, body_at_tier, read_request
from rateloop.integrations._stream import (
    AsyncStreamBody,
    StreamHold,
    StreamInterrupted,
    SyncStreamBody,
)
from rateloop.loop.drivers import AsyncRateLoop, CallOptions, RateLoop
from rateloop.outcome.events import EventSink
from rateloop.outcome.record import Outcome
from rateloop.policy import Policy
from rateloop.route import Route
from rateloop.signal import LimitSignal

__all__ = [
    "OUTCOME_KEY",
    "TRANSPORT_ERROR_ATTEMPTS",
    "AdmissionRefused",
    "AsyncStreamBody",
    "StreamInterrupted",
    "SyncStreamBody",
    "TransportBase",
    "admission_refusal",
    "transport_policy",
]

#: Where a response carries its outcome: ``response.extensions[OUTCOME_KEY]``.
OUTCOME_KEY = "rateloop_outcome"

#: The transport's bound on attempts ending in a network error, a 5xx or an
#: overload when the policy leaves ``max_error_attempts`` unset: counted apart
#: from the 429 budget (``max_attempts`` 20 from the first, 600 s from the first
#: refusal), so neither kind of failure spends the other's attempts.
TRANSPORT_ERROR_ATTEMPTS = 5


def transport_policy(policy: Policy | None) -> Policy:
    """``policy`` (default: ``Policy()``) with the transport's separate error bound filled in.

    >>> transport_policy(None).max_error_attempts, transport_policy(None).max_attempts
    (5, 20)
    >>> transport_policy(Policy(max_error_attempts=2)).max_error_attempts
    2
    """
    policy = Policy() if policy is None else policy
    if policy.max_error_attempts is not None:
        return policy
    return dataclasses.replace(policy, max_error_attempts=TRANSPORT_ERROR_ATTEMPTS)


class AdmissionRefused(RateLimitExhausted):
    """rateloop's own admission refused the request: nothing was sent to the provider.

    Distinct from a provider's refusal (which reaches the caller as the SDK's own
    exception): ``outcome.status`` is ``waiting_for_capacity`` (no capacity
    before the budget or deadline; ``outcome.retry_at`` says when) or
    ``rejected`` (the cost can never fit the configured limits).  Through a
    ready client it reaches the caller as itself, whatever the SDK; an
    Anthropic 2.x client built by hand around the transport wraps it in its
    connection error (as ``__cause__``), and :func:`admission_refusal` finds
    it in either case.
    """


def admission_refusal(error: BaseException | None) -> AdmissionRefused | None:
    """The :class:`AdmissionRefused` behind ``error`` (itself or a cause), if any."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, AdmissionRefused):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


class _EnvelopeFailure(Exception):
    """A 200 response whose JSON body is an error: a refusal for the loop."""

    def __init__(self, response: Any, signal: LimitSignal) -> None:
        self.response = response
        self.signal = signal
        super().__init__(f"error envelope in a 200 response: {signal.kind.value}")


@dataclass(frozen=True, slots=True, kw_only=True)
class _Settings:
    enabled: bool
    max_body_bytes: int
    first_byte_timeout: float
    idle_timeout: float

# --- one request through the loop ------------------------------------------------------


class _Attempt:
    """One request's state across the loop's attempts; the loop's ``fn``."""

    def __init__(self, owner: TransportBase, request: Any, plan: RequestPlan) -> None:
        self.owner = owner
        self.request = request
        self.plan = plan
        self.last_response: Any = None
        self.last_error: BaseException | None = None
        self.stream: StreamHold | None = None
        # The client's own timeouts: each attempt starts from them (limit_reads narrows a copy).
        self._timeouts = request.extensions.get("timeout")
        self._content: bytes = request.content  # as the client wrote it (read by the owner)

    def prepare(self, route: Route) -> None:
        """Start an attempt from the client's timeouts and its body at ``route``'s tier."""
        if self._timeouts is not None:
            self.request.extensions["timeout"] = self._timeouts
        if not self.plan.model_call:
            return
        # The ladder moves a call between service tiers: the request body says which.
        content = body_at_tier(self._content, route.provider, route.tier) or self._content
        if content != self.request.content:
            old = self.request
            headers = [(k, v) for k, v in old.headers.multi_items() if k != "content-length"]
            self.request = self.owner.hx.Request(old.method, old.url, headers=headers,
                                                 content=content, extensions=old.extensions)

    def sent(self, response: Any) -> bool:
        """Record a response with its headers; True when its body is a stream to hand over."""
        self.stream = None
        self.last_response, self.last_error = response, None
        kind = response.headers.get("content-type", "")
        return bool(200 <= response.status_code < 300 and kind.startswith("text/event-stream"))

    def failed(self, error: BaseException) -> None:
        self.stream = None
        self.last_response, self.last_error = None, error

    def buffered(self, response: Any, budget: BodyBudget) -> Any:
        """The response rebuilt around its read body; raises on an error envelope."""
        hx = self.owner.hx
        rebuilt = hx.Response(
            response.status_code,
            headers=response.headers,
            content=budget.content(),
            extensions=dict(response.extensions),
            request=self.request,
        )
        self.last_response = rebuilt
        if rebuilt.status_code == 200 and rebuilt.headers.get("content-type", "").startswith(
            "application/json"
        ):
            try:
                data = rebuilt.json()
            except ValueError:
                data = None
            if envelope_error(data):
                text = rebuilt.text[:4096]
                raise _EnvelopeFailure(rebuilt, signal_of_error_text(text))
        return rebuilt

    def budget(self) -> BodyBudget:
        s = self.owner.settings
        return BodyBudget(
            max_bytes=s.max_body_bytes,
            first_byte_secs=s.first_byte_timeout,
            idle_secs=s.idle_timeout,
        )

    def limit_reads(self, limit: float) -> None:
        """Bound each socket read of the body by ``limit`` seconds.

        httpcore reads the read timeout from the request's extensions when the
        body starts, so setting it after the headers bounds the body only —
        with one value for every read: the sync reader passes the smaller of
        the two deadlines, the async one (which also times each chunk) the larger.
        """
        timeouts = dict(self.request.extensions.get("timeout") or {})
        current = timeouts.get("read")
        timeouts["read"] = limit if current is None else min(float(current), limit)
        self.request.extensions["timeout"] = timeouts

    def stalled(self, budget: BodyBudget, cause: BaseException) -> BaseException:
        """The network error a body that broke its cap or deadline becomes (the SDK maps it)."""
        hx = self.owner.hx
        if isinstance(cause, BodyTooLarge):
            error: BaseException = hx.ReadError(str(cause), request=self.request)
        else:
            error = hx.ReadTimeout(budget.stall_message(), request=self.request)
        self.failed(error)
        return error

    def finish(self, outcome: Outcome) -> Any:
        """What the transport hands back to the client for ``outcome``."""
        response = outcome.value if outcome.ok else self.last_response
        if response is not None:
            response.extensions[OUTCOME_KEY] = outcome
            return response
        if self.last_error is not None:
            # No response (network failures): the SDK maps this error as it always does.
            error = self.last_error
            error.rateloop_outcome = outcome  # type: ignore[attr-defined]
            raise error
        raise AdmissionRefused(outcome)


class _SyncAttempt(_Attempt):
    def __call__(self, route: Route) -> Any:
        owner = self.owner
        self.prepare(route)
        try:
            response = owner.inner.handle_request(self.request)
        except Exception as exc:
            self.failed(exc)
            raise
        if self.sent(response):
            hold = self.stream = StreamHold(route)
            response.stream = owner.sync_stream(response.stream, hold)
            return response
        budget = self.budget()
        self.limit_reads(min(budget.first_byte_secs, budget.idle_secs))
        try:
            for chunk in response.stream:
                budget.feed(chunk)
        except (BodyTooLarge, owner.hx.TimeoutException) as exc:
            raise self.stalled(budget, exc) from exc
        finally:
            response.stream.close()
        return self.buffered(response, budget)


class _AsyncAttempt(_Attempt):
    async def __call__(self, route: Route) -> Any:
        import anyio

        owner = self.owner
        self.prepare(route)
        try:
            response = await owner.inner.handle_async_request(self.request)
        except Exception as exc:
            self.failed(exc)
            raise
        if self.sent(response):
            hold = self.stream = StreamHold(route)
            response.stream = owner.async_stream(response.stream, hold)
            return response
        budget = self.budget()
        self.limit_reads(max(budget.first_byte_secs, budget.idle_secs))
        chunks = response.stream.__aiter__()
        try:
            while True:
                with anyio.fail_after(budget.next_timeout()):
                    try:
                        chunk = await chunks.__anext__()
                    except StopAsyncIteration:
                        break
                budget.feed(chunk)
        except (BodyTooLarge, TimeoutError, owner.hx.TimeoutException) as exc:
            raise self.stalled(budget, exc) from exc
        finally:
            await response.stream.aclose()
        return self.buffered(response, budget)


# --- the loop performers ---------------------------------------------------------------


def _keeps_stream(fn: object, reservation: Any) -> bool:
    """The loop's ``keep_reservation`` hook: a stream takes its attempt's reservation.

    It settles the reservation from the usage it saw when it closes, or
    releases it when it is abandoned (:mod:`rateloop.integrations._stream`).
    Any other successful attempt is settled by the loop as usual.
    """
    if isinstance(fn, _Attempt) and fn.stream is not None:
        fn.stream.hold(reservation)
        return True
    return False


# --- the transport base ----------------------------------------------------------------


class TransportBase:
    """Configuration shared by the four transports (httpx / httpx2, sync / async).

    Subclasses set ``hx`` (the httpx-like module), the stream classes, and
    ``is_async``.
    """

    hx: Any
    is_async: bool
    sync_stream: type[Any]
    async_stream: type[Any]

    def __init__(
        self,
        transport: Any = None,
        *,
        policy: Policy | None = None,
        limiter: Any = None,
        loop: RateLoop | AsyncRateLoop | None = None,
        clock: Clock | None = None,
        sinks: Sequence[EventSink] | None = None,
        enabled: bool = True,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        first_byte_timeout: float = 60.0,
        idle_timeout: float = 30.0,
    ) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be True or False, got {enabled!r}")
        for name, value in (
            ("first_byte_timeout", first_byte_timeout),
            ("idle_timeout", idle_timeout),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
        if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or (
            max_body_bytes < 1
        ):
            raise ValueError(f"max_body_bytes must be an int >= 1, got {max_body_bytes!r}")
        if loop is not None and not isinstance(loop, RateLoop | AsyncRateLoop):
            raise TypeError(f"loop must be a RateLoop or AsyncRateLoop, got {loop!r}")
        if loop is not None and (policy is not None or limiter is not None or clock is not None):
            raise TypeError("pass either loop= or policy=/limiter=/clock=, not both")
        if transport is None:
            transport = self.hx.AsyncHTTPTransport() if self.is_async else self.hx.HTTPTransport()
        self.inner = transport
        self.settings = _Settings(
            enabled=enabled,
            max_body_bytes=max_body_bytes,
            first_byte_timeout=float(first_byte_timeout),
            idle_timeout=float(idle_timeout),
        )
        # The transport runs a plain loop: the stream's hand-over is the public
        # ``keep_reservation`` hook and the envelope reading a ``classify`` (no override).
        driver = AsyncRateLoop if self.is_async else RateLoop
        if loop is not None:
            self.loop: RateLoop | AsyncRateLoop = driver.like(
                loop,
                policy=transport_policy(loop.policy),
                classify=self._classifier(loop.classify, loop.clock),
                keep_reservation=_keeps_stream,
            )
        else:
            # Every door's defaults (the self-learning limiter) come from one builder.
            parts = admission(policy=policy, limiter=limiter, clock=clock)
            self.loop = driver(
                transport_policy(parts.policy),
                limiter=parts.limiter,
                clock=clock,
                sinks=sinks,
                classify=self._classifier(None, clock if clock is not None else system_clock),
                keep_reservation=_keeps_stream,
            )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(inner={type(self.inner).__name__}, "
            f"limiter={type(self.loop.limiter).__name__ if self.loop.limiter else None}, "
            f"enabled={self.enabled})"
        )

    @property
    def enabled(self) -> bool:
        """False when the ``enabled=`` argument or the policy's ``enabled`` turns the loop off."""
        return self.settings.enabled and self.loop.policy.enabled

    @property
    def limiter(self) -> Any:
        return self.loop.limiter

    @property
    def policy(self) -> Policy:
        return self.loop.policy

    @staticmethod
    def _classifier(
        user: Callable[[BaseException], LimitSignal] | None, clock: Clock
    ) -> Callable[[BaseException], LimitSignal]:
        def classify(error: BaseException) -> LimitSignal:
            if isinstance(error, _EnvelopeFailure):
                return error.signal
            if user is not None:
                return user(error)
            return classify_exception(error, now=clock.now())

        return classify

    def _plan(self, request: Any) -> RequestPlan:
        return read_request(request.method, str(request.url), request.headers, request.content)

    def _send_sync(self, request: Any) -> Any:
        if not self.enabled:  # the request runs exactly once, as if we were not here
            return self.inner.handle_request(request)
        request.read()  # the body is sent again on a retry, and read for the cost
        plan = self._plan(request)
        attempt = _SyncAttempt(self, request, plan)
        loop = self.loop
        assert isinstance(loop, RateLoop)
        outcome = loop.call(attempt, route=plan.route, **self._options(plan))
        return attempt.finish(outcome)

    async def _send_async(self, request: Any) -> Any:
        if not self.enabled:  # the request runs exactly once, as if we were not here
            return await self.inner.handle_async_request(request)
        await request.aread()
        plan = self._plan(request)
        attempt = _AsyncAttempt(self, request, plan)
        loop = self.loop
        assert isinstance(loop, AsyncRateLoop)
        outcome = await loop.call(attempt, route=plan.route, **self._options(plan))
        return attempt.finish(outcome)

    def _options(self, plan: RequestPlan) -> CallOptions:
        # The transport cannot rewrite a request for another model: no fallbacks here.
        return CallOptions(
            cost=plan.cost, operation=plan.operation, idempotent=plan.idempotent, fallbacks=()
        )
