"""The limiter every admission conformance test runs against: memory, then the real Redis."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from rateloop.admission.limiter import Limiter
from rateloop.testing import FakeClock


@pytest.fixture(params=["memory", "redis"])
def limiter(request: pytest.FixtureRequest, clock: FakeClock) -> Iterator[Limiter]:
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        prefix = request.getfixturevalue("redis_prefix")
        lim = Limiter.from_url(url, prefix=prefix, rng=random.Random(1))
    else:
        lim = Limiter(clock=clock, rng=random.Random(1))
    yield lim
    lim.close()
