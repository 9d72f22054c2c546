"""``rateloop run`` end to end: ``python -m rateloop run -- <fake agent>`` in a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent_scripts.harness import cli_env, install_agent, rateloop_run

RATE_LIMITED = {"stderr": "429 Too Many Requests: you hit your rate limit\n", "exit": 1}


def _agent(tmp_path: Path, name: str, script: list[dict[str, Any]]) -> tuple[Path, dict[str, str]]:
    agent = install_agent(tmp_path, name, script, flat=True)
    return agent.path, cli_env(agent.env, RATELOOP_BASE_DELAY_SECS="0")


def _runs(tmp_path: Path) -> int:
    return int((tmp_path / "count").read_text())


def test_success_prints_only_the_winning_output(tmp_path: Path) -> None:
    path, env = _agent(
        tmp_path,
        "claude",
        [{"stdout": "junk from a failed try\n", **RATE_LIMITED}, {"stdout": "42\n"}],
    )
    done = rateloop_run(["--", str(path), "-p", "answer"], env)
    assert (done.returncode, done.stdout) == (0, "42\n")
    assert _runs(tmp_path) == 2
    assert "Waiting 0s before retry 1/5 (attempt 2 of 6) ..." in done.stderr


def test_exhausted_exits_75_with_the_exact_message(tmp_path: Path) -> None:
    path, env = _agent(tmp_path, "copilot", [RATE_LIMITED])
    env["RATELOOP_MAX_RETRIES"] = "3"
    done = rateloop_run(["--", str(path), "-p", "x"], env)
    assert done.returncode == 75
    assert done.stdout == ""
    assert _runs(tmp_path) == 4
    assert done.stderr.endswith(
        "Error: copilot rate limit persisted after 3 retries (4 attempts total).\n"
        "The provider kept throttling this step. Increase RATELOOP_MAX_RETRIES\n"
        "or RATELOOP_BASE_DELAY_SECS, or retry later.\n"
    )


def test_other_failures_exit_with_the_childs_code(tmp_path: Path) -> None:
    path, env = _agent(tmp_path, "claude", [{"stderr": "Invalid API key\n", "exit": 2}])
    done = rateloop_run(["--label", "review step", "--", str(path)], env)
    assert done.returncode == 2
    assert _runs(tmp_path) == 1
    assert done.stderr.endswith("Error: review step failed (exit 2)\n")


def test_flags_beat_env_and_aliases_are_read(tmp_path: Path) -> None:
    path, env = _agent(tmp_path, "claude", [RATE_LIMITED])
    env["RATELOOP_MAX_RETRIES"] = "4"
    done = rateloop_run(["--max-retries", "1", "--", str(path)], env)
    assert (done.returncode, _runs(tmp_path)) == (75, 2)

    (tmp_path / "count").unlink()
    del env["RATELOOP_MAX_RETRIES"]
    env["AMPLIHACK_RATELIMIT_MAX_RETRIES"] = "2"
    env["AMPLIHACK_RATELIMIT_FALLBACK_AUTO_MODEL"] = "1"
    done = rateloop_run(["--model", "opus", "--", str(path), "-p", "x"], env)
    assert (done.returncode, _runs(tmp_path)) == (75, 3)
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert calls[-3:] == [
        ["-p", "x", "--model", "opus"],
        ["-p", "x", "--model", "opus"],
        ["-p", "x", "--model", "auto"],
    ]


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="POSIX process groups")
def test_timeout_exits_124(tmp_path: Path) -> None:
    path, env = _agent(tmp_path, "gemini", [{"sleep": 30}])
    done = rateloop_run(["--timeout", "1", "--", str(path)], env)
    assert done.returncode == 124
    assert _runs(tmp_path) == 1
    assert "Error: gemini timed out after 1s on attempt 1 of 6" in done.stderr


def test_bad_flags_are_usage_errors(tmp_path: Path) -> None:
    path, env = _agent(tmp_path, "claude", [{"stdout": "never"}])
    done = rateloop_run(["--timeout", "-3", "--", str(path)], env)
    assert done.returncode == 2
    assert "--timeout" in done.stderr and "-3" in done.stderr
    assert not (tmp_path / "count").exists()
    done = rateloop_run(["--agent", "gpt", "--", str(path)], env)
    assert done.returncode == 2
    assert "gpt" in done.stderr


def test_policy_file_sits_below_env_and_flags(tmp_path: Path) -> None:
    path, env = _agent(tmp_path, "claude", [RATE_LIMITED])
    policy = tmp_path / "rateloop.toml"
    policy.write_text("[agents]\nmax_retries = 2\nbase_delay_secs = 1\n")
    # RATELOOP_BASE_DELAY_SECS=0 (env) beats the file's 1 s; max_retries comes from the file.
    done = rateloop_run(["--policy", str(policy), "--", str(path)], env)
    assert (done.returncode, _runs(tmp_path)) == (75, 3)
    assert "Waiting 0s before retry 2/2 (attempt 3 of 3)" in done.stderr

    policy.write_text("[agents]\nmax_retries = -1\n")
    done = rateloop_run(["--policy", str(policy), "--", str(path)], env)
    assert done.returncode == 2
    assert "agents.max_retries" in done.stderr
    assert _runs(tmp_path) == 3  # nothing ran


def test_stdin_is_read_once_and_fed_to_every_attempt(tmp_path: Path) -> None:
    path, env = _agent(
        tmp_path, "claude", [{**RATE_LIMITED, "echo_stdin": True}, {"echo_stdin": True}]
    )
    done = subprocess.run(
        [sys.executable, "-m", "rateloop", "run", "--stdin", "--", str(path)],
        env=env,
        input="the prompt",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, "the prompt")
    assert _runs(tmp_path) == 2


@pytest.mark.parametrize(
    ("env_extra", "runs"),
    [
        ({"RATELOOP_MAX_RETRIES": "abc"}, 6),  # unparseable: the default 5 retries
        ({"AMPLIHACK_RATELIMIT_MAX_RETRIES": "2"}, 3),  # amplihack's name is an alias
        ({"RATELOOP_MAX_RETRIES": "1", "AMPLIHACK_RATELIMIT_MAX_RETRIES": "3"}, 2),  # ours wins
        ({"RATELOOP_MAX_RETRIES": "-1"}, 6),  # not a u32: the default 5 retries
        ({"RATELOOP_MAX_RETRIES": "+2"}, 3),  # Rust's u32 parse takes a leading '+'
        ({"RATELOOP_MAX_RETRIES": "0"}, 1),
    ],
)
def test_environment_knobs_end_to_end(
    tmp_path: Path, env_extra: dict[str, str], runs: int
) -> None:
    path, env = _agent(tmp_path, "copilot", [RATE_LIMITED])
    env.update(env_extra)
    done = rateloop_run(["--", str(path)], env)
    assert done.returncode == 75
    assert _runs(tmp_path) == runs
    # "1 attempt", never "1 attempts".
    assert f"({runs} attempt{'s' if runs != 1 else ''} total)" in done.stderr



def test_a_failure_shows_the_agents_own_last_lines(tmp_path: Path) -> None:
    key = "sk-ant-api03-" + "k" * 40
    path, env = _agent(
        tmp_path, "claude", [{"stdout": f"Invalid API key · Please run /login\n{key}\n", "exit": 1}]
    )
    done = rateloop_run(["--", str(path), "-p", "x"], env)
    assert done.returncode == 1
    assert done.stderr == (
        "--- last 2 lines of claude's stdout ---\n"
        "Invalid API key · Please run /login\n"
        "[redacted]\n"
        "Error: claude failed (exit 1)\n"
    )
