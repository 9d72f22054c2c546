"""The loop: the RATE loop's flow and the two drivers that perform it.

- :mod:`~rateloop.loop.flow` — the one effect generator shared by both drivers.
- :mod:`~rateloop.loop.effects` — the effects the flow yields and what comes back.
- :mod:`~rateloop.loop.args` — the call's argument checks.
- :mod:`~rateloop.loop.drivers` — :class:`RateLoop` (blocking) and :class:`AsyncRateLoop`.
"""

from __future__ import annotations

from rateloop.loop.args import CallOptions, Priority
from rateloop.loop.drivers import AsyncRateLoop, RateLoop

__all__ = ["AsyncRateLoop", "CallOptions", "Priority", "RateLoop"]
