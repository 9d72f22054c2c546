"""A worker process: ``concurrency`` threads taking tasks from one store until told to stop.

Stopping (SIGTERM, SIGINT, or ``stop.set()``) never loses a task: a thread
finishes the step it is running, checkpoints it, and releases the task
(``queued``, due now) instead of starting the next step.  A worker killed
outright (``kill -9``) loses its leases; they expire after ``lease_secs`` and
another worker takes the tasks again, counting a redelivery.

A worker takes only the tasks it has definitions for (``--app`` and the
built-in ones); it announces their names in the store while it runs, so that
``rateloop tasks list`` can say when a task waits for a worker that knows it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import socket
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rateloop._clock import system_clock
from rateloop.errors import BackendError
from rateloop.loop.drivers import RateLoop
from rateloop.policy import Policy
from rateloop.tasks.definition import TaskRegistry, registry
from rateloop.tasks.model import TaskRecord
from rateloop.tasks.presence import PRESENCE_REFRESH_SECS, PRESENCE_TTL_SECS
from rateloop.tasks.queue import QueuePolicy
from rateloop.tasks.runner import TaskRunner
from rateloop.tasks.store import TaskStore, open_store

__all__ = ["WorkerStats", "import_app", "run_worker"]

_log = logging.getLogger("rateloop.tasks.worker")


@dataclass(slots=True)
class WorkerStats:
    deliveries: int = 0
    by_state: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, rec: TaskRecord | None) -> None:
        with self._lock:
            self.deliveries += 1
            key = rec.state.value if rec is not None else "lease_lost"
            self.by_state[key] = self.by_state.get(key, 0) + 1


def import_app(spec: str) -> None:
    """Import the module (``pkg.mod``) or file (``path/app.py``) that defines the tasks.

    Whatever the import raises (a ``RuntimeError`` of the module's own, a
    ``SyntaxError``, a missing dependency) comes back as one :class:`ImportError`
    naming ``spec`` and the error, chained to it: the operator's mistake, told in
    a line, not a traceback.
    """
    if spec.endswith(".py") or os.sep in spec:
        path = Path(spec)
        if not path.is_file():
            raise FileNotFoundError(f"--app {spec!r}: no such file")
        name = f"rateloop_app_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise ImportError(f"--app {spec!r}: cannot import that file")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]  # as import_module does: no half-imported module stays
            raise _import_failed(spec, exc) from exc
        return
    try:
        importlib.import_module(spec)
    except Exception as exc:
        raise _import_failed(spec, exc) from exc


def _import_failed(spec: str, exc: Exception) -> ImportError:
    # One line: a SyntaxError's str() already names the file and the line.
    what = " ".join(str(exc).split())
    return ImportError(f"--app {spec!r} could not be imported: {type(exc).__name__}: {what}")


def run_worker(
    url: str,
    *,
    stop: threading.Event,
    concurrency: int = 1,
    tasks: TaskRegistry | None = None,
    policy: QueuePolicy | None = None,
    loop_policy: Policy | None = None,
    poll_secs: float = 0.5,
    on_delivery: Callable[[TaskRecord | None], None] | None = None,
) -> WorkerStats:
    """Run ``concurrency`` worker threads on the store at ``url`` until ``stop`` is set."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency!r}")
    if poll_secs <= 0:
        raise ValueError(f"poll_secs must be > 0, got {poll_secs!r}")
    stats = WorkerStats()
    errors: list[BaseException] = []
    known = tasks if tasks is not None else registry
    base = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:4]}"
    presence = _Presence(url, base, known)  # a bad URL or an unreachable store fails here, once

    def work(n: int) -> None:
        store: TaskStore | None = None
        worker_id = f"{base}:{n}"
        try:
            while not stop.is_set():
                try:
                    if store is None:
                        store = open_store(url)
                    runner = TaskRunner(
                        store, tasks=known, policy=policy,
                        worker_id=worker_id, stop=stop, loop=RateLoop(loop_policy),
                    )
                    rec = runner.claim()  # only the tasks this worker has definitions for
                    if rec is None:
                        stop.wait(poll_secs)
                        continue
                    last = runner.run_claimed(rec)
                except BackendError as exc:
                    # The store went away (a restart, a network blip): whatever this thread
                    # held is fenced and its lease will expire; reconnect and go on.
                    _log.warning("worker %s: %s; reconnecting", worker_id, exc)
                    if store is not None:
                        with contextlib.suppress(Exception):
                            store.close()
                    store = None
                    stop.wait(min(5.0, poll_secs * 10))
                    continue
                stats.count(last)
                if on_delivery is not None:
                    on_delivery(last)
        except BaseException as exc:
            errors.append(exc)
            stop.set()
        finally:
            if store is not None:
                store.close()

    threads = [
        threading.Thread(target=work, args=(n,), name=f"rateloop-worker-{n}")
        for n in range(concurrency)
    ]
    try:
        for t in threads:
            t.start()
        # Join with a timeout so the main thread keeps running signal handlers (and
        # renews this worker's announcement).
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(0.2)
            presence.renew_if_due()
    finally:
        presence.retire()
    if errors:
        raise errors[0]
    return stats


class _Presence:
    """This worker process's announcement in the store: the task names it can run.

    ``rateloop tasks list`` reads it to say when no running worker knows a task.
    Renewed from the main thread; a store that is away is retried at the next
    renewal (the announcement runs out meanwhile, which is the truth).
    """

    def __init__(self, url: str, worker_id: str, tasks: TaskRegistry) -> None:
        self._url, self.worker_id, self._tasks = url, worker_id, tasks
        self._store: TaskStore | None = open_store(url)
        self._due = 0.0
        self.renew_if_due()

    def renew_if_due(self) -> None:
        if system_clock.monotonic() < self._due:
            return
        self._due = system_clock.monotonic() + PRESENCE_REFRESH_SECS
        try:
            if self._store is None:
                self._store = open_store(self._url)
            self._store.announce_worker(
                self.worker_id, self._tasks.names(), ttl_secs=PRESENCE_TTL_SECS
            )
        except BackendError as exc:
            _log.warning("worker %s: cannot announce itself: %s", self.worker_id, exc)
            self._close()

    def retire(self) -> None:
        with contextlib.suppress(BackendError):
            if self._store is None:
                self._store = open_store(self._url)
            self._store.retire_worker(self.worker_id)
        self._close()

    def _close(self) -> None:
        if self._store is not None:
            with contextlib.suppress(Exception):
                self._store.close()
        self._store = None
