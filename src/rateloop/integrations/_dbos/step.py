"""The durable step: one call through the RATE loop, as DBOS steps in rounds.

How it works (the rules, in order; the face, :mod:`rateloop.integrations.dbos`, says why):

1. ``_rounds`` is the workflow's side, one generator for both drivers: it asks for a round
   (``_RunRound``), reads the round's record, and either returns a :class:`StepResult`,
   raises :class:`StepGaveUp`, or asks for a durable sleep (``_DurableSleep``) and goes on.
2. A round (``_round`` / ``_around``) is the body of one DBOS step: a loop derived from the
   caller's, its attempts budget less what earlier rounds spent and its sleeps counted, makes
   the call; the round returns a plain record of the verdict, never raising a refusal.
3. ``call_step`` performs the effects with ``DBOS.run_step`` and ``DBOS.sleep``,
   ``call_step_async`` with their ``_async`` twins.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, Unpack

from dbos import DBOS

from rateloop._clock import Clock
from rateloop._redact import redact
from rateloop.errors import RateloopError
from rateloop.integrations._engine import Finish, GiveUp, RetryLater, engine_run_budget, verdict
from rateloop.loop import AsyncRateLoop, CallOptions, RateLoop
from rateloop.loop.args import call_spec
from rateloop.outcome.record import Outcome
from rateloop.route import Route

__all__ = ["DEFAULT_STEP_NAME", "StepGaveUp", "StepResult", "call_step", "call_step_async"]

T = TypeVar("T")

#: The name each round's step has in DBOS's record of the workflow (``name=`` changes it).
DEFAULT_STEP_NAME = "rateloop.call"


@dataclass(frozen=True, slots=True)
class StepResult:
    """A call that finished: its ``value``; ``degraded`` when on an approved fallback.

    ``requests`` are the provider requests of every round, ``rounds`` the DBOS steps run,
    ``asleep_secs`` the seconds slept inside those steps (short waits) and
    ``durable_sleep_secs`` the seconds of durable ``DBOS.sleep`` between rounds.
    """

    value: Any
    status: str
    degraded: bool
    route: str
    requests: int
    rounds: int
    asleep_secs: float
    durable_sleep_secs: float


class StepGaveUp(RateloopError):
    """The call ended in a terminal outcome (``status``); the workflow must not retry it."""

    def __init__(self, status: str, reason: str) -> None:
        self.status = status
        self.reason = redact(reason)
        super().__init__(status, self.reason)  # pickles from args: DBOS stores the error

    def __str__(self) -> str:
        return f"{self.status}: {self.reason}"


class _CountingClock:
    """The loop's clock, adding up the seconds the loop sleeps inside a round."""

    __slots__ = ("_clock", "slept")

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.slept = 0.0

    def monotonic(self) -> float:
        return self._clock.monotonic()

    def now(self) -> Any:
        return self._clock.now()

    def sleep(self, seconds: float) -> None:
        self.slept += max(0.0, seconds)
        self._clock.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        self.slept += max(0.0, seconds)
        await self._clock.asleep(seconds)


@dataclass(frozen=True, slots=True)
class _RunRound:
    """Effect: run one round as a DBOS step; the reply is the round's record (a dict)."""

    prior_requests: int


@dataclass(frozen=True, slots=True)
class _DurableSleep:
    """Effect: ``DBOS.sleep(seconds)`` in the workflow; the reply is None."""

    seconds: float


def _rounds() -> Generator[_RunRound | _DurableSleep, Any, StepResult]:
    """The workflow's side of the rounds, the same for both drivers (rules 2-4 above)."""
    requests, rounds, asleep, durable = 0, 0, 0.0, 0.0
    while True:
        record: Mapping[str, Any] = yield _RunRound(requests)
        rounds += 1
        requests += int(record["requests"])
        asleep += float(record["asleep_secs"])
        match record["verdict"]:
            case "finish":
                return StepResult(record["value"], record["status"], bool(record["degraded"]),
                                  record["route"], requests, rounds, asleep, durable)
            case "give_up":
                raise StepGaveUp(record["status"], record["reason"])
            case _:
                delay = float(record["delay_secs"])
                yield _DurableSleep(delay)
                durable += delay


def _round_loop(loop: RateLoop | AsyncRateLoop, prior: int) -> tuple[Any, _CountingClock]:
    """The loop of one round: its clock counted, earlier rounds' requests spent."""
    clock = _CountingClock(loop.clock)
    budget = engine_run_budget(loop.policy, prior_attempts=prior)
    return loop.replace(run_budget=budget, clock=clock), clock


def _record(outcome: Outcome, clock: _CountingClock) -> dict[str, Any]:
    """What a round checkpoints: plain values, so any DBOS serializer can store them."""
    record: dict[str, Any] = {
        "status": outcome.status.value, "reason": outcome.reason,
        "requests": outcome.attempts.provider_requests, "asleep_secs": clock.slept,
        "route": outcome.route.scope if outcome.route is not None else "",
    }
    match verdict(outcome, now=clock.now()):
        case Finish(value, degraded):
            record.update(verdict="finish", value=value, degraded=degraded)
        case RetryLater(delay_secs):
            record.update(verdict="retry_later", delay_secs=delay_secs)
        case GiveUp():
            record.update(verdict="give_up")
    return record


def _round(loop: RateLoop, prior: int, fn: Callable[..., Any], route: Route,
           options: CallOptions) -> dict[str, Any]:
    derived, clock = _round_loop(loop, prior)
    return _record(derived.call(fn, route=route, **options), clock)


async def _around(loop: AsyncRateLoop, prior: int, fn: Callable[..., Awaitable[Any]],
                  route: Route, options: CallOptions) -> dict[str, Any]:
    derived, clock = _round_loop(loop, prior)
    return _record(await derived.call(fn, route=route, **options), clock)


def _check_call(where: str, loop: object, kind: type, route: object, name: object,
                options: CallOptions) -> None:
    """Caller misuse, said before anything runs."""
    if not isinstance(loop, kind):
        raise TypeError(f"{where} takes loop= a {kind.__name__}, got {type(loop).__name__}")
    if not isinstance(route, Route):
        raise TypeError(f"{where} takes route= a rateloop.Route, got {route!r}")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where} takes name= a non-empty step name, got {name!r}")
    assert isinstance(loop, RateLoop | AsyncRateLoop)
    call_spec(loop.policy, loop.clock, route, options)  # raises on a bad option
    if DBOS.workflow_id is None or DBOS.step_id is not None:
        raise RuntimeError(
            f"{where} runs in a DBOS workflow, outside its steps: call it from a function "
            "decorated with @DBOS.workflow()"
        )


def call_step(fn: Callable[..., T], *, loop: RateLoop, route: Route,
              name: str = DEFAULT_STEP_NAME, **options: Unpack[CallOptions]) -> StepResult:
    """Run ``fn(route)`` through ``loop`` as durable DBOS steps, from a sync workflow.

    ``options`` are :meth:`RateLoop.call`'s (``cost``, ``idempotency_key``, ``fallbacks``,
    ...).  Returns a :class:`StepResult`; raises :class:`StepGaveUp` on a terminal outcome.
    ``fn``'s value is checkpointed by DBOS, so it must be one DBOS's serializer stores (the
    default pickles it): return the text or the parsed body, not an open response.
    """
    _check_call("call_step", loop, RateLoop, route, name, options)
    flow, reply = _rounds(), None
    while True:
        try:
            effect = flow.send(reply)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        match effect:
            case _RunRound(prior):
                reply = DBOS.run_step({"name": name}, _round, loop, prior, fn, route, options)
            case _DurableSleep(seconds):
                DBOS.sleep(seconds)
                reply = None


async def call_step_async(fn: Callable[..., Awaitable[T]], *, loop: AsyncRateLoop,
                          route: Route, name: str = DEFAULT_STEP_NAME,
                          **options: Unpack[CallOptions]) -> StepResult:
    """The asyncio twin of :func:`call_step`, for an ``async`` workflow and ``AsyncRateLoop``."""
    _check_call("call_step_async", loop, AsyncRateLoop, route, name, options)
    flow, reply = _rounds(), None
    while True:
        try:
            effect = flow.send(reply)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        match effect:
            case _RunRound(prior):
                reply = await DBOS.run_step_async({"name": name}, _around, loop, prior, fn,
                                                  route, options)
            case _DurableSleep(seconds):
                await DBOS.sleep_async(seconds)
                reply = None
