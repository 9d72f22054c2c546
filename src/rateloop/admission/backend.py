"""Where limiter state lives: the backend protocol and the ``from_url`` registry.

A backend executes one operation of :mod:`rateloop.admission.plan`
atomically (``execute`` from threads, ``aexecute`` from asyncio).  Backends
are chosen by URL scheme from an explicit registry; ``register_backend`` adds
one.  A backend that cannot reach its store raises
:class:`BackendUnreachable`, which the limiter may answer by falling back to
a local limiter (``on_unreachable="local"``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

from rateloop._clock import Clock
from rateloop.admission.memory import MemoryBackend
from rateloop.errors import BackendError, ConfigError

__all__ = [
    "Backend",
    "BackendUnreachable",
    "backend_from_url",
    "register_backend",
    "registered_schemes",
]


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


#: ``factory(url, clock=..., prefix=..., **options) -> Backend``
BackendFactory = Callable[..., Backend]

_REGISTRY: dict[str, BackendFactory] = {}


def register_backend(scheme: str, factory: BackendFactory) -> None:
    """Make ``scheme://`` URLs build backends with ``factory``."""
    _REGISTRY[scheme.lower()] = factory


def registered_schemes() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def backend_from_url(url: str, *, clock: Clock, prefix: str, **options: Any) -> Backend:
    """Build the backend for ``url`` (``memory://``, ``redis://host:port/db``, ...)."""
    scheme = urlsplit(url).scheme.lower() if isinstance(url, str) else ""
    factory = _REGISTRY.get(scheme)
    if factory is None:
        raise ConfigError(
            f"unknown limiter backend URL {url!r}",
            source="code",
            key="limiter.url",
            value=url,
            allowed=", ".join(f"{s}://" for s in registered_schemes()),
        )
    return factory(url, clock=clock, prefix=prefix, **options)


def _memory(url: str, *, clock: Clock, prefix: str, **options: Any) -> Backend:
    if options:
        raise TypeError(f"memory:// takes no options, got {sorted(options)}")
    return MemoryBackend(clock)


def _redis(url: str, *, clock: Clock, prefix: str, **options: Any) -> Backend:
    # Lazy: redis-py is an optional extra (rateloop[redis]).
    from rateloop.admission.redis_backend import RedisBackend

    return RedisBackend(url, prefix=prefix, **options)


register_backend("memory", _memory)
for _scheme in ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster"):
    register_backend(_scheme, _redis)
