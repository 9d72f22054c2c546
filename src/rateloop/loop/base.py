"""The RATE loop's configuration, shared by both drivers: :class:`_LoopConfig`.

It holds what a loop is built with (checked by :mod:`rateloop.loop.args`),
the public ways to derive a loop from another (:meth:`_LoopConfig.like`,
:meth:`_LoopConfig.replace`), and the small services the flow calls back
into: classifying a result, emitting an event, the one-time warnings, and
turning an outcome into an exception.  What every call starts from (the
backoff, the budget's bounds, a route's spec and chain) is checked and built
once per policy, in :class:`_Prepared`, not on every call.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self, Unpack

from rateloop._clock import Clock, system_clock
from rateloop.classify import classify_exception, classify_response
from rateloop.errors import LimitsWarning, RateLimitExhausted, SdkRetriesWarning
from rateloop.loop.args import (
    CallOptions,
    CallSpec,
    Classifier,
    KeepReservation,
    LoopOptions,
    call_spec,
    check_classify,
    check_clock,
    check_keep_reservation,
    check_limiter,
    check_policy,
    check_rng,
    check_run,
    check_sinks,
    takes_call_labels,
)
from rateloop.loop.effects import Raised, Returned
from rateloop.outcome.console import ConsoleSink
from rateloop.outcome.events import CapacityEvent, EventSink
from rateloop.outcome.record import Outcome, Status
from rateloop.policy import Policy
from rateloop.route import Route
from rateloop.signal import Kind, LimitSignal
from rateloop.timing.backoff import Backoff
from rateloop.timing.budget import CallBudget, RunBudget
from rateloop.timing.ladder import Ladder, ladder_chain

__all__ = ["Classifier", "KeepReservation", "LoopOptions"]

# Outcomes about the request itself, not capacity: the caller gets the provider's own exception.
_NOT_CAPACITY = frozenset({Kind.INVALID, Kind.PERMISSION})

#: A success with nothing to read in it: one value, shared by every such call.
_OK = LimitSignal.of(Kind.OK)

#: How many routes' specs and chains a loop keeps (a loop serves a handful; the bound
#: only keeps a loop that sees endless distinct routes from growing without end).
_CACHED_ROUTES = 256

#: A call's chain of routes, the rung of each, and its ladder (``ladder_chain``).
Chain = tuple[tuple[Route, ...], tuple[str, ...], Ladder | None]

#: Frames between a warning raised for the flow and the caller of ``loop.call``:
#: the warning helper, the flow's step (a sub-generator), the flow, the driver.
_CALLER_STACKLEVEL = 5


def _default_sinks(clock: Clock) -> tuple[EventSink, ...]:
    """A person at a terminal sees progress; a library's non-interactive use prints nothing."""
    try:
        tty = sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stderr
        tty = False
    return (ConsoleSink(clock=clock),) if tty else ()


class _Prepared:
    """What every call of a loop starts from, built once per policy: checked once, immutable.

    The backoff, a template of the call budget (each call takes a fresh copy),
    the checked spec of a call made with no options, per route, and each
    route's chain (routes, rungs, ladder).  All are values the calls share
    and never change; the loop rebuilds this when its policy, rng or run
    budget is another object.
    """

    __slots__ = ("backoff", "budget", "chains", "enabled", "last", "policy", "rng", "run", "specs")

    def __init__(
        self, policy: Policy, rng: Callable[[], float] | None, run: RunBudget | None
    ) -> None:
        self.policy, self.rng, self.run = policy, rng, run
        # enabled = false: the loop steps aside; one attempt, no admission, no wait.
        self.enabled = on = policy.enabled
        self.backoff: Backoff = policy.backoff(rng=rng)
        self.budget = CallBudget(
            max_attempts=policy.max_attempts if on else 1,
            recovery_budget_secs=policy.recovery_budget_secs,
            max_error_attempts=policy.max_error_attempts if on else 1,
            started_at=0.0,
            max_wait_secs=policy.max_wait_secs,
            run=run,
        )
        self.specs: dict[Route, CallSpec] = {}
        self.chains: dict[tuple[Route, tuple[Route, ...], str], Chain] = {}
        # The last option-less call's route, spec and chain: the same Route object again
        # (the usual case) is recognised by identity, without hashing its nine fields.
        self.last: tuple[Route, CallSpec, Chain] | None = None

    def spec(self, clock: Clock, route: Route, options: CallOptions) -> CallSpec:
        """The checked spec of a call; a call with no options on a known route costs a lookup."""
        if options or type(route) is not Route:
            return call_spec(self.policy, clock, route, options)
        last = self.last
        if last is not None and last[0] is route:
            return last[1]
        spec = self.specs.get(route)
        if spec is None:
            spec = call_spec(self.policy, clock, route, options)
            if len(self.specs) >= _CACHED_ROUTES:
                self.specs.clear()
            self.specs[route] = spec
        self.last = (route, spec, self.chain(spec))
        return spec

    def chain(self, spec: CallSpec) -> Chain:
        """The call's chain of routes, rungs and ladder (``ladder_chain``), cached by route."""
        last = self.last
        if last is not None and last[1] is spec:
            return last[2]
        key = (spec.route, spec.fallbacks, spec.priority)
        chain = self.chains.get(key)
        if chain is None:
            ladder = self.policy.ladder if self.enabled else None
            chain = ladder_chain(spec.route, spec.fallbacks, ladder, spec.priority)
            if len(self.chains) >= _CACHED_ROUTES:
                self.chains.clear()
            self.chains[key] = chain
        return chain


class _LoopConfig:
    """Configuration shared by both drivers (the flow is ``rateloop.loop.flow._BaseRateLoop``)."""

    _is_async = False  # which half of the limiter contract the driver calls

    def __init__(
        self,
        policy: Policy | None = None,
        *,
        limiter: Any = None,
        clock: Clock | None = None,
        sinks: Sequence[EventSink] | None = None,
        classify: Classifier | None = None,
        run_budget: RunBudget | None = None,
        run_id: str | None = None,
        rng: Callable[[], float] | None = None,
        keep_reservation: KeepReservation | None = None,
    ) -> None:
        self.policy = check_policy(policy)
        self.limiter = check_limiter(limiter, is_async=self._is_async)
        if clock is not None:
            check_clock(clock, is_async=self._is_async)
        self.clock = clock if clock is not None else system_clock
        self.sinks = _default_sinks(self.clock) if sinks is None else check_sinks(sinks)
        check_classify(classify)
        self.classify = classify
        check_run(run_budget, run_id)
        self.run_budget = run_budget
        self.run_id = run_id
        check_rng(rng)
        self.rng = rng
        check_keep_reservation(keep_reservation)
        self.keep_reservation = keep_reservation
        # Sinks that also want to know when calls start and end (ConsoleSink's summary).
        self._observers = tuple(s for s in self.sinks if hasattr(s, "call_finished"))
        # Which observers' call_started takes operation= and priority= (an older one takes
        # the scope alone and keeps working).
        self._rich_start = frozenset(
            id(s) for s in self._observers if takes_call_labels(getattr(s, "call_started", None))
        )
        self._warned_sdk_retries = False
        self._prepared = _Prepared(self.policy, rng, run_budget)
        self._limits_used: set[str] | None = set()  # None once checked out (warned or all used)

    def __repr__(self) -> str:
        limiter = type(self.limiter).__name__ if self.limiter is not None else None
        return f"{type(self).__name__}(policy=..., limiter={limiter}, clock={self.clock!r})"

    # -- deriving a loop ---------------------------------------------------------------

    def options(self) -> LoopOptions:
        """The arguments this loop was built with: ``type(loop)(**loop.options())`` rebuilds it."""
        return LoopOptions(
            policy=self.policy,
            limiter=self.limiter,
            clock=self.clock,
            sinks=self.sinks,
            classify=self.classify,
            run_budget=self.run_budget,
            run_id=self.run_id,
            rng=self.rng,
            keep_reservation=self.keep_reservation,
        )

    @classmethod
    def like(cls, loop: _LoopConfig, **changes: Unpack[LoopOptions]) -> Self:
        """A new loop of this class, built with ``loop``'s arguments and ``changes`` on top.

        ``AsyncRateLoop.like(sync_loop)`` gives the asyncio twin of a
        blocking loop (its limiter and clock must have the async methods).
        The new loop shares the limiter, the sinks and the run budget; its
        one-time warnings start afresh.
        """
        if not isinstance(loop, _LoopConfig):
            raise TypeError(f"like() takes a RateLoop or AsyncRateLoop, got {loop!r}")
        options = loop.options()
        options.update(changes)
        return cls(**options)

    def replace(self, **changes: Unpack[LoopOptions]) -> Self:
        """A loop like this one with ``changes`` (``loop.replace(policy=strict)``)."""
        return type(self).like(self, **changes)

    # -- services for the flow ---------------------------------------------------------

    def _prepare(self) -> _Prepared:
        """This loop's per-policy values, rebuilt if its policy, rng or run budget changed."""
        prepared = self._prepared
        if (
            prepared.policy is not self.policy
            or prepared.rng is not self.rng
            or prepared.run is not self.run_budget
        ):
            prepared = self._prepared = _Prepared(self.policy, self.rng, self.run_budget)
        return prepared

    def _spec(self, route: Route, options: CallOptions) -> CallSpec:
        return self._prepare().spec(self.clock, route, options)

    def _emit(self, event: CapacityEvent) -> None:
        for sink in self.sinks:
            sink(event)

    def _kept(self, fn: Callable[..., Any], reservation: Any) -> bool:
        """True when the ``keep_reservation`` hook took a successful attempt's reservation."""
        hook = self.keep_reservation
        return hook is not None and bool(hook(fn, reservation))

    def _signal_of(self, result: Returned | Raised) -> LimitSignal:
        if isinstance(result, Raised):
            if self.classify is not None:
                return self.classify(result.error)
            return classify_exception(result.error, now=self.clock.now())
        value = result.value
        status = getattr(value, "status_code", None)
        if isinstance(status, int) and not isinstance(status, bool):
            return classify_response(value, now=self.clock.now())
        return _OK

    def _check_limits_keys(self, route: Route) -> None:
        """Warn once when a route matches no configured limits key while a key matched none.

        A key such as ``openai:gpt-4.1`` written for a route that is really
        ``openai:gpt-4.1-2025-04-14`` would otherwise leave every call unlimited, silently.
        """
        used = self._limits_used
        if used is None:
            return
        limits = getattr(self.limiter, "limits", None)
        # A key that limits no call (a batch queue's enqueued_tokens alone) is not checked.
        keys = {k for k, spec in limits.items() if not getattr(spec, "empty", False)} if (
            isinstance(limits, Mapping)) else set()
        if not keys:
            self._limits_used = None
            return
        matched = [s for s in route.scopes if s in keys]
        used.update(matched)
        unused = sorted(keys - used)
        if not unused:
            self._limits_used = None  # every key has served a call: nothing left to check
        elif not matched:
            self._limits_used = None
            warnings.warn(
                f"no [limits] key matches the route {route.scope} (its scopes: "
                f"{', '.join(route.scopes)}), and the key(s) {', '.join(unused)} matched no "
                "call so far: calls on this route are not limited by them",
                LimitsWarning,
                stacklevel=_CALLER_STACKLEVEL,
            )

    def _warn_sdk_retries(self, retries: int) -> None:
        if self._warned_sdk_retries:
            return
        self._warned_sdk_retries = True
        warnings.warn(
            f"an SDK retried {retries} time(s) inside one rateloop attempt; those requests "
            "count against max_attempts. Build the client with max_retries=0 (or "
            'rateloop.integrations.sdk.plain_client("openai") / plain_client("anthropic")) '
            "so that "
            "rateloop alone decides when to retry",
            SdkRetriesWarning,
            stacklevel=_CALLER_STACKLEVEL,
        )

    @staticmethod
    def _raise_unless_ok(outcome: Outcome, policy: Policy, *, soft: bool = True) -> Outcome:
        """Return a successful outcome; otherwise raise, with the original error chained.

        An outcome about the request itself (``invalid``, ``permission``)
        re-raises the provider's own exception.  ``soft`` lets a
        ``failed_retry_exhausted`` outcome through under ``on_exhausted =
        "soft"`` (``call_or_raise``); ``wrap`` never does, since its caller
        would read the missing value as a result.
        """
        if outcome.ok:
            return outcome
        if (
            soft
            and outcome.status is Status.FAILED_RETRY_EXHAUSTED
            and policy.on_exhausted == "soft"
        ):
            return outcome
        error = outcome.error
        signal = outcome.signal
        if error is not None and signal is not None and signal.kind in _NOT_CAPACITY:
            raise error
        raise RateLimitExhausted(outcome) from error
