"""Writes whose effect is unknown.

A non-idempotent call (``idempotent=False``) that fails *after* the request
may have reached the provider — a read timeout, a dropped connection, a 5xx
— may or may not have taken effect.  The loop never retries such a call
blindly: an ``outcome_check`` decides, and without one the call ends
``needs_operator`` with the reason ``unknown_outcome``.

A failure that provably happened before anything was sent (the connection
was refused or never established) is not ambiguous.  Neither is a refusal
the provider answered with (429, 529, 4xx): the provider said no.
"""

from __future__ import annotations

from enum import StrEnum

from rateloop.signal import Kind, LimitSignal

__all__ = ["WriteOutcome", "is_ambiguous_failure", "normalize_write_outcome"]

# Exception class names that mean the request never left (the connection was not made).
_UNSENT = frozenset(
    {
        "ConnectError",
        "ConnectTimeout",
        "ConnectionRefusedError",
        "PoolTimeout",
        "NewConnectionError",
    }
)


class WriteOutcome(StrEnum):
    """What an ``outcome_check`` found out about a write."""

    APPLIED = "applied"
    NOT_APPLIED = "not_applied"
    UNKNOWN = "unknown"


def normalize_write_outcome(verdict: object) -> WriteOutcome:
    """Accept a :class:`WriteOutcome`, its string, or ``True`` / ``False`` / ``None``."""
    if isinstance(verdict, WriteOutcome):
        return verdict
    if verdict is True:
        return WriteOutcome.APPLIED
    if verdict is False:
        return WriteOutcome.NOT_APPLIED
    if verdict is None:
        return WriteOutcome.UNKNOWN
    if isinstance(verdict, str):
        try:
            return WriteOutcome(verdict)
        except ValueError:
            pass
    allowed = ", ".join(repr(w.value) for w in WriteOutcome)
    raise ValueError(
        f"outcome_check returned {verdict!r}; allowed: WriteOutcome, {allowed}, True, False, None"
    )


def _never_sent(error: BaseException | None) -> bool:
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if type(error).__name__ in _UNSENT:
            return True
        error = error.__cause__ or error.__context__
    return False


def is_ambiguous_failure(signal: LimitSignal, error: BaseException | None) -> bool:
    """True when a write may have taken effect although the call failed."""
    if signal.kind is Kind.NETWORK:
        return not _never_sent(error)
    return signal.kind is Kind.SERVER_ERROR
