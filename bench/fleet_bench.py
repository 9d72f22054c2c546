"""A fleet of agent tasks against one rate-limited provider over real HTTP, side by side.

The provider is the project's own FakeProvider served on 127.0.0.1 (OpenAI
profile: input + ``max_tokens`` counted at admission and kept; continuously
refilled buckets with a burst of ``--burst`` seconds; 429s with
``retry-after`` / ``retry-after-ms`` and ``x-ratelimit-*`` headers).  Each
strategy runs the same tasks (each task a sequence of calls), in 1 process
or N processes; the processes are started and connected **before** the clock
starts (a start event), and ``--concurrency`` tasks run at once in all.

Strategies:

* ``rateloop``       -- ``AsyncRateLoop`` + ``Limiter`` told the limits (rpm/tpm only:
  burst and accounting follow the OpenAI profile); memory in 1 process, one
  Redis shared by all processes otherwise.
* ``rateloop-burst`` -- the same, also told the provider's burst (``burst = 2/60``).
* ``rateloop-zero``  -- the same with no limits configured: learned from the headers
  (and, on Redis, shared: one process learns, all use it).
* ``tenacity``       -- the OpenAI cookbook recipe: the openai SDK (``max_retries=0``)
  inside ``tenacity`` (random exponential wait 1..60 s, 6 attempts).
* ``litellm``        -- LiteLLM's ``Router`` with the deployment's ``rpm``/``tpm``
  (``num_retries=2``); across processes it shares usage through Redis
  (``redis_host``/``redis_port``: its cross-instance mode).
* ``litellm-retries`` -- LiteLLM's ``Router`` told no limits, ``num_retries=6``: its
  own retries (exponential backoff, honouring ``retry-after``) alone.

* ``token-throttle``  -- token-throttle's ``RateLimiter`` (``requests`` and ``tokens``
  quotas per minute; memory backend in 1 process, Redis backend with one
  ``key_prefix`` across processes) reserving ``input + max_tokens`` before each
  call and refunding from the response's ``usage``; the openai SDK (default
  ``max_retries=2``) retries residual 429s.  See ``bench/_tt_worker.py``.
* ``token-throttle-burst`` -- the same, also told the provider's burst as extra
  quotas over the burst window (40 requests / 40k tokens per 2 s).

token-throttle needs Python >= 3.12 (the project runs on 3.11): its workers
run under a peer interpreter, ``bench/.venv-peers/bin/python`` (or
``--peer-python PATH``), made once with ``python bench/fleet_bench.py
--setup-peers`` (optionally ``--setup-peers /path/to/python3.12``).  Without
one the token-throttle strategies are skipped with a message saying so.

Metrics: completed tasks; efficiency = the quota-bound ideal time (the
least time the provider's limits allow for the calls, see
``rateloop.sim.harness.ideal_seconds``) ÷ the wall time (× the share of
tasks completed); 429s per successful call, counted by the provider.

    python bench/fleet_bench.py                                   # short workload, all
    python bench/fleet_bench.py --workload long --processes 1,4
    python bench/fleet_bench.py --strategies rateloop,rateloop-zero --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import logging
import multiprocessing as mp
import os
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REDIS_URL = "redis://127.0.0.1:6379/0"
# Strategies whose workers run under the peer interpreter (Python >= 3.12).
PEER_STRATEGIES = ("token-throttle", "token-throttle-burst")
PEER_VENV = Path(__file__).resolve().parent / ".venv-peers"
PEER_WORKER = Path(__file__).resolve().parent / "_tt_worker.py"
PEER_PACKAGES = ("token-throttle[redis]>=14,<15", "openai", "httpx")
MODEL = "fake-model"
WORKLOADS = {
    # 240 calls: bound by the provider's few-second burst and its rate.
    "short": {"tasks": 60, "calls": 4},
    # 1,200 calls: a minute of the per-minute limits and more.
    "long": {"tasks": 60, "calls": 20},
}


def make_calls(tasks: int, calls: int, seed: int) -> list[list[tuple[int, int, int]]]:
    """Per task, its calls as (input tokens, max_tokens, output tokens)."""
    rng = random.Random(seed)
    out = []
    for _ in range(tasks):
        task = []
        for _ in range(calls):
            inp = max(50, round(rng.lognormvariate(6.2, 0.4)))  # ~530 tokens
            cap = max(32, round(rng.lognormvariate(5.8, 0.4)))  # ~360 max_tokens
            task.append((inp, cap, max(1, round(cap * 0.6))))
        out.append(task)
    return out


# -- the clients ---------------------------------------------------------------------------


def _headers(inp: int, out: int) -> dict[str, str]:
    return {"x-fake-input-tokens": str(inp), "x-fake-output-tokens": str(out)}


def _body(inp: int, cap: int) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": cap}


def make_caller(strategy: str, url: str, cfg: dict[str, Any], processes: int) -> Any:
    """``(caller, close)``: ``async caller(inp, cap, out) -> bool`` for one strategy."""
    if strategy in ("rateloop", "rateloop-zero", "rateloop-burst"):
        import httpx

        from rateloop import AsyncRateLoop, Cost, Route
        from rateloop.admission import Limiter, LimitSpec
        from rateloop.policy import Policy

        route = Route(provider="openai", model=MODEL)
        # rateloop-burst is also told the provider's burst (2 s here) instead of
        # pacing at the profile's 1 s.
        burst = cfg["burst"] / 60 if strategy == "rateloop-burst" else None
        limits = (
            {route.provider_scope: LimitSpec(requests_per_minute=cfg["rpm"],
                                             tokens_per_minute=cfg["tpm"], burst=burst)}
            if strategy != "rateloop-zero"
            else {}
        )
        if processes > 1:
            limiter = Limiter.from_url(cfg["redis"], prefix=cfg["prefix"], limits=limits)
        else:
            limiter = Limiter(limits=limits)
        loop = AsyncRateLoop(Policy(), limiter=limiter)
        client = httpx.AsyncClient(base_url=url, timeout=60)

        async def with_rateloop(inp: int, cap: int, out: int) -> bool:
            async def attempt(_route: Route) -> Any:
                return await client.post("/v1/chat/completions", json=_body(inp, cap),
                                         headers=_headers(inp, out))

            outcome = await loop.call(attempt, route=route,
                                      cost=Cost(input_tokens=inp, output_tokens=cap))
            return outcome.ok

        async def close() -> None:
            await client.aclose()
            await limiter.aclose()

        return with_rateloop, close
    if strategy == "tenacity":
        import openai
        import tenacity

        sdk = openai.AsyncOpenAI(base_url=url + "/v1", api_key="fake", max_retries=0, timeout=60)

        async def with_tenacity(inp: int, cap: int, out: int) -> bool:
            retrying = tenacity.AsyncRetrying(
                wait=tenacity.wait_random_exponential(min=1, max=60),
                stop=tenacity.stop_after_attempt(6),
                reraise=True,
            )
            try:
                async for attempt in retrying:
                    with attempt:
                        await sdk.chat.completions.create(
                            model=MODEL, messages=[{"role": "user", "content": "x"}],
                            max_tokens=cap, extra_headers=_headers(inp, out),
                        )
            except openai.APIError:
                return False
            return True

        async def close_sdk() -> None:
            await sdk.close()

        return with_tenacity, close_sdk
    if strategy in ("litellm", "litellm-retries"):
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import litellm
        from litellm import Router

        litellm.suppress_debug_info = True
        logging.getLogger("LiteLLM").setLevel(logging.CRITICAL)
        logging.getLogger("LiteLLM Router").setLevel(logging.CRITICAL)
        params = {"model": f"openai/{MODEL}", "api_base": url + "/v1", "api_key": "fake"}
        options: dict[str, Any] = {"num_retries": 2}
        if strategy == "litellm":  # told the limits, usage-based routing
            params.update(rpm=cfg["rpm"], tpm=cfg["tpm"])
            options["routing_strategy"] = "usage-based-routing-v2"
        else:  # litellm-retries: no limits told, its retries (backoff, retry-after) alone
            options["num_retries"] = 6
        if processes > 1:
            options.update(redis_host="127.0.0.1", redis_port=int(cfg["redis"].rsplit(":", 1)[1]
                                                                  .split("/")[0]))
        router = Router(model_list=[{"model_name": "fake", "litellm_params": params}], **options)

        async def with_litellm(inp: int, cap: int, out: int) -> bool:
            try:
                await router.acompletion(model="fake", messages=[{"role": "user", "content": "x"}],
                                         max_tokens=cap, extra_headers=_headers(inp, out))
            except Exception:  # LiteLLM raises its own exception classes
                return False
            return True

        async def close_router() -> None:
            return None

        return with_litellm, close_router
    raise ValueError(f"unknown strategy {strategy!r}")


# -- one worker process --------------------------------------------------------------------


async def _work(strategy: str, url: str, cfg: dict[str, Any], processes: int,
                tasks: list[list[tuple[int, int, int]]], ready: Any, go: Any,
                start_at: Any) -> list[tuple[float, bool]]:
    caller, close = make_caller(strategy, url, cfg, processes)
    gate = asyncio.Semaphore(cfg["slots"])
    ready.release()
    while not go.is_set():  # the clock starts when every process is ready
        await asyncio.sleep(0.005)
    t0 = start_at.value

    async def task(calls: list[tuple[int, int, int]]) -> tuple[float, bool]:
        async with gate:
            for inp, cap, out in calls:
                if not await caller(inp, cap, out):
                    return time.time() - t0, False
            return time.time() - t0, True

    try:
        return list(await asyncio.gather(*(task(t) for t in tasks)))
    finally:
        await close()


def _worker(strategy: str, url: str, cfg: dict[str, Any], processes: int,
            tasks: list[list[tuple[int, int, int]]], ready: Any, go: Any, start_at: Any,
            results: Any) -> None:
    try:
        out = asyncio.run(_work(strategy, url, cfg, processes, tasks, ready, go, start_at))
        results.put(("ok", out))
    except BaseException as exc:  # reported to the parent, which prints it
        results.put(("error", f"{type(exc).__name__}: {exc}"))


# -- peers that need another interpreter (token-throttle: Python >= 3.12) -----------------


def _peer_worker(strategy: str, url: str, cfg: dict[str, Any], processes: int,
                 tasks: list[list[tuple[int, int, int]]], ready: Any, go: Any, start_at: Any,
                 results: Any) -> None:
    """A ``_worker`` stand-in that runs ``_tt_worker.py`` under the peer interpreter.

    It relays the same start protocol: ready once the peer's limiter and client are
    up, the clock's start (``start_at``) when ``go`` is set, the peer's results.
    """
    import subprocess

    spec = {"url": url, "cfg": cfg, "processes": processes, "tasks": tasks,
            "prefix": _peer_prefix(cfg), "burst_quotas": strategy == "token-throttle-burst"}
    proc = subprocess.Popen([cfg["peer_python"], str(PEER_WORKER)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(json.dumps(spec) + "\n")
        proc.stdin.flush()
        first = json.loads(proc.stdout.readline() or '{"error": "the peer exited"}')
        ready.release()
        if "ready" not in first:
            results.put(("error", f"{strategy}: {first.get('error')}"))
            return
        while not go.is_set():  # the same 5 ms start poll as _work
            time.sleep(0.005)
        proc.stdin.write(json.dumps({"t0": start_at.value}) + "\n")
        proc.stdin.flush()
        last = json.loads(proc.stdout.readline() or '{"error": "the peer exited"}')
        if "ok" in last:
            results.put(("ok", [(float(t), bool(ok)) for t, ok in last["ok"]]))
        else:
            results.put(("error", f"{strategy}: {last.get('error')}"))
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


def _peer_prefix(cfg: dict[str, Any]) -> str:
    """token-throttle's Redis ``key_prefix`` for this run (no ``:`` allowed in it)."""
    return cfg["prefix"].replace(":", "-").strip("-")


def _drop_peer_keys(cfg: dict[str, Any]) -> None:
    """Delete the keys token-throttle's Redis backend made under this run's prefix."""
    import redis

    client = redis.Redis.from_url(cfg["redis"])
    try:
        keys = list(client.scan_iter(match=_peer_prefix(cfg) + ":*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def peer_python_problem(python: str) -> str | None:
    """Why ``python`` cannot run the token-throttle workers, or None if it can."""
    import subprocess

    if not Path(python).exists():
        return f"no peer interpreter at {python}"
    probe = subprocess.run([python, "-c", "import token_throttle, openai, redis"],
                           check=False, capture_output=True, text=True)
    if probe.returncode != 0:
        return (f"{python} cannot import token_throttle/openai/redis: "
                f"{probe.stderr.strip().splitlines()[-1:]}")
    return None


def _is_python312(python: str) -> bool:
    import subprocess

    try:
        probe = subprocess.run([python, "-c", "import sys; print(sys.version_info >= (3, 12))"],
                               check=False, capture_output=True, text=True, timeout=30)
    except OSError:
        return False
    return probe.stdout.strip() == "True"


def _find_python312() -> str | None:
    """A working Python >= 3.12: python3.1x on PATH, then pyenv's installed versions."""
    import glob
    import shutil

    candidates = [shutil.which(n) for n in ("python3.12", "python3.13", "python3.14")]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python3")))
    return next((c for c in candidates if c and _is_python312(c)), None)


def setup_peers(base: str | None) -> None:
    """Make ``bench/.venv-peers`` with token-throttle and what its worker needs."""
    import subprocess

    base = base or _find_python312()
    if base is None:
        sys.exit("--setup-peers: no Python >= 3.12 found (python3.12/3.13/3.14 on PATH or "
                 "~/.pyenv/versions/3.12*); install one and pass it: "
                 "--setup-peers /path/to/python3.12")
    if not _is_python312(base):
        sys.exit(f"--setup-peers: {base} is not a Python >= 3.12 (token-throttle needs it)")
    subprocess.run([base, "-m", "venv", str(PEER_VENV)], check=True)
    python = str(PEER_VENV / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", *PEER_PACKAGES], check=True)
    problem = peer_python_problem(python)
    if problem:
        sys.exit(f"--setup-peers: {problem}")
    print(f"peer environment ready: {python} (use it with --peer-python or by default)")


# -- one run ------------------------------------------------------------------------------


def split(tasks: list[Any], concurrency: int, processes: int) -> list[tuple[int, list[Any]]]:
    """(slots, tasks) per process: ``concurrency`` slots in all, tasks in proportion.

    30 slots over 4 processes are 8, 8, 7, 7 (not 7 each: 28 in all), and 60
    tasks go 16, 16, 14, 14, so that every process runs the same number of
    waves and none is left with one task running alone at the end.
    """
    slots = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    shares: list[list[Any]] = [[] for _ in range(processes)]
    for t in tasks:  # dealt to the process furthest below its share
        i = min(range(processes), key=lambda k: (len(shares[k]) / max(1, slots[k]), k))
        shares[i].append(t)
    return [(max(1, n), share) for n, share in zip(slots, shares, strict=True)]


def run_processes(strategy: str, processes: int, calls: list[list[tuple[int, int, int]]],
                  cfg: dict[str, Any], url: str, reset: Any) -> list[tuple[float, bool]]:
    """Run ``calls`` with ``strategy`` in ``processes`` workers against ``url``: per task,
    (seconds from the start, completed).  The workers are started and connected before
    the clock starts; ``reset()`` (the provider's) runs just before it."""
    ctx = mp.get_context("spawn")
    ready, go = ctx.Semaphore(0), ctx.Event()
    start_at = ctx.Value("d", 0.0)
    results = ctx.Queue()
    worker = _peer_worker if strategy in PEER_STRATEGIES else _worker
    procs = [
        ctx.Process(target=worker, args=(strategy, url, {**cfg, "slots": slots},
                                          processes, share, ready, go, start_at, results))
        for slots, share in split(calls, cfg["concurrency"], processes)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.acquire(timeout=120)
    reset()  # warm-up connections are not the run
    start_at.value = time.time()
    go.set()
    outs = [results.get(timeout=1800) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    errors = [o[1] for o in outs if o[0] == "error"]
    if errors:
        raise RuntimeError(f"{strategy}: {errors[0]}")
    return [r for o in outs for r in o[1]]


def run(strategy: str, processes: int, workload: str, cfg: dict[str, Any]) -> dict[str, Any]:
    from rateloop.sim.harness import ideal_seconds
    from rateloop.sim.workload import CallSpec
    from rateloop.testing import FakeProvider, FakeProviderServer
    from rateloop.testing._fake.buckets import FakeLimits

    shape = WORKLOADS[workload]
    calls = make_calls(shape["tasks"], shape["calls"], cfg["seed"])
    limits = FakeLimits(rpm=cfg["rpm"], tpm=cfg["tpm"], burst_seconds=cfg["burst"])
    provider = FakeProvider(profile="openai", limits=limits, latency=cfg["latency"],
                            model=MODEL, refusal_latency=0.01)
    cfg = {**cfg, "prefix": f"rateloop-fleet:{uuid.uuid4().hex[:8]}:"}
    with FakeProviderServer(provider) as server:
        try:
            done = run_processes(strategy, processes, calls, cfg, server.url, provider.reset)
        finally:
            if strategy in PEER_STRATEGIES and processes > 1:
                _drop_peer_keys(cfg)
        stats = provider.stats
    wall = max(t for t, _ in done)
    completed = sum(ok for _, ok in done)
    specs = [(0.0, tuple(CallSpec(i, c, o) for i, c, o in task)) for task in calls]
    ideal = ideal_seconds(profile="openai", limits=limits, latency=cfg["latency"], tasks=specs)
    served = stats.served
    return {
        "strategy": strategy,
        "processes": processes,
        "workload": workload,
        "tasks": len(calls),
        "completed": completed,
        "wall_secs": round(wall, 2),
        "ideal_secs": round(ideal, 2),
        "efficiency": round(min(1.0, completed / len(calls) * ideal / wall), 3),
        "429_per_success": round(stats.refused / served, 3) if served else None,
        "served": served,
        "refused": stats.refused,
        "refused_by": {k: v for k, v in stats.refusals.items() if v},
    }


HEADER = (f"{'workload':8} {'strategy':14} {'procs':>5} {'done':>7} {'wall':>7} {'ideal':>6} "
          f"{'effic.':>6} {'429/ok':>7}")


def format_row(row: dict[str, Any]) -> str:
    """One result row under :data:`HEADER`."""
    rej = row["429_per_success"]
    return (f"{row['workload']:8} {row['strategy']:14} {row['processes']:>5} "
            f"{row['completed']:>3}/{row['tasks']:<3} {row['wall_secs']:>6.1f}s "
            f"{row['ideal_secs']:>5.1f}s {row['efficiency']:>6.2f} "
            f"{'inf' if rej is None else f'{rej:.3f}':>7}")


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    """The provider's limits and the fleet's shape, shared by the fleet benches."""
    parser.add_argument("--processes", default="1,4")
    parser.add_argument("--rpm", type=int, default=1_200, help="20 requests a second")
    parser.add_argument("--tpm", type=int, default=1_200_000, help="20k tokens a second")
    parser.add_argument("--burst", type=float, default=2.0, help="the provider's burst, seconds")
    parser.add_argument("--latency", type=float, default=0.5, help="seconds per answer")
    parser.add_argument("--concurrency", type=int, default=30, help="tasks at once, in all")
    parser.add_argument("--redis", default=REDIS_URL)
    parser.add_argument("--seed", type=int, default=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="short", help="short, long or both (short,long)")
    parser.add_argument(
        "--strategies", default="rateloop,rateloop-burst,rateloop-zero,tenacity,litellm,"
        "token-throttle"
    )
    add_fleet_arguments(parser)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--peer-python", default=str(PEER_VENV / "bin" / "python"),
                        help="a Python >= 3.12 with token-throttle (runs its workers)")
    parser.add_argument("--peer-limit-share", type=float, default=1.0,
                        help="token-throttle is told this share of rpm/tpm (1.0: the same "
                             "limits as the others; e.g. 0.95 for headroom)")
    parser.add_argument("--setup-peers", nargs="?", const="", default=None, metavar="PYTHON",
                        help="make bench/.venv-peers from PYTHON (>= 3.12; found if omitted)"
                             " with token-throttle, openai and redis, then exit")
    args = parser.parse_args()
    if args.setup_peers is not None:
        setup_peers(args.setup_peers or None)
        return
    strategies = [s for s in args.strategies.split(",") if s]
    if "litellm" in strategies and importlib.util.find_spec("litellm") is None:
        print("litellm is not installed: skipping it (pip install litellm)", file=sys.stderr)
        strategies.remove("litellm")
    peers = [s for s in strategies if s in PEER_STRATEGIES]
    problem = peer_python_problem(args.peer_python) if peers else None
    if problem:
        print(f"{problem}: skipping {', '.join(peers)} (token-throttle needs Python >= 3.12; "
              "run `python bench/fleet_bench.py --setup-peers [/path/to/python3.12]` once, "
              "or pass --peer-python PATH)", file=sys.stderr)
        strategies = [s for s in strategies if s not in PEER_STRATEGIES]
    cfg = {"rpm": args.rpm, "tpm": args.tpm, "burst": args.burst, "latency": args.latency,
           "concurrency": args.concurrency, "redis": args.redis, "seed": args.seed,
           "peer_python": args.peer_python, "peer_limit_share": args.peer_limit_share}
    rows = []
    print(HEADER, flush=True)
    for workload in args.workload.split(","):
        for processes in (int(p) for p in args.processes.split(",")):
            for strategy in strategies:
                row = run(strategy, processes, workload, cfg)
                rows.append(row)
                print(format_row(row), flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"config": cfg, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
