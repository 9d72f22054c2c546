"""What one call reports as it runs: its events, its attempt ledger, and the outcome it ends in.

:class:`CallReport` is the flow's record keeper (Exit's half of the loop):
it emits one :class:`~rateloop.outcome.events.CapacityEvent` per decision,
counts the attempts by layer and builds the final
:class:`~rateloop.outcome.record.Outcome`.  It reads the loop state, never
changes it (that is :mod:`rateloop.timing.state`'s).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from rateloop.loop.args import CallSpec
from rateloop.loop.base import _LoopConfig
from rateloop.loop.effects import Sleep
from rateloop.outcome.events import CapacityEvent, DecisionKind, signal_fields
from rateloop.outcome.record import AttemptLedger, Outcome, Status
from rateloop.route import Route
from rateloop.signal import LimitSignal
from rateloop.timing.decision import Skips
from rateloop.timing.state import LoopState

__all__ = ["CallReport"]


class CallReport:
    """The events, ledger and outcome of one call; see the module docstring."""

    def __init__(self, loop: _LoopConfig, spec: CallSpec, state: LoopState) -> None:
        self.loop = loop
        self.spec = spec
        self.state = state
        self.ledger = AttemptLedger()
        self.events: list[CapacityEvent] = []
        self.signal: LimitSignal | None = None  # the last attempt's
        self.last_error: BaseException | None = None
        self.waited = 0.0

    def started(self) -> None:
        """Tell the observing sinks a call started (``call_started``)."""
        spec = self.spec
        for observer in self.loop._observers:
            started = getattr(observer, "call_started", None)
            if started is None:
                continue
            if id(observer) in self.loop._rich_start:
                started(spec.route.scope, operation=spec.operation, priority=spec.priority)
            else:
                started(spec.route.scope)

    def emit(self, kind: DecisionKind, **fields: Any) -> None:
        spec = self.spec
        sig = fields.pop("signal", self.signal)
        route = fields.pop("route", self.state.route)
        left: Route | None = fields.pop("from_route", None)
        if left is not None:
            fields.update(
                from_provider=left.provider, from_model=left.model, from_scope=left.scope
            )
        event = CapacityEvent(
            decision=kind,
            operation=spec.operation,
            task_id=spec.task_id,
            run_id=self.loop.run_id,
            provider=route.provider,
            model=route.model,
            scope=fields.pop("scope", route.scope),
            priority=spec.priority,
            **signal_fields(sig),
            attempt=self.ledger.loop,
            sdk_attempts=self.ledger.sdk,
            deadline=spec.deadline,
            **fields,
        )
        self.events.append(event)
        self.loop._emit(event)

    def skips(self, skipped: Skips) -> None:
        # Called before the state moves on: its route is the one the signal came from.
        for route, why in skipped:
            self.emit(DecisionKind.SKIP, route=route, reason=why, from_route=self.state.route)

    def wait_for(self, seconds: float, kind: DecisionKind, route: Route, reason: str) -> Sleep:
        """The sleep of a wait, announced by its event and counted in ``waited_secs``."""
        self.waited += seconds
        self.emit(
            kind,
            route=route,
            wait_seconds=seconds,
            next_attempt_at=self.loop.clock.now() + timedelta(seconds=seconds),
            reason=reason,
        )
        return Sleep(seconds)

    def at(self, retry_at: datetime | None, retry_in: float | None) -> datetime | None:
        """When to retry: ``retry_at``, else ``retry_in`` seconds from now."""
        if retry_at is None and retry_in is not None:
            return self.loop.clock.now() + timedelta(seconds=retry_in)
        return retry_at

    def finish(
        self,
        status: Status,
        reason: str,
        *,
        value: Any = None,
        retry_at: datetime | None = None,
        next_rung: str | None = None,
        cost_usd: float | None = None,
    ) -> Outcome:
        """The call's outcome (with its last event), handed to the observing sinks."""
        succeeded = status.succeeded
        if not succeeded or self.ledger.loop > 1:
            self.emit(
                DecisionKind.SUCCESS_AFTER_RETRY if succeeded else DecisionKind.STOP,
                status=status.value,
                reason=reason,
                next_attempt_at=retry_at,
            )
        state = self.state
        outcome = Outcome(
            status=status,
            reason=reason,
            value=value,
            attempts=self.ledger.snapshot(),
            route=state.route,
            limited_route=state.limited_route if status is Status.DEGRADED else None,
            retry_at=retry_at,
            signal=self.signal,
            events=tuple(self.events),
            error=self.last_error,
            waited_secs=self.waited,
            rung=state.rung,
            cost_usd=cost_usd,
            next_rung=next_rung,
        )
        for observer in self.loop._observers:
            observer.call_finished(outcome)
        return outcome
