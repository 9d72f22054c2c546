"""A kill -9 campaign: real ``rateloop worker`` processes, killed at random, and what survived.

:func:`run_campaign` submits ``tasks`` five-step tasks of
``tasks_campaign_app.py`` to a store, starts ``workers`` worker processes,
``kill -9``s a random one every ``kill_every`` seconds (a uniform draw) and
starts a replacement, until every task has ended or ``timeout`` passed.  The
:class:`Figures` it returns are read from the store and from the effects file
the steps write:

- ``lost``: tasks that did not end ``completed``;
- ``dup_effects_live``: keyed side effects performed again after a performer
  that was *not* killed (forbidden: a live worker's step ran twice);
  ``dup_effects_after_kill`` the same after a killed performer (allowed: the
  step is idempotent by its key, a provider applies it once);
- ``dup_executions_live``: step executions followed by another execution of
  the same step while their worker was alive;
- ``double_posts``: tasks whose non-idempotent ``post`` reached the
  destination twice; ``unchecked_reposts``: tasks whose ``post`` ran again
  more often than its outcome check said "not landed";
- ``dying_posts`` tasks kill their worker right after their post landed (a
  kill -9 at the worst point, on purpose): each must be settled by a check
  that says "landed" (``checks_landed``), never by a second post;
- ``redeliveries`` against ``kills`` (the random ones and the dying posts):
  a single-threaded worker killed strands at most one task, so
  ``false_redeliveries = max(0, redeliveries - kills)`` is a lower bound of
  the redeliveries no kill explains.

Used by ``test_tasks_campaign.py`` (small, bounded) and ``bench/tasks_campaign.py``
(full size)::

    PYTHONPATH=src python3 bench/tasks_campaign.py --store sqlite,postgres --tasks 1000
"""

from __future__ import annotations

import random
import sqlite3
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import tasks_campaign_app as app
from _worker_procs import WorkerProcs
from rateloop.tasks import QueuePolicy, TaskRunner, TaskState, open_store
from rateloop.tasks.postgres_store import PostgresTaskStore
from rateloop.tasks.store import TaskStore

APP = str(Path(__file__).resolve().parent / "tasks_campaign_app.py")


@dataclass(slots=True)
class Figures:
    store: str
    tasks: int
    workers: int
    kills: int = 0
    elapsed: float = 0.0
    states: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    executions: int = 0
    dup_executions_live: int = 0
    dup_effects_after_kill: int = 0
    dup_effects_live: int = 0
    double_posts: int = 0
    unchecked_reposts: int = 0
    dying_posts: int = 0
    check_calls: int = 0
    checks_landed: int = 0
    reposts_after_check: int = 0
    redeliveries: int = 0
    wakes: int = 0
    false_redeliveries: int = 0

    def table(self) -> str:
        rows = "\n".join(f"  {k}: {v}" for k, v in asdict(self).items())
        return f"kill -9 campaign\n{rows}"


class Fleet(WorkerProcs):
    """Worker processes on one store, and the effects file their steps write."""

    def __init__(self, url: str, tmp: Path, *, lease: float, poll: float) -> None:
        self.effects = str(tmp / "effects.db")
        app.init_effects(self.effects)
        (tmp / "policy.toml").write_text("pause_limit_secs = 1\n")
        super().__init__(
            tmp, url, [APP], lease=lease, poll=poll, policy=tmp / "policy.toml",
            env={"RATELOOP_CAMPAIGN_EFFECTS": self.effects, "RATELOOP_CAMPAIGN_WORKER": "1"},
        )

    def booted(self) -> int:
        conn = app.connect(self.effects)
        try:
            return int(conn.execute("SELECT COUNT(*) FROM boots").fetchone()[0])
        finally:
            conn.close()


def wait_booted(fleet: Fleet, n: int, timeout: float) -> None:
    end = time.monotonic() + timeout
    while fleet.booted() < n:
        if time.monotonic() > end:
            raise AssertionError(f"{n} workers not up after {timeout}s\n{fleet.logs(tail=3000)}")
        time.sleep(0.05)
    time.sleep(0.3)  # the import is done; the store opens and the first poll follows


def _audit(fig: Figures, store: TaskStore, ids: list[str], fleet: Fleet) -> None:
    records = [store.get(t) for t in ids]
    fig.states = dict(Counter(r.state.value if r else "missing" for r in records))
    fig.lost = sum(1 for r in records if r is None or r.state is not TaskState.COMPLETED)
    fig.redeliveries = sum(r.checkpoint.attempts_used.redeliveries for r in records if r)
    fig.wakes = sum(r.checkpoint.attempts_used.wakes for r in records if r)
    fig.false_redeliveries = max(0, fig.redeliveries - fig.kills)
    conn = sqlite3.connect(fleet.effects)
    try:
        killed = fleet.killed | {pid for (pid,) in conn.execute("SELECT pid FROM suicides")}
        runs: dict[tuple[str, str], list[int]] = {}
        for task_id, step, pid in conn.execute(
            "SELECT task_id, step, pid FROM executions ORDER BY at, rowid"
        ):
            runs.setdefault((task_id, step), []).append(pid)
        fig.executions = sum(len(p) for p in runs.values())
        # Every execution that another one followed must have been cut short by a kill.
        fig.dup_executions_live = sum(
            1 for pids in runs.values() for pid in pids[:-1] if pid not in killed
        )
        performed: dict[str, list[int]] = {}
        for key, pid in conn.execute("SELECT key, pid FROM effects ORDER BY rowid"):
            performed.setdefault(key, []).append(pid)
        for pids in performed.values():
            for pid in pids[:-1]:
                if pid in killed:
                    fig.dup_effects_after_kill += 1
                else:
                    fig.dup_effects_live += 1
        posts = Counter(t for (t,) in conn.execute("SELECT task_id FROM posts"))
        fig.double_posts = sum(1 for n in posts.values() if n > 1)
        not_landed: Counter[str] = Counter()
        for task_id, landed in conn.execute("SELECT task_id, landed FROM checks"):
            fig.check_calls += 1
            if landed:
                fig.checks_landed += 1
            else:
                not_landed[task_id] += 1
        for (task_id, step), pids in runs.items():
            if step == "post" and len(pids) > 1:
                fig.reposts_after_check += len(pids) - 1
                if len(pids) - 1 > not_landed[task_id]:
                    fig.unchecked_reposts += 1
    finally:
        conn.close()


def run_campaign(
    engine: str,
    *,
    tasks: int,
    workers: int,
    kill_every: tuple[float, float],
    max_kills: int | None = None,
    lease: float = 1.0,
    poll: float = 0.05,
    step_secs: float = 0.01,
    timeout: float = 60.0,
    seed: int = 22,
    dying_posts: int = 2,
    postgres_dsn: str = "postgresql://postgres@127.0.0.1:5432/test",
    tmp: Path | None = None,
) -> tuple[Figures, str]:
    """Run one campaign on ``engine`` (``sqlite`` or ``postgres``); its figures and worker logs."""
    rng = random.Random(seed)
    dying = set(rng.sample(range(tasks), min(dying_posts, tasks)))
    tmp = tmp or Path(tempfile.mkdtemp(prefix="rateloop-campaign-"))
    schema = f"rateloop_campaign_{uuid.uuid4().hex[:10]}"
    url = f"sqlite:///{tmp}/tasks.db" if engine == "sqlite" else f"{postgres_dsn}?schema={schema}"
    fleet = Fleet(url, tmp, lease=lease, poll=poll)
    store = open_store(url)
    fig = Figures(store=engine, tasks=tasks, workers=workers, dying_posts=len(dying))
    try:
        runner = TaskRunner(store, tasks=[app.campaign],
                            policy=QueuePolicy(max_depth=max(10_000, tasks)))
        # The post's answer waits longest, so that random kills land there too.
        sleep = dict.fromkeys(app.campaign.step_names, step_secs) | {"post": 3 * step_secs}
        ids = [
            runner.submit(app.campaign, {"sleep": sleep, "die_in_post": i in dying}).task_id
            for i in range(tasks)
        ]
        procs = [fleet.start() for _ in range(workers)]
        wait_booted(fleet, workers, 60)
        start = time.monotonic()
        next_kill = start + rng.uniform(*kill_every)
        while time.monotonic() - start < timeout:
            counts = store.counts()
            if sum(n for s, n in counts.items() if s.terminal) >= tasks:
                break
            for n, proc in enumerate(procs):
                if proc.poll() is not None:  # it killed itself (die_in_post): replace it
                    procs[n] = fleet.start()
                    fig.kills += 1
            now = time.monotonic()
            if now >= next_kill and (max_kills is None or fig.kills < max_kills):
                victim = rng.randrange(len(procs))
                fleet.kill(procs[victim])
                procs[victim] = fleet.start()
                fig.kills += 1
                next_kill = now + rng.uniform(*kill_every)
            time.sleep(0.02)
        fig.elapsed = round(time.monotonic() - start, 1)
        fleet.stop_all()
        _audit(fig, store, ids, fleet)
        return fig, fleet.logs(tail=3000)
    finally:
        fleet.stop_all()
        store.close()
        if engine == "postgres":
            cleaner = PostgresTaskStore(postgres_dsn, schema=schema)
            cleaner.drop()
            cleaner.close()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", default="sqlite", help="sqlite, postgres or sqlite,postgres")
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--kill-every", default="0.5,2", help="seconds: low,high")
    parser.add_argument("--lease", type=float, default=1.0)
    parser.add_argument("--step-secs", type=float, default=0.01)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--dying-posts", type=int, default=10,
                        help="tasks whose worker kills itself right after the post landed")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    lo, hi = (float(x) for x in args.kill_every.split(","))
    out: dict[str, Any] = {}
    for engine in args.store.split(","):
        fig, _ = run_campaign(
            engine, tasks=args.tasks, workers=args.workers, kill_every=(lo, hi),
            lease=args.lease, step_secs=args.step_secs, timeout=args.timeout, seed=args.seed,
            dying_posts=args.dying_posts,
            postgres_dsn=args.postgres,
        )
        print(fig.table(), flush=True)
        out[engine] = asdict(fig)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
