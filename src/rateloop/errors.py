"""Exceptions raised by rateloop.

::

    RateloopError
    ├── ConfigError          bad configuration: names the source, key, value and what is allowed
    ├── BackendError         a store (Redis, PostgreSQL) that cannot be reached
    └── RateLimitExhausted   a call ended without success; carries the final Outcome

    SdkRetriesWarning (a UserWarning)   an SDK retried inside a loop attempt
    LimitsWarning (a UserWarning)       a [limits] key that the calls' routes do not match
    PolicyWarning (a UserWarning)       a later policy layer tried to change a locked value

The areas raise subclasses of these roots, each defined beside the code that raises it:
``BackendUnreachable`` (a ``BackendError``), ``AdmissionTimeout`` and
``AdmissionRejected`` (admission), ``AdmissionRefused`` (a ``RateLimitExhausted``, the
transports), ``StreamInterrupted`` (a stream that failed mid-way), ``BodyTooLarge``
(a response past the transport's cap), ``SimulationStuck`` and ``MissingExtra`` (the
simulator).

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
    "PolicyWarning",
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


class PolicyWarning(UserWarning):
    """A later layer tried to change a locked value; the change was not applied.

    Kept on ``Policy.warnings`` (and logged once); a real :class:`Warning`, so an
    application may also ``warnings.warn(w)`` it or filter it.
    """

    __slots__ = ("attempted_value", "kept_value", "layer", "locked_by", "path")

    def __init__(
        self, *, path: str, layer: str, attempted_value: Any, kept_value: Any, locked_by: str
    ) -> None:
        self.path = path
        self.layer = layer
        self.attempted_value = attempted_value
        self.kept_value = kept_value
        self.locked_by = locked_by
        super().__init__(str(self))

    def _key(self) -> tuple[Any, ...]:
        return (self.path, self.layer, self.attempted_value, self.kept_value, self.locked_by)

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception pickles from ``args``; this one is built from keywords.
        return (_policy_warning, self._key())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PolicyWarning):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash((self.path, self.layer, self.locked_by))

    def __str__(self) -> str:
        return redact(
            f"{self.layer} tried to set {self.path} = {self.attempted_value!r}; "
            f"kept {self.kept_value!r} (locked by {self.locked_by})"
        )

    def __repr__(self) -> str:
        # Both values may be backend URLs with a password: the repr hides them like __str__.
        return redact(
            f"PolicyWarning(path={self.path!r}, layer={self.layer!r}, "
            f"attempted_value={self.attempted_value!r}, kept_value={self.kept_value!r}, "
            f"locked_by={self.locked_by!r})"
        )


def _policy_warning(
    path: str, layer: str, attempted_value: Any, kept_value: Any, locked_by: str
) -> PolicyWarning:
    """Rebuild a :class:`PolicyWarning` (pickle, copy)."""
    return PolicyWarning(
        path=path,
        layer=layer,
        attempted_value=attempted_value,
        kept_value=kept_value,
        locked_by=locked_by,
    )
