"""The window bound holds across an outage of the shared backend (issue 22, item 7).

With ``on_unreachable="local"``, across a Redis restart, one 10 s window held 224 grants
against a shared bound of 160: calls the shared backend had booked ahead still started
while the local limiter admitted, and on return the restarted (empty) Redis admitted a
whole bucket on top of the local grants still starting.  Now a fallback starts the local
buckets full at the latest start booked on the shared backend, and the return first books
on the shared backend what the local limiter granted and still counts.

Grants are counted at their *start* (a booked call starts later than it is granted), per
sliding window of 10 s: at most ``capacity + rate × 10 s`` (docs/admission.md, "The
bound"), here 60 + 100 = 160.
"""

from __future__ import annotations

import asyncio
import threading
import time
from bisect import bisect_left

import pytest

from _redis_server import free_port, redis_server
from rateloop.admission import LimitSpec
from rateloop.admission.backends import BackendUnreachable
from rateloop.admission.backends.memory import MemoryBackend
from rateloop.admission.limiter import Limiter
from rateloop.admission.reservation import AdmissionTimeout, Denied, Reservation
from rateloop.errors import BackendError
from rateloop.route import Cost, Route
from rateloop.testing import FakeClock

ROUTE = Route(provider="openai", model="gpt-5")
SCOPE = "openai:gpt-5"
LIMITS = {SCOPE: LimitSpec(requests_per_minute=600, burst=0.1)}  # 60 at once, 10 a second
WINDOW = 10.0
BOUND = 60 + 10 * WINDOW  # capacity + rate × W


def busiest_window(starts: list[float], window: float = WINDOW) -> int:
    """The most starts in any window ``[s - window, s]`` (every start is a window's end)."""
    starts = sorted(starts)
    return max(
        (i + 1 - bisect_left(starts, s - window) for i, s in enumerate(starts)), default=0
    )


class Restartable:
    """A real memory backend that can go down and come back *empty* (a Redis restart)."""

    url = "restartable://"

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.inner = MemoryBackend(clock)
        self.down = False

    def execute(self, op: object, *, timeout: float | None = None) -> object:
        if self.down:
            raise BackendUnreachable("stopped")
        return self.inner.execute(op)

    async def aexecute(self, op: object, *, timeout: float | None = None) -> object:
        return self.execute(op)

    def restart(self) -> None:
        self.inner = MemoryBackend(self.clock)  # no persistence: every bucket is empty
        self.down = False

    def close(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


def _saturate(limiter: Limiter, clock: FakeClock, seconds: float, starts: list[float]) -> None:
    """A caller with endless work: each call booked up to 5 s ahead, as the loop books."""
    end = clock.monotonic() + seconds
    while clock.monotonic() < end:
        r = limiter.try_reserve(ROUTE, Cost(), book_within=5)
        if isinstance(r, Reservation):
            starts.append(clock.monotonic() + r.starts_in)
        else:
            clock.advance(0.05)


def test_no_window_passes_the_bound_across_an_outage_and_a_restart() -> None:
    clock = FakeClock()
    shared = Restartable(clock)
    limiter = Limiter(shared, limits=LIMITS, clock=clock, on_unreachable="local")
    starts: list[float] = []
    _saturate(limiter, clock, 4.0, starts)
    shared.down = True
    _saturate(limiter, clock, 8.0, starts)  # past one retry of the local window
    shared.restart()
    _saturate(limiter, clock, 12.0, starts)
    # Before the fix: 210 (the bookings made on the shared backend still started while
    # the local limiter admitted; the restarted backend then admitted a whole bucket on
    # top of the local bookings still to start).
    assert busiest_window(starts) <= BOUND
    assert len(starts) >= 10 * 23  # and the outage cost no throughput: 10 a second


def test_the_return_books_the_local_grants_on_the_shared_backend() -> None:
    clock = FakeClock()
    shared = Restartable(clock)
    limiter = Limiter(shared, limits=LIMITS, clock=clock, on_unreachable="local")
    shared.down = True
    local = [limiter.try_reserve(ROUTE, Cost(), book_within=5) for _ in range(50)]
    assert all(isinstance(r, Reservation) and r.local for r in local)
    shared.restart()
    clock.advance(5.01)  # the local window ends: back to the shared backend ...
    # ... which knows of the local grants still to start: no burst on top of them (before
    # the fix the restarted backend admitted 60 at once).
    assert isinstance(limiter.try_reserve(ROUTE, Cost()), Denied)
    booked = limiter.try_reserve(ROUTE, Cost(), book_within=10)
    assert isinstance(booked, Reservation) and not booked.local
    last_local = max(x.granted_at + x.starts_in for x in local if isinstance(x, Reservation))
    assert clock.monotonic() + booked.starts_in >= last_local


def test_a_fallback_queues_the_local_grants_behind_the_shared_bookings() -> None:
    clock = FakeClock()
    shared = Restartable(clock)
    limiter = Limiter(shared, limits=LIMITS, clock=clock, on_unreachable="local")
    booked = [limiter.try_reserve(ROUTE, Cost(), book_within=5) for _ in range(100)]
    assert all(isinstance(r, Reservation) and not r.local for r in booked)
    last = max(r.starts_in for r in booked if isinstance(r, Reservation))
    assert last == pytest.approx(4.0)  # 60 at once, then 10 a second
    shared.down = True
    first_local = limiter.try_reserve(ROUTE, Cost(), book_within=10)
    assert isinstance(first_local, Reservation) and first_local.local
    # Not before the shared bookings (which still start): behind the last of them.
    assert first_local.starts_in >= last


# -- across a real Redis restart ---------------------------------------------------------


def test_redis_no_window_passes_the_bound_across_a_real_restart() -> None:
    """Two processes (one async, one threaded) with ``local_share = 0.5`` on a private
    redis-server that is stopped for 7 s and started again empty."""
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    starts: list[float] = []
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []

    def limiter() -> Limiter:
        return Limiter.from_url(url, limits=LIMITS, on_unreachable="local", local_share=0.5,
                                socket_timeout=1.0, socket_connect_timeout=0.5)

    def record(r: Reservation) -> None:
        with lock:
            starts.append(time.monotonic())  # reserve() returns at the start
        r.settle(0, 0)

    def threaded(lim: Limiter) -> None:
        while not stop.is_set():
            try:
                record(lim.reserve(ROUTE, Cost(), deadline=5))
            except AdmissionTimeout as exc:
                time.sleep(min(exc.retry_after, 0.05))  # bounded, then ask again
            except BackendError as exc:  # pragma: no cover - reported below
                errors.append(exc)
                return

    def asynchronous(lim: Limiter) -> None:
        async def one() -> None:
            while not stop.is_set():
                try:
                    record(await lim.areserve(ROUTE, Cost(), deadline=5))
                except AdmissionTimeout as exc:
                    await asyncio.sleep(min(exc.retry_after, 0.05))
                except BackendError as exc:  # pragma: no cover - reported below
                    errors.append(exc)
                    return

        async def main() -> None:
            await asyncio.gather(*(one() for _ in range(30)))
            await lim.aclose()

        asyncio.run(main())

    a, b = limiter(), limiter()
    workers = [threading.Thread(target=asynchronous, args=(a,), daemon=True)]
    workers += [threading.Thread(target=threaded, args=(b,), daemon=True) for _ in range(30)]
    try:
        with redis_server(port=port):
            for w in workers:
                w.start()
            time.sleep(4.0)
        time.sleep(7.0)  # down: both fall back, retry after 5 s, fall back again
        with redis_server(port=port):  # back, empty
            time.sleep(11.0)
            stop.set()
            for w in workers:
                w.join(15)
    finally:
        stop.set()
        a.close()
        b.close()
    assert not errors
    assert not any(w.is_alive() for w in workers)
    # Before the fix: 211-219 in one window.  The starts are taken on wake-up, after the
    # limiter's start: on a loaded 2-core machine 60 threads wake late, by up to tens of
    # ms, which moves a few starts across a window's edge (164 seen once under load, 160
    # on a quiet machine).  5 % covers that and still fails the old code by 40 and more.
    busiest = busiest_window(starts)
    print(f"busiest 10 s window: {busiest} starts of {len(starts)} (bound {BOUND:g})")
    assert busiest <= BOUND * 1.05
