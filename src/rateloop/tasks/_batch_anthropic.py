"""Anthropic's Message Batches for a batch step.

- **Submit**: ``POST /v1/messages/batches`` with ``requests = [{custom_id,
  params}]``, each ``custom_id`` the item's wire id (``{tag}-{position}``).
- **Find**: a Message Batch has no metadata, and its requests can be read
  only once it ended (through its results).  So a lookup lists the batches
  newest first back to the submission mark and reads the results of those
  that ended: the one whose ``custom_id`` s carry the submission's tag is it.
  A candidate still running cannot be told apart yet: the lookup answers
  ``unknown`` and the step waits for it to end — slower than OpenAI's metadata
  after a crash, never a second submission.
- **Poll**: ``GET /v1/messages/batches/{id}``; once ``ended``, read the
  results: ``succeeded`` keeps the message; ``errored`` with an
  ``invalid_request_error`` (a bad request, over the model's limits) fails
  with the provider's reason; other errors, ``expired`` and ``canceled`` are
  retried.

Plain httpx, as for OpenAI (see :mod:`._batch_openai`).
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

__all__ = ["AnthropicBatches"]


class AnthropicBatches:
    """Anthropic's Message Batches at ``base_url`` (``https://api.anthropic.com``)."""

    name = "anthropic"

    def __init__(self, *, api_key: str, base_url: str = "https://api.anthropic.com",
                 version: str = "2023-06-01", timeout: float = 60.0) -> None:
        self._api = HttpApi(base_url, {"x-api-key": api_key, "anthropic-version": version},
                            timeout=timeout)

    def __repr__(self) -> str:
        return f"AnthropicBatches({self._api.base_url!r})"

    def close(self) -> None:
        self._api.close()

    def submit(self, key: str, tag: str, requests: Sequence[Any], model: str) -> str:
        entries = [{"custom_id": wire_id(tag, i), "params": json.loads(body)
                    if isinstance(body, str) else body} for i, body in enumerate(requests)]
        batch = self._api.call("POST", "/v1/messages/batches", "create the message batch",
                               json={"requests": entries}).json()
        return str(batch["id"])

    def _results(self, batch_id: str) -> list[Mapping[str, Any]]:
        text = self._api.call("GET", f"/v1/messages/batches/{batch_id}/results",
                              "read the batch's results").text
        return [json.loads(raw) for raw in text.splitlines() if raw.strip()]

    def find(self, key: str, tag: str, since: datetime) -> Found:
        oldest = since.timestamp() - CLOCK_SLACK_SECS
        unknown = 0
        after: str | None = None
        while True:
            params: dict[str, Any] = {"limit": 100, **({"after_id": after} if after else {})}
            page = self._api.call("GET", "/v1/messages/batches", "list the message batches",
                                  params=params).json()
            for batch in page.get("data", []):
                created = datetime.fromisoformat(str(batch["created_at"]).replace("Z", "+00:00"))
                if created.timestamp() < oldest:
                    return Found(unknown=unknown)
                if batch.get("processing_status") != "ended":
                    unknown += 1
                    continue
                lines = self._results(str(batch["id"]))
                if any(wire_position(tag, line.get("custom_id")) is not None for line in lines):
                    return Found(str(batch["id"]))
            if not page.get("has_more") or not page.get("data"):
                return Found(unknown=unknown)
            after = page["data"][-1]["id"]

    def poll(self, batch_id: str, tag: str, count: int) -> Ended | None:
        batch = self._api.call("GET", f"/v1/messages/batches/{batch_id}",
                               "read the message batch").json()
        if batch.get("processing_status") != "ended":
            return None
        items: dict[int, ItemEnd] = {}
        for line in self._results(batch_id):
            position = wire_position(tag, line.get("custom_id"))
            if position is not None:
                items[position] = _item_end(line.get("result") or {})
        for position in range(count):
            items.setdefault(position, ItemEnd("retry", reason="missing from the results"))
        return Ended("ended", items)


def _item_end(result: Mapping[str, Any]) -> ItemEnd:
    kind = result.get("type")
    if kind == "succeeded":
        return ItemEnd("succeeded", value=result.get("message"))
    if kind == "errored":
        body = result.get("error")
        inner = body.get("error") if isinstance(body, Mapping) else None
        invalid = isinstance(inner, Mapping) and inner.get("type") == "invalid_request_error"
        reason = body_reason(body if isinstance(body, Mapping) else None, None)
        return ItemEnd("failed" if invalid else "retry", reason=reason)
    return ItemEnd("retry", reason=f"{kind}: the batch ended before the item ran")
