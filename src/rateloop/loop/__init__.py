"""The loop: the RATE loop's flow and the two drivers that perform it.

- :mod:`~rateloop.loop.flow` — one call's flow, shared by both drivers: small generators
  of effects (admit, attempt, settle and observe, guard a write, apply the decision).
- :mod:`~rateloop.loop.effects` — the closed vocabulary of effects the flow yields, and
  what comes back.
- :mod:`~rateloop.loop.report` — one call's events, attempt ledger and outcome.
- :mod:`~rateloop.loop.base` — the loop's configuration and its public hooks
  (``keep_reservation=``, ``like`` / ``replace``).
- :mod:`~rateloop.loop.args` — the argument checks and the limiter contract.
- :mod:`~rateloop.loop.drivers` — :class:`RateLoop` (blocking) and :class:`AsyncRateLoop`,
  which perform the effects by type.
- :mod:`~rateloop.loop.sdk_count` — the requests an SDK sent inside one attempt (the
  attempt ledger's SDK layer).
"""

from __future__ import annotations

from rateloop.loop.args import CallOptions, Priority
from rateloop.loop.drivers import AsyncRateLoop, RateLoop

__all__ = ["AsyncRateLoop", "CallOptions", "Priority", "RateLoop"]
