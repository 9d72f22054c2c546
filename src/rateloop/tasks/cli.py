"""``rateloop worker`` and ``rateloop tasks list|show|retry|cancel``."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from rateloop.errors import BackendError, ConfigError
from rateloop.tasks.deliveries import delivery_summary
from rateloop.tasks.model import TaskRecord, runtime_summary
from rateloop.tasks.presence import WorkerPresence, worker_note
from rateloop.tasks.queue import QueuePolicy
from rateloop.tasks.states import TaskState
from rateloop.tasks.store import TaskStore, open_store

__all__ = ["register_tasks", "register_worker"]

_STORE_HELP = "Task store URL: sqlite:///path/tasks.db or postgresql://user@host:5432/db"
Store = Annotated[str, typer.Option("--store", help=_STORE_HELP, envvar="RATELOOP_TASK_STORE")]


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"rateloop: {message}", err=True)
    return typer.Exit(code)


_LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
               "error": logging.ERROR}


@contextmanager
def _logging_to_stderr(level: str) -> Iterator[None]:
    """rateloop's own log lines on stderr while the command runs.

    Only the ``rateloop`` loggers, never the root logger: a third-party INFO line
    (an HTTP client logging the URL it called) may carry a key.  rateloop's lines
    carry ids, states and reasons, never a task's arguments or a prompt.
    """
    logger = logging.getLogger("rateloop")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    saved = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(_LOG_LEVELS[level])
    logger.propagate = False  # an --app that configures the root logger gets no duplicates
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])  # setLevel, not .level: it clears the loggers' level caches
        logger.propagate = saved[1]


@contextmanager
def _opened(url: str) -> Iterator[TaskStore]:
    try:
        store = open_store(url)
    except (ConfigError, BackendError, ImportError) as exc:
        raise _fail(str(exc)) from None
    try:
        yield store
    finally:
        store.close()


def worker_command(
    *,
    store: Store,
    concurrency: Annotated[int, typer.Option(min=1, help="Worker threads.")] = 1,
    app: Annotated[
        list[str] | None,
        typer.Option("--app", help="Module or .py file defining the tasks (repeatable)."),
    ] = None,
    lease_secs: Annotated[float, typer.Option(min=0.1, help="Lease length.")] = 30.0,
    poll_secs: Annotated[float, typer.Option(min=0.01, help="Idle poll interval.")] = 0.5,
    policy: Annotated[
        Path | None, typer.Option(help="RATE loop policy file (TOML or YAML) for the steps.")
    ] = None,
    log_level: Annotated[
        str, typer.Option(help=f"Log on stderr from this level: {', '.join(_LOG_LEVELS)}.")
    ] = "info",
) -> None:
    """Run workers until SIGTERM/SIGINT; the step in flight finishes and its task is released."""
    from rateloop.policy import Policy
    from rateloop.tasks.definition import registry
    from rateloop.tasks.worker import import_app, run_worker

    if log_level.lower() not in _LOG_LEVELS:
        raise _fail(f"--log-level {log_level!r}: allowed: {', '.join(_LOG_LEVELS)}")
    for load in _BUILTIN_TASKS:
        load()
    for spec in app or []:
        try:
            import_app(spec)
        except (ImportError, OSError) as exc:  # import_app turns every import error into these
            raise _fail(str(exc)) from None
    try:
        loop_policy = Policy.from_file(policy) if policy is not None else None
    except (ConfigError, OSError) as exc:
        raise _fail(str(exc)) from None
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    names = ", ".join(registry.names()) or "none (use --app)"
    typer.echo(f"rateloop worker: {concurrency} thread(s), tasks: {names}", err=True)
    try:
        with _logging_to_stderr(log_level.lower()):
            stats = run_worker(
                store, stop=stop, concurrency=concurrency, tasks=registry,
                policy=QueuePolicy(lease_secs=lease_secs), loop_policy=loop_policy,
                poll_secs=poll_secs,
            )
    except (ConfigError, BackendError, ImportError) as exc:
        raise _fail(str(exc)) from None
    done = ", ".join(f"{k} {v}" for k, v in sorted(stats.by_state.items())) or "none"
    typer.echo(f"rateloop worker: stopped after {stats.deliveries} deliveries ({done})", err=True)


def _row(rec: TaskRecord, note: str | None) -> str:
    ck = rec.checkpoint
    when = ck.next_attempt_at.isoformat() if rec.state.waiting and ck.next_attempt_at else "-"
    step = f"{ck.current_step}/{len(rec.steps)}"
    reason = "; ".join(x for x in (ck.reason, note) if x)
    return (f"{rec.task_id:<32}  {rec.name:<16}  {rec.state.value:<22}  {rec.priority.value:<11}  "
            f"{step:>5}  {when:<25}  {reason}")


def _cost_line(records: list[TaskRecord]) -> str | None:
    """What the listed tasks' finished steps cost, in all and by ladder rung (None: unpriced)."""
    by_rung: dict[str, float] = {}
    for rec in records:
        for rung, usd in runtime_summary(rec)["cost_by_rung"].items():
            by_rung[rung] = by_rung.get(rung, 0.0) + usd
    if not by_rung:
        return None
    parts = ", ".join(f"{rung} ${usd:.4f}" for rung, usd in sorted(by_rung.items()))
    return f"cost ${sum(by_rung.values()):.4f} ({parts})"


def _workers_line(live: list[WorkerPresence]) -> str:
    if not live:
        return "running workers: none"
    names = sorted({n for w in live for n in w.tasks})
    return f"running workers: {len(live)} (tasks: {', '.join(names) or 'none'})"


def list_command(
    *,
    store: Store,
    state: Annotated[
        list[str] | None, typer.Option(help="Only tasks in this state (repeatable).")
    ] = None,
    limit: Annotated[int, typer.Option(min=1)] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON summary per line.")] = False,
) -> None:
    """What waits, why, until when; what is done and what remains; what no worker can run."""
    try:
        states = [TaskState(s) for s in state or []]
    except ValueError:
        raise _fail(
            f"--state {state!r}: allowed: {', '.join(s.value for s in TaskState)}"
        ) from None
    with _opened(store) as s:
        records = s.list_tasks(states=states or None, limit=limit)
        counts = s.counts()
        live = s.live_workers()
    if as_json:
        for rec in records:
            line = runtime_summary(rec)
            line["note"] = worker_note(rec, live)
            typer.echo(json.dumps(line, sort_keys=True))
        return
    typer.echo(f"{'TASK':<32}  {'NAME':<16}  {'STATE':<22}  {'PRIORITY':<11}  {'STEP':>5}  "
               f"{'NEXT ATTEMPT':<25}  REASON")
    for rec in records:
        typer.echo(_row(rec, worker_note(rec, live)))
    typer.echo(", ".join(f"{k.value} {v}" for k, v in sorted(counts.items())) or "no tasks")
    cost = _cost_line(records)
    if cost:
        typer.echo(cost)
    typer.echo(_workers_line(live))


def show_command(
    task_id: Annotated[str, typer.Argument(help="The task id.")],
    *,
    store: Store,
) -> None:
    """One task: its runtime summary, its checkpoint and why each delivery happened, as JSON."""
    with _opened(store) as s:
        rec = s.get(task_id)
        if rec is None:
            raise _fail(f"no task {task_id!r} in {store}", 1)
        history = s.deliveries(task_id)
        live = s.live_workers()
    out = runtime_summary(rec)
    out["checkpoint"] = json.loads(rec.checkpoint.to_json())
    out["deliveries"] = rec.deliveries
    out["delivery_summary"] = delivery_summary(rec.deliveries, history)
    out["delivery_history"] = [d.to_dict() for d in history]
    out["lease_owner"] = rec.lease_owner
    out["note"] = worker_note(rec, live)
    typer.echo(json.dumps(out, indent=2, sort_keys=True))


def retry_command(
    task_id: Annotated[str, typer.Argument(help="The task id.")],
    *,
    store: Store,
    accept_version: Annotated[
        str | None,
        typer.Option(help="Accept the checkpoint for this workflow version (after a deploy)."),
    ] = None,
) -> None:
    """Queue an unsuccessful or waiting task again now."""
    with _opened(store) as s:
        try:
            rec = s.retry(task_id, accept_version=accept_version)
        except KeyError:
            raise _fail(f"no task {task_id!r} in {store}", 1) from None
        except ValueError as exc:
            raise _fail(str(exc), 1) from None
    typer.echo(f"{rec.task_id}: {rec.state.value}")


def cancel_command(
    task_id: Annotated[str, typer.Argument(help="The task id.")],
    *,
    store: Store,
) -> None:
    """End an unfinished task (cancelled); a worker holding it cannot write again."""
    with _opened(store) as s:
        try:
            rec = s.cancel(task_id)
        except KeyError:
            raise _fail(f"no task {task_id!r} in {store}", 1) from None
        except ValueError as exc:
            raise _fail(str(exc), 1) from None
    typer.echo(f"{rec.task_id}: {rec.state.value}")


#: Loaders of the task definitions every worker knows (the composing CLI passes them:
#: the parked CLI agent step lives in ``agents``, a layer above this one).
_BUILTIN_TASKS: list[Callable[[], object]] = []


def register_worker(
    app: typer.Typer, *, builtin_tasks: Sequence[Callable[[], object]] = ()
) -> None:
    """Add ``rateloop worker``; each of ``builtin_tasks`` registers definitions before it runs."""
    _BUILTIN_TASKS[:] = builtin_tasks
    app.command("worker", no_args_is_help=True)(worker_command)


def register_tasks(app: typer.Typer) -> None:
    group = typer.Typer(no_args_is_help=True, help="List, show, retry and cancel durable tasks.")
    group.command("list")(list_command)
    group.command("show")(show_command)
    group.command("retry")(retry_command)
    group.command("cancel")(cancel_command)
    app.add_typer(group, name="tasks")


