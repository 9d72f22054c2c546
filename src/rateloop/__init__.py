"""rateloop: a runtime control layer that keeps AI agents working when providers push back.

Read (classify refusals), Admit (reserve shared capacity), Time (wait what the
server asked, within budgets), Exit (an explicit outcome for every call).
"""

from __future__ import annotations

import logging
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rateloop")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0+unknown"

from rateloop._clock import Clock, SystemClock
from rateloop.admission import (
    AdmissionRejected,
    AdmissionTimeout,
    Denied,
    Limiter,
    LimitSpec,
    Reservation,
)
from rateloop.agents import AgentSettings, StepFailure, run_step
from rateloop.classify import (
    classify,
    classify_exception,
    classify_response,
    classify_text,
    detect_provider,
)
from rateloop.errors import BackendError, ConfigError, RateLimitExhausted, RateloopError
from rateloop.integrations.clients import (
    anthropic_client,
    async_anthropic_client,
    async_openai_client,
    genai_client,
    openai_client,
)
from rateloop.loop.drivers import AsyncRateLoop, RateLoop
from rateloop.outcome.console import ConsoleSink
from rateloop.outcome.events import CapacityEvent, DecisionKind, LoggingSink, RecordingSink
from rateloop.outcome.record import AttemptLedger, Attempts, Outcome, Status
from rateloop.policy import (
    AdmissionPolicy,
    AgentsPolicy,
    FallbackPolicy,
    Governance,
    Layer,
    Policy,
    PolicyWarning,
)
from rateloop.route import Cost, Priority, Route
from rateloop.signal import Dimension, Kind, LimitSignal, Observed
from rateloop.tasks import AsyncTaskRunner, TaskRunner, TaskState, task
from rateloop.timing.backoff import Backoff, WaitPlan, plan_wait
from rateloop.timing.budget import CallBudget, RunBudget
from rateloop.timing.decide import Decision, FallBack, Proceed, Stop, Wait, decide
from rateloop.timing.writes import WriteOutcome

__all__ = [
    "AdmissionPolicy",
    "AdmissionRejected",
    "AdmissionTimeout",
    "AgentSettings",
    "AgentsPolicy",
    "AsyncRateLoop",
    "AsyncTaskRunner",
    "AttemptLedger",
    "Attempts",
    "BackendError",
    "Backoff",
    "CallBudget",
    "CapacityEvent",
    "Clock",
    "ConfigError",
    "ConsoleSink",
    "Cost",
    "Decision",
    "DecisionKind",
    "Denied",
    "Dimension",
    "FallBack",
    "FallbackPolicy",
    "Governance",
    "Kind",
    "Layer",
    "LimitSignal",
    "LimitSpec",
    "Limiter",
    "LoggingSink",
    "Observed",
    "Outcome",
    "Policy",
    "PolicyWarning",
    "Priority",
    "Proceed",
    "RateLimitExhausted",
    "RateLoop",
    "RateloopError",
    "RecordingSink",
    "Reservation",
    "Route",
    "RunBudget",
    "Status",
    "StepFailure",
    "Stop",
    "SystemClock",
    "TaskRunner",
    "TaskState",
    "Wait",
    "WaitPlan",
    "WriteOutcome",
    "__version__",
    "anthropic_client",
    "async_anthropic_client",
    "async_openai_client",
    "classify",
    "classify_exception",
    "classify_response",
    "classify_text",
    "decide",
    "detect_provider",
    "genai_client",
    "openai_client",
    "plan_wait",
    "run_step",
    "task",
]

# A library never configures logging for its users: without a handler of theirs,
# rateloop's log records (events, policy lock warnings) go nowhere.
logging.getLogger("rateloop").addHandler(logging.NullHandler())
