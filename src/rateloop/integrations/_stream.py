"""Streams handed to the caller: usage watched, errors raised, capacity given back.

How it works: a ``2xx`` event stream leaves the RATE loop after its status
and headers; its body belongs to the caller and is never replayed.  The loop
would settle the reservation at that moment, so the transport's performer
hands the reservation to the stream's :class:`StreamHold` instead.  The
stream body (:class:`SyncStreamBody` / :class:`AsyncStreamBody`, mixed into
the httpx or httpx2 byte-stream class) feeds every chunk to an
:class:`~rateloop.integrations._body.SSEWatch` and then:

- an error event inside the ``200`` stream is raised as
  :class:`StreamInterrupted`, after the bytes that came before it;
- the end of the stream settles the reservation from the usage the events
  reported (the estimate when they reported none);
- an early close, an error, a cancelled task or a stream dropped without
  closing (a finalizer) releases it, concurrency slot included.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any

from rateloop.errors import RateloopError
from rateloop.integrations._body import SSEWatch
from rateloop.route import Route
from rateloop.signal import LimitSignal

__all__ = ["AsyncStreamBody", "StreamHold", "StreamInterrupted", "SyncStreamBody"]


class StreamInterrupted(RateloopError):
    """A stream already handed to the caller failed mid-way (an error event in a 200 stream).

    ``signal`` is the classified error (``overload`` for Anthropic's
    ``overloaded_error``).  The request is never replayed once bytes reached
    the caller: retrying is the caller's decision.
    """

    def __init__(self, signal: LimitSignal, *, route: Route | None = None) -> None:
        self.signal = signal
        self.route = route
        where = f" on {route.scope}" if route is not None else ""
        super().__init__(f"the stream failed mid-way{where}: {signal.kind.value}")


class StreamHold:
    """A stream's reservation, from the loop's settle until the stream ends."""

    __slots__ = ("__weakref__", "box", "completed", "route", "watch")

    def __init__(self, route: Route) -> None:
        self.route = route
        self.watch = SSEWatch()
        self.box: list[Any] = [None]  # the reservation; shared with the abandonment finalizer
        self.completed = False

    def hold(self, reservation: Any) -> None:
        self.box[0] = reservation

    def _take(self) -> tuple[Any, tuple[int, int] | None]:
        reservation, self.box[0] = self.box[0], None
        if reservation is None or self.watch.error is not None:
            return reservation, None
        usage = self.watch.usage()
        if usage is None and self.completed:
            usage = (reservation.cost.input_tokens, reservation.cost.output_tokens)
        return reservation, usage

    def finish(self) -> None:
        reservation, usage = self._take()
        if reservation is not None:
            if usage is None:
                reservation.release()
            else:
                reservation.settle(*usage)

    async def afinish(self) -> None:
        reservation, usage = self._take()
        if reservation is not None:
            if usage is None:
                await reservation.arelease()
            else:
                await reservation.asettle(*usage)

    def check(self, chunk: bytes) -> bytes:
        """The part of ``chunk`` to pass on; raises once an error event is complete."""
        if self.watch.error is not None:
            raise StreamInterrupted(self.watch.error, route=self.route)
        return chunk[: self.watch.feed(chunk)]

    @property
    def failed(self) -> bool:
        return self.watch.error is not None

    def pass_on(self, chunk: bytes) -> Iterator[bytes]:
        """The bytes of ``chunk`` for the caller; then the error, if an event completed one."""
        passed = self.check(chunk)
        if passed:
            yield passed
        if self.failed:
            self.check(b"")  # the error, after the bytes that came before it


def _release_abandoned(box: list[Any]) -> None:
    """Finalizer of a stream dropped without closing: give its capacity back."""
    reservation, box[0] = box[0], None
    if reservation is not None:
        # An async-only backend cannot be reached from a finalizer: its lease expires instead.
        with contextlib.suppress(Exception):
            reservation.release()


class _StreamBody:
    """What both stream bodies hold: the inner stream, its hold, the abandonment finalizer."""

    def __init__(self, inner: Any, hold: StreamHold) -> None:
        self._inner = inner
        self._hold = hold
        weakref.finalize(self, _release_abandoned, hold.box)


class SyncStreamBody(_StreamBody):
    """The body of a sync stream handed to the caller (mixed into the module's SyncByteStream)."""

    def __iter__(self) -> Iterator[bytes]:
        try:
            for chunk in self._inner:
                yield from self._hold.pass_on(chunk)
            self._hold.completed = True
        finally:
            self._hold.finish()

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._hold.finish()


class AsyncStreamBody(_StreamBody):
    """The body of an async stream handed to the caller; see :class:`SyncStreamBody`."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                for piece in self._hold.pass_on(chunk):
                    yield piece
            self._hold.completed = True
        finally:
            # Also on task cancellation: the capacity goes back before the cancel goes on.
            await self._hold.afinish()

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            await self._hold.afinish()
