"""The example programs run as users run them: a subprocess, real SDKs, servers on 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_example(name: str) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-W", "error", str(ROOT / "examples" / name)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:] + result.stdout[-2000:]
    return result.stdout


def test_first_hour_fifty_concurrent_openai_calls() -> None:
    pytest.importorskip("openai")
    out = run_example("first_hour.py")
    assert "rateloop:  {'completed': 50}" in out
    plain = out.splitlines()[0]
    # How many the plain SDK loses depends on how fast a loaded machine sends the 50 requests
    # (real HTTP, real time): the line must be there, the losses are the example's to show.
    assert plain.startswith("plain SDK: {") and "the provider refused" in plain


def test_anthropic_overload_falls_back() -> None:
    pytest.importorskip("anthropic")
    out = run_example("anthropic_fallback.py")
    assert "outcomes: {'degraded': 20}" in out
    assert "was overloaded — completed with claude-haiku-4-5" in out
    lines = [line for line in out.splitlines() if line.startswith("rateloop: ")]
    assert 1 <= len(lines) <= 5, lines  # 20 fallbacks, a few lines
