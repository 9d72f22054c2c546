"""Exceptions raised by rateloop.

::

    RateloopError
    ├── ConfigError          bad configuration: names the source, key, value and what is allowed
    ├── BackendError         a store (Redis, PostgreSQL) that cannot be reached
    └── RateLimitExhausted   a call ended without success; carries the final Outcome

    SdkRetriesWarning (a UserWarning)   an SDK retried inside a loop attempt
    LimitsWarning (a UserWarning)       a [limits] key that the calls' routes do not match

Every message goes through :func:`rateloop._redact.redact`: an error never
shows an API key or a URL password, even when it echoes a bad value.
Caller misuse (a wrong argument type) raises the ordinary ``TypeError`` /
``ValueError``; conditions upstream of the caller are ``RateloopError``.
Third-party errors are translated at one boundary and chained with ``from``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from rateloop._redact import redact

if TYPE_CHECKING:
    from rateloop.outcome.record import Outcome

__all__ = [
    "BackendError",
    "ConfigError",
    "LimitsWarning",
    "RateLimitExhausted",
    "RateloopError",
    "SdkRetriesWarning",
]


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
        self.value = redact(value) if isinstance(value, str) else value
        self.allowed = allowed
        message = redact(message)
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
        super().__init__(redact(text))

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

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class RateLimitExhausted(RateloopError):
    """A call ended without success; ``outcome`` says exactly how."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome
        super().__init__(redact(f"{outcome.status.value}: {outcome.reason}"))


class SdkRetriesWarning(UserWarning):
    """An SDK retried inside one of the loop's attempts (its retries are on).

    Those requests count against ``max_attempts``; build the client with
    ``max_retries=0`` so that one layer decides when to retry.
    """


class LimitsWarning(UserWarning):
    """A call ran on a route that no configured ``[limits]`` key matches, while a key
    has matched no route so far: most likely a key written for another name."""
