"""Tasks for the worker processes of the crash and CLI tests (``rateloop worker --app``).

Not tests: pytest collects nothing here.  The steps count what they do in a
SQLite file the tests own (``RATELOOP_TEST_EFFECTS``): ``executions`` gets a
row every time a step body starts, ``effects`` one row per *distinct*
idempotency key, written the way an idempotent provider or database would
(insert unless the key is there).  A step that kills its own process with
SIGKILL is a real ``kill -9`` at an exact point.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from typing import Any

import httpx

from rateloop import Route
from rateloop.tasks import StepContext, task

ROUTE = Route(provider="openai", model="gpt-test")
VERSION = os.environ.get("RATELOOP_TEST_APP_VERSION", "1")


def effects_db() -> sqlite3.Connection:
    conn = sqlite3.connect(os.environ["RATELOOP_TEST_EFFECTS"], timeout=30, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")  # durable across kill -9, the fault tested here
    return conn


def init_effects(path: str) -> None:
    os.environ["RATELOOP_TEST_EFFECTS"] = path
    with effects_db() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS executions (task_id TEXT, step TEXT, pid INT)")
        conn.execute("CREATE TABLE IF NOT EXISTS effects (key TEXT, task_id TEXT, step TEXT)")


def _executed(ctx: StepContext) -> int:
    """Record that this step's body started; how many times it has, this one included."""
    conn = effects_db()
    try:
        conn.execute(
            "INSERT INTO executions VALUES (?, ?, ?)", (ctx.task_id, ctx.step, os.getpid())
        )
        (n,) = conn.execute(
            "SELECT COUNT(*) FROM executions WHERE task_id = ? AND step = ?",
            (ctx.task_id, ctx.step),
        ).fetchone()
        return int(n)
    finally:
        conn.close()


def _write(ctx: StepContext) -> None:
    """The side effect, idempotent by the step's key (as a provider honouring it would be)."""
    conn = effects_db()
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO effects SELECT ?, ?, ? WHERE NOT EXISTS "
            "(SELECT 1 FROM effects WHERE key = ?)",
            (ctx.idempotency_key, ctx.task_id, ctx.step, ctx.idempotency_key),
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _limited(retry_after: str) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "https://api.openai.com/v1/chat/completions")
    body = {"error": {"message": "Rate limit reached", "type": "requests",
                      "code": "rate_limit_exceeded"}}
    response = httpx.Response(
        429, headers={"retry-after": retry_after}, json=body, request=request
    )
    return httpx.HTTPStatusError("429", request=request, response=response)


durable = task("durable", version=VERSION)


@durable.step()
def prepare(ctx: StepContext) -> dict[str, Any]:
    _executed(ctx)
    _write(ctx)
    if ctx.args.get("mode") == "slow_first":
        time.sleep(float(ctx.args.get("sleep", 1.0)))
    return {"prepared": ctx.task_id}


@durable.step(route=ROUTE, operation="model.generate")
def write(ctx: StepContext, route: Route) -> dict[str, Any]:
    n = _executed(ctx)
    mode = ctx.args.get("mode", "plain")
    if mode == "kill_then_limit":
        if n == 1:
            _kill_self()  # after step 1's checkpoint, before this step's wait is stored
        if n == 2:
            raise _limited("2")
    if mode == "kill_mid_step":
        _write(ctx)
        if n == 1:
            _kill_self()  # the side effect is done, the checkpoint is not
    if mode == "limit_once" and n == 1:
        raise _limited("2")
    if mode == "chaos":
        time.sleep(0.004)
    _write(ctx)
    assert ctx.results["prepare"] == {"prepared": ctx.task_id}
    return {"written": ctx.idempotency_key}
