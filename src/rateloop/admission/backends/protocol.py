"""Where limiter state lives: the protocol every backend implements.

A backend executes one operation of :mod:`rateloop.admission.plan`
atomically (``execute`` from threads, ``aexecute`` from asyncio).  A backend
that cannot reach its store raises :class:`BackendUnreachable`, which the
limiter may answer by falling back to a local limiter
(``on_unreachable="local"``).  This module is a leaf: it imports no
implementation (they are in ``memory.py`` and ``redis.py`` and register
themselves in :mod:`.registry`).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from rateloop.errors import BackendError

__all__ = ["Backend", "BackendUnreachable"]


class BackendUnreachable(BackendError):
    """The store behind a backend cannot be reached (connection refused, timeout)."""


@runtime_checkable
class Backend(Protocol):
    """Limiter state storage: one atomic operation per call."""

    url: str

    def execute(self, op: object, *, timeout: float | None = None) -> object:
        """Run one operation atomically and return its result.

        ``timeout``: the seconds a caller's deadline leaves for this round trip
        (a backend with nothing remote may ignore it).
        """
        ...

    async def aexecute(self, op: object, *, timeout: float | None = None) -> object:
        """The async twin of :meth:`execute`."""
        ...

    def close(self) -> None: ...

    async def aclose(self) -> None: ...
