"""The FakeProvider: limits, shapes, faults, the ASGI app and the server (see docs/testing.md)."""

from __future__ import annotations

from rateloop.testing._fake.batch import FakeBatch
from rateloop.testing._fake.buckets import FakeLimits
from rateloop.testing._fake.model import FAULTS, FakeRequest, FakeResponse, FakeStats, Slow
from rateloop.testing._fake.provider import FakeProvider
from rateloop.testing._fake.server import FakeProviderServer

__all__ = [
    "FAULTS",
    "FakeBatch",
    "FakeLimits",
    "FakeProvider",
    "FakeProviderServer",
    "FakeRequest",
    "FakeResponse",
    "FakeStats",
    "Slow",
]
