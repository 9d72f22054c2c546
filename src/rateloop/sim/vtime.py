"""Virtual time for asyncio: the real drivers run unchanged, an hour passes in a second.

How it works.  asyncio's loop asks its selector to wait ``timeout`` seconds
for I/O until the next timer is due.  :class:`VirtualEventLoop` gives it a
selector that never waits: it moves the loop's clock (``time()``) forward by
``timeout`` and reports no I/O.  So every ``asyncio.sleep`` -- the RATE loop's
waits, the limiter's, the fake provider's latency -- returns as soon as
nothing else can run, at the right virtual moment and in the right order.
A loop with nothing scheduled and nothing ready would wait forever for I/O
that cannot come in a simulation; it raises instead.  Work handed to a
thread (``run_in_executor``, ``asyncio.to_thread``: the SDKs do it for
their platform headers) takes no virtual time: the loop waits for it for
real before it moves the clock.

:class:`VirtualClock` is the rateloop :class:`~rateloop.Clock` on that loop:
``monotonic()`` is the loop's time, ``now()`` a fixed start plus it, and
``asleep`` is ``asyncio.sleep``.  The blocking ``sleep`` is refused: a sync
driver would stop the whole simulated fleet.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from rateloop.errors import RateloopError

__all__ = ["MIN_SLEEP", "SimulationStuck", "VirtualClock", "VirtualEventLoop", "run_virtual"]

T = TypeVar("T")

_START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

#: The shortest wait on virtual time, as a real clock's resolution would be.
MIN_SLEEP = 0.001

#: Real seconds a thread's job may take before a loop with nothing else to do gives up.
_THREAD_WAIT = 60.0


class SimulationStuck(RateloopError, RuntimeError):
    """Every task waits for something that no timer will bring (a deadlock in the simulation)."""


class _VirtualSelector(selectors.BaseSelector):
    """A selector that turns waiting into advancing the virtual clock."""

    def __init__(self) -> None:
        self._real = selectors.DefaultSelector()
        self.now = 0.0
        self.threads = 0  # run_in_executor jobs not yet done (they report on the self-pipe)

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if self.threads and timeout != 0:
            # A thread's job (an SDK's ``asyncio.to_thread``) takes no virtual time: wait
            # for it for real before any timer fires, so the order stays deterministic.
            events = self._real.select(_THREAD_WAIT)
            if events or timeout is not None:
                return events
            raise SimulationStuck(
                f"a thread started with run_in_executor has not finished in {_THREAD_WAIT:g} s "
                "and nothing else can run"
            )
        if timeout is None:
            raise SimulationStuck(
                "nothing is scheduled and nothing can run: every simulated task waits for "
                "I/O or an event that will never come"
            )
        if timeout > 0:
            self.now += timeout
        # The loop's own self-pipe (call_soon_threadsafe) is the only I/O; poll it.
        return self._real.select(0)

    def close(self) -> None:
        self._real.close()

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._real.get_map()


class VirtualEventLoop(asyncio.SelectorEventLoop):
    """An asyncio loop on virtual time (no real waiting; no real network I/O)."""

    def __init__(self) -> None:
        self._vselector = _VirtualSelector()
        super().__init__(self._vselector)

    def time(self) -> float:
        return self._vselector.now

    def run_in_executor(  # type: ignore[override]  # the base's TypeVarTuple signature
        self, executor: Any, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        future = super().run_in_executor(executor, func, *args)
        self._vselector.threads += 1

        def done(_: asyncio.Future[T]) -> None:
            self._vselector.threads -= 1

        future.add_done_callback(done)
        return future


class VirtualClock:
    """The rateloop Clock of a :class:`VirtualEventLoop` (use inside ``run_virtual``)."""

    def __init__(self, start: datetime = _START) -> None:
        if start.tzinfo is None:
            raise ValueError(f"VirtualClock start must be timezone-aware, got {start!r}")
        self._start = start

    def monotonic(self) -> float:
        try:
            return asyncio.get_running_loop().time()
        except RuntimeError:
            raise RuntimeError(
                "VirtualClock is read outside run_virtual(): no virtual loop is running. "
                "Build what uses it (FakeProvider, Limiter, AsyncRateLoop) inside the "
                "coroutine given to run_virtual()"
            ) from None

    def now(self) -> datetime:
        return self._start + timedelta(seconds=self.monotonic())

    def sleep(self, seconds: float) -> None:
        raise RuntimeError(
            "VirtualClock cannot block: the simulator runs the async drivers "
            "(AsyncRateLoop, Limiter.areserve); use asleep"
        )

    async def asleep(self, seconds: float) -> None:
        # A real clock always moves while a driver re-checks; a virtual one only moves when
        # slept on.  A wait of 0 or of a few ulps (the limiter's arithmetic on large
        # monotonic values) would re-ask the same question at the same instant forever.
        await asyncio.sleep(max(MIN_SLEEP, seconds))

    def __repr__(self) -> str:
        return f"VirtualClock(start={self._start.isoformat()})"


def run_virtual(main: Awaitable[T]) -> T:
    """Run a coroutine to completion on a fresh :class:`VirtualEventLoop`.

    >>> import asyncio
    >>> async def hour() -> float:
    ...     await asyncio.sleep(3600)
    ...     return asyncio.get_running_loop().time()
    >>> run_virtual(hour())
    3600.0
    """
    loop = VirtualEventLoop()
    try:
        return loop.run_until_complete(main)
    finally:
        loop.close()
