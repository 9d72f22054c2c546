"""The Redis protocol, packed by hand: the admission hot path's wire format.

redis-py packs every argument in Python on every command.  The backend
instead packs a command once per plan (:func:`evalsha_head`, :func:`bulk`,
:func:`number`, :func:`pack`), so a call adds only its amounts;
:func:`as_eval` turns a packed ``EVALSHA`` into its ``EVAL`` twin for a
server that answers ``NOSCRIPT``.  Pure bytes: no redis-py (the connections
that send these are in :mod:`.clients`).
"""

from __future__ import annotations

from typing import Any

from rateloop.admission.backends.scripts import Script

__all__ = ["as_eval", "bulk", "evalsha_head", "number", "pack"]


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
