"""OpenAI's Batch API for a batch step: a JSONL file, a batch, its output and error files.

- **Submit**: upload the items as a ``purpose=batch`` JSONL file named
  ``rateloop-{tag}.jsonl`` (one ``/v1/chat/completions`` line per item,
  ``custom_id`` = its wire id), then create the batch with ``metadata =
  {"rateloop_key": key}``.
- **Find** (after a crash between the submit and its checkpoint): list the
  batches newest first, back to the submission mark, and take the one whose
  metadata names the key.
- **Poll**: ``GET /v1/batches/{id}``; once ``completed``, ``expired`` or
  ``cancelled``, read the output and error files: a 200 line succeeded, a
  4xx line (but 429) failed with the provider's reason, a 429/5xx line or
  ``batch_expired`` is retried, an item in neither file (a cancel cut it off)
  is retried.  A ``failed`` batch was refused as a whole: the lines its
  ``errors.data`` name fail with their reason, the others are retried; a
  ``token_limit_exceeded`` refusal (the enqueued-token limit) retries all.

Plain httpx rather than the ``openai`` SDK: the step reads a handful of fields,
the SDK is an optional dependency of its own, and the same few requests serve
any OpenAI-compatible server.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from rateloop.tasks._batch_wire import (
    CLOCK_SLACK_SECS,
    Ended,
    Found,
    HttpApi,
    ItemEnd,
    body_reason,
    wire_id,
    wire_position,
)

__all__ = ["OpenAIBatches"]

_CHAT = "/v1/chat/completions"
_ENDED = ("completed", "expired", "cancelled", "failed")


class OpenAIBatches:
    """OpenAI's batches at ``base_url`` (``https://api.openai.com``: the SDK's, minus ``/v1``)."""

    name = "openai"

    def __init__(self, *, api_key: str, base_url: str = "https://api.openai.com",
                 timeout: float = 60.0) -> None:
        self._api = HttpApi(base_url, {"authorization": f"Bearer {api_key}"}, timeout=timeout)

    def __repr__(self) -> str:
        return f"OpenAIBatches({self._api.base_url!r})"

    def close(self) -> None:
        self._api.close()

    def submit(self, key: str, tag: str, requests: Sequence[Any], model: str) -> str:
        lines = []
        for position, body in enumerate(requests):
            # A body given as JSON text goes as is: the provider judges it, line by line.
            text = body if isinstance(body, str) else json.dumps(body)
            lines.append(f'{{"custom_id": {json.dumps(wire_id(tag, position))}, '
                         f'"method": "POST", "url": "{_CHAT}", "body": {text}}}')
        upload = self._api.call(
            "POST", "/v1/files", "upload the batch file",
            data={"purpose": "batch"},
            files={"file": (f"rateloop-{tag}.jsonl", "\n".join(lines).encode(),
                            "application/jsonl")},
        ).json()
        batch = self._api.call(
            "POST", "/v1/batches", "create the batch",
            json={"input_file_id": upload["id"], "endpoint": _CHAT, "completion_window": "24h",
                  "metadata": {"rateloop_key": key}},
        ).json()
        return str(batch["id"])

    def find(self, key: str, tag: str, since: datetime) -> Found:
        oldest = since.timestamp() - CLOCK_SLACK_SECS
        after: str | None = None
        while True:
            params: dict[str, Any] = {"limit": 100, **({"after": after} if after else {})}
            page = self._api.call("GET", "/v1/batches", "list the batches",
                                  params=params).json()
            for batch in page.get("data", []):
                if (batch.get("metadata") or {}).get("rateloop_key") == key:
                    return Found(str(batch["id"]))
                if (batch.get("created_at") or 0) < oldest:
                    return Found()
            if not page.get("has_more") or not page.get("data"):
                return Found()
            after = page["data"][-1]["id"]

    def poll(self, batch_id: str, tag: str, count: int) -> Ended | None:
        batch = self._api.call("GET", f"/v1/batches/{batch_id}", "read the batch").json()
        status = batch.get("status")
        if status not in _ENDED:
            return None
        if status == "failed":
            return _refused(batch, count)
        items: dict[int, ItemEnd] = {}
        for file_id in (batch.get("output_file_id"), batch.get("error_file_id")):
            if file_id:
                content = self._api.call("GET", f"/v1/files/{file_id}/content",
                                         "read the batch's results").text
                for raw in content.splitlines():
                    if raw.strip():
                        _read_line(json.loads(raw), tag, items)
        cut = f"the batch ended {status} before the item ran"
        for position in range(count):
            items.setdefault(position, ItemEnd("retry", reason=cut))
        return Ended(str(status), items)


def _read_line(line: Mapping[str, Any], tag: str, items: dict[int, ItemEnd]) -> None:
    position = wire_position(tag, line.get("custom_id"))
    if position is None:
        return
    response = line.get("response")
    if isinstance(response, Mapping):
        status = int(response.get("status_code") or 0)
        body = response.get("body")
        if status == 200:
            items[position] = ItemEnd("succeeded", value=body)
            return
        reason = body_reason(body, status)
        transient = status in (408, 409, 429) or status >= 500
        items[position] = ItemEnd("retry" if transient else "failed", reason=reason)
        return
    error = line.get("error")
    error = error if isinstance(error, Mapping) else {}
    items[position] = ItemEnd("retry", reason=f"{error.get('code')}: {error.get('message')}")


def _refused(batch: Mapping[str, Any], count: int) -> Ended:
    """A batch refused as a whole: the named lines fail, the others are retried."""
    errors = (batch.get("errors") or {}).get("data") or []
    items: dict[int, ItemEnd] = {}
    queue_full = False
    for error in errors:
        line = error.get("line")
        reason = f"{error.get('code')}: {error.get('message')}"
        if isinstance(line, int) and 1 <= line <= count:
            items[line - 1] = ItemEnd("failed", reason=f"line {line}: {reason}")
        elif error.get("code") == "token_limit_exceeded":
            queue_full = True
            for position in range(count):
                items[position] = ItemEnd("retry", reason=reason)
    others = "the provider refused the batch for another line"
    for position in range(count):
        items.setdefault(position, ItemEnd("retry", reason=others))
    return Ended("failed", items, queue_full=queue_full)
