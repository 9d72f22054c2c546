"""The transport classes of one httpx-like package, built from the package module.

httpx and httpx2 have the same transport interface under two names, so the
two faces (:mod:`rateloop.integrations.httpx`, :mod:`rateloop.integrations.httpx2`)
are one implementation: :func:`transport_faces` makes the sync and async
transport classes (and the stream bodies they hand out) from the module it is
given.  The algorithm itself is the shared driver in
:mod:`rateloop.integrations._transport`.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

from rateloop.integrations._stream import AsyncStreamBody, SyncStreamBody
from rateloop.integrations._transport import TransportBase

__all__ = ["Faces", "transport_faces"]


@dataclass(frozen=True, slots=True)
class Faces:
    """The sync and async RATE-loop transports of one package."""

    sync: type[Any]
    async_: type[Any]


def transport_faces(hx: ModuleType, module: str) -> Faces:
    """``RateLoopTransport`` / ``AsyncRateLoopTransport`` for the httpx-like module ``hx``.

    ``module`` is the public module the classes are shown in (their ``__module__``).
    """
    package = hx.__name__

    class _SyncStream(SyncStreamBody, hx.SyncByteStream):  # type: ignore[misc,name-defined]
        pass

    class _AsyncStream(AsyncStreamBody, hx.AsyncByteStream):  # type: ignore[misc,name-defined]
        pass

    class RateLoopTransport(TransportBase, hx.BaseTransport):  # type: ignore[misc,name-defined]
        __doc__ = (
            f"A sync {package} transport running each request through the RATE loop.\n\n"
            f"``{package}.Client(transport=RateLoopTransport(policy=..., limiter=...))``."
        )

        is_async = False
        sync_stream = _SyncStream
        async_stream = _AsyncStream

        def handle_request(self, request: Any) -> Any:
            return self._send_sync(request)

        def close(self) -> None:
            self.inner.close()

    class AsyncRateLoopTransport(TransportBase, hx.AsyncBaseTransport):  # type: ignore[misc,name-defined]
        __doc__ = f"An async {package} transport running each request through the async RATE loop."

        is_async = True
        sync_stream = _SyncStream
        async_stream = _AsyncStream

        async def handle_async_request(self, request: Any) -> Any:
            return await self._send_async(request)

        async def aclose(self) -> None:
            await self.inner.aclose()

    for cls in (_SyncStream, _AsyncStream, RateLoopTransport, AsyncRateLoopTransport):
        cls.hx = hx
        cls.__module__ = module
        cls.__qualname__ = cls.__name__
    return Faces(sync=RateLoopTransport, async_=AsyncRateLoopTransport)
