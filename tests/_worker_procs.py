"""Real ``rateloop worker`` processes for the task tests, and the store they share.

:class:`WorkerProcs` starts ``python -m rateloop worker`` processes on one
store, each writing stdout and stderr to a log file of its own, and ends every
one it started in :meth:`WorkerProcs.stop_all` (SIGCONT and SIGTERM, SIGKILL
after the wait).  :func:`task_store_url` gives a SQLite file or a PostgreSQL
schema of the test's own, and drops the schema afterwards.  Used by the crash
tests, the worker CLI tests and the kill -9 campaign.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from rateloop.tasks.postgres_store import PostgresTaskStore

SRC = str(Path(__file__).resolve().parents[1] / "src")


class WorkerProcs:
    """``rateloop worker`` processes on one store; :meth:`stop_all` ends every one started."""

    def __init__(
        self,
        tmp: Path,
        url: str,
        apps: Sequence[str],
        *,
        lease: float,
        poll: float,
        env: Mapping[str, str] | None = None,
        policy: Path | None = None,
    ) -> None:
        self.tmp, self.url, self.apps = tmp, url, tuple(apps)
        self.lease, self.poll, self.policy = lease, poll, policy
        self.env = {**os.environ, "PYTHONPATH": SRC, **(env or {})}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.log_paths: list[Path] = []
        self.killed: set[int] = set()

    def start(self, *args: str, apps: Sequence[str] | None = None) -> subprocess.Popen[bytes]:
        """One more worker, running ``apps`` (default: this fleet's), with ``args`` appended."""
        log = self.tmp / f"worker-{len(self.procs)}.log"
        policy = ("--policy", str(self.policy)) if self.policy is not None else ()
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "rateloop", "worker", "--store", self.url,
                 *(x for a in (apps or self.apps) for x in ("--app", a)),
                 "--lease-secs", str(self.lease), "--poll-secs", str(self.poll),
                 *policy, *args],
                env=self.env, stdout=out, stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        self.log_paths.append(log)
        return proc

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return self.log_paths[self.procs.index(proc)].read_text(errors="replace")

    def logs(self, tail: int | None = None) -> str:
        text = "\n".join(p.read_text(errors="replace") for p in self.log_paths)
        return text if tail is None else text[-tail:]

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """kill -9, as a crash would."""
        self.killed.add(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # a paused worker must see the SIGTERM
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:  # pragma: no cover - reported by the test
            proc.kill()
            proc.wait()

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            self.stop(p)


@contextmanager
def task_store_url(tmp: Path, dsn: str | None) -> Iterator[str]:
    """A SQLite file in ``tmp``, or (with ``dsn``) a PostgreSQL schema of this test's own."""
    if dsn is None:
        yield f"sqlite:///{tmp}/tasks.db"
        return
    schema = f"rateloop_test_{uuid.uuid4().hex[:10]}"
    try:
        yield f"{dsn}?schema={schema}"
    finally:
        cleaner = PostgresTaskStore(dsn, schema=schema)
        cleaner.drop()
        cleaner.close()
