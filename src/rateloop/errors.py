"""Exceptions raised by rateloop.

::

    RateloopError
    ├── ConfigError          bad configuration: names the source, key, value and what is allowed
    ├── BackendError         a store (Redis, PostgreSQL) that cannot be reached
    └── RateLimitExhausted   a call ended without success; carries the final Outcome

Caller misuse (a wrong argument type) raises the ordinary ``TypeError`` /
``ValueError``; conditions upstream of the caller are ``RateloopError``.
Third-party errors are translated at one boundary and chained with ``from``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rateloop.outcome import Outcome

__all__ = ["BackendError", "ConfigError", "RateLimitExhausted", "RateloopError"]


class RateloopError(Exception):
    """The root of every rateloop exception."""


class ConfigError(RateloopError, ValueError):
    """Configuration that cannot be used, said precisely.

    The message names where the value came from (``source``: a file, ``env``,
    ``code``), the dot-path ``key``, the offending ``value`` and what is
    ``allowed``.
    """

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        key: str | None = None,
        value: Any = None,
        allowed: str | None = None,
    ) -> None:
        self.source = source
        self.key = key
        self.value = value
        self.allowed = allowed
        self.detail = message
        self.errors: list[ConfigError] = [self]
        parts = []
        if source:
            parts.append(source)
        if key:
            parts.append(key)
        where = ": ".join(parts)
        text = f"{where}: {message}" if where else message
        if allowed:
            text += f" (allowed: {allowed})"
        super().__init__(text)

    @classmethod
    def many(cls, errors: Iterable[ConfigError]) -> ConfigError:
        """Fold several errors into one whose message lists them all."""
        errs = list(errors)
        if len(errs) == 1:
            return errs[0]
        first = errs[0]
        joined = "\n".join(f"  - {e}" for e in errs)
        err = cls(f"{len(errs)} configuration errors:\n{joined}", source=None)
        err.source, err.key, err.value, err.allowed = (
            first.source,
            first.key,
            first.value,
            first.allowed,
        )
        err.errors = errs
        return err


class BackendError(RateloopError):
    """A backend store could not be reached or answered wrongly.

    The message says which store (its URL, with any password hidden) and how
    to start it.
    """


class RateLimitExhausted(RateloopError):
    """A call ended without success; ``outcome`` says exactly how."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome
        super().__init__(f"{outcome.status.value}: {outcome.reason}")
