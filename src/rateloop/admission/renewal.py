"""Local leases renewed ahead of need: the next lease booked off the caller's path.

Once a plan has been to the backend, the process keeps
its *next* lease booked before the current one runs out, off the caller's path
(the flow spawns it: a worker thread or a task, ``spawned.py``): a plain
admission of ``n`` calls' worth *booked* up to ``2 L`` ahead
(:class:`~rateloop.admission.plan.AdmitOp` ``book``), so on a full scope it
lands at the scope's next free start, queued behind every other process's.
``n`` is twice what the process used since its previous renewal, at least one
call and at most 5 % of the allowance (the slice a nearly full bucket lends).
A call that finds the current lease spent and the next one booked ahead is
denied in the process until that start -- the scope has nothing for it
before then -- and the first call after it grants from it.  A renewal the
backend denies (nothing free within ``2 L``) is remembered as a denial for one
call, and the next renewal waits until a booking could land within ``2 L``.  So
on a busy scope nearly every decision is taken in the process: a round trip
on the caller's path is left for a plan's first call and for a call that
arrives while a renewal is still on its way with nothing else known.

The bound (:mod:`rateloop.admission.lease`) is unchanged: a booked lease is
charged as of its start and grants only within ``L`` of it.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from rateloop.admission.lease import Lease, Leases
from rateloop.admission.plan import AdmitOp, AdmitResult
from rateloop.admission.reservation import Denied, denial_reason

__all__ = ["RENEW_AHEAD", "RENEW_SLICE", "STALE_RENEWAL", "Renewal", "Renewals"]

#: A renewal asks for at most this share of each allowance (a nearly full bucket's slice).
RENEW_SLICE = 0.05
#: A renewal books at most this many lease lifetimes ahead.  The bound needs only that a
#: lease grants within ``L`` of its start; how far ahead the start lies only decides how
#: long the process's callers are told to wait for it (never longer than the backend
#: would tell them: the start is the scope's next free one).
RENEW_AHEAD = 2.0
#: A renewal that has not ended after this long (seconds) no longer holds the next back.
STALE_RENEWAL = 10.0


class Renewal(NamedTuple):
    """A plan's next lease, asked for off the caller's path: ``op`` is ``calls`` of one
    call's ``amounts``, booked up to :data:`RENEW_AHEAD` lifetimes ahead."""

    op: AdmitOp
    calls: float
    amounts: tuple[float, ...]


class Renewals:
    """When a plan's next lease is due, and what its answer leaves (sans-IO: the admission
    flow, ``admit.py``, spawns the round trip)."""

    def __init__(self, leases: Leases) -> None:
        self._leases = leases

    def renewal(self, op: AdmitOp) -> Renewal | None:
        """The plan's next lease to ask for now, off the caller's path, or None.

        Due when the plan has been to the backend, no renewal is on its way,
        no next lease is booked, the current one (if any) has started and has
        no more than half of it left, and no renewal was denied or failed too
        recently.  Marks the renewal on its way: :meth:`renewed` (or
        :meth:`renew_failed`) ends it -- or, should neither come (a flow
        closed before it ran), :data:`STALE_RENEWAL` seconds.
        """
        slot = self._leases.known(op.plan)
        if slot is None or not slot.warm or slot.next is not None:
            return None
        now = self._leases.clock.monotonic()
        lease = slot.lease
        if (
            now < slot.renew_after
            or now < slot.renewing
            or (
                lease is not None
                and (lease.received > now or lease.left[0] > lease.borrowed[0] / 2)
            )
        ):
            return None  # one on its way, denied or failed lately, or the current lease ahead
        with slot.lock:
            if now < slot.renewing or slot.next is not None:
                return None
            slot.renewing = now + STALE_RENEWAL
            served, slot.served = slot.served, 0
        amounts = op.amounts
        most = min((al / a for a, al in zip(amounts, op.allowed) if a > 0), default=1.0)  # noqa: B905
        calls = float(max(1, min(2 * served, math.floor(RENEW_SLICE * most))))
        more = tuple(calls * a for a in amounts)
        # A plan that may not book (a class below a reserve kept for the higher ones) renews
        # only what fits now.
        ahead = RENEW_AHEAD * self._leases.lifetime if op.plan.bookable else 0.0
        renew = AdmitOp(op.plan, more, op.allowed, None, op.aimd, ahead)
        return Renewal(renew, calls, amounts)

    def renewed(self, renewal: Renewal, answer: AdmitResult, local: bool, sent: float) -> None:
        """The backend's answer to ``renewal`` (``sent``: monotonic, before it was sent).

        A grant is the plan's next lease, from its start; a denial is
        remembered for one call, and the next renewal waits until a booking
        could land within its horizon (``op.book``).  Run by the local fallback, it
        lends nothing (as a borrow there).
        """
        op = renewal.op
        slot = self._leases.slot(op.plan)
        if slot is None:
            return
        now = self._leases.clock.monotonic()
        if local:
            slot.renew_after = now + self._leases.lifetime
        elif answer.granted:
            ahead = answer.starts_in
            lifetime = self._leases.lifetime
            lease = Lease(
                self._leases,
                op.plan,
                op.amounts,
                list(op.amounts),
                answer.now + ahead,
                now + ahead,
                sent + ahead + lifetime,
            )
            if ahead:  # booked at the next free start: the scope was full then
                lease.full_at = now + ahead
            if now - sent < lifetime:  # else it could not start before it expires: it drains
                with slot.lock:
                    slot.next = lease
                    if not ahead:
                        slot.denied = None
        else:
            wait = answer.wait
            one = wait
            if answer.paused_reason is None and renewal.calls > 1:  # one call fits sooner
                check = next(
                    (c for c in op.plan.checks
                     if c.scope == answer.scope and c.dimension == answer.dimension),
                    None,
                )
                if check is not None and check.rate > 0:
                    index = op.plan.checks.index(check)
                    one = wait - (renewal.calls - 1) * renewal.amounts[index] / check.rate
            slot.renew_after = sent + max(wait - op.book, self._leases.lifetime / 8)
            if not answer.never_fits and one > 0:
                scope = answer.scope or op.plan.checks[0].scope
                dim = answer.dimension
                reason = denial_reason(dim, answer.paused_reason)
                held = Denied(retry_after=one, scope=scope, dimension=dim, reason=reason)
                slot.denied = (held, sent + one, renewal.amounts)
        slot.renewing = -math.inf

    def renew_failed(self, renewal: Renewal) -> None:
        """A renewal ended without an answer (an error): try again a little later."""
        slot = self._leases.slot(renewal.op.plan)
        if slot is not None:
            slot.renew_after = self._leases.clock.monotonic() + self._leases.lifetime / 8
            slot.renewing = -math.inf
