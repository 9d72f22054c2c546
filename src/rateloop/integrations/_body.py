"""Reading response bodies for the transports, sans-IO: caps, deadlines, SSE events.

How it works: the transports read two kinds of body, and each gets a small
state machine fed with byte chunks by the sync or the async reader (the only
place the twins differ):

- :class:`BodyBudget` — a buffered body (every non-stream response, so a
  ``200`` carrying an error envelope is seen, and usage can be settled).  It
  refuses to hold more than ``max_bytes`` and says how long the next read may
  take: the first-byte deadline before any byte, the idle deadline between
  chunks.  A body that breaks either is a network failure, never a hang.
- :class:`SSEWatch` — a server-sent-events stream handed to the caller.  It
  never holds the stream back; it watches the events go by for the usage the
  provider reports (to settle the reservation when the stream closes) and for
  an error event inside a ``200`` stream (Anthropic's ``overloaded_error``,
  OpenAI's ``{"error": …}``), which it turns into a classified
  :class:`~rateloop.integrations._stream.StreamInterrupted`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from rateloop.classify import classify_text
from rateloop.errors import RateloopError
from rateloop.signal import Kind, LimitSignal

__all__ = ["BodyBudget", "SSEWatch", "envelope_error"]

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024

# A single SSE event larger than this is passed through unread (no usage from it).
_MAX_EVENT_BYTES = 1024 * 1024


@dataclass(slots=True)
class BodyBudget:
    """The limits of one buffered body read.

    >>> budget = BodyBudget(max_bytes=10, first_byte_secs=5.0, idle_secs=1.0)
    >>> budget.next_timeout()
    5.0
    >>> budget.feed(b"12345"); budget.next_timeout()
    1.0
    >>> budget.feed(b"123456")
    Traceback (most recent call last):
    ...
    rateloop.integrations._body.BodyTooLarge: the response body passed 10 bytes
    """

    max_bytes: int
    first_byte_secs: float
    idle_secs: float
    size: int = 0
    chunks: list[bytes] = field(default_factory=list)

    def next_timeout(self) -> float:
        """Seconds the next read may take."""
        return self.first_byte_secs if self.size == 0 else self.idle_secs

    def stall_message(self) -> str:
        if self.size == 0:
            return f"no byte of the response body within {self.first_byte_secs:g}s"
        return f"the response body stalled for {self.idle_secs:g}s after {self.size} bytes"

    def feed(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.max_bytes:
            raise BodyTooLarge(f"the response body passed {self.max_bytes} bytes")
        self.chunks.append(chunk)

    def content(self) -> bytes:
        return b"".join(self.chunks)


class BodyTooLarge(RateloopError):
    """A buffered body went past the cap; the transport treats it as a network failure."""


def _usage(data: Any) -> tuple[int | None, int | None]:
    """(input, output) tokens reported in one event, across the three API families."""
    found: list[Any] = []
    if isinstance(data, dict):
        for holder in (data, data.get("message"), data.get("response")):
            if isinstance(holder, dict):
                found.extend(holder.get(k) for k in ("usage", "usageMetadata"))
    inp = out = None
    for usage in found:
        if not isinstance(usage, dict):
            continue
        for name in ("input_tokens", "prompt_tokens", "promptTokenCount"):
            value = usage.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                inp = value
                break
        for name in ("output_tokens", "completion_tokens", "candidatesTokenCount"):
            value = usage.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                out = value
                break
    return inp, out


def envelope_error(data: Any) -> bool:
    """True when a JSON body (or event) is an error envelope, not a result.

    >>> envelope_error({"error": {"type": "overloaded_error"}}), envelope_error({"choices": []})
    (True, False)
    >>> envelope_error({"type": "error", "error": {"type": "api_error"}})
    True
    """
    if not isinstance(data, dict):
        return False
    if data.get("type") == "error":
        return True
    error = data.get("error")
    return isinstance(error, dict | str) and bool(error) and not (
        {"choices", "content", "candidates", "output", "data"} & data.keys()
    )


def signal_of_error_text(text: str) -> LimitSignal:
    """Classify an error found inside a 200 body; an unrecognised one is a server error."""
    signal = classify_text(text)
    if signal.kind in (Kind.OK, Kind.UNKNOWN):
        return LimitSignal.of(Kind.SERVER_ERROR, matched="error envelope in a 200 response")
    return signal


class SSEWatch:
    """Watches a server-sent-events stream for usage and for an error event.

    >>> watch = SSEWatch()
    >>> watch.feed(b'data: {"usage": {"prompt_tokens": 3, "completion_tokens": 5}}\\n\\n')
    63
    >>> watch.usage(), watch.error
    ((3, 5), None)
    >>> watch.feed(b'data: {}\\n\\nevent: error\\ndata: {"type": "error", "error": ')
    56
    >>> watch.feed(b'{"type": "overloaded_error", "message": "Overloaded"}}\\n\\n')
    0
    >>> watch.error.kind.value, watch.error_at
    ('overload', 73)
    """

    __slots__ = ("_buffer", "_input", "_output", "_start", "error", "error_at", "events", "fed")

    def __init__(self) -> None:
        self._buffer = b""
        self._start = 0  # stream offset of the buffer's first byte
        self._input: int | None = None
        self._output: int | None = None
        self.error: LimitSignal | None = None
        self.error_at = 0  # stream offset where the error event begins
        self.events = 0
        self.fed = 0

    def feed(self, chunk: bytes) -> int:
        """Take the next chunk; return how many of its bytes come before an error event.

        That is ``len(chunk)`` while the stream is healthy; once an error event
        completes, :attr:`error` is set and the bytes from the event on are not
        counted (the caller passes the prefix through, then raises).
        """
        chunk_start = self.fed
        self.fed += len(chunk)
        if self.error is not None:
            return 0
        self._buffer += chunk
        while self.error is None:
            cut = _event_end(self._buffer)
            if cut is None:
                break
            raw, self._buffer = self._buffer[: cut[0]], self._buffer[cut[1] :]
            event_start = self._start
            self._start += cut[1]
            self._event(raw)
            if self.error is not None:
                self.error_at = event_start
                return max(0, event_start - chunk_start)
        if len(self._buffer) > _MAX_EVENT_BYTES:
            self._start += len(self._buffer)
            self._buffer = b""  # one enormous event: let it through unread
        return len(chunk)

    def _event(self, raw: bytes) -> None:
        self.events += 1
        name = ""
        data_lines: list[str] = []
        for line in raw.decode("utf-8", "replace").splitlines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data_lines.append(line[5:].lstrip())
        text = "\n".join(data_lines)
        try:
            data = json.loads(text) if text and text != "[DONE]" else None
        except ValueError:
            data = None
        if name == "error" or envelope_error(data):
            self.error = signal_of_error_text(text or name)
            return
        inp, out = _usage(data)
        if inp is not None:
            self._input = inp
        if out is not None:
            self._output = out

    def usage(self) -> tuple[int, int] | None:
        """(input, output) tokens the stream reported so far, or None."""
        if self._input is None and self._output is None:
            return None
        return (self._input or 0, self._output or 0)


def _event_end(buffer: bytes) -> tuple[int, int] | None:
    """Where the first complete event ends and the next begins (blank-line separated)."""
    best: tuple[int, int] | None = None
    for sep in (b"\n\n", b"\r\n\r\n", b"\r\r"):
        at = buffer.find(sep)
        if at != -1 and (best is None or at < best[0]):
            best = (at, at + len(sep))
    return best
