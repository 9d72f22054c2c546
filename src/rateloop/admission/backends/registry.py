"""The ``from_url`` registry: which backend a URL scheme names.

A leaf, like limits' ``_storage_scheme.py``: implementations register
themselves here when their module is imported (``memory.py``: ``memory://``;
``redis.py``: ``redis://``, ``rediss://``, ``unix://`` and the ``+cluster``
twins), and this module imports none of them.  The package
(``rateloop.admission.backends``) imports the built-in implementations, so
their schemes are known as soon as it is; ``register_backend`` adds another.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rateloop._clock import Clock
from rateloop._url import url_scheme
from rateloop.admission.backends.protocol import Backend
from rateloop.errors import ConfigError

__all__ = ["BackendFactory", "backend_from_url", "register_backend", "registered_schemes"]

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
    factory = _REGISTRY.get(url_scheme(url))
    if factory is None:
        raise ConfigError(
            f"unknown limiter backend URL {url!r}",
            source="code",
            key="limiter.url",
            value=url,
            allowed=", ".join(f"{s}://" for s in registered_schemes()),
        )
    return factory(url, clock=clock, prefix=prefix, **options)
