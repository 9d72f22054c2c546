"""A signal to ``rateloop run`` ends the agent's whole process group, then exits 128 + N.

Real processes and real signals: a ``python -m rateloop run`` subprocess whose
fake agent spawns a grandchild that ignores SIGTERM.  Every wait is on a real
process and bounded by a timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import rateloop
from rateloop.agents.process import run_attempt
from rateloop.agents.signals import StepInterrupted, stop_on_signals

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc for process state")

SCRIPT = Path(__file__).parent / "agent_scripts" / "fake_agent.py"
SRC = str(Path(rateloop.__file__).resolve().parent.parent)
# The agent: its own pid, a grandchild that ignores SIGTERM, then a minute of work.
WORKING = {"record_pid": True, "grandchild": True, "stderr": "working\n", "sleep": 60}


def _agent(tmp_path: Path, script: list[dict[str, Any]]) -> tuple[Path, dict[str, str]]:
    path = tmp_path / "claude"
    path.write_text(f"#!{sys.executable}\n" + SCRIPT.read_text())
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "script.json").write_text(json.dumps(script))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RATELOOP_", "AMPLIHACK_"))}
    env.update(
        FAKE_AGENT_COUNTER=str(tmp_path / "count"),
        FAKE_AGENT_SCRIPT=str(tmp_path / "script.json"),
        FAKE_AGENT_PIDS=str(tmp_path / "pids"),
        FAKE_AGENT_SIGNALS=str(tmp_path / "signals"),
        PYTHONPATH=os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p),
    )
    return path, env


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


def _is_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (exited, or a zombie waiting for its reaper)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return fields[0] in ("Z", "X")


def _all_gone(pids: list[int], *, timeout: float = 5.0) -> bool:
    # The orphaned grandchild is reaped by init asynchronously; give it a moment.
    deadline = time.monotonic() + timeout
    while not all(_is_gone(pid) for pid in pids):
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
