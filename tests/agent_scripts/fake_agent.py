"""A fake CLI agent for rateloop's ``run`` tests: a real process that follows a script.

Installed by the tests as an executable named ``claude``, ``copilot``, ``codex``
or ``amplihack`` in a temporary directory (the name drives agent inference).

Environment:

- ``FAKE_AGENT_COUNTER``: a file holding how many times the agent has run;
  each run increments it and then plays behaviour number ``count`` (from 1).
- ``FAKE_AGENT_SCRIPT``: a JSON list of behaviours, one per run; the last
  one repeats.  A behaviour is an object with any of:
  ``stdout``, ``stderr`` (text to print), ``exit`` (code, default 0),
  ``sleep`` (seconds, after printing), ``grandchild`` (spawn a grandchild
  that ignores SIGTERM and sleeps; its pid is written to ``FAKE_AGENT_PIDS``),
  ``ignore_term`` (this process ignores SIGTERM too), ``trap_term`` (this
  process survives SIGTERM but appends ``TERM`` to ``FAKE_AGENT_SIGNALS``),
  ``record_pid`` (write this process's own pid to ``FAKE_AGENT_PIDS`` first), ``message`` (codex:
  text for the ``--output-last-message`` file) or ``message_bytes`` (codex:
  that many bytes of ``x``), ``message_raw_hex`` (codex: raw bytes, hex),
  ``echo_stdin`` (copy stdin to stdout), ``stdout_hex`` / ``stderr_hex`` (raw bytes, hex,
  written after ``stdout`` / ``stderr``), ``wait_for_file`` (after printing,
  wait up to 10 s for that file to exist; exit 3 if it never does).
- ``FAKE_AGENT_CALLS``: a file; each run appends its argv as one JSON line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time


def _bump(path: str) -> int:
    try:
        with open(path, encoding="utf-8") as f:
            count = int(f.read().strip() or "0")
    except FileNotFoundError:
        count = 0
    count += 1
    with open(path, "w", encoding="utf-8") as f:
        f.write(str(count))
    return count


def _option(argv: list[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _log_term(signum: int, frame: object) -> None:
    with open(os.environ["FAKE_AGENT_SIGNALS"], "a", encoding="utf-8") as f:
        f.write("TERM\n")


def main() -> int:
    count = _bump(os.environ["FAKE_AGENT_COUNTER"])
    with open(os.environ["FAKE_AGENT_SCRIPT"], encoding="utf-8") as f:
        script = json.load(f)
    step = script[min(count, len(script)) - 1]
    calls = os.environ.get("FAKE_AGENT_CALLS")
    if calls:
        with open(calls, "a", encoding="utf-8") as f:
            f.write(json.dumps(sys.argv[1:]) + "\n")

    if step.get("record_pid"):
        with open(os.environ["FAKE_AGENT_PIDS"], "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")
    if step.get("ignore_term"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if step.get("trap_term"):
        signal.signal(signal.SIGTERM, _log_term)
    if step.get("grandchild"):
        code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
        child = subprocess.Popen([sys.executable, "-c", code])
        with open(os.environ["FAKE_AGENT_PIDS"], "a", encoding="utf-8") as f:
            f.write(f"{child.pid}\n")

    target = _option(sys.argv[1:], "--output-last-message")
    if target is not None:
        if "message" in step:
            with open(target, "w", encoding="utf-8") as f:
                f.write(step["message"])
        elif "message_bytes" in step:
            with open(target, "wb") as f:
                f.write(b"x" * int(step["message_bytes"]))
        elif "message_raw_hex" in step:
            with open(target, "wb") as f:
                f.write(bytes.fromhex(step["message_raw_hex"]))

    if "stdout" in step:
        sys.stdout.write(step["stdout"])
        sys.stdout.flush()
    if "stderr" in step:
        sys.stderr.write(step["stderr"])
        sys.stderr.flush()
    if "stdout_hex" in step:
        sys.stdout.buffer.write(bytes.fromhex(step["stdout_hex"]))
        sys.stdout.buffer.flush()
    if "stderr_hex" in step:
        sys.stderr.buffer.write(bytes.fromhex(step["stderr_hex"]))
        sys.stderr.buffer.flush()
    if step.get("echo_stdin"):
        sys.stdout.write(sys.stdin.read())
        sys.stdout.flush()
    if "wait_for_file" in step:
        deadline = time.monotonic() + 10
        while not os.path.exists(step["wait_for_file"]):
            if time.monotonic() > deadline:
                return 3
            time.sleep(0.01)
    if "sleep" in step:
        time.sleep(float(step["sleep"]))
    return int(step.get("exit", 0))


if __name__ == "__main__":
    sys.exit(main())
