"""The fleet bench's workload on virtual time, with the jitter of a real machine (diagnostic).

The same Limiter, AsyncRateLoop and FakeProvider as ``fleet_bench.py``, on a
virtual clock (``rateloop.sim.vtime``), so a run takes a fraction of a second
and is reproducible from its seed.  N "processes" each have their own Limiter
and loop over one shared ``MemoryBackend`` (standing in for Redis: one
clock, one atomic store, learned limits read through the backend).  What the
HTTP bench has and a clean virtual run does not is *jitter*, added here per
process:

* ``--stall``: a wake-up is late (an event loop busy with other work, a
  loaded machine): each sleep overshoots by an exponential delay of mean
  ``--stall`` seconds with probability ``--stall-p``;
* ``--send``: the request reaches the provider after a uniform delay in
  ``[0, send]`` (client and network), ``--recv`` the same for the answer;
* ``--foreign T:N[,T:N...]``: another client of the same key takes ``N``
  request slots of the provider's bucket at ``T`` seconds (a refusal this
  fleet cannot foresee; its booked starts must not all be refused after it).

Each refusal is recorded with its time, dimension, and the provider's bucket
level next to the refused call's booked start (``-v`` prints them).

    PYTHONPATH=src python bench/fleet_vtime.py                        # clean
    PYTHONPATH=src python bench/fleet_vtime.py --stall 0.03 --send 0.02 --reps 20
    PYTHONPATH=src python bench/fleet_vtime.py --strategies zero --processes 4 -v
    PYTHONPATH=src python bench/fleet_vtime.py --foreign 3:2 --reps 10 -v
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import random
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleet_bench import WORKLOADS, make_calls

from rateloop import AsyncRateLoop, Cost, Route
from rateloop.admission import Limiter, LimitSpec
from rateloop.admission.backends.memory import MemoryBackend
from rateloop.policy import Policy
from rateloop.sim.harness import ideal_seconds
from rateloop.sim.vtime import VirtualClock, run_virtual
from rateloop.sim.workload import CallSpec
from rateloop.testing import FakeProvider, FakeRequest
from rateloop.testing._fake.buckets import FakeLimits

LIMITS = FakeLimits(rpm=1200, tpm=1_200_000, burst_seconds=2)
#: The booked start (limiter time) of the calling task's last grant.
_BOOKED: contextvars.ContextVar[float | None] = contextvars.ContextVar("booked", default=None)


class RecordingLimiter(Limiter):
    """A Limiter that tells the calling task when its last grant was booked to start."""

    async def atry_book(self, route: Route, cost: Cost, priority: str, within: float) -> Any:
        granted = await super().atry_book(route, cost, priority, within)
        _BOOKED.set(granted.granted_at + granted.starts_in if granted else None)
        return granted


class JitteryClock(VirtualClock):
    """A process's clock: its sleeps overshoot now and then (a busy event loop)."""

    def __init__(self, rng: random.Random, stall: float, p: float) -> None:
        super().__init__()
        self._rng, self._stall, self._p = rng, stall, p

    async def asleep(self, seconds: float) -> None:
        late = self._rng.expovariate(1 / self._stall) if self._stall and (
            self._rng.random() < self._p) else 0.0
        await super().asleep(seconds + late)


def split(n: int, parts: int) -> list[int]:
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def run(strategy: str, processes: int, workload: str, seed: int, args: Any) -> dict[str, Any]:
    shape = WORKLOADS[workload]
    calls = make_calls(shape["tasks"], shape["calls"], 1)
    route = Route(provider="openai", model="fake-model")

    async def main() -> dict[str, Any]:
        base = VirtualClock()
        provider = FakeProvider(profile="openai", limits=LIMITS, latency=0.5,
                                model="fake-model", refusal_latency=0.01, clock=base)
        burst = 2 / 60 if strategy == "burst" else None
        limits = {} if strategy == "zero" else {route.provider_scope: LimitSpec(
            requests_per_minute=LIMITS.rpm, tokens_per_minute=LIMITS.tpm, burst=burst)}
        shared = MemoryBackend(base)
        rng = random.Random(seed)
        slots = split(args.concurrency, processes)
        counts = [round(len(calls) * s / args.concurrency) for s in slots]
        counts[-1] = len(calls) - sum(counts[:-1])
        loops, gates, clocks = [], [], []
        for g in range(processes):
            clock = JitteryClock(random.Random(rng.random()), args.stall, args.stall_p)
            limiter = RecordingLimiter(shared if processes > 1 else None, limits=limits,
                                       clock=clock, rng=random.Random(rng.random()))
            if processes > 1:  # read learned values through the shared store, as on Redis
                limiter._known.shared = True
                limiter._known.learned._shared = True
            loops.append(AsyncRateLoop(Policy(), limiter=limiter, clock=clock,
                                       rng=random.Random(rng.random()).random))
            gates.append(asyncio.Semaphore(slots[g]))
            clocks.append(clock)
        owner = [g for g, n in enumerate(counts) for _ in range(n)]
        net = random.Random(rng.random())
        t0 = base.monotonic()
        refusals: list[tuple[float, int, str, float, float]] = []

        async def task(i: int, cs: list[tuple[int, int, int]]) -> bool:
            g = owner[i]
            async with gates[g]:
                for inp, cap, out in cs:
                    async def attempt(_r: Route, inp: int = inp, cap: int = cap,
                                      out: int = out) -> Any:
                        if args.send:
                            await asyncio.sleep(net.uniform(0, args.send))
                        level = provider._buckets["requests"]
                        level.refill(base.monotonic())
                        before = level.level
                        resp = await provider.arespond(
                            FakeRequest(input_tokens=inp, max_tokens=cap, output_tokens=out))
                        if resp.status_code == 429:
                            booked = _BOOKED.get()
                            late = base.monotonic() - booked if booked is not None else -1.0
                            refusals.append((base.monotonic() - t0, g, resp.refused or "?",
                                             before, late))
                        if args.recv:
                            await asyncio.sleep(net.uniform(0, args.recv))
                        return _Answer(resp)

                    o = await loops[g].call(attempt, route=route,
                                            cost=Cost(input_tokens=inp, output_tokens=cap))
                    if not o.ok:
                        return False
            return True

        async def foreign(at: float, slots: int) -> None:
            await base.asleep(at)
            bucket = provider._buckets["requests"]
            bucket.refill(base.monotonic())
            bucket.take(slots)  # served elsewhere: the provider's bucket only

        extra = [foreign(at, n) for at, n in args.foreign]
        oks = (await asyncio.gather(*(task(i, cs) for i, cs in enumerate(calls)), *extra))
        oks = oks[: len(calls)]
        return {"wall": base.monotonic() - t0, "ok": sum(oks), "refused": provider.stats.refused,
                "served": provider.stats.served, "refusals": refusals}

    out = run_virtual(main())
    specs = [(0.0, tuple(CallSpec(a, b, c) for a, b, c in cs)) for cs in calls]
    ideal = ideal_seconds(profile="openai", limits=LIMITS, latency=0.5, tasks=specs)
    out["ideal"] = ideal
    out["eff"] = min(1.0, out["ok"] / len(calls) * ideal / out["wall"])
    return out


class _Answer:
    """The FakeResponse as the loop reads an HTTP response (status, headers)."""

    def __init__(self, resp: Any) -> None:
        self.status_code = resp.status_code
        self.headers = resp.headers
        self.content = resp.content

    def json(self) -> Any:
        import json

        return json.loads(self.content)


def _foreign(text: str) -> list[tuple[float, int]]:
    out = []
    for part in text.split(","):
        at, _, n = part.partition(":")
        try:
            out.append((float(at), int(n)))
        except ValueError:
            raise argparse.ArgumentTypeError(f"--foreign wants T:N[,...], got {text!r}") from None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategies", default="configured,zero,burst")
    parser.add_argument("--processes", default="1,4")
    parser.add_argument("--workload", default="short")
    parser.add_argument("--concurrency", type=int, default=30)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stall", type=float, default=0.0, help="mean overshoot of a sleep, s")
    parser.add_argument("--stall-p", type=float, default=0.2, help="share of sleeps overshot")
    parser.add_argument("--send", type=float, default=0.0, help="request transit, up to s")
    parser.add_argument("--recv", type=float, default=0.0, help="answer transit, up to s")
    parser.add_argument("--foreign", type=_foreign, default=[],
                        help="T:N[,T:N...]: another client takes N request slots at T s")
    parser.add_argument("-v", action="store_true", help="print every refusal")
    args = parser.parse_args()
    print(f"{'strategy':10} {'procs':>5} {'eff min/med':>12} {'429/ok mean/max':>16} "
          f"{'runs with 429':>13} {'429 max':>7}")
    for processes in (int(p) for p in args.processes.split(",")):
        for strategy in args.strategies.split(","):
            rows = [run(strategy, processes, args.workload, args.seed + r, args)
                    for r in range(args.reps)]
            effs = [r["eff"] for r in rows]
            rates = [r["refused"] / max(1, r["served"]) for r in rows]
            print(f"{strategy:10} {processes:>5} {min(effs):>5.3f}/{statistics.median(effs):.3f}"
                  f" {statistics.mean(rates):>7.3f}/{max(rates):.3f} "
                  f"{sum(1 for x in rates if x):>8}/{len(rows)} "
                  f"{max(r['refused'] for r in rows):>7}", flush=True)
            if args.v:
                for r, row in enumerate(rows):
                    for t, g, dim, before, late in row["refusals"]:
                        print(f"   run {r} t={t:7.3f} proc {g} {dim:9} provider level "
                              f"{before:6.2f}, sent {late * 1000:6.1f} ms after its booked start")


if __name__ == "__main__":
    main()
