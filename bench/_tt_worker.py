"""One token-throttle worker process of ``fleet_bench.py`` (run by a Python >= 3.12).

token-throttle needs Python >= 3.12 while the project runs on 3.11, so the
fleet bench starts this script with the peer interpreter
(``bench/.venv-peers``, made by ``python bench/fleet_bench.py --setup-peers``)
instead of a ``multiprocessing`` worker.  It imports nothing from rateloop.

Protocol, one JSON document per line:

* stdin, first line: ``{"url", "cfg", "processes", "tasks", "prefix"}`` (``tasks``:
  this process's share, each task a list of ``[input, max_tokens, output]``);
* stdout: ``{"ready": true}`` once the limiter, the SDK client and (on Redis)
  the connection are up;
* stdin, second line: ``{"t0": <epoch seconds>}``: the clock has started;
* stdout: ``{"ok": [[seconds since t0, task completed], ...]}`` or ``{"error": "..."}``.

token-throttle is used as its README says for OpenAI-style calls with exact
provider-side counts ("Any provider" + ``refund_capacity_from_response``):
one ``RateLimiter`` per process with ``requests`` and ``tokens`` quotas per
minute (the fleet's rpm / tpm), the memory backend in one process and the
Redis backend (one shared ``key_prefix``) across processes; each call
reserves ``requests: 1, tokens: input + max_tokens`` before it is sent and
refunds from the response's ``usage.total_tokens`` after it.  Residual 429s
are retried by the openai SDK (its default ``max_retries=2``, honouring
``retry-after`` / ``retry-after-ms``), as token-throttle's example recommends
instead of a second retry loop; a call that still fails refunds
``requests: 1, tokens: 0`` (the README's error path) and fails its task.  A
refund that raises ``BackendLockContentionError`` (Redis, hot bucket) is retried,
as its operations guide says (up to 10 attempts).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import openai
from token_throttle import (
    BackendLockContentionError,
    MemoryBackendBuilder,
    PerModelConfig,
    Quota,
    RateLimiter,
    RedisBackendBuilder,
    SecondsIn,
    UsageQuotas,
)

MODEL = "fake-model"


def _emit(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


async def _work(spec: dict[str, Any]) -> list[tuple[float, bool]]:
    cfg, processes = spec["cfg"], spec["processes"]
    # The limits token-throttle is told: the provider's, unless --peer-limit-share
    # asks for headroom (1.0 by default: the same limits as every other strategy).
    share = float(cfg.get("peer_limit_share", 1.0))
    rpm, tpm = int(cfg["rpm"] * share), int(cfg["tpm"] * share)
    quotas = [
        Quota(metric="requests", limit=rpm, per_seconds=SecondsIn.MINUTE),
        Quota(metric="tokens", limit=tpm, per_seconds=SecondsIn.MINUTE),
    ]
    if spec.get("burst_quotas"):
        # token-throttle-burst: also told the provider's burst, as composed quotas
        # over the burst window ("Minimum spacing between calls" in its README).
        window = max(1, round(cfg["burst"]))
        quotas += [
            Quota(metric="requests", limit=rpm * window // 60, per_seconds=window),
            Quota(metric="tokens", limit=tpm * window // 60, per_seconds=window),
        ]
    redis_client = None
    if processes > 1:
        import redis.asyncio as redis

        redis_client = redis.from_url(cfg["redis"])
        await redis_client.ping()
        backend: Any = RedisBackendBuilder(redis_client, key_prefix=spec["prefix"])
    else:
        backend = MemoryBackendBuilder()
    limiter = RateLimiter(PerModelConfig(quotas=UsageQuotas(quotas)), backend=backend)
    sdk = openai.AsyncOpenAI(base_url=spec["url"] + "/v1", api_key="fake", timeout=60)
    gate = asyncio.Semaphore(cfg["slots"])

    async def call(inp: int, cap: int, out: int) -> bool:
        reservation = await limiter.acquire_capacity(
            usage={"requests": 1, "tokens": inp + cap}, model=MODEL
        )
        try:
            response = await sdk.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=cap,
                extra_headers={"x-fake-input-tokens": str(inp),
                               "x-fake-output-tokens": str(out)},
            )
        except openai.APIError:
            await refund(lambda: limiter.refund_capacity(
                actual_usage={"requests": 1, "tokens": 0}, reservation=reservation))
            return False
        await refund(lambda: limiter.refund_capacity_from_response(reservation, response))
        return True

    async def refund(attempt: Any) -> None:
        # A refund that loses the Redis backend's per-bucket lock raises
        # BackendLockContentionError, "safe to retry" (docs/operations.md): retried.
        for left in range(9, -1, -1):
            try:
                return await attempt()
            except BackendLockContentionError:
                if not left:
                    raise

    _emit({"ready": True})
    line = await asyncio.to_thread(sys.stdin.readline)
    t0 = float(json.loads(line)["t0"])

    async def task(calls: list[list[int]]) -> tuple[float, bool]:
        async with gate:
            for inp, cap, out in calls:
                if not await call(inp, cap, out):
                    return time.time() - t0, False
            return time.time() - t0, True

    try:
        return list(await asyncio.gather(*(task(t) for t in spec["tasks"])))
    finally:
        await sdk.close()
        await limiter.aclose()
        if redis_client is not None:
            await redis_client.aclose()


def main() -> None:
    spec = json.loads(sys.stdin.readline())
    try:
        _emit({"ok": asyncio.run(_work(spec))})
    except BaseException as exc:  # reported to the parent, which prints it
        _emit({"error": f"{type(exc).__name__}: {exc}"})


if __name__ == "__main__":
    main()
