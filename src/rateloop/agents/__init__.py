"""The CLI-agent step runner: ``run_step`` and the ``rateloop run`` command.

Runs one agent step (Claude Code, Copilot CLI, Codex, Gemini CLI, or any
command) as a child process and retries it only when its output says the
provider rate limited it, with announced, bounded, exponential waits.  See
``docs/agents.md`` for the contract.
"""

from __future__ import annotations

from rateloop.agents.command import Agent, infer_agent, step_label
from rateloop.agents.excerpt import OutputExcerpt
from rateloop.agents.runner import exit_code_for, run_step
from rateloop.agents.settings import AgentSettings, SettingsLayer, resolve_settings
from rateloop.agents.signals import StepInterrupted, stop_on_signals
from rateloop.agents.step import StepFailure, StepOutput

__all__ = [
    "Agent",
    "AgentSettings",
    "OutputExcerpt",
    "SettingsLayer",
    "StepFailure",
    "StepInterrupted",
    "StepOutput",
    "exit_code_for",
    "infer_agent",
    "resolve_settings",
    "run_step",
    "step_label",
    "stop_on_signals",
]
