"""How ``rateloop status`` and the dashboard say things: durations, moments, a scope's verdict.

Sans-IO, shared by both views so they cannot disagree.

- :func:`human_duration` -- ``"29 s"``, ``"12 min 5 s"``, ``"1 h 28 min"``, ``"2 d 3 h"``.
- :func:`moment` -- a time of day, with its date when it is not ``now``'s day (UTC).
- :func:`verdict` -- whether a scope admits calls now, and if not until when and why.
  A call on a route is admitted only when every scope of the route admits it
  (:attr:`rateloop.route.Route.scopes`: ``provider:model``, then the project,
  then the tenant), so a scope's verdict takes its ancestors' pauses and spent
  quotas too: a tenant's calls are refused while its project's day quota is
  spent.  A scope refuses while it is paused, or while a dimension that waiting
  a few seconds does not refill is out of headroom: a day quota, the
  concurrency slots, or a bucket the provider blocked.  A per-minute bucket
  empty after a burst is not refusing: it refills within a second or so.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rateloop.observe.state import DimensionState, ScopeState, Snapshot

__all__ = ["Verdict", "ancestors", "human_duration", "inherited_from", "moment", "verdict"]


def human_duration(seconds: float) -> str:
    """A duration as people say it, to its two largest units.

    >>> [human_duration(s) for s in (0.4, 29.6, 60, 725, 5286.9, 93_600)]
    ['0 s', '29 s', '1 min', '12 min 5 s', '1 h 28 min', '1 d 2 h']
    """
    total = max(0, int(seconds))
    for big, small, unit, sub in ((86_400, 3600, "d", "h"), (3600, 60, "h", "min")):
        if total >= big:
            high, rest = divmod(total, big)
            low = rest // small
            return f"{high} {unit} {low} {sub}" if low else f"{high} {unit}"
    if total >= 60:
        minutes, secs = divmod(total, 60)
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    return f"{total} s"


def moment(when: datetime, now: datetime) -> str:
    """``03:06:34``, or ``2026-03-02 03:06:34`` when ``when`` is not on ``now``'s day (UTC).

    >>> from datetime import UTC
    >>> now = datetime(2026, 3, 1, 23, 0, tzinfo=UTC)
    >>> moment(datetime(2026, 3, 1, 23, 30, tzinfo=UTC), now)
    '23:30:00'
    >>> moment(datetime(2026, 3, 2, 0, 0, tzinfo=UTC), now)
    '2026-03-02 00:00:00'
    """
    if when.date() == now.date():
        return when.strftime("%H:%M:%S")
    return when.strftime("%Y-%m-%d %H:%M:%S")


def countdown(when: datetime | None, now: datetime) -> str:
    """``03:06:34 (in 2 h 59 min)``; ``-`` for no moment."""
    if when is None:
        return "-"
    return f"{moment(when, now)} (in {human_duration((when - now).total_seconds())})"


def ancestors(scope: str) -> list[str]:
    """The broader scopes a call on ``scope`` is also admitted by, nearest first.

    >>> ancestors("openai:gpt-5:proj:t-7")
    ['openai:gpt-5:proj', 'openai:gpt-5']
    """
    parts = scope.split(":")
    return [":".join(parts[:n]) for n in range(len(parts) - 1, 1, -1)]


def inherited_from(s: ScopeState, snap: Snapshot) -> ScopeState | None:
    """The nearest ancestor with limits, for a scope with none of its own."""
    if s.dimensions:
        return None
    for name in ancestors(s.scope):
        parent = snap.scope(name)
        if parent is not None and parent.dimensions:
            return parent
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """Whether a scope's calls are admitted now.

    ``state``: ``admitting``, ``paused`` (a pause for every worker) or
    ``refusing`` (a quota or the slots spent, or a bucket the provider
    blocked); ``until`` when that ends (None: not known, e.g. slots held);
    ``why`` the reason, naming the scope it comes from when that is an ancestor.
    """

    state: str
    until: datetime | None = None
    why: str = ""

    def text(self, now: datetime, *, short: bool = False) -> str:
        """``paused until 01:34:41, 1 h 28 min left (period_quota)``, or ``admitting``.

        ``short``: without the moment (``paused, 1 h 28 min left (period_quota)``).
        """
        if self.state == "admitting":
            return "admitting"
        out = self.state
        if self.until is not None:
            left = human_duration((self.until - now).total_seconds())
            out += f", {left} left" if short else f" until {moment(self.until, now)}, {left} left"
        return out + (f" ({self.why})" if self.why else "")

    def to_dict(self, now: datetime) -> dict[str, Any]:
        """What the dashboard draws: the state, the end, the time left and the reason."""
        left = None
        if self.until is not None:
            left = human_duration((self.until - now).total_seconds())
        return {
            "state": self.state,
            "until": self.until.isoformat() if self.until is not None else None,
            "left": left,
            "why": self.why,
            "text": self.text(now),
        }


def _spent(d: DimensionState) -> tuple[datetime | None, str] | None:
    """When a dimension stops refusing and why, or None if it admits."""
    if d.blocked_until is not None:
        return d.blocked_until, f"{d.dimension} blocked by the provider"
    if d.kind == "bucket" or d.headroom >= 1:
        return None
    used = f"{d.used:.0f}/{d.capacity:.0f}"
    if d.kind == "day":
        return d.resets_at, f"{d.dimension} {used} spent"
    return None, f"{d.dimension} {used} in use"


def verdict(s: ScopeState, snap: Snapshot) -> Verdict:
    """``s``'s verdict now, its ancestors' pauses and spent dimensions included."""
    chain = [s] + [p for name in ancestors(s.scope) if (p := snap.scope(name)) is not None]
    paused = [c for c in chain if c.paused_until is not None]
    if paused:
        c = max(paused, key=lambda c: c.paused_until or snap.at)
        until = c.paused_until
        why = c.pause_reason or ""
        if c is not s:
            why = f"{c.scope}: {why}" if why else c.scope
        return Verdict(state="paused", until=until, why=why)
    refusals = [(r, c) for c in chain for d in c.dimensions if (r := _spent(d)) is not None]
    if refusals:
        # The longest known refusal binds; an unknown end (slots held) counts last.
        (until, why), c = max(refusals, key=lambda x: (x[0][0] is not None, x[0][0] or snap.at))
        return Verdict(state="refusing", until=until, why=why if c is s else f"{c.scope}: {why}")
    return Verdict(state="admitting")
