"""Cross-check ``rateloop simulate`` against a real-time run over real HTTP.

The same scenario twice:

* **simulated**: the simulator's models of the strategies against an in-process
  FakeProvider on virtual time (what ``rateloop simulate`` prints);
* **real**: the FakeProvider as a server on 127.0.0.1 (real clock, real
  sockets) and the *real* clients: the openai SDK with its own retries
  (``max_retries=2``), the anthropic SDK with its own (``sdk-anthropic``,
  against an Anthropic-shaped provider, compared with the ``sdk`` model),
  real tenacity with the cookbook recipe around the SDK (``max_retries=0``),
  rateloop's ``AsyncRateLoop`` + ``Limiter`` around the SDK, a naive
  immediate-retry loop, and LiteLLM (``litellm.acompletion`` with
  ``num_retries=2``: the OpenAI client's ``max_retries``, then LiteLLM's own
  two more attempts; the simulator's ``litellm`` model) when it is importable.

Both are measured the same way (``rateloop.sim.harness``): completed / lost
tasks, efficiency against the quota-bound ideal, provider refusals per
success, attempts per call.  The limits are scaled up (600 RPM, 400k TPM)
and the answers take 0.5 s so that a real-time run takes about 30 s per
strategy; the retry constants of the clients are not scaled.

The real clients run in spawned OS processes, one per simulated process
(four in ``shared``), each on its own event loop; they are started and ready
before the clock starts; the server runs on a thread of the parent.  The
rateloop callers give the loop the SDK's raw response
(``with_raw_response``), so it reads every answer's ``x-ratelimit-*``
headers as the simulated loop does.

One run of either side is one draw (jittered waits, request timing, the
provider's random faults): each pair is run ``--real-runs`` times for real
and over ``--sim-seeds`` seeds simulated, and the gap compares the two
medians.  Real run n draws the provider's faults from seed n, as the
simulator's seed n does (one fixed seed made every real storm the same mild
one: 40 % of its first 130 draws below 0.5, not 50 %).

    python bench/sim_crosscheck.py                       # burst and steady, all strategies
    python bench/sim_crosscheck.py --scenario burst --strategies sdk,rateloop
    python bench/sim_crosscheck.py --scenario burst,steady,shared --real-runs 2 \
        --json bench/results/sim_crosscheck.json
    python bench/sim_crosscheck.py --scenario shared --strategies rateloop,rateloop-zero

Every scenario of ``rateloop simulate`` runs (``--scenario burst,steady,daily,storm,lower,shared``):
its times are scaled like the limits (``TIME_SCALE``: the storm's 30-150 s window is 3-15 s
here, set on the server's provider by timers).

``shared`` (four processes, one budget) needs the Redis on 127.0.0.1:6379: the
``rateloop`` processes share their limiter state there (under a random key
prefix, deleted afterwards); the zero-config processes each learn alone.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import logging
import math
import multiprocessing as mp
import os
import secrets
import statistics
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import openai

from rateloop import AsyncRateLoop, Cost, Route
from rateloop.admission import Limiter
from rateloop.policy import Policy
from rateloop.sim.harness import (
    RunResult,
    TaskResult,
    achievable_tasks,
    ideal_seconds,
    run_strategy,
)
from rateloop.sim.report import summary
from rateloop.sim.scenarios import Scenario, build_scenario
from rateloop.sim.workload import CallSpec, TaskSpec, Workload
from rateloop.testing import FakeProvider, FakeProviderServer

LIMITS = {"rpm": 600, "tpm": 400_000, "burst_seconds": 5.0, "latency": 0.5}
MESSAGES = [{"role": "user", "content": "x"}]
REDIS_URL = "redis://127.0.0.1:6379/0"  # the shared budget of the "shared" scenario


#: The simulator's times (arrivals over 240 s, the storm from 30 s to 150 s), scaled like
#: the limits: ten times faster.
TIME_SCALE = 0.1


#: Real clients compared with another strategy's model: the Anthropic SDK's retries are
#: the OpenAI SDK's (both SDKs' ``_base_client.py``), so the simulator's ``sdk`` model,
#: run against an Anthropic-shaped provider (its headers, bodies and token accounting).
MODEL_OF = {"sdk-anthropic": "sdk"}
PROFILE_OF = {"sdk-anthropic": "anthropic"}


def scenario(name: str, *, tasks: int, calls: int, seed: int,
             profile: str = "openai") -> Scenario:
    arrival = 240.0 * TIME_SCALE if name in ("steady", "storm") else 0.0
    processes = 4 if name == "shared" else 1
    work = Workload.generate(tasks=tasks, calls=calls, arrival_secs=arrival, seed=seed,
                             processes=processes)
    sc = build_scenario(name, tasks=tasks, calls=calls, profile=profile, rpm=LIMITS["rpm"],
                        tpm=LIMITS["tpm"], burst_seconds=LIMITS["burst_seconds"],
                        latency=LIMITS["latency"], workload=work, seed=seed)
    storms = tuple(replace(w, start=w.start * TIME_SCALE, end=w.end * TIME_SCALE)
                   for w in sc.storms)
    return replace(sc, storms=storms)


def _start_storms(provider: FakeProvider, sc: Scenario) -> list[threading.Timer]:
    """The scenario's overload windows on the real clock, timed from now."""
    timers = []
    for window in sc.storms:
        timers.append(threading.Timer(window.start, provider.set_fault_rates, (window.rates,)))
        timers.append(threading.Timer(window.end, provider.set_fault_rates, (None,)))
    for timer in timers:
        timer.daemon = True
        timer.start()
    return timers


def _headers(call: CallSpec) -> dict[str, str]:
    return {"x-fake-input-tokens": str(call.input_tokens),
            "x-fake-output-tokens": str(call.output_tokens)}


def _client(url: str, retries: int) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="fake", max_retries=retries,
                              timeout=60)


async def _create(client: openai.AsyncOpenAI, call: CallSpec) -> Any:
    return await client.chat.completions.create(
        model="sim-model", messages=MESSAGES, max_tokens=call.max_tokens,  # type: ignore[arg-type]
        extra_headers=_headers(call),
    )


async def _create_raw(client: openai.AsyncOpenAI, call: CallSpec) -> Any:
    """The SDK's raw response: the answer *with its headers*, as the simulator's attempts are.

    A parsed ``ChatCompletion`` carries no headers, so a loop around ``create()``
    would learn only from refusals; the simulated rateloop (and rateloop's own
    SDK clients, ``rateloop.async_openai_client()``) read every answer's
    ``x-ratelimit-*`` headers.
    """
    return await client.chat.completions.with_raw_response.create(
        model="sim-model", messages=MESSAGES, max_tokens=call.max_tokens,  # type: ignore[arg-type]
        extra_headers=_headers(call),
    )


#: The warm-up request of each real client process, sent before the clock starts.
WARM_UP = CallSpec(input_tokens=1, max_tokens=1, output_tokens=1)


def make_real_caller(strategy: str, url: str, sc: Scenario,
                     redis_prefix: str | None = None) -> tuple[Any, Any]:
    """``(async call(spec) -> bool, async warm_up())`` for a real client.

    ``warm_up`` sends one request through the client's own HTTP stack (not
    through any retry layer or limiter): a fresh process's first request
    pays for lazy imports, model building and a TCP connect (measured here:
    45-125 ms), so without it the first call of a real run lands late while
    the provider's bucket is full -- refill the simulated run does not lose.

    With ``redis_prefix``, the ``rateloop`` strategy's limiter keeps its state
    in the Redis on 127.0.0.1 under that prefix: several callers built with
    the same prefix share one budget, as separate processes would.
    """
    if strategy == "sdk":
        client = _client(url, 2)

        async def sdk(call: CallSpec) -> bool:
            try:
                await _create(client, call)
            except openai.APIError:
                return False
            return True

        return sdk, lambda: _create(client, WARM_UP)
    if strategy == "sdk-anthropic":
        import anthropic

        claude = anthropic.AsyncAnthropic(base_url=url, api_key="fake", max_retries=2,
                                          timeout=60)

        def message(call: CallSpec) -> Any:
            return claude.messages.create(
                model="sim-model", messages=MESSAGES, max_tokens=call.max_tokens,  # type: ignore[arg-type]
                extra_headers=_headers(call),
            )

        async def sdk_anthropic(call: CallSpec) -> bool:
            try:
                await message(call)
            except anthropic.APIError:
                return False
            return True

        return sdk_anthropic, lambda: message(WARM_UP)
    if strategy == "immediate":
        client = _client(url, 0)

        async def immediate(call: CallSpec) -> bool:
            for _ in range(10):
                try:
                    await _create(client, call)
                except openai.APIError:
                    continue
                return True
            return False

        return immediate, lambda: _create(client, WARM_UP)
    if strategy == "tenacity":
        import tenacity

        client = _client(url, 0)

        async def with_tenacity(call: CallSpec) -> bool:
            retrying = tenacity.AsyncRetrying(
                wait=tenacity.wait_random_exponential(min=1, max=60),
                stop=tenacity.stop_after_attempt(6), reraise=True,
            )
            try:
                async for attempt in retrying:
                    with attempt:
                        await _create(client, call)
            except openai.APIError:
                return False
            return True

        return with_tenacity, lambda: _create(client, WARM_UP)
    if strategy in ("rateloop", "rateloop-zero"):
        client = _client(url, 0)
        route = Route(provider="openai", model="sim-model")
        limits = {route.provider_scope: sc.configured} if strategy == "rateloop" else {}
        if strategy == "rateloop" and redis_prefix is not None:
            limiter = Limiter.from_url(REDIS_URL, prefix=redis_prefix, limits=limits)
        else:
            limiter = Limiter(limits=limits)  # zero-config: each process learns alone
        loop = AsyncRateLoop(Policy(), limiter=limiter)

        async def with_rateloop(call: CallSpec) -> bool:
            async def attempt(_route: Route) -> Any:
                return await _create_raw(client, call)

            outcome = await loop.call(attempt, route=route, cost=Cost(
                input_tokens=call.input_tokens, output_tokens=call.max_tokens))
            return outcome.ok

        return with_rateloop, lambda: _create_raw(client, WARM_UP)
    if strategy == "litellm":
        import litellm

        litellm.suppress_debug_info = True

        def complete(call: CallSpec, retries: int) -> Any:
            return litellm.acompletion(
                model="openai/sim-model", api_base=url + "/v1", api_key="fake",
                messages=MESSAGES, max_tokens=call.max_tokens, num_retries=retries,
                extra_headers=_headers(call),
            )

        async def with_litellm(call: CallSpec) -> bool:
            try:
                await complete(call, 2)
            except Exception:  # LiteLLM maps to its own exception classes
                return False
            return True

        return with_litellm, lambda: complete(WARM_UP, 0)
    raise ValueError(f"no real client for strategy {strategy!r}")


async def _client_tasks(strategy: str, url: str, sc: Scenario, group: int,
                        redis_prefix: str | None, ready: Any, go: Any,
                        start_at: Any) -> list[tuple[int, TaskResult]]:
    """One client process: its share of the tasks (``group``), timed from the common start."""
    caller, warm_up = make_real_caller(strategy, url, sc, redis_prefix)
    await warm_up()  # the parent resets the provider once every process is ready
    mine = [(i, t) for i, t in enumerate(sc.workload.tasks) if t.group % sc.processes == group]
    ready.release()
    while not go.is_set():  # the clock starts when every process is ready
        await asyncio.sleep(0.002)
    t0 = start_at.value

    async def run_task(spec: TaskSpec) -> TaskResult:
        await asyncio.sleep(max(0.0, t0 + spec.start - time.time()))
        start = time.time() - t0
        done: list[CallSpec] = []
        for call in spec.calls:
            if not await caller(call):
                break
            done.append(call)
        completed = len(done) == len(spec.calls)
        return TaskResult(start, time.time() - t0, completed, tuple(done),
                          len(done) + (0 if completed else 1), 0,
                          "completed" if completed else "failed")

    results = await asyncio.gather(*(run_task(t) for _, t in mine))
    return [(i, r) for (i, _), r in zip(mine, results, strict=True)]


def _client_process(strategy: str, url: str, args: tuple[str, int, int, int], group: int,
                    redis_prefix: str | None, ready: Any, go: Any, start_at: Any,
                    results: Any) -> None:
    logging.getLogger("LiteLLM").setLevel(logging.CRITICAL)
    name, tasks, calls, seed = args
    sc = scenario(name, tasks=tasks, calls=calls, seed=seed,  # deterministic: the parent's
                  profile=PROFILE_OF.get(strategy, "openai"))
    try:
        out = asyncio.run(_client_tasks(strategy, url, sc, group, redis_prefix, ready, go,
                                        start_at))
        results.put(("ok", out))
    except BaseException as exc:  # reported to the parent, which raises it
        results.put(("error", f"{type(exc).__name__}: {exc}"))


def _real(sc: Scenario, strategy: str, args: tuple[str, int, int, int],
          run: int = 1) -> RunResult:
    """The scenario in real time: one OS process per simulated process, the server in this one.

    The client processes are spawned, build their clients and signal ready
    before the clock starts (as ``fleet_bench.py`` does); each runs its own
    event loop.  In ``shared`` the four ``rateloop`` processes share one budget
    in the Redis on 127.0.0.1.
    """
    # Real run n draws the provider's random faults (the storm's overloads) from seed n,
    # as the simulator's seed n does: the runs are not one fault sequence three times.
    provider = FakeProvider(seed=run, **sc.provider_options())
    ctx = mp.get_context("spawn")
    # The server runs its own loop on a thread of this process; the clients run elsewhere.
    with FakeProviderServer(provider) as server:
        prefix = f"rateloop-simcheck-{secrets.token_hex(4)}:" if sc.processes > 1 else None
        ready, go, start_at, queue = ctx.Semaphore(0), ctx.Event(), ctx.Value("d", 0.0), ctx.Queue()
        procs = [ctx.Process(target=_client_process,
                             args=(strategy, server.url, args, g, prefix, ready, go, start_at,
                                   queue))
                 for g in range(sc.processes)]
        storms: list[threading.Timer] = []
        try:
            for proc in procs:
                proc.start()
            for _ in procs:
                if not ready.acquire(timeout=300):
                    raise RuntimeError(f"{strategy}: a client process did not start")
            provider.reset()  # nothing before the clock counts
            start_at.value = time.time()
            storms = _start_storms(provider, sc)
            go.set()
            outs = [queue.get(timeout=1800) for _ in procs]
            for proc in procs:
                proc.join(timeout=30)
        finally:
            for timer in storms:
                timer.cancel()
            provider.set_fault_rates(None)
            for proc in procs:
                if proc.is_alive():
                    proc.terminate()
            if prefix is not None:
                _forget_redis_keys(prefix)
        stats = provider.stats
    errors = [o[1] for o in outs if o[0] == "error"]
    if errors:
        raise RuntimeError(f"{strategy}: {errors[0]}")
    results = [r for _, r in sorted((pair for o in outs for pair in o[1]), key=lambda p: p[0])]
    possible = achievable_tasks(sc.workload.tasks, sc.limits.rpd)
    ideal = ideal_seconds(profile="openai", limits=sc.limits, latency=sc.latency,
                          tasks=[(t.start, t.calls) for t in possible])
    return RunResult(scenario=sc.name, strategy=strategy, tasks=results,
                     provider_attempts=stats.attempts, provider_refusals=stats.refused,
                     served=stats.served, ideal=ideal, achievable=len(possible))


def _forget_redis_keys(prefix: str) -> None:
    """Delete this run's keys (and only them) from the shared Redis."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=prefix + "*", count=500))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def _gap(sim: float | None, real: float | None) -> str:
    if sim is None or real is None or math.isnan(real):
        return "-"
    if max(abs(sim), abs(real)) < 0.05:
        return "both < 0.05"
    return f"{(sim - real) / max(abs(real), 1e-9):+.0%}"


def _row(label: str, name: str, strategy: str, sc: Scenario, row: dict[str, Any]) -> None:
    rej = row["rejected_per_success"]
    done = f"{row['completed']}/{len(sc.workload.tasks)}"
    print(f"{name:8} {strategy:14} {label:7} {done:>6} {row['lost']:>5} "
          f"{row['wall_secs']:>6.1f}s {row['efficiency']:>7.0%} "
          f"{'inf' if rej is None else f'{rej:.2f}':>10} "
          f"{row['attempts_per_call']:>10.2f}", flush=True)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def _finite(value: float) -> float | None:
    return None if math.isinf(value) or math.isnan(value) else value


def _run_all(args: argparse.Namespace, strategies: list[str]) -> list[dict[str, Any]]:
    """Each pair: ``--real-runs`` real runs and the simulator over jitter seeds 1..``--sim-seeds``.

    One run of either side is one draw: jittered waits (the SDK's, tenacity's,
    rateloop's), request timing (the simulator's transit, real HTTP's) and
    who meets a refusal first all vary.  The gap compares the median of the
    real runs with the median over the simulator's seeds.
    """
    rows: list[dict[str, Any]] = []
    print(f"{'scenario':8} {'strategy':14} {'run':7} {'done':>6} {'lost':>5} {'wall':>7} "
          f"{'effic.':>7} {'refused/ok':>10} {'tries/call':>10}", flush=True)
    for name in args.scenario.split(","):
        for strategy in strategies:
            sc = scenario(name, tasks=args.tasks, calls=args.calls, seed=args.seed,
                          profile=PROFILE_OF.get(strategy, "openai"))
            reals = [] if args.sim_only else [
                _real(sc, strategy, (name, args.tasks, args.calls, args.seed), run=n)
                for n in range(1, args.real_runs + 1)]
            model = MODEL_OF.get(strategy, strategy)
            sims = [run_strategy(sc, model, seed=k) for k in range(1, args.sim_seeds + 1)]
            for n, real in enumerate(reals, 1):
                _row(f"real#{n}", name, strategy, sc, summary(real))
            _row("sim", name, strategy, sc, summary(sims[0]))
            effs = [r.efficiency for r in sims]
            rejs = [r.rejected_per_success for r in sims]
            sim_eff, sim_rej = _median(effs), _median(rejs)
            real_eff = _median([r.efficiency for r in reals])
            real_rej = _median([r.rejected_per_success for r in reals])
            gaps = {"efficiency": _gap(sim_eff, real_eff),
                    "rejected_per_success": _gap(_finite(sim_rej), _finite(real_rej))}
            print(f"{'':8} {'':14} sim seeds 1-{len(sims)}: efficiency {min(effs):.0%}-"
                  f"{max(effs):.0%} (median {sim_eff:.0%}), refused/ok {min(rejs):.2f}-"
                  f"{max(rejs):.2f} (median {sim_rej:.2f})", flush=True)
            print(f"{'':8} {'':14} gap (sim median vs real median): efficiency "
                  f"{gaps['efficiency']}, refused/ok {gaps['rejected_per_success']}",
                  flush=True)
            rows.append({
                "scenario": name, "strategy": strategy,
                "real": [summary(r) for r in reals],
                "sim": summary(sims[0]),
                "sim_seeds": {"seeds": len(sims), "efficiency": effs,
                              "rejected_per_success": [_finite(x) for x in rejs]},
                "median": {"real_efficiency": real_eff, "sim_efficiency": sim_eff,
                           "real_rejected_per_success": _finite(real_rej),
                           "sim_rejected_per_success": _finite(sim_rej)},
                "gap_sim_vs_real": gaps,
            })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="burst,steady")
    parser.add_argument("--strategies",
                        default="immediate,sdk,tenacity,rateloop,rateloop-zero,litellm")
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--sim-seeds", type=int, default=40,
                        help="simulate jitter seeds 1..N; the gap uses their median")
    parser.add_argument("--real-runs", type=int, default=1,
                        help="real runs per pair; the gap uses their median")
    parser.add_argument("--sim-only", action="store_true",
                        help="only the simulator's side (seconds, no server): its medians")
    args = parser.parse_args()
    strategies = [s for s in args.strategies.split(",") if s]
    # LiteLLM: no network (its model-price map is bundled), no chatter on stderr.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    logging.getLogger("LiteLLM").setLevel(logging.CRITICAL)
    if "litellm" in strategies and importlib.util.find_spec("litellm") is None:
        print("litellm is not installed: skipping it (pip install litellm)", file=sys.stderr)
        strategies.remove("litellm")
    if min(args.sim_seeds, args.real_runs) < 1:
        parser.error(f"--sim-seeds and --real-runs must be >= 1, got {args.sim_seeds} and "
                     f"{args.real_runs}")
    rows = _run_all(args, strategies)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"limits": LIMITS, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
