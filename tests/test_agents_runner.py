"""``run_step`` end to end against real child processes (fake agents from tests/agent_scripts).

Every test runs with a base delay of 0 (no waits) or an injected FakeClock,
so nothing sleeps on the wall clock except the timeout test, which waits
for its own 1 s timeout.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agent_scripts.harness import FakeAgent, install_agent, is_gone
from rateloop.agents import AgentSettings, StepFailure, exit_code_for, run_step
from rateloop.agents.settings import SettingsLayer, resolve_settings
from rateloop.outcome import Status
from rateloop.outcome.events import RecordingSink
from rateloop.signal import Kind
from rateloop.testing import FakeClock

RATE_LIMITED = {"stderr": "Error: You've hit your rate limit. Please wait.\n", "exit": 1}
EXHAUSTED_3 = (
    "Error: {label} rate limit persisted after 3 retries (4 attempts total).\n"
    "The provider kept throttling this step. Increase RATELOOP_MAX_RETRIES\n"
    "or RATELOOP_BASE_DELAY_SECS, or retry later.\n"
)


Install = Callable[..., FakeAgent]


@pytest.fixture
def install(tmp_path: Path) -> Install:
    """``install("claude", [behaviour, ...])``: an executable fake agent named ``claude``."""

    def _install(name: str, script: list[dict[str, Any]]) -> FakeAgent:
        return install_agent(tmp_path, name, script)

    return _install


def _settings(**flags: Any) -> AgentSettings:
    flags.setdefault("base_delay_secs", 0.0)
    return resolve_settings(flags=SettingsLayer(**flags))


def test_two_rate_limits_then_success(install: Install) -> None:
    agent = install(
        "claude",
        [
            {"stdout": "partial 1\n", **RATE_LIMITED},
            {"stdout": "partial 2\n", **RATE_LIMITED},
            {"stdout": "the answer\n"},
        ],
    )
    err = io.StringIO()
    outcome = run_step(
        [str(agent.path), "-p", "hi"], settings=_settings(), env=agent.env, stderr=err
    )
    assert agent.runs == 3
    assert outcome.status is Status.COMPLETED
    assert outcome.value == "the answer\n"  # failed attempts' stdout never mixes in
    assert outcome.attempts.loop == 3
    assert exit_code_for(outcome) == 0
    text = err.getvalue()
    assert text.count("⏳ RATE LIMIT detected") == 2
    assert "   Waiting 0s before retry 1/5 (attempt 2 of 6) ..." in text
    assert "   Waiting 0s before retry 2/5 (attempt 3 of 6) ..." in text
    assert "You've hit your rate limit" in text  # the child's stderr was forwarded


def test_persistent_rate_limit_exhausts_with_the_exact_message(install: Install) -> None:
    agent = install("copilot", [RATE_LIMITED])
    err = io.StringIO()
    outcome = run_step(
        [str(agent.path)],
        settings=_settings(max_retries=3),
        env=agent.env,
        stderr=err,
    )
    assert agent.runs == 4
    assert outcome.status is Status.FAILED_RETRY_EXHAUSTED
    assert exit_code_for(outcome) == 75
    assert outcome.signal is not None and outcome.signal.kind is Kind.TEMPORARY
    assert err.getvalue().endswith(EXHAUSTED_3.format(label="copilot"))


def test_wrapper_label_and_agent_come_from_the_first_argument(install: Install) -> None:
    wrapper = install("amplihack", [RATE_LIMITED])
    err = io.StringIO()
    outcome = run_step(
        [str(wrapper.path), "copilot", "-p", "x"],
        settings=_settings(max_retries=1, fallback_auto_model=True),
        env=wrapper.env,
        stderr=err,
    )
    assert exit_code_for(outcome) == 75
    assert "Error: amplihack copilot rate limit persisted after 1 retry (2" in err.getvalue()
    assert wrapper.calls() == [["copilot", "-p", "x"], ["copilot", "-p", "x", "--model", "auto"]]


def test_authentication_error_fails_fast_with_the_childs_code(install: Install) -> None:
    agent = install("claude", [{"stderr": "Invalid API key. Please run /login\n", "exit": 2}])
    err = io.StringIO()
    outcome = run_step(
        [str(agent.path), "-p", "hi"], settings=_settings(), env=agent.env, stderr=err
    )
    assert agent.runs == 1
    assert exit_code_for(outcome) == 2
    assert outcome.status in (Status.NEEDS_OPERATOR, Status.INVALID)
    assert isinstance(outcome.value, StepFailure)
    assert outcome.value.child_exit_code == 2
    assert err.getvalue().endswith("Error: claude failed (exit 2)\n")


def test_exit_zero_is_success_even_when_the_output_mentions_a_rate_limit(install: Install) -> None:
    agent = install("claude", [{"stdout": "I hit your rate limit handling code.\n"}])
    outcome = run_step([str(agent.path)], settings=_settings(), env=agent.env, stderr=io.StringIO())
    assert agent.runs == 1
    assert outcome.status is Status.COMPLETED
    assert outcome.value == "I hit your rate limit handling code.\n"


def test_auto_fallback_on_the_final_run_only(install: Install) -> None:
    agent = install("copilot", [RATE_LIMITED, {"stdout": "done on auto\n"}])
    err = io.StringIO()
    outcome = run_step(
        [str(agent.path), "-p", "hi", "--model", "gpt-5"],
        settings=_settings(max_retries=1, fallback_auto_model=True),
        env=agent.env,
        stderr=err,
    )
    first, second = agent.calls()
    assert "auto" not in first
    assert first == ["-p", "hi", "--model", "gpt-5"]
    assert second == ["-p", "hi", "--model", "auto"]
    assert outcome.status is Status.DEGRADED
    assert outcome.value == "done on auto\n"
    assert outcome.route is not None and outcome.route.model == "auto"
    assert exit_code_for(outcome) == 0
    assert "finished on --model auto" in err.getvalue()


def test_codex_never_gets_auto_and_keeps_its_model(install: Install) -> None:
    agent = install("codex", [RATE_LIMITED])
    outcome = run_step(
        [str(agent.path), "exec", "do it"],
        model="o3",
        settings=_settings(max_retries=1, fallback_auto_model=True),
        env=agent.env,
        stderr=io.StringIO(),
    )
    assert exit_code_for(outcome) == 75
    calls = agent.calls()
    assert len(calls) == 2
    paths = []
    for call in calls:
        assert "auto" not in call
        assert call[:4] == ["exec", "do it", "--model", "o3"]
        assert call[4] == "--output-last-message"
        paths.append(call[5])
    assert paths[0] != paths[1]  # a fresh file per attempt


def test_model_flag_is_passed_on_every_attempt(install: Install) -> None:
    agent = install("claude", [RATE_LIMITED, {"stdout": "ok"}])
    run_step(
        [str(agent.path), "-p", "x", "--model=haiku"],
        model="opus",
        settings=_settings(max_retries=3),
        env=agent.env,
        stderr=io.StringIO(),
    )
    assert agent.calls() == [["-p", "x", "--model", "opus"]] * 2


def test_codex_result_is_the_final_message_file(install: Install, tmp_path: Path) -> None:
    agent = install(
        "codex",
        [RATE_LIMITED, {"stdout": "thinking... progress\n", "message": "Final answer."}],
    )
    mine = tmp_path / "mine.txt"
    outcome = run_step(
        [str(agent.path), "exec", "--output-last-message", str(mine), "go"],
        settings=_settings(),
        env=agent.env,
        stderr=io.StringIO(),
    )
    assert outcome.status is Status.COMPLETED
    assert outcome.value == "Final answer."
    assert mine.read_text() == "Final answer."  # the user's own path still gets the message
    assert all(str(mine) not in call for call in agent.calls())


@pytest.mark.parametrize(
    ("behaviour", "needle"),
    [
        ({"message_bytes": 2048}, "codex's final message is 2048 bytes, over the limit of 1024"),
        ({"message": "  \n"}, "codex's final message is empty"),
        ({"message_raw_hex": "ff fe 41"}, "not valid UTF-8"),
        ({"stdout": "no file written"}, "codex wrote no final message"),
    ],
)
def test_codex_unusable_result_fails_clearly(
    install: Install, behaviour: dict[str, Any], needle: str
) -> None:
    agent = install("codex", [behaviour])
    err = io.StringIO()
    outcome = run_step(
        [str(agent.path), "exec", "go"],
        settings=_settings(max_step_output_bytes=1024),
        env=agent.env,
        stderr=err,
    )
    assert agent.runs == 1
    assert outcome.status is Status.INVALID
    assert exit_code_for(outcome) == 65
    assert needle in err.getvalue()
    assert "Error: codex exited 0 but its result is unusable" in err.getvalue()


def test_oversize_stdout_fails_clearly(install: Install) -> None:
    agent = install("claude", [{"stdout": "y" * 5000}])
    err = io.StringIO()
    outcome = run_step(
        [str(agent.path)],
        settings=_settings(max_step_output_bytes=4096),
        env=agent.env,
        stderr=err,
    )
    assert exit_code_for(outcome) == 65
    assert "its stdout is 5000 bytes, over the limit of 4096 bytes" in err.getvalue()


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc to see the grandchild")
def test_timeout_kills_the_process_group_and_is_not_retried(install: Install) -> None:
    agent = install(
        "claude", [{"grandchild": True, "ignore_term": True, "stderr": "working\n", "sleep": 60}]
    )
    err = io.StringIO()
    outcome = run_step(
        [str(agent.path)],
        timeout=1.0,
        kill_grace=0.3,
        settings=_settings(),
        env=agent.env,
        stderr=err,
    )
    assert agent.runs == 1
    assert exit_code_for(outcome) == 124
    assert isinstance(outcome.value, StepFailure) and outcome.value.timed_out
    pids = [int(p) for p in (agent.state / "pids").read_text().split()]
    assert pids and all(is_gone(pid) for pid in pids)
    assert "Error: claude timed out after 1s on attempt 1 of 6" in err.getvalue()


def test_claude_usage_limit_waits_for_reset_without_a_short_retry(install: Install) -> None:
    reset = datetime(2026, 1, 1, 15, 0, tzinfo=UTC)
    agent = install(
        "claude",
        [{"stdout": f"Claude AI usage limit reached|{int(reset.timestamp())}\n", "exit": 1}],
    )
    err = io.StringIO()
    clock = FakeClock(datetime(2026, 1, 1, 12, 0, tzinfo=UTC))
    outcome = run_step(
        [str(agent.path), "-p", "x"],
        settings=_settings(base_delay_secs=60.0),
        clock=clock,
        env=agent.env,
        stderr=err,
    )
    assert agent.runs == 1
    assert clock.sleeps == []
    assert outcome.status is Status.WAITING_FOR_RESET
    assert outcome.retry_at == reset
    assert exit_code_for(outcome) == 75
    assert "resets at 2026-01-01T15:00:00+00:00 (in 3h 0m)" in err.getvalue()


def test_waits_follow_the_schedule_on_the_injected_clock(install: Install) -> None:
    agent = install("claude", [RATE_LIMITED])
    clock, err = FakeClock(), io.StringIO()
    outcome = run_step(
        [str(agent.path)],
        settings=_settings(max_retries=4, base_delay_secs=60.0, max_delay_secs=300.0),
        clock=clock,
        env=agent.env,
        stderr=err,
    )
    assert clock.sleeps == [60.0, 120.0, 240.0, 300.0]
    assert agent.runs == 5
    assert exit_code_for(outcome) == 75
    banner_lines = [line for line in err.getvalue().splitlines() if "Waiting" in line]
    assert banner_lines == [
        "   Waiting 60s before retry 1/4 (attempt 2 of 5) ...",
        "   Waiting 120s before retry 2/4 (attempt 3 of 5) ...",
        "   Waiting 240s before retry 3/4 (attempt 4 of 5) ...",
        "   Waiting 300s before retry 4/4 (attempt 5 of 5) ...",
    ]


def test_stderr_is_streamed_while_the_child_runs(install: Install, tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    agent = install(
        "claude", [{"stderr": "progress line\n", "wait_for_file": str(seen), "stdout": "ok"}]
    )

    class Watcher(io.StringIO):
        def write(self, s: str) -> int:
            if "progress line" in s:
                seen.touch()  # the child is still running and waits for this
            return super().write(s)

    outcome = run_step(
        [str(agent.path)], timeout=15, settings=_settings(), env=agent.env, stderr=Watcher()
    )
    assert outcome.status is Status.COMPLETED  # exit 3 (a failure) if stderr were buffered


def test_input_is_fed_to_every_attempt(install: Install) -> None:
    agent = install("claude", [{**RATE_LIMITED, "echo_stdin": True}, {"echo_stdin": True}])
    outcome = run_step(
        [str(agent.path)],
        input=b"the prompt",
        settings=_settings(),
        env=agent.env,
        stderr=io.StringIO(),
    )
    assert agent.runs == 2
    assert outcome.value == "the prompt"


def test_command_not_found_exits_127(tmp_path: Path) -> None:
    err = io.StringIO()
    outcome = run_step([str(tmp_path / "nope" / "claude")], settings=_settings(), stderr=err)
    assert exit_code_for(outcome) == 127
    assert outcome.attempts.loop == 1
    assert "Error: claude could not be started: command not found" in err.getvalue()


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="empty command"):
        run_step([])
    with pytest.raises(ValueError, match="timeout must be"):
        run_step(["claude"], timeout=0)
    with pytest.raises(ValueError, match=r"unknown agent 'gpt' \(allowed: claude, copilot"):
        run_step(["claude"], agent="gpt")


def test_decisions_are_events_without_the_prompt(install: Install) -> None:
    agent = install("copilot", [RATE_LIMITED, RATE_LIMITED, {"stdout": "ok"}])
    sink = RecordingSink()
    outcome = run_step(
        [str(agent.path), "-p", "SECRET PROMPT sk-abcdefghijklmnop"],
        model="gpt-5",
        settings=_settings(max_retries=2, fallback_auto_model=True),
        env=agent.env,
        stderr=io.StringIO(),
        sinks=[sink],
    )
    assert sink.decisions == ["wait", "retry", "wait", "fallback", "success_after_retry"]
    assert list(outcome.events) == sink.events
    first_wait = sink.events[0]
    assert (first_wait.operation, first_wait.provider, first_wait.model) == (
        "copilot",
        "copilot",
        "gpt-5",
    )
    assert (first_wait.signal_kind, first_wait.wait_seconds, first_wait.attempt) == (
        "temporary",
        0.0,
        1,
    )
    assert sink.events[-1].model == "auto"
    assert all("SECRET" not in e.to_json() and "sk-" not in e.to_json() for e in sink.events)


def test_a_first_try_success_has_no_events_and_a_failure_has_a_stop(install: Install) -> None:
    ok = install("claude", [{"stdout": "fine"}])
    assert run_step([str(ok.path)], settings=_settings(), env=ok.env).events == ()
    bad = install("gemini", [{"exit": 4}])
    outcome = run_step([str(bad.path)], settings=_settings(), env=bad.env, stderr=io.StringIO())
    assert [(e.decision.value, e.status, e.reason) for e in outcome.events] == [
        ("stop", "needs_operator", "gemini failed (exit 4)")
    ]


def test_a_failed_attempts_own_stdout_is_shown_before_the_error(install: Install) -> None:
    # Claude Code prints its auth error on stdout; stderr is empty.
    agent = install("claude", [{"stdout": "Invalid API key · Please run /login\n", "exit": 1}])
    err = io.StringIO()
    outcome = run_step(
        [str(agent.path), "-p", "x"], settings=_settings(), env=agent.env, stderr=err
    )
    assert err.getvalue() == (
        "--- last line of claude's stdout ---\n"
        "Invalid API key · Please run /login\n"
        "Error: claude failed (exit 1)\n"
    )
    assert isinstance(outcome.value, StepFailure) and outcome.value.excerpt is not None
    assert outcome.value.excerpt.lines == ("Invalid API key · Please run /login",)


def test_the_excerpt_prefers_stderr_and_never_shows_a_key(install: Install) -> None:
    key = "sk-ant-api03-" + "Z" * 40
    agent = install(
        "codex",
        [{"stdout": "progress\n", "stderr": f"line 1\n401 Unauthorized: bad key {key}\n",
          "exit": 3}],
    )
    err = io.StringIO()
    outcome = run_step([str(agent.path)], settings=_settings(), env=agent.env, stderr=err)
    text = err.getvalue()
    assert exit_code_for(outcome) == 3
    assert text.endswith(
        "--- last 2 lines of codex's stderr ---\n"
        "line 1\n401 Unauthorized: bad key [redacted]\n"
        "Error: codex failed (exit 3)\n"
    )
    # The live stream is the child's own stderr, forwarded as is; the excerpt is redacted.
    assert text.count(key) == 1


def test_a_usage_limit_shows_the_agents_line_and_a_timeout_shows_none(install: Install) -> None:
    line = "Claude AI usage limit reached|1767279600"
    agent = install("claude", [{"stdout": line + "\n", "exit": 1}])
    err = io.StringIO()
    outcome = run_step(
        [str(agent.path)], settings=_settings(), clock=FakeClock(), env=agent.env, stderr=err
    )
    assert exit_code_for(outcome) == 75
    assert f"--- last line of claude's stdout ---\n{line}\nError: claude hit a usage limit" in (
        err.getvalue()
    )
    ok = install("gemini", [{"stdout": "fine\n"}])
    assert "---" not in _run_quietly(ok)


def _run_quietly(agent: FakeAgent) -> str:
    err = io.StringIO()
    run_step([str(agent.path)], settings=_settings(), env=agent.env, stderr=err)
    return err.getvalue()


def test_an_overloaded_provider_is_named_in_the_banner(install: Install) -> None:
    overloaded = {
        "stderr": 'API Error: 529 {"type":"error","error":{"type":"overloaded_error",'
        '"message":"Overloaded"}}\n',
        "exit": 1,
    }
    agent = install("claude", [overloaded, RATE_LIMITED, {"stdout": "done"}])
    err = io.StringIO()
    outcome = run_step([str(agent.path)], settings=_settings(), env=agent.env, stderr=err)
    assert outcome.status is Status.COMPLETED
    text = err.getvalue()
    assert '⏳ OVERLOADED detected (signal: "overloaded")\n' in text
    assert "   The provider is over capacity (not your limit)." in text
    assert text.count("⏳ RATE LIMIT detected") == 1  # the second attempt was a throttle
    assert text.index("OVERLOADED") < text.index("RATE LIMIT")


def test_our_own_messages_never_show_a_key_even_in_a_label(install: Install) -> None:
    key = "sk-proj-" + "Q" * 30
    agent = install("claude", [{"exit": 4}])
    err = io.StringIO()
    run_step(
        [str(agent.path)], label=f"step {key}", settings=_settings(), env=agent.env, stderr=err
    )
    assert err.getvalue() == "Error: step [redacted] failed (exit 4)\n"
