"""The named scenarios of ``rateloop simulate``: a provider, a workload, what rateloop is told.

Every scenario starts from the same embedded defaults (an OpenAI-shaped
provider at 60 RPM and 40,000 TPM with a 5 s burst, 2 s per answer, 40 tasks
× 5 calls; a request reaches the provider 0-10 ms after it is sent, as no real
one lands on the planned instant) and changes one thing:

- ``burst``: every task arrives at once.
- ``steady``: tasks arrive evenly over four minutes.
- ``daily``: the day quota (RPD) is smaller than the work.
- ``storm``: as ``steady``, and half the attempts are overloaded (529-style)
  between 30 s and 150 s.
- ``lower``: the provider enforces half the limits rateloop was configured with.
- ``shared``: four processes share one budget (rateloop's limiter state is
  shared, as through Redis; zero-config processes each learn alone).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from rateloop.admission import LimitSpec
from rateloop.sim.workload import Workload
from rateloop.testing import FakeLimits
from rateloop.testing._fake.buckets import PROFILES, Profile, charge_of

__all__ = ["SCENARIOS", "Scenario", "StormWindow", "build_scenario"]

SCENARIOS = ("burst", "steady", "daily", "storm", "lower", "shared")


@dataclass(frozen=True, slots=True)
class StormWindow:
    start: float
    end: float
    rates: dict[str, float]


@dataclass(frozen=True, slots=True)
class Scenario:
    """One simulated situation."""

    name: str
    description: str
    profile: str
    limits: FakeLimits  # what the provider enforces
    configured: LimitSpec  # what rateloop is told the limits are
    workload: Workload
    latency: float = 2.0
    refusal_latency: float = 0.05
    transit: float = 0.01  # a request reaches the provider 0..transit seconds after it is sent
    storms: tuple[StormWindow, ...] = field(default=())
    processes: int = 1

    def limits_text(self) -> str:
        """``openai provider: 60 RPM, 40,000 TPM, 5 s burst; answers take 2 s``."""
        lim = self.limits
        parts = [f"{getattr(lim, k):,} {k.upper()}"
                 for k in ("rpm", "tpm", "itpm", "otpm", "rpd") if getattr(lim, k) is not None]
        if lim.concurrency is not None:
            parts.append(f"{lim.concurrency} at once")
        shown = ", ".join(parts) or "no limits"
        return (f"{self.profile} provider: {shown}, {lim.burst_seconds:g} s burst; "
                f"requests reach it in 0-{self.transit * 1000:g} ms, answers take "
                f"{self.latency:g} s")

    def provider_options(self) -> dict[str, Any]:
        return {"profile": self.profile, "limits": self.limits, "latency": self.latency,
                "refusal_latency": self.refusal_latency, "model": "sim-model"}


def limit_spec(
    limits: FakeLimits, workload: Workload, profile: Profile, *, scale: float = 1.0
) -> LimitSpec:
    """The LimitSpec describing ``limits`` (times ``scale``), burst included.

    The limiter's ``burst`` is the provider's burst as a fraction of a minute,
    raised so that the workload's largest call fits in it: the limiter refuses
    for good a call larger than its burst, while a provider admits any call
    within its per-minute limit from a full bucket.
    """

    def scaled(value: int | None) -> int | None:
        return None if value is None else max(1, round(value * scale))

    burst = limits.burst_seconds / 60
    calls = [c for t in workload.tasks for c in t.calls]
    for name, limit in (("tpm", limits.tpm), ("itpm", limits.itpm), ("otpm", limits.otpm)):
        if limit is None or not calls:
            continue
        charges = [charge_of(profile, c.input_tokens, c.max_tokens, 0) for c in calls]
        largest = max(getattr(ch, {"tpm": "total", "itpm": "input", "otpm": "output"}[name])
                      for ch in charges)
        burst = max(burst, largest / (limit * scale))
    return LimitSpec(
        requests_per_minute=scaled(limits.rpm),
        tokens_per_minute=scaled(limits.tpm),
        input_tokens_per_minute=scaled(limits.itpm),
        output_tokens_per_minute=scaled(limits.otpm),
        requests_per_day=scaled(limits.rpd),
        concurrency=scaled(limits.concurrency),
        burst=min(1.0, burst),
    )


def build_scenario(
    name: str,
    *,
    tasks: int = 40,
    calls: int = 5,
    profile: str = "openai",
    rpm: int | None = 60,
    tpm: int | None = 40_000,
    itpm: int | None = None,
    otpm: int | None = None,
    rpd: int | None = None,
    concurrency: int | None = None,
    burst_seconds: float = 5.0,
    latency: float = 2.0,
    transit: float = 0.01,
    input_tokens: int = 600,
    max_tokens: int = 400,
    spread: float = 0.5,
    output_ratio: float = 0.6,
    workload: Workload | None = None,
    seed: int = 1,
) -> Scenario:
    """The scenario ``name`` on these limits and this workload (or a trace's)."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; allowed: {', '.join(SCENARIOS)}")
    processes = 4 if name == "shared" else 1
    arrival = 240.0 if name in ("steady", "storm") else 0.0
    given = workload is not None  # a trace (or a caller's workload) keeps its own arrivals
    if workload is None:
        workload = Workload.generate(tasks=tasks, calls=calls, input_tokens=input_tokens,
                                     max_tokens=max_tokens, spread=spread,
                                     output_ratio=output_ratio, arrival_secs=arrival,
                                     processes=processes, seed=seed)
    elif processes > 1:
        workload = Workload(
            tuple(replace(t, group=i % processes) for i, t in enumerate(workload.tasks)),
            workload.description,
        )
    limits = FakeLimits(rpm=rpm, tpm=tpm, itpm=itpm, otpm=otpm, rpd=rpd,
                        concurrency=concurrency, burst_seconds=burst_seconds)
    prof: Profile = profile if profile in PROFILES else "openai"
    configured = limit_spec(limits, workload, prof)
    storms: tuple[StormWindow, ...] = ()
    if name == "daily":
        day = max(1, workload.calls * 3 // 5)
        limits = replace(limits, rpd=day)
        configured = limit_spec(limits, workload, prof)
        what = f"the day quota is {day} requests for {workload.calls} calls"
    elif name == "storm":
        storms = (StormWindow(30.0, 150.0, {"overload": 0.5}),)
        what = ("half the attempts are overloaded between 30 s and 150 s" if given else
                "tasks arrive over 240 s and half the attempts are overloaded between 30 s "
                "and 150 s")
    elif name == "lower":
        limits = FakeLimits(
            rpm=_half(rpm), tpm=_half(tpm), itpm=_half(itpm), otpm=_half(otpm), rpd=rpd,
            concurrency=concurrency, burst_seconds=burst_seconds,
        )
        what = "the provider enforces half the limits rateloop was told"
    elif name == "shared":
        what = f"{processes} processes share one budget"
    elif given:
        what = "tasks arrive when the workload says"
    elif name == "steady":
        what = "tasks arrive evenly over 240 s"
    else:
        what = "every task arrives at once"
    return Scenario(
        name=name,
        description=f"{name}: {what}; {workload.description}",
        profile=profile,
        limits=limits,
        configured=configured,
        workload=workload,
        latency=latency,
        transit=transit,
        storms=storms,
        processes=processes,
    )


def _half(value: int | None) -> int | None:
    return None if value is None else max(1, value // 2)
