"""A throwaway ``redis-server`` on a free loopback port, for tests that need a fresh one.

The shared Redis on 6379 is used by other test runs at the same time, so a
test that needs a server in a known state (an empty script cache, cluster
mode) starts its own: no persistence, bound to 127.0.0.1, stopped after.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

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


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free and valid too (<= 65535)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20_000, 55_000)
        if all(_free(p) for p in (port, port + 10_000)):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def redis_cluster(masters: int = 3, *extra: str) -> Iterator[list[int]]:
    """A Redis Cluster of ``masters`` nodes (no replicas) on free ports; yields the ports.

    Every node is stopped when the block ends, whatever happened in it.
    """
    if shutil.which("redis-cli") is None:
        pytest.skip("redis-cli is not installed")
    ports: list[int] = []
    while len(ports) < masters:
        port = cluster_port()
        if all(abs(port - p) not in (0, 10_000) for p in ports):
            ports.append(port)
    with contextlib.ExitStack() as stack:
        for port in ports:
            stack.enter_context(
                redis_server(
                    "--cluster-enabled",
                    "yes",
                    "--cluster-node-timeout",
                    "2000",
                    "--cluster-config-file",
                    f"nodes-{port}.conf",
                    *extra,
                    port=port,
                )
            )
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *(f"127.0.0.1:{p}" for p in ports),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        deadline = time.monotonic() + 30
        while True:  # until every node agrees the cluster is up
            states = []
            for p in ports:
                with redis.Redis(port=p, decode_responses=True) as node:
                    states.append(node.cluster("info"))
            if all(s.get("cluster_state") == "ok" for s in states):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not come up: {states}")
            time.sleep(0.1)  # waiting for servers to converge, not for limiter time
        yield ports
