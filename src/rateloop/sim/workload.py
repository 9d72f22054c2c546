"""The simulated work: N agent tasks of K calls each, or a trace of a user's own calls.

A :class:`Workload` is a list of :class:`TaskSpec`, each with its arrival time
and its calls (input tokens, max output tokens, output tokens produced).
Token sizes come from a lognormal distribution around the given means (seeded),
or from a trace: CSV with a header or JSON Lines, one call a row, with
``input_tokens`` and ``max_tokens`` (``output_tokens``, ``task`` and
``start`` -- seconds from the beginning -- optional).  Rows with the same
``task`` form one task, run in order.
"""

from __future__ import annotations

import csv
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CallSpec", "TaskSpec", "Workload", "load_trace"]


@dataclass(frozen=True, slots=True)
class CallSpec:
    input_tokens: int
    max_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class TaskSpec:
    start: float
    calls: tuple[CallSpec, ...]
    group: int = 0  # which simulated process runs it


@dataclass(frozen=True, slots=True)
class Workload:
    tasks: tuple[TaskSpec, ...]
    description: str

    @property
    def calls(self) -> int:
        return sum(len(t.calls) for t in self.tasks)

    @classmethod
    def generate(
        cls,
        *,
        tasks: int,
        calls: int,
        input_tokens: int = 600,
        max_tokens: int = 400,
        output_ratio: float = 0.6,
        spread: float = 0.5,
        arrival_secs: float = 0.0,
        processes: int = 1,
        seed: int = 1,
    ) -> Workload:
        """``tasks`` × ``calls``; token sizes lognormal around the means (``spread`` = sigma).

        Tasks arrive evenly over ``arrival_secs`` (0: all at once) and are
        dealt round-robin to ``processes``.
        """
        for name, value in (("tasks", tasks), ("calls", calls), ("processes", processes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name, value in (("input_tokens", input_tokens), ("max_tokens", max_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not 0 < output_ratio <= 1:
            raise ValueError(
                f"output_ratio must be a fraction 0 < ratio <= 1, got {output_ratio!r}"
            )
        if isinstance(spread, bool) or not isinstance(spread, int | float) or not spread >= 0:
            raise ValueError(
                f"spread must be a number >= 0 (0: every call the mean), got {spread!r}"
            )
        if arrival_secs < 0:
            raise ValueError(f"arrival_secs must be >= 0, got {arrival_secs!r}")
        rng = random.Random(seed)

        def around(mean: int) -> int:
            if spread <= 0:
                return mean
            # A lognormal whose mean is ``mean``.
            mu = math.log(mean) - spread * spread / 2
            return max(1, round(rng.lognormvariate(mu, spread)))

        specs = []
        for i in range(tasks):
            start = arrival_secs * i / tasks if arrival_secs else 0.0
            task_calls = []
            for _ in range(calls):
                cap = around(max_tokens)
                out = max(1, min(cap, round(cap * output_ratio)))
                task_calls.append(CallSpec(around(input_tokens), cap, out))
            specs.append(TaskSpec(start, tuple(task_calls), group=i % processes))
        arrival = f", arriving over {arrival_secs:g} s" if arrival_secs else ", all at once"
        return cls(
            tuple(specs),
            f"{tasks} tasks × {calls} calls (~{input_tokens} in / {max_tokens} max out tokens)"
            f"{arrival}",
        )


def _int(row: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    raw = row.get(key)
    if raw in (None, ""):
        if default is not None:
            return default
        raise ValueError(f"{where}: missing {key!r} (each row needs input_tokens and max_tokens)")
    try:
        value = int(float(raw))
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {key} must be an integer >= 0, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"{where}: {key} must be an integer >= 0, got {raw!r}")
    return value


def _start(raw: Any, where: str) -> float:
    if raw is None or str(raw).strip() == "":
        return 0.0
    try:
        value = math.nan if isinstance(raw, bool) else float(raw)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: start must be seconds >= 0, got {raw!r}")
    return value


def load_trace(path: Path, *, processes: int = 1) -> Workload:
    """A workload from a CSV (with a header) or JSON Lines trace of calls."""
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".ndjson", ".json", ".csv"):
        got = path.suffix or "no suffix"
        raise ValueError(f"trace {path} must be .csv or .jsonl, got {got!r}")
    text = path.read_text(encoding="utf-8")
    rows: list[dict[str, Any]]
    if suffix in (".jsonl", ".ndjson", ".json"):
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not a JSON object ({exc.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{n}: each line must be a JSON object, got {row!r}")
            rows.append(row)
    else:
        rows = list(csv.DictReader(text.splitlines()))
    if not rows:
        raise ValueError(f"trace {path} has no calls")
    tasks: dict[tuple[str, str], list[CallSpec]] = {}
    starts: dict[tuple[str, str], float] = {}
    for n, row in enumerate(rows, 1):
        where = f"{path} row {n}"
        max_tokens = _int(row, "max_tokens", where)
        call = CallSpec(
            _int(row, "input_tokens", where),
            max_tokens,
            min(max_tokens, _int(row, "output_tokens", where, default=max_tokens)),
        )
        # A row without a task (no column, a blank cell, null) is a task of its own.
        task = row.get("task")
        key = ("row", str(n)) if task is None or str(task).strip() == "" else ("task", str(task))
        tasks.setdefault(key, []).append(call)
        start = _start(row.get("start"), where)  # every row's is checked; the first one counts
        starts.setdefault(key, start)
    specs = tuple(
        TaskSpec(starts[k], tuple(calls), group=i % processes)
        for i, (k, calls) in enumerate(tasks.items())
    )
    return Workload(specs, f"trace {path.name}: {len(specs)} tasks, {len(rows)} calls")
