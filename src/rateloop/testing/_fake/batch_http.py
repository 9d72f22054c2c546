"""The batch endpoints over HTTP: OpenAI's files and batches, Anthropic's message batches.

Routes (``{id}`` is the object's id):

- ``POST /v1/files`` (multipart: ``purpose=batch`` and a JSONL ``file``),
  ``GET /v1/files/{id}``, ``GET /v1/files/{id}/content``
- ``POST /v1/batches`` (``{input_file_id, endpoint, completion_window, metadata}``),
  ``GET /v1/batches/{id}``, ``POST /v1/batches/{id}/cancel``,
  ``GET /v1/batches?limit=&after=`` (newest first, with ``metadata``)
- ``POST /v1/messages/batches`` (``{requests: [{custom_id, params}]}``),
  ``GET /v1/messages/batches/{id}``, ``GET /v1/messages/batches/{id}/results``
  (JSONL), ``POST /v1/messages/batches/{id}/cancel``,
  ``GET /v1/messages/batches?limit=&after_id=`` (newest first)

A list answers a page of at most ``limit`` (1 to 100, 20 by default)
batches, newest first, after the one named by ``after`` / ``after_id``, with
``has_more``, ``first_id`` and ``last_id``, as both APIs do.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any
from urllib.parse import parse_qs

from rateloop.testing._fake import batch_shapes as bs
from rateloop.testing._fake.batch import Batches, Flavor

__all__ = ["Answer", "route"]

#: ``(status, content type, body)``
Answer = tuple[int, str, bytes]

_JSON = "application/json"
_OPENAI = re.compile(r"^/v1/(files|batches)(?:/([^/]+))?(?:/(content|cancel))?$")
_ANTHROPIC = re.compile(r"^/v1/messages/batches(?:/([^/]+))?(?:/(results|cancel))?$")


def _json(status: int, data: Any) -> Answer:
    return status, _JSON, json.dumps(data).encode()


def _form(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """The fields of a ``multipart/form-data`` body: name -> (filename, bytes)."""
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1")
    message = BytesParser(policy=HTTP).parsebytes(head + body)
    if not message.is_multipart():
        raise ValueError("a multipart/form-data body is required")
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if isinstance(name, str):
            fields[name] = (part.get_filename(), payload if isinstance(payload, bytes) else b"")
    return fields


def _openai(batches: Batches, method: str, kind: str, ident: str | None, action: str | None,
            headers: Mapping[str, str], body: bytes,
            query: Mapping[str, list[str]]) -> Answer | None:
    if kind == "files":
        if method == "POST" and ident is None:
            try:
                fields = _form(headers.get("content-type", ""), body)
            except ValueError as exc:
                return _json(400, bs.openai_error(f"invalid request: {exc}"))
            purpose = fields.get("purpose", (None, b""))[1].decode("utf-8", "replace")
            if "file" not in fields or purpose != "batch":
                return _json(400, bs.openai_error(
                    f"The fake provider stores batch input files only: purpose must be "
                    f"'batch' and a file is required, got purpose {purpose!r}.", "purpose"))
            filename, content = fields["file"]
            return _json(200, batches.upload(filename or "input.jsonl", content, purpose))
        if method == "GET" and ident is not None and action in (None, "content"):
            stored = batches.file(ident)
            if stored is None:
                return _json(404, bs.openai_error(f"No such File object: {ident}", "id"))
            meta, content = stored
            return (200, "application/octet-stream", content) if action else _json(200, meta)
        return None
    if method == "GET" and ident is None and action is None:
        return _page(batches, "openai", query, "after")
    if method == "POST" and ident is None and action is None:
        data = _object(body)
        if data is None:
            return _json(400, bs.openai_error("invalid request: the body must be a JSON object"))
        return _json(*batches.create_openai(data))
    if ident is not None and (method, action) in (("GET", None), ("POST", "cancel")):
        found = (batches.retrieve("openai", ident) if action is None
                 else batches.cancel("openai", ident))
        if found is None:
            return _json(404, bs.openai_error(f"No batch found with id '{ident}'.", "batch_id"))
        return _json(200, found)
    return None


def _object(body: bytes) -> Mapping[str, Any] | None:
    """The request's JSON object (an empty body is ``{}``); None when it is not one."""
    try:
        data = json.loads(body) if body else {}
    except ValueError:
        return None
    return data if isinstance(data, Mapping) else None


def _page(batches: Batches, flavor: Flavor, query: Mapping[str, list[str]],
          cursor: str) -> Answer:
    """A page of the list of batches, as the provider's list endpoint answers it."""
    error = bs.openai_error if flavor == "openai" else bs.anthropic_error
    raw = query.get("limit", ["20"])[-1]
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        return _json(400, error(f"limit: must be an integer from 1 to 100, got {raw!r}"))
    after = query.get(cursor, [None])[-1]
    page = batches.page(flavor, limit=limit, after=after)
    if page is None:
        return _json(400, error(f"{cursor}: no batch with id {after!r}"))
    data, more = page
    listing: dict[str, Any] = {"data": data, "has_more": more,
                               "first_id": data[0]["id"] if data else None,
                               "last_id": data[-1]["id"] if data else None}
    return _json(200, {"object": "list", **listing} if flavor == "openai" else listing)


def _anthropic(batches: Batches, method: str, ident: str | None, action: str | None,
               body: bytes, query: Mapping[str, list[str]]) -> Answer | None:
    if method == "GET" and ident is None and action is None:
        return _page(batches, "anthropic", query, "after_id")
    if method == "POST" and ident is None and action is None:
        data = _object(body)
        if data is None:
            return _json(400, bs.anthropic_error("the body must be a JSON object"))
        return _json(*batches.create_anthropic(data))
    if ident is None:
        return None
    missing = _json(404, bs.anthropic_error(f"No Message Batch with id {ident!r}",
                                            "not_found_error"))
    if method == "GET" and action == "results":
        if batches.retrieve("anthropic", ident) is None:
            return missing
        lines = batches.results(ident)
        if lines is None:
            return _json(400, bs.anthropic_error(f"Message Batch {ident} has not ended yet: "
                                                 "its results are not available"))
        return 200, "application/binary", lines
    if (method, action) in (("GET", None), ("POST", "cancel")):
        found = (batches.retrieve("anthropic", ident) if action is None
                 else batches.cancel("anthropic", ident))
        return missing if found is None else _json(200, found)
    return None


def route(batches: Batches, method: str, path: str, headers: Mapping[str, str],
          body: bytes) -> Answer | None:
    """The answer to a batch endpoint, or ``None`` when ``path`` is not one.

    ``path`` may carry its query string (``/v1/batches?limit=5``).
    """
    path, _, raw_query = path.partition("?")
    path = path.rstrip("/")
    query = parse_qs(raw_query)
    if match := _ANTHROPIC.match(path):
        return _anthropic(batches, method, match.group(1), match.group(2), body, query)
    if match := _OPENAI.match(path):
        return _openai(batches, method, match.group(1), match.group(2), match.group(3),
                       headers, body, query)
    return None
