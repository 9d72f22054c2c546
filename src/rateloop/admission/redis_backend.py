"""The Redis backend: every operation is one Lua script, one round trip.

How it works.  Each operation of :mod:`rateloop.admission.plan` is encoded
into ``KEYS``/``ARGV`` and run by one script (``pause.lua``, ``observe.lua``,
``learned.lua``; each prefixed with ``_common.lua``), shipped as package
data.  Admitting and settling run a script generated per plan shape from the
templates ``admit.lua`` and ``settle.lua`` (:mod:`._admit_script`).  Scripts
are called with ``EVALSHA``; a server that does not know a script yet
(``NOSCRIPT``: freshly started, restarted or flushed) gets it once with
``EVAL``, which caches it.  The scripts read the server's ``TIME``, so every
worker agrees on the clock, and they run atomically, so all dimensions of all
scopes are admitted together or not at all, however many processes share
the server.

The hot path packs the command itself (a per-plan head, then only this
call's amounts) and sends it on a connection the backend keeps (one for the
sync client, one per event loop), bypassing redis-py's per-command machinery
(pool get/release, retry and observability hooks), which cost as much as the
script.  A thread or task that finds it in use takes a pooled connection; a
call cut off before its answer (deadline, cancellation) drops its connection.
The cluster client goes through redis-py as usual (it routes by key).

Keys, per scope key ``S`` whose ``provider:model`` is ``R`` (``prefix``
defaults to ``rateloop:``)::

    {prefix}{R}:s:{S}   hash: bucket levels/timestamps, day counts, blocks, AIMD
                        factor, the pause (resume time, reason), its expiry time
    {prefix}{R}:l:{S}   sorted set: the concurrency leases held in scope S, scored by
                        expiry (a call holds its lease in every scope with a limit)
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
import os
import threading
from collections.abc import Callable
from importlib import resources
from typing import Any, NamedTuple

from rateloop._redact import redact_url
from rateloop.admission._admit_script import (
    admit_script,
    argument_count,
    settle_script,
    shape_of,
)
from rateloop.admission.backend import BackendUnreachable
from rateloop.admission.learning import LearnedOp, LearnOp
from rateloop.admission.plan import (
    AdmitOp,
    AdmitPlan,
    AdmitResult,
    Check,
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
    from redis.exceptions import NoScriptError
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "the Redis limiter backend needs redis-py: pip install 'rateloop[redis]'"
    ) from exc

from rateloop.admission._redis_wire import (
    AsyncLane,
    Script,
    alane,
    apooled,
    bounded,
    bulk,
    evalsha_head,
    exchange,
    number,
    pack,
)

__all__ = ["RedisBackend", "redact_url"]

_SCRIPTS = ("pause", "observe", "learned")  # admit, settle: one script per shape

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


class _Call(NamedTuple):
    """One operation encoded: its script, KEYS and ARGV, the decoder of the reply.

    ``packed`` is the whole ``EVALSHA`` command in the Redis protocol when the
    encoder built it already (the admission hot path); the sync path sends it
    as is.
    """

    script: Script
    keys: list[Any]
    args: list[Any]
    decode: Callable[[Any], Any]
    packed: bytes | None = None

    def packed_command(self) -> bytes:
        """The ``EVALSHA`` command in the Redis protocol: as encoded, or packed now."""
        if self.packed is not None:
            return self.packed
        return pack(b"EVALSHA", self.script.sha.encode(), self.keys, self.args)


class _EncodedPlan(NamedTuple):
    """What a plan encodes to, whatever the cost (cached per plan).

    ``head`` is the packed ``EVALSHA`` command up to the first argument (the
    script's SHA, KEYS); ``consts`` per check its constant argument (rate,
    day offset or lease TTL), ``shared`` the packed ``allowed`` and constant
    arguments of a call within its class's shares.
    """

    plan: AdmitPlan
    scopes: tuple[str, ...]
    numbers: dict[str, int]
    keys: list[bytes]
    keys_part: bytes
    script: Script
    head: bytes
    consts: tuple[bytes, ...]
    shared: tuple[bytes, ...]
    decode: Callable[[Any], AdmitResult]


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
        self._scripts = {name: Script.of(_script_text(name)) for name in _SCRIPTS}
        # Scripts generated per plan shape (admit) and per settle shape, by shape.
        self._shaped: dict[Any, Script] = {}
        self._settle_cache: dict[
            tuple[int, bool], tuple[AdmitPlan, Script, bytes, tuple[bytes, ...]]
        ] = {}
        self._lock = threading.Lock()
        self._client: redis.Redis | RedisCluster | None = None
        # The sync hot path's own connection, taken from the client's pool once and used
        # by one thread at a time (others take one from the pool meanwhile): a pool's
        # get/release costs as much as the Redis script it brings.
        self._lane: Any = None  # a redis.Connection (untyped in redis-py)
        self._lane_pid = 0
        self._lane_lock = threading.Lock()
        self._plan_cache: dict[int, _EncodedPlan] = {}
        # The last admission's packed command, by identity of its operation (the limiter
        # reuses one AdmitOp while the cost repeats and no lease makes each call unique).
        self._last_admit: tuple[object, bytes] = (None, b"")
        # redis.asyncio connections belong to one event loop: one client per loop.
        self._aclients: dict[asyncio.AbstractEventLoop, AsyncLane] = {}

    def __repr__(self) -> str:
        return f"RedisBackend({self.url!r}, prefix={self.prefix!r})"

    # -- clients ------------------------------------------------------------------------

    def _sync_client(self) -> redis.Redis | RedisCluster:
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

    def _async_client(self) -> AsyncLane:
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

    # -- the Backend protocol ---------------------------------------------------------------

    def execute(self, op: object, *, timeout: float | None = None) -> object:
        """Run ``op`` in one script; ``timeout`` (seconds) bounds the round trip.

        A connection that fails before an answer (a stale pooled connection
        after a Redis restart, a reset) is retried once on a fresh one before
        Redis counts as unreachable.
        """
        call = self._encode(op, packed=not self.cluster)
        try:
            try:
                reply = self._call(call, timeout)
            except redis.ConnectionError:
                reply = self._call(call, timeout)  # once, on a new connection
        except redis.RedisError as exc:
            raise self._error(exc) from exc
        return call.decode(reply)

    def _call(self, call: _Call, timeout: float | None) -> Any:
        client = self._sync_client()
        if not isinstance(client, redis.Redis):  # a cluster routes by key; its socket timeout
            sha, text = call.script
            try:
                return client.evalsha(sha, len(call.keys), *call.keys, *call.args)
            except NoScriptError:
                # Not in this server's cache yet (a fresh or restarted server): EVAL
                # sends the text and caches it, so the next EVALSHA finds it.
                return client.eval(text, len(call.keys), *call.keys, *call.args)
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

    async def aexecute(self, op: object, *, timeout: float | None = None) -> object:
        call = self._encode(op, packed=not self.cluster)
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

    async def _acall(self, call: _Call, timeout: float | None) -> Any:
        entry = self._async_client()
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

    # -- encoding operations --------------------------------------------------------------------

    def _key(self, kind: str, scope: str) -> str:
        """``{prefix}{provider:model}:{kind}:{scope}``: every key of a route in one slot.

        The hash tag (the part in braces) is the scope's ``provider:model``, which
        all scopes of a route share, so one script may touch them all in a
        Redis Cluster: they live on one node.
        """
        root = ":".join(scope.split(":", 2)[:2])
        return f"{self.prefix}{{{root}}}:{kind}:{scope}"

    def _encode(self, op: object, packed: bool) -> _Call:
        """``op`` as a script call; ``packed``: build the protocol bytes too, if cheaper."""
        if isinstance(op, AdmitOp):
            return self._encode_admit(op, packed)
        if isinstance(op, SettleOp):
            return self._encode_settle(op, packed)
        if isinstance(op, PauseOp):
            return _Call(
                self._scripts["pause"],
                [self._key("s", op.scope)],
                [_fmt(op.seconds), op.reason],
                lambda r: PauseResult(now=float(r[0]), until=float(r[1])),
            )
        if isinstance(op, ObserveOp):
            return self._encode_observe(op)
        if isinstance(op, LearnOp):
            flat = [str(x) for pair in op.limits for x in pair]
            ms = str(int(op.ttl * 1000))
            return _Call(
                self._scripts["learned"], [self._key("k", op.scope)], ["w", ms, *flat], int
            )
        if isinstance(op, LearnedOp):
            scopes = op.scopes
            return _Call(
                self._scripts["learned"],
                [self._key("k", s) for s in scopes],
                ["r"],
                lambda reply: _decode_learned(scopes, reply),
            )
        raise TypeError(f"RedisBackend cannot execute {op!r}")

    def _encoded(self, plan: AdmitPlan) -> _EncodedPlan:
        """The cost-independent encoding of ``plan``: keys, script, packed head, decoder.

        The limiter caches plans per (route, priority), so this runs once per
        plan (recognised by identity); a call then adds its amounts.
        """
        cached = self._plan_cache.get(id(plan))
        if cached is None or cached.plan is not plan:
            cached = self._encode_plan(plan)
            if len(self._plan_cache) >= 4096:
                self._plan_cache.clear()
            self._plan_cache[id(plan)] = cached
        return cached

    def _encode_admit(self, op: AdmitOp, packed: bool) -> _Call:
        """The plan's script and KEYS, and this call's arguments (see ``admit.lua``).

        redis-py packs every argument in Python; on the sync path the command
        is packed here instead, from the plan's packed head and, for a call
        within its class's shares, packed ``allowed`` and constant arguments:
        only the amounts (and a lease id) are new per call.
        """
        encoded = self._encoded(op.plan)
        if not packed:
            args: list[Any] = [_fmt(op.aimd.recover_per_second), _fmt(op.book)]
            if op.plan.lease_scopes:
                args.append(op.lease_id or "-")
            for amount, allowed, const in zip(op.amounts, op.allowed, encoded.consts):  # noqa: B905
                args += [_fmt(amount), _fmt(allowed), const]
            return _Call(encoded.script, encoded.keys, args, encoded.decode)
        last = self._last_admit
        if last[0] is op:
            return _Call(encoded.script, encoded.keys, [], encoded.decode, last[1])
        parts = [encoded.head, number(op.aimd.recover_per_second), number(op.book)]
        if op.plan.lease_scopes:
            parts.append(bulk((op.lease_id or "-").encode()))
        if op.allowed is op.plan.shares:  # the common case: every amount within its share
            for amount, rest in zip(op.amounts, encoded.shared):  # noqa: B905 - parallel
                parts.append(number(amount))
                parts.append(rest)
        else:
            for amount, allowed, const in zip(op.amounts, op.allowed, encoded.consts):  # noqa: B905
                parts += (number(amount), number(allowed), bulk(const))
        command = b"".join(parts)
        if op.lease_id is None:
            self._last_admit = (op, command)
        return _Call(encoded.script, encoded.keys, [], encoded.decode, command)

    def _script(self, key: Any, make: Callable[[Any], str], shape: Any) -> Script:
        """The generated script of a shape (``make(shape)``), built once per backend."""
        script = self._shaped.get(key)
        if script is None:
            script = Script.of(make(shape))
            if len(self._shaped) >= 1024:  # shapes are few; this only bounds the cache
                self._shaped.clear()
            self._shaped[key] = script
        return script

    def _encode_plan(self, plan: AdmitPlan) -> _EncodedPlan:
        scopes = _scopes_of(plan.scopes, (c.scope for c in plan.checks))
        index = {s: i + 1 for i, s in enumerate(scopes)}
        shape = shape_of(plan, index, len(scopes))
        script = self._script(("admit", shape), admit_script, shape)
        names = [self._key("s", scope) for scope in scopes]
        # Then the lease set of each scope with a concurrency limit, in the shape's order.
        names += [self._key("l", scopes[s - 1]) for s in shape[1]]
        # Pre-encoded: redis-py passes bytes through without converting them again.
        keys = [k.encode() for k in names]
        keys_part = bulk(b"%d" % len(keys)) + b"".join(bulk(k) for k in keys)
        head = evalsha_head(script, 3 + len(keys) + argument_count(shape)) + keys_part
        consts = tuple(_fmt(_constant(c)).encode() for c in plan.checks)
        shared = tuple(
            number(share) + bulk(const) for share, const in zip(plan.shares, consts, strict=True)
        )

        def decode(reply: Any) -> AdmitResult:
            if reply.__class__ is int:  # granted: the server time in microseconds
                granted = (True, reply / 1e6, 0.0, None, None, False, None, 0.0, _NO_REFUSAL)
                return _new_tuple(AdmitResult, granted)
            kind = int(reply[0])
            if kind == 2:  # granted while a refusal is in force
                granted = (True, int(reply[1]) / 1e6, 0.0, None, None, False, None, 0.0,
                           _refused(reply[2]))
                return _new_tuple(AdmitResult, granted)
            if kind == 1:  # booked: it starts ``reply[2]`` seconds ahead
                booked = (True, int(reply[1]) / 1e6, 0.0, None, None, False, None,
                          float(reply[2]), _refused(reply[3]))
                return _new_tuple(AdmitResult, booked)
            _, now, wait, scope_i, field, never, paused, reason = reply[:8]
            scope = scopes[int(scope_i) - 1] if int(scope_i) > 0 else None
            return AdmitResult(
                granted=False,
                now=int(now) / 1e6,
                wait=float(wait),
                scope=scope,
                dimension=Dimension(field) if field else None,
                never_fits=bool(int(never)),
                paused_reason=str(reason) if int(paused) else None,
                refused_until=_refused(reply[8]) if len(reply) > 8 else _NO_REFUSAL,
            )

        return _EncodedPlan(
            plan, scopes, index, keys, keys_part, script, head, consts, shared, decode
        )

    def _encode_settle(self, op: SettleOp, packed: bool) -> _Call:
        """The settle script of the plan (its token buckets, a lease or not), its arguments.

        Every token bucket of the plan is sent, with a zero delta where the op
        has none (settling zero writes the bucket's drained level: the same
        state), so a plan has one settle script, loaded once.  Like an
        admission, the command is packed here on the sync path, from a head
        (SHA, KEYS) and the buckets' rates packed once per plan.
        """
        plan = op.plan
        encoded = self._encoded(plan)
        has_lease = bool(plan.lease_scopes) and op.lease_id is not None
        entry = self._settle_cache.get((id(plan), has_lease))
        if entry is None or entry[0] is not plan:
            entry = self._settle_entry(encoded, has_lease)
        _, script, head, rates = entry
        deltas = op.deltas
        if len(deltas) != len(rates):  # some buckets unchanged: zeros in their places
            given = dict(zip(map(id, op.checks), deltas, strict=True))
            deltas = tuple(given.pop(id(c), 0.0) for c, _ in plan.refunds)
            if given:
                raise ValueError(f"a settle may only adjust its plan's token buckets: {op.checks}")
        lease_id = op.lease_id or ""
        if not packed:
            args: list[Any] = [_fmt(op.aimd.recover_per_second), _fmt(op.starts_at), lease_id]
            for rate, delta in zip(rates, deltas, strict=True):
                args += [rate, _fmt(delta)]
            return _Call(script, encoded.keys, args, _settled)
        parts = [head, number(op.aimd.recover_per_second), bulk(repr(op.starts_at).encode())]
        parts.append(bulk(lease_id.encode()))
        for rate, delta in zip(rates, deltas, strict=True):
            parts += (bulk(rate), number(delta))
        return _Call(script, encoded.keys, [], _settled, b"".join(parts))

    def _settle_entry(
        self, encoded: _EncodedPlan, has_lease: bool
    ) -> tuple[AdmitPlan, Script, bytes, tuple[bytes, ...]]:
        plan = encoded.plan
        numbers = encoded.numbers
        checks = [c for c, _ in plan.refunds]
        # The lease sets follow the state hashes in KEYS; the lease leaves every one.
        nhashes = len(encoded.scopes)
        leases = tuple(range(nhashes + 1, len(encoded.keys) + 1)) if has_lease else ()
        adjust = tuple((numbers[c.scope], c.dimension.value, c.scaled) for c in checks)
        shape = (leases, adjust)
        script = self._script(("settle", shape), settle_script, shape)
        items = 3 + len(encoded.keys) + 3 + 2 * len(checks)
        head = evalsha_head(script, items) + encoded.keys_part
        entry = (plan, script, head, tuple(_fmt(c.rate).encode() for c in checks))
        if len(self._settle_cache) >= 4096:
            self._settle_cache.clear()
        self._settle_cache[(id(plan), has_lease)] = entry
        return entry

    def _encode_observe(self, op: ObserveOp) -> _Call:
        a = op.aimd
        args = [
            "1" if op.lower else "0",
            _fmt(a.decrease),
            _fmt(a.floor),
            _fmt(a.recover_per_second),
            _fmt(a.cooldown),
            "1" if op.refused else "0",
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
        return _Call(self._scripts["observe"], [self._key("s", op.scope)], args, _observed)


_NO_REFUSAL = float("-inf")


def _refused(text: Any) -> float:
    """A script's ``refused_until`` ('0': none in force)."""
    value = float(text)
    return value if value > 0.0 else _NO_REFUSAL


def _settled(reply: Any) -> tuple[float, float]:
    """settle.lua's answer: ``(now, refused_until)``."""
    if reply.__class__ is int:
        return reply / 1e6, _NO_REFUSAL
    return int(reply[0]) / 1e6, _refused(reply[1])


def _observed(reply: Any) -> tuple[float, float]:
    """observe.lua's answer: ``(factor, refused_until)``."""
    return float(reply[0]), _refused(reply[1])


def _constant(check: Check) -> float:
    """A check's constant argument of the admission script: rate, day offset or lease TTL."""
    if check.kind is CheckKind.DAY:
        return check.offset
    if check.kind is CheckKind.LEASE:
        return check.ttl
    return check.rate


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
