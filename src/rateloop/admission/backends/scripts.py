"""The Lua scripts of the Redis backend: the fixed ones, and those generated per plan shape.

``pause.lua``, ``observe.lua`` and ``learned.lua`` are used as shipped
(:func:`script_text`, each prefixed with ``_common.lua``); every script is
sent as a :class:`Script` (its SHA-1 and text).  The ``*.lua`` files are
package data of this package (``rateloop.admission.backends``).

How it works (admitting and settling).  A generic script that parses a plan on every call spends
most of its time in the Lua interpreter (splitting words, building tables,
looping), not in Redis.  So each plan *shape* -- the number of scopes, each
check's scope, field, kind and whether it follows the AIMD factor, and
which scopes hold a lease -- gets its own script: the sections of
``admit.lua`` (``--@name``) repeated per scope and per check, with field
names and argument positions filled in (``$x``).  Limits are not part of the
shape: amounts, allowances and rates come as arguments, so every tenant of a
fleet with the same kinds of limits shares one script, and a Redis server
holds a handful of them whatever the number of routes.

:func:`shape_of` gives a plan's shape, :func:`admit_script` its Lua text
(``_common.lua`` first).  The arguments are :func:`argument_count` values:
``recover_per_sec``, ``book``, the lease id when there is a lease, then per
check ``amount``, ``allowed`` and its constant (rate, day offset or lease
TTL).  KEYS are each scope's state hash, then the lease set of each scope
with a concurrency limit (:func:`lease_scopes`): a lease check counts its
own scope's set, and a settle removes the lease from every set.
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from importlib import resources
from string import Template
from typing import NamedTuple

from rateloop.admission.gcra import LEASE_POLL_SECONDS
from rateloop.admission.history import HISTORY_TTL_SECONDS
from rateloop.admission.plan import AdmitPlan, CheckKind

__all__ = [
    "Script",
    "SettleShape",
    "Shape",
    "admit_script",
    "argument_count",
    "lease_scopes",
    "script_text",
    "settle_script",
    "shape_of",
]

_PACKAGE = "rateloop.admission.backends"  # where the *.lua files ship


class Script(NamedTuple):
    """A script's SHA-1 (as sent with EVALSHA) and its text (sent once, if the server lacks it)."""

    sha: str
    text: str

    @classmethod
    def of(cls, text: str) -> Script:
        return cls(hashlib.sha1(text.encode()).hexdigest(), text)


def script_text(name: str) -> str:
    """The text of the shipped script ``{name}.lua``, ``_common.lua`` first."""
    return (
        _common()
        + "\n"
        + resources.files(_PACKAGE).joinpath(f"{name}.lua").read_text(encoding="utf-8")
    )


#: (number of scopes, the scope index (from 1) of each lease set in KEYS order,
#: per check (scope index from 1, field, kind, scaled)).
Shape = tuple[int, tuple[int, ...], tuple[tuple[int, str, str, bool], ...]]

_FIELD = re.compile(r"^[a-z_]+$")  # inlined into Lua string literals: never quotes


def shape_of(plan: AdmitPlan, index: dict[str, int], nscopes: int) -> Shape:
    """The shape of ``plan`` whose scopes are numbered by ``index`` (KEYS order)."""
    checks = tuple((index[c.scope], c.dimension.value, c.kind.value, c.scaled) for c in plan.checks)
    return (nscopes, lease_scopes(checks), checks)


def lease_scopes(checks: tuple[tuple[int, str, str, bool], ...]) -> tuple[int, ...]:
    """The scope index of each lease set, in KEYS order (after the ``nscopes`` hashes)."""
    return tuple(dict.fromkeys(s for s, _, kind, _ in checks if kind == CheckKind.LEASE.value))


def argument_count(shape: Shape, borrow: bool = False) -> int:
    return 2 + (1 if shape[1] else 0) + 3 * len(shape[2]) + (1 if borrow else 0)


@cache
def _sections(name: str = "admit") -> dict[str, Template]:
    package = resources.files(_PACKAGE)
    text = package.joinpath(f"{name}.lua").read_text(encoding="utf-8")
    parts = re.split(r"^--@(\w+)\n", text, flags=re.MULTILINE)
    return {name: Template(body) for name, body in zip(parts[1::2], parts[2::2], strict=True)}


@cache
def _common() -> str:
    package = resources.files(_PACKAGE)
    return package.joinpath("_common.lua").read_text(encoding="utf-8")


def admit_script(shape: Shape, history: bool = False, borrow: bool = False) -> str:
    """The Lua text admitting a plan of ``shape`` (``_common.lua`` included).

    ``history``: a granted call also writes this minute's history of each scope
    checked (:mod:`rateloop.admission.history`); KEYS then end with each
    scope's history base, in scope order.  ``borrow``: a
    :class:`~rateloop.admission.plan.BorrowOp`'s script, which takes the most
    it borrows as its last argument.
    """
    nscopes, leased, checks = shape
    if leased != lease_scopes(checks):
        raise ValueError(f"the lease sets {leased!r} are not those of the checks {checks!r}")
    sec = _sections()
    out = [_common(), f"-- admit.lua for {len(checks)} checks in {nscopes} scopes\n"]
    out.append(sec["head"].substitute())
    first = 3
    if leased:
        out.append(sec["lease_id"].substitute())
        first = 4
    # Each scope's lease set follows the state hashes in KEYS: a check counts its own.
    lease_key = {s: nscopes + 1 + n for n, s in enumerate(leased)}
    # Where each check's fields sit in its scope's HMGET reply, and each scope's fields.
    slots: dict[int, tuple[int, int, int]] = {}
    fields: dict[int, list[str]] = {s: [] for s in range(1, nscopes + 1)}
    for i, (s, field, kind, _) in enumerate(checks):
        if not _FIELD.match(field):
            raise ValueError(f"a Redis admission field must be lowercase letters, got {field!r}")
        if kind == CheckKind.LEASE.value:
            continue
        if kind not in (CheckKind.BUCKET.value, CheckKind.DAY.value):
            raise ValueError(f"no Redis admission for a check of kind {kind!r}")
        at = 5 + len(fields[s])  # after 'p', 'x', 'f', 'e'
        slots[i] = (at, at + 1, at + 2)
        one, two = ("l", "t") if kind == CheckKind.BUCKET.value else ("c", "w")
        fields[s] += [f"{field}:{one}", f"{field}:{two}", f"{field}:b"]
    for i, (s, field, _, _) in enumerate(checks):
        out.append(sec["args"].substitute(i=i, a=first + 3 * i, s=s, F=field))
    for s in range(1, nscopes + 1):
        if fields[s]:
            listed = "".join(f", '{f}'" for f in fields[s])
            out.append(sec["read"].substitute(s=s, fields=listed))
        else:
            out.append(sec["read_pause"].substitute(s=s))
    for i, (s, field, kind, scaled) in enumerate(checks):
        if kind == CheckKind.BUCKET.value:
            lvl, ts, block = slots[i]
            scale = f"r{i} = r{i} * f{s}" if scaled else "-- not scaled by the AIMD factor"
            out.append(
                sec["bucket"].substitute(i=i, s=s, F=field, L=lvl, T=ts, B=block, scale=scale)
            )
        elif kind == CheckKind.DAY.value:
            count, window, block = slots[i]
            out.append(sec["day"].substitute(i=i, s=s, F=field, C=count, W=window, B=block))
        else:
            out.append(
                sec["lease"].substitute(
                    i=i, s=s, F=field, z=lease_key[s], poll=_lua(LEASE_POLL_SECONDS)
                )
            )
    out.append(sec["decide"].substitute())
    if borrow:
        out.append(_borrow_sections(sec, checks, first + 3 * len(checks)))
    for s in range(1, nscopes + 1):
        if not fields[s]:
            continue
        out.append(sec["write_open"].substitute(s=s))
        pairs = []
        for i, (cs, field, kind, _) in enumerate(checks):
            if cs != s:
                continue
            if kind == CheckKind.BUCKET.value:
                out.append(sec["write_bucket"].substitute(i=i))
                pairs.append(f", '{field}:l', level{i}, '{field}:t', at_s")
            elif kind == CheckKind.DAY.value:
                out.append(sec["write_day"].substitute(i=i))
                pairs.append(f", '{field}:c', fmt(n{i} + am{i}), '{field}:w', fmt(ix{i})")
        out.append(sec["write_close"].substitute(s=s, pairs="".join(pairs)))
    for i, (s, _, kind, _) in enumerate(checks):
        if kind == CheckKind.LEASE.value:
            out.append(sec["write_lease"].substitute(i=i, s=s, z=lease_key[s]))
    if history:
        out.append(_history_sections(sec, checks, nscopes, nscopes + len(leased)))
    if borrow:
        out.append(sec["borrow_reply"].substitute())
    out.append(sec["reply"].substitute())
    return "".join(out)


def _borrow_sections(
    sec: dict[str, Template], checks: tuple[tuple[int, str, str, bool], ...], most: int
) -> str:
    """admit.lua's borrowing: ``k`` from every bucket (any other check borrows nothing),
    then each amount taken ``1 + k`` times (``most``: the argument of the most)."""
    out = [sec["borrow_open"].substitute(m=most)]
    for i, (_, _, kind, _) in enumerate(checks):
        part = "borrow_check" if kind == CheckKind.BUCKET.value else "borrow_none"
        out.append(sec[part].substitute(i=i))
    more = "\n".join(f"    am{i} = am{i} * (1 + k)" for i in range(len(checks)))
    out.append(sec["borrow_take"].substitute(more=more))
    return "".join(out)


def _history_sections(
    sec: dict[str, Template],
    checks: tuple[tuple[int, str, str, bool], ...],
    nscopes: int,
    base: int,
) -> str:
    """admit.lua's history writes: per scope checked, one ``history`` call (``$h``: its base).

    Each adds one admission and its units to the minute's record and sets the
    limits in force (``_common.lua``'s ``history``: one HGET, one HSET).
    """
    out = []
    for s in range(1, nscopes + 1):
        ops = []
        for i, (cs, field, kind, _) in enumerate(checks):
            if cs != s:
                continue
            if kind == CheckKind.LEASE.value:
                ops.append(f", '=', 'c:{field}', zc{i} + 1, '=', 'L:{field}', al{i}")
            elif kind == CheckKind.BUCKET.value:  # per minute, at the rate in force
                ops.append(f", '+', 'u:{field}', am{i}, '=', 'L:{field}', r{i} * 60")
            else:
                ops.append(
                    f", '+', 'u:{field}', am{i}, '=', 'c:{field}', n{i} + am{i}, "
                    f"'=', 'L:{field}', al{i}"
                )
        if ops:
            out.append(
                sec["hist"].substitute(s=s, h=base + s, ops="".join(ops), keep=HISTORY_TTL_SECONDS)
            )
    return "".join(out)


#: (the KEYS index of each lease set to release the lease from -- none when the
#: reservation holds no lease --, per adjusted bucket (scope index from 1, field, scaled)).
SettleShape = tuple[tuple[int, ...], tuple[tuple[int, str, bool], ...]]


def settle_script(shape: SettleShape, history_base: int = 0) -> str:
    """The Lua text settling adjustments of ``shape`` (``_common.lua`` included).

    Its arguments: ``recover_per_sec``, ``starts_at``, the lease id, then per
    adjustment its rate and delta.  Each scope's hash is read and written once;
    the lease is removed from every lease set.  ``history_base`` > 0: scope
    ``s``'s history base is ``KEYS[history_base + s]``, and a nonzero delta is
    added to this minute's units there.
    """
    lease_keys, adjustments = shape
    sec = _sections("settle")
    out = [_common(), f"-- settle.lua for {len(adjustments)} buckets\n", sec["head"].substitute()]
    fields: dict[int, list[str]] = {}
    for s, field, _ in adjustments:
        if not _FIELD.match(field):
            raise ValueError(f"a Redis admission field must be lowercase letters, got {field!r}")
        fields.setdefault(s, []).extend((f"{field}:l", f"{field}:t"))
    for s, names in fields.items():
        listed = "".join(f", '{f}'" for f in names)
        out.append(sec["read"].substitute(s=s, fields=listed))
    seen: dict[int, int] = {}
    pairs: dict[int, list[str]] = {}
    for j, (s, field, scaled) in enumerate(adjustments):
        at = 4 + 2 * seen.get(s, 0)  # after 'x', 'f', 'e'
        seen[s] = seen.get(s, 0) + 1
        scale = f" * f{s}" if scaled else ""
        out.append(
            sec["adjust"].substitute(j=j, s=s, a=4 + 2 * j, F=field, L=at, T=at + 1, scale=scale)
        )
        pairs.setdefault(s, []).append(f", '{field}:l', level{j}, '{field}:t', at{j}")
    for s, written in pairs.items():
        out.append(sec["write"].substitute(s=s, pairs="".join(written)))
    for z in lease_keys:
        out.append(sec["lease"].substitute(z=z))
    if history_base:
        for j, (s, field, _) in enumerate(adjustments):
            out.append(
                sec["hist"].substitute(
                    s=s, h=history_base + s, a=4 + 2 * j, F=field, keep=HISTORY_TTL_SECONDS
                )
            )
    out.append(sec["reply"].substitute())
    return "".join(out)


def _lua(value: float) -> str:
    return repr(float(value))
