"""``rateloop status`` / ``dashboard`` on bad input: one ``rateloop: ...`` line, exit 2.

Through the real CLI in a subprocess; the busy port is held by a real socket.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")


def rateloop(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rateloop", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": SRC, "COLUMNS": "200"},
        timeout=30,
        check=False,
    )


def assert_one_line_error(out: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("rateloop: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.fixture
def busy_port() -> Iterator[int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    try:
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


@pytest.mark.redis
def test_dashboard_on_a_port_in_use_names_it_and_exits_2(busy_port: int, redis_url: str) -> None:
    out = rateloop("dashboard", "--redis", redis_url, "--port", str(busy_port))
    assert_one_line_error(out, f"127.0.0.1:{busy_port}", "in use", "--port 0")


@pytest.mark.parametrize("command", ["status", "dashboard"])
@pytest.mark.parametrize("url", ["http://127.0.0.1:6379/0", "postgresql://:pw-secret@h/db"])
def test_a_redis_url_with_a_wrong_scheme_names_it_and_what_is_allowed(
    command: str, url: str
) -> None:
    extra = ["--port", "0"] if command == "dashboard" else []
    out = rateloop(command, "--redis", url, *extra)
    scheme = url.split(":", 1)[0]
    assert_one_line_error(out, "--redis", repr(scheme), "redis://", "rediss://", "unix://")
    assert "pw-secret" not in out.stderr + out.stdout


@pytest.mark.parametrize("command", ["status", "dashboard"])
def test_a_redis_url_without_a_scheme_is_refused_too(command: str) -> None:
    extra = ["--port", "0"] if command == "dashboard" else []
    out = rateloop(command, "--redis", "127.0.0.1:6379", *extra)
    assert_one_line_error(out, "--redis", "'127.0.0.1:6379'", "redis://")


def test_status_on_an_unreachable_redis_is_one_rateloop_line() -> None:
    out = rateloop("status", "--redis", "redis://127.0.0.1:1/0")
    assert_one_line_error(out, "127.0.0.1:1")
