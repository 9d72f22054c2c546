"""Nothing an agent started outlives its step (real agents, real grandchildren).

An agent that exits while something it started still runs (a dev server, a
watcher, ``sleep 60 &``) must not leave it behind: when the step ends, its
process group gets SIGTERM, then SIGKILL after the grace.  Every wait here
is a bounded poll; every test kills what it started if an assertion fails.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_scripts.harness import cli_env, install_agent, is_gone
from rateloop.agents import AgentSettings, exit_code_for, run_step

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc for process state")

# A grandchild that notes SIGTERM, then exits: it says it is ready once its handler is set.
POLITE = """
import os, signal, sys, time
marker, ready = sys.argv[1], sys.argv[2]
def _term(signum, frame):
    with open(marker, "w") as f:
        f.write("TERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, _term)
with open(ready + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(ready + ".tmp", ready)
time.sleep(60)
"""


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def _pid(path: Path, *, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} was never written")
        time.sleep(0.01)
    return int(path.read_text().split()[0])


def _gone(pid: int, *, timeout: float = 5.0) -> bool:
    # An orphan is reaped by init asynchronously: give it a moment, bounded.
    deadline = time.monotonic() + timeout
    while not is_gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    """Pids a test may leave running if it fails: killed at the end, whatever happened."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def test_the_cli_ends_a_grandchild_left_by_an_agent_that_exited_0(
    tmp_path: Path, leftovers: list[int]
) -> None:
    marker, ready = tmp_path / "term", tmp_path / "ready"
    agent = _executable(
        tmp_path / "claude",
        f"#!{sys.executable}\n"
        "import os, subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {POLITE!r}, {str(marker)!r}, {str(ready)!r}])\n"
        f"while not os.path.exists({str(ready)!r}):\n"
        "    time.sleep(0.01)\n"
        "print('done')\n",
    )
    done = subprocess.run(
        [sys.executable, "-m", "rateloop", "run", "--", str(agent)],
        env=cli_env(dict(os.environ)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    leftovers.append(_pid(ready))
    assert (done.returncode, done.stdout) == (0, "done\n"), done.stderr
    assert _gone(leftovers[0])
    assert marker.read_text() == "TERM"  # asked to stop first, not killed outright


def test_run_step_ends_a_background_sleep(tmp_path: Path, leftovers: list[int]) -> None:
    pidfile = tmp_path / "pid"
    agent = _executable(
        tmp_path / "gemini", f'#!/bin/sh\nsleep 60 &\necho $! > "{pidfile}"\necho ok\n'
    )
    outcome = run_step([str(agent)], stderr=io.StringIO())
    leftovers.append(_pid(pidfile))
    assert outcome.ok and outcome.value == "ok\n"
    assert _gone(leftovers[0])


@pytest.mark.parametrize("exit_code", [0, 2])
def test_a_grandchild_that_ignores_sigterm_is_killed_after_the_grace(
    tmp_path: Path, leftovers: list[int], exit_code: int
) -> None:
    # The grandchild also holds the stderr pipe open: the step must not wait for it.
    agent = install_agent(
        tmp_path, "claude", [{"grandchild": True, "stdout": "ok\n", "exit": exit_code}]
    )
    started = time.monotonic()
    outcome = run_step(
        [str(agent.path)],
        env=agent.env,
        kill_grace=0.3,
        settings=AgentSettings(base_delay_secs=0),
        stderr=io.StringIO(),
    )
    took = time.monotonic() - started
    leftovers.append(_pid(agent.state / "pids"))
    assert exit_code_for(outcome) == exit_code
    assert _gone(leftovers[0])
    assert took < 30  # bounded: the grace (0.3 s), not the grandchild's 60 s


def test_a_detached_grandchild_holding_stderr_does_not_hang_the_step(
    tmp_path: Path, leftovers: list[int]
) -> None:
    # A grandchild in a session of its own is out of the agent's group and out of reach;
    # it keeps our stderr pipe open, and the step still ends (after a bounded drain).
    pidfile = tmp_path / "pid"
    agent = _executable(
        tmp_path / "copilot",
        f"#!{sys.executable}\n"
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " start_new_session=True)\n"
        f"open({str(pidfile)!r}, 'w').write(str(child.pid))\n"
        "print('ok')\n",
    )
    started = time.monotonic()
    outcome = run_step([str(agent)], stderr=io.StringIO())
    took = time.monotonic() - started
    leftovers.append(_pid(pidfile))
    assert outcome.ok and outcome.value == "ok\n"
    assert took < 30  # the drain gives up after 2 s; the grandchild would hold it for 60
