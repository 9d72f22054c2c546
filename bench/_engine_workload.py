"""The one workload every engine benchmark runs (bench/engine_*.py), so their tables compare.

1,000 model calls from 4 worker processes against a ``FakeProvider`` (OpenAI-shaped) served over
HTTP on 127.0.0.1 by the benchmark's own process, limits scaled so the run takes 1–3 minutes.
One call in twenty (5 %) asks a model whose day quota is spent until ``far_reset_secs`` after
the run starts: a reset far beyond the pause limit, which a worker must not sleep through.

Workers record each call's end in Redis (:class:`ResultLog`); the benchmark's process waits for
all of them, then :func:`summarize` reads the provider's counters and prints one row:
completed / lost, completion time against the quota-bound ideal, refusals per success, and the
worker-seconds spent asleep inside tasks (slots held while waiting).

    with serve_provider(WORKLOAD) as provider:       # in the benchmark's process
        ... start workers, enqueue WORKLOAD.calls calls, provider.begin() ...
        rows.append(summarize("celery + rateloop", WORKLOAD, provider, log.wait_all(...)))
    print_table(rows)

A worker makes call ``i`` with :func:`request_completion` (``raise_for_status`` on refusal:
the engines' own retry tools and rateloop's loop both read ``httpx.HTTPStatusError``).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import redis

from rateloop.testing import FakeProvider, FakeProviderServer
from rateloop.testing._fake.model import FakeRequest, FakeResponse

MODEL = "gpt-4o-mini"
FAR_MODEL = "gpt-4o-far"  # its day quota is spent until far_reset_secs after begin()


@dataclass(frozen=True, slots=True)
class Workload:
    calls: int = 1000
    workers: int = 4
    far_every: int = 20          # call i asks FAR_MODEL when i % far_every == 0: 5 %
    rpm: int = 600               # 10 requests a second: ~95 s for 1,000 calls
    burst_seconds: float = 5.0   # the provider's bucket holds 5 s of requests at the start
    far_reset_secs: float = 60.0  # far beyond the pause limit below
    pause_limit_secs: float = 5.0
    latency: float = 0.05
    max_tokens: int = 16

    def model_for(self, i: int) -> str:
        return FAR_MODEL if i % self.far_every == 0 else MODEL

    @property
    def far_calls(self) -> int:
        return len(range(0, self.calls, self.far_every))

    def ideal_secs(self) -> float:
        """The quota-bound ideal: every call within the requests bucket, far ones after reset."""
        rate = self.rpm / 60.0
        bucket_bound = max(self.calls - rate * self.burst_seconds, 0.0) / rate
        return max(bucket_bound, self.far_reset_secs) + self.latency


WORKLOAD = Workload()


class _FarResetProvider(FakeProvider):
    """A FakeProvider whose FAR_MODEL has its day quota spent until ``far_until``."""

    def __init__(self, workload: Workload) -> None:
        super().__init__(profile="openai", rpm=workload.rpm, burst_seconds=workload.burst_seconds,
                         latency=workload.latency)
        self.far_until: float | None = None  # monotonic; None before begin(): still spent
        self._far_secs = workload.far_reset_secs

    def _open(self, request: FakeRequest) -> tuple[FakeResponse, Any]:
        if request.model == FAR_MODEL:
            now = self.clock.monotonic()
            left = self._far_secs if self.far_until is None else self.far_until - now
            if left > 0:
                with self._lock:
                    self.stats.attempts += 1
                    self._next_id += 1
                    return self._refuse("openai", "requests_per_day", FAR_MODEL,
                                        f"req_far{self._next_id:08d}", left, 1000, 1), None
        return super()._open(request)


class Provider:
    """The running provider: ``base_url`` (ends in ``/v1``), ``stats``, ``begin()``."""

    def __init__(self, server: FakeProviderServer, provider: _FarResetProvider) -> None:
        self._server, self._provider = server, provider
        self.began: float | None = None  # wall time (time.time()) of begin()

    @property
    def base_url(self) -> str:
        return self._server.url + "/v1"

    @property
    def stats(self) -> Any:
        return self._provider.stats

    def begin(self) -> None:
        """The run starts now: the far model's quota resets ``far_reset_secs`` from now."""
        self._provider.far_until = self._provider.clock.monotonic() + self._provider._far_secs
        self.began = time.time()


@contextlib.contextmanager
def serve_provider(workload: Workload = WORKLOAD) -> Iterator[Provider]:
    provider = _FarResetProvider(workload)
    with FakeProviderServer(provider) as server:
        yield Provider(server, provider)


def request_completion(client: httpx.Client, base_url: str, i: int,
                       workload: Workload = WORKLOAD, *, model: str | None = None) -> str:
    """Call ``i``: one chat completion; raises ``httpx.HTTPStatusError`` on a refusal."""
    response = client.post(
        base_url + "/chat/completions",
        headers={"authorization": "Bearer sk-bench"},
        json={"model": model or workload.model_for(i), "max_tokens": workload.max_tokens,
              "messages": [{"role": "user", "content": f"item {i}"}]},
    )
    response.raise_for_status()
    return str(response.json()["choices"][0]["message"]["content"])


async def arequest_completion(client: httpx.AsyncClient, base_url: str, i: int,
                              workload: Workload = WORKLOAD, *, model: str | None = None) -> str:
    """The asyncio twin of :func:`request_completion`."""
    response = await client.post(
        base_url + "/chat/completions",
        headers={"authorization": "Bearer sk-bench"},
        json={"model": model or workload.model_for(i), "max_tokens": workload.max_tokens,
              "messages": [{"role": "user", "content": f"item {i}"}]},
    )
    response.raise_for_status()
    return str(response.json()["choices"][0]["message"]["content"])


@dataclass(frozen=True, slots=True)
class Result:
    i: int
    status: str           # "completed", "degraded", or the terminal state the worker saw
    finished_at: float    # wall time (time.time())
    asleep_secs: float    # seconds the worker slept inside the task for this call (all attempts)
    attempts: int         # engine attempts (deliveries) of this call


class ResultLog:
    """Each call's end, written by the workers to Redis, read by the benchmark's process."""

    def __init__(self, redis_url: str, run_id: str) -> None:
        self._redis = redis.Redis.from_url(redis_url)
        self.key = f"rateloop-bench:engines:{run_id}:results"
        self.asleep_key = f"rateloop-bench:engines:{run_id}:asleep"
        self.trace_key = f"rateloop-bench:engines:{run_id}:trace"
        self.ready_key = f"rateloop-bench:engines:{run_id}:ready"

    def add_asleep(self, i: int, seconds: float) -> None:
        """A worker slept ``seconds`` inside the task of call ``i`` (any attempt)."""
        if seconds > 0:
            self._redis.hincrbyfloat(self.asleep_key, str(i), seconds)

    def worker_ready(self) -> None:
        """A worker process is up and taking work."""
        self._redis.incr(self.ready_key)

    def wait_ready(self, n: int, *, timeout: float, poll: float = 0.2) -> bool:
        """Wait until ``n`` workers said they are ready; False when ``timeout`` passed first."""
        stop = time.monotonic() + timeout
        while int(self._redis.get(self.ready_key) or 0) < n:
            if time.monotonic() >= stop:
                return False
            threading.Event().wait(poll)
        return True

    def trace(self, i: int, fields: dict[str, Any]) -> None:
        """One engine attempt of call ``i``, for a benchmark's ``--trace`` breakdown."""
        self._redis.rpush(self.trace_key, json.dumps({"i": i, **fields}))

    def traces(self) -> list[dict[str, Any]]:
        return [json.loads(v) for v in self._redis.lrange(self.trace_key, 0, -1)]

    def record(self, i: int, status: str, *, attempts: int = 1) -> None:
        """Call ``i`` ended (the first end counts: a redelivered duplicate does not overwrite)."""
        self._redis.hsetnx(self.key, str(i), json.dumps(
            {"status": status, "finished_at": time.time(), "attempts": attempts}))

    def wait_all(self, n: int, *, timeout: float, poll: float = 0.5) -> list[Result]:
        """Wait until ``n`` calls ended or ``timeout`` seconds passed; the ends seen."""
        stop = time.monotonic() + timeout
        while self._redis.hlen(self.key) < n and time.monotonic() < stop:
            threading.Event().wait(poll)
        return self.results()

    def results(self) -> list[Result]:
        asleep = {int(k): float(v) for k, v in self._redis.hgetall(self.asleep_key).items()}
        out = []
        for k, v in self._redis.hgetall(self.key).items():
            d = json.loads(v)
            out.append(Result(int(k), d["status"], d["finished_at"], asleep.get(int(k), 0.0),
                              d["attempts"]))
        return sorted(out, key=lambda r: r.i)

    def clear(self) -> None:
        self._redis.delete(self.key, self.asleep_key, self.trace_key, self.ready_key)


def summarize(name: str, workload: Workload, provider: Provider,
              results: list[Result]) -> dict[str, Any]:
    """One row of the table: what finished, how fast against the ideal, at what cost."""
    done = [r for r in results if r.status in ("completed", "degraded")]
    began = provider.began or min((r.finished_at for r in results), default=time.time())
    wall = (max(r.finished_at for r in done) - began) if done else float("nan")
    served = provider.stats.served
    refused = provider.stats.refused
    return {
        "engine variant": name,
        "completed": len(done),
        "ended otherwise": len(results) - len(done),
        "lost": workload.calls - len(results),
        "time_s": round(wall, 1),
        "ideal_s": round(workload.ideal_secs(), 1),
        "efficiency": round(workload.ideal_secs() / wall, 2) if done else 0.0,
        "refusals_per_success": round(refused / served, 2) if served else float("inf"),
        "worker_s_asleep": round(sum(r.asleep_secs for r in results), 1),
        "engine_attempts": sum(r.attempts for r in results),
        "statuses": sorted({r.status for r in results}),
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    cols = ["engine variant", "completed", "ended otherwise", "lost", "time_s", "ideal_s",
            "efficiency", "refusals_per_success", "worker_s_asleep", "engine_attempts"]
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    print(" | ".join(c.ljust(widths[c]) for c in cols))
    print("-|-".join("-" * widths[c] for c in cols))
    for r in rows:
        print(" | ".join(str(r[c]).ljust(widths[c]) for c in cols))
