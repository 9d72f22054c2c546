"""What the fake's batch endpoints say, in OpenAI's and Anthropic's own shapes.

The objects follow the SDKs' types (``openai.types.Batch``, ``FileObject``,
``BatchError``; ``anthropic.types.messages.MessageBatch``,
``MessageBatchIndividualResponse``) and the providers' guides:

- OpenAI (developers.openai.com/api/docs/guides/batch): an output line is
  ``{"id", "custom_id", "response": {"status_code", "request_id", "body"},
  "error": null}``; a request the model refused goes to the *error* file
  with its 4xx/5xx in ``response`` (``error`` stays null); a request left
  when the batch expired is ``"response": null, "error": {"code":
  "batch_expired", "message": "This request could not be executed before
  the completion window expired."}``.  A batch that fails validation lists
  ``errors.data[]`` of ``{code, line, message, param}``
  (``invalid_json_line``: "This line is not parseable as valid JSON."), and
  one over the queue limit says "Enqueued token limit reached for M in
  organization O. Limit: N enqueued tokens. Please try again once some
  in_progress batches have been completed." (``token_limit_exceeded``, as
  users of the API quote it).  The fake leaves the requests a cancel cut
  off out of both files.
- Anthropic (platform.claude.com/docs/en/build-with-claude/batch-processing):
  ``processing_status`` ``in_progress`` / ``canceling`` / ``ended``;
  ``request_counts`` stay at ``processing`` until the batch ends; a result
  line is ``{"custom_id", "result": {"type": "succeeded", "message"}}``,
  ``{"type": "errored", "error": {"type": "error", "error": {"type",
  "message"}}}``, ``{"type": "expired"}`` or ``{"type": "canceled"}``; params
  are validated when the item runs, so a bad one errors alone.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rateloop.testing._fake import shapes
from rateloop.testing._fake.model import FakeRequest

__all__ = [
    "ANTHROPIC_ID",
    "Outcome",
    "anthropic_batch",
    "anthropic_error",
    "anthropic_line",
    "file_object",
    "line_error",
    "openai_batch",
    "openai_error",
    "openai_line",
    "token_limit_error",
]

ANTHROPIC_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_EXPIRED = "This request could not be executed before the completion window expired."


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one item ends when it runs: ``succeeded`` or ``errored`` with a reason."""

    kind: str
    flavor: str
    model: str
    status: int = 200
    input_tokens: int = 0
    output_tokens: int = 0
    error: dict[str, Any] = field(default_factory=dict)  # the provider's error object

    @classmethod
    def ok(cls, flavor: str, model: str, request: FakeRequest, ratio: float) -> Outcome:
        out = request.output_tokens
        out = min(math.ceil(request.max_tokens * ratio) if out is None else out,
                  request.max_tokens)
        return cls("succeeded", flavor, model, 200, request.input_tokens, out)

    @classmethod
    def invalid(cls, flavor: str, model: str, reason: str, *, param: str | None = None,
                code: str | None = None) -> Outcome:
        if flavor == "openai":
            error = {"message": reason, "type": "invalid_request_error", "param": param,
                     "code": code}
        else:
            error = {"type": "invalid_request_error", "message": reason}
        return cls("errored", flavor, model, 400, error=error)

    @classmethod
    def failed(cls, flavor: str) -> Outcome:
        if flavor == "openai":
            error = {"message": "The server had an error while processing your request. Sorry "
                     "about that!", "type": "server_error", "param": None, "code": None}
            return cls("errored", flavor, "", 500, error=error)
        return cls("errored", flavor, "", 500,
                   error={"type": "api_error", "message": "Internal server error"})

    @classmethod
    def limits(cls, flavor: str, model: str, request: FakeRequest, context: int | None,
               max_output: int | None) -> Outcome | None:
        """The model's 400 for an item over its limits, or ``None`` when it fits."""
        asked, wanted = request.input_tokens, request.max_tokens
        if max_output is not None and wanted > max_output:
            if flavor == "openai":
                return cls.invalid(flavor, model, f"max_tokens is too large: {wanted}. This model "
                                   f"supports at most {max_output} completion tokens, whereas "
                                   f"you provided {wanted}.", param="max_tokens",
                                   code="invalid_value")
            return cls.invalid(flavor, model, f"max_tokens: {wanted} > {max_output}, which is "
                               f"the maximum allowed number of output tokens for {model}")
        if context is not None and asked + (wanted if flavor == "openai" else 0) > context:
            if flavor == "openai":
                return cls.invalid(flavor, model, f"This model's maximum context length is "
                                   f"{context} tokens. However, you requested {asked + wanted} "
                                   f"tokens ({asked} in the messages, {wanted} in the "
                                   "completion). Please reduce the length of the messages or "
                                   "completion.", param="messages",
                                   code="context_length_exceeded")
            return cls.invalid(flavor, model,
                               f"prompt is too long: {asked} tokens > {context} maximum")
        return None


def _stamp(moment: float | None) -> int | None:
    return None if moment is None else int(moment)


def _rfc3339(moment: float | None) -> str | None:
    if moment is None:
        return None
    return datetime.fromtimestamp(moment, UTC).isoformat().replace("+00:00", "Z")


def file_object(file_id: str, filename: str, size: int, created: int,
                purpose: str) -> dict[str, Any]:
    return {"id": file_id, "object": "file", "bytes": size, "created_at": created,
            "filename": filename, "purpose": purpose, "status": "processed",
            "expires_at": None, "status_details": None}


def openai_error(message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param,
                      "code": None}}


def anthropic_error(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": None}


def line_error(code: str, line: int | None, message: str,
               param: str | None = None) -> dict[str, Any]:
    return {"code": code, "line": line, "message": message, "param": param}


def token_limit_error(model: str, limit: int) -> dict[str, Any]:
    return line_error("token_limit_exceeded", None,
                      f"Enqueued token limit reached for {model} in organization org-fake. "
                      f"Limit: {limit:,} enqueued tokens. Please try again once some "
                      "in_progress batches have been completed.")


def openai_batch(f: dict[str, Any]) -> dict[str, Any]:
    """An ``openai.types.Batch`` from :func:`.batch.batch_fields`."""
    state, ended = f["state"], f["ended_at"]
    results = list(f["results"].values())
    started = state not in ("validating", "failed")
    fin = f["ends"] if state in ("finalizing", "completed") else None
    return {
        "id": f["id"], "object": "batch", "endpoint": f["request"].get("endpoint"),
        "errors": {"object": "list", "data": f["errors"]} if f["errors"] else None,
        "input_file_id": f["request"].get("input_file_id"), "completion_window": "24h",
        "status": state, "output_file_id": f["files"].get("output"),
        "error_file_id": f["files"].get("error"), "created_at": _stamp(f["created"]),
        "in_progress_at": _stamp(f["starts"]) if started else None,
        "expires_at": _stamp(f["expires"]),
        "finalizing_at": _stamp(fin),
        "completed_at": _stamp(ended) if state == "completed" else None,
        "failed_at": _stamp(ended) if state == "failed" else None,
        "expired_at": _stamp(ended) if state == "expired" else None,
        "cancelling_at": _stamp(f["cancelled"]),
        "cancelled_at": _stamp(ended) if state == "cancelled" else None,
        "request_counts": {"total": len(results), "completed": results.count("succeeded"),
                           "failed": results.count("errored") + results.count("expired")},
        "metadata": f["request"].get("metadata"), "model": f["model"],
    }


def anthropic_batch(f: dict[str, Any]) -> dict[str, Any]:
    """An ``anthropic.types.messages.MessageBatch`` from :func:`.batch.batch_fields`."""
    state, ended = f["state"], f["ended_at"]
    status = ("ended" if ended is not None else "canceling" if state == "cancelling"
              else "in_progress")
    results = list(f["results"].values())
    counts = {name: results.count(name) if ended is not None else 0
              for name in ("succeeded", "errored", "canceled", "expired")}
    counts["processing"] = 0 if ended is not None else len(results)
    return {
        "id": f["id"], "type": "message_batch", "processing_status": status,
        "request_counts": counts, "ended_at": _rfc3339(ended),
        "created_at": _rfc3339(f["created"]), "expires_at": _rfc3339(f["expires"]),
        "archived_at": None, "cancel_initiated_at": _rfc3339(f["cancelled"]),
        # Relative: the SDK joins it to its base URL (the real one is absolute).
        "results_url": (f"/v1/messages/batches/{f['id']}/results"
                        if ended is not None else None),
    }


def _body(outcome: Outcome, request_id: str, at: float) -> Any:
    if outcome.kind != "succeeded":
        if outcome.flavor == "openai":
            return {"error": outcome.error}
        return {"type": "error", "error": outcome.error, "request_id": request_id}
    answer = shapes.success(outcome.flavor,  # type: ignore[arg-type]
                            model=outcome.model, request_id=request_id, created=int(at),
                            input_tokens=outcome.input_tokens,
                            output_tokens=outcome.output_tokens, cache_read_tokens=0,
                            stream=False, headers={})
    return answer.json()


def openai_line(line_id: str, custom_id: str, outcome: Outcome, result: str,
                at: float) -> dict[str, Any] | None:
    """A line of the output or error file; ``None`` for a request a cancel cut off."""
    if result == "expired":
        return {"id": line_id, "custom_id": custom_id, "response": None,
                "error": {"code": "batch_expired", "message": _EXPIRED}}
    if result not in ("succeeded", "errored"):
        return None
    request_id = f"req_{line_id}"
    return {"id": line_id, "custom_id": custom_id, "error": None,
            "response": {"status_code": outcome.status, "request_id": request_id,
                         "body": _body(outcome, request_id, at)}}


def anthropic_line(custom_id: str, outcome: Outcome, result: str, at: float) -> dict[str, Any]:
    if result == "succeeded":
        return {"custom_id": custom_id,
                "result": {"type": "succeeded",
                           "message": _body(outcome, f"req_{custom_id}", at)}}
    if result == "errored":
        return {"custom_id": custom_id,
                "result": {"type": "errored", "error": _body(outcome, f"req_{custom_id}", at)}}
    return {"custom_id": custom_id, "result": {"type": result}}
