"""Agent inference, step labels and the per-attempt argv edits (pure functions)."""

from __future__ import annotations

import pytest

from rateloop.agents.command import (
    Agent,
    infer_agent,
    step_label,
    with_codex_output,
    with_model,
    without_option,
)


@pytest.mark.parametrize(
    ("command", "agent"),
    [
        (["claude", "-p", "hi"], Agent.CLAUDE),
        (["/usr/local/bin/copilot", "-p", "hi"], Agent.COPILOT),
        (["codex", "exec", "hi"], Agent.CODEX),
        (["gemini"], Agent.GEMINI),
        (["C:\\tools\\Claude.exe", "-p"], Agent.CLAUDE),
        (["amplihack", "copilot", "-p", "hi"], Agent.COPILOT),
        (["amplihack", "claude"], Agent.CLAUDE),
        (["npx", "/opt/codex"], Agent.CODEX),
        (["make", "test"], Agent.GENERIC),
        (["python"], Agent.GENERIC),
    ],
)
def test_infer_agent(command: list[str], agent: Agent) -> None:
    assert infer_agent(command) is agent


@pytest.mark.parametrize(
    ("command", "label"),
    [
        (["/usr/bin/claude", "-p", "x"], "claude"),
        (["amplihack", "copilot", "--model", "m"], "amplihack copilot"),
        (["amplihack", "launch"], "amplihack"),
        (["./scripts/step.sh", "claude"], "step.sh claude"),
        (["make"], "make"),
    ],
)
def test_step_label(command: list[str], label: str) -> None:
    assert step_label(command) == label


def test_empty_command_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="command is empty"):
        infer_agent([])
    with pytest.raises(ValueError, match="command is empty"):
        step_label([])


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["-p", "hi"], ["-p", "hi", "--model", "auto"]),
        (["--model", "opus", "-p", "hi"], ["--model", "auto", "-p", "hi"]),
        (["-p", "hi", "--model=opus"], ["-p", "hi", "--model", "auto"]),
        (["--model", "a", "-p", "--model=b"], ["--model", "auto", "-p"]),
        (["-p", "--", "--model", "x"], ["-p", "--model", "auto", "--", "--model", "x"]),
        ([], ["--model", "auto"]),
    ],
)
def test_with_model_replaces_or_appends(args: list[str], expected: list[str]) -> None:
    assert with_model(args, "auto") == expected


def test_with_codex_output_replaces_the_users_path() -> None:
    args = ["exec", "--output-last-message", "/mine.txt", "--model", "o3", "do it"]
    assert with_codex_output(args, "/tmp/a") == [
        "exec",
        "--model",
        "o3",
        "do it",
        "--output-last-message",
        "/tmp/a",
    ]
    assert without_option(args, "--output-last-message")[1] == "/mine.txt"
    assert with_codex_output(["exec", "--", "-x"], "/p") == [
        "exec",
        "--output-last-message",
        "/p",
        "--",
        "-x",
    ]


def test_without_option_handles_a_dangling_flag() -> None:
    assert without_option(["a", "--model"], "--model") == (["a"], None)


def test_only_claude_and_copilot_accept_auto() -> None:
    assert {a for a in Agent if a.accepts_auto_model} == {Agent.CLAUDE, Agent.COPILOT}
