"""The one place that reads the system clock.

Everything else takes a :class:`Clock`.  Intervals use the monotonic clock;
the wall clock (aware UTC) is only used to turn HTTP dates and reset
timestamps into waits.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "SystemClock", "epoch_ns", "system_clock"]


@runtime_checkable
class Clock(Protocol):
    """What the drivers need from time: read it, and wait on it."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards."""
        ...

    def now(self) -> datetime:
        """The wall-clock time, timezone-aware (UTC)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block the calling thread for ``seconds``."""
        ...

    async def asleep(self, seconds: float) -> None:
        """Suspend the calling task for ``seconds``."""
        ...


class SystemClock:
    """The real clock."""

    __slots__ = ()

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(UTC)

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        # asyncio is imported here, not at the top: `import rateloop` must not pay
        # for the event loop machinery (~20 ms) that sync users never touch.
        import asyncio

        await asyncio.sleep(max(0.0, seconds))

    def __repr__(self) -> str:
        return "SystemClock()"


system_clock: Clock = SystemClock()


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def epoch_ns(moment: datetime) -> int:
    """Nanoseconds since the epoch, exact to the microsecond (no float rounding)."""
    return (moment - _EPOCH) // _MICROSECOND * 1000
