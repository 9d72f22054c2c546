"""The Celery app the integration tests run in real ``celery worker`` processes (not collected).

Configured by the environment the test gives each worker (``RATELOOP_CELERY_*``): the
broker (Redis or RabbitMQ), the Redis result backend, the queue, the Redis key prefix
every key of the test lives under, and the FakeProvider's URL.  What the tasks do is
written to Redis under the prefix, so the test can count it across processes:

- ``deliveries:<task id>``: one JSON entry per delivery's verdict (``on_outcome``);
- ``effects:<key>``: one entry (the worker's pid) each time ``post``'s side effect is
  *performed*: the destination honours no key, so two entries of one key are a repeat;
- ``checks:<key>``: one entry per call of ``post``'s ``outcome_check``;
- ``died:<key>``: set by the delivery of ``post`` that SIGKILLed its own worker.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import httpx
import redis
from celery import Celery

from rateloop import Policy, Route
from rateloop.admission import Limiter
from rateloop.integrations._engine import EngineVerdict, RetryLater
from rateloop.integrations.celery import WriteKeys, configure, rateloop_task
from rateloop.tasks import StepContext

PREFIX = os.environ.get("RATELOOP_CELERY_PREFIX", "rateloop-test:celery:")
REDIS_URL = os.environ.get("RATELOOP_CELERY_REDIS", "redis://127.0.0.1:6379/0")
PROVIDER = os.environ.get("RATELOOP_CELERY_PROVIDER", "http://127.0.0.1:9/v1")
PAUSE_LIMIT_SECS = 1.0

app = Celery(
    "celery_app",
    broker=os.environ.get("RATELOOP_CELERY_BROKER", REDIS_URL),
    backend=os.environ.get("RATELOOP_CELERY_BACKEND", REDIS_URL),
)
configure(app)
app.conf.update(
    task_default_queue=os.environ.get("RATELOOP_CELERY_QUEUE", "rateloop-test"),
    broker_transport_options={"global_keyprefix": PREFIX, "visibility_timeout": 30},
    result_backend_transport_options={"global_keyprefix": PREFIX},
    worker_enable_remote_control=False,
    result_expires=600,
)

policy = Policy.from_dict({"pause_limit_secs": PAUSE_LIMIT_SECS, "max_attempts": 10,
                           "admission": {"backend": REDIS_URL}})
_redis = redis.Redis.from_url(REDIS_URL)


def _limiter() -> Limiter:
    return Limiter.from_policy(policy, prefix=PREFIX + "adm:")


def record(task: Any, verdict: EngineVerdict) -> None:
    _redis.rpush(PREFIX + "deliveries:" + task.request.id, json.dumps({
        "retries": task.request.retries, "verdict": type(verdict).__name__,
        "status": verdict.outcome.status.value,
        "delay": verdict.delay_secs if isinstance(verdict, RetryLater) else None,
        "waited": verdict.outcome.waited_secs, "at": time.time(), "pid": os.getpid(),
    }))


@rateloop_task(app, route=Route(provider="openai", model="gpt-4o-mini"), policy=policy,
               limiter=_limiter, on_outcome=record, name="celery_app.ask")
def ask(route: Route, i: int) -> str:
    with httpx.Client(timeout=10) as client:
        response = client.post(
            PROVIDER + "/chat/completions", headers={"authorization": "Bearer sk-test"},
            json={"model": route.model, "max_tokens": 5,
                  "messages": [{"role": "user", "content": f"item {i}"}]})
    response.raise_for_status()
    return str(response.json()["choices"][0]["message"]["content"])


def _die_once(key: str) -> None:
    """SIGKILL this whole worker (its main process and pool), once per key."""
    if _redis.set(PREFIX + "died:" + key, os.getpid(), nx=True):
        os.killpg(os.getpgid(0), signal.SIGKILL)


def landed(ctx: StepContext, route: Route) -> bool:
    found = bool(_redis.llen(PREFIX + "effects:" + ctx.idempotency_key))
    _redis.rpush(PREFIX + "checks:" + ctx.idempotency_key, int(found))
    return found


@rateloop_task(app, route=Route(provider="acme", model="ledger"), policy=policy,
               limiter=_limiter, idempotent=False, outcome_check=landed, on_outcome=record,
               write_keys=WriteKeys(REDIS_URL, prefix=PREFIX + "write:"),
               name="celery_app.post")
def post(route: Route, i: int, die: str | None = None, *, idempotency_key: str) -> str:
    if die == "before":
        _die_once(idempotency_key)
    _redis.rpush(PREFIX + "effects:" + idempotency_key, os.getpid())
    if die == "after":
        _die_once(idempotency_key)
    time.sleep(0.05)  # a write takes a moment: a kill from outside lands inside some
    return f"posted {i}"


@rateloop_task(app, route=Route(provider="openai", model="gpt-4o-mini"), policy=policy,
               limiter=_limiter, on_outcome=record, name="celery_app.invalid")
def invalid(route: Route) -> str:
    request = httpx.Request("POST", PROVIDER + "/chat/completions")
    response = httpx.Response(400, request=request, json={"error": {
        "message": "Invalid 'messages': empty array.", "type": "invalid_request_error",
        "code": "empty_array"}})
    raise httpx.HTTPStatusError("400 Bad Request", request=request, response=response)
