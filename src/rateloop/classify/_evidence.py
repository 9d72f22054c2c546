"""What a classifier looks at (:class:`Evidence`) and what it concludes (:class:`Finding`).

Headers arrive as any mapping or as pairs, in any case; the body as text,
bytes, an already-parsed JSON value or nothing.  :func:`gather` normalizes
them once so every provider rule sees lowercase header names, the body text
and, when the body is JSON (or an SSE stream carrying an ``error`` event), the
decoded value.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rateloop.signal import Dimension, Kind

__all__ = [
    "BodyLike",
    "Evidence",
    "Finding",
    "HeadersLike",
    "error_object",
    "gather",
    "iter_strings",
    "normalize_headers",
]

HeadersLike = Mapping[str, str] | Iterable[tuple[str, str]] | None
BodyLike = str | bytes | Mapping[str, Any] | None

#: Bodies are read up to this many characters; a refusal is never larger.
MAX_BODY_CHARS = 1_000_000
_MAX_HEADER_VALUE = 8192


@dataclass(frozen=True, slots=True, kw_only=True)
class Evidence:
    """A normalized response: status, lowercase headers, body text and JSON."""

    status: int | None
    headers: Mapping[str, str]
    text: str
    data: Any
    now: datetime
    provider: str | None = None
    sse_error: bool = False

    def header(self, name: str) -> str | None:
        return self.headers.get(name)


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """A rule's conclusion; the core fills in everything else."""

    kind: Kind
    code: str | None = None
    matched: str | None = None
    dimension: Dimension | None = None
    retry_after: float | None = None
    reset_at: datetime | None = None
    request_id: str | None = None
    #: The period came only from a phrase ("requests per day"): a stated wait
    #: within the pause limit outranks it (a continuously refilled bucket).
    soft_period: bool = False


def _text(value: object) -> str:
    if isinstance(value, bytes | bytearray):
        return bytes(value[: MAX_BODY_CHARS * 4]).decode("utf-8", "replace")[:MAX_BODY_CHARS]
    return str(value)[:_MAX_HEADER_VALUE]


def normalize_headers(headers: HeadersLike) -> dict[str, str]:
    """Lowercase names; repeated headers are joined with ``", "`` (RFC 9110)."""
    result: dict[str, str] = {}
    if headers is None:
        return result
    try:
        multi = getattr(headers, "multi_items", None)
        pairs = getattr(headers, "items", None)
        if callable(multi):  # httpx.Headers keeps repeated fields apart
            items: Iterable[Any] = multi()
        elif callable(pairs):  # any mapping, and http.client's HTTPMessage
            items = pairs()
        else:
            items = headers
        for item in items:
            if not isinstance(item, tuple | list) or len(item) != 2:
                continue
            name, value = item
            key = _text(name).strip().lower()
            if not key:
                continue
            text = _text(value).strip()
            result[key] = f"{result[key]}, {text}" if key in result else text
    except Exception:  # hostile mappings must not break classification
        return result
    return result


def _decode_json(text: str) -> Any:
    stripped = text.strip()
    if not stripped or stripped[0] not in "{[":
        return None
    try:
        return json.loads(stripped)
    except (ValueError, RecursionError):
        return None


def _sse_error(text: str) -> Any:
    """The decoded ``data`` of the first SSE error: ``event: error``, a payload of
    ``"type": "error"`` (Anthropic) or one carrying an ``error`` object (OpenAI)."""
    if "data:" not in text:
        return None
    event = ""
    data: list[str] = []
    for raw in [*text.splitlines(), ""]:
        line = raw.rstrip("\r")
        if not line:
            if data:
                payload = _decode_json("\n".join(data))
                is_error = event == "error" or (
                    isinstance(payload, Mapping)
                    and (
                        payload.get("type") == "error"
                        or isinstance(payload.get("error"), Mapping)
                    )
                )
                if is_error:
                    return payload if payload is not None else {"error": "\n".join(data)}
            event, data = "", []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
    return None


def _to_plain(value: Any, depth: int = 0) -> Any:
    """A JSON-like copy of a mapping (bounded depth) so rules can walk it."""
    if depth > 32:
        return None
    if isinstance(value, Mapping):
        return {str(k): _to_plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_plain(v, depth + 1) for v in value]
    return value


def gather(
    status: int | None,
    headers: HeadersLike,
    body: BodyLike,
    *,
    now: datetime,
    provider: str | None,
) -> Evidence:
    norm = normalize_headers(headers)
    data: Any = None
    sse = False
    if body is None:
        text = ""
    elif isinstance(body, Mapping):
        try:
            data = _to_plain(body)
            text = json.dumps(data, default=str)[:MAX_BODY_CHARS]
        except Exception:
            data, text = None, ""
    elif isinstance(body, bytes | bytearray | str):
        text = _text(body) if not isinstance(body, str) else body[:MAX_BODY_CHARS]
        data = _decode_json(text)
        if data is None:
            data = _sse_error(text)
            sse = data is not None
    else:
        text = _text(body)
    return Evidence(
        status=status, headers=norm, text=text, data=data, now=now, provider=provider, sse_error=sse
    )


def error_object(data: Any) -> Mapping[str, Any] | None:
    """The provider's error object: ``{"error": {...}}``, a list of those, or the body."""
    if isinstance(data, list) and data:
        data = data[0]
    if not isinstance(data, Mapping):
        return None
    inner = data.get("error")
    if isinstance(inner, Mapping):
        return inner
    return data


def iter_strings(value: Any, depth: int = 0, *, max_depth: int = 16) -> Iterator[str]:
    """Every string inside a JSON value, down to ``max_depth`` levels of nesting."""
    if depth > max_depth:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from iter_strings(item, depth + 1, max_depth=max_depth)
    elif isinstance(value, list):
        for item in value:
            yield from iter_strings(item, depth + 1, max_depth=max_depth)
