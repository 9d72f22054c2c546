"""The RATE loop's algorithm, once: the flow of one call, as small generators of effects.

How it works: :meth:`_BaseRateLoop._drive` runs one call as a generator that
yields effects (:mod:`rateloop.loop.effects`) and receives their results;
:class:`~rateloop.loop.RateLoop` performs them with blocking calls,
:class:`~rateloop.loop.AsyncRateLoop` with ``await``.  The flow only asks
and performs: every decision comes from :mod:`rateloop.timing.decide`, every
change of the loop state and the budgets is made by :mod:`rateloop.timing.state`,
and events and the outcome are kept by :class:`~rateloop.loop.report.CallReport`.

The steps of one attempt, each a sub-generator composed with ``yield from``:

1. :meth:`_Run.admit` -- book or reserve the cost on the route (or take the
   call's ``booked`` reservation, once, on its route); a booked start is
   slept for, a refusal asks the decider (rule 8): wait, move to a fallback
   at once, or end the call.
2. :meth:`_Run.attempt` -- count the attempt, call ``fn``, count SDK
   retries, classify what came back.  An interruption releases the
   reservation first.
3. :meth:`_Run.settle_and_observe` -- settle the reservation (or let the
   ``keep_reservation`` hook take it), release it on a refusal, feed the
   provider's word to the limiter and pause the scope it names.
4. :meth:`_Run.succeed` -- a success ends the call; :meth:`_Run.respond`
   -- an exception no classifier knows is re-raised (a bug, not a refusal);
   a refusal is recorded and goes on to steps 5 and 6.

Without a limiter steps 1 and 3 have nothing to do and are not entered, and a
success ends in a plain call: the common call, a first-try success, builds
as few generators and objects as it can (``bench/hotpath_bench.py``).
5. :meth:`_Run.guard_write` -- a write that may have taken effect is never
   retried blindly (rule 9).
6. :meth:`_Run.apply` -- ask the decider, then wait and retry, wait and
   fall back, or stop.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from rateloop.admission.limiter import Limiter
from rateloop.admission.reservation import Denied
from rateloop.loop.args import CallSpec
from rateloop.loop.base import _LoopConfig
from rateloop.loop.effects import (
    Book,
    Call,
    Effect,
    Observe,
    OutcomeCheck,
    Pause,
    Raised,
    Release,
    Reserve,
    Returned,
    Settle,
    SettleUsage,
    observed_scope,
    pause_until,
    result_error,
    sdk_retries,
    served_cost_usd,
    usage_of,
)
from rateloop.loop.report import CallReport
from rateloop.outcome.events import DecisionKind
from rateloop.outcome.record import Outcome, Status
from rateloop.route import Route
from rateloop.signal import Kind, LimitSignal
from rateloop.timing.decide import (
    ARRIVAL_SLACK_SECS,
    Decision,
    FallBack,
    Proceed,
    Stop,
    Wait,
    book_within,
    decide,
    decide_admission,
    decide_write,
)
from rateloop.timing.ladder import tier_discount
from rateloop.timing.state import (
    LoopState,
    count_sdk_retries,
    record_answer,
    record_refusal,
    start_attempt,
    take,
    use_controlled_retry,
)
from rateloop.timing.writes import is_ambiguous_failure, normalize_write_outcome

__all__: list[str] = []  # the drivers use _BaseRateLoop; nothing here is public

R = TypeVar("R")
_Flow = Generator[Effect, Any, R]


class _Moved:
    """Admission moved the call to a fallback: admit on it from the top."""


_MOVED: Final = _Moved()


@dataclass(slots=True)  # not frozen: built once per attempt, and frozen fields cost a call each
class _Attempted:
    result: Returned | Raised
    signal: LimitSignal
    now: float  # monotonic, read when the signal was known
    usage: Any | None  # what a success reports it used (``usage_of``), read once


class _BaseRateLoop(_LoopConfig):
    """The configuration and the algorithm shared by both drivers."""

    def _drive(self, spec: CallSpec) -> _Flow[Outcome]:
        """The RATE loop for one call, as a generator of effects."""
        return _Run(self, spec).flow()


class _Run:
    """One call in flight: its spec, its loop state and its report."""

    def __init__(self, loop: _LoopConfig, spec: CallSpec) -> None:
        self.loop, self.spec = loop, spec
        clock, policy = loop.clock, loop.policy
        self.clock, self.policy = clock, policy
        start, wall0 = clock.monotonic(), clock.now()
        deadline = (
            start + (spec.deadline - wall0).total_seconds() if spec.deadline is not None else None
        )
        # Checked once per policy: the budget's bounds, the backoff, the route's chain.
        prepared = loop._prepare()
        # enabled = false: the loop steps aside; one attempt, no admission, no wait.
        self.limiter = loop.limiter if prepared.enabled else None
        chain, rungs, ladder = prepared.chain(spec)
        self.state = LoopState(
            chain=chain,
            rungs=rungs,
            ladder=ladder,
            budget=prepared.budget.fresh(started_at=start, deadline=deadline),
            backoff=prepared.backoff,
            epoch=(start, wall0),
            cost=spec.cost,
            data_class=spec.data_class,
        )
        self.report = CallReport(loop, spec, self.state)
        self.booked = spec.booked

    def flow(self) -> _Flow[Outcome]:
        """Attempt after attempt until the decider stops the call (the steps of the module)."""
        state, report = self.state, self.report
        report.started()
        while True:
            step = decide(state, None, self.policy, self.clock.monotonic())
            if isinstance(step, Stop):
                return report.finish(
                    step.status, step.reason, retry_at=step.retry_at, next_rung=step.next_rung
                )
            assert isinstance(step, Proceed)
            route = step.route
            admitted = None
            if self.limiter is not None:  # (steps 1 and 3 have nothing to do without one)
                admitted = yield from self.admit(route)
                if isinstance(admitted, Outcome):
                    return admitted
                if admitted is _MOVED:
                    continue
            attempted = yield from self.attempt(route, admitted)
            if isinstance(attempted, Outcome):
                return attempted
            if self.limiter is not None:
                yield from self.settle_and_observe(route, admitted, attempted)
            if attempted.signal.kind is Kind.OK:
                return self.succeed(route, attempted)
            ended = yield from self.respond(route, attempted)
            if ended is not None:
                return ended

    # -- 1. admit ----------------------------------------------------------------------

    def admit(self, route: Route) -> _Flow[Any]:
        """A reservation on ``route``, ``_MOVED``, or the outcome (asked with a limiter only)."""
        self.loop._check_limits_keys(route)
        state, report = self.state, self.report
        while True:
            granted = self.take_booked(route)
            if granted is None:
                granted = yield self.booking(route)
            if not isinstance(granted, Denied):
                # A start now (the common grant) has nothing to wait for.
                if not getattr(granted, "starts_in", 0.0) > 0:
                    return granted
                if (yield from self.await_start(route, granted)):
                    return granted
                continue
            now = self.clock.monotonic()
            record_refusal(state, now)
            step = decide_admission(state, granted, self.policy, now)
            if isinstance(step, Wait):
                yield report.wait_for(step.seconds, DecisionKind.ADMISSION_WAIT, route, step.reason)
                continue
            report.skips(step.skipped)
            if isinstance(step, FallBack):
                take(state, step, None)
                report.emit(
                    DecisionKind.FALLBACK, route=step.route, reason=step.reason, from_route=route
                )
                return _MOVED
            return report.finish(
                step.status,
                step.reason,
                retry_at=report.at(step.retry_at, step.retry_in),
                next_rung=step.next_rung,
            )

    def take_booked(self, route: Route) -> Any:
        """The call's ``booked`` reservation the first time ``route`` is admitted, else None."""
        booked = self.booked
        if booked is None or booked.route.scope != route.scope:
            return None
        self.booked = None
        return booked

    def booking(self, route: Route) -> Book | Reserve:
        spec = self.spec
        if isinstance(self.limiter, Limiter):  # book a start it can afford, a short way ahead
            within = book_within(self.state, self.policy, self.clock.monotonic())
            return Book(route, spec.cost, spec.priority, within)
        return Reserve(route, spec.cost, spec.priority)

    def await_start(self, route: Route, reservation: Any) -> _Flow[bool]:
        """Sleep until a booked start ahead; False when a refusal meanwhile voided the booking."""
        starts_in: float = reservation.starts_in
        why = f"booked capacity on {route.scope}"
        sleep = self.report.wait_for(
            starts_in + ARRIVAL_SLACK_SECS, DecisionKind.ADMISSION_WAIT, route, why
        )
        yield from self.holding(reservation, sleep)
        if not getattr(reservation, "stale", False):
            return True
        # The provider refused a call since this was booked (in this process, or another's,
        # as the backend reported): the schedule no longer holds, and a refused request
        # would spend a slot there too.  Give the booking back and ask again -- an
        # admission wait, not an attempt.
        yield Release(reservation)
        self.report.emit(
            DecisionKind.ADMISSION_WAIT,
            route=route,
            wait_seconds=0.0,
            reason=f"re-admitting on {route.scope}: a refusal since its booking",
        )
        return False

    def holding(self, reservation: Any, effect: Effect) -> _Flow[Any]:
        """Perform ``effect`` holding ``reservation``: an interruption gives it back first.

        An interruption (``KeyboardInterrupt``, a cancelled task) releases the
        capacity before it goes on.
        """
        try:
            return (yield effect)
        except BaseException:
            yield from self.release(reservation)
            raise

    def release(self, reservation: Any) -> _Flow[None]:
        """Give ``reservation`` back (None: there is none, without a limiter)."""
        if reservation is not None:
            yield Release(reservation)

    # -- 2. attempt --------------------------------------------------------------------

    def attempt(self, route: Route, reservation: Any) -> _Flow[_Attempted | Outcome]:
        """Call ``fn`` on ``route`` and read what came back."""
        state, report = self.state, self.report
        if not start_attempt(state):  # another call of the run took the last one
            yield from self.release(reservation)
            return report.finish(Status.FAILED_RETRY_EXHAUSTED, "the run's attempt budget is spent")
        report.ledger.record_loop()
        try:  # ``holding``, inlined: one generator fewer on every attempt
            result: Returned | Raised = yield Call(route)
        except BaseException:
            yield from self.release(reservation)
            raise
        if isinstance(result, Raised):
            report.last_error = result.error
        retries = sdk_retries(result)
        if retries:
            # They reached the provider: they spend from this call's attempts.
            report.ledger.record_sdk(retries)
            count_sdk_retries(state, retries)
            self.loop._warn_sdk_retries(retries)
        try:
            signal = self.loop._signal_of(result)
        except Exception:
            yield from self.release(reservation)
            raise
        report.signal = signal
        record_answer(state, signal)  # any answer: this endpoint is there
        usage = usage_of(result) if signal.kind is Kind.OK else None
        return _Attempted(result, signal, self.clock.monotonic(), usage)

    # -- 3. settle and observe ---------------------------------------------------------

    def settle_and_observe(
        self, route: Route, reservation: Any, attempted: _Attempted
    ) -> _Flow[None]:
        """Tell admission what the provider said: settle or release, observe, pause."""
        signal = attempted.signal
        # The answer to a call admitted in its route's cold start (admission/known.py):
        # learn what its headers say first, so that the settle ending the cold start
        # leaves the limits they state, never a moment with none.
        early = False
        if signal.observed and reservation is not None:
            plan = getattr(reservation, "plan", None)  # a carried booking has none
            early = plan is not None and plan.cold_scope is not None
        if early:
            yield Observe(observed_scope(signal, route), signal)
        if reservation is not None:
            if signal.kind is not Kind.OK:
                yield Release(reservation)  # the request still counts
            elif attempted.usage is not None:
                # Read as the provider's accounting profile says (cache reads, ...).
                yield SettleUsage(reservation, attempted.usage)
            else:
                cost = self.spec.cost
                yield Settle(reservation, cost.input_tokens, cost.output_tokens)
        if signal.kind is Kind.OK and not signal.observed:
            return  # nothing to learn from, and a success never pauses a scope
        # The provider speaks for the scope it limits (the project), every tenant
        # included; a tool the call used speaks for the tool's own scope.
        scope = observed_scope(signal, route)
        if (signal.observed or signal.kind is Kind.TEMPORARY) and not early:
            yield Observe(scope, signal)
        wall = self.clock.now()
        until = pause_until(signal, wall)
        if until is not None:
            yield Pause(scope, until, signal.kind.value)
            self.report.emit(
                DecisionKind.PAUSE,
                scope=scope,
                paused_until=until,
                wait_seconds=max(0.0, (until - wall).total_seconds()),
                reason=f"{signal.kind.value} on {scope}",
            )

    # -- 4. respond to what came back -------------------------------------------------

    def succeed(self, route: Route, attempted: _Attempted) -> Outcome:
        """Step 4 on a success: the call ends here (no effect left to perform)."""
        done = decide(self.state, attempted.signal, self.policy, attempted.now)
        assert isinstance(done, Stop)
        result = attempted.result
        value = result.value if isinstance(result, Returned) else None
        return self.report.finish(
            done.status, done.reason, value=value, cost_usd=self.price(route, attempted.usage)
        )

    def respond(self, route: Route, attempted: _Attempted) -> _Flow[Outcome | None]:
        """Steps 4-6 after a refusal: the outcome when the call ends here, None to go round."""
        state, signal, now = self.state, attempted.signal, attempted.now
        self.surface_bug(attempted)
        record_refusal(state, now, signal.kind)
        ended = yield from self.guard_write(route, attempted)
        if ended is not None:
            return ended
        return (yield from self.apply(decide(state, signal, self.policy, now), route))

    def price(self, route: Route, usage: Any | None) -> float | None:
        """What the served call cost on ``route``: the reported ``usage``, else the reservation.

        Tokens as the provider's accounting counts them (cache discounts are not
        applied), at the route's prices less its tier's discount.
        """
        return served_cost_usd(
            route, usage, self.spec.cost, tier_discount(self.policy.ladder, route.tier)
        )

    def surface_bug(self, attempted: _Attempted) -> None:
        """Re-raise an exception no classifier recognises (unless ``trigger_scope = "all"``)."""
        result = attempted.result
        if (
            isinstance(result, Raised)
            and attempted.signal.kind is Kind.UNKNOWN
            and self.policy.trigger_scope != "all"
        ):
            self.report.emit(DecisionKind.STOP, status="raised", reason="unclassified exception")
            raise result.error

    # -- 5. guard a write --------------------------------------------------------------

    def guard_write(self, route: Route, attempted: _Attempted) -> _Flow[Outcome | None]:
        """Never retry blindly a write whose effect is unknown; the outcome when it ends here."""
        spec = self.spec
        error = result_error(attempted.result)
        if spec.idempotent or not is_ambiguous_failure(attempted.signal, error):
            return None
        verdict = None
        if spec.outcome_check is not None:
            verdict = normalize_write_outcome((yield OutcomeCheck(route)))
        stop = decide_write(self.state, verdict)
        if stop is not None:
            return self.report.finish(stop.status, stop.reason)
        use_controlled_retry(self.state)
        return None

    # -- 6. apply the decision ---------------------------------------------------------

    def apply(self, decision: Decision, route: Route) -> _Flow[Outcome | None]:
        """Carry out the decider's answer after a refusal; the outcome when it stops."""
        state, report = self.state, self.report
        kind = report.signal.kind if report.signal is not None else None
        if isinstance(decision, Stop):
            report.skips(decision.skipped)
            reason = decision.reason
            if decision.skipped:  # a fallback that was never tried says why
                reason += "; skipped " + "; ".join(
                    f"{r.scope} ({why})" for r, why in decision.skipped
                )
            retry_at = report.at(decision.retry_at, decision.retry_in)
            return report.finish(
                decision.status, reason, retry_at=retry_at, next_rung=decision.next_rung
            )
        if isinstance(decision, Wait):
            yield report.wait_for(decision.seconds, DecisionKind.WAIT, route, decision.reason)
            take(state, decision, kind)
            report.emit(DecisionKind.RETRY, reason=f"retry {state.waits} on {route.scope}")
            return None
        assert isinstance(decision, FallBack)
        report.skips(decision.skipped)
        if decision.wait > 0:
            yield report.wait_for(decision.wait, DecisionKind.WAIT, route, decision.reason)
        take(state, decision, kind)
        report.emit(
            DecisionKind.FALLBACK, route=decision.route, reason=decision.reason, from_route=route
        )
        return None
