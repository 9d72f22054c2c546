"""Scripted fault injection for tests of code that calls providers.

:class:`FaultScript` is a callable for :meth:`rateloop.RateLoop.call`: each
call takes the next item of the script for the route's model and raises it
(an exception), returns it (anything else), or calls it (a callable taking
the route).  It records every route it was called with, so a test asserts
how many calls reached the provider.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rateloop.route import Route

__all__ = ["FaultScript"]


class FaultScript:
    """Replay a script of results, per model or for every route."""

    def __init__(
        self,
        script: Sequence[object] | Mapping[str, Sequence[object]],
        *,
        on_call: Callable[[Route], None] | None = None,
    ) -> None:
        if isinstance(script, Mapping):
            self._scripts: dict[str | None, list[object]] = {k: list(v) for k, v in script.items()}
        else:
            self._scripts = {None: list(script)}
        self._on_call = on_call
        self.calls: list[Route] = []
        self.kwargs: list[dict[str, Any]] = []

    @property
    def models(self) -> list[str]:
        """The model of each call, in order."""
        return [r.model for r in self.calls]

    def _next(self, route: Route) -> object:
        key: str | None = route.model if route.model in self._scripts else None
        queue = self._scripts.get(key)
        if queue is None:
            raise LookupError(f"FaultScript has no script for model {route.model!r}")
        if not queue:
            raise LookupError(f"FaultScript ran out of results for model {route.model!r}")
        # The last item repeats forever, so "always 429" is a one-item script.
        return queue.pop(0) if len(queue) > 1 else queue[0]

    def __call__(self, route: Route, **kwargs: Any) -> Any:
        self.calls.append(route)
        self.kwargs.append(kwargs)
        if self._on_call is not None:
            self._on_call(route)
        item = self._next(route)
        if isinstance(item, BaseException):
            raise item
        if callable(item):
            return item(route)
        return item

    def __repr__(self) -> str:
        return f"FaultScript(calls={len(self.calls)})"
