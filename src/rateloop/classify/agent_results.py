"""Read the machine-readable result of a headless CLI agent: what it said, not how it exited.

How it works: headless agents report a refusal inside their result and may
still exit 0.  ``claude -p --output-format json`` answers ``"subtype":
"success"`` with ``"is_error": true`` and the refusal in ``result``;
``--output-format stream-json`` adds a ``rate_limit_event`` whose
``rate_limit_info`` says ``"status": "rejected"`` and which allowance
(``rateLimitType``) ran out, and when it returns (``resetsAt``).
``codex exec --json`` prints ``{"type": "error", "message": ...}`` and
``{"type": "turn.failed", "error": {"message": ...}}`` events on stdout;
``gemini -o json`` prints one object whose ``error`` holds ``type``,
``message`` and ``code``.

:func:`read_agent_result` finds such a result in an attempt's stdout (one
JSON document, a JSON array of events, or JSON lines; anything else is not a
result: None) and keeps only what the agent said — the refusal texts, the
allowance, the reset it stated, its own retry attempts, whether it said it
continues by itself.  :func:`classify_agent_result` reads those texts with
:func:`~rateloop.classify.classify_text`, never the JSON around them: a
``usage`` object's ``input_tokens`` key is bookkeeping, not the limit that
was hit.  Never raises on any input.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime, tzinfo
from typing import Any

from rateloop.classify._allowance import (
    ALLOWANCES,
    MODEL_WEEKLY,
    SESSION,
    SPEND_LIMIT,
    WEEKLY,
    allowance_words,
)
from rateloop.classify._sse import decode_json
from rateloop.classify.text import classify_text
from rateloop.signal import Kind, LimitSignal

__all__ = [
    "AgentResult",
    "agent_retries_of",
    "allowance_of",
    "allowance_words",
    "auto_resume_of",
    "classify_agent_result",
    "read_agent_result",
]

#: Results larger than this are not parsed (the runner keeps the last 64 KiB anyway).
MAX_RESULT_CHARS = 1_000_000
#: How much of the end of stderr may hold Gemini CLI's error object.
_STDERR_RESULT_CHARS = 16_000

#: Claude Code's ``rateLimitType`` values, as allowance codes (``classify._allowance``).
_LIMIT_TYPES = {
    "five_hour": SESSION,
    "seven_day": WEEKLY,
    "seven_day_opus": MODEL_WEEKLY,
    "seven_day_sonnet": MODEL_WEEKLY,
    "overage": SPEND_LIMIT,
}

#: What Claude Code prints when it will continue by itself at the reset
#: (Claude Code 2.1.234+, ``autoContinueAtUsageLimit``).
_AUTO_RESUME = re.compile(
    r"continuing automatically when (?:your|the) (?:usage )?limit resets"
    r"|resuming automatically"
)
#: ... and when it will not, although the setting is on.
_NO_AUTO_RESUME = re.compile(r"will not resume on its own")

# The agents' own retry lines: Claude Code's "Retrying in 5 seconds… (attempt 3/10)";
# Gemini CLI's "Attempt 3 failed with status 429. Retrying with backoff..." and "Attempt 3
# failed: <message>. Retrying after 5000ms..." (packages/core/src/utils/retry.ts).
_RETRY_LINE = re.compile(
    r"retrying in [^\n]{0,40}?\(attempt (\d{1,3})/\d{1,3}\)"
    r"|attempt (\d{1,3}) failed[^\n]{0,300}?\. retrying (?:with backoff|after)"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentResult:
    """What a headless agent's own result said.

    ``format`` is the shape that was read (``claude-json``, ``claude-stream-json``,
    ``codex-jsonl``, ``gemini-json``).  ``failed`` is True when the agent's
    result says it did not do the work (``is_error``, an error event, an
    ``error`` object), whatever its exit code.  ``texts`` are the messages
    that carry the refusal, as the agent wrote them.  ``limit_type`` is the
    agent's own name of the allowance that ran out (``five_hour``,
    ``seven_day``, ...), ``reset_at`` the reset it stated (None: it stated
    none), ``status`` the HTTP status it reported.  ``agent_retries`` counts
    the retries the agent made by itself before it gave up, as its output
    shows them.  ``auto_resume`` is True when the agent said it will continue
    by itself when the limit resets.
    """

    format: str
    failed: bool
    texts: tuple[str, ...] = ()
    limit_type: str | None = None
    reset_at: datetime | None = None
    status: int | None = None
    agent_retries: int = 0
    auto_resume: bool = False

    @property
    def text(self) -> str:
        """The refusal texts, one per line."""
        return "\n".join(self.texts)


def _events(stdout: str) -> tuple[list[dict[str, Any]], bool] | None:
    """The JSON objects in ``stdout`` and whether it was one document; None if not JSON."""
    body = stdout.strip()
    if not body or body[0] not in "[{" or len(body) > MAX_RESULT_CHARS:
        return None
    whole = decode_json(body)
    if isinstance(whole, dict):
        return [whole], True
    if isinstance(whole, list):
        return [e for e in whole if isinstance(e, dict)], True
    events = []
    for raw in body.splitlines():
        line = raw.strip()
        if line.startswith("{"):
            value = decode_json(line)
            if isinstance(value, dict):
                events.append(value)
    return (events, False) if events else None


def _text(value: Any) -> str | None:
    if isinstance(value, str) and value.strip():
        return value.strip()
    return None


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return int(value)


def _epoch(value: Any) -> datetime | None:
    seconds = _int(value)
    if seconds is None or not 10**9 <= seconds < 10**11:
        return None
    return datetime.fromtimestamp(seconds, UTC)


def _assistant_texts(event: dict[str, Any]) -> list[str]:
    message = event.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return []
    return [t for block in content if isinstance(block, dict)
            if (t := _text(block.get("text"))) is not None]


def _claude(events: list[dict[str, Any]], whole: bool) -> AgentResult | None:
    result = next((e for e in reversed(events) if e.get("type") == "result"), None)
    limits = [e.get("rate_limit_info") for e in events if e.get("type") == "rate_limit_event"]
    rejected = [i for i in limits if isinstance(i, dict) and i.get("status") == "rejected"]
    if result is None and not rejected:
        return None
    texts: list[str] = []
    failed = bool(rejected)
    status = None
    if result is not None:
        failed = failed or result.get("is_error") is True or (
            isinstance(result.get("subtype"), str) and result["subtype"].startswith("error")
        )
        status = _int(result.get("api_error_status"))
    # The synthetic assistant turn Claude Code writes for an API error carries the same text.
    for event in events:
        if event.get("type") == "assistant" and (
            event.get("is_api_error_message") is True or event.get("error")
        ):
            texts.extend(t for t in _assistant_texts(event) if t not in texts)
    if result is not None and failed:
        found = _text(result.get("result"))
        if found is not None and found not in texts:
            texts.append(found)
    info = rejected[-1] if rejected else None
    limit_type = _text(info.get("rateLimitType")) if info else None
    reset_at = _epoch(info.get("resetsAt")) if info else None
    retries = 0
    for event in events:  # stream-json's retry notices: {"type":"system","subtype":"api_retry"}
        if event.get("type") == "system" and event.get("subtype") == "api_retry":
            retries = max(retries, _int(event.get("attempt")) or 0)
    fmt = "claude-json" if whole and len(events) == 1 else "claude-stream-json"
    return AgentResult(format=fmt, failed=failed, texts=tuple(texts), limit_type=limit_type,
                       reset_at=reset_at, status=status, agent_retries=retries)


def _codex(events: list[dict[str, Any]]) -> AgentResult | None:
    types = {kind for e in events if isinstance(kind := e.get("type"), str)}
    if not types & {"thread.started", "turn.started", "turn.completed", "turn.failed", "error"}:
        return None
    texts: list[str] = []
    failed = "turn.failed" in types
    for event in events:
        kind = event.get("type")
        message = None
        if kind == "error":
            message = _text(event.get("message"))
            # "Reconnecting... 2/5" error events are Codex retrying by itself, not the end.
            if message is not None and message.lower().startswith("reconnecting"):
                continue
            failed = True
        elif kind == "turn.failed":
            error = event.get("error")
            message = _text(error.get("message")) if isinstance(error, dict) else None
        if message is not None and message not in texts:
            texts.append(message)
    if not failed:
        return AgentResult(format="codex-jsonl", failed=False)
    return AgentResult(format="codex-jsonl", failed=True, texts=tuple(texts))


def _gemini(event: dict[str, Any]) -> AgentResult | None:
    if "response" not in event and "error" not in event:
        return None
    error = event.get("error")
    if not isinstance(error, dict):
        return AgentResult(format="gemini-json", failed=False) if "response" in event else None
    texts = tuple(t for t in (_text(error.get("message")),) if t is not None)
    code = _int(error.get("code"))
    status = code if code is not None and 100 <= code <= 599 else None
    return AgentResult(format="gemini-json", failed=True, texts=texts, status=status)


def _gemini_error_on_stderr(stderr: str) -> AgentResult | None:
    """Gemini CLI's ``-o json`` error object, when it ends stderr (stdout then holds nothing).

    Gemini CLI 0.61.0 writes the ``{"session_id": ..., "error": {...}}`` of a
    failed ``-o json`` run on stderr, after its own retry log and stack traces:
    the object is the last lines, from the last line that is a lone ``{``.
    """
    tail = stderr[-_STDERR_RESULT_CHARS:].rstrip()
    if not tail.endswith("}"):
        return None
    start = tail.rfind("\n{\n")
    body = tail[start + 1 :] if start >= 0 else tail
    if not body.startswith("{\n"):
        return None
    event = decode_json(body)
    if not isinstance(event, dict) or not isinstance(event.get("error"), dict):
        return None
    if "session_id" not in event:  # Gemini CLI's shape, not any JSON error a tool printed
        return None
    return _gemini(event)


def _retry_lines(low: str) -> int:
    return max((int(m.group(1) or m.group(2)) for m in _RETRY_LINE.finditer(low)), default=0)


def read_agent_result(stdout: str, stderr: str = "") -> AgentResult | None:
    """The agent's own result in ``stdout``; None when it holds none this module knows.

    ``stderr`` is read for the agent's retry lines and auto-resume notice, and
    for Gemini CLI's ``-o json`` error object when stdout holds no result
    (Gemini CLI writes it on stderr).
    """
    if not isinstance(stdout, str) or not isinstance(stderr, str):
        raise TypeError("stdout and stderr must be str")
    found = _events(stdout)
    result = None
    if found is not None:
        events, whole = found
        result = _claude(events, whole) or _codex(events)
        if result is None and whole and len(events) == 1:
            result = _gemini(events[0])
    if result is None:
        result = _gemini_error_on_stderr(stderr)
    if result is None:
        return None
    low = (result.text + "\n" + stderr[-32_000:]).lower()
    retries = max(result.agent_retries, _retry_lines(low))
    resume = _AUTO_RESUME.search(low) is not None and _NO_AUTO_RESUME.search(low) is None
    return replace(result, agent_retries=retries, auto_resume=resume)


def allowance_of(signal: LimitSignal, limit_type: str | None = None) -> str | None:
    """Which allowance ran out, as a code of :data:`~rateloop.classify._allowance.ALLOWANCES`:
    the agent's own ``rateLimitType``, else the one its words named (the signal's ``code``).

    >>> from rateloop.signal import Kind
    >>> allowance_of(LimitSignal.of(Kind.PERIOD_QUOTA, code="weekly_limit"))
    'weekly_limit'
    >>> allowance_of(LimitSignal.of(Kind.PERIOD_QUOTA), "five_hour")
    'session_limit'
    >>> allowance_of(LimitSignal.of(Kind.TEMPORARY, code="rate_limit_exceeded")) is None
    True
    """
    if limit_type in _LIMIT_TYPES:
        return _LIMIT_TYPES[limit_type]
    return signal.code if signal.code in ALLOWANCES else None


def agent_retries_of(text: str) -> int:
    """How many times the agent retried by itself, as its retry lines show.

    >>> agent_retries_of("API Error (429) · Retrying in 5 seconds… (attempt 3/10)")
    3
    """
    return _retry_lines(text[-32_000:].lower())


def auto_resume_of(text: str) -> bool:
    """Whether the agent said it continues by itself when its usage limit resets."""
    low = text[-32_000:].lower()
    return _AUTO_RESUME.search(low) is not None and _NO_AUTO_RESUME.search(low) is None


def classify_agent_result(
    result: AgentResult,
    *,
    now: datetime | None = None,
    pause_limit: float | None = None,
    tz: tzinfo | None = None,
) -> LimitSignal:
    """The signal of an agent's own result: its refusal texts read as agent output.

    A result that did not fail is ``ok``.  A ``rate_limit_event`` the agent
    marked ``rejected`` is a usage limit (``period_quota``) even when the
    text says less; its ``resetsAt`` is the reset when the text states none.
    The reset is only ever one the agent stated.
    """
    if not result.failed:
        return LimitSignal.of(Kind.OK)
    text = result.text
    if result.status is not None:
        # The status the agent reported is part of what it said ("API Error: 529 ...").
        text = f"{text}\nstatus {result.status}" if text else f"api error: {result.status}"
    signal = classify_text(text, exit_code=1, now=now, pause_limit=pause_limit, tz=tz)
    fields: dict[str, Any] = {}
    if signal.status is None and result.status is not None:
        fields["status"] = result.status
    if result.limit_type is not None and signal.kind in (Kind.UNKNOWN, Kind.TEMPORARY):
        fields["kind"] = Kind.PERIOD_QUOTA
        fields["retryable"] = False
        fields["matched"] = signal.matched or f"rate_limit_event: {result.limit_type}"
    if result.reset_at is not None and signal.reset_at is None:
        fields["reset_at"] = result.reset_at
    return replace(signal, **fields) if fields else signal
