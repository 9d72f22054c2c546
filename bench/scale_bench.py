"""Shared admission at scale: many processes x threads, paced, on one Redis and on a Redis Cluster.

Usage::

    python bench/scale_bench.py [--processes 8] [--threads 16] [--rates 10000]
        [--seconds 8] [--models 24] [--tenants 20] [--per-second 10] [--lease-secs 1]
        [--affinity] [--redis redis://127.0.0.1:6379/0] [--no-cluster]
        [--cases rateloop,rateloop-leases,limits-moving,limits-sliding,ping,local]
        [--json out.json]

``processes`` x ``threads`` callers offer ``rate`` decisions per second in all,
paced open-loop: each thread has its own schedule (``threads x processes /
rate`` apart, staggered) and, when it falls behind, calls at once to catch up.
Every decision is for one of ``models x tenants`` tenant scopes, picked at
random (with ``--affinity``, each process only among the scopes routed to it:
index mod processes, as an application that routes each tenant to one worker);
the models are the keys' hash tags, so on the cluster the scopes spread over the
shards.  Each tenant scope allows ``per-second`` requests a second (10 by
default; offered at 10k/s: about twice that), so about half the decisions are
denials:

* **rateloop**: ``LimitSpec(requests_per_minute=600, burst=1/60)`` on each
  tenant scope -- a bucket of 10 refilled at 10/s; ``try_reserve`` on a route
  in three scopes (model, project, tenant: the two without limits are still read
  for a pause).  Its bound in any window of ``W`` seconds: ``10 + 10 W`` grants
  (docs/admission.md, "The bound"), checked on the Redis ``TIME`` each grant
  was decided at (``Reservation.granted_at``).
* **rateloop-leases**: the same limiter with local leases (``local_lease_secs``,
  ``--lease-secs``): most decisions are taken in the process, from capacity
  borrowed in slices or a denial remembered.  Its bound is ``10 + 10 (W + L)``
  (docs/admission.md, "Local leases"), checked on the limiter's times (a leased
  grant's is the Redis time of its borrow plus the time since, never later than
  Redis's); the windows over the plain ``10 + 10 W`` are reported beside it.
* **limits-moving** / **limits-sliding**: `limits`' ``MovingWindowRateLimiter``
  / ``SlidingWindowCounterRateLimiter`` with ``10 per second`` per tenant key
  (one ``hit`` a decision), on its ``redis://`` and ``redis+cluster://``
  storages.  Checked against the moving window's definition: at most 10 grants
  in any 1 s window, on each worker's clock around the call (``[before,
  after]``): a window is counted as over only when 11 grants' whole intervals
  fit in one second (a certain excess; the moving window takes its timestamp
  inside that interval).
* **ping**: a Redis ``PING`` per decision through redis-py, on the same
  pacing: the floor of a round trip from these processes on this machine.
* **local**: each process its own ``memory://`` limiter with the same limits
  -- no shared limit, so its grants are not checked: the floor of a decision
  that needs no round trip (what one served from a local lease would cost).

Reported per case (``over``: scopes with a window over the case's bound; ``>W``: for
rateloop's cases, scopes with a window over ``capacity + rate x W``, which leases may
pass by up to ``rate x L``): decisions achieved per second, latency per decision
(``perf_counter`` around the call) p50 / p99 / p99.9 / max, the lateness of
the answer against the schedule (p99: what an open-loop caller waits, queueing
in the client included), the grants, and the over-admission check.  Server
side: ``INFO commandstats`` deltas (the script's or command's µs per call in
Redis) and the slow log's entries during the case.  The shared Redis serves
other work at the same time: its server-side figures include that traffic.
Every key is under a fresh prefix and deleted at the end; the cluster's three
``redis-server`` processes run in a temp dir and are stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from redis.cluster import RedisCluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _redis_server import redis_cluster
from rateloop.admission.limiter import Limiter
from rateloop.admission.reservation import Reservation
from rateloop.admission.spec import LimitSpec
from rateloop.route import Cost, Route
from test_admission_stress_redis import max_window_excess

PER_SECOND = 10  # each tenant scope: 10 requests a second (--per-second)
CASES = ("rateloop", "rateloop-leases", "limits-moving", "limits-sliding", "ping", "local")
COST = Cost()

Decide = Callable[[int], tuple[bool, float]]  # scope index -> (granted, decision time)


def scope_names(models: int, tenants: int) -> list[tuple[str, str]]:
    """(model, tenant) of every scope; model names hash to many slots."""
    return [(f"m{m}", f"t{t}") for m in range(models) for t in range(tenants)]


def spec_of(per_second: int) -> LimitSpec:
    """A tenant scope's limits: ``per_second`` at once, refilled at ``per_second`` a second."""
    return LimitSpec(requests_per_minute=per_second * 60, burst=1 / 60)


def make_decide(
    case: str,
    url: str,
    prefix: str,
    scopes: list[tuple[str, str]],
    per_second: int = PER_SECOND,
    lease_secs: float = 1.0,
) -> Decide:
    """One process's decision function for ``case`` (thread-safe, shared by its threads)."""
    spec = spec_of(per_second)
    if case in ("rateloop", "rateloop-leases"):
        routes = [Route(provider="scale", model=m, project="p", tenant=t) for m, t in scopes]
        limiter = Limiter.from_url(
            url,
            prefix=prefix,
            limits={r.scope: spec for r in routes},
            history=True,
            local_lease_secs=lease_secs if case == "rateloop-leases" else None,
        )

        def rateloop(i: int) -> tuple[bool, float]:
            r = limiter.try_reserve(routes[i], COST)
            if isinstance(r, Reservation):
                return True, r.granted_at
            return False, 0.0

        return rateloop
    if case.startswith("limits-"):
        from limits import RateLimitItemPerSecond, storage, strategies

        store = storage.storage_from_string(url, key_prefix=f"{prefix}lim")
        kind = (
            strategies.MovingWindowRateLimiter
            if case == "limits-moving"
            else strategies.SlidingWindowCounterRateLimiter
        )
        limiter_ = kind(store)
        item = RateLimitItemPerSecond(per_second)
        keys = [f"{m}:{t}" for m, t in scopes]

        def limits_hit(i: int) -> tuple[bool, float]:
            return bool(limiter_.hit(item, keys[i])), 0.0

        return limits_hit
    if case == "local":
        # Each process its own memory:// limiter: not a fleet-wide limit (so no grants are
        # checked), the floor of what a decision served from a local lease would cost.
        routes_ = [Route(provider="scale", model=m, project="p", tenant=t) for m, t in scopes]
        local = Limiter.from_url("memory://", limits={r.scope: spec for r in routes_})

        def in_process(i: int) -> tuple[bool, float]:
            local.try_reserve(routes_[i], COST)
            return False, 0.0

        return in_process
    if case == "ping":
        client: Any = (
            RedisCluster.from_url(url.replace("+cluster", ""))
            if "+cluster" in url
            else redis.Redis.from_url(url)
        )

        def ping(i: int) -> tuple[bool, float]:
            client.ping()
            return False, 0.0

        return ping
    raise ValueError(f"unknown case {case!r}; choose from {', '.join(CASES)}")


def caller(
    decide: Decide,
    mine: list[int],
    first: float,
    interval: float,
    end: float,
    seed: int,
    out: dict[str, list[Any]],
) -> None:
    """One thread: a decision at each of its scheduled instants (at once when behind)."""
    rng = random.Random(seed)
    lat, late, grants = out["lat"], out["late"], out["grants"]
    at = first
    while at < end:
        now = time.time()
        if at > now:
            time.sleep(at - now)  # pacing the offered load: the bench runs on real time
        i = mine[rng.randrange(len(mine))]
        before = time.time()
        t0 = time.perf_counter()
        ok, decided = decide(i)
        t1 = time.perf_counter()
        after = time.time()
        lat.append(t1 - t0)
        late.append(after - at)
        if ok:
            grants.append((i, decided, before, after))
        at += interval


def worker(
    case: str,
    url: str,
    prefix: str,
    models: int,
    tenants: int,
    threads: int,
    index: int,
    interval: float,
    seconds: float,
    ready: Any,
    start: Any,
    t0: Any,
    log: str,
    per_second: int = PER_SECOND,
    lease_secs: float = 1.0,
    affinity: bool = False,
) -> None:
    """One process: ``threads`` callers sharing one limiter; results to ``log`` (JSON).

    ``affinity``: this process decides only the scopes ``i`` with ``i % processes ==
    index`` (each tenant routed to one process); else any scope."""
    scopes = scope_names(models, tenants)
    decide = make_decide(case, url, prefix, [*scopes, ("warm", "warm")], per_second, lease_secs)
    warm = len(scopes)  # a scope outside the checked ones: connections, scripts, caches

    def warm_up() -> None:
        for _ in range(3):
            decide(warm)

    pool = [threading.Thread(target=warm_up) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    ready.wait()
    start.wait()
    begin = t0.value
    outs = [{"lat": [], "late": [], "grants": []} for _ in range(threads)]
    processes = int(os.environ.get("SCALE_PROCESSES", "1"))
    nthreads_all = threads * processes
    mine = [i for i in range(len(scopes)) if not affinity or i % processes == index]
    pool = [
        threading.Thread(
            target=caller,
            args=(
                decide,
                mine,
                begin + interval * (index * threads + k) / nthreads_all,
                interval,
                begin + seconds,
                index * 1000 + k,
                outs[k],
            ),
        )
        for k in range(threads)
    ]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    merged: dict[str, Any] = {
        name: [x for o in outs for x in o[name]] for name in ("lat", "late", "grants")
    }
    merged["begin"], merged["end"] = begin, time.time()
    Path(log).write_text(json.dumps(merged))


def run_case(
    case: str, url: str, prefix: str, args: argparse.Namespace, rate: float, workdir: str
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    ready = ctx.Barrier(args.processes + 1)
    start = ctx.Event()
    t0 = ctx.Value("d", 0.0)
    interval = args.processes * args.threads / rate  # each thread's spacing
    logs = [os.path.join(workdir, f"{case}-{i}.json") for i in range(args.processes)]
    os.environ["SCALE_PROCESSES"] = str(args.processes)
    procs = [
        ctx.Process(
            target=worker,
            args=(
                case,
                url,
                prefix,
                args.models,
                args.tenants,
                args.threads,
                i,
                interval,
                args.seconds,
                ready,
                start,
                t0,
                logs[i],
                args.per_second,
                args.lease_secs,
                args.affinity,
            ),
        )
        for i in range(args.processes)
    ]
    for p in procs:
        p.start()
    try:
        ready.wait(timeout=120)
        servers = server_stats(url)
        t0.value = time.time() + 0.3
        start.set()
        for p in procs:
            p.join(timeout=args.seconds + 120)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
    after = server_stats(url)
    results = [json.loads(Path(log).read_text()) for log in logs]
    lat = sorted(x for r in results for x in r["lat"])
    late = sorted(x for r in results for x in r["late"])
    grants = [tuple(g) for r in results for g in r["grants"]]
    out: dict[str, Any] = {
        "case": case,
        "url": url,
        "offered": rate,
        "decisions": len(lat),
        # over the time the decisions really took: callers behind schedule run past the end
        "achieved": len(lat) / (max(r["end"] for r in results) - results[0]["begin"]),
        "grants": len(grants),
        "p50_ms": pct(lat, 50) * 1e3,
        "p99_ms": pct(lat, 99) * 1e3,
        "p999_ms": pct(lat, 99.9) * 1e3,
        "max_ms": lat[-1] * 1e3 if lat else 0.0,
        "late_p50_ms": pct(late, 50) * 1e3,
        "late_p99_ms": pct(late, 99) * 1e3,
        "server": server_delta(servers, after),
    }
    out.update(over_admission(case, grants, args.per_second, args.lease_secs))
    return out


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return 0.0
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]


def over_admission(
    case: str, grants: list[tuple[Any, ...]], per_second: int = PER_SECOND, lease: float = 0.0
) -> dict[str, Any]:
    """The over-admission check of every scope's grants (see the module's docstring)."""
    by_scope: dict[int, list[tuple[float, float, float]]] = defaultdict(list)
    for i, decided, before, after in grants:
        by_scope[int(i)].append((decided, before, after))
    if case.startswith("rateloop"):
        # On the limiter's own (server) times: capacity + rate x window, every window; with
        # leases, capacity + rate x (window + L).
        held = lease if case == "rateloop-leases" else 0.0
        cap = per_second * (1 + held)
        excess = [
            max_window_excess([(d, 1.0) for d, _, _ in gs], cap, per_second)
            for gs in by_scope.values()
        ]
        plain = [
            max_window_excess([(d, 1.0) for d, _, _ in gs], per_second, per_second)
            for gs in by_scope.values()
        ]
        worst = max(excess, default=-float("inf"))
        over = sum(1 for e in excess if e > 1e-9)
        word = f"{per_second:g} + {per_second:g} (W + {held:g})" if held else (
            f"{per_second:g} + {per_second:g} W"
        )
        return {
            "check": f"{word} in every window (server times)",
            "scopes_over": over,
            "worst_excess": worst,
            "scopes_over_plain": sum(1 for e in plain if e > 1e-9),
            "worst_excess_plain": max(plain, default=-float("inf")),
        }
    if case.startswith("limits"):
        over = 0
        worst = 0
        for gs in by_scope.values():
            most = certain_max_in_window([(b, a) for _, b, a in gs], 1.0)
            worst = max(worst, most - per_second)
            over += most > per_second
        return {
            "check": f"<= {per_second} in any 1 s (certain, client clocks)",
            "scopes_over": over,
            "worst_excess": worst,
        }
    return {"check": "-", "scopes_over": 0, "worst_excess": 0}


def certain_max_in_window(intervals: list[tuple[float, float]], width: float) -> int:
    """The most grants whose whole ``[before, after]`` fits in one window of ``width`` s."""
    spans = sorted(intervals)
    most = 0
    for i, (start, _) in enumerate(spans):
        count = 0
        for b, a in spans[i:]:
            if b >= start + width:
                break
            count += a < start + width
        most = max(most, count)
    return most


def nodes_of(url: str) -> list[redis.Redis]:
    if "+cluster" in url:
        cluster = RedisCluster.from_url(url.replace("+cluster", ""))
        nodes = [redis.Redis(host=n.host, port=n.port) for n in cluster.get_primaries()]
        cluster.close()
        return nodes
    return [redis.Redis.from_url(url)]


def server_stats(url: str) -> dict[str, Any]:
    stats: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    slow = 0
    for node in nodes_of(url):
        for name, v in node.info("commandstats").items():
            stats[name][0] += int(v["calls"])
            stats[name][1] += int(v["usec"])
        slow += len(node.slowlog_get(128))
        node.close()
    return {"commands": dict(stats), "slowlog": slow, "at": time.time()}


def server_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, (calls, usec) in after["commands"].items():
        c0, u0 = before["commands"].get(name, (0, 0))
        if calls - c0 > 100:
            out[name.removeprefix("cmdstat_")] = {
                "calls": calls - c0,
                "us_per_call": round((usec - u0) / (calls - c0), 2),
            }
    return {"commands": out, "slowlog_new": after["slowlog"] - before["slowlog"]}


def cleanup(url: str, prefix: str) -> int:
    deleted = 0
    for node in nodes_of(url):
        keys = list(node.scan_iter(match=f"{prefix}*", count=1000))
        for k in range(0, len(keys), 500):
            for key in keys[k : k + 500]:  # one by one: keys of a cluster node span slots
                deleted += int(node.delete(key))
        node.close()
    return deleted


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--rates", default="10000", help="offered decisions/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--models", type=int, default=24)
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument(
        "--per-second", type=int, default=PER_SECOND, help="each tenant scope's limit per second"
    )
    parser.add_argument(
        "--lease-secs", type=float, default=1.0, help="rateloop-leases: local_lease_secs"
    )
    parser.add_argument(
        "--affinity",
        action="store_true",
        help="route each tenant scope to one process (scope index mod processes)",
    )
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--no-cluster", action="store_true", help="only the single Redis")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in CASES]
    if bad:
        parser.error(f"--cases: unknown {bad}; choose from {', '.join(CASES)}")
    rates = [float(r) for r in args.rates.split(",")]
    if any(r <= 0 for r in rates):
        parser.error(f"--rates must be positive, got {args.rates!r}")
    prefix = f"rateloop-scale:{uuid.uuid4().hex[:8]}:"
    print(f"load before: {load()}  ({os.cpu_count()} CPUs)", flush=True)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rateloop-scale-") as workdir:
        targets = [("redis", args.redis)]
        try:
            for rate in rates:
                for case in cases:
                    results.append(run_case(case, args.redis, prefix, args, rate, workdir))
                    results[-1]["target"] = "redis"
                    report(results[-1])
        finally:
            print(f"deleted {cleanup(args.redis, prefix)} keys on {args.redis}", flush=True)
        if not args.no_cluster:
            with redis_cluster(3) as ports:
                url = f"redis+cluster://127.0.0.1:{ports[0]}"
                targets.append(("cluster", url))
                for rate in rates:
                    for case in (c for c in cases if c != "local"):  # local: no Redis at all
                        results.append(run_case(case, url, prefix, args, rate, workdir))
                        results[-1]["target"] = "cluster x3"
                        report(results[-1])
    print(f"load after: {load()}")
    print()
    print(
        f"{'target':10} {'case':15} {'offered':>7} {'achieved':>8} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'p99.9 ms':>8} {'late p99':>8} {'grants':>7} {'over':>5} {'>W':>4} {'trips':>6}"
        f"  server µs/call"
    )
    for r in results:
        cmds = ", ".join(
            f"{n} {v['us_per_call']}"
            for n, v in r["server"]["commands"].items()
            if n in ("evalsha", "eval", "ping", "lpush", "get", "incrby")
        )
        print(
            f"{r['target']:10} {r['case']:15} {r['offered']:>7.0f} {r['achieved']:>8.0f} "
            f"{r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} {r['p999_ms']:>8.2f} "
            f"{r['late_p99_ms']:>8.2f} {r['grants']:>7} {r['scopes_over']:>5} "
            f"{r.get('scopes_over_plain', '-')!s:>4} {trips(r):>6}  {cmds}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


def trips(r: dict[str, Any]) -> str:
    """Round trips to Redis per decision (scripts and PINGs, background ones included;
    the server's counts, other traffic on a shared Redis included)."""
    calls = sum(
        v["calls"]
        for n, v in r["server"]["commands"].items()
        if n in ("evalsha", "eval", "ping")
    )
    return f"{100 * calls / max(1, r['decisions']):.1f}%" if calls else "-"


def report(r: dict[str, Any]) -> None:
    print(json.dumps({k: v for k, v in r.items() if k != "url"}), flush=True)


if __name__ == "__main__":
    main()
