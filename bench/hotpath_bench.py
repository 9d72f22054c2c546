"""The hot path: one call that succeeds at once, through rateloop and its peers.

Five cases, each a plain function returning a value on the first try:

* ``bare``            -- the function itself, no wrapper (the floor);
* ``rateloop``        -- ``RateLoop(Policy()).call`` without a limiter;
* ``rateloop_memory`` -- the same with a memory :class:`Limiter` holding a limit on
  the route (its per-minute history on, the default);
* ``tenacity``        -- ``@retry`` with a stop and a random exponential wait;
* ``stamina``         -- ``@stamina.retry(on=Exception, attempts=6)``.

Three modes::

    python bench/hotpath_bench.py --timeit [--calls 20000] [--rounds 9]
    python bench/hotpath_bench.py --callgrind [--calls 2000]
    python bench/hotpath_bench.py --profile rateloop_memory [--calls 50000]

``--timeit`` runs every case in one process, interleaved round by round (the
order rotates each round), so that the machine's other load falls on all of
them alike; it prints the median microseconds per call and the spread, and
each case's ratio to tenacity.

``--callgrind`` counts instructions, which other load does not change: each
case runs twice under ``valgrind --tool=callgrind`` (``N`` and ``2N`` calls
after the same warm-up), and the difference of the two totals over ``N`` is
the instructions (``Ir``) of one call, start-up and imports cancelled out.

``--profile CASE`` prints cProfile's top functions for one case, by own time,
per call (cProfile's overhead inflates every figure; read the ranking).

Put a source tree first with ``PYTHONPATH=src`` (a work tree) to measure it.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

CASES = ("bare", "rateloop", "rateloop_memory", "tenacity", "stamina")
WARMUP = 200


def _value(route: object) -> str:
    return "ok"


def build(case: str) -> Callable[[], Any]:
    """A no-argument callable making one call of ``case``."""
    if case == "bare":
        from rateloop import Route

        route = Route(provider="openai", model="gpt-5", project="bench")
        return lambda: _value(route)
    if case in ("rateloop", "rateloop_memory"):
        from rateloop import LimitSpec, Policy, RateLoop, Route
        from rateloop.admission.limiter import Limiter

        route = Route(provider="openai", model="gpt-5", project="bench")
        limiter = None
        if case == "rateloop_memory":
            limits = {
                route.scope: LimitSpec(
                    requests_per_minute=10_000_000, input_tokens_per_minute=10_000_000_000
                )
            }
            limiter = Limiter(limits=limits)
        loop = RateLoop(Policy(), limiter=limiter, sinks=[])
        call = loop.call
        return lambda: call(_value, route=route)
    if case == "tenacity":
        import tenacity

        @tenacity.retry(
            stop=tenacity.stop_after_attempt(6),
            wait=tenacity.wait_random_exponential(min=1, max=60),
            reraise=True,
        )
        def with_tenacity() -> str:
            return _value(None)

        return with_tenacity
    if case == "stamina":
        import stamina

        @stamina.retry(on=Exception, attempts=6)
        def with_stamina() -> str:
            return _value(None)

        return with_stamina
    raise SystemExit(f"unknown case {case!r}; allowed: {', '.join(CASES)}")


def _run(fn: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def timeit(cases: list[str], calls: int, rounds: int) -> None:
    fns = {case: build(case) for case in cases}
    for fn in fns.values():
        _run(fn, WARMUP)
    samples: dict[str, list[float]] = {case: [] for case in cases}
    for r in range(rounds):
        order = cases[r % len(cases) :] + cases[: r % len(cases)]
        for case in order:
            samples[case].append(_run(fns[case], calls) * 1e6)
    base = statistics.median(samples["tenacity"]) if "tenacity" in samples else None
    print(f"{'case':18} {'median µs':>10} {'min..max':>16} {'÷ tenacity':>11}")
    for case in cases:
        s = samples[case]
        med = statistics.median(s)
        ratio = f"{med / base:.2f}" if base else "-"
        print(f"{case:18} {med:10.2f} {min(s):7.2f}..{max(s):<7.2f} {ratio:>11}")
    print(f"({calls} calls x {rounds} rounds, interleaved; load {os.getloadavg()[0]:.1f})")


def _child(case: str, calls: int) -> None:
    fn = build(case)
    _run(fn, WARMUP)
    _run(fn, calls)


def _ir(case: str, calls: int, tmp: str) -> int:
    out = os.path.join(tmp, f"cg.{case}.{calls}")
    cmd = [
        "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
        sys.executable, os.path.abspath(__file__), "--child", case, "--calls", str(calls),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=900)
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or found is None:
        raise SystemExit(f"callgrind failed for {case}:\n{proc.stderr[-2000:]}")
    return int(found.group(1))


def callgrind(cases: list[str], calls: int) -> None:
    irs: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            irs[case] = (_ir(case, 2 * calls, tmp) - _ir(case, calls, tmp)) / calls
    base = irs.get("tenacity")
    print(f"{'case':18} {'Ir per call':>12} {'÷ tenacity':>11}")
    for case in cases:
        ratio = f"{irs[case] / base:.2f}" if base else "-"
        print(f"{case:18} {irs[case]:12,.0f} {ratio:>11}")
    print(f"(callgrind, ({2 * calls} - {calls} calls) / {calls}, after {WARMUP} warm-up calls)")


def profile(case: str, calls: int, top: int) -> None:
    fn = build(case)
    _run(fn, WARMUP)
    prof = cProfile.Profile()
    prof.enable()
    _run(fn, calls)
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("tottime").print_stats(top)
    total = sum(v[2] for v in stats.stats.values())  # type: ignore[attr-defined]
    ncalls = sum(v[1] for v in stats.stats.values())  # type: ignore[attr-defined]
    print(f"{case}: {ncalls / calls:.0f} function calls per call, "
          f"{total / calls * 1e6:.1f} µs per call under cProfile")  # fmt: skip
    print(buf.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--timeit", action="store_true")
    mode.add_argument("--callgrind", action="store_true")
    mode.add_argument("--profile", metavar="CASE")
    mode.add_argument("--child", metavar="CASE", help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    for case in cases:
        if case not in CASES:
            parser.error(f"unknown case {case!r}; allowed: {', '.join(CASES)}")
    if args.child:
        _child(args.child, args.calls)
    elif args.timeit:
        timeit(cases, args.calls or 20_000, args.rounds)
    elif args.callgrind:
        callgrind(cases, args.calls or 2_000)
    else:
        profile(args.profile, args.calls or 50_000, args.top)


if __name__ == "__main__":
    main()
