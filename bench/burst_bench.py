"""The provider's whole burst (issue 26, goal 1): a fleet against an independent provider.

The provider is ``_bucket_provider.py`` -- written from OpenAI's documented
behaviour, sharing no code with rateloop's FakeProvider: continuous request
and token buckets holding ``--burst`` seconds of their rates, a refused
request still spending its slot, ``x-ratelimit-*`` headers in OpenAI's format
on every answer.  The fleet and its clients are ``fleet_bench.py``'s (the
same tasks, 30 at once, in 1 or N processes started before the clock), with a
token-heavier workload so that the tokens bucket binds: ~1,000 prompt tokens
and ~450 ``max_tokens`` a call.

* ``short``: 60 tasks × 4 calls -- the provider's 2 s burst is an eighth of
  the ~16 s ideal, so a burst left unused shows;
* ``long``: 60 tasks × 20 calls (1,200 calls, ~86 s ideal).

Efficiency = the quota-bound ideal (each bucket's total charge beyond its
burst at its rate, the larger of the two, plus one answer's latency) ÷ wall
time × the share of tasks completed; 429/ok = refusals the provider counted
per successful call.

    python bench/burst_bench.py --workload short,long --processes 1,4 \\
        --strategies rateloop,rateloop-zero,litellm --repeat 3
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bucket_provider import BucketProviderProcess
from fleet_bench import HEADER, add_fleet_arguments, format_row, run_processes

WORKLOADS = {"short": {"tasks": 60, "calls": 4}, "long": {"tasks": 60, "calls": 20}}
STRATEGIES = ("rateloop", "rateloop-zero", "rateloop-burst", "litellm", "litellm-retries",
              "tenacity")


def make_calls(tasks: int, calls: int, seed: int) -> list[list[tuple[int, int, int]]]:
    """Per task, its calls as (prompt tokens, max_tokens, output tokens)."""
    rng = random.Random(seed)
    return [
        [
            (
                max(50, round(rng.lognormvariate(6.9, 0.3))),  # ~1,000 prompt tokens
                cap := max(32, round(rng.lognormvariate(6.1, 0.3))),  # ~450 max_tokens
                max(1, round(cap * 0.6)),
            )
            for _ in range(calls)
        ]
        for _ in range(tasks)
    ]


def ideal_seconds(calls: list[list[tuple[int, int, int]]], cfg: dict[str, Any]) -> float:
    n = sum(len(t) for t in calls)
    tokens = sum(i + c for t in calls for i, c, _ in t)
    rps, tps = cfg["rpm"] / 60, cfg["tpm"] / 60
    bound = max((n - rps * cfg["burst"]) / rps, (tokens - tps * cfg["burst"]) / tps, 0.0)
    return bound + cfg["latency"]


def run(strategy: str, processes: int, workload: str, cfg: dict[str, Any]) -> dict[str, Any]:
    shape = WORKLOADS[workload]
    calls = make_calls(shape["tasks"], shape["calls"], cfg["seed"])
    cfg = {**cfg, "prefix": f"rateloop-burst:{uuid.uuid4().hex[:8]}:"}
    with BucketProviderProcess(rpm=cfg["rpm"], tpm=cfg["tpm"], burst=cfg["burst"],
                               latency=cfg["latency"],
                               retry_after=cfg["retry_after"]) as provider:
        try:
            done = run_processes(strategy, processes, calls, cfg, provider.url, provider.reset)
        finally:
            _drop_keys(cfg)
        stats = provider.stats()
        trace = provider.trace() if cfg.get("trace") else []
    wall = max(t for t, _ in done)
    completed = sum(ok for _, ok in done)
    ideal = ideal_seconds(calls, cfg)
    served = stats["served"]
    return {
        "strategy": strategy, "processes": processes, "workload": workload,
        "tasks": len(calls), "completed": completed, "wall_secs": round(wall, 2),
        "ideal_secs": round(ideal, 2),
        "efficiency": round(min(1.0, completed / len(calls) * ideal / wall), 3),
        "429_per_success": round(stats["refused"] / served, 3) if served else None,
        "served": served, "refused": stats["refused"],
        "refused_by": {k[8:]: v for k, v in stats.items() if k.startswith("refused_") and v},
        **({"trace": trace} if trace else {}),
    }


def _drop_keys(cfg: dict[str, Any]) -> None:
    try:
        import redis
    except ImportError:
        return
    client = redis.Redis.from_url(cfg["redis"])
    try:
        keys = list(client.scan_iter(match=cfg["prefix"] + "*", count=1000))
        if keys:
            client.delete(*keys)
    except redis.RedisError:
        pass
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="short", help="short, long or both (short,long)")
    parser.add_argument("--strategies", default="rateloop,rateloop-zero,litellm",
                        help=f"comma-separated, of {', '.join(STRATEGIES)}")
    add_fleet_arguments(parser)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each case, interleaved")
    parser.add_argument("--retry-after", action="store_true",
                        help="429s also carry a retry-after header (whole seconds)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--trace", action="store_true",
                        help="keep the provider's decisions (time, refused, levels) in the JSON")
    args = parser.parse_args()
    strategies = [s for s in args.strategies.split(",") if s]
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        parser.error(f"unknown strategies {unknown}: choose from {', '.join(STRATEGIES)}")
    if importlib.util.find_spec("litellm") is None:
        for s in [s for s in strategies if s.startswith("litellm")]:
            print(f"litellm is not installed: skipping {s} (pip install litellm)",
                  file=sys.stderr)
            strategies.remove(s)
    cfg = {"rpm": args.rpm, "tpm": args.tpm, "burst": args.burst, "latency": args.latency,
           "concurrency": args.concurrency, "redis": args.redis, "seed": args.seed,
           "retry_after": args.retry_after, "trace": args.trace}
    rows: list[dict[str, Any]] = []
    print(HEADER, flush=True)
    for workload in args.workload.split(","):
        for processes in (int(p) for p in args.processes.split(",")):
            for _ in range(args.repeat):
                for strategy in strategies:
                    row = run(strategy, processes, workload, cfg)
                    rows.append(row)
                    print(format_row(row), flush=True)
    if args.repeat > 1:
        print("\nmedians")
        for workload in args.workload.split(","):
            for processes in (int(p) for p in args.processes.split(",")):
                for strategy in strategies:
                    mine = [r for r in rows if (r["workload"], r["processes"], r["strategy"])
                            == (workload, processes, strategy)]
                    eff = statistics.median(r["efficiency"] for r in mine)
                    rej = statistics.median(r["429_per_success"] or 0.0 for r in mine)
                    print(f"{workload:8} {strategy:14} {processes:>5} effic. {eff:.2f} "
                          f"429/ok {rej:.3f}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"config": cfg, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
