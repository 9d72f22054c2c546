"""Read the limiter's scope state straight from Redis, read-only.

The Redis backend offers no read API, so this module reads its keys itself.
The key layout has one owner, :mod:`rateloop.admission.backends.keys` (where
it is documented), which both the backend and this reader name their keys
with; ``KINDS``, ``key_of`` and ``scope_of_key`` are re-exported from it.

The calls waiting on each scope come from the event stream ``{prefix}events``
(:mod:`rateloop.observe.waiters`).  Only ``SCAN``, ``TIME``, ``HGETALL``,
``ZCOUNT``, ``XRANGE`` and ``XREVRANGE`` are sent: nothing
is written, no script is run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rateloop._redact import redact_url
from rateloop._url import lower_scheme, url_scheme
from rateloop.admission.backends.keys import (
    KINDS,
    LEARNED,
    LEASES,
    STATE,
    events_key,
    history_scope_of_key,
    key_of,
    notable_events_key,
    scope_of_key,
)
from rateloop.admission.gcra import AIMD
from rateloop.admission.history import HISTORY_MINUTES, ScopeHistory
from rateloop.admission.known import KnownLimits
from rateloop.admission.spec import LimitSpec
from rateloop.errors import BackendError, ConfigError
from rateloop.observe.history import read_redis_history
from rateloop.observe.state import (
    RawScope,
    Snapshot,
    _at,
    recorded_limits,
    scope_state,
    uncounted_day,
)
from rateloop.observe.waiters import waiters

__all__ = [
    "KINDS",
    "READABLE_SCHEMES",
    "RedisStateReader",
    "check_redis_url",
    "key_of",
    "scope_of_key",
]

# What redis.Redis.from_url opens; a Redis Cluster (redis+cluster://) is not read here.
READABLE_SCHEMES = ("redis", "rediss", "unix")


def check_redis_url(url: str, *, key: str = "url") -> None:
    """Refuse a URL redis-py cannot open, naming it and the schemes allowed.

    >>> check_redis_url("http://127.0.0.1:6379/0", key="--redis")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    rateloop.errors.ConfigError: --redis: the Redis URL 'http://127.0.0.1:6379/0' has ...
    """
    scheme = url_scheme(url)
    if scheme not in READABLE_SCHEMES:
        has = f"the scheme {scheme!r}" if scheme else "no scheme"
        raise ConfigError(
            f"the Redis URL {url!r} has {has}",
            key=key,
            value=url,
            allowed=", ".join(f"{s}://" for s in READABLE_SCHEMES) + " URLs",
        )


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
        # The limits as the workers' limiters know them: they resolve each scope's
        # accounting profile exactly as those do.
        self._profiles = KnownLimits(shared=False)
        for scope, spec in self.limits.items():
            self._profiles.set_limits(scope, spec)
        check_redis_url(url)
        try:
            # redis-py before 8 compares its schemes case-sensitively: the canonical spelling.
            self._client: Any = redis.Redis.from_url(
                lower_scheme(url),
                decode_responses=True,
                socket_timeout=socket_timeout,
                socket_connect_timeout=socket_timeout,
            )
        except ValueError as exc:  # a malformed port, db or query string
            raise ConfigError(f"cannot parse the Redis URL {url!r}: {exc}", value=url) from exc

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
        return self._read_stream(events_key(self.prefix), after, count)

    def read_notable_events(
        self, after: str | None = None, *, count: int = 100
    ) -> tuple[str | None, list[dict[str, Any]]]:
        """As :meth:`read_events`, from the stream of the notable events only
        (pauses, fallbacks, skips, stops), which routine events never trim.
        """
        return self._read_stream(notable_events_key(self.prefix), after, count)

    def _read_stream(
        self, key: str, after: str | None, count: int
    ) -> tuple[str | None, list[dict[str, Any]]]:
        from rateloop.observe.redis_events import timeline_entry

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

    def read_history(
        self,
        minutes: int = 60,
        *,
        scopes: Iterable[str] | None = None,
        now: float | None = None,
    ) -> dict[str, ScopeHistory]:
        """Each scope's last ``minutes`` of history (:mod:`rateloop.admission.history`).

        ``scopes``: those of :meth:`read` when None; ``now``: Redis's TIME when None.
        One pipelined ``HGETALL`` per scope and hour the window touches.
        """
        try:
            if scopes is None:
                scopes = [s.scope for s in self.read().scopes]
            if now is None:
                seconds, micros = self._client.time()
                now = float(seconds) + float(micros) / 1_000_000
            return read_redis_history(self._client, self.prefix, scopes, minutes, now)
        except self._redis.RedisError as exc:
            raise BackendError(f"cannot read the history from Redis at {self.url}: {exc}") from exc

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
            elif (scope := history_scope_of_key(self.prefix, key)) is not None:
                found.setdefault(scope, set())  # its state expired; its history is kept
        seconds, micros = client.time()
        now = float(seconds) + float(micros) / 1_000_000
        waiting = waiters(client.xrange(events_key(self.prefix)), now)
        for scope in waiting:  # a call may wait on a scope the limiter holds nothing for
            found.setdefault(scope, set())
        scopes = sorted(found)
        pipe = client.pipeline(transaction=False)
        for scope in scopes:
            pipe.hgetall(key_of(self.prefix, STATE, scope))
            pipe.zcount(key_of(self.prefix, LEASES, scope), f"({now!r}", "+inf")
            pipe.hgetall(key_of(self.prefix, LEARNED, scope))
        replies = pipe.execute()
        raws = []
        for i, scope in enumerate(scopes):
            state, leases, learned = replies[3 * i : 3 * i + 3]
            state = state or {}
            # The pause lives in the state hash: 'p' the resume time, 'pr' the reason.
            pause = f"{state['p']}|{state.get('pr', '')}" if state.get("p") else None
            raws.append(RawScope(scope, state, pause, int(leases or 0), learned or {}))
        recorded = self._recorded(raws, now)
        states = [
            scope_state(
                raw,
                self.limits.get(raw.scope),
                now,
                aimd=self.aimd,
                profile=self._profiles.profile_of(raw.scope),
                waiters=waiting.get(raw.scope),
                recorded=recorded.get(raw.scope),
            )
            for raw in raws
        ]
        return Snapshot(at=_at(now), prefix=self.prefix, scopes=tuple(states))

    def _recorded(self, raws: list[RawScope], now: float) -> dict[str, dict[str, int]]:
        """The limits recorded in the history of scopes Redis counts for but no limit governs.

        Only for a scope with neither configured nor learned limits whose
        state holds a day count or leases (rare): one pipelined read of its
        history since the day window began (00:00 UTC), at most 25 hashes.
        """
        blind = [
            r.scope
            for r in raws
            if r.scope not in self.limits and not r.learned and uncounted_day(r, now)
        ]
        if not blind:
            return {}
        minutes = min(HISTORY_MINUTES, int(now % 86_400) // 60 + 1)
        past = read_redis_history(self._client, self.prefix, blind, minutes, now)
        return {scope: recorded_limits(past.get(scope)) for scope in blind}
