"""Read the limiter's scope state straight from Redis, read-only.

The Redis backend offers no read API, so this module reads its keys itself;
it is the only place outside :mod:`rateloop.admission.redis_backend` that
knows the key layout (documented there; a test holds :func:`key_of` equal to
the backend's own key names).  For a scope ``S`` whose ``provider:model`` is
``R``::

    {prefix}{R}:s:{S}   hash: buckets, day counts, blocks, AIMD factor, the pause
                        ('p' resume time, 'pr' reason)
    {prefix}{R}:l:{S}   sorted set: concurrency leases scored by expiry
    {prefix}{R}:k:{S}   hash: limits learned from the provider's headers (zero-config)

The calls waiting on each scope come from the event stream ``{prefix}events``
(:mod:`rateloop.observe.waiters`).  Only ``SCAN``, ``TIME``, ``HGETALL``,
``ZCOUNT``, ``XRANGE`` and ``XREVRANGE`` are sent: nothing
is written, no script is run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rateloop._redact import redact_url
from rateloop.admission.gcra import AIMD
from rateloop.admission.limiter import Limiter
from rateloop.admission.spec import LimitSpec
from rateloop.errors import BackendError
from rateloop.observe.redis_events import events_key
from rateloop.observe.state import RawScope, Snapshot, _at, scope_state
from rateloop.observe.waiters import waiters

__all__ = ["KINDS", "RedisStateReader", "key_of", "scope_of_key"]

#: The key kinds of one scope: state hash, lease set, learned limits.
KINDS = ("s", "l", "k")


def key_of(prefix: str, kind: str, scope: str) -> str:
    """The Redis key of ``scope``'s ``kind``, as ``RedisBackend._key`` names it.

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


class RedisStateReader:
    """Snapshots of every scope under one prefix of one Redis.

    >>> RedisStateReader("redis://:secret@127.0.0.1:6379/0")
    RedisStateReader('redis://:***@127.0.0.1:6379/0', prefix='rateloop:')
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "rateloop:",
        limits: Mapping[str, LimitSpec] | None = None,
        aimd: AIMD | None = None,
        socket_timeout: float = 5.0,
    ) -> None:
        try:
            import redis
        except ImportError as exc:  # pragma: no cover - depends on the installed extras
            raise ImportError(
                "reading the limiter state needs redis-py: pip install 'rateloop[redis]'"
            ) from exc
        self._redis = redis
        self.url = redact_url(url)
        self.prefix = prefix
        self.limits = dict(limits or {})
        self.aimd = aimd or AIMD()
        # A limiter that is never used to admit: it resolves each scope's accounting
        # profile exactly as the workers' limiters do.
        self._profiles = Limiter(limits=self.limits)
        self._client: Any = redis.Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
        )

    def __repr__(self) -> str:
        return f"RedisStateReader({self.url!r}, prefix={self.prefix!r})"

    def close(self) -> None:
        self._client.close()

    def read_events(
        self, after: str | None = None, *, count: int = 200
    ) -> tuple[str | None, list[dict[str, Any]]]:
        """Timeline entries of the events a :class:`~rateloop.observe.redis_events.RedisEventSink`
        wrote after stream id ``after`` (the last ``count`` when None), and the last id read.
        """
        from rateloop.observe.redis_events import timeline_entry

        key = events_key(self.prefix)
        try:
            if after is None:
                rows = list(reversed(self._client.xrevrange(key, count=count)))
            else:
                rows = self._client.xrange(key, min=f"({after}", count=count)
        except self._redis.RedisError as exc:
            raise BackendError(f"cannot read the events from Redis at {self.url}: {exc}") from exc
        entries = [
            timeline_entry(_at(int(sid.split("-")[0]) / 1000).isoformat(), fields)
            for sid, fields in rows
        ]
        return (rows[-1][0] if rows else after), entries

    def read_waiters(self, now: float | None = None) -> dict[str, dict[str, int]]:
        """``{scope: {priority: calls waiting}}`` at server time ``now`` (Redis TIME when None).

        Reads the whole capped event stream: a wait older than the stream's
        last ``maxlen`` events is no longer seen.
        """
        try:
            if now is None:
                seconds, micros = self._client.time()
                now = float(seconds) + float(micros) / 1_000_000
            rows = self._client.xrange(events_key(self.prefix))
        except self._redis.RedisError as exc:
            raise BackendError(f"cannot read the events from Redis at {self.url}: {exc}") from exc
        return waiters(rows, now)

    def read(self) -> Snapshot:
        """Every configured scope and every scope with state in Redis, now."""
        try:
            return self._read()
        except self._redis.RedisError as exc:
            raise BackendError(
                f"cannot read the limiter state from Redis at {self.url}: {exc}; "
                "start Redis or pass the URL of the limiter's Redis (--redis)"
            ) from exc

    def _read(self) -> Snapshot:
        client = self._client
        found: dict[str, set[str]] = {scope: set() for scope in self.limits}
        pattern = self.prefix.replace("[", "\\[").replace("*", "\\*").replace("?", "\\?") + "*"
        for key in client.scan_iter(match=pattern, count=1000):
            parsed = scope_of_key(self.prefix, key)
            if parsed is not None:
                found.setdefault(parsed[1], set()).add(parsed[0])
        seconds, micros = client.time()
        now = float(seconds) + float(micros) / 1_000_000
        waiting = waiters(client.xrange(events_key(self.prefix)), now)
        for scope in waiting:  # a call may wait on a scope the limiter holds nothing for
            found.setdefault(scope, set())
        scopes = sorted(found)
        pipe = client.pipeline(transaction=False)
        for scope in scopes:
            pipe.hgetall(key_of(self.prefix, "s", scope))
            pipe.zcount(key_of(self.prefix, "l", scope), f"({now!r}", "+inf")
            pipe.hgetall(key_of(self.prefix, "k", scope))
        replies = pipe.execute()
        states = []
        for i, scope in enumerate(scopes):
            state, leases, learned = replies[3 * i : 3 * i + 3]
            state = state or {}
            # The pause lives in the state hash: 'p' the resume time, 'pr' the reason.
            pause = f"{state['p']}|{state.get('pr', '')}" if state.get("p") else None
            raw = RawScope(scope, state, pause, int(leases or 0), learned or {})
            profile = self._profiles.profile_of(scope)
            spec = self.limits.get(scope)
            states.append(
                scope_state(
                    raw, spec, now, aimd=self.aimd, profile=profile, waiters=waiting.get(scope)
                )
            )
        return Snapshot(at=_at(now), prefix=self.prefix, scopes=tuple(states))
