"""The values the FakeProvider takes and returns: requests, responses, faults, counters."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from rateloop.testing._fake.buckets import Profile

__all__ = [
    "FAULTS",
    "SERVICE_TIERS",
    "FakeRequest",
    "FakeResponse",
    "FakeStats",
    "FaultName",
    "Slow",
]

#: OpenAI's ``service_tier`` values a request may name; ``flex`` is served from
#: the flex capacity, every other one from the standard capacity.
SERVICE_TIERS: tuple[str, ...] = ("auto", "default", "flex", "priority", "scale")

FaultName = Literal[
    "rate_limit",  # a 429 on the requests dimension, whatever the buckets hold
    "overload",  # Anthropic 529 overloaded_error, OpenAI/Gemini 503 overloaded
    "server_error",  # a plain 500
    "period_quota",  # the day's quota is spent (a 429 naming requests per day)
    "spend",  # billing / credit exhausted
    "reset",  # the connection is reset before any response
    "stream_error",  # a 200 stream that breaks with an error event after its first chunk
]
FAULTS: tuple[str, ...] = (
    "rate_limit",
    "overload",
    "server_error",
    "period_quota",
    "spend",
    "reset",
    "stream_error",
)


@dataclass(frozen=True, slots=True)
class Slow:
    """A fault that answers normally, ``seconds`` later (holding a concurrency slot)."""

    seconds: float

    def __post_init__(self) -> None:
        if isinstance(self.seconds, bool) or not isinstance(self.seconds, int | float) or (
            self.seconds < 0
        ):
            raise ValueError(f"Slow(seconds) must be a number >= 0, got {self.seconds!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class FakeRequest:
    """One call as the fake provider sees it.

    ``output_tokens`` is what the model will really produce (``None``: the
    provider's ``output_ratio`` of ``max_tokens``); ``cache_read_tokens`` is
    the part of the input served from the prompt cache.  ``service_tier`` is
    OpenAI's (``"flex"``: the flex capacity; ``None``: the standard one).
    """

    input_tokens: int = 100
    max_tokens: int = 256
    output_tokens: int | None = None
    cache_read_tokens: int = 0
    stream: bool = False
    model: str = "fake-model"
    profile: Profile | None = None  # None: the provider's own profile
    service_tier: str | None = None

    def __post_init__(self) -> None:
        tier = self.service_tier
        if tier is not None and tier not in SERVICE_TIERS:
            raise ValueError(f"FakeRequest.service_tier must be one of {', '.join(SERVICE_TIERS)} "
                             f"or None, got {tier!r}")
        for name in ("input_tokens", "max_tokens", "cache_read_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"FakeRequest.{name} must be an int >= 0, got {value!r}")
        out = self.output_tokens
        if out is not None and (isinstance(out, bool) or not isinstance(out, int) or out < 0):
            raise ValueError(f"FakeRequest.output_tokens must be an int >= 0 or None, got {out!r}")


@dataclass(slots=True, kw_only=True)
class FakeResponse:
    """An HTTP response shaped like the provider's (``status_code``, ``headers``, body).

    It quacks like an httpx response for :func:`rateloop.classify_response`
    and the RATE loop (``status_code``, ``headers``, ``content``, ``text``,
    ``json()``).  A streamed response keeps its SSE events in ``chunks``
    (``content`` is all of them joined); ``reset`` means no response at all:
    the connection was dropped.  ``delay`` is the time the provider takes to
    answer (the ASGI app and the simulator wait it out).
    """

    status_code: int
    headers: dict[str, str]
    content: bytes = b""
    chunks: list[bytes] = field(default_factory=list)
    reset: bool = False
    delay: float = 0.0
    refused: str | None = None  # the dimension or fault that refused it, None when served

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def ok(self) -> bool:
        return self.refused is None and 200 <= self.status_code < 300

    def __repr__(self) -> str:
        what = "reset" if self.reset else str(self.status_code)
        return f"FakeResponse({what}, refused={self.refused!r})"


@dataclass(slots=True)
class FakeStats:
    """What the fake provider counted.

    ``attempts`` is every request that reached it; ``served`` the ones
    answered 200 (a stream broken by a ``stream_error`` fault is not served);
    ``refusals`` counts refusals by dimension (``requests``, ``input_tokens``,
    ``output_tokens``, ``tokens``, ``requests_per_day``, ``concurrency``,
    ``resource_unavailable`` for the flex capacity) or by fault name;
    ``input_tokens`` / ``output_tokens`` are tokens served.  The flex tier's
    share of them is counted apart too: ``flex_attempts``, ``flex_served``,
    ``flex_refused``.  ``batches`` counts batches created and
    ``batch_items`` their items by how they ended (``succeeded``,
    ``errored``, ``expired``, ``canceled``).
    """

    attempts: int = 0
    served: int = 0
    refusals: Counter[str] = field(default_factory=Counter)
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    in_flight: int = 0
    peak_concurrency: int = 0
    flex_attempts: int = 0
    flex_served: int = 0
    flex_refused: int = 0
    batches: int = 0
    batch_items: Counter[str] = field(default_factory=Counter)

    @property
    def refused(self) -> int:
        return sum(self.refusals.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "attempts": self.attempts,
            "served": self.served,
            "refused": self.refused,
            "refusals": dict(sorted(self.refusals.items())),
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "in_flight": self.in_flight,
            "peak_concurrency": self.peak_concurrency,
            "flex_attempts": self.flex_attempts,
            "flex_served": self.flex_served,
            "flex_refused": self.flex_refused,
            "batches": self.batches,
            "batch_items": dict(sorted(self.batch_items.items())),
        }
