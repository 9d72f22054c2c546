"""A throwaway ``redis-server`` on a free loopback port, for tests that need a fresh one.

The shared Redis on 6379 is used by other test runs at the same time, so a
test that needs a server in a known state (an empty script cache, cluster
mode) starts its own: no persistence, bound to 127.0.0.1, stopped after.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# A cluster node also listens on its port + 10000, so redis-server refuses ports above this.
_MAX_CLUSTER_PORT = 55535


def free_port() -> int:
    """A free loopback port a cluster node can use too (the OS's ephemeral range reaches 60999)."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port <= _MAX_CLUSTER_PORT:
            return port


def _wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server on port {port} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.02)  # waiting for a subprocess to listen, not for limiter time
    raise RuntimeError(f"redis-server on port {port} did not listen within {timeout} s")


@contextlib.contextmanager
def redis_server(*extra: str, port: int | None = None) -> Iterator[int]:
    """Run ``redis-server`` on a free port (or ``port``) and yield the port."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    port = port or free_port()
    with tempfile.TemporaryDirectory(prefix="rateloop-redis-") as workdir:
        proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                workdir,
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=Path(workdir),
        )
        try:
            _wait_listening(port, proc)
            yield port
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
