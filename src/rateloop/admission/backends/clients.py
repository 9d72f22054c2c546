"""The connections of the Redis backend: redis-py clients, and the lanes the hot path keeps.

How it works.  redis-py runs each command through its pool (get/release),
retry and observability hooks -- about as long as an admission script takes
in Redis.  :class:`RedisClients` instead sends the packed command
(:mod:`.wire`) on a connection it keeps -- a *lane*: one for the sync
client (:func:`exchange`), one per event loop (:class:`AsyncLane`,
:func:`alane`); a thread or task that finds it in use takes a pooled
connection.  A server that does not know a script yet (``NOSCRIPT``:
freshly started, restarted or flushed) gets it once with ``EVAL``, which
caches it.  redis-py's connections disconnect themselves on any error or
cancellation while sending or reading, so a call cut off before its answer
(deadline, cancellation) never leaves that answer for the next.  On a Redis
Cluster the sync path sends the command the same way, on a pooled connection
of the node that redis-py's slot map names for the call's keys (one hash tag:
one slot), and goes through redis-py's cluster client only when the map is out
of date (``MOVED``, ``ASK``, a node down); the async path goes through
redis-py's async cluster client.  redis-py's errors
are translated here, at one boundary: :class:`.protocol.BackendUnreachable`
for a server that cannot be reached, :class:`~rateloop.errors.BackendError`
otherwise.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from rateloop.admission.backends.codec import ScriptCall
from rateloop.admission.backends.protocol import BackendUnreachable
from rateloop.admission.backends.scripts import Script
from rateloop.admission.backends.wire import as_eval
from rateloop.errors import BackendError

try:
    import redis
    import redis.asyncio as aredis
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.cluster import RedisCluster
    from redis.exceptions import AskError, ClusterDownError, NoScriptError, TryAgainError
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "the Redis limiter backend needs redis-py: pip install 'rateloop[redis]'"
    ) from exc

__all__ = [
    "AsyncLane",
    "RedisClients",
    "alane",
    "apooled",
    "bounded",
    "exchange",
    "exchange_many",
]

#: A cluster's answers that a call goes elsewhere (its slot map is out of date, or the
#: slot is moving): redis-py's cluster client follows them (MovedError is an AskError).
_REROUTED = (AskError, TryAgainError, ClusterDownError)

_HOW_TO_START = (
    "start Redis (e.g. `redis-server` or `docker run -d -p 6379:6379 redis:7`), "
    "or build the limiter with on_unreachable='local' to fall back to a per-process limiter"
)


def exchange(conn: Any, script: Script, packed: bytes, timeout: float | None) -> Any:
    """Send one packed ``EVALSHA`` on ``conn``, read its answer (``EVAL`` on NOSCRIPT).

    redis-py's connection disconnects itself on any error while sending or
    reading, so the next use reconnects; ``timeout`` (the caller's
    deadline) bounds the read instead of the client's socket timeout.
    """
    try:
        conn.send_packed_command([packed])
        try:
            return _read(conn, timeout)
        except NoScriptError:
            # Not in this server's cache yet (a fresh or restarted server): EVAL
            # sends the text and caches it, so the next EVALSHA finds it.
            conn.send_packed_command([as_eval(script, packed)])
            return _read(conn, timeout)
    except (TimeoutError, redis.TimeoutError) as exc:
        conn.disconnect()  # its answer may still come: never reuse the connection
        if timeout is None:
            raise
        raise redis.TimeoutError(f"no answer within the caller's {timeout:.3f} s") from exc


def exchange_many(conn: Any, calls: list[ScriptCall]) -> list[Any]:
    """Send every call's packed ``EVALSHA`` on ``conn`` in one write, read the answers in
    order: each reply, or the error Redis answered for that call (the rest still run).

    A call whose script is not in the server's cache yet is sent again alone, as
    ``EVAL`` (:func:`exchange`).  An error of the connection itself is raised.
    """
    conn.send_packed_command([call.packed_command() for call in calls])
    replies: list[Any] = []
    for _ in calls:
        try:
            replies.append(conn.read_response())
        except redis.ResponseError as exc:  # this call's error: the answer was read
            replies.append(exc)
    for i, reply in enumerate(replies):
        if isinstance(reply, NoScriptError):
            call = calls[i]
            try:
                replies[i] = exchange(conn, call.script, call.packed_command(), None)
            except redis.ResponseError as exc:  # this call's error, as above
                replies[i] = exc
    return replies


def _read(conn: Any, timeout: float | None) -> Any:
    """The answer on ``conn``, within ``timeout`` when one is given."""
    if timeout is None:
        return conn.read_response()
    return conn.read_response(timeout=max(timeout, 0.001))


class AsyncLane:
    """An event loop's client and the connection its admissions use while it is free.

    One loop runs one task at a time: a flag, not a lock, tells whether a task is
    waiting on the lane's answer (others then take a connection from the pool).
    """

    __slots__ = ("busy", "client", "conn")

    def __init__(self, client: aredis.Redis | AsyncRedisCluster) -> None:
        self.client = client
        self.conn: Any = None  # a redis.asyncio Connection (untyped in redis-py)
        self.busy = False


async def _aexchange(conn: Any, script: Script, packed: bytes) -> Any:
    """:func:`exchange`, async: an error or a cancellation disconnects ``conn``."""
    await conn.send_packed_command([packed])
    try:
        return await conn.read_response()
    except NoScriptError:
        await conn.send_packed_command([as_eval(script, packed)])
        return await conn.read_response()


async def alane(entry: AsyncLane, client: aredis.Redis, script: Script, packed: bytes) -> Any:
    conn = entry.conn
    if conn is None:  # connecting is part of the round trip the caller's deadline bounds
        conn = entry.conn = await client.connection_pool.get_connection()  # type: ignore[no-untyped-call]
    return await _aexchange(conn, script, packed)


async def apooled(client: aredis.Redis, script: Script, packed: bytes) -> Any:
    pool = client.connection_pool
    conn = await pool.get_connection()  # type: ignore[no-untyped-call]
    try:
        return await _aexchange(conn, script, packed)
    finally:
        await pool.release(conn)


async def bounded(step: Any, timeout: float | None) -> Any:
    """``step`` within the caller's ``timeout`` (cancelled after it: its connection closes)."""
    if timeout is None:
        return await step
    return await asyncio.wait_for(step, max(timeout, 0.001))


class RedisClients:
    """The sync client, one async client per event loop, and their lanes, for one URL."""

    def __init__(self, raw_url: str, url: str, *, cluster: bool, options: dict[str, Any]) -> None:
        self._raw_url = raw_url
        self.url = url  # redacted: for messages
        self.cluster = cluster
        self._options = options
        self._lock = threading.Lock()
        self._client: redis.Redis | RedisCluster | None = None
        # The sync hot path's own connection, taken from the client's pool once and used
        # by one thread at a time (others take one from the pool meanwhile): a pool's
        # get/release costs as much as the Redis script it brings.
        self._lane: Any = None  # a redis.Connection (untyped in redis-py)
        self._lane_pid = 0
        self._lane_lock = threading.Lock()
        # redis.asyncio connections belong to one event loop: one client per loop.
        self._aclients: dict[asyncio.AbstractEventLoop, AsyncLane] = {}

    def sync_client(self) -> redis.Redis | RedisCluster:
        client = self._client
        if client is None:
            with self._lock:  # threads racing on first use build one client
                client = self._client
                if client is None:
                    client = self._client = (
                        RedisCluster.from_url(self._raw_url, **self._options)
                        if self.cluster
                        else redis.Redis.from_url(self._raw_url, **self._options)
                    )
        return client

    def async_client(self) -> AsyncLane:
        """The running loop's client and its lane (built on first use)."""
        loop = asyncio.get_running_loop()
        entry = self._aclients.get(loop)  # a dict read is atomic: the hot path takes no lock
        if entry is None:
            # Event loops in other threads add and prune entries too: iterate and
            # mutate the dict only under the lock.
            with self._lock:
                for dead in [lp for lp in self._aclients if lp.is_closed()]:
                    del self._aclients[dead]  # its loop is gone; aclose() was not called
                entry = self._aclients.get(loop)
                if entry is None:
                    entry = self._aclients[loop] = AsyncLane(
                        AsyncRedisCluster.from_url(self._raw_url, **self._options)
                        if self.cluster
                        else aredis.Redis.from_url(self._raw_url, **self._options)
                    )
        return entry

    def close(self) -> None:
        """Close the sync client (async clients: ``aclose`` in their event loop)."""
        with self._lane_lock:
            lane, self._lane = self._lane, None
        client, self._client = self._client, None
        if lane is not None and isinstance(client, redis.Redis) and self._lane_pid == os.getpid():
            client.connection_pool.release(lane)
        if client is not None:
            client.close()

    async def aclose(self) -> None:
        """Close the async client of the running loop (and forget clients of closed loops)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._aclients.pop(loop, None)
            for dead in [lp for lp in self._aclients if lp.is_closed()]:
                del self._aclients[dead]
        if entry is not None:
            lane, entry.conn = entry.conn, None
            if lane is not None and isinstance(entry.client, aredis.Redis):
                await entry.client.connection_pool.release(lane)
            await entry.client.aclose()

    def _error(self, exc: Exception) -> BackendError:
        if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
            return BackendUnreachable(
                f"Redis at {self.url} is unreachable ({exc}); {_HOW_TO_START}"
            )
        return BackendError(f"Redis at {self.url} failed: {exc}")

    def run(self, call: ScriptCall, timeout: float | None) -> Any:
        """Run one script call; ``timeout`` (seconds) bounds the round trip; the decoded reply.

        A connection that fails before an answer (a stale pooled connection
        after a Redis restart, a reset) is retried once on a fresh one before
        Redis counts as unreachable.
        """
        try:
            try:
                reply = self._call(call, timeout)
            except redis.ConnectionError:
                reply = self._call(call, timeout)  # once, on a new connection
        except redis.RedisError as exc:
            raise self._error(exc) from exc
        return call.decode(reply)

    def run_many(self, calls: list[ScriptCall]) -> list[Any]:
        """Run ``calls`` pipelined: one write and one read per server (per node of a
        cluster).  Each decoded reply, or the :class:`BackendError` of that call.

        Never sent twice: a connection that fails part-way fails every call on it
        that had no answer read -- and those that had, whose answers it drops (what
        they charged drains; sent again, they would charge twice).
        """
        replies = self._call_many(calls)
        out: list[Any] = []
        for call, answer in zip(calls, replies, strict=True):
            reply = answer
            if isinstance(answer, Exception):
                if not isinstance(answer, _REROUTED):
                    out.append(self._error(answer))
                    continue
                try:  # a cluster's map is out of date: redis-py's client follows it
                    reply = self._cluster_routed(self.sync_client(), call)  # type: ignore[arg-type]
                except redis.RedisError as exc:
                    out.append(self._error(exc))
                    continue
            try:
                out.append(call.decode(reply))
            except Exception as exc:  # a reply this call's decoder cannot read
                out.append(BackendError(f"Redis at {self.url} gave an unreadable answer: {exc}"))
        return out

    def _call_many(self, calls: list[ScriptCall]) -> list[Any]:
        """Each call's raw reply or its exception, one pipeline per server or node."""
        try:
            client = self.sync_client()
            if isinstance(client, redis.Redis):
                return self._pooled_many(client.connection_pool, calls)
            # A cluster: one pipeline per node, by the slot of each call's keys.
            by_node: dict[str, tuple[Any, list[int]]] = {}
            for i, call in enumerate(calls):
                node: Any = client.get_node_from_key(call.keys[0])  # type: ignore[no-untyped-call]
                by_node.setdefault(node.name, (node, []))[1].append(i)
        except redis.RedisError as exc:
            return [exc] * len(calls)
        replies: list[Any] = [None] * len(calls)
        for node, indexes in by_node.values():  # a node that fails fails its calls only
            got = self._pooled_many(
                node.redis_connection.connection_pool, [calls[i] for i in indexes]
            )
            for i, reply in zip(indexes, got, strict=True):
                replies[i] = reply
        return replies

    @staticmethod
    def _pooled_many(pool: Any, calls: list[ScriptCall]) -> list[Any]:
        try:
            conn = pool.get_connection()
        except redis.RedisError as exc:
            return [exc] * len(calls)
        try:
            return exchange_many(conn, calls)
        except redis.RedisError as exc:
            conn.disconnect()  # answers may still be on their way: never reuse it
            return [exc] * len(calls)
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)

    def _call(self, call: ScriptCall, timeout: float | None) -> Any:
        client = self.sync_client()
        if not isinstance(client, redis.Redis):
            return self._cluster_call(client, call, timeout)
        packed = call.packed_command()
        # The lane if no other thread is using it, else a connection from the pool.
        if self._lane_lock.acquire(False):
            try:
                conn = self._lane
                if conn is None or self._lane_pid != os.getpid():  # none yet, or forked
                    conn = self._lane = client.connection_pool.get_connection()
                    self._lane_pid = os.getpid()
                return exchange(conn, call.script, packed, timeout)
            finally:
                self._lane_lock.release()
        pool = client.connection_pool
        conn = pool.get_connection()
        try:
            return exchange(conn, call.script, packed, timeout)
        finally:
            pool.release(conn)

    def _cluster_call(self, client: RedisCluster, call: ScriptCall, timeout: float | None) -> Any:
        """A script call on a cluster: packed, on the node that holds its keys' slot.

        Every key of a call shares one hash tag, so the node holding the first
        key's slot (redis-py's map of the slots) runs the script; the command
        is packed by the backend and sent on a pooled connection of that node,
        as on a single server -- redis-py's cluster machinery costs more than
        the script.  When the map is out of date (``MOVED``/``ASK`` after a
        resharding, a failover, a node gone) the call goes through redis-py's
        cluster client instead, which follows the redirection and refreshes
        the map.
        """
        try:
            node: Any = client.get_node_from_key(call.keys[0])  # type: ignore[no-untyped-call]
            pool = node.redis_connection.connection_pool
            conn = pool.get_connection()
        except (redis.RedisError, AttributeError, IndexError):
            return self._cluster_routed(client, call)
        try:
            return exchange(conn, call.script, call.packed_command(), timeout)
        except (*_REROUTED, redis.ConnectionError):
            return self._cluster_routed(client, call)
        finally:
            pool.release(conn)

    @staticmethod
    def _cluster_routed(client: RedisCluster, call: ScriptCall) -> Any:
        """The call through redis-py's cluster client: it routes by key and follows redirections."""
        sha, text = call.script
        try:
            return client.evalsha(sha, len(call.keys), *call.keys, *call.args)
        except NoScriptError:
            # Not in this server's cache yet (a fresh or restarted server): EVAL
            # sends the text and caches it, so the next EVALSHA finds it.
            return client.eval(text, len(call.keys), *call.keys, *call.args)

    async def arun(self, call: ScriptCall, timeout: float | None) -> Any:
        """The async twin of :meth:`run`."""
        try:
            try:
                reply = await self._acall(call, timeout)
            except redis.ConnectionError:
                reply = await self._acall(call, timeout)
        except redis.RedisError as exc:
            raise self._error(exc) from exc
        except TimeoutError as exc:  # asyncio.wait_for: the caller's deadline passed
            raise self._error(redis.TimeoutError(f"no answer within {timeout} s")) from exc
        return call.decode(reply)

    async def _acall(self, call: ScriptCall, timeout: float | None) -> Any:
        entry = self.async_client()
        client = entry.client
        if not isinstance(client, aredis.Redis):  # a cluster routes by key
            sha, text = call.script
            keys, args = call.keys, call.args

            async def run() -> Any:
                try:
                    return await client.evalsha(sha, len(keys), *keys, *args)
                except NoScriptError:
                    return await client.eval(text, len(keys), *keys, *args)

            return await bounded(run(), timeout)
        packed = call.packed_command()
        if not entry.busy:  # the lane, if no other task of this loop is using it
            entry.busy = True
            try:
                return await bounded(alane(entry, client, call.script, packed), timeout)
            finally:
                entry.busy = False
        return await bounded(apooled(client, call.script, packed), timeout)
