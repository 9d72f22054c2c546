"""The steps a flow yields: the vocabulary between the admission flows and their drivers.

A flow (``admit.py``, ``feedback.py``) is a generator: it yields :class:`Do`
("run this operation on the backend"), :class:`Sleep` or :class:`Spawn`
("run this other flow beside me") and receives each step's result; the
runner (``runner.py``) performs them, blocking or awaiting, so the algorithm
is written once.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["Do", "Done", "Flow", "Sleep", "Spawn", "SpawnedFlow"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Do:
    op: object
    local: bool = False
    deadline: float | None = None  # the caller's, on the monotonic clock
    shared: bool = False  # on the shared backend only, never the local fallback (a renewal)


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


SpawnedFlow = Generator[Any, Any, None]


@dataclass(frozen=True, slots=True)
class Spawn:
    """Run ``flow`` beside the spawning flow, which goes on at once (its result is dropped)."""

    flow: SpawnedFlow


_Step = Do | Sleep | Spawn
#: (result, the op actually run, ran locally).  ``Any``: the result's type is the
#: op's (an AdmitResult for an AdmitOp, ...); typed where it is read, not cast at run time.
Done = tuple[Any, Any, bool]
Flow = Generator[_Step, Any, T]
