"""Park a CLI agent step that hit a usage limit, for a worker to run again at the reset.

``rateloop run --queue URL -- CMD`` calls :func:`park_from_cli` when the step
ends ``waiting_for_reset`` (or ``waiting_for_capacity``): instead of exiting 75
the step becomes a one-step task (:data:`agent_step_task`) parked until the
reset, and ``rateloop worker --store URL`` runs the command again then, in the
same directory, through :func:`rateloop.agents.run_step`.

What is stored: the command line — and so the prompt in it — its agent,
model, timeout, label and working directory.  Passing ``--queue`` is the
opt-in to storing it; the environment (API keys) is never stored, the worker's
own is used.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import typer

from rateloop._clock import Clock
from rateloop._redact import redact_url
from rateloop.errors import BackendError, ConfigError
from rateloop.outcome.record import Outcome, Status
from rateloop.tasks.definition import StepContext, Task, TaskRegistry, registry
from rateloop.tasks.model import Ledger, PendingOperation, TaskRecord
from rateloop.tasks.queue import QueuePolicy
from rateloop.tasks.runner import TaskRunner
from rateloop.tasks.states import PriorityClass, TaskState
from rateloop.tasks.store import TaskStore, open_store

__all__ = ["AGENT_TASK", "agent_step_task", "park_agent_step", "park_from_cli"]

AGENT_TASK = "rateloop.agent_step"
_WAITING = (Status.WAITING_FOR_RESET, Status.WAITING_FOR_CAPACITY)

#: A parked CLI agent step: one step, run again by a worker.
agent_step_task = Task(AGENT_TASK, version="1")


@agent_step_task.step("agent", operation="agent.step")
def _run_agent(ctx: StepContext) -> Outcome:
    from rateloop.agents.runner import run_step  # subprocess: loaded only where a worker runs it

    a = ctx.args
    return run_step(
        list(a["command"]), agent=a.get("agent"), model=a.get("model"),
        timeout=a.get("timeout"), label=a.get("label"), cwd=a.get("cwd"),
    )


registry.add(agent_step_task)


def park_agent_step(
    store: TaskStore,
    command: Sequence[str],
    outcome: Outcome,
    *,
    agent: str | None = None,
    model: str | None = None,
    timeout: float | None = None,
    label: str | None = None,
    cwd: str | None = None,
    deadline: datetime | float | None = None,
    priority: PriorityClass | str = PriorityClass.SCHEDULED,
    margin_secs: float = 0.0,
    policy: QueuePolicy | None = None,
    clock: Clock | None = None,
) -> TaskRecord:
    """Store a step that ended waiting as a task parked until ``outcome.retry_at + margin``.

    The record comes back ``waiting_for_reset``/``waiting_for_capacity``, or
    ``rejected`` when the queue is full or the reset is past ``deadline``.
    """
    if outcome.status not in _WAITING:
        raise ValueError(
            f"only a step that ended waiting_for_reset or waiting_for_capacity is parked, "
            f"not {outcome.status.value}"
        )
    runner = TaskRunner(store, tasks=TaskRegistry([agent_step_task]), policy=policy, clock=clock)
    now = runner.clock.now()
    due = (outcome.retry_at or now + timedelta(seconds=60)) + timedelta(seconds=margin_secs)
    args: dict[str, Any] = {
        "command": list(command), "agent": agent, "model": model, "timeout": timeout,
        "label": label, "cwd": cwd if cwd is not None else os.getcwd(),
    }
    rec = runner.new_record(
        agent_step_task, args, task_id=None, priority=priority, deadline=deadline,
        not_before=max(due, now), idempotency_key=None,
    )
    state = TaskState(outcome.status.value)
    rec = replace(rec, state=state).with_checkpoint(
        signal=outcome.signal,
        attempts_used=Ledger(loop=outcome.attempts.loop, sdk=outcome.attempts.sdk),
        pending_operation=PendingOperation(step="agent", operation="agent.step", scope=label),
        reason=outcome.reason,
        user_visible_status=(
            f"{state.value}: the agent step waits until {due.isoformat()} ({outcome.reason}); "
            "not done: agent"
        ),
    )
    return store.submit(rec, runner.policy)


def park_from_cli(
    url: str, command: Sequence[str], outcome: Outcome, *, margin_secs: float, **kw: Any
) -> int:
    """``rateloop run --queue``: park the step and say so; the exit code (0 parked, 75, 2)."""
    try:
        store = open_store(url)
    except (ConfigError, BackendError, ImportError) as exc:
        typer.echo(f"Error: --queue: {exc}", err=True)
        return 75  # the step still waits; nothing was stored
    try:
        rec = park_agent_step(store, command, outcome, margin_secs=margin_secs, **kw)
    finally:
        store.close()
    if rec.state is TaskState.REJECTED:
        typer.echo(f"Error: --queue: not parked: {rec.checkpoint.reason}", err=True)
        return 75
    typer.echo(
        f"rateloop run: parked as task {rec.task_id} until {rec.next_attempt_at.isoformat()}; "
        f"`rateloop worker --store {redact_url(url)}` runs it again then.",
        err=True,
    )
    typer.echo(rec.task_id)
    return 0
