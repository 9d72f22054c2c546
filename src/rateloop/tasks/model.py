"""The durable task record: its checkpoint, and the summary a model may read.

A :class:`Checkpoint` is everything a worker needs to continue a task it has
never seen: which step is next, what the finished steps returned, what the
pending operation is (its name, route scope and cost — never a prompt), the
last :class:`~rateloop.LimitSignal`, the attempt ledger with queue
redeliveries, the retry budget, when to try again and the task's deadline.
It is stored as JSON; :meth:`Checkpoint.to_json` / :meth:`Checkpoint.from_json`
round-trip it exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from rateloop.classify._json import signal_dict
from rateloop.outcome.record import Attempts
from rateloop.route import Cost, Route
from rateloop.signal import Dimension, Kind, LimitSignal
from rateloop.tasks.states import PriorityClass, TaskState

__all__ = [
    "USER_MESSAGE_POLICY",
    "Checkpoint",
    "CompletedStep",
    "Ledger",
    "PendingOperation",
    "TaskRecord",
    "runtime_summary",
]

#: What an agent may tell its user about a task that is not finished.
USER_MESSAGE_POLICY = "explain the delay without claiming completion"


def _iso(when: datetime | None) -> str | None:
    return when.astimezone(UTC).isoformat() if when is not None else None


def _dt(text: Any) -> datetime | None:
    return datetime.fromisoformat(text) if isinstance(text, str) else None


def signal_to_dict(signal: LimitSignal) -> dict[str, Any]:
    """The normalized signal, JSON-able (the evidence, never a request body)."""
    # Every time in a checkpoint is UTC; the key keeps its place in the dict.
    return {**signal_dict(signal), "reset_at": _iso(signal.reset_at)}


def signal_from_dict(data: dict[str, Any]) -> LimitSignal:
    dimension = data.get("dimension")
    return LimitSignal(
        kind=Kind(data["kind"]),
        retryable=bool(data["retryable"]),
        retry_after=data.get("retry_after"),
        reset_at=_dt(data.get("reset_at")),
        dimension=Dimension(dimension) if dimension is not None else None,
        provider=data.get("provider"),
        request_id=data.get("request_id"),
        status=data.get("status"),
        code=data.get("code"),
        matched=data.get("matched"),
        scope=data.get("scope"),
        operation=data.get("operation"),
    )


def _route_dict(route: Route) -> dict[str, Any]:
    """A route as the checkpoint keeps it: its fields (a route holds no secret), tags sorted."""
    return {"provider": route.provider, "model": route.model, "project": route.project,
            "tenant": route.tenant, "context_window": route.context_window,
            "tags": sorted(route.tags), "input_price_per_mtok": route.input_price_per_mtok,
            "output_price_per_mtok": route.output_price_per_mtok, "tier": route.tier}


def _route_of(data: dict[str, Any]) -> Route:
    """The route :func:`_route_dict` wrote."""
    return Route(**{**data, "tags": frozenset(data.get("tags", ()))})


@dataclass(frozen=True, slots=True)
class Ledger:
    """Attempts by layer for the whole task; ``redeliveries`` are lease losses, ``wakes`` parks."""

    loop: int = 0
    sdk: int = 0
    redeliveries: int = 0
    wakes: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"loop": self.loop, "sdk": self.sdk, "redeliveries": self.redeliveries,
                "wakes": self.wakes}

    @property
    def attempts(self) -> Attempts:
        """The ledger as the loop's :class:`~rateloop.Attempts` (``redeliveries`` included)."""
        return Attempts(loop=self.loop, sdk=self.sdk, redeliveries=self.redeliveries)


@dataclass(frozen=True, slots=True)
class CompletedStep:
    """A finished step: its status, what it returned (or a reference to it), its attempts.

    ``rung`` and ``cost_usd`` are the outcome's (the ladder rung it finished on,
    what it cost there; docs/ladder.md), written only when known.
    """

    index: int
    name: str
    status: str
    result: Any = None
    attempts: int = 0
    rung: str | None = None
    cost_usd: float | None = None

    def to_dict(self) -> dict[str, Any]:
        # Written only when set: checkpoints of steps without them keep their shape.
        extra = {k: v for k, v in (("rung", self.rung), ("cost_usd", self.cost_usd))
                 if v is not None}
        return {"index": self.index, "name": self.name, "status": self.status,
                "result": self.result, "attempts": self.attempts, **extra}


@dataclass(frozen=True, slots=True)
class PendingOperation:
    """The operation a task is about to run or waits to run again: no prompt, no secret.

    ``started_delivery`` marks a write (``idempotent=False``) in flight: the
    delivery that started it, saved before it ran and cleared when it
    answered.  A later delivery that finds it set does not know whether the
    write took effect, and asks the step's ``outcome_check`` before running it.
    """

    step: str
    operation: str
    scope: str | None = None
    cost: dict[str, int] | None = None
    started_delivery: int | None = None

    @classmethod
    def of(
        cls, step: str, operation: str, route: Route | None, cost: Cost | None
    ) -> PendingOperation:
        if cost is None and route is not None:
            cost = Cost()  # what the loop charges a call that names no cost
        return cls(
            step=step,
            operation=operation,
            scope=route.scope if route is not None else None,
            cost=(
                {"requests": cost.requests, "input_tokens": cost.input_tokens,
                 "output_tokens": cost.output_tokens}
                if cost is not None
                else None
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        # The marker is written only while set: checkpoints without a write in flight keep
        # the shape they had before it existed.
        marker = {} if self.started_delivery is None else {
            "started_delivery": self.started_delivery}
        return {"step": self.step, "operation": self.operation, "scope": self.scope,
                "cost": self.cost, **marker}


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    """The resumable state of a task, as the issue lists it."""

    task_id: str
    run_id: str
    workflow_version: str
    current_step: int = 0
    completed_steps: tuple[CompletedStep, ...] = ()
    pending_operation: PendingOperation | None = None
    signal: LimitSignal | None = None
    attempts_used: Ledger = field(default_factory=Ledger)
    retry_budget_remaining: int = 20
    next_attempt_at: datetime | None = None
    task_deadline: datetime | None = None
    idempotency_key: str = ""
    outcome_check: str | None = None
    user_visible_status: str = "queued"
    reason: str = ""
    #: What the current step saved of its own progress (``ctx.save_progress``): JSON, or None.
    step_progress: Any = None
    #: The batch-tier route the current step's call was handed to (the ladder's ``batch``
    #: rung): while set, every delivery of the step runs on the batch rung (flow rule 8).
    batch_route: Route | None = None

    def to_json(self) -> str:
        # Written only while set: checkpoints of steps that save none keep their old shape.
        progress = {} if self.step_progress is None else {"step_progress": self.step_progress}
        if self.batch_route is not None:
            progress["batch_route"] = _route_dict(self.batch_route)
        return json.dumps(
            {
                "task_id": self.task_id,
                "run_id": self.run_id,
                "workflow_version": self.workflow_version,
                "current_step": self.current_step,
                "completed_steps": [s.to_dict() for s in self.completed_steps],
                "pending_operation": (
                    self.pending_operation.to_dict() if self.pending_operation else None
                ),
                "signal": signal_to_dict(self.signal) if self.signal is not None else None,
                "attempts_used": self.attempts_used.to_dict(),
                "retry_budget_remaining": self.retry_budget_remaining,
                "next_attempt_at": _iso(self.next_attempt_at),
                "task_deadline": _iso(self.task_deadline),
                "idempotency_key": self.idempotency_key,
                "outcome_check": self.outcome_check,
                "user_visible_status": self.user_visible_status,
                "reason": self.reason,
                **progress,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> Checkpoint:
        data = json.loads(text)
        pending = data.get("pending_operation")
        signal = data.get("signal")
        return cls(
            task_id=data["task_id"],
            run_id=data["run_id"],
            workflow_version=data["workflow_version"],
            current_step=int(data["current_step"]),
            completed_steps=tuple(CompletedStep(**s) for s in data["completed_steps"]),
            pending_operation=PendingOperation(**pending) if pending else None,
            signal=signal_from_dict(signal) if signal else None,
            attempts_used=Ledger(**data["attempts_used"]),
            retry_budget_remaining=int(data["retry_budget_remaining"]),
            next_attempt_at=_dt(data.get("next_attempt_at")),
            task_deadline=_dt(data.get("task_deadline")),
            idempotency_key=data.get("idempotency_key", ""),
            outcome_check=data.get("outcome_check"),
            user_visible_status=data.get("user_visible_status", ""),
            reason=data.get("reason", ""),
            step_progress=data.get("step_progress"),
            batch_route=_route_of(data["batch_route"]) if data.get("batch_route") else None,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskRecord:
    """One row of the store: the queue's columns and the checkpoint."""

    task_id: str
    name: str
    state: TaskState
    priority: PriorityClass
    args: dict[str, Any]
    steps: tuple[str, ...]
    checkpoint: Checkpoint
    created_at: datetime
    updated_at: datetime
    next_attempt_at: datetime
    deadline: datetime | None = None
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    fence: int = 0
    deliveries: int = 0

    @property
    def workflow_version(self) -> str:
        return self.checkpoint.workflow_version

    @property
    def completed(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.checkpoint.completed_steps)

    @property
    def remaining(self) -> tuple[str, ...]:
        return self.steps[self.checkpoint.current_step :]

    @property
    def result(self) -> Any:
        """What the last finished step returned (the task's result once it completed)."""
        done = self.checkpoint.completed_steps
        return done[-1].result if done else None

    def with_checkpoint(self, **changes: Any) -> TaskRecord:
        return replace(self, checkpoint=replace(self.checkpoint, **changes))

    def __repr__(self) -> str:
        return (
            f"TaskRecord({self.task_id!r}, {self.name!r}, {self.state.value}, "
            f"step {self.checkpoint.current_step}/{len(self.steps)}, fence={self.fence})"
        )


def runtime_summary(record: TaskRecord) -> dict[str, Any]:
    """What an agent may read about a task, JSON-able: the truth, without claiming completion.

    >>> from rateloop.tasks.model import Checkpoint, TaskRecord, runtime_summary
    >>> from rateloop.tasks.states import PriorityClass, TaskState
    >>> from datetime import UTC, datetime
    >>> t = datetime(2026, 1, 1, tzinfo=UTC)
    >>> rec = TaskRecord(task_id="t1", name="report", state=TaskState.WAITING_FOR_RESET,
    ...     priority=PriorityClass.INTERACTIVE, args={}, steps=("fetch", "draft"),
    ...     checkpoint=Checkpoint(task_id="t1", run_id="r1", workflow_version="1",
    ...                           user_visible_status="waiting"),
    ...     created_at=t, updated_at=t, next_attempt_at=t)
    >>> s = runtime_summary(rec)
    >>> s["status"], s["remaining_steps"], s["done"]
    ('waiting_for_reset', ['fetch', 'draft'], False)
    """
    ck = record.checkpoint
    pending = ck.pending_operation
    by_rung: dict[str, float] = {}
    for done in ck.completed_steps:
        if done.cost_usd is not None:
            rung = done.rung or "standard"
            by_rung[rung] = by_rung.get(rung, 0.0) + done.cost_usd
    return {
        "task_id": record.task_id,
        "task": record.name,
        "status": record.state.value,
        "done": record.state in (TaskState.COMPLETED, TaskState.DEGRADED),
        "operation": pending.operation if pending is not None else None,
        "retry_at": _iso(ck.next_attempt_at) if record.state.waiting else None,
        "deadline": _iso(record.deadline),
        "completed_steps": list(record.completed),
        "remaining_steps": list(record.remaining),
        "reason": ck.reason,
        "user_visible_status": ck.user_visible_status,
        "user_message_policy": USER_MESSAGE_POLICY,
        # What the finished steps cost, in all and by the ladder rung they finished on.
        "cost_usd": sum(by_rung.values()) if by_rung else None,
        "cost_by_rung": dict(sorted(by_rung.items())),
    }
