"""classify_mcp: what an MCP server answers, in every form a client holds it.

The fixtures in tests/fixtures/classify/mcp.yaml check the messages of real
servers and the specification; these check the forms (the mcp SDK's own
objects, a raised MCPError, JSON text), the scope, and bad input.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rateloop
from rateloop.classify import classify_mcp
from rateloop.signal import Kind

NOW = datetime(2026, 1, 1, tzinfo=UTC)
SPEC_RATE_LIMIT = {
    "jsonrpc": "2.0", "id": 4,
    "result": {"content": [{"type": "text",
                            "text": "Failed to fetch weather data: API rate limit exceeded"}],
               "isError": True},
}


def test_the_face_exports_classify_mcp() -> None:
    assert rateloop.classify_mcp is classify_mcp


def test_the_sdk_objects_read_as_their_json_does() -> None:
    types = pytest.importorskip("mcp.types")
    text = "failed to create pull request: GitHub API rate limit exceeded. Retry after 30s."
    result = types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], isError=True
    )
    signal = classify_mcp(result, server="github", tool="create_pull_request", now=NOW)
    assert (signal.kind, signal.retry_after) == (Kind.TEMPORARY, 30.0)
    assert signal.scope == "mcp:github:create_pull_request"
    as_json = classify_mcp(json.dumps(result.model_dump(by_alias=True, exclude_none=True)),
                           server="github", tool="create_pull_request", now=NOW)
    assert as_json == signal


def test_a_raised_sdk_error_is_read_from_its_error_data() -> None:
    exceptions = pytest.importorskip("mcp.shared.exceptions")
    error_class = getattr(exceptions, "MCPError", None) or exceptions.McpError
    error = error_class(-32000, "rate limit exceeded", {"retry_after_seconds": 45})
    signal = classify_mcp(error, server="gitlab", tool="list_projects", now=NOW)
    assert (signal.kind, signal.retry_after) == (Kind.TEMPORARY, 45.0)
    assert (signal.scope, signal.operation) == ("mcp:gitlab:list_projects", "list_projects")


def test_a_notion_style_rate_limited_error_reads_its_retry_after_seconds() -> None:
    # A body carrying the API's code and a wait in seconds, as a tool result's JSON text.
    body = {"code": "rate_limited", "status": 429, "object": "error",
            "message": "You have been rate limited. Please try again in a few minutes.",
            "retry_after_seconds": 20}
    result = {"content": [{"type": "text", "text": json.dumps(body)}], "isError": True}
    signal = classify_mcp(result, server="notion", tool="notion-search", now=NOW)
    assert (signal.kind, signal.retry_after, signal.provider) == (Kind.TEMPORARY, 20.0, "notion")
    assert signal.scope == "mcp:notion:notion-search"


def test_a_tool_limit_through_mcp_never_names_a_model_scope() -> None:
    signal = classify_mcp(SPEC_RATE_LIMIT, server="weather", tool="get_weather", now=NOW)
    assert signal.scope == "mcp:weather:get_weather" and signal.retryable


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (None, TypeError),
        (42, TypeError),
        ([1, 2], TypeError),
        ("rate limit exceeded", TypeError),  # text that is not JSON: say what is allowed
    ],
)
def test_what_is_not_an_mcp_message_is_refused_with_what_is_allowed(
    bad: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match="tool result or JSON-RPC error"):
        classify_mcp(bad, server="s", tool="t", now=NOW)


@pytest.mark.parametrize(("server", "tool"), [("", "t"), ("s", ""), ("a:b", "t"), ("s", None)])
def test_a_bad_server_or_tool_names_the_value(server: object, tool: object) -> None:
    with pytest.raises(ValueError, match="without ':'"):
        classify_mcp(SPEC_RATE_LIMIT, server=server, tool=tool, now=NOW)  # type: ignore[arg-type]


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["content", "isError", "error", "code", "message", "data", "result",
                         "text", "type", "status", "retry_after", "structuredContent"]),
        inner, max_size=5),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["content", "isError", "error", "result", "code",
                                        "message", "data", "jsonrpc"]), JSONISH, max_size=5))
def test_hostile_content_never_raises(message: dict[str, object]) -> None:
    signal = classify_mcp(message, server="s", tool="t", now=NOW)
    assert signal.scope == "mcp:s:t"
    assert signal.retry_after is None or 0 <= signal.retry_after <= 86_400
