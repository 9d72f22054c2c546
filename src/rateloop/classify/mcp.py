"""MCP: a tool result or a JSON-RPC error from an MCP server, read like any other refusal.

An MCP server reports a failure in one of two ways (the MCP specification,
"Tools" → "Error Handling"):

* a **tool execution error**: a ``tools/call`` *result* with
  ``"isError": true`` and the reason as text in ``content`` -- the way servers
  relay the upstream API's refusal (the GitHub MCP server: "failed to list
  issues: GitHub API rate limit exceeded. Retry after 59m12s."; the reference
  Brave server: "Error: Brave API error: 429 Too Many Requests" and the API's
  JSON body);
* a **protocol error**: a JSON-RPC ``error`` object, ``{"code", "message",
  "data"}`` -- -32700 parse error, -32600 invalid request, -32601 method not
  found, -32602 invalid params (an unknown tool), -32603 internal error, and
  -32000 to -32099 for the implementation (servers use -32000 for "rate limit
  exceeded"; the SDKs use -32000 for a closed connection and -32001 for a
  request timeout).

How it works: the text and JSON of the message are gathered (``content``
texts, the error's ``message`` and ``data``, ``structuredContent``).  An
HTTP status relayed in the text ("…: 429 Too Many Requests", "HTTP 403",
``"status": 429`` in a JSON body) makes it an HTTP response, read by
:func:`~rateloop.classify.classify` with the relayed JSON body, so Notion's
``rate_limited``, Brave's month and GitHub's secondary limit read as they
do over HTTP.  Without a status, a rate-limit, quota or billing phrase reads
as a refusal with the shared throttle rule (spend, then a spent period, then
a throttle, with any wait stated in the text or a ``retry_after`` /
``retry_after_seconds`` field).  Otherwise the JSON-RPC code decides; a tool
error that names no limit is ``unknown`` (the model handles it; waiting will
not help).

The signal's scope is ``mcp:<server>:<tool>`` (a
``Route("mcp", server, project=tool)``, under the server's ``mcp:<server>``)
and its ``operation`` is the tool.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from itertools import islice
from typing import Any

from rateloop.classify._core import classify, resolve_now
from rateloop.classify._far import far_wait_threshold
from rateloop.classify._phrases import period_of, spend_of, wait_in
from rateloop.classify._sse import decode_json
from rateloop.signal import Kind, LimitSignal

__all__ = ["classify_mcp"]

#: How much of a tool result's text is read; a refusal is never larger.
_MAX_TEXT = 100_000
_MAX_ITEMS = 64

_INVALID_CODES = frozenset({-32700, -32600, -32601, -32602, -32002})
_INTERNAL = -32603
_SDK_CONNECTION_CLOSED = -32000
_SDK_REQUEST_TIMEOUT = -32001

_LIMIT = re.compile(
    r"rate[ _-]?limit|ratelimited|too many requests|\bquota\b|throttl|usage limit",
    re.IGNORECASE,
)
# A status the server relayed from the API it called.  Anchored to the forms
# servers print ("error: 429 Too Many Requests", "HTTP 403", "status code 429",
# go-github's "GET https://…: 403 API rate limit …"), never a bare number.
_STATUS = re.compile(
    r"(?:\bHTTP(?:/[\d.]+)?\s+|\bstatus(?:\s*code)?\s*[:=]?\s*|:\s)([45]\d\d)\b",
    re.IGNORECASE,
)
_CLOSED = re.compile(r"connection closed", re.IGNORECASE)
_NOT_A_LIMIT = frozenset({Kind.PERMISSION, Kind.INVALID, Kind.UNKNOWN, Kind.OK})


def _name(value: object, what: str) -> str:
    if not isinstance(value, str) or not value.strip() or ":" in value:
        raise ValueError(
            f"classify_mcp: {what} must be a non-empty string without ':', got {value!r}"
        )
    return value.strip()


def _field(obj: object, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    try:
        return getattr(obj, name, None)
    except Exception:  # a half-built SDK object's property may raise
        return None


def _plain(value: object) -> Any:
    """A pydantic model (the mcp SDK's types) as its JSON-like dump; anything else as it is."""
    dump = _field(value, "model_dump")
    if callable(dump):
        try:
            return dump(by_alias=True, exclude_none=True)
        except Exception:
            return None
    return value


def _texts(content: object) -> list[str]:
    out: list[str] = []
    if not isinstance(content, list | tuple):
        content = [content] if content is not None else []
    for item in islice(content, _MAX_ITEMS):  # a hostile list of millions is not copied
        text = _field(item, "text")
        if text is None:  # an embedded resource carries its text one level down
            text = _field(_field(item, "resource"), "text")
        if isinstance(text, str) and text:
            out.append(text[:_MAX_TEXT])
    return out


class _Message:
    """What an MCP message says: whether it is an error, its JSON-RPC code, text and JSON."""

    def __init__(self, value: object) -> None:
        self.error = False
        self.code: int | None = None
        self.texts: list[str] = []
        self.data: Any = None
        value = self._decoded(value)
        # An McpError carries its ErrorData as .error; a JSON-RPC response its error
        # object, or its result (the tool result).
        error = _field(value, "error")
        if error is not None and not isinstance(error, str):
            self._error(error)
        elif _field(value, "code") is not None and _field(value, "message") is not None:
            self._error(value)
        else:
            result = _field(value, "result")
            self._result(result if result is not None else value)

    @staticmethod
    def _decoded(value: object) -> object:
        if isinstance(value, bytes | bytearray):
            value = bytes(value[: _MAX_TEXT * 4]).decode("utf-8", "replace")
        if isinstance(value, str):
            try:
                return json.loads(value[:_MAX_TEXT])
            except (ValueError, RecursionError):
                raise TypeError(
                    "classify_mcp needs a tool result or JSON-RPC error (a mapping, an mcp "
                    f"SDK object or its JSON text), got text that is not JSON: {value[:80]!r}"
                ) from None
        if value is None or isinstance(value, int | float | bool | list | tuple):
            raise TypeError(
                "classify_mcp needs a tool result or JSON-RPC error (a mapping, an mcp SDK "
                f"object or its JSON text), got {type(value).__name__}: {value!r:.80}"
            )
        return value

    def _error(self, error: object) -> None:
        self.error = True
        code = _field(error, "code")
        self.code = code if isinstance(code, int) and not isinstance(code, bool) else None
        message = _field(error, "message")
        if isinstance(message, str):
            self.texts.append(message[:_MAX_TEXT])
        data = _plain(_field(error, "data"))
        if isinstance(data, str):
            self.texts.append(data[:_MAX_TEXT])
        else:
            self.data = data

    def _result(self, result: object) -> None:
        self.error = _field(result, "isError") is True or _field(result, "is_error") is True
        self.texts = _texts(_field(result, "content"))
        structured = _plain(_field(result, "structuredContent"))
        self.data = structured if isinstance(structured, Mapping) else None

    @property
    def text(self) -> str:
        return "\n".join(self.texts)[:_MAX_TEXT]


def _relayed_json(text: str) -> Mapping[str, Any] | None:
    """A JSON object the server copied into its text (the upstream API's body)."""
    start = text.find("{")
    value = decode_json(text[start:]) if start >= 0 else None
    return value if isinstance(value, Mapping) else None


def _status_in(body: Mapping[str, Any] | None, text: str) -> int | None:
    for holder in (body, body.get("error") if body is not None else None):
        if isinstance(holder, Mapping):
            for key in ("status", "statusCode", "status_code", "httpStatus"):
                value = holder.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and 400 <= value < 600:
                    return value
    match = _STATUS.search(text)
    return int(match.group(1)) if match else None


def _by_code(code: int | None, text: str) -> LimitSignal:
    if code in _INVALID_CODES:
        kind, matched = Kind.INVALID, str(code)
    elif code == _INTERNAL:
        kind, matched = Kind.SERVER_ERROR, str(code)
    elif code == _SDK_REQUEST_TIMEOUT or (code == _SDK_CONNECTION_CLOSED and _CLOSED.search(text)):
        kind, matched = Kind.NETWORK, str(code)
    else:
        kind, matched = Kind.UNKNOWN, "isError" if code is None else str(code)
    return LimitSignal.of(kind, code=None if code is None else str(code), matched=matched)


def _read(message: _Message, now: datetime, limit: float) -> LimitSignal:
    if not message.error:
        return LimitSignal.of(Kind.OK)
    text = message.text
    body = message.data if isinstance(message.data, Mapping) else _relayed_json(text)
    status = _status_in(body, text)
    named = bool(_LIMIT.search(text)) or spend_of(text) is not None or period_of(text) is not None
    if status is not None:
        relayed: Any = body if body is not None else text
        signal = classify(status, None, relayed, now=now, pause_limit=limit)
        # Without the API's headers a relayed 403 cannot show it was a limit
        # (GitHub's x-ratelimit-remaining: 0): the words decide then.
        if not (named and signal.kind in _NOT_A_LIMIT):
            return signal
    if named:
        # A limit named in words: read as a 429 would be, the body being the
        # relayed JSON (its retry_after fields) with the text as its message.
        fields = dict(body) if body is not None else {}
        fields.setdefault("message", text)
        stated = wait_in(text)
        if stated is not None:  # read as a reset field: the far-wait rule still applies
            fields.setdefault("retry_after", stated)
        signal = classify(429, None, fields, now=now, pause_limit=limit)
        phrase = _LIMIT.search(text)
        matched = phrase.group(0).lower() if phrase and signal.matched == "429" else signal.matched
        return replace(signal, status=status, matched=matched)
    return _by_code(message.code, text)


def classify_mcp(
    result_or_error: object,
    *,
    server: str,
    tool: str,
    now: datetime | None = None,
    pause_limit: float | None = None,
) -> LimitSignal:
    """Classify what an MCP server answered to a ``tools/call``.

    ``result_or_error`` is a tool result (``{"content": [...], "isError": true}``),
    a JSON-RPC response (``{"jsonrpc": "2.0", "result": ...}`` or ``"error": ...``),
    a bare JSON-RPC error object (``{"code": -32000, "message": ...}``), the mcp
    SDK's ``CallToolResult`` / ``ErrorData`` / ``McpError``, or the JSON text of
    any of these.  ``server`` and ``tool`` name the scope
    (``mcp:<server>:<tool>``); ``now`` and ``pause_limit`` are as for
    :func:`~rateloop.classify.classify`.  Raises ``TypeError`` for anything
    else and ``ValueError`` for a bad ``server`` or ``tool``; never raises on
    hostile content.
    """
    server_name, tool_name = _name(server, "server"), _name(tool, "tool")
    moment = resolve_now(now)
    limit = far_wait_threshold(pause_limit)
    message = _Message(result_or_error)
    try:
        signal = _read(message, moment, limit)
    except Exception:  # a reader bug must not take the caller's loop down
        signal = LimitSignal.of(Kind.UNKNOWN, matched="isError")
    return replace(signal, scope=f"mcp:{server_name}:{tool_name}", operation=tool_name)
