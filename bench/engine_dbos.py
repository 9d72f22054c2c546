"""DBOS: rateloop's step inside DBOS against DBOS's queue limiter alone, the shared workload.

Usage::

    PYTHONPATH=src python bench/engine_dbos.py [--calls 1000] [--variants rateloop,alone]
        [--postgres postgresql://postgres@127.0.0.1:5432/test] [--redis redis://127.0.0.1:6379/0]

The workload is ``bench/_engine_workload.py``'s: 1,000 chat calls, 5 % of them on a model whose
day quota resets 60 s after the run starts, against a ``FakeProvider`` at 600 requests a minute
(a 5 s bucket) served by this process.  Each variant runs once, in turn, on a system database of
its own (created here, dropped at the end): four worker processes (``--worker``), each a DBOS
app with its own executor id on that one system database, all listening to one queue; this
process enqueues the calls with a ``DBOSClient`` as soon as the workers are up.

- ``rateloop``: each workflow runs its call through ``call_step`` (a ``RateLoop`` whose
  admission is shared by the four workers in Redis, the provider's limits configured, pause
  limit 5 s); the queue's limiter comes from the same limits (``queue_limits``: 10 starts a
  second).  Waits beyond the pause limit are durable ``DBOS.sleep``\\ s between rounds.
- ``alone``: DBOS's tools alone: the queue's limiter at the provider's rate,
  ``{"limit": 10, "period": 1}``, and the call as a ``@DBOS.step`` with retries
  (``interval_seconds=1, backoff_rate=2, max_attempts=8``: 127 s of retries, enough to outlast
  the 60 s reset; DBOS's default of 3 attempts would lose every far call).

Besides the shared row, the table after it gives the seconds workflows spent in durable
``DBOS.sleep`` (a workflow thread parked, no step running, the wait checkpointed) apart from
``worker_s_asleep`` (sleeps inside a running step: the loop's short waits, or DBOS's step-retry
sleeps).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import redis
from _engine_workload import (
    MODEL,
    WORKLOAD,
    ResultLog,
    Workload,
    print_table,
    request_completion,
    serve_provider,
    summarize,
)

QUEUE = "bench-calls"
WORKFLOW = "bench_call"
ALONE_LIMITER = {"limit": 10, "period": 1.0}
ALONE_RETRIES = {"retries_allowed": True, "interval_seconds": 1.0, "backoff_rate": 2.0,
                 "max_attempts": 8}


def _keys(run: str) -> dict[str, str]:
    base = f"rateloop-bench:engines:{run}"
    return {"ready": f"{base}:ready", "stop": f"{base}:stop", "durable": f"{base}:durable",
            "limiter": f"{base}:limiter:"}


# --- a worker process --------------------------------------------------------------------


def worker(variant: str, index: int, sysdb: str, redis_url: str, run: str, base_url: str,
           calls: int) -> None:
    import httpx
    from dbos import DBOS

    from rateloop import Policy, RateLoop, Route
    from rateloop.admission import Limiter
    from rateloop.errors import LimitsWarning
    from rateloop.integrations.dbos import (
        StepGaveUp,
        call_step,
        launch,
        queue_limits,
        register_queue,
    )

    # Only the main model's limits are configured; the far model's are learned: say it once
    # here rather than once per worker.
    warnings.filterwarnings("ignore", category=LimitsWarning)
    workload = dataclasses.replace(WORKLOAD, calls=calls)
    keys = _keys(run)
    log = ResultLog(redis_url, run)
    shared = redis.Redis.from_url(redis_url)
    client = httpx.Client(timeout=30)
    policy = Policy.from_dict({
        "pause_limit_secs": workload.pause_limit_secs,
        "limits": {f"openai:{MODEL}": {"requests_per_minute": workload.rpm,
                                       "burst": workload.burst_seconds / 60}},
        "admission": {"backend": redis_url},
    })

    if variant == "rateloop":
        loop = RateLoop(policy, limiter=Limiter.from_policy(policy, prefix=keys["limiter"]),
                        sinks=())

        @DBOS.workflow(name=WORKFLOW)
        def bench_call(i: int) -> str:
            route = Route(provider="openai", model=workload.model_for(i))
            try:
                result = call_step(
                    lambda r: request_completion(client, base_url, i, workload, model=r.model),
                    loop=loop, route=route, name="chat")
            except StepGaveUp as exc:
                log.record(i, exc.status)
                return exc.status
            log.add_asleep(i, result.asleep_secs)
            if result.durable_sleep_secs:
                shared.hincrbyfloat(keys["durable"], str(i), result.durable_sleep_secs)
            log.record(i, result.status, attempts=result.rounds)
            return result.status
    else:
        attempts: dict[int, int] = {}
        failed_at: dict[int, float] = {}

        @DBOS.step(name="chat", **ALONE_RETRIES)  # type: ignore[arg-type]
        def chat(i: int) -> str:
            if i in failed_at:  # DBOS slept between the attempts, inside the step
                log.add_asleep(i, time.time() - failed_at.pop(i))
            attempts[i] = attempts.get(i, 0) + 1
            try:
                return request_completion(client, base_url, i, workload)
            except Exception:
                failed_at[i] = time.time()
                raise

        @DBOS.workflow(name=WORKFLOW)
        def bench_call(i: int) -> str:
            try:
                chat(i)
                status = "completed"
            except Exception:
                status = "failed"
            log.record(i, status, attempts=attempts.pop(i, 1))
            return status

    launch({"name": "rateloop-bench", "system_database_url": sysdb,
            "executor_id": f"{variant}-{index}", "application_version": "bench",
            "sys_db_pool_size": 8, "log_level": "ERROR"})
    try:
        if variant == "rateloop":
            register_queue(QUEUE, queue_limits(policy, Route(provider="openai", model=MODEL)),
                           on_conflict="always_update")
        else:
            DBOS.register_queue(QUEUE, limiter=ALONE_LIMITER,  # type: ignore[arg-type]
                                on_conflict="always_update")
        shared.incr(keys["ready"])
        while not shared.exists(keys["stop"]):
            threading.Event().wait(0.5)
    finally:
        DBOS.destroy()
        client.close()


# --- the benchmark's process -------------------------------------------------------------


def _create_db(dsn: str, name: str) -> str:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return dsn.rsplit("/", 1)[0] + "/" + name


def _drop_db(dsn: str, name: str) -> None:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _wait(predicate: Any, timeout: float, what: str) -> None:
    stop = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > stop:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        threading.Event().wait(0.2)


def run_variant(variant: str, workload: Workload, args: argparse.Namespace
                ) -> tuple[dict[str, Any], dict[str, Any]]:
    from dbos import DBOSClient

    run = f"dbos-{variant}-{uuid.uuid4().hex[:8]}"
    keys = _keys(run)
    db = f"rateloop_bench_dbos_{uuid.uuid4().hex[:8]}"
    sysdb = _create_db(args.postgres, db)
    shared = redis.Redis.from_url(args.redis)
    log = ResultLog(args.redis, run)
    procs: list[subprocess.Popen[bytes]] = []
    client: DBOSClient | None = None
    try:
        with serve_provider(workload) as provider:
            # The first worker creates the system database's tables; the others then join.
            for index in range(workload.workers):
                procs.append(subprocess.Popen(
                    [sys.executable, __file__, "--worker", variant, str(index), sysdb, args.redis,
                     run, provider.base_url, str(workload.calls)],
                    start_new_session=True, env=dict(os.environ)))
                if index == 0:
                    _wait(lambda: int(shared.get(keys["ready"]) or 0) >= 1, 90, "worker 0")
            _wait(lambda: int(shared.get(keys["ready"]) or 0) >= workload.workers, 90,
                  "the workers")
            client = DBOSClient(system_database_url=sysdb)
            provider.begin()
            options = {"workflow_name": WORKFLOW, "queue_name": QUEUE}
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda i: client.enqueue(options, i),  # type: ignore[arg-type, union-attr]
                              range(workload.calls)))
            enqueued = time.time() - (provider.began or time.time())
            results = log.wait_all(workload.calls, timeout=args.timeout)
            name = "dbos + rateloop" if variant == "rateloop" else "dbos queue limiter alone"
            row = summarize(name, workload, provider, results)
            durable = sum(float(v) for v in shared.hvals(keys["durable"]))
            extra = {"engine variant": row["engine variant"],
                     "worker_s_asleep (in steps)": row["worker_s_asleep"],
                     "durable_sleep_s (DBOS.sleep)": round(durable, 1),
                     "enqueue_s": round(enqueued, 1),
                     "statuses": ",".join(row["statuses"])}
            return row, extra
    finally:
        shared.set(keys["stop"], 1)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        if client is not None:
            client.destroy()
        log.clear()
        for key in [*shared.scan_iter(match=keys["limiter"] + "*"), keys["ready"], keys["stop"],
                    keys["durable"]]:
            shared.delete(key)
        _drop_db(args.postgres, db)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        variant, index, sysdb, redis_url, run, base_url, calls = sys.argv[2:9]
        worker(variant, int(index), sysdb, redis_url, run, base_url, int(calls))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=WORKLOAD.calls)
    parser.add_argument("--variants", default="rateloop,alone")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--timeout", type=float, default=400.0,
                        help="seconds to wait for every call of a variant to end")
    args = parser.parse_args()
    workload = dataclasses.replace(WORKLOAD, calls=args.calls)
    rows, extras = [], []
    for variant in args.variants.split(","):
        if variant not in ("rateloop", "alone"):
            parser.error(f"--variants takes rateloop and/or alone, got {variant!r}")
        row, extra = run_variant(variant, workload, args)
        rows.append(row)
        extras.append(extra)
    print_table(rows)
    print()
    cols = list(extras[0])
    widths = {c: max(len(c), *(len(str(e[c])) for e in extras)) for c in cols}
    print(" | ".join(c.ljust(widths[c]) for c in cols))
    print("-|-".join("-" * widths[c] for c in cols))
    for e in extras:
        print(" | ".join(str(e[c]).ljust(widths[c]) for c in cols))


if __name__ == "__main__":
    main()
