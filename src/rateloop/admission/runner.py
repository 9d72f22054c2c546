"""How the limiter's flows reach a backend: one step at a time, with the local fallback.

How it works.  The limiter's public methods are generators (*flows*, in
``admit.py`` and ``feedback.py``) that yield steps -- :class:`Do` "run this
operation on the backend" or :class:`Sleep` "sleep this long" -- and receive
their results.  :class:`BackendRunner` performs them: :meth:`BackendRunner.run`
with blocking calls, :meth:`BackendRunner.arun` with awaits, so the algorithm
is written once.  When the shared backend is unreachable and
``on_unreachable="local"``, an operation runs on a per-process memory backend
holding ``local_share`` of every limit (the ``_scaled_*`` functions) until
:data:`LOCAL_RETRY_SECONDS` have passed; a settle always goes to the backend
that granted.  What the backends say of refusals is kept in :class:`Refusals`,
which the flows and the reservations read.

The runner depends on the backends and :class:`Refusals` only: it knows
nothing of limits, plans or reservations.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Generator
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeVar, cast

from rateloop._clock import Clock, system_clock
from rateloop.admission.backends.memory import MemoryBackend
from rateloop.admission.backends.protocol import Backend, BackendUnreachable
from rateloop.admission.plan import (
    AdmitOp,
    AdmitPlan,
    Check,
    CheckKind,
    ObserveOp,
    Refused,
    SettleOp,
)

__all__ = [
    "LOCAL_RETRY_SECONDS",
    "NEVER",
    "BackendRunner",
    "Do",
    "Done",
    "Flow",
    "Refusals",
    "Sleep",
]

#: After the shared backend was unreachable, stay local this long before retrying it.
LOCAL_RETRY_SECONDS = 5.0

T = TypeVar("T")

#: ``-inf``: no refusal known; the ``_local_until`` of a runner that never fell back.
NEVER = -math.inf
_NEVER = NEVER


@dataclass(frozen=True, slots=True)
class Do:
    op: object
    local: bool = False
    deadline: float | None = None  # the caller's, on the monotonic clock


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


_Step = Do | Sleep
#: (result, the op actually run, ran locally).  ``Any``: the result's type is the
#: op's (an AdmitResult for an AdmitOp, ...); typed where it is read, not cast at run time.
Done = tuple[Any, Any, bool]
Flow = Generator[_Step, Any, T]


def _scaled_check(check: Check, share: float) -> Check:
    """``check`` holding only ``share`` of its limit (the local fallback's part)."""
    if share >= 1.0:
        return check
    if check.kind is CheckKind.BUCKET:
        capacity = max(check.capacity * share, 1.0)
    else:
        capacity = float(max(1, math.floor(check.capacity * share)))
    class_share = check.share * capacity / check.capacity
    if check.kind is CheckKind.LEASE:
        class_share = float(max(1, math.floor(class_share + 1e-9)))
    ceiling = max(check.ceiling * share, capacity)
    return replace(
        check, capacity=capacity, share=class_share, rate=check.rate * share, ceiling=ceiling
    )


def _scaled_plan(plan: AdmitPlan, share: float) -> AdmitPlan:
    """``plan`` with every check scaled to ``share``; remembered on the plan."""
    local = plan.local
    if local is not None and local[0] == share:
        return local[1]
    scaled = AdmitPlan(
        plan.scopes,
        tuple(_scaled_check(c, share) for c in plan.checks),
        plan.priority,
        plan.profile,
    )
    plan.local = (share, scaled)
    return scaled


def _scaled_op(op: object, share: float) -> object:
    if share >= 1.0:
        return op
    if isinstance(op, AdmitOp):
        plan = _scaled_plan(op.plan, share)
        return op._replace(plan=plan, allowed=plan.allowances(op.amounts))
    if isinstance(op, ObserveOp):
        return replace(
            op,
            tightenings=tuple(
                replace(t, check=_scaled_check(t.check, share)) for t in op.tightenings
            ),
        )
    return op  # settle ops of local reservations already hold scaled checks


class Refusals:
    """Per scope, until when a refusal this process knows of left the provider with nothing.

    In the backend's time: this process's own refusals (a 429 observed, a
    pause) and other processes' as the shared backend reports them with each
    admission and settle.  One table for the shared backend, one for the
    local fallback (their clocks differ).  Only ever raised.
    """

    __slots__ = ("_local", "_shared")

    def __init__(self) -> None:
        self._shared: dict[str, float] = {}
        self._local: dict[str, float] = {}

    def note(self, refused: Refused, local: bool) -> None:
        """The backend says a refusal in each ``(scope, until)`` left nothing before ``until``.

        Each is kept for the scope it was recorded in, never for the other
        scopes of the route that brought the news: a project's pause is not
        its model's, and the model's other projects keep their bookings.
        """
        known = self._local if local else self._shared
        for scope, until in refused:
            if known.get(scope, _NEVER) < until:
                known[scope] = until

    def before(self, scopes: tuple[str, ...], start: float, local: bool) -> bool:
        """Did a refusal in one of ``scopes`` leave nothing at the backend time ``start``?"""
        known = self._local if local else self._shared
        if not known:
            return False
        return any(known.get(scope, _NEVER) > start for scope in scopes)


class BackendRunner:
    """Runs flows on the shared backend, or on the local fallback while it is unreachable."""

    def __init__(
        self,
        backend: Backend | None,
        *,
        clock: Clock | None,
        on_unreachable: Literal["fail_closed", "local"],
        local_share: float,
    ) -> None:
        if on_unreachable not in ("fail_closed", "local"):
            raise ValueError(
                f"on_unreachable must be 'fail_closed' or 'local', got {on_unreachable!r}"
            )
        if (
            isinstance(local_share, bool)
            or not isinstance(local_share, int | float)
            or not 0 < local_share <= 1
        ):
            raise ValueError(f"local_share must be a fraction 0 < share <= 1, got {local_share!r}")
        self._clock = clock or system_clock
        self._backend: Backend = backend if backend is not None else MemoryBackend(self._clock)
        self._on_unreachable = on_unreachable
        self._local_share = float(local_share)
        self._local: MemoryBackend | None = None
        self._local_until = _NEVER
        self._lock = threading.Lock()
        self.refusals = Refusals()

    @property
    def backend(self) -> Backend:
        """The shared backend."""
        return self._backend

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def on_unreachable(self) -> Literal["fail_closed", "local"]:
        return self._on_unreachable

    @property
    def local(self) -> MemoryBackend | None:
        """The local fallback's backend, once the shared one was unreachable (else None)."""
        return self._local

    def _local_backend(self) -> MemoryBackend:
        with self._lock:
            if self._local is None:
                self._local = MemoryBackend(self._clock)
            return self._local

    def _shared_after_fallback(self, op: object) -> bool:
        """After a fallback: run ``op`` on the shared backend?

        A settle always is (it belongs where it was granted); anything else
        once :data:`LOCAL_RETRY_SECONDS` have passed.
        """
        return isinstance(op, SettleOp) or self._clock.monotonic() >= self._local_until

    def _fallback(self, exc: BackendUnreachable) -> None:
        """Start a local window -- unless one is running: the window ends on schedule.

        Several calls in flight can each see the shared backend fail (one
        error per pooled connection); only the first starts the window, so
        the shared backend is tried again :data:`LOCAL_RETRY_SECONDS` after
        the outage was noticed, not after its last echo.  A new window's
        local limiter starts full (:meth:`MemoryBackend.restart_full`).
        """
        if self._on_unreachable != "local":
            raise exc
        now = self._clock.monotonic()
        with self._lock:
            if now < self._local_until:
                return
            from_shared = self._local_until == _NEVER
            self._local_until = now + LOCAL_RETRY_SECONDS
        if from_shared:  # the transition, not a retry during the same outage
            self._local_backend().restart_full()

    def _recovered(self) -> None:
        """The shared backend answered after a fallback: back to it, the fast path again."""
        self._local_until = _NEVER

    def execute(self, op: object, local: bool = False, deadline: float | None = None) -> Done:
        # The first test is the common case: never fallen back, no clock read.
        if not local and (self._local_until == _NEVER or self._shared_after_fallback(op)):
            try:
                result = (
                    self._backend.execute(op)
                    if deadline is None
                    else self._backend.execute(op, timeout=deadline - self._clock.monotonic())
                )
            except BackendUnreachable as exc:
                self._fallback(exc)
                if isinstance(op, SettleOp):
                    return None, op, False  # dropped: its lease expires by TTL
            else:
                if self._local_until != _NEVER:
                    self._recovered()
                return result, op, False
        scaled = _scaled_op(op, self._local_share)
        return self._local_backend().execute(scaled), scaled, True

    async def aexecute(
        self, op: object, local: bool = False, deadline: float | None = None
    ) -> Done:
        if not local and (self._local_until == _NEVER or self._shared_after_fallback(op)):
            try:
                if deadline is None:
                    result = await self._backend.aexecute(op)
                else:
                    left = deadline - self._clock.monotonic()
                    result = await self._backend.aexecute(op, timeout=left)
            except BackendUnreachable as exc:
                self._fallback(exc)
                if isinstance(op, SettleOp):
                    return None, op, False  # dropped: its lease expires by TTL
            else:
                if self._local_until != _NEVER:
                    self._recovered()
                return result, op, False
        scaled = _scaled_op(op, self._local_share)
        return await self._local_backend().aexecute(scaled), scaled, True

    def run(self, flow: Flow[T]) -> T:
        try:
            step = next(flow)
            while True:
                if isinstance(step, Sleep):
                    self._clock.sleep(step.seconds)
                    step = flow.send(None)
                else:
                    step = flow.send(self.execute(step.op, step.local, step.deadline))
        except StopIteration as stop:
            return cast(T, stop.value)

    async def arun(self, flow: Flow[T]) -> T:
        try:
            step = next(flow)
            while True:
                if isinstance(step, Sleep):
                    await self._clock.asleep(step.seconds)
                    step = flow.send(None)
                else:
                    step = flow.send(await self.aexecute(step.op, step.local, step.deadline))
        except StopIteration as stop:
            return cast(T, stop.value)

    def settle(self, op: SettleOp, *, local: bool) -> float | None:
        """Settle on the backend that granted; returns the backend's time.

        A reservation the shared backend granted is settled there even while
        the limiter is in its local fallback window (``local=False``): the
        lease and the refund live there.  If the shared backend is still
        unreachable (and ``on_unreachable="local"``) the settle is dropped --
        nothing of it belongs in the local limiter -- so the lease expires
        after its TTL and the refund is lost; the result is then ``None``.
        A settle is one step with nothing to decide around it, so it runs
        without a flow (as ``try_reserve`` does).
        """
        return self.settled(self.execute(op, local))

    async def asettle(self, op: SettleOp, *, local: bool) -> float | None:
        return self.settled(await self.aexecute(op, local))

    def settled(self, done: Done) -> float | None:
        """A settle's answer ``(now, refused)``: note the refusals, return the time."""
        result, _, local = done
        if result is None:
            return None
        now, refused = result
        if refused:
            self.refusals.note(refused, local)
        return float(now)
