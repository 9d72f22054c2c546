"""What each agent does on its own at a limit: its retry setting, and its auto-continue.

How it works: agents retry by themselves before they exit (Claude Code 10
times by default, Gemini CLI and Codex too), and ``rateloop run`` retries
the step on top, so the requests multiply.  :func:`agent_env` sets the
agent's documented retry setting when the caller left it unset, so one
throttled attempt costs a few requests, not a dozen; the retries an agent
still makes are counted against the step's budget by
:class:`~rateloop.agents.step.StepLoop`.

Claude Code (2.1.234+) can also continue by itself when a usage limit
resets ("Continue automatically at usage limit" in ``/config``, the
``autoContinueAtUsageLimit`` setting).  :func:`claude_auto_continue` reads
that setting from the files Claude Code reads it from, so that a step is
never resumed by both sides.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from rateloop.agents.command import Agent

__all__ = ["AGENT_RETRY_SETTINGS", "CLAUDE_MAX_RETRIES", "agent_env", "claude_auto_continue"]

#: The retries Claude Code may make by itself per attempt when the caller did not choose:
#: a short blip is still absorbed inside the attempt, a lasting throttle reaches rateloop run.
CLAUDE_MAX_RETRIES = 2

#: Each agent's own retry setting that ``rateloop run`` sets when it is unset, and its value.
AGENT_RETRY_SETTINGS: dict[Agent, tuple[str, str]] = {
    Agent.CLAUDE: ("CLAUDE_CODE_MAX_RETRIES", str(CLAUDE_MAX_RETRIES)),
}

_CLAUDE_SETTING = "autoContinueAtUsageLimit"


def agent_env(agent: Agent, env: Mapping[str, str] | None) -> dict[str, str] | None:
    """The environment to run ``agent`` in: ``env`` (default: ours) with its retry setting.

    A value the caller set (in ``env`` or, without one, in ``os.environ``) is
    kept.  None when nothing changes (the child inherits ``os.environ``).
    """
    setting = AGENT_RETRY_SETTINGS.get(agent)
    if setting is None:
        return dict(env) if env is not None else None
    name, value = setting
    base = dict(env) if env is not None else dict(os.environ)
    base.setdefault(name, value)
    return base


def _setting(path: Path) -> bool | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    value = data.get(_CLAUDE_SETTING) if isinstance(data, dict) else None
    return value if isinstance(value, bool) else None


def claude_auto_continue(
    env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None
) -> bool:
    """Whether Claude Code's ``autoContinueAtUsageLimit`` is set to true for a step in ``cwd``.

    The user's settings (``$CLAUDE_CONFIG_DIR``, else ``~/.claude``), then
    the project's ``.claude/settings.json`` and ``.claude/settings.local.json``;
    the last file that sets it wins.  Only an explicit ``true`` counts: a
    missing or unreadable file says nothing.
    """
    environ = env if env is not None else os.environ
    home = environ.get("CLAUDE_CONFIG_DIR") or str(Path(environ.get("HOME", "~")) / ".claude")
    project = Path(cwd) if cwd is not None else Path.cwd()
    found: bool | None = None
    for path in (
        Path(home).expanduser() / "settings.json",
        project / ".claude" / "settings.json",
        project / ".claude" / "settings.local.json",
    ):
        value = _setting(path)
        if value is not None:
            found = value
    return bool(found)
