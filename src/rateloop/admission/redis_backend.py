"""The Redis backend: every operation is one Lua script, one round trip.

How it works.  Each operation of :mod:`rateloop.admission.plan` is encoded
into ``KEYS``/``ARGV`` and run by one script (``admit.lua``, ``settle.lua``,
``pause.lua``, ``observe.lua``; each prefixed with ``_common.lua``), shipped
as package data.  Scripts are registered once per client and called with
``EVALSHA``; a server that does not know a script yet (``NOSCRIPT``: freshly
started, restarted or flushed) gets it once with ``EVAL``, which caches it.  The scripts
read the server's ``TIME``, so every worker agrees on the clock, and they run
atomically, so all dimensions of all scopes are admitted together or not at
all, however many processes share the server.

Keys, per scope key ``S`` whose ``provider:model`` is ``R`` (``prefix``
defaults to ``rateloop:``)::

    {prefix}{R}:s:{S}   hash: bucket levels/timestamps, day counts, blocks, AIMD
                        factor, the pause (resume time, reason), its expiry time
    {prefix}{R}:l:{S}   sorted set: concurrency leases scored by expiry
    {prefix}{R}:k:{S}   hash: limits learned from the provider's headers (zero-config)

``{R}`` is a Redis Cluster hash tag: all scopes of a route share their
``provider:model``, so every key one script touches is in one slot.  A
state hash lives until its state stops mattering (bucket drained, block,
pause and day window over, AIMD factor recovered), plus up to a minute: its
TTL is set only when the state would outlive it, so most admissions run no
``PEXPIRE`` -- one ``TIME``, one ``HMGET`` per scope and one ``HSET`` per
written scope.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from importlib import resources
from typing import Any

from rateloop._redact import redact_url
from rateloop.admission.backend import BackendUnreachable
from rateloop.admission.gcra import LEASE_POLL_SECONDS
from rateloop.admission.learning import LearnedOp, LearnOp
from rateloop.admission.plan import (
    AdmitOp,
    AdmitPlan,
    AdmitResult,
    CheckKind,
    ObserveOp,
    PauseOp,
    PauseResult,
    SettleOp,
)
from rateloop.errors import BackendError
from rateloop.signal import Dimension

try:
    import redis
    import redis.asyncio as aredis
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.cluster import RedisCluster
    from redis.commands.core import AsyncScript, Script
    from redis.exceptions import NoScriptError
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "the Redis limiter backend needs redis-py: pip install 'rateloop[redis]'"
    ) from exc

__all__ = ["RedisBackend", "redact_url"]

_SCRIPTS = ("admit", "settle", "pause", "observe", "learned")

# What a plan encodes to, whatever the cost: (the plan, all scopes, their 1-based index,
# KEYS, the plan argument of admit.lua, the decoder of its reply).
_EncodedPlan = tuple[
    AdmitPlan, tuple[str, ...], dict[str, int], list[bytes], bytes, Callable[[Any], AdmitResult]
]
_new_tuple = tuple.__new__
_HOW_TO_START = (
    "start Redis (e.g. `redis-server` or `docker run -d -p 6379:6379 redis:7`), "
    "or build the limiter with on_unreachable='local' to fall back to a per-process limiter"
)




def _script_text(name: str) -> str:
    package = resources.files("rateloop.admission")
    common = package.joinpath("_common.lua").read_text(encoding="utf-8")
    return common + "\n" + package.joinpath(f"{name}.lua").read_text(encoding="utf-8")


def _fmt(value: float) -> str:
    return repr(float(value))


class RedisBackend:
    """Limiter state in Redis, shared by every process that uses the same prefix."""

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "rateloop:",
        socket_timeout: float = 5.0,
        socket_connect_timeout: float | None = None,
        **options: Any,
    ) -> None:
        if "{" in prefix or "}" in prefix:
            raise ValueError(
                f"a Redis key prefix may not contain braces (they make the cluster hash tag), "
                f"got {prefix!r}"
            )
        scheme, sep, rest = url.partition("://")
        # redis+cluster:// (or rediss+cluster://): a Redis Cluster, through any of its nodes.
        self.cluster = scheme.lower().endswith("+cluster")
        self._raw_url = f"{scheme.lower().removesuffix('+cluster')}{sep}{rest}"
        self.url = redact_url(url)
        self.prefix = prefix
        self._options: dict[str, Any] = {
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": socket_connect_timeout or socket_timeout,
            "decode_responses": True,
            **options,
        }
        self._texts = {name: _script_text(name) for name in _SCRIPTS}
        self._lock = threading.Lock()
        self._client: redis.Redis | RedisCluster | None = None
        self._scripts: dict[str, Script] = {}
        # redis.asyncio connections belong to one event loop: one client per loop.
        self._plan_cache: dict[int, _EncodedPlan] = {}
        self._aclients: dict[
            asyncio.AbstractEventLoop,
            tuple[aredis.Redis | AsyncRedisCluster, dict[str, AsyncScript]],
        ] = {}

    def __repr__(self) -> str:
        return f"RedisBackend({self.url!r}, prefix={self.prefix!r})"

    # -- clients ------------------------------------------------------------------------

    def _sync_scripts(self) -> dict[str, Script]:
        if self._client is None:
            with self._lock:  # threads racing on first use build one client
                if self._client is None:
                    client: redis.Redis | RedisCluster = (
                        RedisCluster.from_url(self._raw_url, **self._options)
                        if self.cluster
                        else redis.Redis.from_url(self._raw_url, **self._options)
                    )
                    self._scripts = {n: client.register_script(t) for n, t in self._texts.items()}
                    self._client = client
        return self._scripts

    def _async_scripts(self) -> dict[str, AsyncScript]:
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
                    client: aredis.Redis | AsyncRedisCluster = (
                        AsyncRedisCluster.from_url(self._raw_url, **self._options)
                        if self.cluster
                        else aredis.Redis.from_url(self._raw_url, **self._options)
                    )
                    scripts = {n: client.register_script(t) for n, t in self._texts.items()}
                    entry = self._aclients[loop] = (client, scripts)
        return entry[1]

    def close(self) -> None:
        """Close the sync client (async clients: ``aclose`` in their event loop)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    async def aclose(self) -> None:
        """Close the async client of the running loop (and forget clients of closed loops)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._aclients.pop(loop, None)
            for dead in [lp for lp in self._aclients if lp.is_closed()]:
                del self._aclients[dead]
        if entry is not None:
            await entry[0].aclose()

    def _error(self, exc: Exception) -> BackendError:
        if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
            return BackendUnreachable(
                f"Redis at {self.url} is unreachable ({exc}); {_HOW_TO_START}"
            )
        return BackendError(f"Redis at {self.url} failed: {exc}")

    # -- the Backend protocol ---------------------------------------------------------------

    def execute(self, op: object, *, timeout: float | None = None) -> object:
        """Run ``op`` in one script; ``timeout`` (seconds) bounds the round trip.

        A connection that fails before an answer (a stale pooled connection
        after a Redis restart, a reset) is retried once on a fresh one before
        Redis counts as unreachable.
        """
        name, keys, args, decode = self._encode(op)
        try:
            try:
                reply = self._call(name, keys, args, timeout)
            except redis.ConnectionError:
                reply = self._call(name, keys, args, timeout)  # once, on a new connection
        except redis.RedisError as exc:
            raise self._error(exc) from exc
        return decode(reply)

    def _call(self, name: str, keys: list[Any], args: list[Any], timeout: float | None) -> Any:
        script = self._sync_scripts()[name]
        client = script.registered_client
        if timeout is None or self.cluster:  # a cluster client keeps its socket timeout
            try:
                return client.evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:
                # Not in this server's cache yet (a fresh or restarted server): EVAL
                # sends the text and caches it, so the next EVALSHA finds it.
                return client.eval(self._texts[name], len(keys), *keys, *args)
        # The caller's deadline bounds this round trip, not the client's socket timeout.
        if not isinstance(self._client, redis.Redis):  # pragma: no cover - built above
            raise redis.ConnectionError("no client")
        pool = self._client.connection_pool
        conn: Any = pool.get_connection()  # redis-py's Connection methods are untyped
        try:
            conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
            try:
                return conn.read_response(timeout=max(timeout, 0.001))
            except NoScriptError:
                conn.send_command("EVAL", self._texts[name], len(keys), *keys, *args)
                return conn.read_response(timeout=max(timeout, 0.001))
        except TimeoutError as exc:
            conn.disconnect()  # its answer may still come: never reuse the connection
            raise redis.TimeoutError(f"no answer within the caller's {timeout:.3f} s") from exc
        finally:
            pool.release(conn)

    async def aexecute(self, op: object, *, timeout: float | None = None) -> object:
        name, keys, args, decode = self._encode(op)
        try:
            try:
                reply = await self._acall(name, keys, args, timeout)
            except redis.ConnectionError:
                reply = await self._acall(name, keys, args, timeout)
        except redis.RedisError as exc:
            raise self._error(exc) from exc
        except TimeoutError as exc:  # asyncio.wait_for: the caller's deadline passed
            raise self._error(redis.TimeoutError(f"no answer within {timeout} s")) from exc
        return decode(reply)

    async def _acall(
        self, name: str, keys: list[Any], args: list[Any], timeout: float | None
    ) -> Any:
        script = self._async_scripts()[name]
        client = script.registered_client

        async def call() -> Any:
            try:
                return await client.evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:
                return await client.eval(self._texts[name], len(keys), *keys, *args)

        if timeout is None:
            return await call()
        return await asyncio.wait_for(call(), max(timeout, 0.001))

    # -- encoding operations --------------------------------------------------------------------

    def _key(self, kind: str, scope: str) -> str:
        """``{prefix}{provider:model}:{kind}:{scope}``: every key of a route in one slot.

        The hash tag (the part in braces) is the scope's ``provider:model``, which
        all scopes of a route share, so one script may touch them all in a
        Redis Cluster: they live on one node.
        """
        root = ":".join(scope.split(":", 2)[:2])
        return f"{self.prefix}{{{root}}}:{kind}:{scope}"

    def _encode(self, op: object) -> tuple[str, list[Any], list[Any], Any]:
        if isinstance(op, AdmitOp):
            return self._encode_admit(op)
        if isinstance(op, SettleOp):
            return self._encode_settle(op)
        if isinstance(op, PauseOp):
            return (
                "pause",
                [self._key("s", op.scope)],
                [_fmt(op.seconds), op.reason],
                lambda r: PauseResult(now=float(r[0]), until=float(r[1])),
            )
        if isinstance(op, ObserveOp):
            return self._encode_observe(op)
        if isinstance(op, LearnOp):
            flat = [str(x) for pair in op.limits for x in pair]
            ms = str(int(op.ttl * 1000))
            return "learned", [self._key("k", op.scope)], ["w", ms, *flat], int
        if isinstance(op, LearnedOp):
            scopes = op.scopes
            return (
                "learned",
                [self._key("k", s) for s in scopes],
                ["r"],
                lambda reply: _decode_learned(scopes, reply),
            )
        raise TypeError(f"RedisBackend cannot execute {op!r}")

    def _encoded(self, plan: AdmitPlan) -> _EncodedPlan:
        """The cost-independent encoding of ``plan``: keys, the plan argument, the decoder.

        The limiter caches plans per (route, priority), so this runs once per
        plan (recognised by identity); a call then adds its amounts.
        """
        cached = self._plan_cache.get(id(plan))
        if cached is None or cached[0] is not plan:
            cached = self._encode_plan(plan)
            if len(self._plan_cache) >= 4096:
                self._plan_cache.clear()
            self._plan_cache[id(plan)] = cached
        return cached

    def _encode_admit(self, op: AdmitOp) -> tuple[str, list[Any], list[Any], Any]:
        """Two arguments whatever the plan: the fixed plan, and this call's amounts.

        redis-py packs every argument in Python, so few arguments are what
        makes one admission cheap on the client.
        """
        encoded = self._encoded(op.plan)
        parts = [op.lease_id or "-", repr(op.aimd.recover_per_second), repr(op.book)]
        for allowed, amount in zip(op.allowed, op.amounts):  # noqa: B905 - parallel by design
            parts.append(repr(allowed))
            parts.append(repr(amount))
        return "admit", encoded[3], [encoded[4], " ".join(parts)], encoded[5]

    def _encode_plan(self, plan: AdmitPlan) -> _EncodedPlan:
        lease = [plan.lease_scope] if plan.lease_scope is not None else []
        scopes = _scopes_of(plan.scopes, [*(c.scope for c in plan.checks), *lease])
        index = {s: i + 1 for i, s in enumerate(scopes)}
        words = [_fmt(LEASE_POLL_SECONDS), str(len(scopes))]
        for c in plan.checks:
            extra = c.offset if c.kind is CheckKind.DAY else c.ttl
            words += [
                str(index[c.scope]),
                c.dimension.value,
                c.kind.value,
                _fmt(c.capacity),
                _fmt(c.rate),
                "1" if c.scaled else "0",
                _fmt(extra),
            ]
        names = [self._key("s", scope) for scope in scopes]
        if plan.lease_scope is not None:
            names.append(self._key("l", plan.lease_scope))

        def decode(reply: list[Any]) -> AdmitResult:
            if len(reply) == 2:
                granted = (True, float(reply[1]), 0.0, None, None, False, None, 0.0)
                return _new_tuple(AdmitResult, granted)
            if len(reply) == 3:  # booked: it starts ``reply[2]`` seconds ahead
                booked = (True, float(reply[1]), 0.0, None, None, False, None, float(reply[2]))
                return _new_tuple(AdmitResult, booked)
            _, now, wait, scope_i, field, never, paused, reason = reply
            scope = scopes[int(scope_i) - 1] if int(scope_i) > 0 else None
            return AdmitResult(
                granted=False,
                now=float(now),
                wait=float(wait),
                scope=scope,
                dimension=Dimension(field) if field else None,
                never_fits=bool(int(never)),
                paused_reason=str(reason) if int(paused) else None,
            )

        # Pre-encoded: redis-py passes bytes through without converting them again.
        keys = [k.encode() for k in names]
        return (plan, scopes, index, keys, " ".join(words).encode(), decode)

    def _encode_settle(self, op: SettleOp) -> tuple[str, list[Any], list[Any], Any]:
        plan = op.plan
        _, _, index, keys, _, _ = self._encoded(plan)
        has_lease = plan.lease_scope is not None and op.lease_id is not None
        args = [
            _fmt(op.aimd.recover_per_second),
            "1" if has_lease else "0",
            op.lease_id or "",
            _fmt(op.starts_at),
        ]
        for c, delta in zip(op.checks, op.deltas, strict=True):
            args += [
                str(index[c.scope]),
                c.dimension.value,
                _fmt(c.rate),
                "1" if c.scaled else "0",
                _fmt(delta),
            ]
        return "settle", keys, args, float

    def _encode_observe(self, op: ObserveOp) -> tuple[str, list[str], list[str], Any]:
        a = op.aimd
        args = [
            "1" if op.lower else "0",
            _fmt(a.decrease),
            _fmt(a.floor),
            _fmt(a.recover_per_second),
            _fmt(a.cooldown),
        ]
        for t in op.tightenings:
            c = t.check
            args += [
                c.dimension.value,
                c.kind.value,
                _fmt(c.capacity),
                _fmt(c.rate),
                "1" if c.scaled else "0",
                _fmt(c.offset),
                "" if t.remaining is None else _fmt(t.remaining),
                "" if t.reset_after is None else _fmt(t.reset_after),
            ]
        return "observe", [self._key("s", op.scope)], args, float


def _decode_learned(scopes: tuple[str, ...], reply: list[Any]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    at = 0
    for scope in scopes:
        count = int(reply[at])
        items = reply[at + 1 : at + 1 + 2 * count]
        at += 1 + 2 * count
        limits: dict[str, float] = {}
        for name, value in zip(items[::2], items[1::2], strict=True):
            try:
                limits[str(name)] = float(value)  # limits are whole; a burst is a fraction
            except ValueError:
                continue  # not ours to interpret
        if limits:
            out[scope] = limits
    return out


def _scopes_of(first: tuple[str, ...], more: Any) -> tuple[str, ...]:
    seen = dict.fromkeys(first)
    for scope in more:
        seen.setdefault(scope)
    return tuple(seen)
