"""The calls waiting on each scope now, by priority, from the shared event stream (sans-IO).

The limiter keeps no list of waiters: a call it denies sleeps in its own
process.  What every worker does share is the event stream a
:class:`~rateloop.observe.redis_events.RedisEventSink` writes
(``{prefix}events``), and each wait of the loop is an event there: its
stream id is the Redis server's time when it was written, ``wait_seconds``
how long the call sleeps, ``priority`` the call's priority.  A wait is
*live* while ``stream time + wait_seconds`` is after the server's time now.

The waits counted are :data:`WAIT_DECISIONS`: ``admission_wait`` (the
limiter denied the call; it sleeps before asking again) and ``wait`` (the
provider refused an attempt; the call sleeps before the next one).  Both are
a call sleeping on its scope before an attempt.

One call, one count.  The sink tags every event of one call with ``call``, a
random token drawn when the call starts (nothing a person chose; see
``RedisEventSink.call_started``).  The latest event of a call supersedes its
earlier ones: a call counts while its latest event is a live wait, so a call
that went on to a retry, a fallback or a stop is no longer counted.  An
event without the tag (a loop that does not call the sink's hooks) is
counted on its own; a call's waits follow one another, so at most one of
them is live at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rateloop.route import Priority

__all__ = ["UNKNOWN_PRIORITY", "WAIT_DECISIONS", "stream_seconds", "waiters"]

#: The decisions that mean "this call is sleeping on its scope before an attempt".
WAIT_DECISIONS = frozenset({"admission_wait", "wait"})
#: The priority shown for a wait event that carries none.
UNKNOWN_PRIORITY = "unknown"
# Priorities listed most urgent first, then any other label alphabetically.
_RANK = {p.value: i for i, p in enumerate(Priority)}


def stream_seconds(stream_id: str) -> float:
    """The server time (seconds since the epoch) at which a stream entry was written.

    >>> stream_seconds("1767225600123-0")
    1767225600.123
    """
    return int(stream_id.split("-", 1)[0]) / 1000


def waiters(rows: Iterable[tuple[str, Mapping[str, str]]], now: float) -> dict[str, dict[str, int]]:
    """``{scope: {priority: calls waiting}}`` at server time ``now``, from stream rows in order.

    >>> rows = [
    ...     ("1000000-0", {"decision": "admission_wait", "scope": "s", "priority": "batch",
    ...                    "wait_seconds": "5", "call": "a"}),
    ...     ("1002000-0", {"decision": "admission_wait", "scope": "s", "priority": "batch",
    ...                    "wait_seconds": "5", "call": "a"}),
    ...     ("1002000-1", {"decision": "stop", "scope": "s", "call": "b"}),
    ... ]
    >>> waiters(rows, now=1003.0)
    {'s': {'batch': 1}}
    >>> waiters(rows, now=1008.0)
    {}
    """
    latest: dict[str, tuple[float, Mapping[str, str]]] = {}
    untagged: list[tuple[float, Mapping[str, str]]] = []
    for stream_id, fields in rows:
        row = (stream_seconds(stream_id), fields)
        call = fields.get("call")
        if call:
            latest[call] = row  # rows come in stream order: the last one wins
        else:
            untagged.append(row)
    out: dict[str, dict[str, int]] = {}
    for written, fields in [*latest.values(), *untagged]:
        if fields.get("decision") not in WAIT_DECISIONS or not fields.get("scope"):
            continue
        try:
            wait = float(fields.get("wait_seconds", ""))
        except ValueError:
            continue
        if written + wait <= now:
            continue
        by_priority = out.setdefault(fields["scope"], {})
        priority = fields.get("priority") or UNKNOWN_PRIORITY
        by_priority[priority] = by_priority.get(priority, 0) + 1
    return {
        scope: dict(sorted(counts.items(), key=lambda kv: (_RANK.get(kv[0], len(_RANK)), kv[0])))
        for scope, counts in sorted(out.items())
    }
