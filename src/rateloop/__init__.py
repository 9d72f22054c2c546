"""rateloop: a runtime control layer that keeps AI agents working when providers push back.

Read (classify refusals), Admit (reserve shared capacity), Time (wait what the
server asked, within budgets), Exit (an explicit outcome for every call).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rateloop")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0+unknown"

from rateloop._clock import Clock, SystemClock
from rateloop.admission.spec import LimitSpec
from rateloop.errors import BackendError, ConfigError, RateLimitExhausted, RateloopError
from rateloop.outcome import AttemptLedger, Attempts, Outcome, Status
from rateloop.route import Cost, Route
from rateloop.signal import Dimension, Kind, LimitSignal, Observed

__all__ = [
    "AttemptLedger",
    "Attempts",
    "BackendError",
    "Clock",
    "ConfigError",
    "Cost",
    "Dimension",
    "Kind",
    "LimitSignal",
    "LimitSpec",
    "Observed",
    "Outcome",
    "RateLimitExhausted",
    "RateloopError",
    "Route",
    "Status",
    "SystemClock",
    "__version__",
]
