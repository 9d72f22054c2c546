"""Local leases (``local_lease_secs``): what a process borrows, grants in the process, gives back.

Several limiters sharing one backend object stand for several processes sharing a Redis;
a :class:`Counting` backend (a real MemoryBackend that counts the operations it runs)
shows which admissions needed a round trip.  The window bound across processes is in
``test_admission_lease_bound.py``.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

import pytest

import _limiters
from rateloop.admission import LimitSpec
from rateloop.admission.backends import MemoryBackend
from rateloop.admission.gcra import AIMD, lease_calls, returnable
from rateloop.admission.limiter import Limiter
from rateloop.admission.plan import AdmitOp, AdmitPlan, BorrowOp, PauseOp, ReturnOp, build_checks
from rateloop.admission.reservation import Denied, Reservation
from rateloop.errors import ConfigError
from rateloop.policy import Policy
from rateloop.route import Cost, Priority, Route
from rateloop.testing import FakeClock

MODEL = "openai:gpt-5"
ROUTE = Route(provider="openai", model="gpt-5")
#: 10 at once, 10 a second.
TEN = {MODEL: LimitSpec(requests_per_minute=600, burst=1 / 60)}
limiter = _limiters.limiter  # memory, then the real Redis (the conformance fixture)


def is_renewal(op: object) -> bool:
    """A bare admission booked ahead: a lease renewal (with leases on, nothing else is)."""
    return type(op) is AdmitOp and op.book > 0


class Counting:
    """A real MemoryBackend that counts the operations it runs, by type.

    A bare admission booked ahead is a lease renewal (``lease.py``: the next lease, asked
    for off the caller's path): counted as ``Renewal``.  ``trips`` counts the round trips
    on the callers' path only.
    """

    url = "memory://"

    def __init__(self, clock: FakeClock) -> None:
        self.inner = MemoryBackend(clock)
        self.ops: Counter[str] = Counter()

    def execute(self, op: object, *, timeout: float | None = None) -> object:
        self.ops["Renewal" if is_renewal(op) else type(op).__name__] += 1
        return self.inner.execute(op)

    async def aexecute(self, op: object, *, timeout: float | None = None) -> object:
        return self.execute(op)

    def close(self) -> None: ...

    async def aclose(self) -> None: ...

    @property
    def trips(self) -> int:
        return sum(n for name, n in self.ops.items() if name != "Renewal")


def fleet(n: int, clock: FakeClock, lease: float | None = 1.0, limits: Any = None) -> tuple[
    Counting, list[Limiter]
]:
    backend = Counting(clock)
    limiters = [
        Limiter(backend, limits=limits or TEN, clock=clock, rng=random.Random(i),
                local_lease_secs=lease)
        for i in range(n)
    ]
    return backend, limiters


ONE = Cost()


def grants(limiter: Limiter, n: int, cost: Cost = ONE, route: Route = ROUTE) -> int:
    return sum(isinstance(limiter.try_reserve(route, cost), Reservation) for _ in range(n))


# -- the backends' two operations: one suite, memory and Redis ------------------------------


def _plan(spec: LimitSpec, scope: str = MODEL) -> AdmitPlan:
    return AdmitPlan((scope,), tuple(build_checks(scope, spec)), Priority.INTERACTIVE)


def _op(plan: AdmitPlan, amount: float, book: float = 0.0) -> AdmitOp:
    return AdmitOp(plan, (amount,), plan.shares, None, AIMD(), book)


def test_a_borrow_takes_a_slice_that_shrinks_as_the_bucket_fills(limiter: Limiter) -> None:
    # 1,000 at once, refilled at 16.7 a second: Redis's clock moves a few ms between calls,
    # far from every threshold below.
    plan = _plan(LimitSpec(requests_per_minute=1_000, burst=1.0))
    backend = limiter.backend
    ks = []
    for _ in range(9):
        result, k = backend.execute(BorrowOp(_op(plan, 10.0), 1_000.0))  # type: ignore[misc]
        ks.append(k if result.granted else None)
    # 25 % of 1,000 below half full, 10 % up to 80 %, 5 % above, within the room left;
    # then full: denied, nothing borrowed.
    assert ks == [25, 25, 10, 10, 10, 5, 5, 2, None]
    result, k = backend.execute(BorrowOp(_op(plan, 10.0), 1_000.0))  # type: ignore[misc]
    assert (result.granted, k) == (False, 0.0)


def test_a_borrow_never_takes_more_than_asked_nor_when_booked_or_paused(limiter: Limiter) -> None:
    plan = _plan(LimitSpec(requests_per_minute=600, burst=1 / 60))  # 10 at once, 10/s
    backend = limiter.backend
    result, k = backend.execute(BorrowOp(_op(plan, 1.0), 1.0))  # type: ignore[misc]
    assert result.granted and k == 1.0  # the slice would allow 2
    for _ in range(8):
        backend.execute(_op(plan, 1.0))
    result, k = backend.execute(BorrowOp(_op(plan, 1.0, book=5.0), 100.0))  # type: ignore[misc]
    assert result.granted and result.starts_in > 0 and k == 0.0  # booked: no lease
    backend.execute(PauseOp(scope=MODEL, seconds=30, reason="test"))
    result, k = backend.execute(BorrowOp(_op(plan, 1.0), 100.0))  # type: ignore[misc]
    assert not result.granted and result.paused_reason == "test" and k == 0.0


def test_a_return_gives_back_only_what_cannot_have_drained(limiter: Limiter) -> None:
    plan = _plan(LimitSpec(requests_per_minute=1_000, burst=1.0))
    backend = limiter.backend
    result, k = backend.execute(BorrowOp(_op(plan, 10.0), 4.0))  # type: ignore[misc]
    assert k == 4.0  # 10 + 40 in use
    _, given = backend.execute(ReturnOp(plan.checks, (40.0,), (30.0,), result.now, AIMD()))
    assert given[0] == pytest.approx(30.0, abs=1.0)  # a few ms of drain on Redis
    # Borrowed long ago: drained at the rate since, so nothing of it is left to give back.
    result, k = backend.execute(BorrowOp(_op(plan, 10.0), 4.0))  # type: ignore[misc]
    _, given = backend.execute(ReturnOp(plan.checks, (40.0,), (40.0,), result.now - 60, AIMD()))
    assert given == (0.0,)


@pytest.mark.parametrize(
    ("used", "allowed", "amount", "calls"),
    [(1, 10, 1, 2), (5, 10, 1, 1), (8, 10, 1, 0), (10, 10, 1, 0), (11, 10, 1, 0), (0, 10, 0, None)],
)
def test_lease_calls(used: float, allowed: float, amount: float, calls: float | None) -> None:
    got = lease_calls(used, allowed, amount)
    assert got == (float("inf") if calls is None else calls)


def test_returnable() -> None:
    assert returnable(40, 30, 10, since=0, at=0) == 30
    assert returnable(40, 30, 10, since=0, at=2) == 20  # 20 of the 40 may have drained
    assert returnable(40, 30, 10, since=0, at=5) == 0


# -- one process ------------------------------------------------------------------------------


def test_leases_are_off_by_default_every_admission_is_a_round_trip() -> None:
    backend, (plain,) = fleet(1, FakeClock(), lease=None)
    assert grants(plain, 12) == 10
    assert backend.ops == {"AdmitOp": 12}


def test_a_process_grants_from_its_lease_and_renews_it_off_the_callers_path() -> None:
    clock = FakeClock()
    backend, (a,) = fleet(1, clock)
    outcomes = [a.try_reserve(ROUTE, Cost()) for _ in range(12)]
    assert [bool(o) for o in outcomes] == [True] * 10 + [False] * 2
    # The first call borrows (one more call: k=1).  From the second on, each call decided
    # in the process books the next lease beside it: one call (twice what it served,
    # capped at 5 % of 10, at least one).  The 10th call's renewal lands 0.1 s ahead, at
    # the bucket's next free start, so the 11th and 12th are denied in the process until
    # then: one round trip on the callers' path for 12 calls.
    assert backend.ops == {"BorrowOp": 1, "Renewal": 9}
    assert all(isinstance(o, Denied) and o.retry_after == pytest.approx(0.1) for o in outcomes[10:])
    clock.advance(0.1)  # the booked lease starts: the first call after grants from it
    r = a.try_reserve(ROUTE, Cost())
    assert isinstance(r, Reservation) and r.granted_at == pytest.approx(0.1)
    assert backend.trips == 1


def test_a_booked_lease_is_taken_by_a_booking_and_starts_when_it_was_booked() -> None:
    clock = FakeClock()
    backend, (a,) = fleet(1, clock)
    grants(a, 10)  # the 10th call's renewal is booked 0.1 s ahead
    booked = a.try_reserve(ROUTE, Cost(), book_within=1.0)
    assert isinstance(booked, Reservation)
    assert booked.starts_in == pytest.approx(0.1) and backend.trips == 1
    assert booked.granted_at + booked.starts_in == pytest.approx(0.1)
    # That lease found the scope full at its start: nothing is free before one call's refill
    # after it (0.2), what the backend would answer too -- denied in the process.
    nothing = a.try_reserve(ROUTE, Cost(), book_within=0.05)
    assert isinstance(nothing, Denied) and nothing.retry_after == pytest.approx(0.2)
    assert backend.trips == 1
    later = a.try_reserve(ROUTE, Cost(), book_within=0.5)  # far enough: the backend books it
    assert isinstance(later, Reservation) and later.starts_in == pytest.approx(0.2)
    assert backend.trips == 2


def test_a_lease_lives_local_lease_secs_from_its_borrow() -> None:
    clock = FakeClock()
    limits = {MODEL: LimitSpec(requests_per_minute=60_000)}  # 1,000 at once
    backend, (a,) = fleet(1, clock, lease=0.5, limits=limits)
    grants(a, 4)  # leases of 1, then 2: one unit left
    trips = backend.trips
    clock.advance(0.499)
    assert grants(a, 1) == 1 and backend.trips == trips  # from the lease
    grants(a, 3)
    trips = backend.trips
    clock.advance(0.5)  # the lease borrowed last has just expired
    assert grants(a, 1) == 1 and backend.trips == trips + 1


def test_plans_with_a_day_quota_or_concurrency_do_not_lease() -> None:
    clock = FakeClock()
    limits = {
        MODEL: LimitSpec(requests_per_minute=600),
        "openai:gpt-5:p": LimitSpec(concurrency=100),
        "openai:gpt-5:q": LimitSpec(requests_per_day=100),
    }
    backend, (a,) = fleet(1, clock, limits=limits)
    for project in ("p", "q"):
        route = Route(provider="openai", model="gpt-5", project=project)
        assert grants(a, 3, route=route) == 3
    assert backend.ops["AdmitOp"] == 6 and backend.ops["BorrowOp"] == 0


def test_a_remembered_denial_is_local_but_a_booking_still_asks() -> None:
    clock = FakeClock()
    backend, (a,) = fleet(1, clock, lease=0.04)  # a renewal books at most 2 L = 0.08 s ahead
    grants(a, 10)  # the 10th call's renewal is denied: the next start is 0.1 s away
    trips = backend.trips
    d = a.try_reserve(ROUTE, Cost())
    assert isinstance(d, Denied) and backend.trips == trips
    booked = a.try_reserve(ROUTE, Cost(), book_within=1.0)
    assert isinstance(booked, Reservation) and booked.starts_in > 0
    assert backend.trips == trips + 1
    clock.advance(d.retry_after)  # the remembered denial ends: the backend is asked again
    a.try_reserve(ROUTE, Cost())
    assert backend.trips == trips + 2


def test_settling_a_leased_grant_refunds_into_the_lease_while_it_lives() -> None:
    clock = FakeClock()
    limits = {MODEL: LimitSpec(input_tokens_per_minute=60_000, burst=1 / 60)}  # 1,000 at once
    backend, (a,) = fleet(1, clock, limits=limits)
    first = a.try_reserve(ROUTE, Cost(input_tokens=100))  # borrows one more call: 100 tokens
    leased = a.try_reserve(ROUTE, Cost(input_tokens=100))
    assert isinstance(first, Reservation) and isinstance(leased, Reservation)
    trips = backend.trips
    leased.settle(40, 0)  # 60 unused: back into the lease, no round trip
    assert backend.trips == trips
    assert isinstance(a.try_reserve(ROUTE, Cost(input_tokens=60)), Reservation)
    assert backend.trips == trips  # the refund was granted again from the lease
    again = a.try_reserve(ROUTE, Cost(input_tokens=100))  # borrows (the lease is empty)
    more = a.try_reserve(ROUTE, Cost(input_tokens=100))
    assert isinstance(again, Reservation) and isinstance(more, Reservation)
    clock.advance(1.0)  # the lease has expired: its grants settle on the backend
    trips = backend.trips
    more.settle(10, 0)
    assert backend.ops["SettleOp"] == 1 and backend.trips == trips + 1


def test_usage_above_the_estimate_is_taken_from_the_lease_when_it_holds_it() -> None:
    clock = FakeClock()
    limits = {MODEL: LimitSpec(input_tokens_per_minute=600_000, burst=1 / 60)}  # 10k at once
    backend, (a,) = fleet(1, clock, limits=limits)
    # A lease of 100 tokens, taken by the second call, which books the next: 200 tokens.
    grants(a, 2, Cost(input_tokens=100))
    leased = a.try_reserve(ROUTE, Cost(input_tokens=100))  # from it: 100 left
    assert isinstance(leased, Reservation) and backend.ops == {"BorrowOp": 1, "Renewal": 2}
    leased.settle(150, 0)  # 50 above the estimate: the lease holds it
    assert backend.trips == 1 and backend.ops["SettleOp"] == 0
    assert isinstance(a.try_reserve(ROUTE, Cost(input_tokens=50)), Reservation)
    assert backend.trips == 1  # exactly the 50 left
    over = a.try_reserve(ROUTE, Cost(input_tokens=100))  # from the next lease: 100 left
    assert isinstance(over, Reservation) and backend.trips == 1
    over.settle(300, 0)  # 200 above: more than the lease holds, the backend takes it
    assert backend.ops["SettleOp"] == 1


# -- several processes --------------------------------------------------------------------------


def test_a_pause_stops_this_process_at_once_and_the_others_within_the_lease_lifetime() -> None:
    clock = FakeClock()
    limits = {MODEL: LimitSpec(requests_per_minute=6_000, burst=1 / 60)}  # 100 at once
    _, (a, b) = fleet(2, clock, lease=1.0, limits=limits)
    grants(a, 3)
    grants(b, 3)  # each holds a lease of 2 (leases of 1, then 2)
    a.pause(MODEL, 30, "provider said so")
    assert isinstance(a.try_reserve(ROUTE, Cost()), Denied)  # at once: its lease is dropped
    after = [b.try_reserve(ROUTE, Cost()) for _ in range(5)]
    # b does not know yet: it grants what its lease holds, and no more.
    assert [bool(r) for r in after] == [True, True, False, False, False]
    clock.advance(1.0)
    assert isinstance(b.try_reserve(ROUTE, Cost()), Denied)


def test_a_process_drops_its_leases_when_the_backend_reports_another_s_pause() -> None:
    clock = FakeClock()
    limits = {MODEL: LimitSpec(input_tokens_per_minute=600_000, burst=1 / 60)}  # 10k at once
    _, (a, b) = fleet(2, clock, limits=limits)
    on_backend = b.try_reserve(ROUTE, Cost(input_tokens=100))  # granted by the backend
    assert isinstance(on_backend, Reservation)
    grants(b, 2, Cost(input_tokens=100))  # b holds a lease of 2 calls
    a.pause(MODEL, 30, "provider said so")
    on_backend.settle(50, 0)  # the settle's answer reports the pause in force
    assert isinstance(b.try_reserve(ROUTE, Cost(input_tokens=100)), Denied)


def test_close_gives_back_what_is_left_so_other_processes_can_use_it() -> None:
    clock = FakeClock()
    backend, (a,) = fleet(1, clock)
    # Two processes without leases: neither books ahead of the bucket's level.
    b, c = (Limiter(backend, limits=TEN, clock=clock) for _ in range(2))
    # a: 4 charged on the backend (a borrow of 1 more, then two renewals of one call each),
    # one of them still in the lease booked next.
    grants(a, 3)
    assert grants(b, 10) == 6
    a.close()  # nothing has drained (the clock did not move): it comes back
    assert grants(c, 10) == 1


def test_a_lease_that_has_drained_gives_nothing_back() -> None:
    clock = FakeClock()
    _, (a, b) = fleet(2, clock)
    grants(a, 3)  # 5 in use, 2 of them in a's lease
    clock.advance(0.5)  # all 5 have drained: the bucket is empty again
    assert grants(b, 20) == 10  # b fills it
    a.close()  # what is left of a's lease drained long ago: nothing to give back
    clock.advance(0.1)
    assert grants(b, 20) == 1  # one unit's refill, no more


def test_async_twins_share_the_leases() -> None:
    clock = FakeClock()
    backend, (a,) = fleet(1, clock)

    async def run() -> list[bool]:
        got = [bool(await a.atry_reserve(ROUTE, Cost())) for _ in range(12)]
        await a.aclose()
        return got

    assert asyncio.run(run()) == [True] * 10 + [False] * 2
    # As the sync twin; closing gives back the lease booked 0.1 s ahead.
    assert backend.ops == {"BorrowOp": 1, "Renewal": 9, "ReturnOp": 1}


def test_reserve_waits_with_leases_too() -> None:
    clock = FakeClock()
    _, (a,) = fleet(1, clock)
    starts = []
    for _ in range(14):
        with a.reserve(ROUTE, Cost()) as r:
            starts.append(r.granted_at + r.starts_in)  # the memory backend's time: monotonic
    assert starts[:10] == [0.0] * 10 and starts[10:] == pytest.approx([0.1, 0.2, 0.3, 0.4])


def test_the_local_fallback_lends_nothing() -> None:
    clock = FakeClock()

    class Down(Counting):
        def execute(self, op: object, *, timeout: float | None = None) -> object:
            from rateloop.admission.backends import BackendUnreachable

            raise BackendUnreachable("down")

    backend = Down(clock)
    a = Limiter(backend, limits=TEN, clock=clock, on_unreachable="local", local_share=0.5,
                local_lease_secs=1.0)
    # The local limiter starts full (it does not know what the others took) at half the
    # rate: one call every 0.2 s, never a lease.
    assert grants(a, 3) == 0
    clock.advance(0.2)
    assert grants(a, 3) == 1


# -- configuration --------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, 60.5, float("nan"), "1", True])
def test_local_lease_secs_is_checked(bad: object) -> None:
    with pytest.raises(ValueError, match=r"local_lease_secs must be seconds, 0 < L <= 60"):
        Limiter(local_lease_secs=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="local_lease_secs"):
        Limiter.from_url("memory://", local_lease_secs=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"admission\.local_lease_secs"):
        Policy.from_dict({"admission": {"local_lease_secs": bad}})


def test_from_policy_turns_leases_on() -> None:
    clock = FakeClock()
    policy = Policy.from_dict(
        {"admission": {"local_lease_secs": 0.5}, "limits": {MODEL: {"requests_per_minute": 600}}}
    )
    a = Limiter.from_policy(policy, clock=clock)
    assert grants(a, 3) == 3
    # The first call borrowed one more (2 in use), the second took it from the lease and
    # booked the next (3), the third took that and booked the next: 4 in use for 3 calls.
    assert isinstance(a.backend, MemoryBackend)
    assert a.backend.in_use(build_checks(MODEL, LimitSpec(requests_per_minute=600))[0]) == 4
