"""First contact for the LangChain adapter: until a route's limits are known, one call probes.

Why: zero-config admission learns a provider's limits from the headers of
its answers, and the limiter's own cold start (``admission/known.py``) lets a
few calls go before the first answer, then admits by what it taught -- or,
when the answer carried no rate-limit headers, without limits.  LangChain's
rate-limiter hook only sees an answer's headers when the model includes them
(``ChatOpenAI(include_response_headers=True)``); without them it cannot tell
"the provider states no limits" from "the model hid them", so this adapter
keeps a stricter gate: the first call on a route the limiter knows nothing
about goes alone, the others wait for its end, and an answer that taught
nothing hands the turn to the next call, until headers or a refusal state
the limits.  The HTTP doors (the transports) see every header and rely on the
limiter's cold start alone.

:class:`FirstContact` is the bookkeeping (thread-safe, no waiting); the sync
side waits on a ``threading.Event``, the async one on an ``asyncio.Event``
made on its own loop.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Literal

from rateloop.route import Route

__all__ = ["FirstContact"]

Role = Literal["go", "probe", "wait"]


class FirstContact:
    """Which request probes each unknown scope, and who waits for it.

    >>> gate = FirstContact()
    >>> from rateloop import Route
    >>> route = Route(provider="openai", model="m", project="p")
    >>> gate.role(route, limiter=None)
    'go'
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done: set[str] = set()
        self._probing: dict[str, tuple[threading.Event, list[tuple[Any, asyncio.Event]]]] = {}

    def role(self, route: Route, limiter: Any) -> Role:
        """``go`` (known scope), ``probe`` (you go alone, then :meth:`finish`), or ``wait``."""
        if limiter is None:
            return "go"
        key = route.provider_scope
        with self._lock:
            if key in self._done:
                return "go"
            if any(limiter.limits_for(scope) is not None for scope in route.scopes):
                self._done.add(key)
                return "go"
            if key in self._probing:
                return "wait"
            self._probing[key] = (threading.Event(), [])
            return "probe"

    def finish(self, route: Route, *, learned: bool = True) -> None:
        """The probe of ``route``'s scope answered (or failed): let the waiters go.

        ``learned=False``: the answer taught nothing (no rate-limit headers), so the
        scope stays unknown and the next caller to ask :meth:`role` probes alone again.
        """
        key = route.provider_scope
        with self._lock:
            if learned:
                self._done.add(key)
            entry = self._probing.pop(key, None)
        if entry is None:
            return
        event, async_waiters = entry
        event.set()
        for loop, waiter in async_waiters:
            if loop.is_closed():
                continue
            loop.call_soon_threadsafe(waiter.set)

    def wait(self, route: Route, timeout: float) -> bool:
        """Block until the probe of ``route``'s scope finishes: False when ``timeout`` passed."""
        with self._lock:
            entry = self._probing.get(route.provider_scope)
        return True if entry is None else entry[0].wait(timeout)

    async def await_probe(self, route: Route, timeout: float) -> bool:
        """Await the probe of ``route``'s scope: False when ``timeout`` passed first."""
        loop = asyncio.get_running_loop()
        waiter = asyncio.Event()
        with self._lock:
            entry = self._probing.get(route.provider_scope)
            if entry is None:
                return True
            entry[1].append((loop, waiter))
        try:
            await asyncio.wait_for(waiter.wait(), timeout)
        except TimeoutError:  # a probe that hangs holds nobody forever
            return False
        return True
