"""``rateloop classify``: the real app through CliRunner, and one real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import rateloop
from rateloop.classify.cli import parse_http_message
from rateloop.cli import app

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
runner = CliRunner()


def _run(*args: str, stdin: str | None = None) -> tuple[int, dict[str, object] | str]:
    result = runner.invoke(app, ["classify", "--json", *args], input=stdin)
    if result.exit_code == 0:
        return result.exit_code, json.loads(result.stdout)
    return result.exit_code, result.output


def test_readme_demo_in_a_real_subprocess() -> None:
    """`rateloop classify examples/openai-insufficient-quota.http` prints spend, not retryable."""
    src = str(Path(rateloop.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "rateloop", "classify", "examples/openai-insufficient-quota.http"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    first, rest = done.stdout.split("\n", 1)
    assert first == "spend: billing — a person must add credit; retrying will not help"
    signal = json.loads(rest)
    assert (signal["kind"], signal["retryable"], signal["status"], signal["provider"]) == (
        "spend", False, 429, "openai"
    )
    assert signal["code"] == "insufficient_quota"
    assert signal["observed"][0] == {
        "dimension": "requests",
        "limit": 500.0,
        "remaining": 499.0,
        "reset_after": 0.12,
        "window": 60.0,
    }


@pytest.mark.parametrize(
    ("example", "kind", "retryable"),
    [
        ("openai-insufficient-quota.http", "spend", False),
        ("openai-rate-limit.http", "temporary", True),
        ("anthropic-overloaded-529.http", "overload", True),
        ("gemini-daily-quota.http", "period_quota", False),
        ("groq-request-too-large.http", "invalid", False),
        ("minimax-200-rate-limit.http", "temporary", True),
    ],
)
def test_bundled_http_examples(example: str, kind: str, retryable: bool) -> None:
    code, signal = _run(str(EXAMPLES / example))
    assert code == 0
    assert isinstance(signal, dict)
    assert (signal["kind"], signal["retryable"]) == (kind, retryable)


def test_copilot_text_example() -> None:
    code, signal = _run("--text", "--exit-code", "1", str(EXAMPLES / "copilot-rate-limit.txt"))
    assert code == 0
    assert isinstance(signal, dict)
    assert (signal["kind"], signal["matched"]) == ("temporary", "hit your rate limit")


def test_claude_usage_example_prints_reset_at_in_iso_8601() -> None:
    code, signal = _run("--text", str(EXAMPLES / "claude-usage-limit.txt"))
    assert isinstance(signal, dict)
    assert (code, signal["kind"], signal["reset_at"]) == (
        0, "period_quota", "2026-01-01T00:00:00+00:00"
    )


@pytest.mark.parametrize(
    ("example", "kind", "provider"),
    [
        ("claude-hit-your-limit.txt", "period_quota", "anthropic"),
        ("codex-usage-limit.txt", "period_quota", "openai"),
        ("gemini-capacity.txt", "period_quota", "google"),
        ("copilot-rate-limit.txt", "temporary", "github"),
    ],
)
def test_bundled_agent_examples(example: str, kind: str, provider: str) -> None:
    code, signal = _run("--text", "--exit-code", "1", str(EXAMPLES / example))
    assert isinstance(signal, dict)
    assert (code, signal["kind"], signal["provider"]) == (0, kind, provider)
    if kind == "period_quota":
        assert signal["reset_at"] is not None


def test_text_exit_code_zero_is_ok() -> None:
    code, signal = _run("--text", "--exit-code", "0", "-", stdin="429 Too Many Requests")
    assert isinstance(signal, dict)
    assert (code, signal["kind"]) == (0, "ok")


def test_stdin_with_redirect_blocks_and_lf_line_ends() -> None:
    stdin = (
        "HTTP/1.1 301 Moved Permanently\nLocation: https://api.example.com/v1\n\n"
        "HTTP/2 429\nretry-after: 7\nx-slack-req-id: abc\n\n"
        '{"ok": false, "error": "ratelimited"}\n'
    )
    code, signal = _run(stdin=stdin)
    assert isinstance(signal, dict)
    assert (code, signal["kind"], signal["retry_after"], signal["provider"]) == (
        0, "temporary", 7.0, "slack"
    )


def test_provider_override() -> None:
    stdin = 'HTTP/1.1 402 Payment Required\r\n\r\n{"error": {"message": "Insufficient Balance"}}'
    code, signal = _run("--provider", "DeepSeek", "-", stdin=stdin)
    assert isinstance(signal, dict)
    assert (code, signal["kind"], signal["provider"]) == (0, "spend", "deepseek")


def test_unreadable_file_exits_2_with_a_clear_error(tmp_path: Path) -> None:
    code, output = _run(str(tmp_path / "missing.http"))
    assert code == 2
    assert "cannot read" in str(output)
    assert "missing.http" in str(output)


def test_non_http_input_exits_2_and_suggests_text() -> None:
    code, output = _run(stdin="panic: index out of bounds\n")
    assert code == 2
    assert "expected a status line" in str(output)
    assert "--text" in str(output)


def test_exit_code_without_text_is_refused() -> None:
    code, output = _run("--exit-code", "1", stdin="HTTP/1.1 200 OK\n\n")
    assert code == 2
    assert "--exit-code" in str(output)


def test_parse_http_message_takes_the_last_block_and_keeps_the_body() -> None:
    status, headers, body = parse_http_message(
        "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 Connection established\r\n\r\n"
        "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 5\r\nX-Folded: a\r\n b\r\n\r\n"
        "line one\r\n\r\nline three"
    )
    assert status == 503
    assert headers == [("Retry-After", "5"), ("X-Folded", "a b")]
    assert body == "line one\r\n\r\nline three"


def test_bom_utf16_lowercase_and_redirect_bodies_are_read(tmp_path: Path) -> None:
    message = (
        "http/1.1 301 Moved Permanently\r\nlocation: /v1\r\n\r\n<html>moved</html>\r\n"
        'HTTP/2 429\r\nretry-after: 7\r\n\r\n{"error": {"code": "rate_limit_exceeded"}}'
    )
    status, headers, body = parse_http_message(message)
    assert status == 429 and ("retry-after", "7") in headers and "rate_limit_exceeded" in body
    for name, data in (
        ("bom.http", b"\xef\xbb\xbf" + message.encode()),
        ("utf16.http", message.encode("utf-16")),
    ):
        path = tmp_path / name
        path.write_bytes(data)
        out = CliRunner().invoke(app, ["classify", "--json", str(path)])
        assert out.exit_code == 0, out.output
        assert json.loads(out.stdout)["retry_after"] == 7.0


@pytest.mark.parametrize(
    ("args", "stdin", "line"),
    [
        ([], "HTTP/1.1 429 Too Many Requests\nretry-after: 20\n\n",
         "temporary: a short throttle — wait at least 20 s and retry"),
        (["--text"], "Claude AI usage limit reached|1767312000",
         "period_quota: an allowance for a period (hours, a day, a month) is spent — it "
         "returns at 2026-01-02T00:00:00+00:00; waiting minutes will not help"),
        (["--text"], "Error: HTTP 429 Too Many Requests",
         "temporary: a short throttle — back off briefly and retry"),
        (["--text"], "Invalid API key · Please run /login",
         "permission: the key, account or project was refused, or has no quota at all "
         "for this model (limit 0) — an operator must act; retrying will not help"),
        (["--text"], "API Error: 529 Overloaded",
         "overload: the provider is overloaded — retry later or fall back"),
        (["--text"], "panic: index out of bounds",
         "unknown: not recognised — surfaced as it is, not retried"),
    ],
)
def test_a_meaning_line_comes_above_the_json(args: list[str], stdin: str, line: str) -> None:
    result = runner.invoke(app, ["classify", *args, "-"], input=stdin)
    assert result.exit_code == 0, result.output
    first, rest = result.stdout.split("\n", 1)
    assert first == line
    assert json.loads(rest)["kind"] == line.split(":", 1)[0]


def test_json_prints_the_bare_json() -> None:
    result = runner.invoke(app, ["classify", "--json", "-"], input="HTTP/1.1 402 X\n\n")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["kind"] == "spend"


@pytest.mark.parametrize(
    ("stdin", "line"),
    [
        ("You've hit your weekly limit · resets 4am (Europe/Madrid)",
         "period_quota: the weekly limit is spent — it returns at "),
        ("Sorry, you have been rate-limited. Please wait 2 minutes before trying again.\n"
         "Server Error: Sorry, you've exceeded your weekly rate limit.\n"
         "Error Code: user_weekly_rate_limited",
         "period_quota: the weekly limit is spent — when it returns was not stated; "
         "waiting minutes will not help"),
        ("You've hit your session limit · resets 3pm (America/Bogota)",
         "period_quota: the session limit is spent — it returns at "),
        ("You've hit your monthly spend limit. Ask an admin to raise it.",
         "spend: the account's spend limit is used up — a person must act; "
         "retrying will not help"),
        ("You're out of extra usage · resets 9pm", "period_quota: the credit balance is spent"),
        ("Usage limit reached for all Pro models.",
         "period_quota: a limit on this model is spent — when it returns was not stated; "
         "waiting minutes will not help"),
        ("⚡ You have reached your daily gemini-2.5-pro quota limit.",
         "period_quota: this model's daily limit is spent — it returns at "),
        ("Opus weekly limit reached ∙ resets Oct 31, 9am",
         "period_quota: this model's weekly limit is spent — it returns at "),
        ("The monthly usage limit has been reached (request_id: 0e06d8cd)",
         "period_quota: the monthly limit is spent — when it returns was not stated"),
        ("You have exceeded your monthly included credits for Inference Providers.",
         "period_quota: the credit balance is spent — when it returns was not stated"),
        ("Slow response times detected. Automatically switching from gemini-2.5-pro to "
         "gemini-2.5-flash for faster responses for the remainder of this session.",
         "unknown: only a model fallback notice — the agent switched models and went on; "
         "not a refusal, surfaced as it is, not retried"),
        ("You've used 51% of your weekly rate limit. Your weekly rate limit will reset on "
         "April 27 at 8:00 AM.",
         "unknown: only a usage warning — the agent went on; not a refusal, surfaced as it "
         "is, not retried"),
        ("server busy, please try again.  maximum pending requests exceeded",
         "overload: the provider is overloaded — retry later or fall back"),
    ],
)
def test_the_meaning_line_names_the_allowance_the_agent_said_ran_out(stdin: str, line: str) -> None:
    result = runner.invoke(app, ["classify", "--text", "-"], input=stdin)
    assert result.exit_code == 0, result.output
    first, rest = result.stdout.split("\n", 1)
    assert first.startswith(line), first
    assert json.loads(rest)["kind"] == line.split(":", 1)[0]
