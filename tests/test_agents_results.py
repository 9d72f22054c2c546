"""Headless agents' own results: read what the agent said, whatever it exited with.

The fixtures (tests/fixtures/agent_results.yaml) are real outputs, each with
the agent's version and where it was published.  The end-to-end tests run
real child processes (the fake agents of tests/agent_scripts) on a FakeClock
or with no waits.
"""

from __future__ import annotations

import io
import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from agent_scripts.harness import cli_env, install_agent, rateloop_run
from rateloop.agents import StepFailure, exit_code_for, run_step
from rateloop.agents.banner import exhausted_message
from rateloop.agents.headless import claude_auto_continue
from rateloop.agents.settings import SettingsLayer, resolve_settings
from rateloop.classify import classify_text
from rateloop.classify.agent_results import (
    agent_retries_of,
    allowance_of,
    auto_resume_of,
    classify_agent_result,
    read_agent_result,
)
from rateloop.outcome import Status
from rateloop.signal import Dimension, Kind
from rateloop.testing import FakeClock

FIXTURES = yaml.safe_load(
    (Path(__file__).parent / "fixtures" / "agent_results.yaml").read_text(encoding="utf-8")
)
NOW = datetime.fromisoformat(FIXTURES["now"].replace("Z", "+00:00"))
CASES = {case["name"]: case for case in FIXTURES["cases"]}
SESSION_LIMIT = CASES[
    "claude stream-json, session limit, exit 0 with is_error and subtype success"
]["stdout"]
SERVED = CASES[
    "claude stream-json, a served request with an allowed rate_limit_event is not a limit"
]["stdout"]
# Claude Code's own notice that it will continue by itself (the strings of the Claude Code
# 2.1.261 binary, listed in a public implementation plan found with find_string, id 61385515841).
AUTO_CONTINUE = "Continuing automatically when your limit resets"
# Claude Code's retry line (tests/fixtures/classify/agents_claude.yaml, anthropics/claude-code#1909
# shape): the 10th of its own 10 retries.
RETRY_429 = (
    'API Error (429 {"type":"error","error":{"type":"rate_limit_error","message":"This request'
    " would exceed your account's rate limit. Please try again later.\"}}) · Retrying in 40"
    " seconds… (attempt 10/10)"
)
# Codex's usage-limit text (codex-rs/core/src/error.rs, as in agents_codex.yaml), inside the
# `codex exec --json` error event shape of openai/codex#37676.
CODEX_LIMIT = (
    "You've hit your usage limit. Upgrade to Pro (https://openai.com/chatgpt/pricing), visit"
    " https://chatgpt.com/codex/settings/usage to purchase more credits or try again at 3:28 PM."
)
CODEX_STDIN = "Reading additional input from stdin...\n"


def _settings(**flags: Any) -> Any:
    flags.setdefault("base_delay_secs", 0.0)
    return resolve_settings(flags=SettingsLayer(**flags))


@pytest.mark.parametrize("case", FIXTURES["cases"], ids=lambda case: case["name"])
def test_each_real_result_is_read(case: dict[str, Any]) -> None:
    result = read_agent_result(case["stdout"], case.get("stderr", ""))
    assert result is not None
    expect = case["expect"]
    assert result.format == expect["format"]
    assert result.failed is expect["failed"]
    assert list(result.texts) == expect["texts"]
    for field in ("limit_type", "status", "agent_retries"):
        if field in expect:
            assert getattr(result, field) == expect[field]
    signal = classify_agent_result(result, now=NOW)
    if "allowance" in expect:
        assert allowance_of(signal, result.limit_type) == expect["allowance"]
    if "kind" in expect:
        assert signal.kind.value == expect["kind"]
    if "dimension" in expect:
        assert signal.dimension == expect["dimension"]
    if "reset_at" in expect:
        assert signal.reset_at == datetime.fromisoformat(expect["reset_at"])


def test_the_usage_keys_of_a_json_result_are_not_the_limit() -> None:
    # Read as text, the JSON's `usage` object ("input_tokens") and a "rate_limit_event" make a
    # served request look like an input-token throttle; the structured reader reads what the
    # agent said.
    raw = classify_text(SERVED, exit_code=1, now=NOW)
    assert raw.dimension is Dimension.INPUT_TOKENS  # the misreading this module exists for
    result = read_agent_result(SERVED)
    assert result is not None and not result.failed
    assert classify_agent_result(result, now=NOW).kind is Kind.OK


def test_a_rejected_rate_limit_event_is_a_usage_limit_with_the_stated_reset() -> None:
    # The rate_limit_info payload of anthropics/claude-code#92418 (Claude Code 2.1.261), as a
    # stream-json rate_limit_event, with no text at all.
    info = {"status": "rejected", "resetsAt": 1788625200, "unifiedRateLimitFallbackAvailable":
            False, "rateLimitType": "five_hour", "overageStatus": "rejected",
            "overageDisabledReason": "member_zero_credit_limit", "isUsingOverage": False}
    stdout = json.dumps({"type": "rate_limit_event", "rate_limit_info": info}) + "\n"
    result = read_agent_result(stdout)
    assert result is not None and result.failed
    signal = classify_agent_result(result, now=NOW)
    assert signal.kind is Kind.PERIOD_QUOTA
    assert signal.reset_at == datetime.fromtimestamp(1788625200, UTC)
    assert allowance_of(signal, result.limit_type) == "session_limit"


@pytest.mark.parametrize(
    "stdout",
    ["", "plain text\n", "{not json", "[" * 100_000, '{"type": "message"}', "42", "null"],
)
def test_what_is_not_a_known_result_is_none(stdout: str) -> None:
    assert read_agent_result(stdout) is None


def test_the_agents_own_retries_and_auto_resume_are_read() -> None:
    assert agent_retries_of(RETRY_429) == 10
    assert agent_retries_of("429 Too Many Requests") == 0
    # Claude Code's stream-json retry notice, as measured from claude 2.1.241 (a public
    # source comment found with find_string, id 58292258493).
    retry = ('{"type":"system","subtype":"api_retry","attempt":1,"max_retries":10,'
             '"retry_delay_ms":600,"error_status":529,"error":"overloaded"}\n')
    end = ('{"type":"result","subtype":"success","is_error":true,"terminal_reason":"api_error",'
           '"api_error_status":403,"num_turns":484,"duration_ms":1505}\n')  # #79500's result
    result = read_agent_result(retry * 3 + retry.replace('"attempt":1', '"attempt":4') + end)
    assert result is not None and result.failed and result.agent_retries == 4
    # Gemini CLI's logRetryAttempt (google-gemini/gemini-cli packages/core/src/utils/retry.ts).
    assert agent_retries_of("Attempt 4 failed with status 429. Retrying with backoff...") == 4
    assert auto_resume_of(f"You've hit your session limit · resets 9am\n{AUTO_CONTINUE}")
    assert not auto_resume_of(
        f"{AUTO_CONTINUE}\nthe usage limit now resets more than 24 hours out, so this task will"
        " not resume on its own"
    )


@pytest.mark.parametrize(
    ("text", "allowance"),
    [
        ("You've hit your weekly limit · resets 3am (Europe/London)", "weekly_limit"),
        ("You've hit your session limit · resets 9am (Europe/Berlin)", "session_limit"),
        ("You've hit your monthly spend limit", "spend_limit"),
        ("You've hit your Opus limit", "model_limit"),
        ("429 Too Many Requests", None),
    ],
)
def test_the_allowance_is_the_one_the_agent_named(text: str, allowance: str | None) -> None:
    # One vocabulary: the allowance is the code the agent-text reader gives (classify._allowance).
    signal = classify_text(text, exit_code=1, now=NOW)
    assert allowance_of(signal) == allowance


# -- end to end ------------------------------------------------------------------------------


def test_exit_0_with_a_limit_in_the_result_is_not_a_success(tmp_path: Path) -> None:
    agent = install_agent(tmp_path, "claude", [{"stdout": SESSION_LIMIT, "exit": 0}])
    err = io.StringIO()
    outcome = run_step(
        [str(agent.path), "-p", "x", "--output-format", "stream-json", "--verbose"],
        settings=_settings(), env=agent.env, stderr=err, clock=FakeClock(NOW),
    )
    assert outcome.status is Status.WAITING_FOR_RESET
    assert exit_code_for(outcome) == 75
    assert agent.runs == 1  # a usage limit is not retried in the short loop
    failure = outcome.value
    assert isinstance(failure, StepFailure)
    assert failure.allowance == "session_limit"
    assert outcome.retry_at == datetime(2026, 1, 2, 8, tzinfo=UTC)  # 9am Berlin, as stated
    assert failure.excerpt is not None and failure.excerpt.source == "result"
    assert failure.excerpt.lines == ("You've hit your session limit · resets 9am (Europe/Berlin)",)
    text = err.getvalue()
    assert "The allowance that ran out: the session limit (session_limit)." in text
    assert '"input_tokens"' not in text  # the excerpt is the refusal, not the JSON around it


def test_a_served_json_result_stays_a_success(tmp_path: Path) -> None:
    agent = install_agent(tmp_path, "claude", [{"stdout": SERVED, "exit": 0}])
    outcome = run_step([str(agent.path), "-p", "x"], settings=_settings(), env=agent.env,
                       stderr=io.StringIO())
    assert outcome.status is Status.COMPLETED and outcome.value == SERVED


def test_codex_json_errors_on_stdout_are_the_excerpt(tmp_path: Path) -> None:
    events = [{"type": "thread.started", "thread_id": "<redacted>"}, {"type": "turn.started"},
              {"type": "error", "message": CODEX_LIMIT},
              {"type": "turn.failed", "error": {"message": CODEX_LIMIT}}]
    stdout = "".join(json.dumps(e) + "\n" for e in events)
    agent = install_agent(tmp_path, "codex", [{"stdout": stdout, "stderr": CODEX_STDIN,
                                                "exit": 1}])
    err = io.StringIO()
    outcome = run_step([str(agent.path), "exec", "--json", "x"], settings=_settings(),
                       env=agent.env, stderr=err, clock=FakeClock(NOW))
    assert outcome.status is Status.WAITING_FOR_RESET
    failure = outcome.value
    assert isinstance(failure, StepFailure) and failure.excerpt is not None
    assert failure.excerpt.lines == (CODEX_LIMIT,)
    assert "Reading additional input" not in failure.excerpt.render("codex")


GEMINI_429 = CASES[
    "gemini -o json, a 429 that stayed; the error object is on stderr, stdout is empty (exit 173)"
]


def test_geminis_json_error_on_stderr_is_its_result_and_the_excerpt(tmp_path: Path) -> None:
    # The real Gemini CLI 0.61.0 (bench/real_agents.py): `-o json` prints its error object at
    # the end of stderr, after its retry log and stack traces; stdout is empty.
    agent = install_agent(tmp_path, "gemini", [{"stdout": "", "stderr": GEMINI_429["stderr"],
                                                 "exit": 173}])
    outcome = run_step([str(agent.path), "-p", "x", "-o", "json"],
                       settings=_settings(max_retries=0), env=agent.env, stderr=io.StringIO())
    assert outcome.status is Status.FAILED_RETRY_EXHAUSTED
    assert outcome.signal is not None and outcome.signal.status == 429
    failure = outcome.value
    assert isinstance(failure, StepFailure) and failure.excerpt is not None
    assert failure.excerpt.source == "result"
    assert failure.excerpt.lines == ("Resource has been exhausted (e.g. check quota).",)
    assert failure.agent_retries == 9


def test_a_json_error_a_tool_printed_on_stderr_is_not_geminis_result() -> None:
    stderr = '{\n  "error": {"message": "429 Too Many Requests", "code": 429}\n}\n'
    assert read_agent_result("", stderr) is None


def test_a_refusal_on_stdout_is_shown_over_an_unrelated_stderr(tmp_path: Path) -> None:
    agent = install_agent(tmp_path, "gemini", [{"stdout": "Error: 429 Too Many Requests\n",
                                                 "stderr": "Loaded cached credentials.\n",
                                                 "exit": 1}])
    outcome = run_step([str(agent.path)], settings=_settings(max_retries=0), env=agent.env,
                       stderr=io.StringIO())
    failure = outcome.value
    assert isinstance(failure, StepFailure) and failure.excerpt is not None
    assert failure.excerpt.source == "stdout"
    assert failure.excerpt.lines == ("Error: 429 Too Many Requests",)


def test_the_agents_own_retries_spend_the_steps_budget(tmp_path: Path) -> None:
    # Claude Code retried 10 times by itself; with 5 retries for the step, running it again
    # would make 11 more requests per run (the ~66 requests of the issue).
    agent = install_agent(tmp_path, "claude", [{"stdout": RETRY_429 + "\n", "exit": 1}])
    err = io.StringIO()
    outcome = run_step([str(agent.path), "-p", "x"], settings=_settings(max_retries=5),
                       env=agent.env, stderr=err)
    assert outcome.status is Status.FAILED_RETRY_EXHAUSTED
    assert agent.runs == 1
    failure = outcome.value
    assert isinstance(failure, StepFailure) and failure.agent_retries == 10
    assert "after 0 retries (1 attempt total, and 10 retries by claude itself)" in err.getvalue()


def test_a_few_agent_retries_leave_the_rest_of_the_budget(tmp_path: Path) -> None:
    line = RETRY_429.replace("attempt 10/10", "attempt 2/2")
    agent = install_agent(tmp_path, "claude", [{"stdout": line + "\n", "exit": 1}])
    outcome = run_step([str(agent.path), "-p", "x"], settings=_settings(max_retries=5),
                       env=agent.env, stderr=io.StringIO())
    # 6 requests in all: 2 runs of claude, each 1 request + 2 of its own retries.
    assert outcome.status is Status.FAILED_RETRY_EXHAUSTED and agent.runs == 2


def test_claude_runs_with_a_small_retry_setting_unless_one_is_set(tmp_path: Path) -> None:
    claude = tmp_path / "claude"
    claude.write_text(
        f"#!{sys.executable}\nimport os\nprint(os.environ.get('CLAUDE_CODE_MAX_RETRIES'))\n"
    )
    claude.chmod(0o755)
    env = {k: v for k, v in __import__("os").environ.items() if k != "CLAUDE_CODE_MAX_RETRIES"}
    ours = run_step([str(claude), "-p", "x"], settings=_settings(), env=env)
    assert ours.value == "2\n"
    theirs = run_step([str(claude), "-p", "x"], settings=_settings(),
                      env={**env, "CLAUDE_CODE_MAX_RETRIES": "7"})
    assert theirs.value == "7\n"
    gemini = tmp_path / "gemini"
    gemini.write_text(claude.read_text())
    gemini.chmod(0o755)
    assert run_step([str(gemini)], settings=_settings(), env=env).value == "None\n"


def test_when_the_agent_says_it_continues_by_itself_rateloop_does_not(tmp_path: Path) -> None:
    reset = int((NOW + timedelta(hours=1)).timestamp())
    said = f"Claude AI usage limit reached|{reset}\n{AUTO_CONTINUE}\n"
    agent = install_agent(tmp_path, "claude", [{"stdout": said, "exit": 1}, {"stdout": "done\n"}])
    err = io.StringIO()
    clock = FakeClock(NOW)
    outcome = run_step([str(agent.path), "-p", "x"], settings=_settings(), env=agent.env,
                       stderr=err, clock=clock, wait_for_reset=6 * 3600)
    assert agent.runs == 1 and clock.now() == NOW  # no wait, no second run
    assert outcome.status is Status.WAITING_FOR_RESET
    failure = outcome.value
    assert isinstance(failure, StepFailure) and failure.resumed_by == "agent"
    assert "said it will continue by itself when the limit resets" in err.getvalue()


def test_the_auto_continue_setting_is_read_and_the_banner_says_who_resumes(
    tmp_path: Path,
) -> None:
    config = tmp_path / "claude-config"
    config.mkdir()
    (config / "settings.json").write_text(json.dumps({"autoContinueAtUsageLimit": True}))
    project = tmp_path / "project"
    project.mkdir()
    assert claude_auto_continue({"CLAUDE_CONFIG_DIR": str(config)}, project)
    assert not claude_auto_continue({"CLAUDE_CONFIG_DIR": str(tmp_path / "none")}, project)
    (project / ".claude").mkdir()
    (project / ".claude" / "settings.local.json").write_text('{"autoContinueAtUsageLimit": false}')
    assert not claude_auto_continue({"CLAUDE_CONFIG_DIR": str(config)}, project)

    reset = int((NOW + timedelta(hours=1)).timestamp())
    agent = install_agent(tmp_path, "claude", [
        {"stdout": f"Claude AI usage limit reached|{reset}\n", "exit": 1}, {"stdout": "done\n"},
    ])
    err = io.StringIO()
    outcome = run_step([str(agent.path), "-p", "x"], settings=_settings(),
                       env={**agent.env, "CLAUDE_CONFIG_DIR": str(config)}, cwd=tmp_path,
                       stderr=err, clock=FakeClock(NOW), wait_for_reset=6 * 3600)
    assert outcome.status is Status.COMPLETED and agent.runs == 2
    assert "own auto-continue is on, but it exited, so it cannot resume;" in err.getvalue()


def test_the_give_up_message_names_an_overload() -> None:
    message = exhausted_message("claude", 1, kind=Kind.OVERLOAD)
    assert message.startswith("Error: claude stayed overloaded after 1 retry (2 attempts total).")
    assert "kept throttling" not in message
    assert "after 0 retries (1 attempt total)" in exhausted_message("claude", 0)


def test_an_overload_that_persists_is_reported_as_one(tmp_path: Path) -> None:
    # Claude Code's give-up line after its own 529 retries (quoted for v2.1.295 at
    # https://www.developersdigest.tech/blog/claude-code-retry-watchdog-unattended-runs).
    overloaded = "API Error: Repeated 529 Overloaded errors"
    agent = install_agent(tmp_path, "claude", [{"stdout": overloaded + "\n", "exit": 1}])
    err = io.StringIO()
    outcome = run_step([str(agent.path), "-p", "x"], settings=_settings(max_retries=1),
                       env=agent.env, stderr=err)
    assert outcome.status is Status.FAILED_RETRY_EXHAUSTED and agent.runs == 2
    assert "Error: claude stayed overloaded after 1 retry (2 attempts total)." in err.getvalue()


def test_run_json_says_which_allowance_ran_out_and_when_it_returns(tmp_path: Path) -> None:
    agent = install_agent(tmp_path, "claude", [{"stdout": SESSION_LIMIT, "exit": 0}], flat=True)
    done = rateloop_run(["--json", "--", str(agent.path), "-p", "x"], cli_env(agent.env))
    assert done.returncode == 75 and done.stdout == ""
    summary = json.loads(done.stderr.splitlines()[-1])
    assert summary["status"] == "waiting_for_reset" and summary["exit_code"] == 75
    assert summary["kind"] == "period_quota"
    assert summary["allowance"] == "session_limit"
    reset = datetime.fromisoformat(summary["reset_at"])
    assert reset.astimezone(ZoneInfo("Europe/Berlin")).hour == 9  # "resets 9am (Europe/Berlin)"
    assert summary["resumed_by"] is None and summary["agent_retries"] == 0


def test_run_json_never_invents_a_reset(tmp_path: Path) -> None:
    agent = install_agent(tmp_path, "copilot", [{"stderr": "429 Too Many Requests\n", "exit": 1}],
                          flat=True)
    done = rateloop_run(["--json", "--max-retries", "0", "--", str(agent.path)],
                        cli_env(agent.env))
    assert done.returncode == 75
    summary = json.loads(done.stderr.splitlines()[-1])
    assert summary["status"] == "failed_retry_exhausted" and summary["kind"] == "temporary"
    assert summary["allowance"] is None and summary["reset_at"] is None
    assert summary["attempts"] == 1


@given(st.text(max_size=400) | st.lists(st.dictionaries(
    st.sampled_from(["type", "subtype", "is_error", "result", "error", "message",
                     "rate_limit_info", "api_error_status", "attempt", "response"]),
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
    | st.dictionaries(st.sampled_from(["status", "rateLimitType", "resetsAt", "message"]),
                      st.none() | st.integers() | st.floats() | st.text(max_size=10)),
    max_size=5), max_size=4).map(lambda events: "\n".join(json.dumps(e) for e in events)))
def test_any_output_is_read_without_raising(stdout: str) -> None:
    result = read_agent_result(stdout, stdout)
    if result is not None:
        signal = classify_agent_result(result, now=NOW)
        assert signal.reset_at is None or signal.reset_at.tzinfo is not None


def test_codex_exit_0_with_turn_failed_is_the_limit_not_an_unusable_result(
    tmp_path: Path,
) -> None:
    # codex exec can print error and turn.failed events and still exit 0
    # (https://github.com/wzj998/ChatCCC/pull/363); it then writes no final message.
    events = [{"type": "thread.started", "thread_id": "<redacted>"}, {"type": "turn.started"},
              {"type": "error", "message": CODEX_LIMIT},
              {"type": "turn.failed", "error": {"message": CODEX_LIMIT}}]
    stdout = "".join(json.dumps(e) + "\n" for e in events)
    agent = install_agent(tmp_path, "codex", [{"stdout": stdout, "stderr": CODEX_STDIN,
                                                "exit": 0}])
    outcome = run_step([str(agent.path), "exec", "--json", "x"], settings=_settings(),
                       env=agent.env, stderr=io.StringIO(), clock=FakeClock(NOW))
    assert outcome.status is Status.WAITING_FOR_RESET and exit_code_for(outcome) == 75
    reset = outcome.retry_at
    assert reset is not None  # "try again at 3:28 PM", in this machine's zone
    assert (reset.astimezone().hour, reset.astimezone().minute) == (15, 28)
