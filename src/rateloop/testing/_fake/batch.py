"""The FakeProvider's batch endpoints: OpenAI's Batch API and Anthropic's Message Batches.

How it works.  A batch is decided when it is created and *read* on the
provider's clock afterwards: every item gets its outcome (succeeded, errored
with the provider's reason) and the moment it finishes, and every later
request derives the batch's status from the time now.  So on a virtual clock
a batch that takes an hour is done the moment the test advances the clock an
hour, and two reads at the same time always agree.

The timeline (:class:`FakeBatch`): the batch validates for
``validation_seconds`` (OpenAI's ``validating``), then its items finish one
after another, the first ``delay`` seconds later and each next one
``item_seconds`` after it; OpenAI then spends ``finalizing_seconds`` in
``finalizing``.  A batch whose items would finish after
``completion_window`` expires at that moment: the items done by then keep
their results, the others come back expired.  A cancelled batch keeps the
items done before the cancel and ends ``finalizing_seconds`` later.

What fails, and how (the shapes are in :mod:`.batch_shapes`):

- an item over the model's limits (``context_window``: input plus
  ``max_tokens``; ``max_output_tokens``) or with parameters the fake cannot
  read fails alone, with the provider's 400 and its reason; the others run;
- an item in ``fail_ids``, or drawn at ``fail_rate`` (from ``seed``), fails
  alone with the provider's 500;
- OpenAI validates the input file as a whole, as the real API does: a line
  that is not JSON (``invalid_json_line``), a duplicate ``custom_id``, a
  line for another endpoint or model fails the whole batch (``failed``, the
  errors listed with their line numbers); so does a batch that would take
  its model's enqueued tokens (the input tokens of the batches in flight)
  over ``enqueued_tokens`` (``token_limit_exceeded``, OpenAI's words).
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from rateloop._clock import Clock
from rateloop.testing._fake import batch_shapes as bs
from rateloop.testing._fake.asgi import parse_request
from rateloop.testing._fake.model import FakeRequest, FakeStats

__all__ = ["BatchHost", "Batches", "FakeBatch"]

Flavor = Literal["openai", "anthropic"]
_CHAT = "/v1/chat/completions"


def _seconds(name: str, value: object, *, positive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or (
        positive and value == 0
    ):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"FakeBatch.{name} must be a number of seconds {bound}, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class FakeBatch:
    """How the fake's batches behave; times are seconds on the provider's clock.

    ``enqueued_tokens`` is OpenAI's per-model batch queue limit (``None``:
    unlimited); ``context_window`` and ``max_output_tokens`` are the model's
    limits an item must fit (``None``: no limit).
    """

    validation_seconds: float = 1.0
    delay: float = 60.0
    item_seconds: float = 0.0
    finalizing_seconds: float = 1.0
    completion_window: float = 86_400.0
    fail_rate: float = 0.0
    fail_ids: frozenset[str] = frozenset()
    enqueued_tokens: int | None = None
    context_window: int | None = None
    max_output_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("validation_seconds", "delay", "item_seconds", "finalizing_seconds"):
            _seconds(name, getattr(self, name))
        _seconds("completion_window", self.completion_window, positive=True)
        rate = self.fail_rate
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 1:
            raise ValueError(f"FakeBatch.fail_rate must be a probability 0..1, got {rate!r}")
        ids = self.fail_ids
        if isinstance(ids, str) or not isinstance(ids, Iterable) or not all(
            isinstance(i, str) for i in ids
        ):
            raise ValueError(f"FakeBatch.fail_ids must be a set of custom_id strings, got {ids!r}")
        object.__setattr__(self, "fail_ids", frozenset(ids))
        for name in ("enqueued_tokens", "context_window", "max_output_tokens"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(f"FakeBatch.{name} must be an integer >= 1 or None (no limit), "
                                 f"got {value!r}")


class BatchHost(Protocol):
    """What the batches read from their provider (a :class:`FakeProvider`)."""

    @property
    def clock(self) -> Clock: ...
    @property
    def model(self) -> str: ...
    @property
    def output_ratio(self) -> float: ...
    @property
    def stats(self) -> FakeStats: ...


@dataclass(slots=True)
class _Item:
    custom_id: str
    outcome: bs.Outcome  # what happens when the item runs
    done_at: float = 0.0  # when it finishes, on the clock (epoch seconds)


@dataclass(slots=True)
class _Batch:
    flavor: Flavor
    id: str
    created: float
    items: list[_Item]
    model: str
    tokens: int  # input tokens enqueued
    request: dict[str, Any] = field(default_factory=dict)  # OpenAI: endpoint, file, metadata
    errors: list[dict[str, Any]] = field(default_factory=list)  # OpenAI validation errors
    starts: float = 0.0
    ends: float = 0.0  # when the last item finishes
    expires: float = 0.0
    cancelled: float | None = None
    files: dict[str, str | None] = field(default_factory=dict)  # output / error file ids
    counted: bool = False


@dataclass(frozen=True, slots=True)
class _View:
    """A batch as it stands at one moment."""

    state: str  # validating failed in_progress finalizing completed expired cancelling cancelled
    cut: float  # items finished by then keep their results
    ended_at: float | None
    results: dict[str, str]  # custom_id -> succeeded | errored | expired | canceled | running


class Batches:
    """The files and batches of one provider (``fake.batches``); the HTTP routes call it."""

    def __init__(self, host: BatchHost, config: FakeBatch, *, seed: int = 0) -> None:
        self.host = host
        self.config = config
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._files: dict[str, tuple[dict[str, Any], bytes]] = {}
        self._batches: dict[str, _Batch] = {}
        self._next = 0

    def clear(self) -> None:
        with self._lock:
            self._files.clear()
            self._batches.clear()

    def _now(self) -> float:
        return self.host.clock.now().timestamp()

    def _id(self, prefix: str) -> str:
        self._next += 1
        return f"{prefix}{self._next:024x}"

    # -- files (OpenAI) ----------------------------------------------------------------

    def upload(self, filename: str, content: bytes, purpose: str) -> dict[str, Any]:
        with self._lock:
            return self._store(filename, content, purpose)

    def _store(self, filename: str, content: bytes, purpose: str) -> dict[str, Any]:
        file_id = self._id("file-")
        meta = bs.file_object(file_id, filename, len(content), int(self._now()), purpose)
        self._files[file_id] = (meta, content)
        return meta

    def file(self, file_id: str) -> tuple[dict[str, Any], bytes] | None:
        with self._lock:
            for batch in self._batches.values():
                self._view(batch)  # materialise the output files that are due
            return self._files.get(file_id)

    # -- creating ----------------------------------------------------------------------

    def create_openai(self, body: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        """``POST /v1/batches``: the batch object, or a 400 for a request that cannot start."""
        endpoint, window = body.get("endpoint"), body.get("completion_window")
        if endpoint != _CHAT:
            return 400, bs.openai_error(f"Invalid endpoint {endpoint!r}: the fake provider "
                                        f"batches {_CHAT} only.", "endpoint")
        if window != "24h":
            return 400, bs.openai_error(f"Invalid completion_window {window!r}: only '24h' is "
                                        "supported.", "completion_window")
        with self._lock:
            stored = self._files.get(str(body.get("input_file_id")))
            if stored is None:
                return 404, bs.openai_error(f"No such File object: {body.get('input_file_id')}",
                                            "input_file_id")
            meta, content = stored
            if meta["purpose"] != "batch":
                return 400, bs.openai_error(f"The input file must have purpose 'batch', got "
                                            f"{meta['purpose']!r}.", "input_file_id")
            now = self._now()
            items, errors, model, tokens = self._read_lines(content)
            batch = self._new_batch("openai", now, items, model, tokens)
            batch.request = {"endpoint": endpoint, "input_file_id": meta["id"],
                             "metadata": body.get("metadata")}
            limit = self.config.enqueued_tokens
            queued = sum(b.tokens for b in self._batches.values() if b.flavor == "openai"
                         and not b.errors and b.model == model
                         and self._view(b).ended_at is None)
            if not errors and limit is not None and queued + tokens > limit:
                errors = [bs.token_limit_error(model, limit)]
            batch.errors = errors
            self._batches[batch.id] = batch
            self.host.stats.batches += 1
            return 200, bs.openai_batch(batch_fields(batch, self._view(batch)))

    def create_anthropic(self, body: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        """``POST /v1/messages/batches``: the batch, or a 400 for a request that is malformed."""
        requests = body.get("requests")
        if not isinstance(requests, list) or not requests:
            return 400, bs.anthropic_error("requests: a non-empty list of {custom_id, params} "
                                           "is required")
        seen: set[str] = set()
        for index, entry in enumerate(requests):
            custom_id = entry.get("custom_id") if isinstance(entry, Mapping) else None
            if not isinstance(custom_id, str) or not bs.ANTHROPIC_ID.fullmatch(custom_id):
                return 400, bs.anthropic_error(
                    f"requests.{index}.custom_id: must match ^[a-zA-Z0-9_-]{{1,64}}$, "
                    f"got {custom_id!r}")
            if custom_id in seen:
                return 400, bs.anthropic_error(f"requests.{index}.custom_id: {custom_id!r} is "
                                               "used twice; custom_id must be unique")
            seen.add(custom_id)
        with self._lock:
            items = [self._item("anthropic", e["custom_id"], e.get("params")) for e in requests]
            model = next((str(e["params"]["model"]) for e in requests
                          if isinstance(e.get("params"), Mapping) and e["params"].get("model")),
                         self.host.model)
            batch = self._new_batch("anthropic", self._now(), [i for i, _ in items], model,
                                    sum(t for _, t in items))
            self._batches[batch.id] = batch
            self.host.stats.batches += 1
            return 200, bs.anthropic_batch(batch_fields(batch, self._view(batch)))

    def _read_lines(self, content: bytes) -> tuple[list[_Item], list[dict[str, Any]], str, int]:
        """The items of an OpenAI input file, the file's errors, its model and input tokens."""
        items: list[_Item] = []
        errors: list[dict[str, Any]] = []
        models: list[str] = []
        tokens = 0
        lines = [(n, raw) for n, raw in enumerate(content.splitlines(), 1) if raw.strip()]
        if not lines:
            errors.append(bs.line_error("empty_file", None, "The batch input file is empty."))
        for number, raw in lines:
            try:
                line = json.loads(raw)
            except ValueError:
                line = None
            if not isinstance(line, Mapping):
                errors.append(bs.line_error("invalid_json_line", number,
                                            "This line is not parseable as valid JSON."))
                continue
            custom_id, body = line.get("custom_id"), line.get("body")
            if not isinstance(custom_id, str) or not custom_id:
                errors.append(bs.line_error("missing_required_parameter", number,
                                            "Missing required parameter: 'custom_id'.",
                                            "custom_id"))
                continue
            if any(i.custom_id == custom_id for i in items):
                errors.append(bs.line_error("duplicate_custom_id", number,
                                            f"The custom_id {custom_id!r} is used twice.",
                                            "custom_id"))
                continue
            if line.get("url") != _CHAT or line.get("method", "POST") != "POST":
                errors.append(bs.line_error("url_mismatch", number,
                                            f"The line's url must be the batch's endpoint "
                                            f"{_CHAT}.", "url"))
                continue
            model = body.get("model") if isinstance(body, Mapping) else None
            if isinstance(model, str):
                if models and model != models[0]:
                    errors.append(bs.line_error("model_mismatch", number,
                                                "Every line of a batch must use the same "
                                                f"model ({models[0]!r}), got {model!r}.",
                                                "body.model"))
                    continue
                models.append(model)
            item, counted = self._item("openai", custom_id, body)
            items.append(item)
            tokens += counted
        return items, errors, models[0] if models else self.host.model, tokens

    def _item(self, flavor: Flavor, custom_id: str, params: Any) -> tuple[_Item, int]:
        """One item and the input tokens it enqueues; its outcome is drawn now."""
        path = _CHAT if flavor == "openai" else "/v1/messages"
        model = params.get("model") if isinstance(params, Mapping) else None
        model = model if isinstance(model, str) and model else self.host.model
        request: FakeRequest | None = None
        reason: str | None = None
        if not isinstance(params, Mapping):
            reason = "body: an object is required" if flavor == "openai" else (
                "params: an object is required")
        else:
            try:
                request = parse_request(path, {}, params)
            except ValueError as exc:
                reason = str(exc)
        failed = custom_id in self.config.fail_ids or (
            self.config.fail_rate > 0 and self._rng.random() < self.config.fail_rate)
        if request is None:
            return _Item(custom_id, bs.Outcome.invalid(flavor, model, reason or "")), 0
        outcome = (bs.Outcome.limits(flavor, model, request, self.config.context_window,
                                     self.config.max_output_tokens)
                   or (bs.Outcome.failed(flavor) if failed
                       else bs.Outcome.ok(flavor, model, request, self.host.output_ratio)))
        return _Item(custom_id, outcome), request.input_tokens

    def _new_batch(self, flavor: Flavor, now: float, items: list[_Item], model: str,
                   tokens: int) -> _Batch:
        cfg = self.config
        prefix = "batch_" if flavor == "openai" else "msgbatch_"
        batch = _Batch(flavor=flavor, id=self._id(prefix), created=now, items=items,
                       model=model, tokens=tokens)
        batch.starts = now + (cfg.validation_seconds if flavor == "openai" else 0.0)
        for index, item in enumerate(items):
            item.done_at = batch.starts + cfg.delay + index * cfg.item_seconds
        batch.ends = items[-1].done_at if items else batch.starts
        batch.expires = now + cfg.completion_window
        return batch

    # -- reading -----------------------------------------------------------------------

    def retrieve(self, flavor: Flavor, batch_id: str) -> dict[str, Any] | None:
        with self._lock:
            batch = self._batches.get(batch_id)
            if batch is None or batch.flavor != flavor:
                return None
            fields = batch_fields(batch, self._view(batch))
            return bs.openai_batch(fields) if flavor == "openai" else bs.anthropic_batch(fields)

    def page(self, flavor: Flavor, *, limit: int,
             after: str | None) -> tuple[list[dict[str, Any]], bool] | None:
        """Up to ``limit`` batches, newest first, after the batch ``after`` (``None``: an
        unknown cursor), and whether more follow."""
        with self._lock:
            mine = [b for b in reversed(self._batches.values()) if b.flavor == flavor]
            start = 0
            if after is not None:
                ids = [b.id for b in mine]
                if after not in ids:
                    return None
                start = ids.index(after) + 1
            chosen = mine[start:start + limit]
            shape = bs.openai_batch if flavor == "openai" else bs.anthropic_batch
            data = [shape(batch_fields(b, self._view(b))) for b in chosen]
            return data, start + limit < len(mine)

    def cancel(self, flavor: Flavor, batch_id: str) -> dict[str, Any] | None:
        with self._lock:
            batch = self._batches.get(batch_id)
            if batch is None or batch.flavor != flavor:
                return None
            if self._view(batch).ended_at is None and batch.cancelled is None:
                batch.cancelled = self._now()
        return self.retrieve(flavor, batch_id)

    def results(self, batch_id: str) -> bytes | None:
        """Anthropic's results JSONL, or ``None`` while the batch runs (or is unknown)."""
        with self._lock:
            batch = self._batches.get(batch_id)
            if batch is None or batch.flavor != "anthropic":
                return None
            view = self._view(batch)
            if view.ended_at is None:
                return None
            lines = [bs.anthropic_line(item.custom_id, item.outcome, view.results[item.custom_id],
                                       item.done_at) for item in batch.items]
            return "".join(json.dumps(line) + "\n" for line in lines).encode()

    def _view(self, batch: _Batch) -> _View:
        """The batch at the time now; a batch that just ended writes its files and counts."""
        now = self._now()
        fin = self.config.finalizing_seconds
        ended_at: float | None
        if batch.errors:
            state = "validating" if now < batch.starts else "failed"
            ended_at = batch.starts if state == "failed" else None
            cut = batch.starts
        elif batch.cancelled is not None:
            end = batch.cancelled + fin
            state = "cancelling" if now < end else "cancelled"
            ended_at = end if state == "cancelled" else None
            cut = batch.cancelled
        elif batch.ends > batch.expires:
            state = "expired" if now >= batch.expires else (
                "validating" if now < batch.starts else "in_progress")
            ended_at = batch.expires if state == "expired" else None
            cut = batch.expires
        else:
            done = batch.ends + (fin if batch.flavor == "openai" else 0.0)
            state = ("validating" if now < batch.starts else "in_progress" if now < batch.ends
                     else "finalizing" if now < done else "completed")
            ended_at = done if state == "completed" else None
            cut = batch.ends
        cut = min(cut, now)
        end_kind = {"expired": "expired", "cancelling": "canceled", "cancelled": "canceled"}
        results = {item.custom_id: (item.outcome.kind if item.done_at <= cut else
                                    end_kind.get(state, "running")) for item in batch.items}
        view = _View(state=state, cut=cut, ended_at=ended_at, results=results)
        if ended_at is not None and not batch.counted:
            batch.counted = True
            self.host.stats.batch_items.update(results.values())
            if batch.flavor == "openai" and state != "failed":
                self._write_files(batch, view)
        return view

    def _write_files(self, batch: _Batch, view: _View) -> None:
        out: list[str] = []
        err: list[str] = []
        for index, item in enumerate(batch.items):
            line = bs.openai_line(f"batch_req_{batch.id[6:]}_{index}", item.custom_id,
                                  item.outcome, view.results[item.custom_id], item.done_at)
            if line is not None:
                (out if view.results[item.custom_id] == "succeeded" else err).append(
                    json.dumps(line) + "\n")
        for kind, lines in (("output", out), ("error", err)):
            if lines:
                meta = self._store(f"batch_{batch.id}_{kind}.jsonl", "".join(lines).encode(),
                                   "batch_output")
                batch.files[kind] = meta["id"]


def batch_fields(batch: _Batch, view: _View) -> dict[str, Any]:
    """What the shapes need to write a batch object."""
    return {"id": batch.id, "created": batch.created, "starts": batch.starts,
            "ends": batch.ends, "expires": batch.expires, "cancelled": batch.cancelled,
            "state": view.state, "ended_at": view.ended_at, "results": view.results,
            "model": batch.model, "request": batch.request, "errors": batch.errors,
            "files": dict(batch.files)}
