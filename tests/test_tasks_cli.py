"""``rateloop tasks list|show|retry|cancel`` and ``rateloop worker`` argument errors."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rateloop.cli import app
from rateloop.outcome import Outcome, Status
from rateloop.tasks import StepContext, TaskRegistry, TaskRunner, TaskState, open_store, task
from rateloop.testing import FakeClock


@pytest.fixture
def cli() -> CliRunner:
    return CliRunner()


@pytest.fixture
def waiting(tmp_path: Path) -> tuple[str, str]:
    """A store holding one task parked on a daily quota after its first step."""
    clock = FakeClock()
    url = f"sqlite:///{tmp_path}/tasks.db"
    store = open_store(url, clock=clock)
    reg = TaskRegistry()
    t = task("digest", into=reg)

    @t.step()
    def collect(ctx: StepContext) -> list[int]:
        return [1, 2]

    @t.step()
    def summarize(ctx: StepContext) -> Outcome:
        return Outcome(status=Status.WAITING_FOR_RESET, reason="daily quota spent",
                       retry_at=clock.now() + timedelta(hours=3))

    runner = TaskRunner(store, tasks=reg, clock=clock)
    rec = runner.submit(t, task_id="digest-1")
    runner.run_until_idle()
    store.close()
    return url, rec.task_id


def test_list_says_what_waits_why_and_until_when(cli: CliRunner, waiting: tuple[str, str]) -> None:
    url, tid = waiting
    out = cli.invoke(app, ["tasks", "list", "--store", url])
    assert out.exit_code == 0, out.output
    line = next(x for x in out.output.splitlines() if x.startswith(tid))
    assert "waiting_for_reset" in line and "1/2" in line and "daily quota spent" in line
    assert "2026-01-01T03:00:00+00:00" in line
    assert "waiting_for_reset 1" in out.output
    as_json = cli.invoke(app, ["tasks", "list", "--store", url, "--json"])
    summary = json.loads(as_json.output.splitlines()[0])
    assert summary["completed_steps"] == ["collect"]
    assert summary["remaining_steps"] == ["summarize"]
    assert not summary["done"]
    none = cli.invoke(app, ["tasks", "list", "--store", url, "--state", "completed"])
    assert tid not in none.output


def test_show_retry_cancel(cli: CliRunner, waiting: tuple[str, str]) -> None:
    url, tid = waiting
    shown = cli.invoke(app, ["tasks", "show", tid, "--store", url])
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.output)
    assert data["status"] == "waiting_for_reset"
    assert data["checkpoint"]["completed_steps"][0]["result"] == [1, 2]
    assert data["user_message_policy"] == "explain the delay without claiming completion"
    retried = cli.invoke(app, ["tasks", "retry", tid, "--store", url])
    assert retried.exit_code == 0 and "queued" in retried.output
    cancelled = cli.invoke(app, ["tasks", "cancel", tid, "--store", url])
    assert cancelled.exit_code == 0 and "cancelled" in cancelled.output
    again = cli.invoke(app, ["tasks", "cancel", tid, "--store", url])
    assert again.exit_code == 1 and "already cancelled" in again.output
    store = open_store(url)
    rec = store.get(tid)
    store.close()
    assert rec is not None and rec.state is TaskState.CANCELLED
    missing = cli.invoke(app, ["tasks", "show", "nope", "--store", url])
    assert missing.exit_code == 1 and "no task 'nope'" in missing.output


@pytest.mark.parametrize("command", [["tasks", "list"], ["worker"]])
def test_a_bad_store_url_is_named_with_what_is_allowed(
    cli: CliRunner, command: list[str]
) -> None:
    out = cli.invoke(app, [*command, "--store", "mysql://u:hunter2@db/x"])
    assert out.exit_code == 2
    assert "mysql://u:***@db/x" in out.output and "hunter2" not in out.output
    assert "sqlite:///" in out.output and "postgresql://" in out.output


def test_bad_state_and_bad_app(cli: CliRunner, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    out = cli.invoke(app, ["tasks", "list", "--store", url, "--state", "sleeping"])
    assert out.exit_code == 2 and "allowed: queued" in out.output
    out = cli.invoke(app, ["worker", "--store", url, "--app", str(tmp_path / "missing.py")])
    assert out.exit_code == 2 and "no such file" in out.output
