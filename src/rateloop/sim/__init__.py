"""The fleet simulator: the real RateLoop and Limiter against a FakeProvider on virtual time.

``rateloop simulate`` (see docs/simulate.md) runs N tasks × K calls under
rateloop and under models of the usual retry strategies, on a virtual clock,
and prints what each did; :func:`plan_capacity` answers the planning
questions (how long, how much concurrency helps, what limits a target needs).
"""

from __future__ import annotations

from rateloop.sim.harness import RunResult, ideal_seconds, run_strategy
from rateloop.sim.plan import Plan, plan_capacity
from rateloop.sim.scenarios import SCENARIOS, Scenario, build_scenario
from rateloop.sim.strategies import STRATEGIES
from rateloop.sim.vtime import VirtualClock, VirtualEventLoop, run_virtual
from rateloop.sim.workload import CallSpec, TaskSpec, Workload, load_trace

__all__ = [
    "SCENARIOS",
    "STRATEGIES",
    "CallSpec",
    "Plan",
    "RunResult",
    "Scenario",
    "TaskSpec",
    "VirtualClock",
    "VirtualEventLoop",
    "Workload",
    "build_scenario",
    "ideal_seconds",
    "load_trace",
    "plan_capacity",
    "run_strategy",
    "run_virtual",
]
