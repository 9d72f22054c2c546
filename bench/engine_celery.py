"""Celery: rateloop inside the task vs Celery's own tools alone, on the shared engine workload.

    PYTHONPATH=src python bench/engine_celery.py [--calls N]

One run, two rows (bench/_engine_workload.py: 1,000 calls, 5 % of them on a model whose day
quota resets 60 s after the start, far beyond the 5 s pause limit):

- ``celery + rateloop``: ``rateloop_task`` (rateloop.integrations.celery) with zero-config
  admission shared in Redis by the workers, a 5 s pause limit; waits past it go back to
  Celery as retry countdowns;
- ``celery alone``: ``rate_limit="150/m"`` (the provider's 600/min split over the 4 workers:
  Celery's rate limit is per worker) + ``autoretry_for=(httpx.HTTPStatusError,)`` with
  ``retry_backoff=True`` (1, 2, 4 ... s, full jitter, at most 600 s) and ``max_retries=10``.

Each row runs 4 worker processes: 4 ``celery worker --concurrency=1`` (prefork, one pool
process each), ``worker_prefetch_multiplier=1`` and ``acks_late``, the broker and the result
store in the Redis at 127.0.0.1:6379 (a queue and key prefix of the run's own).  This file is
also the workers' app (``celery -A engine_celery``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import redis
from _engine_workload import (
    FAR_MODEL,
    MODEL,
    WORKLOAD,
    ResultLog,
    Workload,
    print_table,
    request_completion,
    serve_provider,
    summarize,
)
from celery import Celery
from celery.signals import worker_ready

from rateloop import Policy, Route
from rateloop.admission import Limiter
from rateloop.integrations.celery import Finish, GiveUp, configure, rateloop_task

REDIS_URL = os.environ.get("RATELOOP_BENCH_REDIS", "redis://127.0.0.1:6379/0")
RUN = os.environ.get("RATELOOP_BENCH_RUN") or uuid.uuid4().hex[:8]
PREFIX = f"rateloop-bench:engines:{RUN}:"
HERE = Path(__file__).resolve().parent

app = configure(Celery("engine_celery", broker=REDIS_URL, backend=REDIS_URL))
app.conf.update(
    broker_transport_options={"global_keyprefix": PREFIX},
    result_backend_transport_options={"global_keyprefix": PREFIX},
    worker_enable_remote_control=False,
    task_ignore_result=True,  # the ResultLog is the record
)



@worker_ready.connect
def _ready(sender: Any = None, **_: Any) -> None:
    with redis.Redis.from_url(REDIS_URL) as r:
        r.sadd(PREFIX + "ready", str(sender.hostname))


_logs: dict[str, ResultLog] = {}
_client = threading.local()


def _log(run_id: str) -> ResultLog:
    if run_id not in _logs:
        _logs[run_id] = ResultLog(REDIS_URL, run_id)
    return _logs[run_id]


def _http() -> httpx.Client:
    if getattr(_client, "c", None) is None:
        _client.c = httpx.Client(timeout=30)
    return _client.c  # type: ignore[no-any-return]


# --- celery + rateloop ---------------------------------------------------------------------

policy = Policy.from_dict({"pause_limit_secs": WORKLOAD.pause_limit_secs,
                           "admission": {"backend": REDIS_URL}})


def _limiter() -> Limiter:  # one per worker process, shared through Redis
    return Limiter.from_policy(policy, prefix=PREFIX + "adm:")


def _seen(task: Any, verdict: Any) -> None:
    _base_url, run_id, i = task.request.args
    log = _log(run_id)
    log.add_asleep(i, verdict.outcome.waited_secs)
    if isinstance(verdict, Finish | GiveUp):
        status = verdict.outcome.status.value
        log.record(i, status, attempts=task.request.retries + 1)


def _call(route: Route, base_url: str, run_id: str, i: int) -> str:
    return request_completion(_http(), base_url, i, model=route.model)


ask_rateloop = rateloop_task(app, route=Route(provider="openai", model=MODEL), policy=policy,
                             limiter=_limiter, on_outcome=_seen, name="bench.ask_rateloop",
                             ignore_result=True)(_call)
ask_far_rateloop = rateloop_task(app, route=Route(provider="openai", model=FAR_MODEL),
                                 policy=policy, limiter=_limiter, on_outcome=_seen,
                                 name="bench.ask_far_rateloop", ignore_result=True)(_call)


# --- celery alone -----------------------------------------------------------------------------


class _Recorded(app.Task):  # type: ignore[misc, name-defined]
    def on_failure(self, exc: Any, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        _base_url, run_id, i = args
        _log(run_id).record(i, "failed", attempts=self.request.retries + 1)


@app.task(base=_Recorded, bind=True, name="bench.ask_alone", rate_limit="150/m",
          autoretry_for=(httpx.HTTPStatusError,), retry_backoff=True, retry_backoff_max=600,
          retry_jitter=True, max_retries=10, ignore_result=True)
def ask_alone(self: Any, base_url: str, run_id: str, i: int) -> str:
    value = request_completion(_http(), base_url, i)
    _log(run_id).record(i, "completed", attempts=self.request.retries + 1)
    return value


# --- the run ----------------------------------------------------------------------------------


@contextlib.contextmanager
def workers(queue: str, n: int) -> Iterator[None]:
    """``n`` ``celery worker --concurrency=1`` processes on ``queue``; all stopped after."""
    env = {**os.environ, "RATELOOP_BENCH_RUN": RUN,
           "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent / "src")])}
    logs = [Path(f"/tmp/rateloop-bench-celery-{RUN}-{queue}-{k}.log") for k in range(n)]
    procs = []
    for k, path in enumerate(logs):
        with open(path, "wb") as out:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "engine_celery", "worker", "-Q", queue,
                 "--concurrency=1", "--pool=prefork", "--loglevel=WARNING", "-n",
                 f"w{k}-{queue}@%h", "--without-gossip", "--without-mingle",
                 "--without-heartbeat"],
                cwd=HERE, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True))
    try:
        ready = redis.Redis.from_url(REDIS_URL)
        deadline = time.monotonic() + 60
        while ready.scard(PREFIX + "ready") < n and time.monotonic() < deadline:
            time.sleep(0.2)
        ready.delete(PREFIX + "ready")
        ready.close()
        yield
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        for path in logs:
            path.unlink(missing_ok=True)


def run_variant(name: str, workload: Workload) -> dict[str, Any]:
    queue = f"{name.replace(' ', '-').replace('+', 'and')}-{uuid.uuid4().hex[:6]}"
    run_id = f"{RUN}-{queue}"
    log = _log(run_id)
    log.clear()
    with serve_provider(workload) as provider, workers(queue, workload.workers):
        base_url = provider.base_url
        provider.begin()
        for i in range(workload.calls):
            if name == "celery alone":
                ask_alone.apply_async(args=(base_url, run_id, i), queue=queue)
            else:
                task = ask_far_rateloop if workload.model_for(i) == FAR_MODEL else ask_rateloop
                task.apply_async(args=(base_url, run_id, i), queue=queue)
        results = log.wait_all(workload.calls, timeout=600)
        row = summarize(name, workload, provider, results)
    log.clear()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=WORKLOAD.calls)
    args = parser.parse_args()
    workload = Workload(calls=args.calls)
    started = time.monotonic()
    rows = [run_variant("celery + rateloop", workload), run_variant("celery alone", workload)]
    print_table(rows)
    print(f"statuses: {[(r['engine variant'], r['statuses']) for r in rows]}; "
          f"{time.monotonic() - started:.0f} s in all")
    client = redis.Redis.from_url(REDIS_URL)  # the run's own keys, gone
    for key in client.scan_iter(match=PREFIX + "*", count=1000):
        client.delete(key)
    client.close()


if __name__ == "__main__":
    os.environ.setdefault("RATELOOP_BENCH_RUN", RUN)
    main()
