"""Capacity planning: how long a workload takes under given limits, and what would change it.

Pure arithmetic on the same model the FakeProvider enforces (continuously
refilled per-minute buckets holding ``burst_seconds`` of their limit):

- **Completion time.** A per-minute limit ``L`` (rate ``r = L/60`` per second,
  bucket ``c = r × burst``) serves a demand ``D`` in ``(D - c) / r`` seconds at
  best; the workload needs the largest of these over every limited dimension,
  and never less than its longest task's own chain of calls (``calls ×
  latency`` after it arrives) nor, with a concurrency limit ``C``, than
  ``calls × latency / C``.
- **Useful concurrency (Little's law).** In steady state the calls in flight
  are ``N = λ × W``: the sustainable call rate ``λ`` (the tightest limit
  divided by what one call costs in it) times the time a call takes ``W``.
  More calls in flight than ``ceil(N)`` cannot go faster: they only wait, or
  collect 429s.
- **The limit a target needs.** Finishing in ``T`` seconds needs
  ``(D - c) / r <= T``, that is ``L >= 60 × D / (T + burst)`` for each
  dimension; a target shorter than the longest task's chain cannot be met
  by any limit.
- **Day quota.** More calls than the requests-per-day limit cannot finish
  today, whatever the per-minute limits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rateloop.sim.workload import CallSpec, Workload
from rateloop.testing import FakeLimits
from rateloop.testing._fake.buckets import Profile, charge_of

__all__ = ["DimensionPlan", "Plan", "plan_capacity"]

_DIMENSIONS = (("rpm", "requests"), ("tpm", "tokens"), ("itpm", "input tokens"),
               ("otpm", "output tokens"))


@dataclass(frozen=True, slots=True)
class DimensionPlan:
    name: str  # rpm, tpm, itpm, otpm
    limit: int
    demand: float  # units the whole workload needs
    per_call: float  # mean units one call costs
    seconds: float  # the least time this dimension allows
    needed_for_target: int | None  # the limit that would meet the target


@dataclass(frozen=True, slots=True)
class Plan:
    calls: int
    completion_secs: float
    binding: str  # what bounds the completion time
    calls_per_minute: float  # the sustainable rate λ, per minute
    useful_concurrency: int  # ceil(λ × W)
    latency: float
    dimensions: tuple[DimensionPlan, ...]
    critical_path_secs: float
    target_secs: float | None
    target_feasible: bool | None
    day_shortfall: int  # calls beyond the day quota (0 = fits)

    def lines(self) -> list[str]:
        """The plan in plain sentences."""
        out = [
            f"{self.calls} calls finish in {self.completion_secs:,.0f} s at best "
            f"(bound by {self.binding}).",
            f"Sustainable rate: {self.calls_per_minute:,.1f} calls/min; each call takes "
            f"{self.latency:g} s, so about {self.useful_concurrency} call(s) in flight is all the "
            "limits can use (Little's law): more concurrency only adds waiting or 429s.",
        ]
        for d in self.dimensions:
            out.append(f"  {d.name} {d.limit:,}: needs {d.demand:,.0f} ({d.per_call:,.0f}/call) "
                       f"-> {d.seconds:,.0f} s")
        if self.day_shortfall:
            out.append(f"The day quota is {self.day_shortfall} calls short: those cannot "
                       "finish before the quota resets.")
        if self.target_secs is not None:
            if not self.target_feasible:
                out.append(
                    f"A target of {self.target_secs:,.0f} s cannot be met by raising limits: "
                    f"the longest task's own chain of calls takes {self.critical_path_secs:,.0f} s."
                )
            else:
                raises = [
                    f"{d.name} {d.limit:,} -> {d.needed_for_target:,} "
                    f"(×{d.needed_for_target / d.limit:.2f})"
                    for d in self.dimensions
                    if d.needed_for_target is not None and d.needed_for_target > d.limit
                ]
                if raises:
                    out.append(f"To finish in {self.target_secs:,.0f} s: " + ", ".join(raises)
                               + ".")
                else:
                    out.append(f"The current limits already meet {self.target_secs:,.0f} s.")
        return out


def _amount(name: str, profile: Profile, call: CallSpec) -> float:
    charge = charge_of(profile, call.input_tokens, call.max_tokens, 0)
    if name == "rpm":
        return 1.0
    if name == "tpm":
        return float(charge.total)
    if name == "itpm":
        return float(charge.input)
    # Anthropic corrects the output charge to what was produced.
    return float(call.output_tokens if profile == "anthropic" else charge.output)


def plan_capacity(
    workload: Workload,
    limits: FakeLimits,
    *,
    profile: Profile = "openai",
    latency: float = 2.0,
    target_secs: float | None = None,
) -> Plan:
    """The capacity plan of ``workload`` under ``limits`` (see the module docstring)."""
    if latency <= 0:
        raise ValueError(f"latency must be > 0 seconds, got {latency!r}")
    if target_secs is not None and target_secs <= 0:
        raise ValueError(f"target must be > 0 seconds, got {target_secs!r}")
    calls = [c for t in workload.tasks for c in t.calls]
    if not calls:
        raise ValueError("the workload has no calls")
    critical = max(t.start + len(t.calls) * latency for t in workload.tasks)
    bounds: list[tuple[float, str]] = [(critical, "the longest task's chain of calls")]
    rates: list[float] = []  # calls per second each dimension sustains
    dims = []
    burst = limits.burst_seconds
    for name, label in _DIMENSIONS:
        limit = getattr(limits, name)
        if limit is None:
            continue
        demand = sum(_amount(name, profile, c) for c in calls)
        per_call = demand / len(calls)
        rate = limit / 60.0
        seconds = max(0.0, (demand - max(1.0, rate * burst)) / rate)
        needed = None
        if target_secs is not None:
            needed = math.ceil(60.0 * demand / (target_secs + burst))
        dims.append(DimensionPlan(name, limit, demand, per_call, seconds, needed))
        bounds.append((seconds, f"{label} per minute ({name})"))
        if per_call > 0:
            rates.append(rate / per_call)
    if limits.concurrency is not None:
        bounds.append((len(calls) * latency / limits.concurrency,
                       f"concurrency ({limits.concurrency})"))
        rates.append(limits.concurrency / latency)
    completion, binding = max(bounds)
    rate = min(rates) if rates else math.inf
    useful = math.ceil(rate * latency - 1e-9) if math.isfinite(rate) else len(calls)
    shortfall = max(0, len(calls) - limits.rpd) if limits.rpd is not None else 0
    return Plan(
        calls=len(calls),
        completion_secs=completion,
        binding=binding,
        calls_per_minute=rate * 60 if math.isfinite(rate) else math.inf,
        useful_concurrency=max(1, useful),
        latency=latency,
        dimensions=tuple(dims),
        critical_path_secs=critical,
        target_secs=target_secs,
        target_feasible=None if target_secs is None else target_secs >= critical,
        day_shortfall=shortfall,
    )
