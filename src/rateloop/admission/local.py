"""The local fallback's arithmetic: limits scaled to the local share, and the way back.

How it works.  While the shared backend is unreachable (``on_unreachable =
"local"``) a process admits on its own memory backend holding ``local_share``
of every limit (:func:`scaled_op`).  When it returns, it first books on the
shared backend what the local limiter granted and still counts
(:func:`carry_ops`): the shared backend -- restarted empty, or drained during
the outage -- would otherwise admit a whole bucket on top of the local grants
still starting or draining.  Pure values over a :class:`MemoryBackend`; the
:class:`~rateloop.admission.runner.BackendRunner` decides when.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from rateloop.admission.backends.memory import MemoryBackend
from rateloop.admission.gcra import AIMD
from rateloop.admission.plan import AdmitOp, AdmitPlan, BorrowOp, Check, CheckKind, ObserveOp
from rateloop.route import Priority
from rateloop.signal import Dimension

__all__ = ["carry_ops", "scaled_check", "scaled_op", "scaled_plan"]

#: Carrying the local grants back: an allowance no charge exceeds (a charge, not a request),
#: and how far behind the shared backend's own bookings it may be booked.
_CARRY_ALLOWED = 1e300
_CARRY_BOOK_SECONDS = 3600.0


def scaled_check(check: Check, share: float) -> Check:
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


def scaled_plan(plan: AdmitPlan, share: float) -> AdmitPlan:
    """``plan`` with every check scaled to ``share``; remembered on the plan."""
    local = plan.local
    if local is not None and local[0] == share:
        return local[1]
    scaled = AdmitPlan(
        plan.scopes,
        tuple(scaled_check(c, share) for c in plan.checks),
        plan.priority,
        plan.profile,
    )
    plan.local = (share, scaled)
    return scaled


def scaled_op(op: object, share: float) -> object:
    """``op`` as the local fallback runs it: its checks at ``share`` of their limits.

    A borrow is the call alone: the local fallback lends nothing (a lease is
    shared capacity).
    """
    if type(op) is BorrowOp:
        op = op.op
    if share >= 1.0:
        return op
    if isinstance(op, AdmitOp):
        plan = scaled_plan(op.plan, share)
        return op._replace(plan=plan, allowed=plan.allowances(op.amounts))
    if isinstance(op, ObserveOp):
        return replace(
            op,
            tightenings=tuple(
                replace(t, check=scaled_check(t.check, share)) for t in op.tightenings
            ),
        )
    return op  # settle ops of local reservations already hold scaled checks


def carry_ops(
    plans: Mapping[int, tuple[AdmitPlan, AdmitPlan]], local: MemoryBackend | None
) -> list[AdmitOp]:
    """What the local limiter granted that is still in use, as charges on the shared backend.

    Without them the shared backend (restarted empty, or drained during
    the outage) admits a whole bucket on top of the local grants still
    starting or draining.  Each bucket the local plans used is charged
    with its units in use (bookings ahead included) -- always granted,
    booked behind the shared backend's own bookings, taking no lease --
    so the shared backend's next calls wait for them.  One operation per
    ``provider:model`` (a Redis Cluster script touches one slot).
    """
    if local is None or not plans:
        return []
    in_use: dict[tuple[str, Dimension], tuple[Check, float]] = {}
    for plan, scaled in plans.values():
        for check, mine in zip(plan.checks, scaled.checks, strict=True):
            key = (check.scope, check.dimension)
            if check.kind is CheckKind.BUCKET and key not in in_use:
                in_use[key] = (check, local.in_use(mine))
    by_model: dict[str, list[tuple[Check, float]]] = {}
    for check, amount in in_use.values():
        if amount > 0.0:
            model = ":".join(check.scope.split(":", 2)[:2])
            by_model.setdefault(model, []).append((check, amount))
    ops = []
    for items in by_model.values():
        checks = tuple(c for c, _ in items)
        plan = AdmitPlan(tuple(dict.fromkeys(c.scope for c in checks)), checks,
                         Priority.INTERACTIVE)
        amounts = tuple(a for _, a in items)
        allowed = (_CARRY_ALLOWED,) * len(items)
        ops.append(AdmitOp(plan, amounts, allowed, None, AIMD(), _CARRY_BOOK_SECONDS))
    return ops
