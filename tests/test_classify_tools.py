"""Tool APIs: the request a tool response answered completes its signal.

The fixtures in tests/fixtures/classify/tools.yaml check each tool's kinds,
waits and scopes; these check what only a response object carries: the
operation (method and path, never the query) and Slack's method in the scope.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from rateloop.classify import PROVIDERS, classify, classify_exception, classify_response

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_slack_limit_holds_the_method_it_was_read_on() -> None:
    request = httpx.Request("POST", "https://slack.com/api/chat.postMessage?token=xoxb-1")
    resp = httpx.Response(429, headers={"retry-after": "30"},
                          json={"ok": False, "error": "ratelimited"}, request=request)
    signal = classify_response(resp, now=NOW)
    assert signal.scope == "tool:slack:chat.postMessage"
    assert signal.operation == "POST /api/chat.postMessage"  # the query (a token) is left out
    assert "xoxb" not in repr(signal)


def test_a_github_exception_carries_its_operation() -> None:
    request = httpx.Request("GET", "https://api.github.com/search/code?q=secret")
    resp = httpx.Response(
        403,
        headers={"x-github-request-id": "AB12:CD34", "x-ratelimit-remaining": "0",
                 "x-ratelimit-reset": "1767225630",
                 "x-ratelimit-resource": "code_search"},
        json={"message": "API rate limit exceeded for user ID 1."},
        request=request,
    )
    signal = classify_exception(httpx.HTTPStatusError("403", request=request, response=resp),
                                now=NOW)
    assert (signal.kind.value, signal.retry_after) == ("temporary", 30.0)
    assert (signal.scope, signal.operation) == ("tool:github:code_search", "GET /search/code")


def test_a_model_providers_signal_names_no_scope_and_no_operation() -> None:
    request = httpx.Request("POST", "https://api.openai.com/v1/chat/completions")
    resp = httpx.Response(429, headers={"retry-after": "2"},
                          json={"error": {"message": "Rate limit reached", "type": "requests"}},
                          request=request)
    signal = classify_response(resp, now=NOW)
    assert (signal.scope, signal.operation) == (None, None)


@pytest.mark.parametrize("tool", ["atlassian", "brave", "discord", "github", "notion", "slack"])
def test_every_tool_is_a_known_provider(tool: str) -> None:
    assert tool in PROVIDERS


def test_a_header_in_a_scope_is_kept_to_a_safe_alphabet() -> None:
    signal = classify(429, {"x-ratelimit-bucket": "ab cd:ef/../\n" + "x" * 200,
                            "retry-after": "1"}, None, now=NOW)
    assert signal.provider == "discord"
    assert signal.scope is not None and signal.scope.startswith("tool:discord:ab_cd_ef")
    assert len(signal.scope) <= len("tool:discord:") + 64
    assert signal.scope.count(":") == 2


def test_rateloop_classify_explains_a_tool_response(tmp_path: Path) -> None:
    # Discord's documented older 429: Retry-After and retry_after in milliseconds.
    message = tmp_path / "discord.http"
    message.write_bytes(
        b"HTTP/1.1 429 TOO MANY REQUESTS\r\nContent-Type: application/json\r\n"
        b"Retry-After: 6457\r\nX-RateLimit-Limit: 10\r\nX-RateLimit-Remaining: 0\r\n"
        b"X-RateLimit-Reset: 1470173023\r\nX-RateLimit-Bucket: abcd1234\r\n\r\n"
        b'{"message": "You are being rate limited.", "retry_after": 6457, "global": false}'
    )
    out = subprocess.run([sys.executable, "-m", "rateloop", "classify", str(message)],
                         capture_output=True, text=True, check=True)
    first, _, rest = out.stdout.partition("\n")
    assert first == ("temporary: a short throttle — wait at least 6.457 s and retry "
                     "(the limit of tool:discord:abcd1234, not of the model)")
    data = json.loads(rest)
    assert (data["provider"], data["scope"], data["retry_after"]) == (
        "discord", "tool:discord:abcd1234", 6.457)
