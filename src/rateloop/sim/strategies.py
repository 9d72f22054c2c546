"""The strategies compared by ``rateloop simulate``: three baselines and rateloop itself.

The baselines are *models of the peers' documented behaviour*, written in a few
lines each against the same fake provider and the same virtual clock -- not
the peers' code (``bench/sim_crosscheck.py`` runs the real SDKs):

- ``immediate``: retry at once on any failure, up to 10 attempts (the naive loop).
- ``sdk``: the OpenAI / Anthropic Python SDKs' built-in retries as their source
  reads (``_base_client.py``): 2 retries on 408/409/429/5xx and connection
  errors; honour ``retry-after-ms`` / ``retry-after`` when 0 < it <= 120 s
  and do not retry at all above that; otherwise ``min(0.5 × 2^n, 8)`` s
  reduced by up to 25 % at random.
- ``litellm``: ``litellm.acompletion(num_retries=2)`` as LiteLLM's source reads
  (1.110, ``main.py`` / ``utils.py``): the OpenAI client with ``max_retries=2``
  (the ``sdk`` model above); when that raises, LiteLLM's own wrapper
  (``acompletion_with_retries``) tries 2 more times with the client's retries
  off: at once, then after 1 s (``wait_exponential(multiplier=1, max=10)``)
  if the error was a 429, at once otherwise.
- ``tenacity``: the OpenAI cookbook's recipe ("How to handle rate limits"):
  ``@retry(wait=wait_random_exponential(min=1, max=60), stop=stop_after_attempt(6))``
  -- a uniform wait between 1 s and ``min(60, 2^(n-1))`` s, on any error.

and rateloop, with the real :class:`~rateloop.AsyncRateLoop` and
:class:`~rateloop.admission.Limiter`:

- ``rateloop``: the provider's limits configured (``[limits]`` in the policy),
  one shared limiter per budget (Redis in production; its memory twin here).
- ``rateloop-zero``: nothing configured: default policy, a limiter that only
  learns from the provider's answers.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any

from rateloop.admission import Limiter, LimitSpec
from rateloop.admission.backends.memory import MemoryBackend
from rateloop.loop.drivers import AsyncRateLoop
from rateloop.policy import Policy
from rateloop.route import Cost, Route
from rateloop.sim.vtime import VirtualClock
from rateloop.sim.workload import CallSpec
from rateloop.testing import FakeProvider, FakeRequest, FakeResponse

__all__ = ["STRATEGIES", "CallResult", "SimContext", "Strategy", "make_caller"]


@dataclass(frozen=True, slots=True)
class CallResult:
    ok: bool
    attempts: int
    status: str


@dataclass(slots=True)
class SimContext:
    """What a strategy's callers share in one run."""

    provider: FakeProvider
    clock: VirtualClock
    rng: random.Random
    configured: LimitSpec | None  # what rateloop is told (may differ from the provider)
    route: Route
    attempts_log: list[tuple[float, bool]] = field(default_factory=list)
    shared_backend: MemoryBackend | None = None
    #: A request reaches the provider a uniform random 0..``transit`` seconds after it is
    #: sent (drawn from ``transit_rng``, not ``rng``: the baselines' jitter is unchanged).
    transit: float = 0.0
    transit_rng: random.Random = field(default_factory=lambda: random.Random(0))
    _limiters: dict[int, Limiter] = field(default_factory=dict)

    async def attempt(self, call: CallSpec) -> FakeResponse:
        if self.transit > 0:
            # No real request lands on the instant it was planned for: the client's own
            # work and the network put a few varying milliseconds between the two.  A
            # simulation without them hits a provider's bucket edges exactly (a call that
            # leaves it with 0.0 tokens, never 0.3), which real clients never do.
            await asyncio.sleep(self.transit_rng.uniform(0.0, self.transit))
        response = await self.provider.arespond(FakeRequest(
            input_tokens=call.input_tokens, max_tokens=call.max_tokens,
            output_tokens=call.output_tokens,
        ))
        self.attempts_log.append((self.clock.monotonic(), response.ok))
        return response


@dataclass(frozen=True, slots=True)
class Strategy:
    name: str
    label: str
    is_model: bool  # a model of a peer's documented behaviour (not rateloop itself)


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy("immediate", "immediate retry*", True),
        Strategy("sdk", "SDK retries*", True),
        Strategy("tenacity", "tenacity recipe*", True),
        Strategy("litellm", "LiteLLM retries*", True),
        Strategy("rateloop", "rateloop", False),
        Strategy("rateloop-zero", "rateloop zero-config", False),
    )
}

Caller = Callable[[CallSpec], Awaitable[CallResult]]


def _failed(response: FakeResponse) -> bool:
    return response.reset or not response.ok


def _retry_after(response: FakeResponse, now: datetime) -> float | None:
    """The SDKs' reading: ``retry-after-ms``, else ``retry-after`` (seconds or an HTTP date)."""
    headers = response.headers
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            return float(raw_ms) / 1000
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        try:
            return (parsedate_to_datetime(raw) - now).total_seconds()
        except (TypeError, ValueError):
            return None


def _immediate(ctx: SimContext) -> Caller:
    async def call(spec: CallSpec) -> CallResult:
        for n in range(1, 11):
            if not _failed(await ctx.attempt(spec)):
                return CallResult(True, n, "completed")
        return CallResult(False, 10, "gave up after 10 attempts")

    return call


async def _sdk_call(ctx: SimContext, spec: CallSpec) -> tuple[CallResult, FakeResponse]:
    """One call through the SDK's retries: the result and the last response."""
    max_retries = 2
    for n in range(max_retries + 1):
        response = await ctx.attempt(spec)
        if not _failed(response):
            return CallResult(True, n + 1, "completed"), response
        status = response.status_code
        retryable = response.reset or status in (408, 409, 429) or status >= 500
        after = None if response.reset else _retry_after(response, ctx.clock.now())
        if after is not None and after > 120:
            return CallResult(False, n + 1, "retry-after beyond 120 s: not retried"), response
        if not retryable or n == max_retries:
            return CallResult(False, n + 1, f"raised after {n + 1} attempts"), response
        if after is not None and 0 < after <= 120:
            wait = after
        else:
            wait = min(0.5 * 2.0**n, 8.0) * (1 - 0.25 * ctx.rng.random())
        await ctx.clock.asleep(wait)
    raise AssertionError("unreachable")


def _sdk(ctx: SimContext) -> Caller:
    async def call(spec: CallSpec) -> CallResult:
        result, _ = await _sdk_call(ctx, spec)
        return result

    return call


def _litellm(ctx: SimContext) -> Caller:
    num_retries = 2

    async def call(spec: CallSpec) -> CallResult:
        result, last = await _sdk_call(ctx, spec)
        if result.ok:
            return result
        # The wrapper's tenacity: exponential (1 s, 2 s, ...) after a RateLimitError,
        # no wait after any other error; the strategy is chosen by the client's error.
        rate_limited = not last.reset and last.status_code == 429
        attempts = result.attempts
        for n in range(1, num_retries + 1):
            attempts += 1
            if not _failed(await ctx.attempt(spec)):
                return CallResult(True, attempts, "completed")
            if n < num_retries and rate_limited:
                await ctx.clock.asleep(min(2.0 ** (n - 1), 10.0))
        return CallResult(False, attempts, f"raised after {attempts} attempts")

    return call


def _tenacity(ctx: SimContext) -> Caller:
    stop_after = 6

    async def call(spec: CallSpec) -> CallResult:
        for n in range(1, stop_after + 1):
            if not _failed(await ctx.attempt(spec)):
                return CallResult(True, n, "completed")
            if n == stop_after:
                break
            high = max(1.0, min(2.0 ** (n - 1), 60.0))
            await ctx.clock.asleep(ctx.rng.uniform(1.0, high))
        return CallResult(False, stop_after, "RetryError after 6 attempts")

    return call


def _limiter(ctx: SimContext, group: int, *, configured: bool) -> Limiter:
    if group in ctx._limiters:
        return ctx._limiters[group]
    scope = ctx.route.provider_scope
    limits = {scope: ctx.configured} if configured and ctx.configured is not None else {}
    if configured:
        # One budget for every process: the shared backend (Redis in production).
        if ctx.shared_backend is None:
            ctx.shared_backend = MemoryBackend(ctx.clock)
        limiter = Limiter(ctx.shared_backend, limits=limits, clock=ctx.clock,
                          rng=random.Random(ctx.rng.random()))
    else:
        # Zero-config: each process learns on its own.
        limiter = Limiter(limits=limits, clock=ctx.clock, rng=random.Random(ctx.rng.random()))
    ctx._limiters[group] = limiter
    return limiter


def _rateloop(ctx: SimContext, group: int, *, configured: bool) -> Caller:
    limiter = _limiter(ctx, group, configured=configured)
    rng = random.Random(ctx.rng.random())
    loop = AsyncRateLoop(Policy(), limiter=limiter, clock=ctx.clock, rng=rng.random)

    async def call(spec: CallSpec) -> CallResult:
        async def attempt(route: Route) -> Any:
            response = await ctx.attempt(spec)
            if response.reset:
                raise ConnectionResetError("the fake provider reset the connection")
            return response

        outcome = await loop.call(
            attempt, route=ctx.route,
            cost=Cost(input_tokens=spec.input_tokens, output_tokens=spec.max_tokens),
        )
        return CallResult(outcome.ok, outcome.attempts.loop, outcome.status.value)

    return call


def make_caller(name: str, ctx: SimContext, group: int) -> Caller:
    """The caller of strategy ``name`` for the simulated process ``group``."""
    if name == "immediate":
        return _immediate(ctx)
    if name == "sdk":
        return _sdk(ctx)
    if name == "tenacity":
        return _tenacity(ctx)
    if name == "litellm":
        return _litellm(ctx)
    if name == "rateloop":
        return _rateloop(ctx, group, configured=True)
    if name == "rateloop-zero":
        return _rateloop(ctx, group, configured=False)
    raise ValueError(f"unknown strategy {name!r}; allowed: {', '.join(STRATEGIES)}")
