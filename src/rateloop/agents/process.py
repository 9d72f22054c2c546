"""Run one attempt of a CLI agent step as a child process (POSIX).

How it works: the child starts in a new session (``start_new_session=True``),
so it leads its own process group and everything it spawns (node workers,
MCP servers, shells) is in that group.  Its stdout goes to a file the caller
owns (one per attempt, so a failed attempt's output never mixes into the
result and a large output never sits in a pipe).  Its stderr is a pipe read
by a thread that forwards every chunk to our stderr as it arrives, byte for
byte, and keeps the last :data:`STDERR_TAIL_BYTES` for classification.

When an attempt outlives its timeout the whole group gets SIGTERM, then,
after a grace period, SIGKILL (which also reaches grandchildren that ignore
SIGTERM).  Ctrl-C or any other exception while waiting does the same, so
no agent is left running behind us; a second interrupt during the grace
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
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, TextIO

from rateloop._clock import system_clock
from rateloop.agents.signals import hold_stop_signals

__all__ = ["STDERR_TAIL_BYTES", "ProcessResult", "run_attempt"]

#: How much of the end of stderr is kept for classification.
STDERR_TAIL_BYTES = 64 * 1024
_CHUNK = 64 * 1024
# After the child exits, a grandchild that inherited stderr may keep the pipe
# open; we stop waiting for its end of file after this long.
_DRAIN_SECS = 2.0
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
        self._thread = threading.Thread(target=self._pump, name="rateloop-stderr", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _pump(self) -> None:
        fd = self._pipe.fileno()
        while True:
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

    def finish(self, timeout: float | None) -> bytes:
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._pipe.close()
        with self._lock:
            return bytes(self._tail)


def _binary_layer(sink: TextIO | None) -> IO[bytes] | None:
    """The binary stream under a text stream (``TextIOWrapper.buffer``), or None."""
    raw = getattr(sink, "buffer", None)
    return raw if callable(getattr(raw, "write", None)) else None


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is already gone
        os.killpg(pgid, sig)


def _kill_group(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM the child's process group, then SIGKILL it after ``grace`` seconds."""
    _signal_group(proc.pid, signal.SIGTERM)
    interrupted: BaseException | None = None
    try:
        proc.wait(timeout=max(grace, 0.0))
    except subprocess.TimeoutExpired:
        pass
    except BaseException as exc:  # a second Ctrl-C / SIGTERM: skip the grace, kill now
        interrupted = exc
    # Also when the child itself is gone: a grandchild may have ignored SIGTERM.
    # The group id cannot be reused while any member of the group is alive.
    _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()
    _await_group_gone(proc.pid, limit=2.0)
    if interrupted is not None:
        raise interrupted


def _await_group_gone(pgid: int, *, limit: float) -> None:
    """Wait (bounded) until no member of the killed group is left running.

    SIGKILL takes effect asynchronously, so a grandchild may still be on its
    way out when the child has been reaped; returning only once the group is
    gone means a timed-out step leaves nothing behind.  Zombies do not count:
    those that are our own children (when ``rateloop run`` is PID 1 in a
    container, orphans are reparented to it) are reaped here, and on Linux a
    group whose members are all zombies waiting for a slow init is gone.  The
    wait stops after ``limit`` seconds in any case.
    """
    end = system_clock.monotonic() + limit
    while system_clock.monotonic() < end:
        _reap_group(pgid)
        if not _group_runs(pgid):
            return
        system_clock.sleep(0.01)


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
            release()  # a stop signal held while the child started is raised here
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc, kill_grace)
        except BaseException:
            try:
                _kill_group(proc, kill_grace)
            finally:
                tee.finish(_DRAIN_SECS)  # the group is gone: its end of the pipe is closed
            raise
    tail = tee.finish(_DRAIN_SECS)
    return ProcessResult(returncode=proc.returncode, timed_out=timed_out, stderr_tail=tail)
