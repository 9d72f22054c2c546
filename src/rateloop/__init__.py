"""rateloop: a runtime control layer that keeps AI agents working when providers push back.

Read (classify refusals), Admit (reserve shared capacity), Time (wait what the
server asked, within budgets), Exit (an explicit outcome for every call).

How the face loads: ``import rateloop`` imports only the values every stage
passes around (the signal and route vocabulary, the errors, the clock, the
Exit record and events) and Time (backoff, budgets, the sans-IO decider).
Every other public name is listed in :data:`_LAZY` with the module that
defines it and is imported on first use by the module-level
:func:`__getattr__` (PEP 562), then kept in the module's namespace, so
``from rateloop import RateLoop`` works as before and costs its import once.
``__version__`` is read from the installed metadata the same way (stamina's
``__init__.py``).

One name needs more: ``rateloop.classify`` is both the Read subpackage and
its function.  Whoever imports the subpackage first (a stage, or a user's
``from rateloop.classify import ...``) makes the import system bind the
module to ``rateloop.classify``; :class:`_Face` binds the function instead,
as the eager face's ``from rateloop.classify import classify`` did.
"""

from __future__ import annotations

import logging
import sys
import types
from typing import TYPE_CHECKING, Any

from rateloop._clock import Clock, SystemClock
from rateloop.errors import (
    BackendError,
    ConfigError,
    PolicyWarning,
    RateLimitExhausted,
    RateloopError,
)
from rateloop.outcome.console import ConsoleSink
from rateloop.outcome.events import CapacityEvent, DecisionKind, LoggingSink, RecordingSink
from rateloop.outcome.record import AttemptLedger, Attempts, Outcome, Status
from rateloop.route import Cost, Priority, Route
from rateloop.signal import Dimension, Kind, LimitSignal, Observed
from rateloop.timing.backoff import Backoff, WaitPlan, plan_wait
from rateloop.timing.budget import CallBudget, RunBudget
from rateloop.timing.decide import Decision, FallBack, Proceed, Stop, Wait, decide
from rateloop.timing.writes import WriteOutcome

if TYPE_CHECKING:  # what the lazy names are, for type checkers and editors
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
        classify_mcp,
        classify_response,
        classify_text,
        detect_provider,
    )
    from rateloop.integrations.clients import (
        anthropic_client,
        async_anthropic_client,
        async_openai_client,
        genai_client,
        openai_client,
    )
    from rateloop.loop.drivers import AsyncRateLoop, RateLoop
    from rateloop.policy import (
        AdmissionPolicy,
        AgentsPolicy,
        FallbackPolicy,
        Governance,
        Layer,
        Policy,
    )
    from rateloop.tasks import AsyncTaskRunner, TaskRunner, TaskState, task

    __version__: str

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
    "classify_mcp",
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

_READ = "rateloop.classify"  # ~100 patterns and ~4000 lines: the largest stage to load
_ADMIT = "rateloop.admission"
_POLICY = "rateloop.policy"  # TOML/YAML loading, layers and locks
_LOOP = "rateloop.loop.drivers"
_TASKS = "rateloop.tasks"  # sqlite3, the durable store
_AGENTS = "rateloop.agents"  # subprocess, the CLI-agent runner
_CLIENTS = "rateloop.integrations.clients"  # the SDK clients, each an extra

#: Each public name imported on first use, and the module that provides it.
_LAZY: dict[str, str] = {
    "AdmissionPolicy": _POLICY,
    "AdmissionRejected": _ADMIT,
    "AdmissionTimeout": _ADMIT,
    "AgentSettings": _AGENTS,
    "AgentsPolicy": _POLICY,
    "AsyncRateLoop": _LOOP,
    "AsyncTaskRunner": _TASKS,
    "Denied": _ADMIT,
    "FallbackPolicy": _POLICY,
    "Governance": _POLICY,
    "Layer": _POLICY,
    "LimitSpec": _ADMIT,
    "Limiter": _ADMIT,
    "Policy": _POLICY,
    "RateLoop": _LOOP,
    "Reservation": _ADMIT,
    "StepFailure": _AGENTS,
    "TaskRunner": _TASKS,
    "TaskState": _TASKS,
    "anthropic_client": _CLIENTS,
    "async_anthropic_client": _CLIENTS,
    "async_openai_client": _CLIENTS,
    "classify": _READ,
    "classify_exception": _READ,
    "classify_mcp": _READ,
    "classify_response": _READ,
    "classify_text": _READ,
    "detect_provider": _READ,
    "genai_client": _CLIENTS,
    "openai_client": _CLIENTS,
    "run_step": _AGENTS,
    "task": _TASKS,
}


def __getattr__(name: str) -> Any:
    """Import a lazy public name on first use and keep it (PEP 562)."""
    if name == "__version__":
        from rateloop._version import package_version

        value: Any = package_version()
    else:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        from importlib import import_module

        value = getattr(import_module(module), name)
    globals()[name] = value  # later look-ups find it without calling this again
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Face(types.ModuleType):
    """The face's module type: it keeps ``rateloop.classify`` the function."""

    def __setattr__(self, name: str, value: Any) -> None:
        # The import system binds a loaded subpackage to its parent's attribute.
        if name == "classify" and isinstance(value, types.ModuleType):
            value = value.classify
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Face


# A library never configures logging for its users: without a handler of theirs,
# rateloop's log records (events, policy lock warnings) go nowhere.
logging.getLogger("rateloop").addHandler(logging.NullHandler())
