"""Stress: 8 processes × 50 concurrent callers share one Redis limiter; the logs prove the bound.

Every worker process logs each grant: ``("g", granted_at, tokens, before,
after)`` with the Redis ``TIME`` the script decided at (the limiter's own
report) and the worker's own wall clock read immediately before
``try_reserve`` was called and immediately after it returned (independent of
the limiter), and ``("s", granted_at, settled_at, refund)`` when it settles.
The parent then checks:

* requests and tokens, on the limiter's times: in every window ``[t_i, t_j]``
  the net units admitted are at most ``capacity + rate × (t_j - t_i)`` -- the
  exact bound of a continuously refilled bucket (see
  ``rateloop/admission/gcra.py``), with refunds counted as negative
  admissions at the time they were given back;
* requests, on the workers' independent times (see :func:`max_interval_excess`):
  for every window ``[s, s + W]``, the grants whose ``[before, after]``
  interval intersects it number at most ``capacity + rate × (W + 2M)``, where
  ``M`` is the longest ``after - before`` of the run;
* concurrency: at no instant are more leases held than the limit;
* the fixed day window: never more grants than the day's limit.

Half the workers use threads and ``try_reserve``, half asyncio tasks and
``atry_reserve`` (each waits ``retry_after`` itself, so the clock reads
bracket exactly one admission), so both drivers and both redis-py clients are
exercised.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import multiprocessing as mp
import random
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from rateloop.admission.gcra import DAY
from rateloop.admission.limiter import Limiter
from rateloop.admission.reservation import Reservation
from rateloop.admission.spec import LimitSpec
from rateloop.route import Cost, Route

PROCESSES = 8
CALLERS = 50
RUN_SECONDS = 3.0
ROUTE = Route(provider="stress", model="m", project="p")
REQUESTS_PER_MINUTE = 2_400  # 40/s, burst 0.1 -> 240
TOKENS_PER_MINUTE = 60_000  # 1000/s, burst 0.1 -> 6000
CONCURRENCY = 8
REQUESTS_PER_DAY = 350
LIMITS = {
    "stress:m": LimitSpec(
        requests_per_minute=REQUESTS_PER_MINUTE, tokens_per_minute=TOKENS_PER_MINUTE, burst=0.1
    ),
    "stress:m:p": LimitSpec(
        concurrency=CONCURRENCY, requests_per_day=REQUESTS_PER_DAY, day_resets_at="00:00"
    ),
}


def _caller_plan(rng: random.Random) -> tuple[Cost, int, float]:
    cost = Cost(input_tokens=rng.randint(5, 40), output_tokens=rng.randint(0, 30))
    used_output = rng.randint(0, cost.output_tokens)  # usage <= estimate: refunds happen
    return cost, used_output, rng.uniform(0.0, 0.03)


def _grant_line(r: Reservation, before: float, after: float) -> str:
    return json.dumps(["g", r.granted_at, r.cost.tokens, before, after])


def _settle_line(r: Reservation, used_output: int) -> str:
    refund = r.cost.output_tokens - used_output
    return json.dumps(["s", r.granted_at, r.settled_at, refund])


def _thread_worker(limiter: Limiter, end: float, seed: int, out: list[str]) -> None:
    rng = random.Random(seed)
    while True:
        cost, used_output, hold = _caller_plan(rng)
        while True:
            before = time.time()  # the worker's own clock, independent of the limiter
            r = limiter.try_reserve(ROUTE, cost)
            after = time.time()
            if isinstance(r, Reservation):
                break
            if time.monotonic() + r.retry_after > end:
                return
            time.sleep(r.retry_after)
        out.append(_grant_line(r, before, after))
        time.sleep(hold)  # the "call"
        r.settle(cost.input_tokens, used_output)
        out.append(_settle_line(r, used_output))


async def _task_worker(limiter: Limiter, end: float, seed: int, out: list[str]) -> None:
    rng = random.Random(seed)
    while True:
        cost, used_output, hold = _caller_plan(rng)
        while True:
            before = time.time()
            r = await limiter.atry_reserve(ROUTE, cost)
            after = time.time()
            if isinstance(r, Reservation):
                break
            if time.monotonic() + r.retry_after > end:
                return
            await asyncio.sleep(r.retry_after)
        out.append(_grant_line(r, before, after))
        await asyncio.sleep(hold)
        await r.asettle(cost.input_tokens, used_output)
        out.append(_settle_line(r, used_output))


def worker(index: int, url: str, prefix: str, log: str, ready: object, start: object) -> None:
    """One process: CALLERS concurrent callers until RUN_SECONDS have passed."""
    limiter = Limiter.from_url(url, prefix=prefix, limits=LIMITS)
    out: list[str] = []
    ready.release()  # type: ignore[attr-defined]
    start.wait()  # type: ignore[attr-defined]
    end = time.monotonic() + RUN_SECONDS
    if index % 2:

        async def run() -> None:
            await asyncio.gather(
                *(_task_worker(limiter, end, index * 1000 + i, out) for i in range(CALLERS))
            )
            await limiter.aclose()

        asyncio.run(run())
    else:
        threads = [
            threading.Thread(target=_thread_worker, args=(limiter, end, index * 1000 + i, out))
            for i in range(CALLERS)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    limiter.close()
    Path(log).write_text("\n".join(out) + "\n")


def max_window_excess(events: list[tuple[float, float]], capacity: float, rate: float) -> float:
    """max over time windows [s, e] of (net units in it) - (capacity + rate × (e - s)).

    Events at the same instant are merged first, so a window holds all of them.
    O(n) with a running maximum: for each end j, the best start i <= j
    maximizes ``rate × t_i - prefix_before_i``.
    """
    merged: dict[float, float] = defaultdict(float)
    for t, units in events:
        merged[t] += units
    worst = -float("inf")
    best_start = -float("inf")
    prefix = 0.0
    for t, units in sorted(merged.items()):
        best_start = max(best_start, rate * t - prefix)
        prefix += units
        worst = max(worst, prefix - rate * t + best_start - capacity)
    return worst


def max_interval_excess(
    intervals: list[tuple[float, float]], capacity: float, rate: float
) -> float:
    """Worst excess over the bound on independent clock reads, or <= 0 when it holds.

    Each grant happened at some instant ``g`` inside its ``[before, after]``
    interval (the script ran after the call was sent and before its reply came
    back; every worker reads the same host clock).  A grant whose interval
    intersects ``[s, e]`` therefore has ``g`` in ``[s - M, e + M]``, where
    ``M`` is the longest interval, and the bucket admits at most
    ``capacity + rate × (e - s + 2M)`` in that wider window.  This returns
    ``max over s <= e of N(s, e) - capacity - rate × (e - s + 2M)``, where
    ``N(s, e) = #{before <= e} - #{after < s}`` counts the intersecting
    intervals (an interval ending before ``s`` also began before ``e``).  The
    maximum is at ``e`` = some ``before`` and ``s`` = some ``after`` (or
    ``s = e``), found by one sweep in O(n log n).
    """
    if not intervals:
        return -capacity
    longest = max(a - b for b, a in intervals)
    befores = sorted(b for b, _ in intervals)
    afters = sorted(a for _, a in intervals)
    worst = -float("inf")
    best_start = -float("inf")  # max over s <= e of rate × s - #{after < s}
    k = 0
    for j, e in enumerate(befores):
        while k < len(afters) and afters[k] <= e:
            best_start = max(best_start, rate * afters[k] - bisect.bisect_left(afters, afters[k]))
            k += 1
        start = max(best_start, rate * e - bisect.bisect_left(afters, e))
        count_before = bisect.bisect_right(befores, e, lo=j)
        worst = max(worst, count_before - rate * e + start)
    return worst - capacity - 2 * rate * longest


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = [(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals]
    events.sort(key=lambda e: (e[0], e[1]))  # a release at the same instant comes first
    held = worst = 0
    for _, delta in events:
        held += delta
        worst = max(worst, held)
    return worst


@pytest.mark.slow
def test_redis_limiter_under_8_processes_never_exceeds_any_limit(
    redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    ctx = mp.get_context("spawn")
    ready = ctx.Semaphore(0)
    start = ctx.Event()
    logs = [tmp_path / f"worker-{i}.jsonl" for i in range(PROCESSES)]
    procs = [
        ctx.Process(target=worker, args=(i, redis_url, redis_prefix, str(logs[i]), ready, start))
        for i in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        assert ready.acquire(timeout=30), "a worker did not start"
    start.set()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0, f"worker exited with {p.exitcode}"

    requests: list[tuple[float, float]] = []
    tokens: list[tuple[float, float]] = []
    leases: list[tuple[float, float]] = []
    brackets: list[tuple[float, float]] = []  # the workers' own [before, after] per grant
    for log in logs:
        for line in log.read_text().splitlines():
            if not line:
                continue
            record = json.loads(line)
            if record[0] == "g":
                _, t, units, before, after = record
                brackets.append((before, after))
                requests.append((t, 1.0))
                tokens.append((t, float(units)))
            else:
                _, granted, settled, refund = record
                leases.append((granted, settled))
                if refund:
                    tokens.append((settled, -float(refund)))

    # It really ran under contention: the burst and then the refill were used.
    assert len(requests) >= 250, len(requests)
    assert len(leases) == len(requests)
    assert max_window_excess(requests, 0.1 * REQUESTS_PER_MINUTE, REQUESTS_PER_MINUTE / 60) <= 1e-6
    assert max_window_excess(tokens, 0.1 * TOKENS_PER_MINUTE, TOKENS_PER_MINUTE / 60) <= 1e-6
    assert max_overlap(leases) <= CONCURRENCY
    independent = max_interval_excess(brackets, 0.1 * REQUESTS_PER_MINUTE, REQUESTS_PER_MINUTE / 60)
    assert independent <= 1e-6, independent
    longest = max(a - b for b, a in brackets)
    print(
        f"independent clock: longest try_reserve {longest * 1000:.1f} ms, "
        f"worst excess {independent:.3f} requests"
    )
    print(
        f"{len(requests)} grants; worst window excess: requests "
        f"{max_window_excess(requests, 0.1 * REQUESTS_PER_MINUTE, REQUESTS_PER_MINUTE / 60):.3f}, "
        f"tokens {max_window_excess(tokens, 0.1 * TOKENS_PER_MINUTE, TOKENS_PER_MINUTE / 60):.3f}; "
        f"max leases {max_overlap(leases)}"
    )
    per_day: dict[int, int] = defaultdict(int)
    for t, _ in requests:
        per_day[int(t // DAY)] += 1
    assert max(per_day.values()) <= REQUESTS_PER_DAY


def test_window_checkers_catch_violations() -> None:
    """The checkers above can fail: they see an excess and an overlap when there is one."""
    assert max_window_excess([(0.0, 5.0), (0.5, 5.0)], capacity=9, rate=1.0) == pytest.approx(0.5)
    assert max_window_excess([(0.0, 5.0), (2.0, 5.0)], capacity=9, rate=1.0) < 0
    # the refund at the same instant cancels the first grant: 9 at 0.1 exactly fills it
    assert max_window_excess([(0.0, 5.0), (0.0, -5.0), (0.1, 9.0)], capacity=9, rate=1.0) == 0
    # Independent intervals: 10 overlapping grants (all hold 0.09..0.1), capacity 5,
    # rate 1/s, M = 0.1: the window [0.09, 0.09] sees 10 > 5 + 1 × (0 + 2 × 0.1).
    burst = [(i * 0.01, i * 0.01 + 0.1) for i in range(10)]
    assert max_interval_excess(burst, capacity=5, rate=1.0) == pytest.approx(10 - 5 - 0.2)
    spread = [(float(i), i + 0.1) for i in range(10)]  # one a second: within rate 1/s
    assert max_interval_excess(spread, capacity=1, rate=1.0) <= 0
    assert max_overlap([(0, 2), (1, 3), (2, 4)]) == 2
    assert max_overlap([(0, 2), (1, 3), (1.5, 4)]) == 3
