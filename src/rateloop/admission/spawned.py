"""Flows spawned beside the caller's (a lease renewed ahead of need): run, never waited for.

A flow yields :class:`Spawn` to start another flow and goes on at once
(``runner.py`` hands it here).  On a backend in this process the spawned
flow runs inline, at once -- it costs no round trip, and tests on a
virtual clock stay deterministic; on a shared backend it runs in the
background: on a few worker threads under the sync driver -- a worker takes
every flow waiting and runs them together, their round trips pipelined --, as
a task of the running event loop under the async one.  A spawned flow handles its own
errors; one that escapes is logged (its type only) and dropped.  Closing
lets the ones under way finish and starts no more.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from collections.abc import Awaitable, Callable

from rateloop.admission.steps import Spawn, SpawnedFlow

__all__ = ["BATCH_MOST", "SPAWN_WORKERS", "Spawn", "Spawned"]  # Spawn: from steps.py

log = logging.getLogger("rateloop.admission")
#: Worker threads that run spawned flows for the sync driver, per runner (started lazily).
SPAWN_WORKERS = 2
#: A worker takes every flow waiting, up to this many, and runs them together: their
#: round trips go out pipelined (``BackendRunner.run_many``).
BATCH_MOST = 64

class Spawned:
    """Runs spawned flows with the runner's own drivers (``run``, ``arun``)."""

    def __init__(
        self,
        run: Callable[[SpawnedFlow], None],
        arun: Callable[[SpawnedFlow], Awaitable[None]],
        run_many: Callable[[list[SpawnedFlow]], None] | None = None,
        *,
        inline: bool,
    ) -> None:
        self._run = run
        self._arun = arun
        self._run_many = run_many
        self._inline = inline
        self._queue: queue.SimpleQueue[SpawnedFlow | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._workers: list[threading.Thread] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopped = False  # closing: spawn nothing more
        self._pid = os.getpid()  # a fork keeps no thread: its child starts its own workers

    def spawn(self, flow: SpawnedFlow) -> None:
        """Run ``flow`` inline (a backend in this process) or on a worker thread."""
        if self._stopped:
            flow.close()
            return
        if self._inline:
            self._quietly(flow)
            return
        if self._pid != os.getpid():
            with self._lock:
                self._pid, self._workers = os.getpid(), []
                self._queue = queue.SimpleQueue()  # what the parent's workers had not taken
        if len(self._workers) < SPAWN_WORKERS:
            with self._lock:
                if len(self._workers) < SPAWN_WORKERS and not self._stopped:
                    worker = threading.Thread(
                        target=self._work, name="rateloop-admission", daemon=True
                    )
                    self._workers.append(worker)
                    worker.start()
        self._queue.put(flow)

    async def aspawn(self, flow: SpawnedFlow) -> None:
        """Run ``flow`` inline (a backend in this process) or as a task of the running loop."""
        if self._stopped:
            flow.close()
            return
        if self._inline:
            await self._aquietly(flow)
            return
        task = asyncio.get_running_loop().create_task(self._aquietly(flow))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _work(self) -> None:
        while (flow := self._queue.get()) is not None:
            batch, stop = [flow], False
            while len(batch) < BATCH_MOST:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:  # this worker's stop, after the batch
                    stop = True
                    break
                batch.append(more)
            if self._run_many is None or len(batch) == 1:
                for each in batch:
                    self._quietly(each)
            else:
                self._together(batch)
            if stop:
                break

    def _together(self, batch: list[SpawnedFlow]) -> None:
        assert self._run_many is not None
        try:
            self._run_many(batch)
        except Exception as exc:  # run_many logs each flow's own failure: this is its own
            log.debug("background admission steps failed: %s", type(exc).__name__)
        finally:
            for flow in batch:
                flow.close()

    def _quietly(self, flow: SpawnedFlow) -> None:
        try:
            self._run(flow)
        except Exception as exc:  # unreachable, a timeout: the flow cleans up as it closes
            log.debug("a background admission step failed: %s", type(exc).__name__)
        finally:
            flow.close()  # an error left it at its step: its cleanup runs now

    async def _aquietly(self, flow: SpawnedFlow) -> None:
        try:
            await self._arun(flow)
        except Exception as exc:
            log.debug("a background admission step failed: %s", type(exc).__name__)
        finally:
            flow.close()

    def stop(self, timeout: float = 5.0) -> None:
        """Let the spawned flows under way finish (at most ``timeout``); spawn no more."""
        with self._lock:
            self._stopped = True
            workers, self._workers = self._workers, []
        for _ in workers:
            self._queue.put(None)
        for worker in workers:
            worker.join(timeout)

    async def astop(self, timeout: float = 5.0) -> None:
        """Let the spawned tasks under way finish (at most ``timeout``), then cancel the rest."""
        self._stopped = True
        tasks = list(self._tasks)
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
