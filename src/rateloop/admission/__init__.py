"""Admit: reserve shared capacity before a call.

:class:`Limiter` reserves requests, tokens, day quotas and concurrency in
every scope of a route at once, on the in-process ``memory://`` backend or on
Redis; see ``docs/admission.md``.  Where things live::

    limiter.py       Limiter: construction and the public twins (a composition of:)
      runner.py        BackendRunner (performs flows' steps; local fallback), Refusals
      local.py         the local fallback's share of each limit; its grants carried back
      known.py         KnownLimits: limits in force (configured, learned), cached plans
      admit.py         Admissions: try_reserve / reserve flows; what reservations call back
      feedback.py      Feedback: observe / pause flows (learning from the provider)
    reservation.py   Reservation, Denied, AdmissionTimeout, AdmissionRejected, Settler
    plan.py          checks, plans and the backend operations
    holds.py         HeldCapacity: capacity in flight until released (a batch queue's tokens)
    spec.py  profile.py  gcra.py  learning.py  subscription.py
    backends/        protocol + registry (leaves), memory, redis (+ codec, scripts, wire,
                     clients, *.lua), keys (the Redis key layout)
"""

from rateloop.admission.backends import Backend, BackendUnreachable, register_backend
from rateloop.admission.backends.memory import MemoryBackend
from rateloop.admission.gcra import AIMD
from rateloop.admission.holds import Held, HeldCapacity
from rateloop.admission.limiter import Limiter
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
    "Held",
    "HeldCapacity",
    "LimitSpec",
    "Limiter",
    "MemoryBackend",
    "Priority",
    "Reservation",
    "register_backend",
]
