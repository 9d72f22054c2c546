"""The window bound with local leases: what every process together grants in any window.

With ``local_lease_secs = L`` a unit is charged on the shared backend when it is borrowed
and granted in the process at most ``L`` later; a process that exits gives back only what
cannot have drained.  So, across any number of processes, the units granted in any window
of ``W`` seconds are at most ``capacity + rate × (W + L)`` (docs/admission.md, "Local
leases"); token refunds count when they are given back, those of the ``L`` seconds before
the window included.

* a seeded run on virtual time: a fleet of limiters sharing one MemoryBackend (each stands
  for a process), two tenants under a model-wide limit of requests and tokens, random
  costs, settles below the estimate (refunds into the leases and to the backend), and
  processes that exit (``close()``, giving their leases back) and start mid-run; every
  bucket's grants are checked in every window;
* the same bound on the real Redis: limiters (each its own backend and connections) in
  threads, every grant logged with the limiter's time and the caller's own clock.
"""

from __future__ import annotations

import bisect
import random
import threading
import time
from collections import defaultdict

import pytest

from rateloop.admission import LimitSpec
from rateloop.admission.backends import MemoryBackend
from rateloop.admission.limiter import Limiter
from rateloop.admission.reservation import Reservation
from rateloop.route import Cost, Route
from rateloop.testing import FakeClock
from test_admission_stress_redis import max_interval_excess, max_window_excess

LEASE = 0.1  # rate x L: a tenth of the model's capacity, less than a lease may hold
MODEL = "lease:m"
TENANTS = [Route(provider="lease", model="m", project="p", tenant=t) for t in ("a", "b")]
#: The model: 20 requests and 1,000 input tokens at once, refilled at 20 and 1,000 a second;
#: each tenant: 12 requests at once, 12 a second.
MODEL_SPEC = LimitSpec(
    requests_per_minute=1_200, input_tokens_per_minute=60_000, burst=1 / 60, profile="anthropic"
)
TENANT_SPEC = LimitSpec(requests_per_minute=720, burst=1 / 60)
LIMITS = {MODEL: MODEL_SPEC, **{r.scope: TENANT_SPEC for r in TENANTS}}


def excess_with_refunds(
    grants: list[tuple[float, float]],
    refunds: list[tuple[float, float]],
    capacity: float,
    rate: float,
    lease: float,
) -> float:
    """max over windows [a, b] of: units granted in it - refunds given back in [a - L, b]
    - (capacity + rate × (b - a + L)).  Windows start and end at grant instants."""
    grants = sorted(grants)
    times = [t for t, _ in grants]
    prefix = [0.0]
    for _, units in grants:
        prefix.append(prefix[-1] + units)
    refunds = sorted(refunds)
    back_times = [t for t, _ in refunds]
    back = [0.0]
    for _, units in refunds:
        back.append(back[-1] + units)
    worst = -float("inf")
    for i, a in enumerate(times):
        lo = back[bisect.bisect_left(back_times, a - lease)]
        for j in range(i, len(times)):
            b = times[j]
            if j + 1 < len(times) and times[j + 1] == b:
                continue  # a window holds every grant of its last instant
            given = back[bisect.bisect_right(back_times, b)] - lo
            units = prefix[j + 1] - prefix[i] - given
            worst = max(worst, units - capacity - rate * (b - a + lease))
    return worst


def _fleet_run(seed: int) -> tuple[dict[str, list[tuple[float, float]]], list[tuple[float, float]]]:
    """A seeded run: every grant per bucket ``(time, units)``, and the token refunds."""
    rng = random.Random(seed)
    clock = FakeClock()
    backend = MemoryBackend(clock, history=False)

    def start(i: int) -> Limiter:
        return Limiter(
            backend, limits=LIMITS, clock=clock, rng=random.Random(i), local_lease_secs=LEASE
        )

    fleet = [start(i) for i in range(5)]
    started = len(fleet)
    grants: dict[str, list[tuple[float, float]]] = defaultdict(list)
    refunds: list[tuple[float, float]] = []
    open_: list[tuple[float, int, Reservation, int]] = []  # (settle at, process, r, used)

    def settle_due(until: float, process: int | None = None) -> None:
        for item in [o for o in open_ if o[0] <= until or o[1] == process]:
            open_.remove(item)
            _, _, r, used = item
            r.settle(used, 0)
            refunds.append((clock.monotonic(), float(r.cost.input_tokens - used)))

    for _ in range(800):
        # Calls come in runs: a process calls for one tenant several times at one instant
        # (its leases grow as it uses them), ~35 calls a second in all (the model allows 20).
        # Each process calls mostly for one tenant: its leases of the other one linger.
        clock.advance(rng.expovariate(8.0))
        now = clock.monotonic()
        settle_due(now)
        if rng.random() < 0.05:  # a process exits (its calls settle first) and another starts
            i = rng.randrange(len(fleet))
            settle_due(now, process=i)
            fleet[i].close()
            fleet[i] = start(started)
            started += 1
        i = rng.randrange(len(fleet))
        route = TENANTS[i % 2] if rng.random() < 0.8 else TENANTS[1 - i % 2]
        for _ in range(rng.randint(1, 8)):
            cost = Cost(input_tokens=rng.choice((10, 40, 100, 250)))
            r = fleet[i].try_reserve(route, cost)
            if isinstance(r, Reservation):
                grants[MODEL + " requests"].append((now, 1.0))
                grants[MODEL + " tokens"].append((now, float(cost.input_tokens)))
                grants[route.scope].append((now, 1.0))
                used = rng.randint(cost.input_tokens // 4, cost.input_tokens)
                open_.append((now + rng.uniform(0.0, 0.6), i, r, used))
    return grants, refunds


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_fleet_with_leases_never_passes_capacity_plus_rate_times_w_plus_l(seed: int) -> None:
    grants, refunds = _fleet_run(seed)
    model_requests = grants[MODEL + " requests"]
    assert len(model_requests) > 500  # saturated: the model's 20/s for most of the run
    assert max_window_excess(model_requests, 20 + 20 * LEASE, 20) <= 1e-9
    for tenant in TENANTS:
        assert max_window_excess(grants[tenant.scope], 12 + 12 * LEASE, 12) <= 1e-9
    tokens = grants[MODEL + " tokens"][:1_500]  # O(n^2): the first half of the run
    assert excess_with_refunds(tokens, refunds, 1_000, 1_000, LEASE) <= 1e-6


# -- the real Redis ------------------------------------------------------------------------------

REDIS_ROUTE = Route(provider="lease", model="r", project="p")
REDIS_LIMITS = {"lease:r": LimitSpec(requests_per_minute=2_400, burst=1 / 60)}  # 40 at once, 40/s
PROCESSES, THREADS, SECONDS = 4, 4, 2.0


@pytest.mark.slow
def test_redis_limiters_with_leases_in_threads_never_pass_the_bound(
    redis_url: str, redis_prefix: str
) -> None:
    limiters = [
        Limiter.from_url(
            redis_url, prefix=redis_prefix, limits=REDIS_LIMITS, local_lease_secs=LEASE
        )
        for _ in range(PROCESSES)
    ]
    logs: list[list[tuple[float, float, float]]] = [[] for _ in range(PROCESSES * THREADS)]
    end = time.monotonic() + SECONDS
    barrier = threading.Barrier(PROCESSES * THREADS)

    def caller(limiter: Limiter, out: list[tuple[float, float, float]]) -> None:
        barrier.wait()
        while time.monotonic() < end:
            before = time.time()  # the caller's own clock, independent of the limiter
            r = limiter.try_reserve(REDIS_ROUTE, Cost())
            after = time.time()
            if isinstance(r, Reservation):
                out.append((r.granted_at, before, after))
            else:
                time.sleep(min(r.retry_after, 0.005))

    threads = [
        threading.Thread(target=caller, args=(limiters[k // THREADS], logs[k]))
        for k in range(PROCESSES * THREADS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for limiter in limiters:
        limiter.close()
    granted = [g for log in logs for g in log]
    assert len(granted) >= 80  # the burst and then the refill were used
    # On the limiter's own (Redis) times: a leased grant's is never later than the backend's
    # now, never earlier than its borrow, so grants are within L after their charge.
    assert max_window_excess([(t, 1.0) for t, _, _ in granted], 40 + 40 * LEASE, 40) <= 1e-6
    # On the callers' clocks, independent of the limiter.
    brackets = [(before, after) for _, before, after in granted]
    assert max_interval_excess(brackets, 40 + 40 * LEASE, 40) <= 1e-6
