"""Leases renewed ahead of need (``renewal.py``, ``spawned.py``): the next lease is booked off
the caller's path, so a busy process decides nearly every admission without a round trip.

Limiters sharing one :class:`Counting` backend (a real MemoryBackend that counts what it
runs) stand for processes sharing a Redis, on virtual time: there a renewal runs inline, at
once, and ``trips`` counts only the callers' round trips.  On the real Redis renewals run on
worker threads (sync) or as tasks (async): a counting wrapper around the real Redis backend
shows on which.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter
from collections.abc import Generator
from typing import Any

import pytest

from rateloop.admission import LimitSpec
from rateloop.admission.backends import BackendUnreachable
from rateloop.admission.backends.redis import RedisBackend
from rateloop.admission.lease import Lease
from rateloop.admission.limiter import Limiter
from rateloop.admission.plan import AdmitOp, AdmitResult, BorrowOp, PauseOp, build_checks
from rateloop.admission.reservation import Denied, Reservation
from rateloop.admission.runner import BackendRunner, Do
from rateloop.admission.spawned import Spawned
from rateloop.route import Cost, Route
from rateloop.testing import FakeClock
from test_admission_local_leases import (
    MODEL,
    ROUTE,
    TEN,
    Counting,
    _op,
    _plan,
    fleet,
    grants,
    is_renewal,
)
from test_admission_stress_redis import max_window_excess


def _fleet_calls(
    processes: int,
    routes: list[Route],
    spec: LimitSpec,
    rate: float,
    seconds: float,
    affinity: bool = False,
) -> tuple[Counting, int, list[list[float]]]:
    """``rate`` calls a second for ``seconds`` of virtual time, each from a random process
    (or, with ``affinity``, from the one its route is routed to) for a random route.
    Returns the backend, the decisions, and each route's grant times."""
    clock = FakeClock()
    backend = Counting(clock)
    limits = {r.scope: spec for r in routes}
    limiters = [
        Limiter(backend, limits=limits, clock=clock, rng=random.Random(i), local_lease_secs=1.0)
        for i in range(processes)
    ]
    rng = random.Random(7)
    granted: list[list[float]] = [[] for _ in routes]
    decisions = int(rate * seconds)
    for _ in range(decisions):
        clock.advance(1 / rate)
        j = rng.randrange(len(routes))
        process = j % processes if affinity else rng.randrange(processes)
        r = limiters[process].try_reserve(routes[j], Cost())
        if isinstance(r, Reservation):
            assert r.starts_in == 0.0
            granted[j].append(clock.monotonic())
    return backend, decisions, granted


def test_on_hot_scopes_nearly_every_decision_is_taken_in_the_process() -> None:
    # 8 processes, 2 scopes of 100 at once and 100 a second, offered 500 calls a second:
    # each process sees each scope ~31 times a second, and the scopes are full.
    routes = [Route(provider="hot", model=m) for m in ("a", "b")]
    spec = LimitSpec(requests_per_minute=6_000, burst=1 / 60)
    backend, decisions, granted = _fleet_calls(8, routes, spec, 500.0, 4.0)
    # Round trips on the callers' path: each process's first call per scope (16) and a
    # few more.  Without renewals a full scope sends about a third of its calls.
    assert backend.trips <= 0.02 * decisions
    assert backend.ops["Renewal"] > 0
    allowed = 100 + 100 * 4.0
    for times in granted:
        assert len(times) >= 0.9 * allowed  # the scope's capacity is used
        # and never beyond the leases' bound: capacity + rate × (W + L)
        assert max_window_excess([(t, 1.0) for t in times], 100 + 100 * 1.0, 100) <= 1e-6


def test_thin_tenants_routed_one_per_process_are_decided_in_the_process() -> None:
    # 48 tenants of 10 a second, each routed to one of 8 processes, offered 1,000 a second.
    routes = [Route(provider="thin", model="m", project="p", tenant=f"t{i}") for i in range(48)]
    spec = LimitSpec(requests_per_minute=600, burst=1 / 60)
    backend, decisions, granted = _fleet_calls(8, routes, spec, 1_000.0, 4.0, affinity=True)
    assert backend.trips <= 48 + 0.01 * decisions  # each tenant's first call, and few more
    assert sum(map(len, granted)) >= 0.9 * 48 * (10 + 10 * 4.0)


def test_a_call_before_the_next_lease_starts_is_denied_until_then_in_the_process() -> None:
    clock = FakeClock()
    backend, (a,) = fleet(1, clock)
    b = Limiter(backend, limits=TEN, clock=clock)  # a process without leases
    assert grants(b, 10) == 10  # b fills the bucket
    assert grants(a, 1) == 0  # a's first call: denied by the backend, for 0.1 s
    trips = backend.trips
    # That answer made the route known: its renewal booked a lease at the next free start.
    assert backend.ops["Renewal"] >= 1
    denied = a.try_reserve(ROUTE, Cost())
    assert isinstance(denied, Denied) and denied.retry_after == pytest.approx(0.1)
    assert backend.trips == trips
    clock.advance(0.1)
    r = a.try_reserve(ROUTE, Cost())
    assert isinstance(r, Reservation) and r.granted_at == pytest.approx(0.1)
    assert backend.trips == trips  # granted from the booked lease


def test_a_denied_renewal_is_remembered_and_the_next_waits_for_its_horizon() -> None:
    clock = FakeClock()
    backend, (a,) = fleet(1, clock, lease=0.04)  # renewals book at most 2 L = 0.08 s ahead
    grants(a, 10)  # the 10th call's renewal is denied: the next free start is 0.1 s away
    renewals = backend.ops["Renewal"]
    for _ in range(3):  # denied in the process (for one call, until 0.1); no renewal yet
        clock.advance(0.005)
        assert isinstance(a.try_reserve(ROUTE, Cost()), Denied)
    assert backend.ops["Renewal"] == renewals and backend.trips == 1
    clock.advance(0.006)  # past 0.02: a booking at 0.1 is now within 0.08
    assert isinstance(a.try_reserve(ROUTE, Cost()), Denied)
    assert backend.ops["Renewal"] == renewals + 1
    clock.advance(0.079)
    assert isinstance(a.try_reserve(ROUTE, Cost()), Reservation)
    assert backend.trips == 1


def test_a_pause_voids_the_lease_booked_next() -> None:
    clock = FakeClock()
    _, (a,) = fleet(1, clock)
    grants(a, 10)  # the next lease is booked 0.1 s ahead
    a.pause(MODEL, 30, "provider said so")
    clock.advance(0.1)
    d = a.try_reserve(ROUTE, Cost())
    assert isinstance(d, Denied) and "paused" in d.reason


def test_renewals_ask_for_twice_what_the_process_used_up_to_five_percent() -> None:
    clock = FakeClock()
    limits = {MODEL: LimitSpec(requests_per_minute=60_000, burst=1 / 60)}  # 1,000 at once
    backend, (a,) = fleet(1, clock, limits=limits)
    sizes: list[float] = []
    inner = backend.execute

    def execute(op: object, *, timeout: float | None = None) -> object:
        if is_renewal(op):
            sizes.append(op.amounts[0])
        return inner(op)

    backend.execute = execute  # type: ignore[method-assign]
    grants(a, 300)
    # Twice what was used since the previous renewal (renewals come at half a lease), up
    # to 5 % of 1,000; then steady.
    assert sizes[0] == 2.0 and max(sizes) == 50.0
    assert sizes == sorted(sizes) and sizes[-5:] == [50.0] * 5
    assert backend.trips == 1


# -- spawned flows ----------------------------------------------------------------------------


def _flow(ran: list[str], gate: threading.Event | None = None) -> Generator[Any, Any, None]:
    try:
        if gate is not None:
            gate.wait(10)
        ran.append(threading.current_thread().name)
        yield from ()
    finally:
        ran.append("closed")


def _run(flow: Generator[Any, Any, None]) -> None:
    for _ in flow:
        pass


async def _arun(flow: Generator[Any, Any, None]) -> None:
    _run(flow)


def test_spawned_flows_run_inline_on_an_in_process_backend() -> None:
    ran: list[str] = []
    Spawned(_run, _arun, inline=True).spawn(_flow(ran))
    assert ran == [threading.current_thread().name, "closed"]


def test_spawned_flows_run_on_worker_threads_and_stop_lets_them_finish() -> None:
    ran: list[str] = []
    gate = threading.Event()
    spawned = Spawned(_run, _arun, inline=False)
    spawned.spawn(_flow(ran, gate))
    assert ran == []  # the caller went on at once
    gate.set()
    spawned.stop()  # waits for the flow under way
    assert ran == ["rateloop-admission", "closed"]
    late: list[str] = []
    spawned.spawn(_flow(late))  # after stop: closed, never run
    assert late == []


def test_async_spawned_flows_run_as_tasks() -> None:
    ran: list[str] = []

    async def main() -> None:
        spawned = Spawned(_run, _arun, inline=False)
        await spawned.aspawn(_flow(ran))
        assert ran == []  # a task: it runs when the caller yields
        await spawned.astop()

    asyncio.run(main())
    assert ran == [threading.current_thread().name, "closed"]


# -- on the real Redis ------------------------------------------------------------------------


class _Tally(RedisBackend):
    """The real Redis backend, counting each admission by the thread (or task) that ran it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.by: Counter[tuple[str, bool]] = Counter()

    def execute(self, op: object, *, timeout: float | None = None) -> object:
        self.by[(threading.current_thread().name, is_renewal(op))] += 1
        return super().execute(op, timeout=timeout)

    async def aexecute(self, op: object, *, timeout: float | None = None) -> object:
        task = asyncio.current_task()
        self.by[(task.get_name() if task else "-", is_renewal(op))] += 1
        return await super().aexecute(op, timeout=timeout)


HOT = {"redis:m": LimitSpec(requests_per_minute=60_000, burst=1 / 60)}  # 1,000 at once
HOT_ROUTE = Route(provider="redis", model="m")


def test_on_redis_renewals_run_on_worker_threads_off_the_callers_path(
    redis_url: str, redis_prefix: str
) -> None:
    backend = _Tally(redis_url, prefix=redis_prefix)
    limiter = Limiter(backend, limits=HOT, local_lease_secs=5.0)
    got = [limiter.try_reserve(HOT_ROUTE, Cost()) for _ in range(200)]
    limiter.close()  # lets the renewals under way finish
    assert all(isinstance(r, Reservation) for r in got)
    caller = threading.current_thread().name
    on_caller = sum(n for (name, _), n in backend.by.items() if name == caller)
    renewed = sum(n for (name, renewal), n in backend.by.items() if renewal)
    assert renewed >= 1
    assert all(name == "rateloop-admission" for (name, renewal) in backend.by if renewal)
    # The first call borrowed; a call that found its lease spent before its renewal came
    # back went alone: far fewer round trips on the caller's path than calls.
    assert on_caller <= 20


def test_on_redis_async_renewals_run_as_tasks(redis_url: str, redis_prefix: str) -> None:
    backend = _Tally(redis_url, prefix=redis_prefix)
    limiter = Limiter(backend, limits=HOT, local_lease_secs=5.0)

    async def main() -> list[object]:
        out: list[object] = []
        for _ in range(200):
            out.append(await limiter.atry_reserve(HOT_ROUTE, Cost()))
            await asyncio.sleep(0)  # a real application yields: the renewal task runs
        await limiter.aclose()
        return out

    got = asyncio.run(main())
    assert all(isinstance(r, Reservation) for r in got)
    renewed = [(name, n) for (name, renewal), n in backend.by.items() if renewal]
    assert renewed and sum(n for _, n in backend.by.items()) - sum(n for _, n in renewed) <= 20


def test_execute_many_pipelines_admissions_and_reloads_lost_scripts(
    redis_url: str, redis_prefix: str
) -> None:
    import redis as redis_py

    backend = RedisBackend(redis_url, prefix=redis_prefix)
    plan = _plan(TEN[MODEL])
    ops: list[object] = [_op(plan, 1.0) for _ in range(12)]
    try:
        redis_py.Redis.from_url(redis_url).script_flush()  # every script must be sent again
        answers = backend.execute_many(ops)
        assert [a.granted for a in answers] == [True] * 10 + [False] * 2  # type: ignore[attr-defined]
        backend.execute(PauseOp(scope="other", seconds=1.0, reason="-"))  # its script cached
        # In order, in one pipeline: the pause, then an admission it denies.
        pause = PauseOp(scope=MODEL, seconds=30.0, reason="said so")
        paused = backend.execute_many([pause, _op(plan, 1.0)])
        assert "said so" in str(paused[1].paused_reason)  # type: ignore[attr-defined]
    finally:
        backend.close()


def test_run_many_sends_each_round_of_steps_together(redis_url: str, redis_prefix: str) -> None:
    backend = _Tally(redis_url, prefix=redis_prefix)
    batches: list[int] = []
    many = backend.execute_many

    def execute_many(ops: list[object]) -> list[object]:
        batches.append(len(ops))
        return many(ops)

    backend.execute_many = execute_many  # type: ignore[method-assign]
    runner = BackendRunner(backend, clock=None, on_unreachable="fail_closed", local_share=1.0)
    plan = _plan(TEN[MODEL])
    seen: list[list[bool]] = [[] for _ in range(3)]

    def flow(i: int) -> Generator[Any, Any, None]:
        for _ in range(2):
            done = yield Do(_op(plan, 1.0 + i))
            seen[i].append(done[0].granted)

    try:
        runner.run_many([flow(i) for i in range(3)])
    finally:
        backend.close()
    assert batches == [3, 3]  # two rounds, each one pipelined round trip
    # 2 + 4 + 6 = 12 units asked of a bucket of 10: the third flow's second call waits.
    assert seen == [[True, True], [True, True], [True, False]]


def test_a_forked_child_starts_its_own_workers() -> None:
    import os

    ran: list[str] = []
    spawned = Spawned(_run, _arun, inline=False)
    spawned.spawn(_flow(ran))  # the parent's workers start
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its parent's threads are gone
        child: list[str] = []
        spawned.spawn(_flow(child))
        spawned.stop()
        os.write(write, ",".join(child).encode())
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read) as f:
        assert f.read() == "rateloop-admission,closed" and status == 0
    spawned.stop()
    assert ran == ["rateloop-admission", "closed"]


# -- what the review found: each guarded -----------------------------------------------------


def _leases_of(limiter: Limiter) -> Any:
    return limiter._admissions.leases


def test_a_renewal_answered_too_late_to_start_before_it_expires_is_dropped() -> None:
    clock = FakeClock()
    _, (a,) = fleet(1, clock)
    grants(a, 1)  # the route is known: its renewals are due
    renewals = a._admissions._renewals
    plan = _plan(TEN[MODEL])
    leases = _leases_of(a)
    slot = leases.slot(plan)
    slot.warm = True
    renewal = renewals.renewal(_op(plan, 1.0))
    assert renewal is not None and renewal.op.book == pytest.approx(2.0)  # 2 L ahead
    sent = clock.monotonic()
    clock.advance(1.0)  # its answer takes a whole lease lifetime
    answer = AdmitResult(granted=True, now=1.0, starts_in=0.05)
    renewals.renewed(renewal, answer, False, sent)
    assert slot.next is None  # granting from it could pass start + L: it drains instead
    assert renewals.renewal(_op(plan, 1.0)) is not None  # and the next may go


def test_a_class_that_may_not_book_renews_only_what_fits_now() -> None:
    clock = FakeClock()
    spec = LimitSpec(requests_per_minute=600, burst=1 / 60, reserve=0.2)
    backend, (a,) = fleet(1, clock, limits={MODEL: spec})
    booked: list[float] = []
    inner = backend.execute

    def execute(op: object, *, timeout: float | None = None) -> object:
        if type(op) is AdmitOp:
            booked.append(op.book)
        return inner(op)

    backend.execute = execute  # type: ignore[method-assign]
    for _ in range(12):
        a.try_reserve(ROUTE, Cost(), priority="background")
    assert booked and set(booked) == {0.0}  # never into the reserve the higher classes keep


def test_a_borrow_answered_while_a_lease_still_serves_waits_as_the_next() -> None:
    clock = FakeClock()
    _, (a,) = fleet(1, clock)
    leases = _leases_of(a)
    plan = _plan(TEN[MODEL])
    first = leases.borrow(_op(plan, 1.0))
    leases.borrowed(first, ((AdmitResult(granted=True, now=0.0), 2.0), first, False), 0.0)
    slot = leases.slot(plan)
    current = slot.lease
    assert current is not None and current.left == [2.0]
    second = BorrowOp(_op(plan, 1.0), 2.0)
    leases.borrowed(second, ((AdmitResult(granted=True, now=0.0), 2.0), second, False), 0.0)
    assert slot.lease is current and slot.next is not None  # nothing charged is lost


def test_a_spent_lease_booked_ahead_denies_each_call_for_its_own_refill() -> None:
    clock = FakeClock()
    limits = {MODEL: LimitSpec(input_tokens_per_minute=60_000, burst=1 / 60)}  # 1,000/s
    _, (a,) = fleet(1, clock, limits=limits)
    leases = _leases_of(a)
    plan = _plan(limits[MODEL])
    slot = leases.slot(plan)
    slot.lease = Lease(leases, plan, (400.0,), [0.0], 0.0, 0.0, 1.0, full_at=0.0)
    small = leases.take(_op(plan, 100.0), ROUTE, Cost(input_tokens=100))
    large = leases.take(_op(plan, 400.0), ROUTE, Cost(input_tokens=400))
    assert isinstance(small, Denied) and small.retry_after == pytest.approx(0.1)
    assert isinstance(large, Denied) and large.retry_after == pytest.approx(0.4)


def test_a_renewal_never_runs_on_the_local_fallback() -> None:
    clock = FakeClock()

    class Flaky(Counting):
        down = False

        def execute(self, op: object, *, timeout: float | None = None) -> object:
            if self.down:
                raise BackendUnreachable("down")
            return super().execute(op)

    backend = Flaky(clock)
    a = Limiter(backend, limits=TEN, clock=clock, on_unreachable="local", local_share=0.5,
                local_lease_secs=1.0)
    assert grants(a, 2) == 2  # a borrow, then a grant from its lease that renews
    renewals = backend.ops["Renewal"]
    assert renewals >= 1
    backend.down = True
    assert grants(a, 1) == 1  # from the renewed lease: its renewal fails, and starts the window
    assert backend.ops["Renewal"] == renewals
    local = a._runner.local
    assert local is None or not local.in_use(build_checks(MODEL, TEN[MODEL])[0])


def test_a_forked_child_forgets_its_parent_s_leases() -> None:
    import os

    clock = FakeClock()
    _, (a,) = fleet(1, clock)
    grants(a, 3)  # a lease (and its renewal) in the parent
    leases = _leases_of(a)
    assert leases._slots
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, str(len(leases._slots)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as f:
        assert f.read() == "0"  # the parent's units are the parent's to grant
    assert leases._slots
