"""Requests an SDK sent inside one attempt of the loop: the attempt ledger's SDK layer.

Stacked retries multiply, so rateloop owns them; where a user keeps SDK retries on,
the ledger still learns how many requests the provider saw:

- a client built by :mod:`rateloop.integrations.sdk` counts every request it sends (an
  httpx request hook calling :func:`count_request`); the loop reads the count around each
  attempt (:func:`counting_requests`), so retries inside a *successful* attempt count too;
- otherwise :func:`sdk_retries_taken` reads a raw response's ``retries_taken``
  (``with_raw_response``), or the ``x-stainless-retry-count`` header of the last request
  an SDK error kept.
"""

from __future__ import annotations

from contextvars import ContextVar

__all__ = ["acount_request", "count_request", "counting_requests", "sdk_retries_taken"]

# Requests sent by helper-built clients during the current attempt (None: not counting).
_requests_seen: ContextVar[list[int] | None] = ContextVar("rateloop_sdk_requests", default=None)


class counting_requests:  # a function's name: it is used as one, ``with counting_requests()``
    """Count the requests helper-built clients send inside the block: ``box[0]``.

    A class rather than a ``@contextmanager`` generator: it runs around every
    attempt, and a generator-based manager costs several times as much.

    >>> with counting_requests() as sent:
    ...     count_request(object())
    >>> sent
    [1]
    """

    __slots__ = ("_token",)

    def __enter__(self) -> list[int]:
        box = [0]
        self._token = _requests_seen.set(box)
        return box

    def __exit__(self, *exc: object) -> None:
        _requests_seen.reset(self._token)


def count_request(request: object) -> None:
    box = _requests_seen.get()
    if box is not None:
        box[0] += 1


async def acount_request(request: object) -> None:
    count_request(request)


def sdk_retries_taken(obj: object) -> int:
    """Retries an SDK took for ``obj`` (response, raw response or exception); 0 if unknown."""
    for name in ("retries_taken", "_retries_taken"):
        value = getattr(obj, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    response = getattr(obj, "response", None)
    request = getattr(response, "request", None) if response is not None else None
    headers = getattr(request, "headers", None)
    if headers is not None:
        try:
            raw = headers.get("x-stainless-retry-count")
        except Exception:
            raw = None
        if raw is not None:
            try:
                count = int(raw)
            except (TypeError, ValueError):
                return 0
            return max(count, 0)
    return 0
