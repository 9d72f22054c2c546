"""How the limiter's flows reach a backend: one step at a time, with the local fallback.

How it works.  The limiter's public methods are generators (*flows*, in
``admit.py`` and ``feedback.py``) that yield steps -- :class:`Do` "run this
operation on the backend" or :class:`Sleep` "sleep this long" -- and receive
their results.  :class:`BackendRunner` performs them: :meth:`BackendRunner.run`
with blocking calls, :meth:`BackendRunner.arun` with awaits, so the algorithm
is written once.  A flow may also :class:`Spawn` another flow to run beside
it (a lease renewed ahead of need, ``lease.py``): on a backend in this
process it runs at once, inline; on a shared one in the background -- on the
runner's worker threads under :meth:`~BackendRunner.run`, as a task of the
running event loop under :meth:`~BackendRunner.arun` -- so the caller never
waits for its round trip.  When the shared backend is unreachable and
``on_unreachable="local"``, an operation runs on a per-process memory backend
holding ``local_share`` of every limit (:mod:`.local`) until
:data:`LOCAL_RETRY_SECONDS` have passed; a settle always goes to the backend
that granted.  Across the transitions nothing is admitted twice: a fallback
starts the local buckets full until the latest start booked on the shared
backend, and the return first books there what the local limiter granted and
still counts, while the process's other calls stay local.  What the backends
say of refusals is kept in :class:`Refusals`, which the flows and the
reservations read.

The runner depends on the backends and :class:`Refusals` only: it knows
nothing of limits, plans or reservations.
"""

from __future__ import annotations

import threading
from collections.abc import Generator
from typing import Any, Literal, TypeVar, cast

from rateloop._clock import Clock, system_clock
from rateloop._url import url_scheme
from rateloop.admission.backends.memory import MemoryBackend
from rateloop.admission.backends.protocol import Backend, BackendUnreachable
from rateloop.admission.local import carry_ops, scaled_op
from rateloop.admission.plan import AdmitOp, AdmitPlan, BorrowOp, SettleOp
from rateloop.admission.refusals import NEVER, Refusals
from rateloop.admission.spawned import Spawned, log
from rateloop.admission.steps import Do, Done, Flow, Sleep, Spawn

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

_NEVER = NEVER  # the ``_local_until`` of a runner that never fell back
_AHEAD_KEPT = 4096  # scopes whose latest booked start is remembered, at most


class _Busy:
    """Another caller is returning to the shared backend (see ``_returning``)."""


_BUSY = _Busy()


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
        # Per scope, the latest start booked on the shared backend (monotonic): the local
        # fallback's buckets are full until then.
        self._ahead: dict[str, float] = {}
        # The plans admitted locally since the fallback (by id, the plan kept alive), with
        # their scaled twins: what is still in use of them is carried back on return.
        self._local_plans: dict[int, tuple[AdmitPlan, AdmitPlan]] = {}
        self._carrying = False  # a caller is booking the local grants on the shared backend
        # Spawned flows: inline on a backend in this process, else in the background.
        self.spawned = Spawned(
            self.run,
            self.arun,
            self.run_many,
            inline=url_scheme(getattr(self._backend, "url", "")) == "memory",
        )

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
    def falling_back(self) -> bool:
        """Has the shared backend been unreachable, and the runner not returned to it yet?"""
        return self._local_until != _NEVER

    @property
    def local(self) -> MemoryBackend | None:
        """The local fallback's backend, once the shared one was unreachable (else None)."""
        return self._local

    def _local_backend(self) -> MemoryBackend:
        with self._lock:
            if self._local is None:
                self._local = MemoryBackend(self._clock, history=False)
            return self._local

    def _shared_after_fallback(self, op: object) -> bool:
        """After a fallback: run ``op`` on the shared backend?

        A settle always is (it belongs where it was granted); anything else
        once :data:`LOCAL_RETRY_SECONDS` have passed.
        """
        return isinstance(op, SettleOp) or self._clock.monotonic() >= self._local_until

    def _fallback(self, exc: BackendUnreachable, *, returning: bool = False) -> None:
        """Start a local window -- unless one is running: the window ends on schedule.

        Several calls in flight can each see the shared backend fail (one
        error per pooled connection); only the first starts the window, so
        the shared backend is tried again :data:`LOCAL_RETRY_SECONDS` after
        the outage was noticed, not after its last echo.  A new window's
        local limiter starts full (:meth:`MemoryBackend.restart_full`), and
        full until the latest start this process booked on the shared
        backend.  ``returning``: the failure came while returning to it.
        """
        if self._on_unreachable != "local":
            raise exc
        now = self._clock.monotonic()
        with self._lock:
            if returning:
                self._carrying = False  # still down (or down again): the next return carries
            if now < self._local_until:
                return
            from_shared = self._local_until == _NEVER
            self._local_until = now + LOCAL_RETRY_SECONDS
        if from_shared:  # the transition, not a retry during the same outage
            now = self._clock.monotonic()
            with self._lock:
                ahead = {s: t for s, t in self._ahead.items() if t > now}
                self._ahead = ahead
                self._local_plans = {}
            self._local_backend().restart_full(ahead)

    def booked_ahead(self, scopes: tuple[str, ...], starts_in: float) -> None:
        """The shared backend booked a call of ``scopes`` to start ``starts_in`` from now.

        Remembered so that a fallback starts the local buckets of those scopes
        full at the latest such start: the booked calls still go, and the
        local grants must not add to them.
        """
        until = self._clock.monotonic() + starts_in
        ahead = self._ahead
        if len(ahead) >= _AHEAD_KEPT:
            now = self._clock.monotonic()
            self._ahead = ahead = {s: t for s, t in ahead.items() if t > now}
        for scope in scopes:
            if ahead.get(scope, _NEVER) < until:
                ahead[scope] = until

    def _returning(self, op: object) -> list[AdmitOp] | _Busy | None:
        """After a fallback's window: return to the shared backend with ``op``?

        ``None``: no (a settle goes to the backend that granted, returning
        nothing).  A list: yes, this caller returns -- it first books on the
        shared backend what the local limiter granted and still counts
        (:func:`~rateloop.admission.local.carry_ops`), then runs ``op`` there.  ``_BUSY``: another
        caller is returning right now; ``op`` stays local meanwhile, so that
        nothing is admitted by a shared backend that has not been charged yet.
        """
        if type(op) is SettleOp:
            return None
        with self._lock:
            if self._local_until == _NEVER:
                return None
            if self._carrying:
                return _BUSY
            self._carrying = True
            plans = dict(self._local_plans)
        return carry_ops(plans, self._local)

    def _abandon_return(self) -> None:
        with self._lock:
            self._carrying = False

    def _returned(self) -> None:
        """The local grants are booked on the shared backend: back to it, the fast path."""
        with self._lock:
            self._local_until = _NEVER
            self._carrying = False
            self._local_plans = {}

    def _note_local(self, op: object, scaled: object) -> None:
        """Remember a plan admitted locally (its grants are carried back on return)."""
        if type(op) is BorrowOp:  # run locally as the call alone (``scaled_op``)
            op = op.op
        if type(op) is AdmitOp and type(scaled) is AdmitOp:
            plan = op.plan
            if id(plan) not in self._local_plans:
                with self._lock:
                    self._local_plans[id(plan)] = (plan, scaled.plan)

    def execute(self, op: object, local: bool = False, deadline: float | None = None) -> Done:
        # The first test is the common case: never fallen back, no clock read.
        if not local and self._local_until == _NEVER:
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
                return result, op, False
        elif not local and self._shared_after_fallback(op):
            done = self._execute_returning(op, deadline)
            if done is not None:
                return done
        scaled = scaled_op(op, self._local_share)
        self._note_local(op, scaled)
        return self._local_backend().execute(scaled), scaled, True

    async def aexecute(
        self, op: object, local: bool = False, deadline: float | None = None
    ) -> Done:
        if not local and self._local_until == _NEVER:
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
                return result, op, False
        elif not local and self._shared_after_fallback(op):
            done = await self._aexecute_returning(op, deadline)
            if done is not None:
                return done
        scaled = scaled_op(op, self._local_share)
        self._note_local(op, scaled)
        return await self._local_backend().aexecute(scaled), scaled, True

    def execute_shared(self, op: object) -> Done:
        """``op`` on the shared backend only: unreachable, or in the local fallback's window,
        it raises :class:`BackendUnreachable` (a failure still starts the window)."""
        self._not_falling_back()
        try:
            return self._backend.execute(op), op, False
        except BackendUnreachable as exc:
            self._fallback(exc)
            raise

    async def aexecute_shared(self, op: object) -> Done:
        self._not_falling_back()
        try:
            return await self._backend.aexecute(op), op, False
        except BackendUnreachable as exc:
            self._fallback(exc)
            raise

    def _not_falling_back(self) -> None:
        if self._local_until != _NEVER:
            raise BackendUnreachable("the shared backend is unreachable: in the local fallback")

    def _return_steps(self, op: object) -> Generator[object, Any, Done | None]:
        """``op`` on the shared backend after a fallback, as the ops to call there;
        returns its answer, or None to run it locally.

        A settle just goes there; anything else first books the local grants
        there when this caller is the one returning (:meth:`_returning`).
        :meth:`_execute_returning` and :meth:`_aexecute_returning` send each
        op's answer back, or throw its error in.
        """
        carry = self._returning(op)
        if isinstance(carry, _Busy):
            return None
        try:
            # Not `yield from`: the drivers send each charge's answer, which a list cannot take.
            for charge in carry or ():  # noqa: UP028
                yield charge
            if carry:  # booked: the local state is now the shared backend's
                self._returned()
            result = yield op
        except BackendUnreachable as exc:
            self._fallback(exc, returning=carry is not None)
            return (None, op, False) if isinstance(op, SettleOp) else None
        except BaseException:  # a timeout, a cancellation: the next call returns
            if carry is not None:
                self._abandon_return()
            raise
        if carry is not None and not carry:  # nothing to book: back once it answered
            self._returned()
        return result, op, False

    def _execute_returning(self, op: object, deadline: float | None) -> Done | None:
        steps = self._return_steps(op)
        try:
            call = next(steps)
            while True:
                try:
                    answer = self._call(call, deadline)
                except BaseException as exc:
                    call = steps.throw(exc)
                else:
                    call = steps.send(answer)
        except StopIteration as stop:
            return cast("Done | None", stop.value)

    async def _aexecute_returning(self, op: object, deadline: float | None) -> Done | None:
        steps = self._return_steps(op)
        try:
            call = next(steps)
            while True:
                try:
                    answer = await self._acall(call, deadline)
                except BaseException as exc:
                    call = steps.throw(exc)
                else:
                    call = steps.send(answer)
        except StopIteration as stop:
            return cast("Done | None", stop.value)

    def _call(self, op: object, deadline: float | None) -> Any:
        if deadline is None:
            return self._backend.execute(op)
        return self._backend.execute(op, timeout=deadline - self._clock.monotonic())

    async def _acall(self, op: object, deadline: float | None) -> Any:
        if deadline is None:
            return await self._backend.aexecute(op)
        return await self._backend.aexecute(op, timeout=deadline - self._clock.monotonic())

    def run(self, flow: Flow[T]) -> T:
        try:
            step = next(flow)
            while True:
                if isinstance(step, Do):
                    if step.shared:
                        step = flow.send(self.execute_shared(step.op))
                    else:
                        step = flow.send(self.execute(step.op, step.local, step.deadline))
                elif isinstance(step, Sleep):
                    self._clock.sleep(step.seconds)
                    step = flow.send(None)
                else:
                    self.spawned.spawn(step.flow)
                    step = flow.send(None)
        except StopIteration as stop:
            return cast(T, stop.value)

    async def arun(self, flow: Flow[T]) -> T:
        try:
            step = next(flow)
            while True:
                if isinstance(step, Do):
                    if step.shared:
                        step = flow.send(await self.aexecute_shared(step.op))
                    else:
                        step = flow.send(await self.aexecute(step.op, step.local, step.deadline))
                elif isinstance(step, Sleep):
                    await self._clock.asleep(step.seconds)
                    step = flow.send(None)
                else:
                    await self.spawned.aspawn(step.flow)
                    step = flow.send(None)
        except StopIteration as stop:
            return cast(T, stop.value)

    def run_many(self, flows: list[Flow[None]]) -> None:
        """Run spawned ``flows`` side by side: at each round their backend steps go
        together, pipelined where the backend can (``execute_many``: one write and one
        read per server).  A flow that fails is logged (its type) and dropped."""
        answers: list[tuple[Flow[None], Any, BaseException | None]] = [
            (flow, None, None) for flow in flows
        ]
        while answers:
            batch: list[tuple[Flow[None], Do]] = []
            for flow, value, error in answers:
                try:
                    step = flow.send(value) if error is None else flow.throw(error)
                    while not isinstance(step, Do) or step.local:  # rare: alone, at once
                        step = flow.send(self._perform(step))
                    batch.append((flow, step))
                except StopIteration:
                    pass
                except Exception as exc:
                    log.debug("a background admission step failed: %s", type(exc).__name__)
            answers = []
            if not batch:
                break
            for (flow, _), done in zip(batch, self._execute_many(batch), strict=True):
                if isinstance(done, BaseException):
                    answers.append((flow, None, done))
                else:
                    answers.append((flow, done, None))

    def _execute_many(self, batch: list[tuple[Flow[None], Do]]) -> list[Done | BaseException]:
        ops = [step.op for _, step in batch]
        many = getattr(self._backend, "execute_many", None)
        if many is not None and self._local_until == _NEVER:
            return [
                r if isinstance(r, BaseException) else (r, op, False)
                for op, r in zip(ops, many(ops), strict=True)
            ]
        out: list[Done | BaseException] = []
        for _, step in batch:
            try:
                out.append(self._perform(step))
            except Exception as exc:
                out.append(exc)
        return out

    def _perform(self, step: Do | Sleep | Spawn) -> Any:
        """One step, blocking: what :meth:`run` does with it, inline there for speed."""
        if isinstance(step, Do):
            if step.shared:
                return self.execute_shared(step.op)
            return self.execute(step.op, step.local, step.deadline)
        if isinstance(step, Sleep):
            self._clock.sleep(step.seconds)
        else:
            self.spawned.spawn(step.flow)
        return None

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
