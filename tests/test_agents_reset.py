"""``--wait-for-reset``: wait out a usage limit whose reset is known and near, then run once more.

Real child processes (the fake agent); every wait is on an injected FakeClock.
"""

from __future__ import annotations

import io
import json
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agent_scripts.harness import FakeAgent, cli_env, install_agent, rateloop_run
from rateloop.agents import AgentSettings, StepFailure, exit_code_for, run_step
from rateloop.agents.banner import WAIT_CHUNK_SECS, wait_until
from rateloop.agents.settings import parse_wait_limit
from rateloop.agents.step import RESET_MARGIN_SECS
from rateloop.outcome import Status
from rateloop.outcome.events import RecordingSink
from rateloop.testing import FakeClock

NOON = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
SIX_HOURS = 6 * 3600.0
THROTTLED = {"stderr": "429 Too Many Requests: you hit your rate limit\n", "exit": 1}
Install = Callable[..., FakeAgent]


def _limit(reset: datetime) -> dict[str, Any]:
    """Claude Code 1.x's usage-limit line, with its reset epoch."""
    return {"stdout": f"Claude AI usage limit reached|{int(reset.timestamp())}\n", "exit": 1}


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def install(tmp_path: Path) -> Install:
    def _install(name: str, script: list[dict[str, Any]]) -> FakeAgent:
        return install_agent(tmp_path, name, script)

    return _install


def _run(
    agent: FakeAgent, *, clock: FakeClock, err: io.StringIO, **kwargs: Any
) -> tuple[Any, RecordingSink]:
    sink = RecordingSink()
    kwargs.setdefault("settings", AgentSettings(base_delay_secs=0.0))
    outcome = run_step(
        [str(agent.path), "-p", "x"], clock=clock, env=agent.env, stderr=err, sinks=[sink], **kwargs
    )
    return outcome, sink


def test_a_near_reset_is_waited_out_then_the_step_runs_once_more(install: Install) -> None:
    reset = NOON + timedelta(hours=3)
    agent = install("claude", [_limit(reset), {"stdout": "done\n"}])
    clock, err = FakeClock(NOON), io.StringIO()
    outcome, sink = _run(agent, clock=clock, err=err, wait_for_reset=SIX_HOURS)
    assert agent.runs == 2
    assert (outcome.status, outcome.value, exit_code_for(outcome)) == (
        Status.COMPLETED,
        "done\n",
        0,
    )
    # Off a terminal: slept in chunks until the reset plus the margin, by the wall clock.
    assert clock.now() == reset + timedelta(seconds=RESET_MARGIN_SECS)
    assert sum(clock.sleeps) == pytest.approx(3 * 3600 + RESET_MARGIN_SECS)
    assert max(clock.sleeps) == WAIT_CHUNK_SECS
    assert err.getvalue().startswith(
        "================================================================================\n"
        '⏳ USAGE LIMIT reached (signal: "usage limit reached")\n'
        "   The limit resets at 2026-01-01T15:00:00+00:00 (in 3h 0m).\n"
        "   Waiting for the reset (--wait-for-reset, up to 6h 0m), then running claude once"
        " more ...\n"
    )
    assert "retrying in" not in err.getvalue() and "running again in" not in err.getvalue()
    assert sink.decisions == ["wait", "retry", "success_after_retry"]
    assert sink.events[0].wait_seconds == 3 * 3600 + RESET_MARGIN_SECS
    assert sink.events[0].reason == (
        "waiting for the usage limit to reset at 2026-01-01T15:00:00+00:00"
    )


def test_on_a_terminal_the_wait_is_a_live_countdown(install: Install) -> None:
    reset = NOON + timedelta(minutes=2)
    agent = install("claude", [_limit(reset), {"stdout": "done\n"}])
    clock, err = FakeClock(NOON), _Terminal()
    outcome, _ = _run(agent, clock=clock, err=err, wait_for_reset=SIX_HOURS)
    assert outcome.status is Status.COMPLETED
    assert clock.sleeps == [1.0] * int(120 + RESET_MARGIN_SECS)
    frames = [p.strip() for p in err.getvalue().split("\r") if p.strip().startswith("running")]
    assert frames[0] == "running again in 3m 00s ..."
    assert frames[1] == "running again in 2m 59s ..."
    assert frames[-1] == "running again in 1s ..."
    assert len(frames) == 180


def test_a_reset_beyond_max_exits_75_naming_the_reset(install: Install) -> None:
    reset = NOON + timedelta(hours=8)
    agent = install("claude", [_limit(reset)])
    clock, err = FakeClock(NOON), io.StringIO()
    outcome, _ = _run(agent, clock=clock, err=err, wait_for_reset=SIX_HOURS)
    assert (agent.runs, clock.sleeps, exit_code_for(outcome)) == (1, [], 75)
    assert outcome.status is Status.WAITING_FOR_RESET and outcome.retry_at == reset
    assert err.getvalue().endswith(
        "The limit resets at 2026-01-01T20:00:00+00:00 (in 8h 0m); retry after that.\n"
        "That is beyond --wait-for-reset's 6h 0m; not waiting.\n"
    )


def test_without_the_flag_a_usage_limit_still_exits_75(install: Install) -> None:
    agent = install("claude", [_limit(NOON + timedelta(minutes=5)), {"stdout": "never"}])
    clock, err = FakeClock(NOON), io.StringIO()
    outcome, _ = _run(agent, clock=clock, err=err)
    assert (agent.runs, clock.sleeps, exit_code_for(outcome)) == (1, [], 75)
    assert "wait-for-reset" not in err.getvalue()


def test_an_unknown_reset_is_not_waited_for(install: Install) -> None:
    agent = install("claude", [{"stdout": "Claude usage limit reached.\n", "exit": 1}])
    clock, err = FakeClock(NOON), io.StringIO()
    outcome, _ = _run(agent, clock=clock, err=err, wait_for_reset=SIX_HOURS)
    assert (agent.runs, clock.sleeps, exit_code_for(outcome)) == (1, [], 75)
    assert err.getvalue().endswith(
        "The provider did not say when it resets; retry later.\n"
        "--wait-for-reset cannot wait: the provider did not say when the limit resets.\n"
    )


def test_the_reset_is_waited_for_once(install: Install) -> None:
    agent = install(
        "claude", [_limit(NOON + timedelta(hours=1)), _limit(NOON + timedelta(hours=2))]
    )
    clock, err = FakeClock(NOON), io.StringIO()
    outcome, sink = _run(agent, clock=clock, err=err, wait_for_reset=SIX_HOURS)
    assert agent.runs == 2
    assert exit_code_for(outcome) == 75
    assert sum(clock.sleeps) == pytest.approx(3600 + RESET_MARGIN_SECS)
    assert err.getvalue().endswith(
        "Still limited after waiting for the reset once; not waiting again.\n"
    )
    assert sink.decisions == ["wait", "retry", "stop"]


def test_the_run_after_the_reset_spends_no_retry(install: Install) -> None:
    # One retry allowed: the reset run is extra, so a throttle after it still gets its retry.
    agent = install(
        "claude", [_limit(NOON + timedelta(hours=1)), THROTTLED, {"stdout": "done\n"}]
    )
    clock, err = FakeClock(NOON), io.StringIO()
    outcome, _ = _run(
        agent,
        clock=clock,
        err=err,
        wait_for_reset=SIX_HOURS,
        settings=AgentSettings(max_retries=1, base_delay_secs=7.0, fallback_auto_model=True),
    )
    assert (agent.runs, outcome.status) == (3, Status.DEGRADED)
    assert "   Waiting 7s before retry 1/1 (attempt 3 of 3) ..." in err.getvalue()
    # The run after the reset keeps the model; only the final retry falls back to auto.
    assert agent.calls() == [["-p", "x"], ["-p", "x"], ["-p", "x", "--model", "auto"]]


def test_the_run_after_the_reset_can_exhaust_with_the_right_count(install: Install) -> None:
    agent = install("claude", [_limit(NOON + timedelta(minutes=30)), THROTTLED])
    clock, err = FakeClock(NOON), io.StringIO()
    outcome, _ = _run(
        agent,
        clock=clock,
        err=err,
        wait_for_reset=SIX_HOURS,
        settings=AgentSettings(max_retries=0, fallback_auto_model=True),
    )
    assert agent.runs == 2
    assert outcome.status is Status.FAILED_RETRY_EXHAUSTED
    assert "persisted after 0 retries (2 attempts total)." in err.getvalue()
    assert agent.calls() == [["-p", "x"], ["-p", "x"]]  # a single-run step keeps its model


def test_a_reset_already_past_waits_only_the_margin(install: Install) -> None:
    agent = install("claude", [_limit(NOON - timedelta(minutes=1)), {"stdout": "ok"}])
    clock, err = FakeClock(NOON), io.StringIO()
    outcome, _ = _run(agent, clock=clock, err=err, wait_for_reset=SIX_HOURS)
    assert outcome.status is Status.COMPLETED
    assert sum(clock.sleeps) == pytest.approx(RESET_MARGIN_SECS)


class _SuspendingClock(FakeClock):
    """A laptop lid closed during the first sleep: the wall clock jumps two hours."""

    def sleep(self, seconds: float) -> None:
        first = not self.sleeps
        super().sleep(seconds)
        if first:
            self.advance(2 * 3600)


def test_the_wait_follows_the_wall_clock_across_a_suspend() -> None:
    clock = _SuspendingClock(NOON)
    wait_until(clock, NOON + timedelta(hours=2, minutes=30), io.StringIO())
    assert clock.now() == NOON + timedelta(hours=2, minutes=30)
    assert len(clock.sleeps) == 1 + 29  # one chunk, the jump, then the last 29 minutes


def test_run_step_refuses_a_bad_limit() -> None:
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="wait_for_reset must be"):
            run_step(["claude"], wait_for_reset=bad)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("3600", 3600.0),
        ("90m", 5400.0),
        ("6h", 21600.0),
        ("6H", 21600.0),
        (" 1h30m ", 5400.0),
        ("1.5h", 5400.0),
        ("45s", 45.0),
        ("2d", 172800.0),
        ("1d12h", 129600.0),
        ("7d", 604800.0),
    ],
)
def test_wait_limit_forms(text: str, seconds: float) -> None:
    assert parse_wait_limit(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "abc", "-5", "0", "0m", "8d", "6 h", "1h-30m", "nan", "inf", "1e3", "h", "6hours"]
)
def test_bad_wait_limits_name_the_value_and_the_forms(text: str) -> None:
    with pytest.raises(ValueError, match=r"90m, 6h") as raised:
        parse_wait_limit(text)
    assert repr(text) in str(raised.value)


# -- the command line --------------------------------------------------------------------------


def _cli(
    tmp_path: Path, script: list[dict[str, Any]], *args: str
) -> subprocess.CompletedProcess[str]:
    agent = install_agent(tmp_path, "claude", script)
    argv = [a.replace("AGENT", str(agent.path)) for a in args]
    return rateloop_run(argv, cli_env(agent.env))


@pytest.mark.parametrize(
    ("args", "limit"),
    [
        (("--wait-for-reset", "--", "AGENT"), "6h 0m"),
        (("--wait-for-reset=90m", "--", "AGENT"), "1h 30m"),
        (("--wait-for-reset", "2h", "--", "AGENT"), "2h 0m"),
    ],
)
def test_cli_flag_forms_and_a_far_reset(tmp_path: Path, args: tuple[str, ...], limit: str) -> None:
    far = datetime.now(UTC) + timedelta(hours=9)
    done = _cli(tmp_path, [_limit(far)], *args)
    assert done.returncode == 75, done.stderr
    assert f"That is beyond --wait-for-reset's {limit}; not waiting." in done.stderr
    assert "The limit resets at " in done.stderr


def test_cli_refuses_a_bad_limit_before_running(tmp_path: Path) -> None:
    done = _cli(tmp_path, [{"stdout": "never"}], "--wait-for-reset=soon", "--", "AGENT")
    assert done.returncode == 2
    assert "'soon' is not a wait limit" in " ".join(done.stderr.split())
    assert not (tmp_path / "state-claude" / "count").exists()


def test_cli_bare_flag_before_the_command_and_words_after_it(tmp_path: Path) -> None:
    # No `--`: the bare flag takes the default and the command starts at AGENT; a
    # "--wait-for-reset" inside the agent's own arguments is the agent's, untouched.
    done = _cli(
        tmp_path,
        [{"stdout": "ran"}],
        "--model",
        "opus",
        "--wait-for-reset",
        "AGENT",
        "-p",
        "--wait-for-reset",
        "2h",
    )
    assert (done.returncode, done.stdout) == (0, "ran"), done.stderr
    calls = (tmp_path / "state-claude" / "calls.jsonl").read_text()
    assert json.loads(calls) == ["-p", "--wait-for-reset", "2h", "--model", "opus"]


def test_step_failure_of_a_waited_step_keeps_its_excerpt(install: Install) -> None:
    agent = install("claude", [_limit(NOON + timedelta(hours=1)), {"stderr": "boom\n", "exit": 9}])
    outcome, _ = _run(agent, clock=FakeClock(NOON), err=io.StringIO(), wait_for_reset=SIX_HOURS)
    assert isinstance(outcome.value, StepFailure)
    assert (outcome.value.exit_code, outcome.value.excerpt and outcome.value.excerpt.lines) == (
        9,
        ("boom",),
    )


# -- Claude Code 2.x's own line (recognised by classify_text since the Read work) ---------------

CLAUDE_2X = "You've hit your limit · resets 3:30am (Asia/Calcutta)\n"  # 22:00 UTC


def test_claude_code_2x_limit_line_is_waited_out(install: Install) -> None:
    # Reported by a user of `claude -p` (slopus/happy#465 shows the same shape, exit 1).
    agent = install("claude", [{"stdout": CLAUDE_2X, "exit": 1}, {"stdout": "done\n"}])
    evening = datetime(2026, 1, 1, 18, 0, tzinfo=UTC)
    clock, err = FakeClock(evening), io.StringIO()
    outcome, _ = _run(agent, clock=clock, err=err, wait_for_reset=SIX_HOURS)
    assert (agent.runs, outcome.status, outcome.value) == (2, Status.COMPLETED, "done\n")
    assert clock.now() == datetime(2026, 1, 1, 22, 0, tzinfo=UTC) + timedelta(
        seconds=RESET_MARGIN_SECS
    )
    assert '⏳ USAGE LIMIT reached (signal: "hit your limit")' in err.getvalue()
    assert "The limit resets at 2026-01-01T22:00:00+00:00 (in 4h 0m)." in err.getvalue()


def test_claude_code_2x_limit_line_beyond_max_exits_75(install: Install) -> None:
    agent = install("claude", [{"stdout": CLAUDE_2X, "exit": 1}])
    clock, err = FakeClock(NOON), io.StringIO()
    outcome, _ = _run(agent, clock=clock, err=err, wait_for_reset=SIX_HOURS)
    assert (agent.runs, clock.sleeps, exit_code_for(outcome)) == (1, [], 75)
    assert outcome.retry_at == datetime(2026, 1, 1, 22, 0, tzinfo=UTC)
    assert err.getvalue().endswith(
        "--- last line of claude's stdout ---\n"
        "You've hit your limit · resets 3:30am (Asia/Calcutta)\n"
        'Error: claude hit a usage limit (signal: "hit your limit"); not retrying in this run.\n'
        "The limit resets at 2026-01-01T22:00:00+00:00 (in 10h 0m); retry after that.\n"
        "That is beyond --wait-for-reset's 6h 0m; not waiting.\n"
    )


def test_cli_with_claude_code_2x_line_names_the_reset(tmp_path: Path) -> None:
    # On the real clock: a reset three hours from now, written as Claude Code writes it.
    at = (datetime.now(UTC) + timedelta(hours=3)).replace(minute=0, second=0, microsecond=0)
    hour = at.hour % 12 or 12
    line = f"You've hit your limit · resets {hour}{'am' if at.hour < 12 else 'pm'} (UTC)\n"
    done = _cli(tmp_path, [{"stdout": line, "exit": 1}], "--wait-for-reset=1h", "--", "AGENT")
    assert done.returncode == 75, done.stderr
    assert f"The limit resets at {at.isoformat(timespec='seconds')}" in done.stderr
    assert "That is beyond --wait-for-reset's 1h 0m; not waiting." in done.stderr


def test_cli_a_reset_beyond_max_is_parked_with_queue(tmp_path: Path) -> None:
    # --wait-for-reset waits for near resets in process; --queue parks the farther ones.
    far = datetime.now(UTC) + timedelta(hours=9)
    db = tmp_path / "tasks.db"
    done = _cli(
        tmp_path, [_limit(far)], "--wait-for-reset=1h", "--queue", f"sqlite:///{db}", "--", "AGENT"
    )
    assert done.returncode == 0, done.stderr
    assert "That is beyond --wait-for-reset's 1h 0m; not waiting." in done.stderr
    assert "parked as task" in done.stderr
    assert done.stdout.strip()  # the task id
