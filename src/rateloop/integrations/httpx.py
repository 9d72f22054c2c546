"""The RATE loop as an ``httpx`` transport: every request admitted, read, timed and settled.

``RateLoopTransport`` / ``AsyncRateLoopTransport`` wrap another httpx
transport (by default a plain ``httpx.HTTPTransport``).  Without ``limiter=``
(or ``loop=``) they get the self-learning limiter every door gets
(:mod:`rateloop.integrations._assemble`).  The classes are made from the
``httpx`` module by :func:`~rateloop.integrations._faces.transport_faces`,
the same code as the other face; the algorithm is the shared driver in
:mod:`rateloop.integrations._transport`.  Install with
``pip install 'rateloop[httpx]'``.
"""

from __future__ import annotations

from rateloop.integrations._faces import transport_faces
from rateloop.integrations._transport import (
    OUTCOME_KEY,
    AdmissionRefused,
    StreamInterrupted,
    admission_refusal,
)

try:
    import httpx as _hx
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "rateloop.integrations.httpx needs the 'httpx' package: pip install 'rateloop[httpx]'"
    ) from exc

__all__ = [
    "OUTCOME_KEY",
    "AdmissionRefused",
    "AsyncRateLoopTransport",
    "RateLoopTransport",
    "StreamInterrupted",
    "admission_refusal",
]

_faces = transport_faces(_hx, __name__)
RateLoopTransport = _faces.sync
AsyncRateLoopTransport = _faces.async_
