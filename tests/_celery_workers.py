"""Real ``celery worker`` processes for tests/test_integrations_celery.py, and its helpers.

:class:`Workers` starts ``celery -A celery_app worker`` processes (tests/celery_app.py), each in
a process group of its own with a log file, and :meth:`Workers.stop` ends every one (SIGTERM to
the group, SIGKILL after the wait).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import redis

TESTS = Path(__file__).resolve().parent
SRC = str(TESTS.parent / "src")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Workers:
    """Real ``celery worker`` processes (each its own process group); stop() ends them all."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp, self.env = tmp, {**os.environ, "PYTHONPATH": f"{SRC}:{TESTS}", **env}
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, concurrency: int = 1) -> subprocess.Popen[bytes]:
        n = len(self.procs)
        with open(self.tmp / f"worker-{n}.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "celery_app", "worker",
                 f"--concurrency={concurrency}", "--pool=prefork", "--loglevel=INFO",
                 "-n", f"w{n}-{uuid.uuid4().hex[:6]}@%h", "-Q", self.env["RATELOOP_CELERY_QUEUE"],
                 "--without-gossip", "--without-mingle", "--without-heartbeat"],
                cwd=self.tmp, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        self.procs.append(proc)
        return proc

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:]
                         for p in sorted(self.tmp.glob("worker-*.log")))

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def client_app(env: dict[str, str]) -> Any:
    """tests/celery_app.py as the test's producer (its env set first)."""
    os.environ.update(env)
    sys.path.insert(0, str(TESTS))
    try:
        import importlib

        import celery_app

        return importlib.reload(celery_app)
    finally:
        sys.path.remove(str(TESTS))


def deliveries(redis_url: str, prefix: str, task_id: str) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(redis_url)
    try:
        return [json.loads(x) for x in client.lrange(prefix + "deliveries:" + task_id, 0, -1)]
    finally:
        client.close()
