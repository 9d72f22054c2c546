"""The agent behind a command line, the step's label, and the argv of each attempt.

Pure functions over argument lists; nothing here runs a process.

The agent is read from the command's name (``/usr/bin/claude`` is claude);
when the command is a wrapper (``amplihack copilot -p ...``) its first
argument names the agent instead.  The label used in messages is the
command's name, plus that first argument when it is an agent name.

Per attempt, the argv is the user's command with two possible edits: the
model (``--model M`` replaces an existing ``--model X`` / ``--model=X`` or is
appended) and, for codex, ``--output-last-message PATH`` pointing at a fresh
file.  Appended options go before a ``--`` separator when there is one, so
they are never taken for positional arguments.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import StrEnum

__all__ = [
    "AUTO_MODEL",
    "CODEX_OUTPUT_FLAG",
    "Agent",
    "infer_agent",
    "step_label",
    "with_codex_output",
    "with_model",
    "without_option",
]

#: The model name both Claude Code and Copilot CLI accept as "pick one that has capacity".
AUTO_MODEL = "auto"
CODEX_OUTPUT_FLAG = "--output-last-message"
_MODEL_FLAG = "--model"


class Agent(StrEnum):
    """The CLI agents ``rateloop run`` knows, and ``generic`` for anything else."""

    CLAUDE = "claude"
    COPILOT = "copilot"
    CODEX = "codex"
    GEMINI = "gemini"
    GENERIC = "generic"

    @property
    def accepts_auto_model(self) -> bool:
        """Whether ``--model auto`` is a valid fallback for this agent (claude, copilot)."""
        return self in (Agent.CLAUDE, Agent.COPILOT)


_AGENT_NAMES = frozenset(a.value for a in Agent if a is not Agent.GENERIC)


def _basename(arg: str) -> str:
    """The last path component, for POSIX and Windows separators alike."""
    return re.split(r"[\\/]", arg.rstrip("/\\"))[-1] or arg


def _program_name(arg: str) -> str:
    """``C:\\bin\\Claude.exe`` -> ``claude``: basename, lower-cased, Windows suffix dropped."""
    name = _basename(arg).lower()
    for suffix in (".exe", ".cmd", ".bat", ".ps1"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _agent_named(arg: str) -> Agent | None:
    name = _program_name(arg)
    return Agent(name) if name in _AGENT_NAMES else None


def infer_agent(command: Sequence[str]) -> Agent:
    """The agent a command runs: its name, else (for a wrapper) its first argument's."""
    if not command:
        raise ValueError("the step's command is empty: give the agent command to run")
    named = _agent_named(command[0])
    if named is not None:
        return named
    if len(command) > 1:
        wrapped = _agent_named(command[1])
        if wrapped is not None:
            return wrapped
    return Agent.GENERIC


def step_label(command: Sequence[str]) -> str:
    """``claude`` for ``/usr/bin/claude -p ...``; ``amplihack copilot`` for a wrapper."""
    if not command:
        raise ValueError("the step's command is empty: give the agent command to run")
    label = _basename(command[0])
    if _agent_named(command[0]) is None and len(command) > 1 and _agent_named(command[1]):
        label = f"{label} {command[1]}"
    return label


def _option_end(args: Sequence[str]) -> int:
    """Where appended options go: before a ``--`` separator, else at the end."""
    try:
        return list(args).index("--")
    except ValueError:
        return len(args)


def without_option(args: Sequence[str], flag: str) -> tuple[list[str], str | None]:
    """``args`` without any ``flag VALUE`` / ``flag=VALUE`` before ``--``; and the last VALUE.

    A trailing ``flag`` with no value is removed too (its value is None).
    """
    end = _option_end(args)
    kept: list[str] = []
    value: str | None = None
    i = 0
    while i < end:
        arg = args[i]
        if arg == flag:
            value = args[i + 1] if i + 1 < end else None
            i += 2
            continue
        if arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
            i += 1
            continue
        kept.append(arg)
        i += 1
    return kept + list(args[end:]), value


def with_model(args: Sequence[str], model: str) -> list[str]:
    """``args`` running on ``model``: an existing ``--model`` is replaced, else one is appended.

    The replacement keeps the position of the first ``--model`` so a wrapper
    that only forwards options after its subcommand still forwards it.
    """
    end = _option_end(args)
    for i in range(end):
        arg = args[i]
        if arg == _MODEL_FLAG or arg.startswith(_MODEL_FLAG + "="):
            rest, _ = without_option(list(args[i:]), _MODEL_FLAG)
            return [*args[:i], _MODEL_FLAG, model, *rest]
    return [*args[:end], _MODEL_FLAG, model, *args[end:]]


def with_codex_output(args: Sequence[str], path: str) -> list[str]:
    """``args`` writing codex's final message to ``path`` (replacing any user-given path)."""
    kept, _ = without_option(args, CODEX_OUTPUT_FLAG)
    end = _option_end(kept)
    return [*kept[:end], CODEX_OUTPUT_FLAG, path, *kept[end:]]
