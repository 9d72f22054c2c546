"""The text of ``rateloop status``: the scope table, the history lines and the queue.

How it works.  The scope table is a :class:`rich.table.Table` rendered at the
terminal's width.  Its columns have priorities: while the table's natural width
exceeds the width, the least important column still droppable goes
(:data:`COLUMNS`, ``EFFECTIVE`` and ``AIMD`` first); the essential columns
(``SCOPE``, ``STATE``, ``DIMENSION``, ``USED/CAPACITY``) and ``NOTE`` (when a
day resets, a block ends) are never dropped, and rich folds their cells to fit
what is left.  Durations and moments are said by :mod:`rateloop.observe.present`,
as on the dashboard.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from datetime import datetime

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from rateloop.admission.history import ScopeHistory
from rateloop.observe.present import countdown, human_duration, inherited_from, verdict
from rateloop.observe.queue_state import QueueState
from rateloop.observe.state import ScopeState, Snapshot

__all__ = ["COLUMNS", "render_history", "render_queue", "render_table"]

#: The scope table's columns, in order, with their priority: 0 are never dropped,
#: 1 are dropped last, higher numbers first.
COLUMNS: dict[str, int] = {
    "SCOPE": 0,
    "STATE": 0,
    "WAITING": 4,
    "AIMD": 5,
    "DIMENSION": 0,
    "LIMIT": 3,
    "EFFECTIVE": 6,
    "USED/CAPACITY": 0,
    "HEADROOM": 2,  # USED/CAPACITY says it too
    "NOTE": 1,
}
_KEEP = 1  # columns of this priority or less are folded, never dropped


def _num(value: float) -> str:
    return f"{value:.0f}" if value == int(value) or value >= 100 else f"{value:.1f}"


def _waiting(by_priority: Mapping[str, int]) -> str:
    """``interactive 2, background 1``: the calls sleeping on a scope, by priority."""
    return ", ".join(f"{p} {n}" for p, n in by_priority.items()) or "-"


def _scope_rows(s: ScopeState, snap: Snapshot) -> list[dict[str, str]]:
    now = snap.at
    head = {
        "SCOPE": s.scope,
        "STATE": verdict(s, snap).text(now, short=True),
        "AIMD": f"{s.factor:.2f}",
        "WAITING": _waiting(s.waiters),
    }
    if not s.dimensions:
        parent = inherited_from(s, snap)
        if parent is not None:
            note = f"within the limits of {parent.scope}"
        elif s.counts:
            note = ", ".join(f"{d} {_num(n)} today (limit unknown)" for d, n in s.counts.items())
        elif s.governed_by == "learned":
            note = "learned limits with no dimension"
        else:
            note = "no limits known (pass --config)" if not s.configured else "no dimensions"
        return [{**head, "NOTE": note}]
    rows = []
    for i, d in enumerate(s.dimensions):
        per = "/day" if d.dimension == "requests_per_day" else "/min" if d.kind == "bucket" else ""
        source = " " + s.governed_by if s.governed_by in ("learned", "recorded") else ""
        note = "-"
        if d.blocked_until is not None:
            note = "blocked until " + countdown(d.blocked_until, now)
        elif d.resets_at is not None:
            note = "resets " + countdown(d.resets_at, now)
        rows.append(
            {
                **(head if i == 0 else {}),
                "DIMENSION": d.dimension,
                "LIMIT": f"{d.configured}{per}{source}",
                "EFFECTIVE": _num(d.effective) if d.kind == "bucket" else "-",
                "USED/CAPACITY": f"{_num(d.used)}/{_num(d.capacity)}",
                "HEADROOM": f"{_num(d.headroom)} ({d.headroom_fraction:.0%})",
                "NOTE": note,
            }
        )
    return rows


#: Columns of short tokens: never wrapped (the others fold at spaces, then anywhere).
_NO_WRAP = frozenset({"AIMD", "DIMENSION", "LIMIT", "EFFECTIVE", "USED/CAPACITY", "HEADROOM"})
#: Columns of sentences: wrapped within this many characters.
_MAX_WIDTH = {"STATE": 26, "NOTE": 26, "WAITING": 16}


def _table(names: list[str], rows: list[dict[str, str]], *, capped: bool = True) -> Table:
    table = Table(box=None, pad_edge=False, expand=False, padding=(0, 2, 0, 0))
    for name in names:
        table.add_column(
            name,
            overflow="fold",
            no_wrap=name in _NO_WRAP,
            max_width=_MAX_WIDTH.get(name) if capped else None,
        )
    for row in rows:
        table.add_row(*(row.get(name, "") for name in names))
    return table


def _render(renderable: object, width: int) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, highlight=False, soft_wrap=False)
    console.print(renderable)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())


def _natural(table: Table) -> int:
    console = Console(width=100_000, file=io.StringIO())  # unbounded: the natural width
    return Measurement.get(console, console.options, table).maximum


def fitted_columns(rows: list[dict[str, str]], width: int) -> tuple[list[str], bool]:
    """The columns kept at ``width``, and whether the sentence columns wrap.

    Every column on one line each when that fits; else the sentences wrap
    (:data:`_MAX_WIDTH`) and the least important columns go while the table
    is still too wide.
    """
    names = list(COLUMNS)
    if _natural(_table(names, rows, capped=False)) <= width:
        return names, False
    while True:
        droppable = [n for n in names if COLUMNS[n] > _KEEP]
        if _natural(_table(names, rows)) <= width or not droppable:
            return names, True
        # The highest priority number goes first; of equals, the rightmost.
        names.remove(max(reversed(droppable), key=COLUMNS.__getitem__))


def render_table(snap: Snapshot, *, source: str, width: int = 120) -> str:
    """The status table, one row per limited dimension of each scope, at most ``width`` wide."""
    title = f"rateloop status  {source} prefix={snap.prefix!r}  at {snap.at.isoformat()}"
    if not snap.scopes:
        return (
            _render(title, width)
            + "\n"
            + _render(
                "no scopes: nothing configured (--config) and no state under this prefix", width
            )
        )
    rows = [row for s in snap.scopes for row in _scope_rows(s, snap)]
    names, capped = fitted_columns(rows, width)
    table = _table(names, rows, capped=capped)
    return _render(title, width) + "\n" + _render(table, width)


def render_history(past: Mapping[str, ScopeHistory], *, minutes: int) -> str:
    """One line per scope: its totals over the last ``minutes`` (``--history``)."""
    lines = [f"history  last {minutes} min"]
    for scope, h in sorted(past.items()):
        m = h.minutes
        waited = sum(x.wait_seconds for x in m)
        lines.append(
            f"{scope}  admitted {sum(x.admissions for x in m)}  "
            f"refused {sum(x.refusals for x in m)}  waits {sum(x.waits for x in m)} "
            f"({human_duration(waited)})  pauses {sum(x.pauses for x in m)}  "
            f"fallbacks {sum(x.fallbacks for x in m)}"
        )
    return "\n".join(lines)


def render_queue(queue: QueueState, *, source: str, width: int = 120) -> str:
    """The queue's depth, oldest task and the parked tasks' wake-ups, reasons and steps."""
    states = ", ".join(f"{k} {v}" for k, v in sorted(queue.by_state.items()) if v)
    age = queue.oldest_age_secs
    oldest = "-" if age is None else human_duration(age) + ("" if queue.oldest_exact else "+")
    head = f"queue  {source}  depth {queue.depth}  oldest {oldest}  ({states or 'empty'})"
    if not queue.waiting:
        return _render(head, width) + "\nno parked tasks"
    table = Table(box=None, pad_edge=False, padding=(0, 2, 0, 0))
    for name in ("TASK", "NAME", "STATE", "PRIORITY", "WAKES", "REMAINING", "REASON"):
        table.add_column(name, overflow="fold")
    for t in queue.waiting:
        retry_at = datetime.fromisoformat(t["retry_at"]) if t["retry_at"] else None
        table.add_row(
            t["task_id"],
            t["task"],
            t["state"],
            t["priority"],
            countdown(retry_at, queue.at),
            ",".join(t["remaining_steps"]) or "-",
            t["reason"] or "-",
        )
    return _render(head, width) + "\n" + _render(table, width)
