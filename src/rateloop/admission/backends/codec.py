"""Operations as Redis script calls: ``KEYS``, ``ARGV`` and the decoder of each reply.

How it works.  Each operation of :mod:`rateloop.admission.plan` becomes one
:class:`ScriptCall`: ``pause.lua``, ``observe.lua`` and ``learned.lua`` as
shipped, admitting and settling with the script generated per plan shape
(:mod:`.scripts`).  The hot path packs the command itself
(:mod:`.wire`): the cost-independent part of a plan -- keys, script,
packed head, decoder, an :class:`EncodedPlan` -- is built once per plan
(recognised by identity) and a call adds only its amounts.  Keys are named
by :mod:`.keys`, the one owner of the layout.  A state hash lives until its
state stops mattering (bucket drained, block, pause and day window over,
AIMD factor recovered), plus up to a minute: its TTL is set only when the
state would outlive it, so most admissions run no ``PEXPIRE`` -- one
``TIME``, one ``HMGET`` per scope and one ``HSET`` per written scope.
Pure: no redis-py (the connections are in :mod:`.clients`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from rateloop.admission.backends.keys import HISTORY, LEARNED, LEASES, STATE, key_of
from rateloop.admission.backends.scripts import (
    Script,
    admit_script,
    argument_count,
    script_text,
    settle_script,
    shape_of,
)
from rateloop.admission.backends.wire import bulk, evalsha_head, number, pack
from rateloop.admission.history import HISTORY_TTL_SECONDS
from rateloop.admission.learning import LearnedOp, LearnOp
from rateloop.admission.plan import (
    AdmitOp,
    AdmitPlan,
    AdmitResult,
    BorrowOp,
    Check,
    CheckKind,
    ObserveOp,
    PauseOp,
    PauseResult,
    Refused,
    ReturnOp,
    SettleOp,
)
from rateloop.signal import Dimension

__all__ = ["EncodedPlan", "RedisCodec", "ScriptCall"]

_SCRIPTS = ("pause", "observe", "learned", "lease_return")  # admit, settle: one per shape

_new_tuple = tuple.__new__


def _fmt(value: float) -> str:
    return repr(float(value))


class ScriptCall(NamedTuple):
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


class EncodedPlan(NamedTuple):
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
    settled: Callable[[Any], tuple[float, Refused]]


class RedisCodec:
    """Encodes operations for the scripts under one key ``prefix``; caches per plan and shape.

    ``history``: the admission, settle and pause scripts also write each
    scope's per-minute history (:mod:`rateloop.admission.history`); the
    history bases then follow the other KEYS.
    """

    def __init__(self, prefix: str, *, history: bool = True) -> None:
        self.prefix = prefix
        self.history = history
        self._scripts = {name: Script.of(script_text(name)) for name in _SCRIPTS}
        # Scripts generated per plan shape (admit) and per settle shape, by shape.
        self._shaped: dict[Any, Script] = {}
        self._settle_cache: dict[
            tuple[int, bool], tuple[AdmitPlan, Script, bytes, tuple[bytes, ...]]
        ] = {}
        self._plan_cache: dict[int, EncodedPlan] = {}
        self._borrow_cache: dict[int, tuple[AdmitPlan, Script, bytes, Any]] = {}
        # The last admission's packed command, by identity of its operation (the limiter
        # reuses one AdmitOp while the cost repeats and no lease makes each call unique).
        self._last_admit: tuple[object, bytes] = (None, b"")

    def key(self, kind: str, scope: str) -> str:
        """The key of ``scope``'s ``kind`` under this prefix (:func:`.keys.key_of`)."""
        return key_of(self.prefix, kind, scope)

    def encode(self, op: object, packed: bool) -> ScriptCall:
        """``op`` as a script call; ``packed``: build the protocol bytes too, if cheaper."""
        if isinstance(op, AdmitOp):
            return self._encode_admit(op, packed)
        if isinstance(op, SettleOp):
            return self._encode_settle(op, packed)
        if isinstance(op, BorrowOp):
            return self._encode_borrow(op, packed)
        if isinstance(op, ReturnOp):
            return self._encode_return(op)
        if isinstance(op, PauseOp):
            keys, args = [self.key(STATE, op.scope)], [_fmt(op.seconds), op.reason]
            if self.history:
                keys.append(self.key(HISTORY, op.scope))
                args.append(str(HISTORY_TTL_SECONDS))
            return ScriptCall(
                self._scripts["pause"],
                keys,
                args,
                lambda r: PauseResult(now=float(r[0]), until=float(r[1])),
            )
        if isinstance(op, ObserveOp):
            return self._encode_observe(op)
        if isinstance(op, LearnOp):
            flat = [str(x) for pair in op.limits for x in pair]
            ms = str(int(op.ttl * 1000))
            return ScriptCall(
                self._scripts["learned"], [self.key(LEARNED, op.scope)], ["w", ms, *flat], int
            )
        if isinstance(op, LearnedOp):
            scopes = op.scopes
            return ScriptCall(
                self._scripts["learned"],
                [self.key(LEARNED, s) for s in scopes],
                ["r"],
                lambda reply: _decode_learned(scopes, reply),
            )
        raise TypeError(f"RedisBackend cannot execute {op!r}")

    def encoded(self, plan: AdmitPlan) -> EncodedPlan:
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

    def _encode_admit(self, op: AdmitOp, packed: bool) -> ScriptCall:
        """The plan's script and KEYS, and this call's arguments (see ``admit.lua``).

        redis-py packs every argument in Python; on the sync path the command
        is packed here instead, from the plan's packed head and, for a call
        within its class's shares, packed ``allowed`` and constant arguments:
        only the amounts (and a lease id) are new per call.
        """
        encoded = self.encoded(op.plan)
        if not packed:
            return ScriptCall(encoded.script, encoded.keys, _admit_args(op, encoded),
                              encoded.decode)
        last = self._last_admit
        if last[0] is op:
            return ScriptCall(encoded.script, encoded.keys, [], encoded.decode, last[1])
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
        return ScriptCall(encoded.script, encoded.keys, [], encoded.decode, command)

    def _encode_borrow(self, op: BorrowOp, packed: bool) -> ScriptCall:
        """The plan's borrowing script (``admit.lua`` with its borrow sections), and this
        call's arguments: an admission's, then the most it borrows.  Packed on the sync
        path like an admission.  Answers ``(AdmitResult, k)``."""
        inner = op.op
        encoded = self.encoded(inner.plan)
        script, head, decode = self._borrow_entry(encoded)
        if not packed:
            return ScriptCall(script, encoded.keys, [*_admit_args(inner, encoded), _fmt(op.most)],
                              decode)
        parts = [head, number(inner.aimd.recover_per_second), number(inner.book)]
        if inner.plan.lease_scopes:
            parts.append(bulk((inner.lease_id or "-").encode()))
        for amount, allowed, const in zip(inner.amounts, inner.allowed, encoded.consts):  # noqa: B905
            parts += (number(amount), number(allowed), bulk(const))
        parts.append(number(op.most))
        return ScriptCall(script, encoded.keys, [], decode, b"".join(parts))

    def _borrow_entry(
        self, encoded: EncodedPlan
    ) -> tuple[Script, bytes, Callable[[Any], tuple[AdmitResult, float]]]:
        """A plan's borrowing script, its packed head and its decoder, built once per plan."""
        plan = encoded.plan
        entry = self._borrow_cache.get(id(plan))
        if entry is not None and entry[0] is plan:
            return entry[1], entry[2], entry[3]
        shape = shape_of(plan, encoded.numbers, len(encoded.scopes))
        history = self.history
        script = self._script(
            ("borrow", shape, history),
            lambda sh: admit_script(sh, history=history, borrow=True),
            shape,
        )
        items = 3 + len(encoded.keys) + argument_count(shape, borrow=True)
        head = evalsha_head(script, items) + encoded.keys_part
        plain, scopes = encoded.decode, encoded.scopes

        def decode(reply: Any) -> tuple[AdmitResult, float]:
            if reply.__class__ is not int and int(reply[0]) == 3:  # granted, k more borrowed
                granted = (True, int(reply[1]) / 1e6, 0.0, None, None, False, None, 0.0,
                           _refused(reply[3], scopes))
                return _new_tuple(AdmitResult, granted), float(reply[2])
            return plain(reply), 0.0

        if len(self._borrow_cache) >= 4096:
            self._borrow_cache.clear()
        self._borrow_cache[id(plan)] = (plan, script, head, decode)
        return script, head, decode

    def _encode_return(self, op: ReturnOp) -> ScriptCall:
        """``lease_return.lua``: the state hash of each scope (and its history base)."""
        scopes = tuple(dict.fromkeys(c.scope for c in op.checks))
        index = {scope: i + 1 for i, scope in enumerate(scopes)}
        keys = [self.key(STATE, scope) for scope in scopes]
        if self.history:
            keys += [self.key(HISTORY, scope) for scope in scopes]
        history = "1" if self.history else "0"
        args = [_fmt(op.aimd.recover_per_second), _fmt(op.since), history, HISTORY_TTL_SECONDS]
        for check, borrowed, left in zip(op.checks, op.borrowed, op.left, strict=True):
            scaled = "1" if check.scaled else "0"
            args += [index[check.scope], check.dimension.value, _fmt(check.rate), scaled]
            args += [_fmt(borrowed), _fmt(left)]
        return ScriptCall(self._scripts["lease_return"], keys, args, _returned)

    def _script(self, key: Any, make: Callable[[Any], str], shape: Any) -> Script:
        """The generated script of a shape (``make(shape)``), built once per backend."""
        script = self._shaped.get(key)
        if script is None:
            script = Script.of(make(shape))
            if len(self._shaped) >= 1024:  # shapes are few; this only bounds the cache
                self._shaped.clear()
            self._shaped[key] = script
        return script

    def _encode_plan(self, plan: AdmitPlan) -> EncodedPlan:
        scopes = _scopes_of(plan.scopes, (c.scope for c in plan.checks))
        index = {s: i + 1 for i, s in enumerate(scopes)}
        shape = shape_of(plan, index, len(scopes))
        history = self.history
        script = self._script(
            ("admit", shape, history), lambda sh: admit_script(sh, history=history), shape
        )
        names = [self.key(STATE, scope) for scope in scopes]
        # Then the lease set of each scope with a concurrency limit, in the shape's order.
        names += [self.key(LEASES, scopes[s - 1]) for s in shape[1]]
        if history:  # then each scope's history base, in scope order
            names += [self.key(HISTORY, scope) for scope in scopes]
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
                return _new_tuple(AdmitResult, (True, reply / 1e6, 0.0, None, None, False,
                                                None, 0.0, ()))
            kind = int(reply[0])
            if kind == 2:  # granted while a refusal is in force
                return _new_tuple(AdmitResult, (True, int(reply[1]) / 1e6, 0.0, None, None,
                                                False, None, 0.0, _refused(reply[2], scopes)))
            if kind == 1:  # booked: it starts ``reply[2]`` seconds ahead
                booked = (True, int(reply[1]) / 1e6, 0.0, None, None, False, None,
                          float(reply[2]), _refused(reply[3], scopes))
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
                refused=_refused(reply[8], scopes) if len(reply) > 8 else (),
            )

        def settled(reply: Any) -> tuple[float, Refused]:
            """settle.lua's answer: ``(now, refused)``."""
            if reply.__class__ is int:
                return reply / 1e6, ()
            return int(reply[0]) / 1e6, _refused(reply[1], scopes)

        return EncodedPlan(
            plan, scopes, index, keys, keys_part, script, head, consts, shared, decode, settled
        )

    def _encode_settle(self, op: SettleOp, packed: bool) -> ScriptCall:
        """The settle script of the plan (its token buckets, a lease or not), its arguments.

        Every token bucket of the plan is sent, with a zero delta where the op
        has none (settling zero writes the bucket's drained level: the same
        state), so a plan has one settle script, loaded once.  Like an
        admission, the command is packed here on the sync path, from a head
        (SHA, KEYS) and the buckets' rates packed once per plan.
        """
        plan = op.plan
        encoded = self.encoded(plan)
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
            return ScriptCall(script, encoded.keys, args, encoded.settled)
        parts = [head, number(op.aimd.recover_per_second), bulk(repr(op.starts_at).encode())]
        parts.append(bulk(lease_id.encode()))
        for rate, delta in zip(rates, deltas, strict=True):
            parts += (bulk(rate), number(delta))
        return ScriptCall(script, encoded.keys, [], encoded.settled, b"".join(parts))

    def _settle_entry(
        self, encoded: EncodedPlan, has_lease: bool
    ) -> tuple[AdmitPlan, Script, bytes, tuple[bytes, ...]]:
        plan = encoded.plan
        numbers = encoded.numbers
        checks = [c for c, _ in plan.refunds]
        # The lease sets follow the state hashes in KEYS; the lease leaves every one.
        nhashes = len(encoded.scopes)
        nkeys = len(encoded.keys) - (nhashes if self.history else 0)  # hashes and lease sets
        leases = tuple(range(nhashes + 1, nkeys + 1)) if has_lease else ()
        adjust = tuple((numbers[c.scope], c.dimension.value, c.scaled) for c in checks)
        shape = (leases, adjust)
        base = nkeys if self.history else 0
        script = self._script(
            ("settle", shape, base), lambda sh: settle_script(sh, history_base=base), shape
        )
        items = 3 + len(encoded.keys) + 3 + 2 * len(checks)
        head = evalsha_head(script, items) + encoded.keys_part
        entry = (plan, script, head, tuple(_fmt(c.rate).encode() for c in checks))
        if len(self._settle_cache) >= 4096:
            self._settle_cache.clear()
        self._settle_cache[(id(plan), has_lease)] = entry
        return entry

    def _encode_observe(self, op: ObserveOp) -> ScriptCall:
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
        return ScriptCall(self._scripts["observe"], [self.key(STATE, op.scope)], args, _observed)


_NO_REFUSAL = float("-inf")


def _refused(text: Any, scopes: tuple[str, ...]) -> Refused:
    """A script's refusals in force, ``' index until'`` per scope ('': none), by scope name."""
    words = (text.decode() if isinstance(text, bytes) else str(text)).split()
    return tuple(
        (scopes[int(i) - 1], float(until))
        for i, until in zip(words[::2], words[1::2], strict=True)
    )


def _refused_until(text: Any) -> float:
    """observe.lua's ``refused_until`` of its one scope ('0': none in force)."""
    value = float(text)
    return value if value > 0.0 else _NO_REFUSAL


def _observed(reply: Any) -> tuple[float, float]:
    """observe.lua's answer: ``(factor, refused_until)``."""
    return float(reply[0]), _refused_until(reply[1])


def _returned(reply: Any) -> tuple[float, tuple[float, ...]]:
    """lease_return.lua's answer: ``(now, given back per bucket)``."""
    return int(reply[0]) / 1e6, tuple(float(x) for x in reply[1:])


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


def _admit_args(op: AdmitOp, encoded: EncodedPlan) -> list[Any]:
    """An admission's script arguments, unpacked (``admit.lua``; a borrow adds its most)."""
    args: list[Any] = [_fmt(op.aimd.recover_per_second), _fmt(op.book)]
    if op.plan.lease_scopes:
        args.append(op.lease_id or "-")
    for amount, allowed, const in zip(op.amounts, op.allowed, encoded.consts):  # noqa: B905
        args += [_fmt(amount), _fmt(allowed), const]
    return args
