"""Admit: reserve shared capacity before a call.

:class:`Limiter` reserves requests, tokens, day quotas and concurrency in
every scope of a route at once, on the in-process ``memory://`` backend or on
Redis; see ``docs/admission.md``.
"""

from rateloop.admission.backend import Backend, BackendUnreachable, register_backend
from rateloop.admission.gcra import AIMD
from rateloop.admission.limiter import Limiter
from rateloop.admission.memory import MemoryBackend
from rateloop.admission.reservation import (
    AdmissionRejected,
    AdmissionTimeout,
    Denied,
    Reservation,
)
from rateloop.admission.spec import LimitSpec
from rateloop.route import Priority

__all__ = [
    "AIMD",
    "AdmissionRejected",
    "AdmissionTimeout",
    "Backend",
    "BackendUnreachable",
    "Denied",
    "LimitSpec",
    "Limiter",
    "MemoryBackend",
    "Priority",
    "Reservation",
    "register_backend",
]
