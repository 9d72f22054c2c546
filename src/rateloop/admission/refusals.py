"""What this process knows of refusals: per scope, until when the provider has nothing.

The backends report refusals in force (a pause, a 429 observed) with each
admission and settle; :class:`Refusals` keeps them for the flows and the
reservations to read (``runner.py`` owns one).
"""

from __future__ import annotations

import math

from rateloop.admission.plan import Refused

__all__ = ["NEVER", "Refusals"]

#: ``-inf``: no refusal known.
NEVER = -math.inf
_NEVER = NEVER


class Refusals:
    """Per scope, until when a refusal this process knows of left the provider with nothing.

    In the backend's time: this process's own refusals (a 429 observed, a
    pause) and other processes' as the shared backend reports them with each
    admission and settle.  One table for the shared backend, one for the
    local fallback (their clocks differ).  Only ever raised.
    """

    __slots__ = ("_local", "_shared")

    def __init__(self) -> None:
        self._shared: dict[str, float] = {}
        self._local: dict[str, float] = {}

    def note(self, refused: Refused, local: bool) -> None:
        """The backend says a refusal in each ``(scope, until)`` left nothing before ``until``.

        Each is kept for the scope it was recorded in, never for the other
        scopes of the route that brought the news: a project's pause is not
        its model's, and the model's other projects keep their bookings.
        """
        known = self._local if local else self._shared
        for scope, until in refused:
            if known.get(scope, _NEVER) < until:
                known[scope] = until

    def before(self, scopes: tuple[str, ...], start: float, local: bool) -> bool:
        """Did a refusal in one of ``scopes`` leave nothing at the backend time ``start``?"""
        known = self._local if local else self._shared
        if not known:
            return False
        return any(known.get(scope, _NEVER) > start for scope in scopes)
