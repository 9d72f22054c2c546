"""The RATE loop as an ``httpx2`` transport: every request admitted, read, timed and settled.

``RateLoopTransport`` / ``AsyncRateLoopTransport`` wrap another httpx2
transport (by default a plain ``httpx2.HTTPTransport``); the algorithm is the
shared driver in :mod:`rateloop.integrations._transport`.  Install with
``pip install 'rateloop[httpx2]'``.
"""

from __future__ import annotations

from rateloop.integrations._transport import (
    OUTCOME_KEY,
    AdmissionRefused,
    AsyncStreamBody,
    StreamInterrupted,
    SyncStreamBody,
    TransportBase,
    admission_refusal,
)

try:
    import httpx2 as _hx
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "rateloop.integrations.httpx2 needs the 'httpx2' package: pip install 'rateloop[httpx2]'"
    ) from exc

__all__ = [
    "OUTCOME_KEY",
    "AdmissionRefused",
    "AsyncRateLoopTransport",
    "RateLoopTransport",
    "StreamInterrupted",
    "admission_refusal",
]


class _SyncStream(SyncStreamBody, _hx.SyncByteStream):
    pass


class _AsyncStream(AsyncStreamBody, _hx.AsyncByteStream):
    pass


class RateLoopTransport(TransportBase, _hx.BaseTransport):
    """A sync httpx2 transport running each request through the RATE loop.

    ``httpx2.Client(transport=RateLoopTransport(policy=..., limiter=...))``.
    """

    hx = _hx
    is_async = False
    sync_stream = _SyncStream
    async_stream = _AsyncStream

    def handle_request(self, request: _hx.Request) -> _hx.Response:
        response: _hx.Response = self._send_sync(request)
        return response

    def close(self) -> None:
        self.inner.close()


class AsyncRateLoopTransport(TransportBase, _hx.AsyncBaseTransport):
    """An async httpx2 transport running each request through the async RATE loop."""

    hx = _hx
    is_async = True
    sync_stream = _SyncStream
    async_stream = _AsyncStream

    async def handle_async_request(self, request: _hx.Request) -> _hx.Response:
        response: _hx.Response = await self._send_async(request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()

