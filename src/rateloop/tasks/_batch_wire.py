"""What a batch step and a provider's batch adapter say to each other.

An adapter (:mod:`._batch_openai`, :mod:`._batch_anthropic`) speaks one
provider's batch API over HTTP; the step (:mod:`.batch`) decides.  Between
them: a submission's wire ids (``{tag}-{position}``, so the results map back
to items whatever their own ids are, and a tag names the submission),
:class:`ItemEnd` for each item of an ended batch, :class:`Found` for the
lookup that makes a submission exactly-once, and :class:`Transient` for a
provider that could not answer now (wait and ask again).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

__all__ = [
    "BatchProvider",
    "BatchRejected",
    "Ended",
    "Found",
    "ItemEnd",
    "Transient",
    "submission_tag",
    "wire_id",
    "wire_position",
]

#: Lookups look this far before the submission mark, for clocks that disagree.
CLOCK_SLACK_SECS = 300.0


class Transient(Exception):
    """The provider could not answer now (a 429, a 5xx, the network): ask again later.

    The message names the operation and the status only, never a body or a key.
    """


class BatchRejected(Exception):
    """The provider refused a request as malformed (a 4xx other than 429): fix it."""


def submission_tag(key: str) -> str:
    """A short, stable name of a submission key, fit for Anthropic's ``custom_id`` charset."""
    return "rl" + hashlib.sha256(key.encode()).hexdigest()[:14]


def wire_id(tag: str, position: int) -> str:
    return f"{tag}-{position}"


def wire_position(tag: str, custom_id: object) -> int | None:
    """The position an answer's ``custom_id`` names in this submission, or None."""
    if not isinstance(custom_id, str) or not custom_id.startswith(tag + "-"):
        return None
    tail = custom_id[len(tag) + 1 :]
    return int(tail) if tail.isdigit() else None


@dataclass(frozen=True, slots=True)
class ItemEnd:
    """How one item of an ended batch ended.

    ``succeeded`` with the provider's response body in ``value``; ``retry``
    (a 5xx, expired, cancelled, or held back by another line's rejection) and
    ``failed`` (the provider says the item itself is wrong: a 400, over the
    model's limits, a bad line) with the provider's ``reason``.
    """

    kind: Literal["succeeded", "retry", "failed"]
    value: Any = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Ended:
    """An ended batch: its status and each position's end.

    ``queue_full``: the provider refused the whole batch for its enqueued-token
    limit (nothing ran; every item is ``retry``): wait, do not count a round.
    """

    status: str
    items: dict[int, ItemEnd] = field(default_factory=dict)
    queue_full: bool = False


@dataclass(frozen=True, slots=True)
class Found:
    """A lookup's answer: the batch of a submission key, ``absent``, or ``unknown`` yet."""

    batch_id: str | None = None
    unknown: int = 0  # batches that may be it and cannot be told apart before they end

    @property
    def absent(self) -> bool:
        return self.batch_id is None and self.unknown == 0


class BatchProvider(Protocol):
    """One provider's batch API, as the step uses it (blocking)."""

    name: str

    def submit(self, key: str, tag: str, requests: Sequence[Any], model: str) -> str:
        """Submit ``requests`` (position i as ``wire_id(tag, i)``); the batch id."""
        ...

    def find(self, key: str, tag: str, since: datetime) -> Found:
        """The batch submitted under ``key`` at or after ``since``, if the provider has one."""
        ...

    def poll(self, batch_id: str, tag: str, count: int) -> Ended | None:
        """``None`` while the batch runs; its end once it ended (``count`` items)."""
        ...


def body_reason(body: Mapping[str, Any] | None, status: int | None) -> str:
    """The provider's own words from an error body: ``"400 invalid_request_error: ..."``."""
    error = body.get("error") if isinstance(body, Mapping) else None
    if isinstance(error, Mapping) and isinstance(error.get("error"), Mapping):
        error = error["error"]  # Anthropic's {"type": "error", "error": {...}}
    if not isinstance(error, Mapping):
        return f"{status}" if status is not None else "no reason given"
    kind = error.get("code") or error.get("type") or "error"
    message = error.get("message") or ""
    head = f"{status} {kind}" if status is not None else str(kind)
    return f"{head}: {message}" if message else head


class HttpApi:
    """A provider's HTTP API through httpx: a status outside 2xx becomes an exception.

    ``Transient`` for 408, 409, 429, 5xx and transport errors; ``BatchRejected``
    for the other 4xx.  The API key goes in ``headers`` and is never shown.
    """

    def __init__(self, base_url: str, headers: Mapping[str, str], *, timeout: float) -> None:
        try:
            import httpx
        except ImportError as exc:  # pragma: no cover - the extra is installed in CI
            raise ImportError("the batch adapters need httpx: pip install 'rateloop[httpx]'"
                              ) from exc
        self.base_url = base_url.rstrip("/")
        self._httpx = httpx
        self._client = httpx.Client(base_url=self.base_url, headers=dict(headers),
                                    timeout=timeout)

    def __repr__(self) -> str:
        return f"HttpApi({self.base_url!r})"

    def close(self) -> None:
        self._client.close()

    def call(self, method: str, path: str, what: str, **kwargs: Any) -> Any:
        """The response (an ``httpx.Response``) of a 2xx; ``what`` names it in errors."""
        try:
            response = self._client.request(method, path, **kwargs)
        except self._httpx.TransportError as exc:
            raise Transient(f"{what}: {type(exc).__name__}") from exc
        status = response.status_code
        if status < 300:
            return response
        try:
            body = response.json()
        except ValueError:
            body = None
        reason = body_reason(body, status)
        if status in (408, 409, 429) or status >= 500:
            raise Transient(f"{what}: {reason}")
        raise BatchRejected(f"{what}: {reason}")
