"""The hot-path cost of each scope's per-minute history, and its size in Redis.

Runs ``RateLoop.call`` (a first-try success, settled from its usage) with
the history on and off, for the memory limiter and the Redis limiter, in one
process and one run, interleaved round by round so that drift and noise
fall on both sides alike; prints the median per-call time of each, and the
overhead.  Then measures what a scope's history takes in Redis: a minute
written by real admissions, settles, a pause and the loop's events
(``MEMORY USAGE``), times the 1,440 minutes kept.

    python bench/history_bench.py [--calls 2000] [--rounds 7] [--redis redis://127.0.0.1:6379/0]

The Redis runs need a reachable Redis (their keys, under a random prefix, are
deleted afterwards).  The machine's other load shows in the numbers: compare
the on/off pairs, not the absolute times, and rerun when they disagree.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import httpx

from rateloop import LimitSpec, Policy, RateLoop, Route
from rateloop.admission.history import HISTORY_MINUTES
from rateloop.admission.limiter import Limiter

ROUTE = Route(provider="openai", model="gpt-5", project="bench")
LIMITS = {
    ROUTE.scope: LimitSpec(
        requests_per_minute=10_000_000, input_tokens_per_minute=10_000_000_000,
        requests_per_day=1_000_000_000,
    )
}  # fmt: skip
REQUEST = httpx.Request("POST", "https://api.openai.com/v1/chat/completions")
RESPONSE = httpx.Response(200, json={"usage": {"prompt_tokens": 12}}, request=REQUEST)


def _call(route: Route) -> httpx.Response:
    return RESPONSE


def _loop(url: str, prefix: str, history: bool) -> tuple[RateLoop, Limiter]:
    limiter = Limiter.from_url(url, prefix=prefix, limits=LIMITS, history=history)
    return RateLoop(Policy(), limiter=limiter), limiter


def _per_call(loop: RateLoop, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        loop.call(_call, route=ROUTE)
    return (time.perf_counter() - start) / calls


def run(cases: dict[str, RateLoop], calls: int, rounds: int) -> dict[str, float]:
    """Median seconds per call of each case, the cases interleaved within each round."""
    for loop in cases.values():  # warm up: scripts loaded, plans cached
        _per_call(loop, min(200, calls))
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for r in range(rounds):
        order = list(cases) if r % 2 == 0 else list(reversed(cases))
        for name in order:
            samples[name].append(_per_call(cases[name], calls))
    return {name: statistics.median(v) for name, v in samples.items()}


def redis_size(url: str) -> tuple[int, int]:
    """(bytes of one busy minute of a scope's history in Redis, the fields it holds)."""
    import redis

    from rateloop.admission.backends.keys import history_key
    from rateloop.observe.redis_events import RedisEventSink
    from rateloop.testing import FaultScript

    prefix = f"rateloop-bench:{uuid.uuid4().hex[:8]}:"
    client = redis.Redis.from_url(url, decode_responses=True)
    limits = {ROUTE.scope: LimitSpec(requests_per_minute=6000, input_tokens_per_minute=6_000_000,
                                     requests_per_day=100_000, concurrency=8)}  # fmt: skip
    limiter = Limiter.from_url(url, prefix=prefix, limits=limits)
    sink = RedisEventSink(url, prefix=prefix)
    loop = RateLoop(Policy.from_dict({"backoff": {"jitter": "none"}}), limiter=limiter,
                    sinks=[sink])  # fmt: skip
    try:
        resp = httpx.Response(429, headers={"retry-after": "0.01"}, request=REQUEST)
        refused = httpx.HTTPStatusError("429", request=REQUEST, response=resp)
        for _ in range(50):
            loop.call(_call, route=ROUTE)
        loop.call(FaultScript([refused, RESPONSE]), route=ROUTE)
        seconds, _ = client.time()
        minute = int(seconds) // 60
        keys = [history_key(prefix, ROUTE.scope, m) for m in (minute - 1, minute)]
        key = max(keys, key=client.hlen)
        return int(client.memory_usage(key) or 0), int(client.hlen(key))
    finally:
        sink.close()
        limiter.close()
        for k in client.scan_iter(match=f"{prefix}*"):
            client.delete(k)
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per case per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    prefix = f"rateloop-bench:{uuid.uuid4().hex[:8]}:"
    made: list[Limiter] = []

    def case(url: str, history: bool) -> RateLoop:
        loop, limiter = _loop(url, prefix, history)
        made.append(limiter)
        return loop

    cases: dict[str, Callable[[], RateLoop]] = {
        "memory, history off": lambda: case("memory://", False),
        "memory, history on": lambda: case("memory://", True),
        "redis, history off": lambda: case(args.redis, False),
        "redis, history on": lambda: case(args.redis, True),
    }
    built = {name: make() for name, make in cases.items()}
    try:
        medians = run(built, args.calls, args.rounds)
        size, fields = redis_size(args.redis)
    finally:
        for limiter in made:
            limiter.close()
        import redis

        client = redis.Redis.from_url(args.redis)
        for k in client.scan_iter(match=f"{prefix}*"):
            client.delete(k)
        client.close()
    print(f"$ python bench/history_bench.py --calls {args.calls} --rounds {args.rounds}")
    print(f"{'case':<22} {'µs/call':>9} {'overhead':>10}")
    for backend in ("memory", "redis"):
        off, on = medians[f"{backend}, history off"], medians[f"{backend}, history on"]
        print(f"{backend + ', history off':<22} {off * 1e6:>9.1f}")
        print(f"{backend + ', history on':<22} {on * 1e6:>9.1f} "
              f"{(on - off) * 1e6:>+7.1f} µs ({(on / off - 1) * 100:+.1f}%)")  # fmt: skip
    print(f"redis: one busy minute of a scope = {size} bytes ({fields} fields, MEMORY USAGE); "
          f"a full day = {HISTORY_MINUTES} x {size} = {HISTORY_MINUTES * size / 1024:.0f} KiB "
          f"per scope, at most")  # fmt: skip


if __name__ == "__main__":
    main()
