"""Local leases: shared capacity borrowed in slices and handed out in the process.

How it works.  With ``local_lease_secs = L`` a limiter on a shared backend
decides most admissions without a round trip.  An admission it cannot decide
in the process goes to the backend as a
:class:`~rateloop.admission.plan.BorrowOp`: the call, and -- when it is
granted now -- up to ``k`` more calls of its amounts on every bucket, ``k``
whole.  The backend picks ``k`` from what it sees of each bucket
(:func:`~rateloop.admission.gcra.lease_calls`): a slice of the allowance that
shrinks as the bucket fills -- 25 % of it below half full, 10 % up to 80 %,
5 % above, TensorZero's rule -- within the room left; the process asks for at
most twice what it used of its previous lease (at least one call), so an
idle process does not sit on capacity.  Those ``k`` calls' worth are the
plan's :class:`Lease`, charged on the backend like any admission: every
other process sees them as used.

The rules for a call of a *leasable* plan (rate buckets only: per-minute
requests and tokens; a plan with a day quota or a concurrency limit goes to
the backend as before), in order:

1. A lease whose lifetime ``L`` (from when its borrow was sent) has passed,
   or one of whose scopes has a refusal in force that this process knows of
   -- a pause or a 429 of its own, or another process's as the backend
   reported it -- is dropped.
2. A lease that holds the call's amounts grants it (no round trip).
3. When it is spent, the *next* lease (booked by a renewal,
   :mod:`rateloop.admission.renewal`) takes over; one that starts later
   denies the call until its start (no round trip; a call that books a
   start at least that far takes it and starts then), and a spent lease
   that was booked ahead denies it until one call's refill after its start.
4. A denial the backend gave this plan for an equal or larger cost denies it
   until its ``retry_after`` (no round trip; a call that books a start
   skips this rule, since the backend may book it).
5. Otherwise the call borrows (one round trip).  One borrow per plan at a
   time: a call meanwhile goes to the backend alone.

A grant from a lease is a :class:`~rateloop.admission.reservation.Reservation`
whose settle goes to its lease while the lease lives -- unused tokens go back
into it and are handed out again, usage above the estimate is taken from it
when it holds enough -- and otherwise to the backend, as any settle.  Closing
the limiter gives back what is left of every lease
(:class:`~rateloop.admission.plan.ReturnOp`): only what cannot have drained
since it was borrowed (:func:`~rateloop.admission.gcra.returnable`).  What
is left of a lease that expires or is dropped is not given back: it drains.

The bound.  Every unit a lease grants was charged on the backend when it was
borrowed, at most ``L`` before; a return gives back only units that no call
got and that are still in the bucket.  So the backend's bucket bounds the
borrows as it bounds admissions, and the units granted from leases and by the
backend in any window of ``W`` seconds, across every process, are at most
``max(capacity, largest call) + rate x (W + L)`` (docs/admission.md, "Local
leases").  A booked lease is charged as of its start ``s`` (the bucket admits
its units at ``s``, as any booking) and grants only within ``[s, s + L]``:
the same argument, with ``s`` in place of the borrow's time.  The price: a
process can hold, for at most ``L``, up to its slice of capacity that another
process is waiting for.
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from dataclasses import dataclass, field
from operator import ge
from typing import Any, Protocol

from rateloop._clock import Clock
from rateloop.admission.gcra import AIMD
from rateloop.admission.plan import (
    AdmitOp,
    AdmitPlan,
    AdmitResult,
    BorrowOp,
    CheckKind,
    ReturnOp,
    SettleOp,
)
from rateloop.admission.reservation import Denied, Reservation, Settler, denial_reason
from rateloop.route import Cost, Route
from rateloop.signal import Dimension

__all__ = ["MAX_LEASE_SECONDS", "Lease", "Leases", "lease_seconds"]

#: The longest lease lifetime ``local_lease_secs`` may set (seconds).
MAX_LEASE_SECONDS = 60.0
#: A lease's amounts left are compared with this relative slack: ``k`` subtractions of a
#: call's amounts from ``k`` times them may leave a rounding error below the last call.
_SLACK = 1e-9
_SLOTS_KEPT = 4096
_MINUTE = frozenset(
    {Dimension.REQUESTS, Dimension.INPUT_TOKENS, Dimension.OUTPUT_TOKENS, Dimension.TOKENS}
)


def lease_seconds(value: object) -> float | None:
    """``local_lease_secs`` checked: seconds, ``0 < L <= 60``, or None (no leases)."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 < value <= MAX_LEASE_SECONDS
    ):
        raise ValueError(
            f"local_lease_secs must be seconds, 0 < L <= {MAX_LEASE_SECONDS:g}, or None "
            f"(no local leases), got {value!r}"
        )
    return float(value)


def _refill(plan: AdmitPlan, amounts: tuple[float, ...]) -> float:
    """The least time a full bucket of ``plan`` needs to drain one call of ``amounts``
    (which bucket was full is not known: the smallest, 0 if the call skips one)."""
    return min(
        (a / c.rate for a, c in zip(amounts, plan.checks) if c.rate > 0),  # noqa: B905
        default=0.0,
    )


def leasable(plan: AdmitPlan) -> bool:
    """Can ``plan`` borrow?  Only per-minute rate buckets (no day quota, no concurrency)."""
    return bool(plan.checks) and all(
        c.kind is CheckKind.BUCKET and c.dimension in _MINUTE for c in plan.checks
    )


class _Refusals(Protocol):
    def before(self, scopes: tuple[str, ...], start: float, local: bool) -> bool: ...


@dataclass(slots=True, eq=False)
class Lease:
    """What one borrow of ``plan`` holds: ``left`` of ``borrowed`` per check, until ``expires``.

    ``since`` is the backend's time of the borrow; ``received`` (monotonic)
    when its answer came, so ``since + (now - received)`` is never later than
    the backend's now.  ``expires`` is ``L`` after the borrow was *sent*, so
    no unit is granted later than ``L`` after it was charged.  A lease booked
    ``s`` seconds ahead has both moved by ``s``: ``since`` is the backend's
    time of its start and ``received`` the monotonic time from which it may
    grant (never before the backend reaches that start).  A lease is the
    :class:`~rateloop.admission.reservation.Settler` of the reservations it
    grants.
    """

    owner: Leases
    plan: AdmitPlan
    borrowed: tuple[float, ...]
    left: list[float]
    since: float
    received: float
    expires: float
    calls: int = 0
    #: Booked ahead, its start (monotonic) found the scope full: once it is spent, nothing
    #: is free for a call before one call's refill after it.
    full_at: float = -math.inf

    def backend_now(self, now: float) -> float:
        """The backend's time at the monotonic ``now``, never later than it really is."""
        return self.since + (now - self.received)

    # -- the Settler protocol: what a reservation granted from this lease calls back ------

    @property
    def aimd(self) -> AIMD:
        return self.owner.settler.aimd

    def refused_before(self, scopes: tuple[str, ...], start: float, local: bool) -> bool:
        return self.owner.settler.refused_before(scopes, start, local)

    def settle(self, op: SettleOp, *, local: bool) -> float | None:
        """Into the lease while it lives; else on the backend, as any settle."""
        at = self.owner.absorb(self, op)
        return at if at is not None else self.owner.settler.settle(op, local=False)

    async def asettle(self, op: SettleOp, *, local: bool) -> float | None:
        at = self.owner.absorb(self, op)
        return at if at is not None else await self.owner.settler.asettle(op, local=False)


@dataclass(slots=True, eq=False)
class _Slot:
    """A leasable plan's lease, the borrow under way and the denial remembered.

    Its own lock guards taking from the lease and starting a borrow (threads
    on different plans never wait for each other); ``lease`` and ``denied``
    are each replaced whole, so reading them needs no lock.
    """

    lease: Lease | None = None
    borrowing: float = -math.inf  # monotonic: a borrow was sent and is not answered before it
    served: int = 0  # calls granted from leases since the last borrow
    #: The backend's denial, until when it holds (monotonic), for amounts at least these.
    denied: tuple[Denied, float, tuple[float, ...]] | None = None
    #: The lease booked to follow ``lease`` (it may start later), and its renewal's state.
    next: Lease | None = None
    warm: bool = False  # the plan has been to the backend: renew its leases ahead of need
    renewing: float = -math.inf  # monotonic: a renewal is on its way until then at most
    renew_after: float = -math.inf  # monotonic: no renewal before (one denied, or failed)
    lock: threading.Lock = field(default_factory=threading.Lock)


#: Every Leases of this process: a forked child forgets what its parent held (the parent
#: still grants it; its renewals on their way never end in the child).
_LIVE: weakref.WeakSet[Leases] = weakref.WeakSet()


def _forget_in_child() -> None:
    for leases in list(_LIVE):
        leases.forget()


os.register_at_fork(after_in_child=_forget_in_child)

#: ``_slots.get``'s default: a plan not seen yet.
_UNKNOWN = _Slot()


class Leases:
    """The leases of one limiter, per plan; the sans-IO half of borrowing.

    The admission flows (``admit.py``) ask :meth:`take` first, send what
    :meth:`borrow` gives, and pass the answer through :meth:`borrowed`;
    :meth:`decided` remembers denials; :meth:`returns` is what closing gives
    back.  Each plan's slot has its own lock: each step is a few comparisons.
    """

    def __init__(
        self, lifetime: float, *, clock: Clock, refusals: _Refusals, settler: Settler
    ) -> None:
        _LIVE.add(self)
        self.lifetime = lifetime
        self.settler = settler
        self._clock = clock
        self._refusals = refusals
        self._lock = threading.Lock()
        self._slots: dict[AdmitPlan, _Slot | None] = {}

    def __repr__(self) -> str:
        live = sum(
            (s.lease is not None) + (s.next is not None)
            for s in self._slots.values()
            if s is not None
        )
        return f"Leases(lifetime={self.lifetime:g}s, plans={len(self._slots)}, leases={live})"

    def slot(self, plan: AdmitPlan) -> _Slot | None:
        slot = self._slots.get(plan, _UNKNOWN)
        if slot is not _UNKNOWN:
            return slot
        new = _Slot() if leasable(plan) else None
        with self._lock:
            if len(self._slots) >= _SLOTS_KEPT:  # plans replaced by new limits, mostly
                now = self._clock.monotonic()
                self._slots = {
                    p: s
                    for p, s in self._slots.items()
                    if s is not None
                    and any(x is not None and x.expires > now for x in (s.lease, s.next))
                }
            return self._slots.setdefault(plan, new)

    def known(self, plan: AdmitPlan) -> _Slot | None:
        """``plan``'s slot if it has one already (None: not seen yet, or it cannot lease)."""
        return self._slots.get(plan)

    @property
    def clock(self) -> Clock:
        return self._clock

    def take(self, op: AdmitOp, route: Route, cost: Cost) -> Reservation | Denied | None:
        """Decide ``op`` in the process (rules 1-4), or None: ask the backend."""
        plan = op.plan
        slot = self.slot(plan)
        if slot is None:
            return None
        now = self._clock.monotonic()
        amounts = op.amounts
        if slot.lease is not None or slot.next is not None:
            with slot.lock:
                got = self._from_leases(slot, plan, amounts, now, op.book)
            if isinstance(got, Lease):  # a booking may take a lease booked ahead: its start
                ahead = max(0.0, got.received - now)
                at = got.backend_now(now)
                return Reservation(got, route, cost, plan, None, at, False, ahead)
            if got is not None:  # the next lease starts then: nothing before
                first = plan.checks[0]
                return Denied(
                    retry_after=max(got - now, 0.001),
                    scope=first.scope,
                    dimension=first.dimension,
                    reason=denial_reason(first.dimension),
                )
        denied = slot.denied
        if (
            denied is not None
            and not op.book
            and now < denied[1]
            and all(map(ge, amounts, denied[2]))
        ):
            held = denied[0]
            return Denied(
                retry_after=max(denied[1] - now, 0.001),
                scope=held.scope,
                dimension=held.dimension,
                reason=held.reason,
            )
        return None

    def _from_leases(
        self, slot: _Slot, plan: AdmitPlan, amounts: tuple[float, ...], now: float, book: float
    ) -> Lease | float | None:
        """Take ``amounts`` from the current lease, then the next (under the slot's lock).

        Returns the lease taken from -- one booked ahead only for a call that
        books at least that far (``book``) --, or a monotonic time nothing is
        free before: the start of a lease that has not started, or, for a spent
        lease that was booked ahead, one call's refill after its start (the
        scope was full then); or None: no lease can.  A lease expired,
        refused or too small for the call gives way to the next one; what is
        left of it drains.
        """
        while True:
            lease = slot.lease
            if lease is None:
                lease = slot.next
                if lease is None:
                    return None
                slot.lease, slot.next = lease, None
            ahead = lease.received - now
            if now >= lease.expires or self._refusals.before(
                plan.scopes, lease.since + max(0.0, -ahead), False
            ):
                slot.lease = None
                continue
            left = lease.left
            if all(a <= x + _SLACK * a for a, x in zip(amounts, left)):  # noqa: B905
                if ahead > 0 and book < ahead:
                    return lease.received
                for i, a in enumerate(amounts):
                    left[i] = max(0.0, left[i] - a)
                lease.calls += 1
                slot.served += 1
                return lease
            if slot.next is None:  # spent: a lease booked ahead knows the scope is full
                if lease.full_at > -math.inf:
                    until = lease.full_at + _refill(plan, amounts)
                    if until > now + book:
                        return until
                return None
            slot.lease = None

    def forget(self) -> None:
        """Drop every lease, denial and renewal state (a forked child: the parent's)."""
        self._lock = threading.Lock()
        self._slots = {}

    def borrow(self, op: AdmitOp) -> AdmitOp | BorrowOp:
        """What to send for a call :meth:`take` left to the backend (rule 5).

        A :class:`BorrowOp` asking for at most twice what the previous lease
        served (at least one call), unless the plan cannot lease or one of
        its borrows is under way: then ``op`` alone.
        """
        slot = self.slot(op.plan)
        if slot is None:
            return op
        now = self._clock.monotonic()
        with slot.lock:
            if slot.borrowing > now:
                return op
            slot.borrowing = now + self.lifetime  # cleared by the answer (or it expires)
            most = float(max(1, 2 * slot.served))
            slot.served = 0
        return BorrowOp(op, most)

    def abandon(self, sent: object) -> None:
        """A borrow ended without an answer (an error, a cancellation): let the next one go."""
        if type(sent) is BorrowOp:
            slot = self.slot(sent.op.plan)
            if slot is not None:
                slot.borrowing = -math.inf

    def borrowed(
        self, send: object, done: tuple[Any, Any, bool], sent: float
    ) -> tuple[Any, Any, bool]:
        """The backend's answer to ``send`` (what :meth:`borrow` gave), as an admission's.

        A grant that borrowed ``k > 0`` more becomes the plan's lease
        (``sent``: the monotonic time before the borrow was sent).  A borrow
        the local fallback ran was the call alone (it lends nothing).
        """
        if type(send) is not BorrowOp:
            return done
        slot = self.slot(send.op.plan)
        result, ran, local = done
        if type(ran) is not BorrowOp:  # run by the local fallback: the call alone
            if slot is not None:
                slot.borrowing = -math.inf
            return done
        answer: AdmitResult = result[0]
        k: float = result[1]
        inner: AdmitOp = ran.op
        if slot is None:
            return answer, inner, local
        if k > 0 and answer.granted and not answer.starts_in:
            borrowed = tuple(k * a for a in inner.amounts)
            now = self._clock.monotonic()
            lease = Lease(
                self, inner.plan, borrowed, list(borrowed), answer.now, now, sent + self.lifetime
            )
            with slot.lock:  # a live lease that still holds units keeps serving first
                current = slot.lease
                if (
                    current is not None
                    and slot.next is None
                    and now < current.expires
                    and any(current.left)
                ):
                    slot.next = lease
                else:
                    slot.lease = lease
        slot.borrowing = -math.inf
        return answer, inner, local

    def decided(self, op: AdmitOp, outcome: Reservation | Denied, sent: float) -> None:
        """Remember the backend's denial of ``op`` (rule 4); a grant forgets it.  Either
        way the plan is now known: its leases are renewed ahead of need."""
        slot = self.slot(op.plan)
        if slot is None:
            return
        slot.warm = True
        if isinstance(outcome, Reservation):
            if not outcome.starts_in:  # it fits now: the denial is over
                slot.denied = None
        elif not outcome.never_fits:
            slot.denied = (outcome, sent + outcome.retry_after, op.amounts)

    def absorb(self, lease: Lease, op: SettleOp) -> float | None:
        """Settle ``op`` into ``lease`` if it lives and holds any overrun; its backend time.

        None: the lease is gone (expired, dropped, replaced) or cannot cover
        the usage above the estimate -- the settle goes to the backend.
        """
        now = self._clock.monotonic()
        slot = self._slots.get(lease.plan)
        if slot is None:
            return None
        with slot.lock:
            if slot.lease is not lease or now >= lease.expires:
                return None
            index = lease.plan.checks.index
            changes = [(index(c), d) for c, d in zip(op.checks, op.deltas, strict=True)]
            left = lease.left
            if any(d > left[i] for i, d in changes):
                return None
            for i, d in changes:
                left[i] = min(lease.borrowed[i], left[i] - d)
        return lease.backend_now(now)

    def returns(self) -> list[ReturnOp]:
        """Give back what is left of every lease (closing); the leases are forgotten."""
        with self._lock:
            leases = [
                x
                for s in self._slots.values()
                if s is not None
                for x in (s.lease, s.next)
                if x is not None
            ]
            self._slots = {}
        aimd = self.settler.aimd
        return [
            ReturnOp(lease.plan.checks, lease.borrowed, tuple(lease.left), lease.since, aimd)
            for lease in leases
            if any(lease.left)
        ]

