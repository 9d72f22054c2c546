"""Run one scenario under one strategy on virtual time, and measure it.

Every strategy meets a fresh FakeProvider built from the scenario, on a fresh
:class:`~rateloop.sim.vtime.VirtualEventLoop`, with the same seed: the same
tasks arrive at the same virtual moments with the same token sizes.  A task
runs its calls in order and is *lost* when one of them ends without success.

The measures:

- ``wall``: virtual seconds until every task has ended (completed or not);
- ``ideal``: the least time the provider's limits allow for all the work that
  can be done today (:func:`ideal_seconds`; with a day quota, the tasks that
  fit in it); ``efficiency`` = (completed ÷ achievable tasks) × min(1, ideal ÷ wall):
  the share of the work done, times how close to the ideal time it ran;
- ``deferred``: tasks that ended with an explicit "wait for capacity / the
  reset" outcome and a time to resume (rateloop's), ``lost``: the others;
- ``rejected per success``: provider refusals per successful call;
- ``attempts per call``: provider attempts per call started;
- task latency percentiles (arrival to end) over completed tasks.
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass, field

from rateloop.route import Route
from rateloop.sim.plan import plan_of
from rateloop.sim.scenarios import Scenario
from rateloop.sim.strategies import CallResult, SimContext, make_caller
from rateloop.sim.vtime import VirtualClock, run_virtual
from rateloop.sim.workload import CallSpec, TaskSpec, Workload
from rateloop.testing import FakeLimits, FakeProvider
from rateloop.testing._fake.buckets import Profile

__all__ = ["RunResult", "TaskResult", "achievable_tasks", "ideal_seconds", "run_strategy"]

_DEFERRED = frozenset({"waiting_for_capacity", "waiting_for_reset"})


@dataclass(frozen=True, slots=True)
class TaskResult:
    start: float
    end: float
    completed: bool
    calls_done: tuple[CallSpec, ...]
    calls_started: int
    attempts: int
    status: str  # how the last call ended


@dataclass(slots=True)
class RunResult:
    scenario: str
    strategy: str
    tasks: list[TaskResult]
    provider_attempts: int
    provider_refusals: int
    served: int
    ideal: float
    achievable: int
    attempts_log: list[tuple[float, bool]] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)

    @property
    def completed(self) -> int:
        return sum(t.completed for t in self.tasks)

    @property
    def deferred(self) -> int:
        return sum(not t.completed and t.status in _DEFERRED for t in self.tasks)

    @property
    def lost(self) -> int:
        return len(self.tasks) - self.completed - self.deferred

    @property
    def wall(self) -> float:
        return max((t.end for t in self.tasks), default=0.0)

    @property
    def efficiency(self) -> float:
        if self.wall <= 0 or self.achievable == 0:
            return 0.0
        # The share of the work done times how close to the ideal it ran: a strategy
        # that fails fast must not score for its short wall.
        return self.completed / self.achievable * min(1.0, self.ideal / self.wall)

    @property
    def rejected_per_success(self) -> float:
        return self.provider_refusals / self.served if self.served else math.inf

    @property
    def attempts_per_call(self) -> float:
        started = sum(t.calls_started for t in self.tasks)
        return self.provider_attempts / started if started else 0.0

    def latency(self, q: float) -> float | None:
        done = sorted(t.end - t.start for t in self.tasks if t.completed)
        if not done:
            return None
        index = min(len(done) - 1, max(0, math.ceil(q * len(done)) - 1))
        return done[index]


def ideal_seconds(
    *,
    profile: Profile,
    limits: FakeLimits,
    latency: float,
    tasks: list[tuple[float, tuple[CallSpec, ...]]],
) -> float:
    """The least wall time in which ``limits`` let ``tasks`` (arrival, calls) complete.

    The capacity plan's completion time (:func:`rateloop.sim.plan.plan_capacity`):
    the largest of each per-minute bucket's bound (its demand beyond one
    bucket at its rate, the largest call last, plus that call's answer), the
    concurrency bound and each task's own chain of calls.
    """
    if not any(calls for _, calls in tasks):
        return 0.0
    work = Workload(tuple(TaskSpec(start, calls) for start, calls in tasks), "ideal")
    return plan_of(work, limits, profile, latency).completion_secs


def achievable_tasks(tasks: tuple[TaskSpec, ...], rpd: int | None) -> list[TaskSpec]:
    """The tasks that a day quota of ``rpd`` requests can complete (in arrival order)."""
    if rpd is None:
        return list(tasks)
    chosen, used = [], 0
    for task in sorted(tasks, key=lambda t: t.start):
        if used + len(task.calls) <= rpd:
            chosen.append(task)
            used += len(task.calls)
    return chosen


async def _run(scenario: Scenario, strategy: str, seed: int) -> RunResult:
    clock = VirtualClock()
    provider = FakeProvider(clock=clock, seed=seed, **scenario.provider_options())
    route = Route(provider=scenario.profile, model="sim-model")
    ctx = SimContext(provider=provider, clock=clock, rng=random.Random(seed),
                     configured=scenario.configured, route=route, transit=scenario.transit,
                     transit_rng=random.Random(f"transit-{seed}"))
    callers = {g: make_caller(strategy, ctx, g) for g in range(scenario.processes)}
    statuses: dict[str, int] = {}

    async def storm(start: float, end: float, rates: dict[str, float]) -> None:
        await asyncio.sleep(start)
        provider.set_fault_rates(rates)
        await asyncio.sleep(end - start)
        provider.set_fault_rates(None)

    async def run_task(spec: TaskSpec) -> TaskResult:
        await asyncio.sleep(spec.start)
        start = clock.monotonic()
        caller = callers[spec.group % scenario.processes]
        done: list[CallSpec] = []
        attempts = 0
        result: CallResult | None = None
        for call in spec.calls:
            result = await caller(call)
            attempts += result.attempts
            statuses[result.status] = statuses.get(result.status, 0) + 1
            if not result.ok:
                break
            done.append(call)
        completed = len(done) == len(spec.calls)
        return TaskResult(start, clock.monotonic(), completed, tuple(done),
                          len(done) + (0 if completed else 1), attempts,
                          result.status if result is not None else "completed")

    storms = [asyncio.ensure_future(storm(w.start, w.end, w.rates)) for w in scenario.storms]
    results = await asyncio.gather(*(run_task(t) for t in scenario.workload.tasks))
    for pending in storms:
        pending.cancel()
    await asyncio.gather(*storms, return_exceptions=True)
    possible = achievable_tasks(scenario.workload.tasks, scenario.limits.rpd)
    ideal = ideal_seconds(
        profile=provider.profile, limits=scenario.limits, latency=scenario.latency,
        tasks=[(t.start, t.calls) for t in possible],
    )
    stats = provider.stats
    return RunResult(
        scenario=scenario.name,
        strategy=strategy,
        tasks=list(results),
        provider_attempts=stats.attempts,
        provider_refusals=stats.refused,
        served=stats.served,
        ideal=ideal,
        achievable=len(possible),
        attempts_log=ctx.attempts_log,
        statuses=statuses,
    )


def run_strategy(scenario: Scenario, strategy: str, *, seed: int = 1) -> RunResult:
    """Simulate ``scenario`` under ``strategy`` on virtual time."""
    return run_virtual(_run(scenario, strategy, seed))
