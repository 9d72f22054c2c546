"""A signal to ``rateloop run`` ends the agent's whole process group, then exits 128 + N.

Real processes and real signals: a ``python -m rateloop run`` subprocess whose
fake agent spawns a grandchild that ignores SIGTERM.  Every wait is on a real
process and bounded by a timeout.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agent_scripts.harness import cli_env, install_agent, is_gone
from rateloop.agents.process import run_attempt
from rateloop.agents.signals import StepInterrupted, hold_stop_signals, stop_on_signals

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc for process state")

# The agent: its own pid, a grandchild that ignores SIGTERM, then a minute of work.
WORKING = {"record_pid": True, "grandchild": True, "stderr": "working\n", "sleep": 60}


def _agent(tmp_path: Path, script: list[dict[str, Any]]) -> tuple[Path, dict[str, str]]:
    agent = install_agent(tmp_path, "claude", script, flat=True)
    return agent.path, cli_env(agent.env)


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _await_lines(path: Path, count: int, *, timeout: float = 30.0) -> list[str]:
    """Poll (bounded) until ``path`` holds ``count`` lines: the agent is up and working."""
    deadline = time.monotonic() + timeout
    while len(_lines(path)) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} never got {count} lines: {_lines(path)}")
        time.sleep(0.01)
    return _lines(path)


def _all_gone(pids: list[int], *, timeout: float = 5.0) -> bool:
    # The orphaned grandchild is reaped by init asynchronously; give it a moment.
    deadline = time.monotonic() + timeout
    while not all(is_gone(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _reap_leftovers(pids: list[int]) -> None:
    """After a failed assertion, do not leave the agents of this test running."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(
    ("sig", "code"),
    [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)],
)
def test_a_signal_ends_the_agents_process_group(
    tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    path, env = _agent(tmp_path, [WORKING])
    proc = subprocess.Popen(
        [sys.executable, "-m", "rateloop", "run", "--", str(path), "-p", "x"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pids: list[int] = []
    try:
        pids = [int(p) for p in _await_lines(tmp_path / "pids", 2)]
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        gone = _all_gone(pids)
        _reap_leftovers(pids)
    assert proc.returncode == code, err
    assert gone, f"the agent or its grandchild outlived rateloop run ({pids})"
    assert out == ""
    assert err.endswith(
        f"Error: claude stopped: rateloop run received {sig.name};"
        " the agent's process group was ended.\n"
    )


def test_a_signal_during_the_backoff_wait_exits_at_once(tmp_path: Path) -> None:
    # The agent is rate limited; rateloop run waits 60 s (no child running) and is stopped.
    path, env = _agent(
        tmp_path,
        [{"record_pid": True, "stderr": "429 Too Many Requests: you hit your rate limit\n",
          "exit": 1}],
    )
    env["RATELOOP_BASE_DELAY_SECS"] = "60"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rateloop", "run", "--", str(path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _await_lines(tmp_path / "pids", 1)
        # Wait until the banner is out: rateloop run is now in its backoff wait.
        assert proc.stderr is not None
        seen = ""
        while "Waiting 60s" not in seen:
            line = proc.stderr.readline()
            assert line, f"rateloop run ended before its wait: {seen!r}"
            seen += line
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143
    assert "received SIGTERM" in err
    # No agent ran during the wait: nothing was "ended", and the message must not say so.
    assert "process group was ended" not in err
    assert err.endswith(
        "Error: claude stopped: rateloop run received SIGTERM while waiting to run it again;"
        " no agent was running.\n"
    )
    assert _lines(tmp_path / "count") == ["1"]  # no second run


def test_a_second_signal_skips_the_kill_grace(tmp_path: Path) -> None:
    # The agent survives SIGTERM; with a 60 s grace only a second signal ends the wait early.
    path, env = _agent(tmp_path, [{**WORKING, "trap_term": True}])
    signals_file = tmp_path / "signals"
    me = os.getpid()

    def stop_twice() -> None:
        with contextlib.suppress(AssertionError):
            _await_lines(tmp_path / "pids", 2)
            os.kill(me, signal.SIGTERM)
            _await_lines(signals_file, 1)  # the agent got the group's SIGTERM and ignored it
            os.kill(me, signal.SIGTERM)

    sender = threading.Thread(target=stop_twice)
    started = time.monotonic()
    with tempfile.TemporaryFile() as out, stop_on_signals():
        sender.start()
        with pytest.raises(StepInterrupted) as stopped:
            run_attempt([str(path)], stdout=out, stderr=None, env=env, kill_grace=60.0)
    sender.join(timeout=30)
    pids = [int(p) for p in _lines(tmp_path / "pids")]
    gone = _all_gone(pids)
    _reap_leftovers(pids)
    assert stopped.value.exit_code == 143 and stopped.value.name == "SIGTERM"
    assert _lines(signals_file) == ["TERM"]
    assert time.monotonic() - started < 30  # not the 60 s grace
    assert gone


def test_stop_on_signals_restores_the_previous_handlers() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    with stop_on_signals():
        assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_step_interrupted_names_its_signal() -> None:
    assert repr(StepInterrupted(signal.SIGHUP)) == "StepInterrupted(SIGHUP)"
    assert StepInterrupted(signal.SIGINT).exit_code == 130
    assert not isinstance(StepInterrupted(signal.SIGTERM), Exception)


def test_a_signal_held_while_starting_is_raised_on_release() -> None:
    ran_on = False
    with (
        stop_on_signals(),
        pytest.raises(StepInterrupted) as stopped,
        hold_stop_signals() as release,
    ):
        signal.raise_signal(signal.SIGHUP)  # the handler runs now, and holds it
        ran_on = True
        release()
    assert ran_on
    assert stopped.value.exit_code == 129
    # Released: the next signal raises at once again.
    with stop_on_signals(), pytest.raises(StepInterrupted):
        signal.raise_signal(signal.SIGTERM)


def test_a_signal_while_the_child_starts_still_ends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The stop lands inside subprocess.Popen, right after the real child was created:
    # without the hold it would unwind through Popen and leave the agent running.
    path, env = _agent(tmp_path, [WORKING])
    real_popen = subprocess.Popen

    class _StoppedWhileStarting(real_popen):  # type: ignore[type-arg,misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            _await_lines(tmp_path / "pids", 2)  # the agent and its grandchild are up
            signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(subprocess, "Popen", _StoppedWhileStarting)
    with tempfile.TemporaryFile() as out, stop_on_signals(), pytest.raises(StepInterrupted):
        run_attempt([str(path)], stdout=out, stderr=None, env=env, kill_grace=5.0)
    monkeypatch.undo()
    pids = [int(p) for p in _lines(tmp_path / "pids")]
    gone = _all_gone(pids)
    _reap_leftovers(pids)
    assert gone
