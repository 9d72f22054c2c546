"""The fleet bench's short workload on virtual time (same limiter, loop, provider).

Diagnostic: `PYTHONPATH=src python bench/fleet_vtime.py . [-v]` (-v: starts per 0.5 s).
4 "processes" share one MemoryBackend (Redis stands in), reading learned values.
"""
import asyncio, random, sys, time
sys.path.insert(0, sys.argv[1] + "/bench")
from fleet_bench import make_calls
from rateloop import AsyncRateLoop, Cost, Route
from rateloop.admission import Limiter, LimitSpec
from rateloop.admission.memory import MemoryBackend
from rateloop.policy import Policy
from rateloop.sim.vtime import VirtualClock, run_virtual
from rateloop.sim.harness import ideal_seconds
from rateloop.sim.workload import CallSpec
from rateloop.testing import FakeProvider, FakeRequest
from rateloop.testing._fake.buckets import FakeLimits

def main(strategy, processes, tasks=60, calls=4, conc=30):
    calls_ = make_calls(tasks, calls, 1)
    async def run():
        clock = VirtualClock()
        limits = FakeLimits(rpm=1200, tpm=1_200_000, burst_seconds=2)
        provider = FakeProvider(profile="openai", limits=limits, latency=0.5, model="m",
                                refusal_latency=0.01, clock=clock)
        route = Route(provider="openai", model="m")
        burst = 2 / 60 if strategy == "burst" else None
        lim = {route.provider_scope: LimitSpec(requests_per_minute=1200, tokens_per_minute=1_200_000,
                                               burst=burst)} if strategy != "zero" else {}
        shared = MemoryBackend(clock)
        loops = []
        for g in range(processes):
            limiter = Limiter(shared if processes > 1 else None, limits=lim, clock=clock,
                              rng=random.Random(g))
            if processes > 1:
                limiter._learned_shared = True
                limiter._learned._shared = True
            loops.append(AsyncRateLoop(Policy(), limiter=limiter, clock=clock,
                                       rng=random.Random(10 + g).random))
        gates = [asyncio.Semaphore(conc // processes) for _ in range(processes)]
        t0 = clock.monotonic()
        starts = []
        async def task(i, cs):
            g = i % processes
            async with gates[g]:
                for inp, cap, out in cs:
                    async def attempt(_r):
                        starts.append(clock.monotonic() - t0)
                        return await provider.arespond(FakeRequest(input_tokens=inp, max_tokens=cap, output_tokens=out))
                    o = await loops[g].call(attempt, route=route, cost=Cost(input_tokens=inp, output_tokens=cap))
                    if not o.ok:
                        return False
            return True
        oks = await asyncio.gather(*(task(i, cs) for i, cs in enumerate(calls_)))
        wall = clock.monotonic() - t0
        return wall, sum(oks), provider.stats.refused, sorted(starts)
    wall, ok, refused, starts = run_virtual(run())
    ideal = ideal_seconds(profile="openai", limits=FakeLimits(rpm=1200, tpm=1_200_000, burst_seconds=2),
                          latency=0.5, tasks=[(0.0, tuple(CallSpec(a, b, c) for a, b, c in cs)) for cs in calls_])
    print(f"{strategy:10} procs={processes} wall={wall:.2f} ideal={ideal:.2f} eff={ideal/wall:.3f} ok={ok} refused={refused}")
    return starts

if __name__ == "__main__":
    for p in (1, 4):
        for s in ("configured", "zero", "burst"):
            st = main(s, p)
            if "-v" in sys.argv:
                # starts per 0.5 s
                import collections
                c = collections.Counter(int(x * 2) / 2 for x in st)
                print("  ", " ".join(f"{k:g}:{v}" for k, v in sorted(c.items())))
