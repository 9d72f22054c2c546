"""A pytest plugin: the ``fake_provider`` fixture (registered through the ``pytest11`` entry point).

A test asks for it and gets a running :class:`~rateloop.testing.FakeProviderServer`
on 127.0.0.1 with default limits; ``fake_provider.provider`` is the
:class:`~rateloop.testing.FakeProvider` (its counters, ``exhaust_day()`` …).
For other limits, mark the test::

    @pytest.mark.fake_provider(profile="anthropic", rpm=5, latency=0.01)
    def test_mine(fake_provider):
        client = anthropic.Anthropic(base_url=fake_provider.url, api_key="fake")
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from rateloop.testing._fake.provider import FakeProvider
from rateloop.testing._fake.server import FakeProviderServer

__all__ = ["fake_provider"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "fake_provider(**options): FakeProvider options for the fake_provider fixture "
        "(profile, rpm, tpm, itpm, otpm, rpd, concurrency, latency, faults, ...)",
    )


@pytest.fixture
def fake_provider(request: pytest.FixtureRequest) -> Iterator[FakeProviderServer]:
    """A FakeProvider serving on 127.0.0.1 for this test (``.url``, ``.provider``)."""
    options: dict[str, Any] = {}
    marker = request.node.get_closest_marker("fake_provider")
    if marker is not None:
        options.update(marker.kwargs)
    with FakeProviderServer(FakeProvider(**options)) as server:
        yield server
