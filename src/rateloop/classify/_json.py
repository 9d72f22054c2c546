"""The JSON form of a :class:`~rateloop.signal.LimitSignal` shared by its writers.

``rateloop classify`` prints it with the evidence lists added; a task
checkpoint stores it with ``reset_at`` in UTC.  Both start from these fields,
in this order.
"""

from __future__ import annotations

from typing import Any

from rateloop.signal import LimitSignal

__all__ = ["signal_dict"]


def signal_dict(signal: LimitSignal) -> dict[str, Any]:
    """The signal's scalar fields, JSON-able (``reset_at`` in ISO 8601, as given)."""
    return {
        "kind": signal.kind.value,
        "retryable": signal.retryable,
        "retry_after": signal.retry_after,
        "reset_at": signal.reset_at.isoformat() if signal.reset_at is not None else None,
        "dimension": signal.dimension.value if signal.dimension is not None else None,
        "provider": signal.provider,
        "request_id": signal.request_id,
        "status": signal.status,
        "code": signal.code,
        "matched": signal.matched,
        "scope": signal.scope,
        "operation": signal.operation,
    }
