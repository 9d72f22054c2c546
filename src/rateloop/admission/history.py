"""Each scope's history, minute by minute: the format, and the in-process store.

How it works.  A scope's history is one small record per minute (UTC, epoch
minutes), kept for :data:`HISTORY_MINUTES` (24 h) and trimmed by its writer.
A record is a flat map of counters, the same names in Redis and in memory:

====================  ============================================================
``a``                 admissions granted (booked ones included)
``r``                 provider refusals: attempts the provider refused (429, 529, ...)
``w`` / ``ws``        local waits (admission waits) and their scheduled seconds
``p``                 pauses begun; ``ps`` the first one's start, ``pu`` the latest
                      end of those pauses (epoch seconds)
``f``                 fallbacks taken away from the scope
``u:<dimension>``     units admitted (a bucket's or day quota's amounts; a settle adds
                      its refund, negative)
``c:<dimension>``     units in force after the minute's last admission: the day count,
                      the leases held
``L:<dimension>``     the limit then: per minute for a bucket (the effective rate, AIMD
                      included), the day allowance, the concurrency slots
====================  ============================================================

The limiter writes what it sees in the same step as the admission (``a``,
``u``, ``c``, ``L``; a settle's refund; a pause: ``p``, ``ps``, ``pu``): in
Redis inside the admission script itself, so no round trip is added.  What
only the loop knows -- a refusal, an admission wait, a fallback -- comes from
its events (:mod:`rateloop.observe.history`).

Redis keeps one hash per scope and *hour*, ``{prefix}{provider:model}:h:{scope}:{epoch
hour}`` (:mod:`.backends.keys`), expiring 24 h after its hour ends: 24 or 25
keys per scope, not 1,440.  In it each minute of the hour (``0`` to ``59``)
has one field, the limiter's record packed as ``"name value name value
..."`` (written by ``_common.lua``'s ``history``: one ``HGET``, one ``HSET``),
and the loop's counts have their own fields ``<minute>:<name>`` (``7:r``), so
the event sink adds them with ``HINCRBY`` in the pipeline it already sends.
One field per minute keeps an hour's hash small: at most 60 records plus the
rare loop counts, so a busy hour stays a listpack, or becomes a hashtable of
~60 entries when a record is longer than ``hash-max-listpack-value`` (64
bytes): either way cheap to update.  :func:`hour_records` unpacks it.
:class:`MemoryHistory` keeps a bounded deque of flat records per scope.
:func:`scope_history` reads records back into a :class:`ScopeHistory`.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "HISTORY_MINUTES",
    "HISTORY_TTL_SECONDS",
    "MemoryHistory",
    "Minute",
    "ScopeHistory",
    "Usage",
    "check_minutes",
    "hour_field",
    "hour_of",
    "hour_records",
    "minute_of",
    "scope_history",
]

#: How many minutes a scope's history keeps (24 h).
HISTORY_MINUTES = 1440
#: How long past its hour's end a scope's hour of history lives in Redis (``EXPIREAT``).
HISTORY_TTL_SECONDS = HISTORY_MINUTES * 60

_COUNTS = {"a": "admissions", "r": "refusals", "w": "waits", "p": "pauses", "f": "fallbacks"}


def minute_of(wall: float) -> int:
    """The epoch minute of a wall-clock time (seconds since the epoch, UTC)."""
    return int(wall // 60)


def hour_of(minute: int) -> int:
    """The epoch hour of an epoch minute: its history hash in Redis (one per scope and hour)."""
    return minute // 60


def hour_field(minute: int, name: str | None = None) -> str:
    """The field of ``minute`` in its hour's hash: the record, or one count ``name``.

    >>> hour_field(29000007), hour_field(29000007, "r")
    ('27', '27:r')
    """
    at = str(minute % 60)
    return at if name is None else f"{at}:{name}"


def hour_records(hour: int, fields: Mapping[str, str]) -> list[tuple[int, dict[str, str]]]:
    """The ``(epoch minute, flat record)`` pairs of a scope's hash for epoch ``hour``.

    A field ``"<minute>"`` holds the limiter's record, ``"name value ..."``;
    ``"<minute>:<name>"`` one of the loop's counts.  A malformed field is skipped.

    >>> hour_records(483333, {"7": "a 3 u:requests 3 L:requests 600", "7:r": "1", "x": "?"})
    [(28999987, {'a': '3', 'u:requests': '3', 'L:requests': '600', 'r': '1'})]
    """
    minutes: dict[int, dict[str, str]] = {}
    for key, value in fields.items():
        at, sep, name = str(key).partition(":")
        if not at.isdigit() or int(at) >= 60 or (sep and not name):
            continue
        record = minutes.setdefault(hour * 60 + int(at), {})
        if sep:
            record[name] = str(value)
            continue
        words = str(value).split()
        record.update(zip(words[0::2], words[1::2], strict=False))
    return sorted(minutes.items())


def check_minutes(minutes: object, *, key: str = "minutes") -> int:
    """``minutes`` as a history window, or a clear ``ValueError``."""
    if (
        isinstance(minutes, bool)
        or not isinstance(minutes, int)
        or not 1 <= minutes <= (HISTORY_MINUTES)
    ):
        raise ValueError(
            f"{key} must be a whole number of minutes from 1 to {HISTORY_MINUTES}, got {minutes!r}"
        )
    return minutes


def _at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """One dimension in one minute: units admitted, units in force, and the limit then."""

    used: float = 0.0
    count: float | None = None
    limit: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Minute:
    """One minute of a scope's history (see the module's table)."""

    at: datetime
    admissions: int = 0
    refusals: int = 0
    waits: int = 0
    wait_seconds: float = 0.0
    pauses: int = 0
    fallbacks: int = 0
    usage: Mapping[str, Usage] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "admissions": self.admissions,
            "refusals": self.refusals,
            "waits": self.waits,
            "wait_seconds": self.wait_seconds,
            "pauses": self.pauses,
            "fallbacks": self.fallbacks,
            "usage": {
                d: {"used": u.used, "count": u.count, "limit": u.limit}
                for d, u in sorted(self.usage.items())
            },
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ScopeHistory:
    """A scope's minutes with data (oldest first) and its pauses as ``(start, end)`` bands."""

    scope: str
    minutes: tuple[Minute, ...] = ()
    pauses: tuple[tuple[datetime, datetime], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "minutes": [m.to_dict() for m in self.minutes],
            "pauses": [[a.isoformat(), b.isoformat()] for a, b in self.pauses],
        }


def _num(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0


def _minute(minute: int, fields: Mapping[str, Any]) -> Minute:
    usage: dict[str, dict[str, float]] = {}
    for name, value in fields.items():
        kind, sep, dimension = str(name).partition(":")
        if sep and kind in ("u", "c", "L") and dimension:
            usage.setdefault(dimension, {})[kind] = _num(value)
    counts = {label: int(_num(fields.get(code, 0))) for code, label in _COUNTS.items()}
    return Minute(
        at=_at(minute * 60.0),
        wait_seconds=_num(fields.get("ws", 0)),
        usage={
            d: Usage(used=v.get("u", 0.0), count=v.get("c"), limit=v.get("L"))
            for d, v in usage.items()
        },
        **counts,
    )


def scope_history(scope: str, records: Iterable[tuple[int, Mapping[str, Any]]]) -> ScopeHistory:
    """A scope's :class:`ScopeHistory` from its ``(epoch minute, record)`` pairs.

    Empty records are left out; pauses that overlap are merged into one band.

    >>> h = scope_history("openai:gpt-5", [(29000000, {"a": "3", "u:requests": "3",
    ...     "L:requests": "60", "p": "1", "ps": "1740000010", "pu": "1740000040"}), (29000001, {})])
    >>> m, = h.minutes
    >>> m.admissions, m.usage["requests"].used, m.usage["requests"].limit, m.pauses
    (3, 3.0, 60.0, 1)
    >>> [(a.isoformat(), b.isoformat()) for a, b in h.pauses]
    [('2025-02-19T21:20:10+00:00', '2025-02-19T21:20:40+00:00')]
    """
    minutes: list[Minute] = []
    bands: list[tuple[float, float]] = []
    for minute, fields in sorted(records, key=lambda r: r[0]):
        if not fields:
            continue
        minutes.append(_minute(minute, fields))
        if "pu" in fields:
            end = _num(fields["pu"])
            start = _num(fields.get("ps", minute * 60))
            bands.append((min(start, end), end))
    merged: list[tuple[float, float]] = []
    for start, end in sorted(bands):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return ScopeHistory(
        scope=scope,
        minutes=tuple(minutes),
        pauses=tuple((_at(a), _at(b)) for a, b in merged),
    )


class MemoryHistory:
    """The history of every scope of one process, bounded and trimmed by its writers.

    Each scope keeps at most ``minutes`` records; a write drops those older
    than ``minutes`` before the minute it writes.  Safe across threads.
    """

    def __init__(self, minutes: int = HISTORY_MINUTES) -> None:
        self.minutes = check_minutes(minutes)
        self._lock = threading.Lock()
        self._scopes: dict[str, deque[tuple[int, dict[str, float]]]] = {}

    def __repr__(self) -> str:
        return f"MemoryHistory(scopes={len(self._scopes)}, minutes={self.minutes})"

    def record(self, scope: str, wall: float) -> dict[str, float]:
        """The record of ``scope`` for the minute of ``wall``: the caller holds :attr:`lock`."""
        minute = minute_of(wall)
        rows = self._scopes.get(scope)
        if rows is None:
            rows = self._scopes[scope] = deque()
        if rows and rows[-1][0] == minute:
            return rows[-1][1]
        if rows and rows[-1][0] > minute:  # a late write (another thread's clock read)
            for m, fields in reversed(rows):
                if m == minute:
                    return fields
            return {}  # older than what is kept, or a gap: dropped, never reordered
        rows.append((minute, {}))
        oldest = minute - self.minutes
        while rows[0][0] <= oldest:
            rows.popleft()
        return rows[-1][1]

    @property
    def lock(self) -> threading.Lock:
        return self._lock

    def add(self, scope: str, wall: float, counts: Mapping[str, float]) -> None:
        """Add ``counts`` to the record of ``scope`` for the minute of ``wall``."""
        with self._lock:
            fields = self.record(scope, wall)
            for name, n in counts.items():
                fields[name] = fields.get(name, 0.0) + n

    def paused(self, scope: str, wall: float, until: float) -> None:
        """A pause of ``scope`` from ``wall`` to ``until`` (epoch seconds)."""
        with self._lock:
            fields = self.record(scope, wall)
            fields["p"] = fields.get("p", 0.0) + 1
            fields.setdefault("ps", wall)
            fields["pu"] = max(fields.get("pu", until), until)

    def read(
        self, minutes: int = 60, *, now: float, scopes: Iterable[str] | None = None
    ) -> dict[str, ScopeHistory]:
        """The last ``minutes`` (the minute of ``now`` included) of each scope (all by default)."""
        check_minutes(minutes)
        first = minute_of(now) - minutes + 1
        with self._lock:
            names = sorted(self._scopes) if scopes is None else list(scopes)
            copied = {
                s: [(m, dict(f)) for m, f in self._scopes.get(s, ()) if m >= first] for s in names
            }
        return {s: scope_history(s, rows) for s, rows in copied.items()}
