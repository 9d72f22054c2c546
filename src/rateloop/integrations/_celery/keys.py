"""The record of each keyed write a Celery task makes, in Redis: at most once per key.

How it works.  Celery delivers a task at least once: with ``acks_late`` a worker killed
mid-task (SIGKILL, OOM, a lost node) leaves its message unacknowledged and the broker
hands it to another worker.  For a model call that is harmless; for a write (a task
marked ``idempotent=False``) it would repeat the side effect.  So each write is recorded
under its idempotency key, in one Redis hash per key:

- before the write runs, :meth:`WriteKeys.begin` marks the key *started* by this delivery
  (a token of its own), atomically; it finds instead the key *done* (an earlier delivery
  finished: its stored result is returned, nothing runs) or *started* by another delivery
  (that one died or was redelivered before the write's answer was recorded: *in doubt*);
- the write's answer ends the mark: :meth:`finish` records *done* with the result (before
  the task returns, so before Celery acknowledges the message), :meth:`clear` removes the
  mark of a write that was refused (the provider said no: nothing landed);
- an in-doubt key is settled by the task's ``outcome_check`` (the rule of
  :func:`rateloop.tasks.flow.earlier_write`, shared); :meth:`take_over` then moves the mark
  to the delivery that runs the write again.

A record lives ``ttl_secs`` (a week by default): longer than any redelivery can come.
Redis errors are translated here into :class:`~rateloop.errors.BackendError`, which names
the server and how to start it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, cast

from rateloop._redact import redact_url
from rateloop.errors import BackendError

try:
    import redis
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "rateloop.integrations.celery needs redis-py: pip install 'rateloop[celery]'"
    ) from exc

__all__ = ["Begun", "WriteKeys"]

#: How long a key's record is kept (seconds): a week.
DEFAULT_TTL_SECS = 7 * 24 * 3600


@dataclass(frozen=True, slots=True)
class Begun:
    """What :meth:`WriteKeys.begin` found: run the write (``fresh``), its stored result
    (``done``), or an earlier delivery's unanswered write (``in_doubt``, by ``holder``)."""

    state: Literal["fresh", "done", "in_doubt"]
    payload: bytes | None = None
    content_type: str | None = None
    content_encoding: str | None = None
    holder: str | None = None


class WriteKeys:
    """Each keyed write's record, in the Redis at ``url`` (keys under ``prefix``)."""

    def __init__(
        self, url: str, *, prefix: str = "rateloop:celery:write:", ttl_secs: int = DEFAULT_TTL_SECS
    ) -> None:
        if not isinstance(ttl_secs, int) or isinstance(ttl_secs, bool) or ttl_secs < 1:
            raise ValueError(f"ttl_secs must be an int >= 1 (seconds), got {ttl_secs!r}")
        self.url, self.prefix, self.ttl_secs = url, prefix, ttl_secs
        self._redis = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=10)

    def __repr__(self) -> str:
        return f"WriteKeys({redact_url(self.url)!r}, prefix={self.prefix!r})"

    def begin(self, key: str, token: str) -> Begun:
        """Mark ``key`` started by ``token`` unless it is done or started already."""

        def step(pipe: Any) -> Begun:
            found = pipe.hgetall(self._key(key))
            state = found.get(b"state")
            if state == b"done":
                return Begun("done", payload=found.get(b"payload", b""),
                             content_type=found.get(b"content_type", b"").decode(),
                             content_encoding=found.get(b"content_encoding", b"").decode())
            if state == b"started":
                return Begun("in_doubt", holder=found.get(b"token", b"").decode())
            pipe.multi()
            pipe.hset(self._key(key), mapping={"state": "started", "token": token})
            pipe.expire(self._key(key), self.ttl_secs)
            return Begun("fresh")

        return cast(Begun, self._transaction(step, key))

    def take_over(self, key: str, holder: str, token: str) -> bool:
        """Move an in-doubt mark from ``holder`` to ``token``; False if it changed meanwhile."""

        def step(pipe: Any) -> bool:
            found = pipe.hgetall(self._key(key))
            if found.get(b"state") != b"started" or found.get(b"token", b"").decode() != holder:
                return False
            pipe.multi()
            pipe.hset(self._key(key), "token", token)
            return True

        return bool(self._transaction(step, key))

    def finish(self, key: str, payload: bytes, content_type: str, content_encoding: str) -> None:
        """The write landed: ``key`` is done, with its serialized result."""

        def done(r: Any) -> Any:
            pipe = r.pipeline(transaction=True)
            pipe.hset(self._key(key), mapping={
                "state": "done", "payload": payload, "content_type": content_type,
                "content_encoding": content_encoding})
            pipe.expire(self._key(key), self.ttl_secs)
            return pipe.execute()

        self._run(done, key)

    def clear(self, key: str, token: str) -> None:
        """The write was answered without landing: drop ``token``'s mark (not another's)."""

        def step(pipe: Any) -> None:
            found = pipe.hgetall(self._key(key))
            if found.get(b"state") == b"started" and found.get(b"token", b"").decode() == token:
                pipe.multi()
                pipe.delete(self._key(key))

        self._transaction(step, key)

    def close(self) -> None:
        self._redis.close()

    def _key(self, key: str) -> str:
        return self.prefix + key

    def _transaction(self, step: Any, key: str) -> Any:
        return self._run(lambda r: r.transaction(step, self._key(key), value_from_callable=True),
                         key)

    def _run(self, op: Any, key: str) -> Any:
        try:
            return op(self._redis)
        except redis.RedisError as exc:
            raise BackendError(
                f"the write-key record of key {key!r} at {redact_url(self.url)} failed: "
                f"{type(exc).__name__}: {exc}; start Redis there (e.g. `redis-server`), "
                "or pass write_keys='redis://host:port/db' naming a running one"
            ) from exc
