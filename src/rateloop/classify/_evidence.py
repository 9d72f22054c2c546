"""What a classifier looks at (:class:`Evidence`) and what it concludes (:class:`Finding`).

Headers arrive as any mapping or as pairs, in any case; the body as text,
bytes, an already-parsed JSON value or nothing.  :func:`gather` normalizes
them once so every provider rule sees lowercase header names, the body text
and, when the body is JSON (or an SSE stream carrying an ``error`` event), the
decoded value.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from typing import Any

from rateloop.classify._sse import decode_json, sse_error
from rateloop.signal import Dimension, Kind

__all__ = [
    "MAX_BODY_CHARS",
    "MAX_HEADER_CHARS",
    "MAX_HEADER_FIELDS",
    "MAX_JSON_NODES",
    "BodyLike",
    "BodyView",
    "Evidence",
    "Finding",
    "HeadersLike",
    "body_text",
    "error_object",
    "gather",
    "iter_strings",
    "normalize_headers",
    "plain_body",
    "read_body",
]

HeadersLike = Mapping[str, str] | Iterable[tuple[str, str]] | None
BodyLike = str | bytes | Mapping[str, Any] | None

#: Bodies are read up to this many characters; a refusal is never larger.
MAX_BODY_CHARS = 1_000_000
#: Header fields are read up to this many (repeats included).  A provider sends a
#: few dozen, and http.client (under requests and urllib3) refuses more than 100.
MAX_HEADER_FIELDS = 1_000
#: ... and up to this many characters of names and values (a response's header
#: block is a few kilobytes; proxies refuse one past 8 to 64 KiB).
MAX_HEADER_CHARS = 65_536
#: A JSON body is walked (and a mapping body copied) up to this many values.
MAX_JSON_NODES = 4_096
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
    #: The capacity pool that refused, when it is not the route's own
    #: (``tier:flex``: OpenAI's flex tier); ``None`` for the route's.
    scope: str | None = None


def _decode(value: bytes | bytearray) -> str:
    """The first :data:`MAX_BODY_CHARS` characters of UTF-8 bytes (errors replaced).

    Decoded in two steps, as few bytes as can give that many characters first:
    4 MB of invalid bytes decoded at once took ~20 ms for the 1 MB kept.  The
    incremental decoder makes the two steps decode exactly as one would.
    """
    first = MAX_BODY_CHARS + 3  # a character cut at the end completes within 3 bytes
    if len(value) <= first:
        return bytes(value).decode("utf-8", "replace")[:MAX_BODY_CHARS]
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    text = decoder.decode(bytes(value[:first]))
    if len(text) < MAX_BODY_CHARS:
        last = MAX_BODY_CHARS * 4  # 4 bytes a character at most
        text += decoder.decode(bytes(value[first:last]), final=True)
    return text[:MAX_BODY_CHARS]


def _text(value: object) -> str:
    if isinstance(value, bytes | bytearray):
        return _decode(value)
    return str(value)[:_MAX_HEADER_VALUE]


def body_text(body: str | bytes | bytearray) -> str:
    """The body as read: its first :data:`MAX_BODY_CHARS` characters (bytes as UTF-8)."""
    return body[:MAX_BODY_CHARS] if isinstance(body, str) else _text(body)


def normalize_headers(headers: HeadersLike) -> dict[str, str]:
    """Lowercase names; repeated headers are joined with ``", "`` (RFC 9110).

    Fields are read until :data:`MAX_HEADER_FIELDS` of them or
    :data:`MAX_HEADER_CHARS` characters of names and values have been read,
    and a joined value is cut at 8192 characters, as a single one is: a real
    response has a few dozen fields in a few kilobytes, and reading a hostile
    million would stall the caller.
    """
    parts: dict[str, list[str]] = {}
    if headers is None:
        return {}
    budget = MAX_HEADER_CHARS
    try:
        multi = getattr(headers, "multi_items", None)
        pairs = getattr(headers, "items", None)
        if callable(multi):  # httpx.Headers keeps repeated fields apart
            items: Iterable[Any] = multi()
        elif callable(pairs):  # any mapping, and http.client's HTTPMessage
            items = pairs()
        else:
            items = headers
        for item in islice(items, MAX_HEADER_FIELDS):
            if not isinstance(item, tuple | list) or len(item) != 2:
                continue
            name, value = _text(item[0]), _text(item[1])
            budget -= len(name) + len(value)
            if budget < 0:
                break
            key = name.strip().lower()
            if not key:
                continue
            # Joined once at the end: joining on every repeat copied the value
            # each time (quadratic; 20 000 repeats took ~8 s).
            parts.setdefault(key, []).append(value.strip())
    except Exception:  # hostile mappings must not break classification
        pass
    return {
        key: seen[0] if len(seen) == 1 else ", ".join(seen)[:_MAX_HEADER_VALUE]
        for key, seen in parts.items()
    }


def _to_plain(value: Any, budget: list[int], depth: int = 0) -> Any:
    """A JSON-like copy of a mapping so rules can walk it: 32 levels deep, and
    at most ``budget[0]`` values in all (copying a hostile mapping of 100 000
    keys took ~0.1 s; a refusal has a few dozen values)."""
    if depth > 32:
        return None
    budget[0] -= 1
    if isinstance(value, Mapping):
        plain: dict[str, Any] = {}
        for key, item in value.items():
            if budget[0] <= 0:
                break
            plain[str(key)] = _to_plain(item, budget, depth + 1)
        return plain
    if isinstance(value, list | tuple):
        items: list[Any] = []
        for item in value:
            if budget[0] <= 0:
                break
            items.append(_to_plain(item, budget, depth + 1))
        return items
    return value


def plain_body(body: Mapping[str, Any]) -> tuple[Any, str]:
    """A mapping body as read: its bounded JSON-like copy and that copy's JSON
    text, cut at :data:`MAX_BODY_CHARS`; ``(None, "")`` when it cannot be read."""
    try:
        data = _to_plain(body, [MAX_JSON_NODES])
        return data, json.dumps(data, default=str)[:MAX_BODY_CHARS]
    except Exception:
        return None, ""


#: What a body reads as: its text, its decoded JSON (or SSE error payload), and
#: whether that payload came from an SSE stream.
BodyView = tuple[str, Any, bool]
def read_body(body: BodyLike) -> BodyView:
    """The body as every reader sees it (see :data:`BodyView`)."""
    if body is None:
        view = ("", None, False)
    elif isinstance(body, Mapping):
        data, text = plain_body(body)
        view = (text, data, False)
    elif isinstance(body, bytes | bytearray | str):
        text = body_text(body)
        data = decode_json(text)
        sse = False
        if data is None:
            data = sse_error(text)
            sse = data is not None
        view = (text, data, sse)
    else:
        view = (_text(body), None, False)
    return view


def gather(
    status: int | None,
    headers: HeadersLike,
    body: BodyLike,
    *,
    now: datetime,
    provider: str | None,
) -> Evidence:
    norm = normalize_headers(headers)
    text, data, sse = read_body(body)
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
