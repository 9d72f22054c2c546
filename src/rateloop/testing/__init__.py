"""Test helpers for rateloop and for its users' own tests.

:class:`FakeClock` is a virtual clock: ``sleep`` returns at once, advances
time and records the wait, so a test asserts on the schedule of waits
instead of on elapsed wall time.

:class:`FakeProvider` is a model provider that enforces limits the way the
real ones do and answers in their shapes (OpenAI, Anthropic, Gemini), with
scriptable faults; it runs in-process (an ASGI app, on any clock) or as a
server on 127.0.0.1 (:class:`FakeProviderServer`).  See docs/testing.md.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rateloop.testing._fake import (
    FAULTS,
    FakeBatch,
    FakeLimits,
    FakeProvider,
    FakeProviderServer,
    FakeRequest,
    FakeResponse,
    FakeStats,
    Slow,
)
from rateloop.testing.faults import FaultScript

__all__ = [
    "FAULTS",
    "FakeBatch",
    "FakeClock",
    "FakeLimits",
    "FakeProvider",
    "FakeProviderServer",
    "FakeRequest",
    "FakeResponse",
    "FakeStats",
    "FaultScript",
    "Slow",
]

_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


class FakeClock:
    """A clock that only moves when told to (``advance``) or slept on.

    >>> clock = FakeClock()
    >>> clock.sleep(2.5)
    >>> clock.sleeps
    [2.5]
    >>> clock.monotonic()
    2.5
    """

    def __init__(self, start: datetime | None = None, *, monotonic: float = 0.0) -> None:
        if start is not None and start.tzinfo is None:
            raise ValueError(f"FakeClock start must be timezone-aware, got naive {start!r}")
        self._start = start or _EPOCH
        self._mono0 = monotonic
        self._elapsed = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self._mono0 + self._elapsed

    def now(self) -> datetime:
        return self._start + timedelta(seconds=self._elapsed)

    def advance(self, seconds: float) -> None:
        """Move time forward without recording a sleep (time spent working)."""
        if seconds < 0:
            raise ValueError(f"cannot move a clock backwards: advance({seconds!r})")
        self._elapsed += seconds

    def sleep(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.sleeps.append(seconds)
        self._elapsed += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)

    def __repr__(self) -> str:
        return f"FakeClock(now={self.now().isoformat()}, sleeps={len(self.sleeps)})"
