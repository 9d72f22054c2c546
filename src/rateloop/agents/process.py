"""Run one attempt of a CLI agent step as a child process (POSIX).

How it works: the child starts in a new session (``start_new_session=True``),
so it leads its own process group and everything it spawns (node workers,
MCP servers, shells) is in that group.  Its stdout goes to a file the caller
owns (one per attempt, so a failed attempt's output never mixes into the
result and a large output never sits in a pipe).  Its stderr is a pipe read
by a thread that forwards every chunk to our stderr as it arrives, byte for
byte, and keeps the last :data:`STDERR_TAIL_BYTES` for classification.

When an attempt ends, its whole group gets SIGTERM, then, after a grace
period, SIGKILL (which also reaches grandchildren that ignore SIGTERM): on a
timeout, on Ctrl-C or any other exception while waiting, and also after the
child exited by itself, when something it started (``sleep 60 &``, a dev
server) still runs.  So nothing the agent started outlives its step (short of
a daemon that left the group with ``setsid``); a second interrupt during the grace
period (an impatient second Ctrl-C, ``docker stop`` escalating) skips the
rest of the grace and goes straight to SIGKILL.  ``rateloop run`` turns
SIGTERM and SIGHUP into such an exception too (:mod:`rateloop.agents.signals`).

Timeouts here are real wall-clock time by nature (a child process does not
run on a fake clock); they are measured by :mod:`subprocess` itself.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import select
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, TextIO

from rateloop._clock import system_clock
from rateloop.agents.signals import StepInterrupted, hold_stop_signals

__all__ = ["STDERR_TAIL_BYTES", "ProcessResult", "run_attempt"]

#: How much of the end of stderr is kept for classification.
STDERR_TAIL_BYTES = 64 * 1024
_CHUNK = 64 * 1024
# After the agent's group has ended, a process that left the group (a daemon in
# a session of its own) may still hold the stderr pipe open; we stop waiting for
# its end of file after this long, and stop forwarding it.
_DRAIN_SECS = 2.0
# How long the stopped pump may take to finish a write in progress.
_STOP_SECS = 1.0
# The shell's conventions for a command that could not be started.
_NOT_FOUND = 127
_CANNOT_EXECUTE = 126


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessResult:
    """How one child process ended.

    ``returncode`` is negative when the child died of a signal.  When the
    process could not be started, ``start_error`` says why and
    ``returncode`` is what a shell would report: 127 (not found) or 126.
    """

    returncode: int
    timed_out: bool
    stderr_tail: bytes
    start_error: str | None = None


class _StderrTee:
    """Forward a pipe to a stream chunk by chunk, keeping the tail.

    The agent's bytes go unchanged into the stream's binary ``buffer`` when
    it has one (``sys.stderr``, a file): its stderr passes through exactly,
    whatever the encoding.  A text-only stream (``io.StringIO``) cannot hold
    bytes; it gets them decoded as UTF-8, an invalid byte replaced by U+FFFD.
    """

    def __init__(self, pipe: IO[bytes], sink: TextIO | None) -> None:
        self._pipe = pipe
        self._sink = sink
        self._raw = _binary_layer(sink)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._tail = bytearray()
        self._lock = threading.Lock()
        # Closing the write end wakes the pump to stop (see finish).
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._pump, name="rateloop-stderr", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _pump(self) -> None:
        # The pump owns the pipe and closes it when done: finish() may return while a
        # process outside the agent's group still holds the other end.
        fd = self._pipe.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        try:
            while True:
                if self._wake_r in dict(poller.poll()):
                    break  # told to stop
                try:
                    chunk = os.read(fd, _CHUNK)
                except OSError:
                    break
                if not chunk:
                    break
                with self._lock:
                    self._tail += chunk
                    del self._tail[:-STDERR_TAIL_BYTES]
                self._forward(chunk)
            self._forward(b"", final=True)
        finally:
            self._pipe.close()
            os.close(self._wake_r)

    def _forward(self, chunk: bytes, *, final: bool = False) -> None:
        sink = self._sink
        if sink is None:
            return
        try:
            if self._raw is not None:
                if chunk:
                    sink.flush()  # what we wrote as text before goes out first
                    self._raw.write(chunk)
                    self._raw.flush()
                return
            text = self._decoder.decode(chunk, final=final)
            if text:
                sink.write(text)
                sink.flush()
        except (OSError, ValueError):
            # Our own stderr went away (closed pipe): keep draining the child so it
            # never blocks on a full pipe, but stop forwarding.
            self._sink = None

    def finish(self, timeout: float) -> bytes:
        """Wait up to ``timeout`` s for the end of the pipe, then stop; the tail kept.

        Called once the agent's group is gone, so its end of the pipe is normally
        closed already.  Only a process that left the group (a daemon in a session
        of its own) can still hold it: it is not waited for, and no longer forwarded.
        """
        self._thread.join(timeout)
        os.close(self._wake_w)  # wakes the pump if it still waits
        self._thread.join(_STOP_SECS)  # bounded: a blocked write to our stderr must not hang us
        with self._lock:
            return bytes(self._tail)


def _binary_layer(sink: TextIO | None) -> IO[bytes] | None:
    """The binary stream under a text stream (``TextIOWrapper.buffer``), or None."""
    raw = getattr(sink, "buffer", None)
    return raw if callable(getattr(raw, "write", None)) else None


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send ``sig`` to group ``pgid``; False when no member is left to receive it."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _end_group(proc: subprocess.Popen[bytes], grace: float) -> None:
    """End what is left of the child's process group: SIGTERM, then SIGKILL after ``grace`` s.

    Called whenever an attempt ends: after a timeout or an interrupt (the child
    still runs) and after a normal exit (a grandchild may still run: a dev
    server, ``sleep 60 &``).  An empty group, the usual case, costs one
    ``killpg``.  SIGKILL also reaches members that ignore SIGTERM.  A second
    interrupt during the grace (a second Ctrl-C, ``docker stop`` escalating)
    skips the rest of it, kills at once, and is raised once the group is gone.

    The group id is the child's pid.  After the child has been reaped it could
    only be reused once no member of the group is left, and Linux hands out
    pids cyclically, so the window for signalling a stranger is negligible.
    """
    pgid = proc.pid
    if not _signal_group(pgid, signal.SIGTERM) and proc.poll() is not None:
        return  # the child exited and left nothing behind
    interrupted: BaseException | None = None
    try:
        _await_group_gone(proc, limit=max(grace, 0.0))
    except BaseException as exc:  # a second Ctrl-C / SIGTERM: skip the grace, kill now
        interrupted = exc
    if proc.poll() is None or _group_runs(pgid):
        _signal_group(pgid, signal.SIGKILL)
    proc.wait()
    _await_group_gone(proc, limit=2.0)
    if interrupted is not None:
        raise interrupted


def _await_group_gone(proc: subprocess.Popen[bytes], *, limit: float) -> None:
    """Wait (bounded) until the child has exited and no member of its group runs.

    Signals take effect asynchronously, so a grandchild may still be on its
    way out when the child has been reaped; returning only once the group is
    gone means an ended step leaves nothing behind.  Zombies do not count:
    those that are our own children (when ``rateloop run`` is PID 1 in a
    container, orphans are reparented to it) are reaped here, and on Linux a
    group whose members are all zombies waiting for a slow init is gone.  The
    wait stops after ``limit`` seconds in any case.
    """
    end = system_clock.monotonic() + limit
    pause = 0.005
    while True:
        # Orphans are reaped only once the child is: its exit status is Popen's to collect.
        if proc.poll() is not None:
            _reap_group(proc.pid)
            if not _group_runs(proc.pid):
                return
        if system_clock.monotonic() >= end:
            return
        system_clock.sleep(pause)
        pause = min(pause * 2, 0.1)  # a member ignoring SIGTERM: no /proc scan 100x a second


def _reap_group(pgid: int) -> None:
    """Reap any zombie child of ours in group ``pgid`` (only ever the agent's orphans)."""
    with contextlib.suppress(ChildProcessError, OSError):
        while os.waitpid(-pgid, os.WNOHANG)[0] > 0:
            pass


def _group_runs(pgid: int) -> bool:
    """Whether a member of group ``pgid`` still runs (a zombie does not run)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        entries = list(os.scandir("/proc"))
    except OSError:
        return True  # not Linux: a member (maybe a zombie) exists; keep waiting
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            with open(f"{entry.path}/stat", encoding="ascii", errors="replace") as f:
                # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


def run_attempt(
    argv: Sequence[str],
    *,
    stdout: IO[bytes],
    stderr: TextIO | None,
    timeout: float | None = None,
    stdin: IO[bytes] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    kill_grace: float = 5.0,
) -> ProcessResult:
    """Run ``argv`` once; stdout into ``stdout``, stderr teed to ``stderr``.

    ``timeout`` bounds this attempt only (None: no bound).  ``stdin`` is the
    child's input (None: an empty input, ``/dev/null``).
    """
    with hold_stop_signals() as release:
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=stdin if stdin is not None else subprocess.DEVNULL,
                stdout=stdout,
                stderr=subprocess.PIPE,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            return ProcessResult(
                returncode=_NOT_FOUND,
                timed_out=False,
                stderr_tail=b"",
                start_error=f"command not found: {exc.filename or argv[0]}",
            )
        except OSError as exc:  # permission denied, exec format error, ...
            return ProcessResult(
                returncode=_CANNOT_EXECUTE,
                timed_out=False,
                stderr_tail=b"",
                start_error=f"cannot execute {argv[0]}: {exc.strerror or exc}",
            )
        assert proc.stderr is not None  # stderr=PIPE
        tee = _StderrTee(proc.stderr, stderr)
        tee.start()
        timed_out = False
        try:
            try:
                release()  # a stop signal held while the child started is raised here
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            except StepInterrupted as stop:
                stop.agent_ended = True  # the finally below ends the group before it propagates
                raise
            finally:
                # However the attempt ended (exited, timed out, interrupted), nothing it
                # started outlives it, and no grandchild keeps the stderr pipe open.
                _end_group(proc, kill_grace)
        finally:
            tail = tee.finish(_DRAIN_SECS)
    return ProcessResult(returncode=proc.returncode, timed_out=timed_out, stderr_tail=tail)
