"""The agent's output passes through ``rateloop run`` byte for byte (real child processes).

An agent may print anything: a binary diff, Latin-1 from an old tool, a
progress bar cut mid-character.  Whatever it writes on stdout (the result)
and stderr (forwarded live) must come out exactly, never re-encoded.
"""

from __future__ import annotations

import copy
import io
import json
import pickle
import subprocess
import sys
from pathlib import Path

from agent_scripts.harness import cli_env, install_agent
from rateloop.agents import AgentSettings, StepOutput, run_step
from rateloop.outcome import Status

# Every byte value once: half of them (0x80-0xff alone) are not UTF-8.
ALL_BYTES = bytes(range(256))
RATE_LIMITED = {"stderr": "429 Too Many Requests: you hit your rate limit\n", "exit": 1}


def _binary_agent(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    agent = install_agent(
        tmp_path,
        "claude",
        [{"stdout_hex": ALL_BYTES.hex(), "stderr_hex": ALL_BYTES.hex()}],
        flat=True,
    )
    return agent.path, agent.env


def test_the_cli_passes_every_byte_through_on_stdout_and_stderr(tmp_path: Path) -> None:
    path, env = _binary_agent(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "rateloop", "run", "--", str(path)],
        env=cli_env(env),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ALL_BYTES  # was 512 bytes: every non-UTF-8 byte became U+FFFD
    assert done.stderr == ALL_BYTES


def test_run_step_returns_the_exact_bytes_and_forwards_them(tmp_path: Path) -> None:
    path, env = _binary_agent(tmp_path)
    sink = io.BytesIO()
    stderr = io.TextIOWrapper(sink, encoding="utf-8", write_through=True)
    outcome = run_step([str(path)], env=env, stderr=stderr)
    assert outcome.status is Status.COMPLETED
    assert isinstance(outcome.value, StepOutput)
    assert outcome.value.data == ALL_BYTES
    # The text stays what it always was: the output decoded, bad bytes replaced.
    assert outcome.value == ALL_BYTES.decode("utf-8", "replace")
    assert sink.getvalue() == ALL_BYTES


def test_a_text_only_stream_gets_the_stderr_decoded(tmp_path: Path) -> None:
    # io.StringIO cannot hold bytes: it gets the text, bad bytes replaced.
    path, env = _binary_agent(tmp_path)
    stderr = io.StringIO()
    outcome = run_step([str(path)], env=env, stderr=stderr)
    assert outcome.ok
    assert stderr.getvalue() == ALL_BYTES.decode("utf-8", "replace")


def test_a_failed_attempts_stderr_is_forwarded_exactly_before_our_banner(tmp_path: Path) -> None:
    agent = install_agent(
        tmp_path,
        "claude",
        [{"stderr_hex": b"\xff\xfe partial \xe2\x82".hex(), **RATE_LIMITED}, {"stdout": "ok\n"}],
    )
    sink = io.BytesIO()
    stderr = io.TextIOWrapper(sink, encoding="utf-8", write_through=True)
    outcome = run_step(
        [str(agent.path)], env=agent.env, stderr=stderr, settings=AgentSettings(base_delay_secs=0)
    )
    assert outcome.ok and outcome.value == "ok\n"
    out = sink.getvalue()
    # The cut character stays cut (no U+FFFD), and our banner follows the child's bytes.
    child = RATE_LIMITED["stderr"].encode() + b"\xff\xfe partial \xe2\x82"
    assert out.startswith(child + b"=" * 80 + b"\n")
    assert b"Waiting 0s before retry 1/5" in out


def test_codex_result_bytes_are_the_final_message_file(tmp_path: Path) -> None:
    message = "résumé ✓\n"
    agent = install_agent(tmp_path, "codex", [{"message": message, "stdout": "progress\n"}])
    outcome = run_step([str(agent.path), "exec", "x"], env=agent.env, stderr=io.StringIO())
    assert isinstance(outcome.value, StepOutput)
    assert (outcome.value, outcome.value.data) == (message, message.encode())


def test_a_step_output_keeps_its_bytes_through_pickle_and_copy() -> None:
    value = StepOutput(b"caf\xe9\n")
    for again in (pickle.loads(pickle.dumps(value)), copy.copy(value), copy.deepcopy(value)):
        assert isinstance(again, StepOutput)
        assert (again, again.data) == ("caf\ufffd\n", b"caf\xe9\n")
    assert json.dumps(value) == '"caf\\ufffd\\n"'  # stored by a task queue as its text
