"""The Redis key layout: the one place that names the keys under a prefix.

The Redis backend (:mod:`.codec`) writes these keys and the read-only state
reader (:mod:`rateloop.observe.redis_state`) reads them; the event sink
(:mod:`rateloop.observe.redis_events`) appends to the stream.  For a scope
key ``S`` whose ``provider:model`` is ``R`` (``prefix`` defaults to
``rateloop:``)::

    {prefix}{R}:s:{S}   hash: bucket levels/timestamps, day counts, blocks, AIMD
                        factor, the pause ('p' resume time, 'pr' reason), its expiry
    {prefix}{R}:l:{S}   sorted set: the concurrency leases held in scope S, scored by
                        expiry (a call holds its lease in every scope with a limit)
    {prefix}{R}:k:{S}   hash: limits learned from the provider's headers (zero-config)
    {prefix}{R}:h:{S}:{H}  hash: scope S's history for epoch hour H, a field per minute,
                        expiring 24 h after the hour ends (rateloop.admission.history)
    {prefix}{R}:q:{S}   hash: the holds of scope S (a batch's enqueued tokens), a field per
                        key, ``"amount expiry"`` (rateloop.admission.holds)
    {prefix}events      stream: the loop's events (``RedisEventSink``)
    {prefix}events:notable  stream: the notable ones again (pauses, fallbacks, skips,
                        stops), capped apart so routine admissions never push them out

``{R}`` is a Redis Cluster hash tag: all scopes of a route share their
``provider:model``, so every key one script touches is in one slot.
Pure: no redis-py.
"""

from __future__ import annotations

__all__ = [
    "HISTORY",
    "HOLDS",
    "KINDS",
    "LEARNED",
    "LEASES",
    "STATE",
    "events_key",
    "history_key",
    "history_scope_of_key",
    "key_of",
    "notable_events_key",
    "scope_of_key",
]

#: The state hash of a scope: buckets, day counts, blocks, AIMD factor, the pause.
STATE = "s"
#: The sorted set of a scope's concurrency leases, scored by expiry.
LEASES = "l"
#: The hash of the limits learned from the provider's headers.
LEARNED = "k"
#: The per-hour history hashes of a scope (``key_of(prefix, HISTORY, scope)`` + ``:{hour}``).
HISTORY = "h"
#: The holds of a scope: capacity in flight until released (``enqueued_tokens``).
HOLDS = "q"
#: The key kinds of one scope: state hash, lease set, learned limits.
KINDS = (STATE, LEASES, LEARNED)


def key_of(prefix: str, kind: str, scope: str) -> str:
    """``{prefix}{provider:model}:{kind}:{scope}``: every key of a route in one slot.

    >>> key_of("rateloop:", "s", "openai:gpt-5:proj-1")
    'rateloop:{openai:gpt-5}:s:openai:gpt-5:proj-1'
    """
    root = ":".join(scope.split(":", 2)[:2])
    return f"{prefix}{{{root}}}:{kind}:{scope}"


def scope_of_key(prefix: str, key: str) -> tuple[str, str] | None:
    """``(kind, scope)`` of a key under ``prefix``, or None for another key."""
    if not key.startswith(prefix + "{"):
        return None
    _, sep, rest = key[len(prefix) + 1 :].partition("}:")
    kind, sep2, scope = rest.partition(":")
    if not (sep and sep2) or kind not in KINDS or not scope:
        return None
    if key_of(prefix, kind, scope) != key:  # the hash tag must be the scope's own root
        return None
    return kind, scope


def history_key(prefix: str, scope: str, hour: int) -> str:
    """The history hash of ``scope`` for one epoch hour (a field per minute).

    >>> history_key("rateloop:", "openai:gpt-5:proj-1", 483333)
    'rateloop:{openai:gpt-5}:h:openai:gpt-5:proj-1:483333'
    """
    return f"{key_of(prefix, HISTORY, scope)}:{hour}"


def history_scope_of_key(prefix: str, key: str) -> str | None:
    """The scope of a history hash under ``prefix`` (:func:`history_key`), or None.

    >>> history_scope_of_key("rateloop:", "rateloop:{openai:gpt-5}:h:openai:gpt-5:p:483333")
    'openai:gpt-5:p'
    """
    base, sep, hour = key.rpartition(":")
    if not sep or not hour.isdigit():
        return None
    parsed = scope_of_key(prefix, base.replace(f"}}:{HISTORY}:", f"}}:{STATE}:", 1))
    if parsed is None or key_of(prefix, HISTORY, parsed[1]) != base:
        return None
    return parsed[1]


def events_key(prefix: str) -> str:
    """The stream of the loop's events under ``prefix``."""
    return f"{prefix}events"


def notable_events_key(prefix: str) -> str:
    """The stream of the loop's notable events (pauses, fallbacks, ...) under ``prefix``."""
    return f"{prefix}events:notable"
