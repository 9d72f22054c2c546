"""DBOS: a durable step that runs a model or tool call through the RATE loop, and a queue
whose rate limit is fed from the limits rateloop knows or learns.

How it works.  :func:`call_step` (:func:`call_step_async` for async workflows) runs inside a
DBOS workflow, in rounds:

1. A round is one DBOS step, checkpointed in the system database.  The RATE loop makes the
   call in it, sleeping the short waits (those within the policy's ``pause_limit_secs``) inside
   the step, and the step records the loop's verdict (:mod:`rateloop.integrations._engine`).
   It never raises a refusal, so DBOS's own step retries never run on top of the loop.
2. ``completed`` / ``degraded``: the workflow gets a :class:`StepResult` (``degraded`` marked).
3. ``waiting_for_reset`` / ``waiting_for_capacity``: a durable ``DBOS.sleep`` until the
   outcome's ``retry_at``, then the next round.  The provider requests of earlier rounds count
   against the policy's ``max_attempts`` (:func:`engine_run_budget`), so rounds and the loop's
   retries never multiply each other.
4. ``needs_operator``, ``invalid``, ``rejected``, ``failed_retry_exhausted``: the workflow
   raises :class:`StepGaveUp` with the outcome's status and reason; DBOS records the workflow
   as failed and never retries it.

After a crash DBOS replays the recorded rounds and sleeps (a finished round is never run
again) and sleeps only what is left of an interrupted ``DBOS.sleep``.  DBOS runs a workflow
in a thread (a sync one) or a task (an async one): a durable sleep holds that thread or task
and the workflow's place in its queue's concurrency, but no step is running and the wait
survives a restart.

The queue.  :func:`queue_limits` turns the limits rateloop knows for a route (a
:class:`~rateloop.Policy`'s configured ``[limits]``) or learns (a
:class:`~rateloop.admission.Limiter`'s ``limits_for``: configured, else learned from the
provider's headers) into DBOS's ``limiter={"limit": N, "period": S}`` and
``global_concurrency``; :func:`register_queue` registers a queue with them and
:func:`refresh_queue` writes newer ones to the queue's row.  DBOS (3.x) keeps a registered
queue's configuration in the system database and every worker re-reads it on each poll, so a
refresh reaches every process at its next poll.  DBOS's limiter counts workflow starts in one
rolling window; token and day limits stay with rateloop's admission (Redis), which is exact.

Install with ``pip install 'rateloop[dbos]'``.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar, Unpack

from rateloop._clock import Clock
from rateloop._redact import redact
from rateloop.admission import LimitSpec
from rateloop.errors import BackendError, RateloopError
from rateloop.integrations._engine import Finish, GiveUp, RetryLater, engine_run_budget, verdict
from rateloop.loop import AsyncRateLoop, CallOptions, RateLoop
from rateloop.loop.args import call_spec
from rateloop.outcome.record import Outcome
from rateloop.policy import Policy
from rateloop.route import Route

try:
    import psycopg
    from dbos import DBOS, DBOSConfig, Queue
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "rateloop.integrations.dbos needs DBOS: pip install 'rateloop[dbos]'"
    ) from exc

__all__ = [
    "DEFAULT_STEP_NAME",
    "QueueLimits",
    "QueueRateLimit",
    "StepGaveUp",
    "StepResult",
    "call_step",
    "call_step_async",
    "check_system_database",
    "launch",
    "queue_limits",
    "refresh_queue",
    "refresh_queue_async",
    "register_queue",
]

T = TypeVar("T")

#: The name each round's step has in DBOS's record of the workflow (``name=`` changes it).
DEFAULT_STEP_NAME = "rateloop.call"


# --- the step ------------------------------------------------------------------------


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


# --- the queue -----------------------------------------------------------------------


class QueueRateLimit(TypedDict):
    """DBOS's queue ``limiter``: at most ``limit`` workflow starts in any ``period`` seconds."""

    limit: int
    period: float


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """A DBOS queue's ``limiter`` and ``global_concurrency``, from rateloop's limits.

    ``scope`` names the scope whose rate binds (None: no rate is known).
    """

    limiter: QueueRateLimit | None
    global_concurrency: int | None
    scope: str | None

    def options(self) -> dict[str, Any]:
        """Keyword arguments for ``DBOS.register_queue``."""
        return {"limiter": self.limiter, "global_concurrency": self.global_concurrency}


_DAY_SECS = 86_400.0


def _window(spec: LimitSpec, share: float, calls: int) -> tuple[float, int, float] | None:
    """(workflows a second, limit, period) of one scope's request limits, or None."""
    if spec.requests_per_minute is not None:
        rate = spec.requests_per_minute * share / 60.0 / calls
        # The provider's bucket: ``burst`` of a minute at once, else one second of the rate.
        period = spec.burst * 60.0 if spec.burst is not None else 1.0
    elif spec.requests_per_day is not None:
        rate, period = spec.requests_per_day * share / _DAY_SECS / calls, _DAY_SECS
    else:
        return None
    limit = math.floor(rate * period + 1e-9)
    if limit < 1:  # less than one workflow a window: one per 1/rate seconds
        return rate, 1, 1.0 / rate
    return rate, limit, period


def queue_limits(known: Policy | Any, route: Route, *, calls_per_workflow: int = 1,
                 share: float = 1.0) -> QueueLimits:
    """The queue limits that keep ``route`` within what ``known`` says of it.

    ``known`` is a :class:`~rateloop.Policy` (its configured ``[limits]``) or a
    :class:`~rateloop.admission.Limiter` (``limits_for``: configured, else learned).  Every
    scope of the route counts and the tightest binds.  The request rate becomes the
    limiter: the provider's bucket (``burst`` of a minute, else one second) of requests per
    that window; without a per-minute limit, the day's requests per rolling day.
    ``calls_per_workflow``: model calls each workflow of the queue makes; ``share``: the
    fraction of the route's limits this queue may use (0 < share <= 1).
    """
    if isinstance(calls_per_workflow, bool) or not isinstance(calls_per_workflow, int) or (
        calls_per_workflow < 1
    ):
        raise ValueError(f"calls_per_workflow must be an int >= 1, got {calls_per_workflow!r}")
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
        raise ValueError(f"share must be a fraction 0 < share <= 1, got {share!r}")
    if not isinstance(route, Route):
        raise TypeError(f"route must be a rateloop.Route, got {route!r}")
    if isinstance(known, Policy):
        limits = known.limits

        def lookup(scope: str) -> LimitSpec | None:
            return limits.get(scope)
    elif callable(getattr(known, "limits_for", None)):
        lookup = known.limits_for
    else:
        raise TypeError(f"known must be a rateloop.Policy or a Limiter, got {known!r}")
    best: tuple[float, int, float] | None = None
    scope_of_best: str | None = None
    concurrency: int | None = None
    for scope in route.scopes:
        spec = lookup(scope)
        if spec is None:
            continue
        window = _window(spec, share, calls_per_workflow)
        if window is not None and (best is None or window[0] < best[0]):
            best, scope_of_best = window, scope
        if spec.concurrency is not None:
            mine = max(1, math.floor(spec.concurrency * share))
            concurrency = mine if concurrency is None else min(concurrency, mine)
    limiter: QueueRateLimit | None = (
        None if best is None else {"limit": best[1], "period": round(best[2], 3)}
    )
    return QueueLimits(limiter, concurrency, scope_of_best)


def register_queue(name: str, limits: QueueLimits, **options: Any) -> Queue:
    """``DBOS.register_queue(name, ...)`` with ``limits``; ``options`` are DBOS's others
    (``worker_concurrency``, ``polling_interval_sec``, ...)."""
    if not isinstance(limits, QueueLimits):
        raise TypeError(f"limits must be a QueueLimits (from queue_limits()), got {limits!r}")
    clash = sorted({"limiter", "global_concurrency", "concurrency"} & set(options))
    if clash:
        raise TypeError(f"register_queue takes {', '.join(clash)} from limits=, not as options")
    return DBOS.register_queue(name, **limits.options(), **options)


def _changes(limits: QueueLimits, limiter: QueueRateLimit | None,
             concurrency: int | None) -> dict[str, Any]:
    if not isinstance(limits, QueueLimits):
        raise TypeError(f"limits must be a QueueLimits (from queue_limits()), got {limits!r}")
    changes: dict[str, Any] = {}
    if _rate_of(limiter) != _rate_of(limits.limiter):
        changes["limiter"] = limits.limiter
    if concurrency != limits.global_concurrency:
        changes["global_concurrency"] = limits.global_concurrency
    return changes


def _rate_of(limiter: QueueRateLimit | None) -> tuple[int, float] | None:
    return None if limiter is None else (int(limiter["limit"]), float(limiter["period"]))


def refresh_queue(queue: Queue, limits: QueueLimits) -> bool:
    """Write ``limits`` to a registered queue's row when they differ; True when changed.

    Every worker picks the new limits up at its next poll of the queue.
    """
    changes = _changes(limits, queue.limiter, queue.global_concurrency)
    if "limiter" in changes:
        queue.set_limiter(changes["limiter"])
    if "global_concurrency" in changes:
        queue.set_global_concurrency(changes["global_concurrency"])
    return bool(changes)


async def refresh_queue_async(queue: Queue, limits: QueueLimits) -> bool:
    """The asyncio twin of :func:`refresh_queue`."""
    changes = _changes(limits, await queue.get_limiter_async(),
                       await queue.get_global_concurrency_async())
    if "limiter" in changes:
        await queue.set_limiter_async(changes["limiter"])
    if "global_concurrency" in changes:
        await queue.set_global_concurrency_async(changes["global_concurrency"])
    return bool(changes)


# --- launching -----------------------------------------------------------------------


def _postgres_dsn(url: str) -> str | None:
    """The libpq form of a PostgreSQL URL (``postgresql+psycopg://`` too); None otherwise."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.split("+", 1)[0].lower() not in ("postgresql", "postgres"):
        return None
    return f"postgresql://{rest}"


def check_system_database(url: str, *, connect_timeout: float = 5.0) -> None:
    """Raise :class:`~rateloop.errors.BackendError` when PostgreSQL at ``url`` does not answer.

    A database that does not exist yet passes: DBOS creates it.  SQLite URLs pass.
    """
    dsn = _postgres_dsn(url)
    if dsn is None:
        return
    try:
        psycopg.connect(dsn, connect_timeout=max(1, math.ceil(connect_timeout))).close()
    except psycopg.OperationalError as exc:
        if "does not exist" in str(exc):
            return
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BackendError(
            f"the DBOS system database at {url} is not reachable ({first}): start PostgreSQL "
            "there, or set system_database_url to a running server"
        ) from exc


def launch(config: DBOSConfig, *, connect_timeout: float = 5.0) -> DBOS:
    """``DBOS(config=config)`` and ``DBOS.launch()``, after checking the system database.

    A PostgreSQL that does not answer is one :class:`~rateloop.errors.BackendError` naming
    the URL and what to start, within ``connect_timeout`` seconds, before DBOS starts.
    """
    url = config.get("system_database_url")
    if url is None:
        raise ValueError("config must set system_database_url (a postgresql:// URL)")
    check_system_database(url, connect_timeout=connect_timeout)
    dbos = DBOS(config=config)
    DBOS.launch()
    return dbos

