"""One builder for every door into the RATE loop at the SDK boundary.

A user meets the loop through several doors: a ready client
(``rateloop.openai_client()``), :func:`rateloop_transport`, a transport built
directly (``RateLoopTransport()``), or a framework adapter (LangChain,
pydantic-ai, the OpenAI Agents SDK).  Every one of them is assembled here, so
the doors cannot differ.  The defaults, for a door given nothing:

- **Admission: the self-learning limiter.**  Without ``limiter=`` (or
  ``loop=``), :func:`admission` builds one from the policy's ``[admission]``
  table (in memory by default) with the policy's ``[limits]`` (none by
  default).  It learns the provider's limits from the headers of every
  answer and from its 429s; on a scope it knows nothing about, a few calls
  go first and the others wait for an answer (its cold start,
  ``[admission] cold_start``).  A limiter, loop or policy the user passes is
  used as given.
- **The SDK's retries off** (:data:`SDK_RETRIES`): every SDK client built
  here gets ``max_retries=0``, since stacked retries multiply and the loop
  owns them; a ready client refuses ``max_retries=`` and ``http_client=``
  with the reason (:func:`take_loop_options`), and its copies keep them so
  (``with_options``: :mod:`~rateloop.integrations._ready`).
- **The same warnings**: every request of the HTTP doors runs through the
  one loop (:mod:`rateloop.loop`), which warns of an SDK retrying inside an
  attempt and of ``[limits]`` keys that match no call.

A framework that only asks before a call and tells after it (LangChain's
rate limiter) cannot run the loop around the request; it still gets the
same limiter (and, since it cannot see whether an answer carried headers,
its own first contact: :mod:`~rateloop.integrations._probe`), and
:func:`learn_from_answer` /
:func:`learn_from_refusal` tell that limiter what the provider said, as
the loop does after each attempt (observe the headers; on a refusal,
observe it and pause the scope for the server's minimum).

The doors themselves sit on top: the transports (:mod:`~rateloop.integrations._transport`
builds its loop with :func:`admission`), then the ready clients and
``rateloop_transport()`` (:mod:`~rateloop.integrations.clients`, which pick the
httpx2 or httpx face), then the adapters.  The SDKs are optional: they are
imported on first use (:func:`need`) and a missing one says what to install.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rateloop._clock import Clock
from rateloop.admission import Limiter
from rateloop.classify import classify_exception
from rateloop.integrations._ready import HTTP_CLIENT_REFUSED
from rateloop.loop.args import check_policy
from rateloop.loop.effects import observed_scope, pause_until
from rateloop.loop.sdk_count import acount_request, count_request
from rateloop.policy import Policy
from rateloop.route import Route
from rateloop.signal import Kind

__all__ = [
    "LOOP_OPTIONS",
    "SDK_RETRIES",
    "Admission",
    "admission",
    "learn_from_answer",
    "learn_from_refusal",
    "need",
    "plain_sdk_client",
    "take_loop_options",
]

#: The SDK's own retries on every client a door builds: off, the loop retries.
SDK_RETRIES = 0

#: rateloop's own keyword arguments to a ready client (everything else goes to the SDK).
LOOP_OPTIONS = (
    "policy",
    "limiter",
    "loop",
    "clock",
    "sinks",
    "enabled",
    "max_body_bytes",
    "first_byte_timeout",
    "idle_timeout",
)


@dataclass(frozen=True, slots=True)
class Admission:
    """The policy and limiter a door runs with (the user's, or the defaults)."""

    policy: Policy
    limiter: Any


def admission(
    *, policy: object = None, limiter: Any = None, clock: Clock | None = None
) -> Admission:
    """The policy (checked; ``Policy()`` by default) and the limiter for a door.

    Without ``limiter`` it is the self-learning limiter: ``Limiter.from_policy``
    of the policy, on ``clock``, knowing no limits until the provider's answers
    teach them.

    >>> a = admission()
    >>> a.policy == Policy(), type(a.limiter).__name__, dict(a.limiter.limits)
    (True, 'Limiter', {})
    """
    checked = check_policy(policy)  # raises with the reason
    if limiter is None:
        limiter = Limiter.from_policy(checked, clock=clock)
    return Admission(checked, limiter)


def need(module: str, extra: str) -> Any:
    """Import an optional dependency, or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"this helper needs the {module!r} package: pip install 'rateloop[{extra}]'"
        ) from exc


def take_loop_options(kwargs: MutableMapping[str, Any]) -> dict[str, Any]:
    """Take rateloop's own arguments out of a ready client's ``kwargs``.

    Refuses ``max_retries`` and ``http_client`` (either would take 429
    recovery away from the loop), and resolves the admission once, so the
    transports of one client (google-genai's sync and async) share a limiter.
    """
    for name in ("max_retries", "http_client"):
        if name in kwargs:
            raise TypeError(f"{name}= {HTTP_CLIENT_REFUSED}")
    ours = {name: kwargs.pop(name) for name in LOOP_OPTIONS if name in kwargs}
    if ours.get("loop") is None:
        resolved = admission(
            policy=ours.get("policy"), limiter=ours.get("limiter"), clock=ours.get("clock")
        )
        ours["limiter"] = resolved.limiter
    return ours


def plain_sdk_client(module: str, cls: str, *, is_async: bool, kwargs: dict[str, Any]) -> Any:
    """``module.cls(**kwargs)`` with its retries off (unless given) and requests counted.

    For wrapping calls by hand with ``RateLoop.call``: no transport, so the
    loop around the call does the admitting; the request hook lets the loop
    count any request the SDK sends (:mod:`rateloop.loop.sdk_count`).
    """
    kwargs.setdefault("max_retries", SDK_RETRIES)
    client = getattr(need(module, module), cls)(**kwargs)
    hooks = getattr(getattr(client, "_client", None), "event_hooks", None)
    if isinstance(hooks, dict):
        hooks.setdefault("request", []).append(acount_request if is_async else count_request)
    return client


def learn_from_answer(limiter: Any, route: Route, headers: Mapping[str, str]) -> None:
    """Tell ``limiter`` the rate-limit headers of an answer on ``route``, as the loop does."""
    limiter.observe(route.provider_scope, headers)


def learn_from_refusal(limiter: Any, route: Route, error: BaseException, now: datetime) -> None:
    """Tell ``limiter`` what a failed call on ``route`` said, as the loop does after an attempt.

    The provider speaks for the scope it limits (the project): its signal is
    observed there (headers and a throttle teach the limits), and a server
    minimum pauses the whole scope for every caller sharing the limiter.
    """
    signal = classify_exception(error, now=now)
    scope = observed_scope(signal, route)  # a tool's refusal holds the tool, not the model
    if signal.observed or signal.kind is Kind.TEMPORARY:
        limiter.observe(scope, signal)
    until = pause_until(signal, now)
    if until is not None:
        limiter.pause(scope, until, signal.kind.value)
