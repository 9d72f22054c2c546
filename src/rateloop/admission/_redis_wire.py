"""The Redis protocol on connections the backend keeps: the admission hot path's wire.

redis-py packs every argument and runs each command through its pool
(get/release), retry and observability hooks -- about as long as an
admission script takes in Redis.  The backend instead packs a command once
per plan (:func:`pack`, :func:`bulk`, :func:`number`), sends it on a
connection it keeps (:func:`exchange`; per event loop :class:`AsyncLane`,
:func:`alane`), and falls back to ``EVAL`` with the script's text when the
server answers ``NOSCRIPT`` (:func:`as_eval`).  redis-py's connections
disconnect themselves on any error or cancellation while sending or reading,
so a call cut off before its answer never leaves that answer for the next.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any, NamedTuple

import redis
import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import NoScriptError

__all__ = [
    "AsyncLane",
    "Script",
    "alane",
    "apooled",
    "as_eval",
    "bounded",
    "bulk",
    "evalsha_head",
    "exchange",
    "number",
    "pack",
]


class Script(NamedTuple):
    """A script's SHA-1 (as sent with EVALSHA) and its text (sent once, if the server lacks it)."""

    sha: str
    text: str

    @classmethod
    def of(cls, text: str) -> Script:
        return cls(hashlib.sha1(text.encode()).hexdigest(), text)


def bulk(value: bytes) -> bytes:
    """``value`` as a Redis protocol bulk string."""
    return b"$%d\r\n%b\r\n" % (len(value), value)


_NUMBERS: dict[float, bytes] = {}


def number(value: float) -> bytes:
    """A float argument as a packed bulk string (its ``repr``: exact), cached by value."""
    packed = _NUMBERS.get(value)
    if packed is None:
        packed = bulk(repr(float(value)).encode())
        if len(_NUMBERS) < 4096:
            _NUMBERS[value] = packed
    return packed


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode()


def pack(command: bytes, script: bytes, keys: list[Any], args: list[Any]) -> bytes:
    """``command script len(keys) *keys *args`` in the Redis protocol."""
    parts = [b"*%d\r\n" % (3 + len(keys) + len(args)), bulk(command), bulk(script)]
    parts.append(bulk(b"%d" % len(keys)))
    parts += [bulk(_as_bytes(v)) for v in keys]
    parts += [bulk(_as_bytes(v)) for v in args]
    return b"".join(parts)


def evalsha_head(script: Script, items: int) -> bytes:
    return b"*%d\r\n$7\r\nEVALSHA\r\n$40\r\n%b\r\n" % (items, script.sha.encode())


def as_eval(script: Script, packed: bytes) -> bytes:
    """The ``EVAL`` twin of a packed ``EVALSHA`` command: the text instead of the SHA."""
    star = packed.index(b"\r\n")
    rest = packed[star + 2 + len(b"$7\r\nEVALSHA\r\n$40\r\n") + 40 + 2 :]
    return packed[: star + 2] + bulk(b"EVAL") + bulk(script.text.encode()) + rest


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
