"""Ending a step when ``rateloop run`` itself is told to stop: SIGINT, SIGTERM, SIGHUP.

How it works: the agent runs in its own session (see
:mod:`rateloop.agents.process`), so a signal sent to ``rateloop run`` — CI
cancellation and ``docker stop`` send SIGTERM, a closed terminal or SSH
session sends SIGHUP, Ctrl-C sends SIGINT — never reaches it on its own.
Python's default for SIGTERM and SIGHUP is to die on the spot, which would
leave the agent running, orphaned.

:func:`stop_on_signals` turns each of these signals into a
:class:`StepInterrupted` raised in the main thread.  The attempt's wait
(:func:`~rateloop.agents.process.run_attempt`) ends the child's whole process
group on any exception (SIGTERM, then SIGKILL after the grace period; a
second signal during the grace skips it), and ``rateloop run`` exits with
``128 + signal number`` (130, 143, 129), as a shell reports a process killed
by that signal.

One window needs care: a signal that lands while :class:`subprocess.Popen`
is starting the child would unwind through it, leaving a child that nobody
ends.  :func:`hold_stop_signals` holds the stop signals over that window and
delivers a held one as soon as the code that ends the child is armed.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from types import FrameType

__all__ = ["STOP_SIGNALS", "StepInterrupted", "hold_stop_signals", "stop_on_signals"]

#: The signals ``rateloop run`` stops on (after ending the agent's process group).
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StepInterrupted(BaseException):
    """``rateloop run`` received ``signum`` and is stopping the step.

    A :class:`BaseException`, like :class:`KeyboardInterrupt`: an ``except
    Exception`` in code the step runs through must not swallow a stop request.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        #: Whether an agent was running and its process group was ended; False when
        #: the signal came during a backoff or reset wait (set by the attempt's runner).
        self.agent_ended = False

    @property
    def name(self) -> str:
        """The signal's name, e.g. ``SIGTERM``."""
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"

    @property
    def exit_code(self) -> int:
        """``128 + signum``: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP."""
        return 128 + self.signum

    def __repr__(self) -> str:
        return f"StepInterrupted({self.name})"


class _Hold:
    """Whether stop signals are held now, and which arrived meanwhile.

    Signal handlers run in the main thread only, so one shared instance is enough.
    """

    __slots__ = ("active", "held")

    def __init__(self) -> None:
        self.active = False
        self.held: list[int] = []

    def release(self) -> None:
        self.active = False
        if self.held:
            signum = self.held[0]
            self.held.clear()
            raise StepInterrupted(signum)


_HOLD = _Hold()


def _raise(signum: int, frame: FrameType | None) -> None:
    if _HOLD.active:
        _HOLD.held.append(signum)
        return
    raise StepInterrupted(signum)


@contextlib.contextmanager
def hold_stop_signals() -> Iterator[Callable[[], None]]:
    """Hold the stop signals of :func:`stop_on_signals` while inside; yield ``release``.

    ``release()`` ends the hold and raises :class:`StepInterrupted` for a
    signal that arrived meanwhile; leaving the block releases too.  Outside
    the main thread (where no handler runs) this holds nothing.
    """
    if threading.current_thread() is not threading.main_thread() or _HOLD.active:
        yield lambda: None
        return
    _HOLD.active = True
    try:
        yield _HOLD.release
    finally:
        if _HOLD.active:
            _HOLD.release()


@contextlib.contextmanager
def stop_on_signals(signals: Sequence[signal.Signals] = STOP_SIGNALS) -> Iterator[None]:
    """While inside, each of ``signals`` raises :class:`StepInterrupted` in the main thread.

    The previous handlers come back on exit.  Signal handlers belong to the
    main thread; called from another thread this changes nothing (the caller
    keeps Python's defaults).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _raise) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
