"""A five-step task for the kill -9 campaigns (``rateloop worker --app``; not collected by pytest).

Used by ``tests/test_tasks_campaign.py`` and ``bench/tasks_campaign.py``.  The
steps write what they do in a SQLite file the caller owns
(``RATELOOP_CAMPAIGN_EFFECTS``), in WAL mode so that a row survives the
``kill -9`` of the process that wrote it:

- ``boots``: one row per worker process that imported this module;
- ``executions``: one row every time a step body starts (task, step, pid);
- ``effects``: one row every time a keyed side effect is *performed*, key and
  pid included (the idempotent steps: a provider honouring the key would
  apply only the first, so two rows of one key mean the side effect ran twice);
- ``posts``: one row per ``post`` (the write marked ``idempotent=False``: the
  destination honours no key, so two rows of one task are a double post);
- ``checks``: one row per call of ``post``'s ``outcome_check``, with its verdict;
- ``suicides``: the pid of a worker that killed itself (``args["die_in_post"]``:
  ``post`` kills its process with SIGKILL after the post landed, once per task).

``args["sleep"]`` maps step names to seconds a step takes (default: a few
milliseconds, so that kills land inside steps as well as between them).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from typing import Any

from rateloop import Route
from rateloop.tasks import StepContext, task

ROUTE = Route(provider="openai", model="gpt-campaign")
_DEFAULT_SLEEP = 0.01

_TABLES = (
    "CREATE TABLE IF NOT EXISTS boots (pid INT)",
    "CREATE TABLE IF NOT EXISTS executions (task_id TEXT, step TEXT, pid INT, at REAL)",
    "CREATE TABLE IF NOT EXISTS effects (key TEXT, task_id TEXT, step TEXT, pid INT)",
    "CREATE TABLE IF NOT EXISTS posts (task_id TEXT, pid INT)",
    "CREATE TABLE IF NOT EXISTS checks (task_id TEXT, pid INT, landed INT)",
    "CREATE TABLE IF NOT EXISTS suicides (pid INT, task_id TEXT)",
)


def connect(path: str | None = None) -> sqlite3.Connection:
    conn = sqlite3.connect(
        path or os.environ["RATELOOP_CAMPAIGN_EFFECTS"], timeout=30, isolation_level=None
    )
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")  # a committed row survives kill -9
    return conn


def init_effects(path: str) -> None:
    conn = connect(path)
    try:
        for sql in _TABLES:
            conn.execute(sql)
    finally:
        conn.close()


def _row(sql: str, args: tuple[Any, ...]) -> None:
    conn = connect()
    try:
        conn.execute(sql, args)
    finally:
        conn.close()


def _step(ctx: StepContext, *, effect: bool = True) -> None:
    _row("INSERT INTO executions VALUES (?, ?, ?, ?)",
         (ctx.task_id, ctx.step, os.getpid(), time.time()))
    time.sleep(float(ctx.args.get("sleep", {}).get(ctx.step, _DEFAULT_SLEEP)))
    if effect:
        _row("INSERT INTO effects VALUES (?, ?, ?, ?)",
             (ctx.idempotency_key, ctx.task_id, ctx.step, os.getpid()))


def _died_here(task_id: str) -> bool:
    conn = connect()
    try:
        return bool(conn.execute("SELECT 1 FROM suicides WHERE task_id = ?",
                                 (task_id,)).fetchone())
    finally:
        conn.close()


def post_landed(ctx: StepContext, route: Route) -> bool:
    """``post``'s outcome check: did the destination get this task's post?"""
    conn = connect()
    try:
        (n,) = conn.execute("SELECT COUNT(*) FROM posts WHERE task_id = ?",
                            (ctx.task_id,)).fetchone()
        conn.execute("INSERT INTO checks VALUES (?, ?, ?)", (ctx.task_id, os.getpid(), int(n)))
        return bool(n)
    finally:
        conn.close()


campaign = task("campaign", version="1")


@campaign.step()
def fetch(ctx: StepContext) -> dict[str, str]:
    _step(ctx)
    return {"fetched": ctx.task_id}


@campaign.step(route=ROUTE)
def draft(ctx: StepContext, route: Route) -> dict[str, str]:
    _step(ctx)
    return {"draft": ctx.idempotency_key}


@campaign.step(route=ROUTE, operation="tool.post", idempotent=False, outcome_check=post_landed)
def post(ctx: StepContext, route: Route) -> dict[str, str]:
    _row("INSERT INTO executions VALUES (?, ?, ?, ?)",
         (ctx.task_id, ctx.step, os.getpid(), time.time()))
    _row("INSERT INTO posts VALUES (?, ?)", (ctx.task_id, os.getpid()))
    # The post has landed; its answer is not checkpointed yet (a kill here is the
    # case an outcome check exists for).
    if ctx.args.get("die_in_post") and not _died_here(ctx.task_id):
        _row("INSERT INTO suicides VALUES (?, ?)", (os.getpid(), ctx.task_id))
        os.kill(os.getpid(), signal.SIGKILL)  # landed, unanswered: a kill -9 at that point
    time.sleep(float(ctx.args.get("sleep", {}).get(ctx.step, _DEFAULT_SLEEP)))
    return {"posted": ctx.task_id}


@campaign.step(route=ROUTE)
def review(ctx: StepContext, route: Route) -> dict[str, str]:
    _step(ctx)
    return {"reviewed": ctx.idempotency_key}


@campaign.step()
def notify(ctx: StepContext) -> str:
    _step(ctx)
    return "notified"


if os.environ.get("RATELOOP_CAMPAIGN_WORKER") == "1":  # a worker process: say it is up
    _row("INSERT INTO boots VALUES (?)", (os.getpid(),))
