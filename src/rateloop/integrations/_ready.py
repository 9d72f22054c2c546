"""The ready clients' classes: the SDK's own class, with the RATE loop kept in charge.

A ready client (``rateloop.openai_client()`` and friends) is an instance of
a small subclass of the SDK's class, made once per class by
:func:`ready_class`: ``isinstance(client, openai.OpenAI)`` holds and its
name is the SDK's.  It changes two things at the boundary, and nothing else:

- **Copies keep the loop in charge.**  ``client.with_options(...)`` /
  ``client.copy(...)`` build a new client of the same class around the same
  transport, so the loop is still inside; but ``max_retries=N`` would turn
  the SDK's retries back on around it, and each SDK retry runs the loop's
  whole budget again (an always-503 provider saw 6 requests instead of 2).
  So ``max_retries`` other than 0 is dropped with one
  :class:`~rateloop.errors.SdkRetriesWarning` naming the value and what to
  set instead (the policy's ``max_attempts`` / ``max_error_attempts``): the
  copy's SDK retries stay 0.  ``http_client=`` is refused, as by the
  constructor: it would send the requests around the loop.
- **rateloop's own errors reach the caller as themselves.**  anthropic 2.x
  wraps any exception raised under its HTTP client in
  ``APIConnectionError("Connection error.")``, so an unreachable Redis
  (:class:`~rateloop.admission.backends.BackendUnreachable`) or an
  admission refusal read as a network failure, with the useful message
  only in ``__cause__``.  ``request()`` raises the
  :class:`~rateloop.errors.RateloopError` behind such a wrapper instead,
  as openai 3.x and google-genai already do.  (The body of a stream is read
  after ``request()`` returned: a stream that fails mid-way is still wrapped
  by anthropic, with the ``StreamInterrupted`` as the cause.)
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import MutableMapping
from functools import cache
from typing import Any

from rateloop.errors import RateloopError, SdkRetriesWarning

__all__ = ["HTTP_CLIENT_REFUSED", "keep_loop_in_charge", "own_error", "ready_class"]

#: Why a ready client (or a copy of one) refuses ``http_client=``.
HTTP_CLIENT_REFUSED = (
    "is set by the rateloop client helpers (the RATE loop owns retries and sends through "
    "its transport); build the SDK client yourself with "
    "rateloop.integrations.clients.rateloop_transport() to customise it"
)

# Frames from the warning to the caller of ``with_options``: this function, ``copy``.
_CALLER = 3


def _given(value: object) -> bool:
    """False for the SDKs' "not given" sentinels (``openai.NOT_GIVEN``, ``omit``)."""
    return type(value).__name__ not in ("NotGiven", "Omit")


def keep_loop_in_charge(kwargs: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """The arguments of a ready client's ``copy`` / ``with_options``, the loop kept in charge.

    ``max_retries`` other than 0 is taken out with a warning (the copy keeps
    the SDK's retries at 0); ``http_client`` is refused.
    """
    if kwargs.get("http_client") is not None:
        raise TypeError(f"http_client= {HTTP_CLIENT_REFUSED}")
    if "max_retries" in kwargs:
        asked = kwargs.pop("max_retries")
        if _given(asked) and not (type(asked) is int and asked == 0):
            warnings.warn(
                f"with_options(max_retries={asked!r}) on a rateloop client is ignored: the "
                "SDK's retries stay off (max_retries=0), since each SDK retry would run the "
                "RATE loop's whole budget again. The loop decides how often a call is "
                "retried; to change it, build the client with policy=rateloop.Policy("
                "max_attempts=..., max_error_attempts=...)",
                SdkRetriesWarning,
                stacklevel=_CALLER,
            )
    return kwargs


def own_error(error: BaseException, wrapper: type[BaseException]) -> RateloopError | None:
    """The rateloop error an SDK wrapped in ``wrapper`` (its connection error), if any."""
    cause = error.__cause__
    if isinstance(error, wrapper) and isinstance(cause, RateloopError):
        return cause
    return None


class _Copies:
    """``copy`` / ``with_options`` of a ready client: the copy is a ready client too."""

    def copy(self, **kwargs: Any) -> Any:
        return super().copy(**keep_loop_in_charge(kwargs))  # type: ignore[misc]

    with_options = copy


@cache
def ready_class(base: type[Any], wrapper: type[BaseException]) -> type[Any]:
    """The ready client's class for the SDK class ``base`` (see the module docstring).

    ``wrapper`` is the SDK's connection error, the one it wraps foreign
    exceptions in.  The sync and async classes differ only in awaiting.
    """
    if inspect.iscoroutinefunction(base.request):

        class AsyncReady(_Copies, base):  # type: ignore[misc]
            async def request(self, *args: Any, **kwargs: Any) -> Any:
                try:
                    return await super().request(*args, **kwargs)
                except wrapper as exc:
                    ours = own_error(exc, wrapper)
                    if ours is None:
                        raise
                # Raised here, outside the handler, so it does not chain the SDK's wrapper.
                raise ours

        ready: type[Any] = AsyncReady
    else:

        class Ready(_Copies, base):  # type: ignore[misc]
            def request(self, *args: Any, **kwargs: Any) -> Any:
                try:
                    return super().request(*args, **kwargs)
                except wrapper as exc:
                    ours = own_error(exc, wrapper)
                    if ours is None:
                        raise
                raise ours

        ready = Ready
    ready.__name__ = ready.__qualname__ = base.__name__
    ready.__doc__ = base.__doc__
    return ready
