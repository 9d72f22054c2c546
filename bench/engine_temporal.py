"""Temporal: rateloop inside the activity vs Temporal's default retry policy alone, one run.

The shared workload (bench/_engine_workload.py): 1,000 model calls, each one workflow running
one activity, from 4 worker processes against the FakeProvider over HTTP; 5 % of the calls ask a
model whose day quota resets 60 s after the run starts (far beyond the 5 s pause limit).

- ``temporal + rateloop``: the activity runs its call through ``aactivity_call`` (an
  AsyncRateLoop whose limiter lives in Redis, shared by the 4 workers); far waits go back to
  the server as ``next_retry_delay``; the retry policy is ``retry_policy(policy)``.
- ``temporal alone``: the activity raises on a refusal (``raise_for_status``) and Temporal's
  default retry policy (1 s, x2, at most 100 s, unlimited attempts) retries it.

Both run on one dev server this script starts (``temporal server start-dev``) and stops.

    PYTHONPATH=src python3 bench/engine_temporal.py            # the full run
    PYTHONPATH=src python3 bench/engine_temporal.py --calls 200  # a smaller one
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import redis
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _engine_workload import (
    WORKLOAD,
    ResultLog,
    Workload,
    arequest_completion,
    print_table,
    serve_provider,
    summarize,
)

from rateloop import AsyncRateLoop, Policy, Route
from rateloop.admission import Limiter
from rateloop.integrations._engine import Finish, GiveUp, RetryLater
from rateloop.integrations.temporal import (
    ActivityReport,
    aactivity_call,
    retry_policy,
)
from rateloop.testing.temporal import temporal_dev_server

REDIS_URL = os.environ.get("RATELOOP_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
SLOTS_PER_WORKER = 25
VARIANTS = ("temporal + rateloop", "temporal alone")


def bench_policy(workload: Workload) -> Policy:
    return Policy.from_dict({
        "pause_limit_secs": workload.pause_limit_secs,
        "admission": {"backend": REDIS_URL},
    })


def limiter_prefix(run_id: str) -> str:
    return f"rateloop-bench:temporal:{run_id}:"


@workflow.defn(name="CallModel", sandboxed=False)
class CallModel:
    @workflow.run
    async def run(self, i: int, rateloop: bool, max_attempts: int) -> str:
        policy = retry_policy(Policy.from_dict({"max_attempts": max_attempts})) if rateloop \
            else None  # None: the server's default retry policy
        return str(await workflow.execute_activity(
            "call_model", i, start_to_close_timeout=timedelta(seconds=60), retry_policy=policy))


# --- where the seconds go (--trace) ------------------------------------------------------


def trace(log: ResultLog, i: int, r: ActivityReport) -> None:
    """One engine attempt's record: its end, its waits, the server's dispatch latency."""
    info = activity.info()
    sched = info.current_attempt_scheduled_time
    admission = sum(e.wait_seconds or 0.0 for e in r.outcome.events
                    if e.decision == "admission_wait")
    v = r.verdict
    log.trace(i, {
        "attempt": r.engine_attempt,
        "status": r.outcome.status.value,
        "reason": r.outcome.reason.split(" (")[0][:60],
        "delay": v.delay_secs if isinstance(v, RetryLater) else None,
        "asleep": r.asleep_secs,
        "admission_wait": admission,
        "dispatch": (info.started_time - sched).total_seconds() if sched else None,
        "booked_in": r.booked_in,
        "took_booking": r.took_booking,
        "t": time.time(),
    })


def print_trace(log: ResultLog) -> None:
    """Where the seconds went: ends by reason, admission waits, dispatch latency."""
    rows = log.traces()
    if path := os.environ.get("RATELOOP_BENCH_TRACE_FILE"):  # every record, for a closer look
        Path(path).write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    starts = {(r["i"], r["started"]) for r in rows if "started" in r}
    rows = [r for r in rows if "started" not in r]
    print(f"engine attempts started and never ended (lost: timed out): "
          f"{len(starts - {(r['i'], r['attempt']) for r in rows})}")
    ends = collections.Counter((r["status"], r["reason"]) for r in rows)
    print(f"engine attempts traced: {len(rows)}")
    for (status, reason), n in ends.most_common():
        print(f"  {n:5d}  {status:22s} {reason}")

    def quantiles(name: str, xs: list[float]) -> None:
        if not xs:
            return
        xs = sorted(xs)
        q = [xs[min(len(xs) - 1, int(p * len(xs)))] for p in (0.5, 0.9, 0.99)]
        print(f"  {name:28s} n={len(xs):5d} sum={sum(xs):8.1f} p50={q[0]:6.2f} "
              f"p90={q[1]:6.2f} p99={q[2]:6.2f} max={xs[-1]:6.2f}")

    quantiles("admission wait (s)", [r["admission_wait"] for r in rows])
    quantiles("asleep per attempt (s)", [r["asleep"] for r in rows])
    quantiles("hand-back delay (s)", [r["delay"] for r in rows if r["delay"] is not None])
    quantiles("dispatch latency, 1st (s)", [r["dispatch"] for r in rows
                                            if r["dispatch"] is not None and r["attempt"] == 1])
    quantiles("dispatch latency, retry (s)", [r["dispatch"] for r in rows
                                              if r["dispatch"] is not None and r["attempt"] > 1])
    quantiles("booked start ahead (s)", [r["booked_in"] for r in rows
                                         if r.get("booked_in") is not None])
    print(f"  attempts that took a booked start: {sum(bool(r.get('took_booking')) for r in rows)}")
    t0 = min((r["t"] for r in rows), default=0.0)
    done = collections.Counter(int((r["t"] - t0) // 10) for r in rows
                               if r["status"] in ("completed", "degraded"))
    print("  completions per 10 s:", [done[k] for k in range(max(done, default=-1) + 1)])
    per_call = collections.Counter(r["i"] for r in rows if r["delay"] is not None)
    print("  hand-backs per call:", sorted(collections.Counter(per_call.values()).items()))


# --- a worker process -------------------------------------------------------------------


async def run_worker(args: argparse.Namespace) -> None:
    workload = dataclasses.replace(WORKLOAD, calls=args.calls)
    log = ResultLog(REDIS_URL, args.run_id)
    policy = bench_policy(workload)
    loop = AsyncRateLoop(policy, limiter=Limiter.from_policy(
        policy, prefix=limiter_prefix(args.run_id)), sinks=[])
    http = httpx.AsyncClient(timeout=30)

    @activity.defn(name="call_model")
    async def call_model(i: int) -> str:
        model = workload.model_for(i)
        if not args.rateloop:
            text = await arequest_completion(http, args.base_url, i, workload, model=model)
            log.record(i, "completed", attempts=activity.info().attempt)
            return text

        if args.trace:  # an attempt that starts and never reports is a lost one
            log.trace(i, {"started": activity.info().attempt, "t": time.time()})

        def report(r: ActivityReport) -> None:
            log.add_asleep(i, r.asleep_secs)
            if args.trace:
                trace(log, i, r)
            if isinstance(r.verdict, Finish | GiveUp):  # a RetryLater is not an end
                log.record(i, r.outcome.status.value, attempts=r.engine_attempt)

        async def attempt(route: Route) -> str:
            return await arequest_completion(http, args.base_url, i, workload, model=route.model)

        return str(await aactivity_call(loop, attempt, route=Route(provider="openai", model=model),
                                        on_report=report))

    client = await Client.connect(args.target)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with Worker(client, task_queue=args.queue, workflows=[CallModel],
                      activities=[call_model], max_concurrent_activities=SLOTS_PER_WORKER,
                      workflow_runner=UnsandboxedWorkflowRunner()):
        log.worker_ready()
        await stop.wait()
    await http.aclose()
    await loop.limiter.aclose()


# --- the benchmark's process ------------------------------------------------------------


@contextlib.contextmanager
def workers(n: int, argv: list[str]) -> Iterator[None]:
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", *argv],
                              start_new_session=True) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)


async def enqueue(target: str, queue: str, workload: Workload, rateloop: bool) -> None:
    client = await Client.connect(target)
    max_attempts = Policy().max_attempts
    for start in range(0, workload.calls, 100):
        await asyncio.gather(*(
            client.start_workflow(CallModel.run, args=[i, rateloop, max_attempts],
                                  id=f"{queue}-{i}", task_queue=queue)
            for i in range(start, min(start + 100, workload.calls))))


def run_variant(name: str, target: str, workload: Workload, timeout: float,
                *, traced: bool = False) -> dict[str, Any]:
    rateloop = name == "temporal + rateloop"
    run_id = uuid.uuid4().hex[:10]
    queue = f"bench-{run_id}"
    log = ResultLog(REDIS_URL, run_id)
    log.clear()
    with serve_provider(workload) as provider:
        argv = ["--target", target, "--queue", queue, "--run-id", run_id, "--calls",
                str(workload.calls), "--base-url", provider.base_url]
        argv += ["--rateloop"] if rateloop else []
        with workers(workload.workers, argv + (["--trace"] if traced else [])):
            # The clock starts when every worker polls, as in the Celery and DBOS benchmarks.
            if not log.wait_ready(workload.workers, timeout=90):
                raise SystemExit(f"the {workload.workers} workers were not ready in 90 s")
            provider.begin()
            asyncio.run(enqueue(target, queue, workload, rateloop))
            results = log.wait_all(workload.calls, timeout=timeout)
        row = summarize(name, workload, provider, results)
    if traced:
        print(f"--- {name}")
        print_trace(log)
    log.clear()
    keys = redis.Redis.from_url(REDIS_URL)  # the shared limiter's state of this run
    for key in keys.scan_iter(match=f"{limiter_prefix(run_id)}*"):
        keys.delete(key)
    keys.close()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=WORKLOAD.calls)
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds each variant may take before its missing calls are lost")
    parser.add_argument("--variant", choices=VARIANTS, action="append",
                        help="run only this variant (repeatable; default: all)")
    parser.add_argument("--trace", action="store_true",
                        help="print where the seconds went: ends by reason, admission waits, "
                             "the server's dispatch latency")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rateloop", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--queue", help=argparse.SUPPRESS)
    parser.add_argument("--run-id", help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        # Refusals are the workload: Temporal's warning per failed attempt would flood the run.
        logging.getLogger("temporalio").setLevel(logging.ERROR)
        asyncio.run(run_worker(args))
        sys.stdout.flush()
        # The SDK's core threads can outlive the interpreter's finalization and abort it
        # (PyGILState_Release); the worker has shut down cleanly, so skip finalization.
        os._exit(0)
    workload = dataclasses.replace(WORKLOAD, calls=args.calls)
    with temporal_dev_server() as target:
        rows = [run_variant(name, target, workload, args.timeout, traced=args.trace)
                for name in args.variant or VARIANTS]
    print_table(rows)


if __name__ == "__main__":
    main()
