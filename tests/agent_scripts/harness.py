"""Install the fake agent (``fake_agent.py``) as a real executable, for ``run_step`` tests."""

from __future__ import annotations

import json
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).parent / "fake_agent.py"


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


def install_agent(root: Path, name: str, script: list[dict[str, Any]]) -> FakeAgent:
    """An executable fake agent named ``name`` under ``root``, playing ``script``."""
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
