"""Durable tasks: tasks per second through SQLite and PostgreSQL, 1 and 4 workers; checkpoint cost.

Usage::

    python bench/tasks_bench.py [--tasks 1000] [--engines sqlite,sqlite-full,postgres]
        [--postgres postgresql://postgres@127.0.0.1:5432/test] [--json out.json]

Throughput: ``--tasks`` tasks of two no-op local steps are submitted, then 1
or 4 worker *processes* (each its own store connection and ``TaskRunner``)
run them until the queue is empty.  A task costs one claim, one checkpoint
after its first step and one final save: the numbers are the store's, not a
provider's.  Time runs from the moment all workers are ready to the last one
finding the queue empty.

Checkpoint latency: the time of one ``store.save`` of a realistic checkpoint
(two completed steps with small results, a limit signal, a pending
operation), median and p99 over 500 saves by one connection.  That is what a
step pays on top of its own work.

``sqlite`` is the default (WAL, ``synchronous=NORMAL``); ``sqlite-full`` adds
one fsync per commit (``?synchronous=full``).  PostgreSQL runs in a schema
of its own that is dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import tempfile
import time
import uuid
from dataclasses import replace
from datetime import timedelta
from typing import Any

from rateloop.signal import Kind, LimitSignal
from rateloop.tasks import (
    CompletedStep,
    PendingOperation,
    QueuePolicy,
    StepContext,
    Task,
    TaskRegistry,
    TaskRunner,
    open_store,
)

POLICY = QueuePolicy(max_depth=1_000_000)


def _definition() -> Task:
    t = Task("bench")

    @t.step()
    def first(ctx: StepContext) -> dict[str, int]:
        return {"n": 1}

    @t.step()
    def second(ctx: StepContext) -> dict[str, int]:
        return {"n": 2}

    return t


def _worker(url: str, ready: Any, go: Any, done: Any) -> None:
    store = open_store(url)
    runner = TaskRunner(store, tasks=TaskRegistry([_definition()]), policy=POLICY)
    ready.release()
    go.wait()
    n = len(runner.run_until_idle())
    store.close()
    done.put(n)


def throughput(url: str, tasks: int, workers: int) -> float:
    store = open_store(url)
    runner = TaskRunner(store, tasks=TaskRegistry([_definition()]), policy=POLICY)
    definition = runner.tasks.get("bench")
    assert definition is not None
    for _ in range(tasks):
        runner.submit(definition)
    store.close()
    ctx = mp.get_context("fork")
    ready, go, done = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(url, ready, go, done)) for _ in range(workers)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.acquire()
    start = time.perf_counter()
    go.set()
    ran = sum(done.get() for _ in procs)
    elapsed = time.perf_counter() - start
    for p in procs:
        p.join()
    assert ran == tasks, f"ran {ran} of {tasks}"
    return tasks / elapsed


def checkpoint_latency(url: str, saves: int = 500) -> tuple[float, float]:
    store = open_store(url)
    runner = TaskRunner(store, tasks=TaskRegistry([_definition()]), policy=POLICY)
    definition = runner.tasks.get("bench")
    assert definition is not None
    runner.submit(definition, {"doc": "ref:1"})
    rec = store.claim("bench", lease_secs=600)
    assert rec is not None
    now = rec.created_at
    signal = LimitSignal.of(Kind.TEMPORARY, retry_after=20.0, status=429, provider="openai",
                            scope="openai:gpt-5", matched="retry-after")
    ck = replace(
        rec.checkpoint,
        current_step=1,
        completed_steps=(CompletedStep(index=0, name="first", status="completed",
                                       result={"summary_ref": "blob:1", "tokens": 812},
                                       attempts=2),),
        pending_operation=PendingOperation(step="second", operation="model.generate",
                                           scope="openai:gpt-5", cost={"requests": 1,
                                                                       "input_tokens": 2000,
                                                                       "output_tokens": 500}),
        signal=signal,
        next_attempt_at=now + timedelta(seconds=20),
    )
    rec = replace(rec, checkpoint=ck)
    times = []
    for _ in range(saves):
        t0 = time.perf_counter()
        ok = store.save(rec, fence=rec.fence)
        times.append(time.perf_counter() - t0)
        assert ok
    store.close()
    times.sort()
    return statistics.median(times) * 1000, times[int(len(times) * 0.99) - 1] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--engines", default="sqlite,sqlite-full,postgres")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--json")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    print(f"{'engine':<12} {'1 worker':>12} {'4 workers':>12} {'ckpt p50':>10} {'ckpt p99':>10}")
    for engine in args.engines.split(","):
        row: dict[str, Any] = {"engine": engine, "tasks": args.tasks}
        schema = None
        for workers in (1, 4):
            tmp = tempfile.mkdtemp(prefix="rateloop-bench-")
            if engine == "postgres":
                schema = f"rateloop_bench_{uuid.uuid4().hex[:8]}"
                url = f"{args.postgres}?schema={schema}"
            else:
                sync = "full" if engine == "sqlite-full" else "normal"
                url = f"sqlite:///{tmp}/tasks.db?synchronous={sync}"
            try:
                row[f"tasks_per_sec_{workers}w"] = round(throughput(url, args.tasks, workers), 1)
                if workers == 1:
                    p50, p99 = checkpoint_latency(url)
                    row["checkpoint_ms_p50"] = round(p50, 3)
                    row["checkpoint_ms_p99"] = round(p99, 3)
            finally:
                if schema is not None:
                    from rateloop.tasks.postgres_store import PostgresTaskStore

                    cleaner = PostgresTaskStore(args.postgres, schema=schema)
                    cleaner.drop()
                    cleaner.close()
        rows.append(row)
        print(f"{engine:<12} {row['tasks_per_sec_1w']:>10.0f}/s {row['tasks_per_sec_4w']:>10.0f}/s "
              f"{row['checkpoint_ms_p50']:>8.2f}ms {row['checkpoint_ms_p99']:>8.2f}ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
