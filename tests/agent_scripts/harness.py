"""Install the fake agent (``fake_agent.py``) as a real executable, for ``run_step`` tests."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rateloop

SCRIPT = Path(__file__).parent / "fake_agent.py"
# The rateloop under test (the worktree's src when PYTHONPATH names it), for child processes.
SRC = str(Path(rateloop.__file__).resolve().parent.parent)


@dataclass
class FakeAgent:
    """One installed fake agent: its executable, its state files and the env to run it with."""

    path: Path
    state: Path
    env: dict[str, str]

    @property
    def runs(self) -> int:
        counter = self.state / "count"
        return int(counter.read_text()) if counter.exists() else 0

    def calls(self) -> list[list[str]]:
        calls = self.state / "calls.jsonl"
        if not calls.exists():
            return []
        return [json.loads(line) for line in calls.read_text().splitlines()]


def install_agent(
    root: Path, name: str, script: list[dict[str, Any]], *, flat: bool = False
) -> FakeAgent:
    """An executable fake agent named ``name`` under ``root``, playing ``script``.

    ``flat``: the executable and its state files (``count``, ``pids``, ...)
    directly in ``root``, for tests that install one agent and read them there.
    """
    if flat:
        bindir = state = root
    else:
        bindir = root / "bin"
        bindir.mkdir(exist_ok=True)
        state = root / f"state-{name}"
        state.mkdir()
    path = bindir / name
    path.write_text(f"#!{sys.executable}\n" + SCRIPT.read_text())
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    (state / "script.json").write_text(json.dumps(script))
    env = dict(os.environ)
    env.update(
        FAKE_AGENT_COUNTER=str(state / "count"),
        FAKE_AGENT_SCRIPT=str(state / "script.json"),
        FAKE_AGENT_CALLS=str(state / "calls.jsonl"),
        FAKE_AGENT_PIDS=str(state / "pids"),
        FAKE_AGENT_SIGNALS=str(state / "signals"),
    )
    return FakeAgent(path=path, state=state, env=env)


def cli_env(agent_env: dict[str, str], **extra: str) -> dict[str, str]:
    """The env for ``python -m rateloop`` driving an agent: no RATELOOP_/AMPLIHACK_ settings
    inherited from the caller, this checkout's ``src`` importable, then ``extra``."""
    env = {k: v for k, v in agent_env.items() if not k.startswith(("RATELOOP_", "AMPLIHACK_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def rateloop_run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python -m rateloop run ARGS`` to completion (60 s at most), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "rateloop", "run", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def is_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (exited, or a zombie waiting for its reaper)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return fields[0] in ("Z", "X")
