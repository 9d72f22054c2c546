"""Defining a multi-step task: :func:`task` and :class:`Task`, its :class:`Step` s.

A step is a function.  With a ``route`` it is a call through the RATE loop:
``fn(ctx, route)`` is the attempt, and the loop reads, admits, waits and
falls back around it.  Without one it runs as is: ``fn(ctx)`` may return an
:class:`~rateloop.Outcome` it made itself (``run_step`` for a CLI agent, a
``RateLoop.call`` of its own), or a plain value (a safe local step).

What a step returns is checkpointed as JSON before the next step starts and is
handed to later steps in ``ctx.results``; return references (ids, paths), not
prompts or secrets.

A routed step may also name ``batch=`` (a
:class:`~rateloop.tasks.batch_rung.BatchRung`): when the degrade ladder hands
its call to the ``batch`` rung, the call goes to the provider's batch API
instead of parking (rule 8 of :mod:`rateloop.tasks.flow`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from rateloop.outcome.record import Outcome
from rateloop.route import Cost, Route

if TYPE_CHECKING:
    from rateloop._clock import Clock
    from rateloop.admission.limiter import Limiter

__all__ = [
    "LeaseLost",
    "Step",
    "StepBatch",
    "StepContext",
    "Task",
    "TaskRegistry",
    "registry",
    "task",
]


class LeaseLost(RuntimeError):
    """A step's progress checkpoint was refused: the fence moved (the lease was taken, or an
    operator cancelled the task).  The step must stop: another delivery owns the task now."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepContext:
    """What a step sees: its task's arguments, the earlier steps' results, its idempotency key.

    ``idempotency_key`` is the same on every delivery of the step: pass it to
    the provider or write with it, and a redelivered step cannot duplicate its
    side effect.
    """

    task_id: str
    step: str
    index: int
    args: Mapping[str, Any]
    results: Mapping[str, Any]
    idempotency_key: str
    delivery: int
    #: What this step saved with :meth:`save_progress` in an earlier delivery (or None).
    progress: Any = None
    saver: Callable[[Any], None] | None = field(default=None, repr=False, compare=False)

    def save_progress(self, progress: Any) -> None:
        """Checkpoint this step's progress now, before it does what must not be done twice.

        ``progress`` is JSON; the next delivery of this step (a wake, a
        redelivery after a crash) reads it back in :attr:`progress`.  It is
        cleared when the step completes.  Raises :class:`LeaseLost` when the
        store refuses the save (the step must stop), ``TypeError`` for a value
        that is not JSON, and ``RuntimeError`` outside a runner.
        """
        if self.saver is None:
            raise RuntimeError(f"step {self.step!r} has no runner to save its progress")
        self.saver(progress)


class StepBatch(Protocol):
    """What a step's ``batch=`` does: one delivery of its call on the ladder's batch rung.

    :class:`rateloop.tasks.batch_rung.BatchRung` is the implementation; a
    protocol here keeps the batch machinery out of a task's definition.
    ``route`` is the batch-tier route the loop handed the call to; the runner
    passes the step's ``cost``, the policy's batch ``discount``, whether batch
    was not the call's first rung (``degraded``), its clock and its limiter.
    """

    def run(self, ctx: StepContext, route: Route, *, cost: Cost | None, discount: float,
            degraded: bool, clock: Clock, limiter: Limiter | None) -> Outcome: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One step of a task."""

    name: str
    fn: Callable[..., Any]
    route: Route | None = None
    cost: Cost | None = None
    operation: str = "model.generate"
    idempotent: bool = True
    fallbacks: tuple[Route, ...] | None = None
    outcome_check: Callable[[StepContext, Route], Any] | None = None
    batch: StepBatch | None = None

    @property
    def outcome_check_ref(self) -> str | None:
        """The check's name as the checkpoint records it (a reference, never code)."""
        fn = self.outcome_check
        if fn is None:
            return None
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


@dataclass(slots=True)
class Task:
    """A named, versioned sequence of steps.

    Bump ``version`` whenever a change makes old checkpoints mean something
    else (steps reordered, a result's shape changed): a worker never resumes a
    checkpoint of another version; it ends the task ``needs_operator``.
    """

    name: str
    version: str = "1"
    steps: list[Step] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"a task needs a non-empty name, got {self.name!r}")
        names = [s.name for s in self.steps]
        if len(set(names)) != len(names):
            raise ValueError(f"task {self.name!r} has duplicate step names: {names}")

    def step(
        self,
        name: str | None = None,
        *,
        route: Route | None = None,
        cost: Cost | None = None,
        operation: str = "model.generate",
        idempotent: bool = True,
        fallbacks: Iterable[Route] | None = None,
        outcome_check: Callable[[StepContext, Route], Any] | None = None,
        batch: StepBatch | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: append the function as the next step.

        A write (``idempotent=False``) whose call fails ambiguously is never
        retried blindly: ``outcome_check(ctx, route)`` says whether it took
        effect (see :mod:`rateloop.timing.writes`); without one it ends ``needs_operator``.
        The same check settles a write an earlier delivery started and never
        answered (its worker died) before the step runs again.

        ``batch`` (a :class:`~rateloop.tasks.batch_rung.BatchRung`, for a step
        with a ``route``) sends the call to the provider's batch API when the
        ladder hands it to the ``batch`` rung; without it such a step parks.
        """
        if batch is not None and route is None:
            raise ValueError("batch= needs a route: it runs the step's call on the route's "
                             "batch tier")
        if batch is not None and not callable(getattr(batch, "run", None)):
            raise TypeError(f"batch= must be a BatchRung (rateloop.tasks.batch_rung), "
                            f"got {type(batch).__name__}")

        def add(fn: Callable[..., Any]) -> Callable[..., Any]:
            step_name = name or fn.__name__
            if any(s.name == step_name for s in self.steps):
                raise ValueError(f"task {self.name!r} already has a step {step_name!r}")
            self.steps.append(
                Step(
                    name=step_name, fn=fn, route=route, cost=cost, operation=operation,
                    idempotent=idempotent,
                    fallbacks=tuple(fallbacks) if fallbacks is not None else None,
                    outcome_check=outcome_check, batch=batch,
                )
            )
            return fn

        return add

    @property
    def step_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.steps)

    def __repr__(self) -> str:
        return f"Task({self.name!r}, version={self.version!r}, steps={list(self.step_names)})"


class TaskRegistry:
    """Tasks by name: what a worker can run.  :func:`task` registers in :data:`registry`."""

    def __init__(self, tasks: Iterable[Task] = ()) -> None:
        self._tasks: dict[str, Task] = {}
        self._lock = threading.Lock()
        for t in tasks:
            self.add(t)

    def add(self, t: Task) -> Task:
        with self._lock:
            self._tasks[t.name] = t  # a re-imported module replaces its own definition
        return t

    def get(self, name: str) -> Task | None:
        return self._tasks.get(name)

    def names(self) -> list[str]:
        return sorted(self._tasks)

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __repr__(self) -> str:
        return f"TaskRegistry({self.names()})"


#: The default registry: ``rateloop worker --app module`` imports the module, which fills it.
registry = TaskRegistry()


def task(name: str, *, version: str = "1", into: TaskRegistry | None = None) -> Task:
    """Create and register a task; add its steps with ``@t.step(...)``.

    >>> from rateloop.tasks import TaskRegistry, task
    >>> report = task("report", version="2", into=TaskRegistry())
    >>> @report.step()
    ... def fetch(ctx):
    ...     return {"rows": 3}
    >>> report
    Task('report', version='2', steps=['fetch'])
    """
    return (into if into is not None else registry).add(Task(name, version=version))
