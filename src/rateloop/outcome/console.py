"""Progress on screen: :class:`ConsoleSink`, a few human lines instead of one per event.

How it works.  The sink receives every capacity event (and, through the
optional ``call_started`` / ``call_finished`` hooks, every call's start and
outcome), keeps counters, and prints only:

- one line when a scope **pauses** (a wait with a server minimum, or an
  admission wait) and one when it **resumes** (the first event or outcome
  on it after the pause ended);
- one line when a call **waits longer** than ``long_wait_secs`` on its own
  backoff;
- one line when a **fallback** is taken, and one when a call **ends without
  success**;
- a **summary** line at most every ``summary_every`` seconds while there
  is activity: calls in flight, waiting, done, degraded, rejected, failed,
  the scopes paused now, and the headroom when a ``headroom`` function is
  given (e.g. one reading the limiter's state; events alone do not carry it).

It never floods: every line but the summary has a topic (its kind and
scope), and a topic prints at most once per ``repeat_secs``; what it holds
back is counted and shown on the topic's next line ("+12 more").  On top,
at most ``max_lines`` topic lines are printed per ``repeat_secs`` window
whatever the number of scopes (fifty tenants refused at once); the rest is
counted on the next summary.  Fifty calls refused together therefore print
a handful of lines, not hundreds.
There is no thread: lines are printed from the calls' own events, with the
time read from the injected clock.  Like every event, the lines carry no
prompt, argument or key.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from rateloop._clock import Clock, system_clock

if TYPE_CHECKING:
    from rateloop.outcome.events import CapacityEvent
    from rateloop.outcome.record import Outcome

__all__ = ["ConsoleSink"]


@dataclass(slots=True)
class _Topic:
    last_printed: float
    held: int = 0


class ConsoleSink:
    """Human-readable progress on a terminal (stderr by default), rate-limited.

    ``RateLoop`` / ``AsyncRateLoop`` add one by default when stderr is a
    terminal and ``sinks`` is not given; pass ``sinks=[ConsoleSink(), ...]``
    to keep it next to your own sinks.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        clock: Clock | None = None,
        summary_every: float = 10.0,
        long_wait_secs: float = 5.0,
        repeat_secs: float = 10.0,
        max_lines: int = 10,
        headroom: Callable[[], str | None] | None = None,
    ) -> None:
        for name, value in (
            ("summary_every", summary_every),
            ("long_wait_secs", long_wait_secs),
            ("repeat_secs", repeat_secs),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ValueError(f"ConsoleSink {name} must be a number >= 0, got {value!r}")
        if headroom is not None and not callable(headroom):
            raise ValueError(
                f"ConsoleSink headroom must be a callable returning text, got {headroom!r}"
            )
        if isinstance(max_lines, bool) or not isinstance(max_lines, int) or max_lines < 1:
            raise ValueError(f"ConsoleSink max_lines must be an int >= 1, got {max_lines!r}")
        self.max_lines = max_lines
        self._window: tuple[float, int] = (float("-inf"), 0)  # (start, lines printed in it)
        self._held_back = 0
        self._headroom = headroom
        self._stream = stream
        self._clock = clock if clock is not None else system_clock
        self.summary_every = float(summary_every)
        self.long_wait_secs = float(long_wait_secs)
        self.repeat_secs = float(repeat_secs)
        self._lock = threading.Lock()
        self._topics: dict[tuple[str, str], _Topic] = {}
        self._paused: dict[str, tuple[float, float, int]] = {}  # scope -> (since, until, calls)
        self._waits: list[float] = []  # when each pending wait ends (monotonic)
        self._started = self._finished = 0
        self._done = self._degraded = self._rejected = self._failed = 0
        self._last_summary: float | None = None
        self._activity = False
        self.lines_printed = 0

    # -- the sink protocol ---------------------------------------------------------

    def __call__(self, event: CapacityEvent) -> None:
        with self._lock:
            now = self._clock.monotonic()
            self._activity = True
            self._resume_expired(now, event.scope)
            decision = str(event.decision)
            scope = event.scope or "?"
            wait = event.wait_seconds or 0.0
            if decision in ("wait", "admission_wait"):
                self._waits.append(now + wait)
                if decision == "admission_wait" or event.retry_after_seconds:
                    self._pause(now, scope, wait, event)
                elif wait >= self.long_wait_secs:
                    self._say(
                        now, ("wait", scope), f"waiting {wait:.0f}s on {scope} ({_why(event)})"
                    )
            elif decision == "fallback":
                self._say(now, ("fallback", scope), f"fallback: {event.reason}")
            self._maybe_summary(now)

    def call_started(self, scope: str) -> None:
        """A call began on ``scope`` (the loop calls this for sinks that define it)."""
        with self._lock:
            self._started += 1

    def call_finished(self, outcome: Outcome) -> None:
        """A call ended (the loop calls this for sinks that define it)."""
        with self._lock:
            now = self._clock.monotonic()
            self._finished += 1
            self._activity = True
            status = outcome.status.value
            scope = outcome.route.scope if outcome.route is not None else "?"
            self._resume_expired(now, scope)
            if status == "completed":
                self._done += 1
            elif status == "degraded":
                self._done += 1
                self._degraded += 1
            else:
                if status == "rejected":
                    self._rejected += 1
                else:
                    self._failed += 1
                self._say(
                    now, (status, scope), f"a call on {scope} ended {status}: {outcome.reason}"
                )
            self._maybe_summary(now)

    def flush(self) -> None:
        """Print the summary now (e.g. at the end of a batch)."""
        with self._lock:
            now = self._clock.monotonic()
            self._resume_expired(now, None)
            self._summary(now)

    # -- lines -----------------------------------------------------------------------

    def _print(self, text: str) -> None:
        stream = self._stream if self._stream is not None else sys.stderr
        print(f"rateloop: {text}", file=stream, flush=True)
        self.lines_printed += 1

    def _say(self, now: float, topic: tuple[str, str], text: str) -> None:
        state = self._topics.get(topic)
        if state is not None and now - state.last_printed < self.repeat_secs:
            state.held += 1
            return
        start, count = self._window
        if now - start >= self.repeat_secs:
            start, count = now, 0
        if count >= self.max_lines:  # many scopes at once: the summary will count them
            self._held_back += 1
            if state is not None:
                state.held += 1
            return
        self._window = (start, count + 1)
        held = state.held if state is not None else 0
        self._topics[topic] = _Topic(last_printed=now)
        self._print(text + (f" (+{held} more like it)" if held else ""))

    def _pause(self, now: float, scope: str, wait: float, event: CapacityEvent) -> None:
        since, until, calls = self._paused.get(scope, (now, now, 0))
        fresh = scope not in self._paused
        self._paused[scope] = (since, max(until, now + wait), calls + 1)
        if fresh:
            self._say(now, ("pause", scope), f"{scope} paused {wait:.0f}s ({_why(event)})")

    def _resume_expired(self, now: float, scope: str | None) -> None:
        for key, (since, until, calls) in list(self._paused.items()):
            if now >= until and (scope is None or key == scope or now - until >= 1.0):
                del self._paused[key]
                noun = "call" if calls == 1 else "calls"
                self._say(
                    now,
                    ("resume", key),
                    f"{key} resumed after {until - since:.0f}s ({calls} {noun} waited)",
                )

    def _maybe_summary(self, now: float) -> None:
        if self._last_summary is None:
            self._last_summary = now
        elif now - self._last_summary >= self.summary_every and self._activity:
            self._summary(now)

    def _summary(self, now: float) -> None:
        self._last_summary = now
        self._activity = False
        self._waits = [t for t in self._waits if t > now]
        in_flight = self._started - self._finished
        scopes = sorted(self._paused)
        paused = ", ".join(scopes[:3]) or "none"
        if len(scopes) > 3:
            paused += f" and {len(scopes) - 3} more"
        headroom = self._headroom() if self._headroom is not None else None
        held, self._held_back = self._held_back, 0
        self._print(
            f"{in_flight} in flight, {len(self._waits)} waiting, {self._done} done "
            f"({self._degraded} degraded), {self._rejected} rejected, {self._failed} failed; "
            f"paused: {paused}"
            + (f"; headroom: {headroom}" if headroom else "")
            + (f" ({held} lines held back)" if held else "")
        )

    def __repr__(self) -> str:
        return f"ConsoleSink(summary_every={self.summary_every:g}, lines={self.lines_printed})"


def _why(event: CapacityEvent) -> str:
    kind = event.signal_kind or ("admission" if str(event.decision) == "admission_wait" else "?")
    return f"{kind} {event.http_status}" if event.http_status else kind
