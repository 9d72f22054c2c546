"""Capacity planning: how long a workload takes under given limits, and what would change it.

Pure arithmetic on the same model the FakeProvider enforces (continuously
refilled per-minute buckets holding ``burst_seconds`` of their limit; a call
is admitted once the bucket holds ``min(cost, bucket)``, so a call larger
than the bucket is let in from a full one and leaves it in debt):

- **Completion time.** A per-minute limit ``L`` (rate ``r = L/60`` per second,
  bucket ``c = r × burst``) admits a demand ``D`` whose largest call ``a``
  comes last no sooner than ``(D - max(0, a - c) - c) / r`` seconds, and that
  call's answer takes ``latency`` more; the workload needs the largest of
  these over every limited dimension, and never less than its longest task's
  own chain of calls (arrival + ``calls × latency``) nor, with a concurrency
  limit ``C``, than ``ceil(calls / C) × latency``.  :func:`bucket_seconds` is
  one dimension's bound and :func:`plan_of` the workload's; the simulator's
  "quota-bound ideal" is the same number.
- **Useful concurrency (Little's law).** In steady state the calls in flight
  are ``N = λ × W``: the sustainable call rate ``λ`` (the tightest limit
  divided by what one call costs in it) times the time a call takes ``W``.
  More calls in flight than ``ceil(N)`` cannot go faster: they only wait, or
  collect 429s.
- **The limits a target needs.** Finishing in ``T`` seconds needs each
  dimension's bound ``<= T`` (with the largest call within the bucket,
  ``L >= 60 × D / (T - latency + burst)``), a concurrency of at least
  ``ceil(calls / floor(T / latency))``, and a day quota of every call; a
  target shorter than the longest task's chain cannot be met by any limit.
- **Day quota.** More calls than the requests-per-day limit cannot finish
  today, whatever the per-minute limits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rateloop.sim.workload import CallSpec, Workload
from rateloop.testing import FakeLimits
from rateloop.testing._fake.buckets import Profile, charge_of

__all__ = ["DimensionPlan", "Plan", "Raise", "bucket_seconds", "plan_capacity"]

_DIMENSIONS = (("rpm", "requests"), ("tpm", "tokens"), ("itpm", "input tokens"),
               ("otpm", "output tokens"))


@dataclass(frozen=True, slots=True)
class DimensionPlan:
    name: str  # rpm, tpm, itpm, otpm
    limit: int
    demand: float  # units the whole workload needs
    per_call: float  # mean units one call costs
    seconds: float  # the least time this dimension allows (the last call answered); inf:
    #                 a call costs more than the whole minute's limit and never fits
    needed_for_target: int | None  # the limit that would meet the target
    largest: float = 0.0  # what the largest call costs


@dataclass(frozen=True, slots=True)
class Raise:
    """A limit to raise so that the workload meets the target."""

    name: str  # rpm, tpm, itpm, otpm, concurrency, rpd
    limit: int
    needed: int

    def __str__(self) -> str:
        return f"{self.name} {self.limit:,} -> {self.needed:,} (×{self.needed / self.limit:.2f})"


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
    raises: tuple[Raise, ...] = ()  # what meets the target (empty: nothing needs raising)

    def lines(self) -> list[str]:
        """The plan in plain sentences."""
        finish = (f"{self.calls} calls cannot all finish (bound by {self.binding})."
                  if math.isinf(self.completion_secs) else
                  f"{self.calls} calls finish in {self.completion_secs:,.0f} s at best "
                  f"(bound by {self.binding}).")
        out = [
            finish,
            f"Sustainable rate: {self.calls_per_minute:,.1f} calls/min; each call takes "
            f"{self.latency:g} s, so about {self.useful_concurrency} call(s) in flight is all the "
            "limits can use (Little's law): more concurrency only adds waiting or 429s.",
        ]
        for d in self.dimensions:
            if math.isinf(d.seconds):
                out.append(f"  {d.name} {d.limit:,}: a call needs {d.largest:,.0f}, more than the "
                           "whole minute's limit: it is refused whatever the wait")
                continue
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
            elif self.raises:
                out.append(f"To finish in {self.target_secs:,.0f} s: "
                           + ", ".join(str(r) for r in self.raises) + ".")
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


def bucket_seconds(demand: float, largest: float, limit: int, burst: float,
                   latency: float) -> float:
    """The least time a bucket of ``limit`` per minute lets ``demand`` through, answered.

    The largest call (``largest``) goes last: it is admitted once the bucket
    holds ``min(largest, bucket)``, so what exceeds the bucket needs no
    refill; its answer takes ``latency``.
    """
    if largest > limit:  # the provider refuses it for good (more than a minute's limit)
        return math.inf
    rate = limit / 60.0
    capacity = max(1.0, rate * burst)
    return max(0.0, (demand - max(0.0, largest - capacity) - capacity) / rate) + latency


def _limit_for(demand: float, largest: float, burst: float, latency: float,
               target: float) -> int:
    """The least per-minute limit whose :func:`bucket_seconds` is within ``target``."""
    low = max(1, math.ceil(largest))
    high = max(low, math.ceil(60.0 * demand / max(target - latency, 1e-6)) + 1)
    while low < high:  # bucket_seconds falls as the limit grows
        mid = (low + high) // 2
        if bucket_seconds(demand, largest, mid, burst, latency) <= target + 1e-9:
            high = mid
        else:
            low = mid + 1
    return low


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
    if not workload.calls:
        raise ValueError("the workload has no calls")
    return plan_of(workload, limits, profile, latency, target_secs)


def plan_of(workload: Workload, limits: FakeLimits, profile: Profile, latency: float,
            target_secs: float | None = None) -> Plan:
    """:func:`plan_capacity` without its checks (the simulator's ideal allows latency 0)."""
    calls = [c for t in workload.tasks for c in t.calls]
    critical = max(t.start + len(t.calls) * latency for t in workload.tasks)
    feasible = None if target_secs is None else target_secs >= critical
    meet = target_secs if feasible else None  # plan raises only for a target limits can meet
    bounds: list[tuple[float, str]] = [(critical, "the longest task's chain of calls")]
    rates: list[float] = []  # calls per second each dimension sustains
    dims = []
    raises: list[Raise] = []
    burst = limits.burst_seconds
    for name, label in _DIMENSIONS:
        limit = getattr(limits, name)
        if limit is None:
            continue
        amounts = [_amount(name, profile, c) for c in calls]
        demand, largest = sum(amounts), max(amounts)
        per_call = demand / len(calls)
        seconds = bucket_seconds(demand, largest, limit, burst, latency)
        needed = None if meet is None else _limit_for(demand, largest, burst, latency, meet)
        dims.append(DimensionPlan(name, limit, demand, per_call, seconds, needed, largest))
        if needed is not None and needed > limit:
            raises.append(Raise(name, limit, needed))
        bounds.append((seconds, f"{label} per minute ({name})"))
        if per_call > 0:
            rates.append(limit / 60.0 / per_call)
    cap = limits.concurrency
    if cap is not None:
        bounds.append((math.ceil(len(calls) / cap) * latency, f"concurrency ({cap})"))
        rates.append(cap / latency)
        if meet is not None and latency > 0:
            # ceil(calls / C) rounds of ``latency`` must fit in the target.
            needed_cap = math.ceil(len(calls) / max(1, math.floor(meet / latency + 1e-9)))
            if needed_cap > cap:
                raises.append(Raise("concurrency", cap, needed_cap))
    completion, binding = max(bounds)
    rate = min(rates) if rates else math.inf
    useful = math.ceil(rate * latency - 1e-9) if math.isfinite(rate) else len(calls)
    shortfall = max(0, len(calls) - limits.rpd) if limits.rpd is not None else 0
    if shortfall and meet is not None and limits.rpd is not None:
        raises.append(Raise("rpd", limits.rpd, len(calls)))  # all of it today
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
        target_feasible=feasible,
        day_shortfall=shortfall,
        raises=tuple(raises),
    )
