"""``rateloop run --queue URL -- CMD``: a usage limit parks the step; a worker runs it at the reset.

Real processes throughout: the fake agent, ``rateloop run`` and ``rateloop worker``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agent_scripts.harness import FakeAgent, install_agent
from rateloop.agents.parked import AGENT_TASK, park_agent_step
from rateloop.outcome import Outcome, Status
from rateloop.tasks import TaskState, open_store
from rateloop.testing import FakeClock

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _limit(reset: datetime) -> dict[str, Any]:
    """Claude Code's usage-limit line, with its reset epoch."""
    return {"stdout": f"Claude AI usage limit reached|{int(reset.timestamp())}\n", "exit": 1}


def _env(agent: FakeAgent) -> dict[str, str]:
    return dict(agent.env, PYTHONPATH=SRC)


def _rateloop(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rateloop", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=60, check=False)


def test_a_usage_limit_is_parked_and_a_worker_runs_it_after_the_reset(tmp_path: Path) -> None:
    # The reset has just passed (plus the margin), so the worker may take it at once.
    reset = datetime.now(UTC) - timedelta(minutes=2)
    agent = install_agent(tmp_path, "claude", [_limit(reset), {"stdout": "the fix is in\n"}])
    url = f"sqlite:///{tmp_path}/tasks.db"
    work = tmp_path / "repo"
    work.mkdir()
    done = _rateloop(["run", "--queue", url, "--", str(agent.path), "-p", "fix it"],
                     _env(agent), work)
    assert done.returncode == 0, done.stderr
    task_id = done.stdout.strip()
    assert "parked as task" in done.stderr and agent.runs == 1
    store = open_store(url)
    try:
        parked = store.get(task_id)
        assert parked is not None
        assert parked.name == AGENT_TASK and parked.state is TaskState.WAITING_FOR_RESET
        assert parked.args["command"][1:] == ["-p", "fix it"]
        assert parked.args["cwd"] == str(work)
        assert parked.checkpoint.attempts_used.loop == 1
        assert parked.checkpoint.signal is not None

        worker = subprocess.Popen(
            [sys.executable, "-m", "rateloop", "worker", "--store", url, "--poll-secs", "0.05"],
            env=_env(agent), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        try:
            end = time.monotonic() + 30
            while (rec := store.get(task_id)) is not None and not rec.state.terminal:
                assert time.monotonic() < end, "the worker did not finish the parked step"
                time.sleep(0.05)
        finally:
            worker.send_signal(signal.SIGTERM)
            _, err = worker.communicate(timeout=30)
        assert worker.returncode == 0, err
        assert rec is not None and rec.state is TaskState.COMPLETED, rec
        assert rec.result == "the fix is in\n"
        assert agent.runs == 2
        first, again = agent.calls()
        assert again == first and "fix it" in again  # the same command, prompt included
        assert rec.checkpoint.attempts_used.wakes == 1
    finally:
        store.close()


def test_a_bad_queue_url_fails_before_the_agent_runs(tmp_path: Path) -> None:
    agent = install_agent(tmp_path, "claude", [{"stdout": "ok\n"}])
    done = _rateloop(["run", "--queue", "redis://x", "--", str(agent.path), "-p", "x"],
                     _env(agent), tmp_path)
    assert done.returncode == 2
    assert "unsupported scheme 'redis'" in done.stderr and "sqlite:///" in done.stderr
    assert agent.runs == 0


def test_without_a_limit_nothing_is_parked(tmp_path: Path) -> None:
    agent = install_agent(tmp_path, "claude", [{"stdout": "ok\n"}])
    url = f"sqlite:///{tmp_path}/tasks.db"
    done = _rateloop(["run", "--queue", url, "--", str(agent.path), "-p", "x"],
                     _env(agent), tmp_path)
    assert (done.returncode, done.stdout) == (0, "ok\n")
    store = open_store(url)
    try:
        assert store.counts() == {}
    finally:
        store.close()


def test_parking_api(tmp_path: Path, clock: FakeClock) -> None:
    store = open_store(f"sqlite:///{tmp_path}/tasks.db", clock=clock)
    try:
        waiting = Outcome(status=Status.WAITING_FOR_RESET, reason="usage limit",
                          retry_at=clock.now() + timedelta(hours=2))
        rec = park_agent_step(store, ["claude", "-p", "x"], waiting, margin_secs=60,
                              cwd="/repo", clock=clock)
        assert rec.state is TaskState.WAITING_FOR_RESET
        assert rec.next_attempt_at == clock.now() + timedelta(hours=2, seconds=60)
        late = park_agent_step(store, ["claude"], waiting, deadline=3600, clock=clock)
        assert late.state is TaskState.REJECTED and "past the deadline" in late.checkpoint.reason
        with pytest.raises(ValueError, match="not completed"):
            park_agent_step(store, ["claude"], Outcome(status=Status.COMPLETED, reason="ok"))
    finally:
        store.close()

